"""fork(): a handle belongs to the process that made it (docs/python.md,
"fork").  In a forked child a handle's calls raise KVO_ESTATE and close() and
the finalizers neither free nor unlink anything: the parent's handles keep
working, a shared arena's name stays for the process expected to attach, and
the child exits cleanly (before: SIGSEGV at exit with a FileTier, a hang with
a Connector, the arena's name unlinked by the child)."""
import gc
import os
import subprocess
import sys
import textwrap

import pytest

import kvoffload as k
from kvoffload import _lib as L


def small_plan():
    return k.Plan(k.Model("t", 16, [dict(name="full", tokens_per_block=16, layers=1, page_bytes=1024)]),
                  blocks_per_chunk=2)


def wait_child(pid):
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_child_neither_frees_nor_unlinks(tmp_path):
    plan = small_plan()
    store = k.Store(plan, 1 << 20)
    ft = k.FileTier(str(tmp_path / "files"), plan, 64 << 20)
    conn = k.Connector(plan, 4 << 20, file_tier=ft)
    xfer = k.Transfer(plan, threads=2)
    arena = k.Arena(1 << 16)
    view = arena.view(0, 16)
    shared = k.SharedArena("fork", 1 << 16, plan.fingerprint, expected=2, directory=str(tmp_path))
    assert shared.creator and shared.linked
    keys = k.make_keys([1, 2, 3], 0)
    need, *_ = store.prepare_store(keys)
    store.complete_store(keys[need])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: touch, close, collect, exit; report what it saw through the pipe
        os.close(r)
        seen = []
        try:
            store.lookup(keys)
            seen.append("lookup-worked")
        except k.KvoError as e:
            seen.append("estate" if e.code == L.KVO_ESTATE else "other")
        for h in (conn, ft, xfer, store, arena, plan):
            h.close()
        shared.close()
        del view
        gc.collect()
        os.write(w, ",".join(seen).encode())
        os._exit(0)
    os.close(w)
    code = wait_child(pid)
    said = os.read(r, 100).decode()
    os.close(r)
    assert code == 0 and said == "estate", (code, said)
    # the parent's handles still work, and the name waits for the second process
    assert list(store.lookup(keys)) == [k.READY] * 3
    assert shared.linked
    other = k.SharedArena("fork", 1 << 16, plan.fingerprint, expected=2, directory=str(tmp_path))
    assert not other.creator and not shared.linked  # the second attach unlinked it, as designed
    assert ft.lookup(keys).shape == (3,)
    conn.add_request(7, list(range(64)))
    assert conn.lookup(7)["status"] >= 0
    xfer.stats()
    view[0] = 1
    for h in (other, shared, conn, xfer, ft, store, arena):
        h.close()


CHILD_EXITS = textwrap.dedent("""
    import os, sys
    import kvoffload as k
    plan = k.Plan(k.Model("t", 16, [dict(name="full", tokens_per_block=16, layers=1, page_bytes=1024)]),
                  blocks_per_chunk=2)
    ft = k.FileTier(sys.argv[1], plan, 64 << 20)
    conn = k.Connector(plan, 4 << 20, file_tier=ft)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the interpreter's own exit: finalizers of the parent's handles run here
    _, status = os.waitpid(pid, 0)
    conn.add_request(1, list(range(64)))
    print("child", os.waitstatus_to_exitcode(status), "parent lookup", conn.lookup(1)["status"] >= 0)
""")


def test_child_exits_cleanly_holding_file_tier_and_connector(tmp_path):
    """The child leaves through the interpreter's exit (finalizers, gc): no
    SIGSEGV (FileTier), no hang (Connector)."""
    out = subprocess.run([sys.executable, "-c", CHILD_EXITS, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "child 0 parent lookup True" in out.stdout, (out.stdout, out.stderr)
