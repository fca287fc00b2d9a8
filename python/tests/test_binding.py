"""Tests of the ctypes bindings against the real shared library."""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kvoffload as k
import workloads
from kvoffload import _lib as L
from kvoffload import shm

HERE = os.path.dirname(os.path.abspath(__file__))


def small_plan(bpc=2, groups=None):
    groups = groups or [dict(name="full", tokens_per_block=16, layers=2, page_bytes=1024)]
    return k.Plan(k.Model("t", 16, groups), blocks_per_chunk=bpc)


def test_struct_sizes_match_c():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to print the C struct sizes")
    root = os.path.join(HERE, "..", "..")
    incs = ["-I", os.path.join(root, "include")]
    # a generated header (kvo_version.h) may live in the build tree
    for d in [os.path.join(os.path.dirname(k.LIBRARY_PATH), "include"), os.path.join(root, "build", "include")]:
        if os.path.exists(os.path.join(d, "kvoffload", "kvo_version.h")):
            incs += ["-I", d]
    exe = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kvo_abi_{os.getpid()}")
    subprocess.run([cc, *incs, os.path.join(HERE, "abi_sizes.c"), "-o", exe], check=True)
    try:
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(exe)
    names = {"kvo_group_desc": L.GroupDesc, "kvo_plan_params": L.PlanParams, "kvo_group_plan": L.GroupPlan,
             "kvo_store_params": L.StoreParams, "kvo_store_entry": L.StoreEntry, "kvo_store_event": L.StoreEvent,
             "kvo_store_stats": L.StoreStats, "kvo_arena_params": L.ArenaParams,
             "kvo_file_tier_params": L.FileTierParams, "kvo_file_tier_stats": L.FileTierStats,
             "kvo_file_completion": L.FileCompletion, "kvo_transfer_params": L.TransferParams,
             "kvo_segment": L.Segment, "kvo_xfer_op": L.XferOp, "kvo_xfer_result": L.XferResult,
             "kvo_transfer_stats": L.TransferStats, "kvo_connector_params": L.ConnectorParams,
             "kvo_request_desc": L.RequestDesc, "kvo_lookup_result": L.LookupResultC,
             "kvo_completion": L.Completion, "kvo_connector_stats": L.ConnectorStats,
             "kvo_request_stats": L.RequestStats, "kvo_cuda_params": L.CudaParams,
             "kvo_remote_tier_params": L.RemoteTierParams, "kvo_remote_tier_stats": L.RemoteTierStats,
             "kvo_remote_completion": L.RemoteCompletion, "kvo_cuda_stats": L.CudaStats,
             "kvo_tenant_stats": L.TenantStats}
    seen = 0
    for line in out.splitlines():
        name, size = line.split()
        assert ctypes.sizeof(names[name]) == int(size), name
        seen += 1
    assert seen == len(names)


def test_error_table_comes_from_the_library():
    assert L.ERROR_NAMES[L.KVO_EINVAL] == "KVO_EINVAL" and L.KVO_OK == 0
    assert L.lib.kvo_error_name(L.KVO_ENOSPC) == b"KVO_ENOSPC"
    assert len(L.ERROR_NAMES) >= 18


def test_version_and_library_path():
    assert k.version().count(".") == 2
    assert os.path.exists(k.LIBRARY_PATH) or "kvoffload" in k.LIBRARY_PATH


def test_one_version():
    """The package, the loaded library and the compiled module report one
    version: the root CMakeLists.txt's project(), the one place it is written
    (an installed package: its _version.py, written by the build)."""
    assert k.__version__ == k.library_version()
    from kvoffload import _hot
    assert _hot.KVO_VERSION == k.library_version()
    cmake = os.path.join(HERE, "..", "..", "CMakeLists.txt")
    if os.path.exists(cmake):  # a checkout (the sdist's tests run beside kvoffload-c/ instead)
        import re
        with open(cmake) as f:
            m = re.search(r"project\(kvoffload VERSION ([0-9.]+)", f.read())
        assert m and m.group(1) == k.library_version()


def test_library_lookup_order(tmp_path):
    """KVO_LIBRARY first, else a libkvoffload.so next to the package."""
    pkg = tmp_path / "kvoffload"
    shutil.copytree(os.path.dirname(k.__file__), pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(k.LIBRARY_PATH, pkg / "libkvoffload.so")
    # a wheel repaired by auditwheel: the library's RPATH names the libraries beside the package
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(k.__file__))), "kvoffload.libs")
    if os.path.isdir(libs):
        shutil.copytree(libs, tmp_path / "kvoffload.libs")
    env = {kk: v for kk, v in os.environ.items() if kk != "KVO_LIBRARY"}
    env["PYTHONPATH"] = str(tmp_path)
    code = "import kvoffload; print(kvoffload.LIBRARY_PATH)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.strip() == str(pkg / "libkvoffload.so")
    env["KVO_LIBRARY"] = str(tmp_path / "missing.so")
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "missing.so" in bad.stderr


def test_transfer_device_index_reaches_c():
    """A tensor-parallel rank's worker asks for its own GPU (cuda:N): the
    index travels to kvo_transfer_create, whose error names it (no GPU here;
    the device is refused, never silently device 0)."""
    plan = k.Plan(k.Model("t", 16, [dict(name="full", tokens_per_block=16, layers=1, page_bytes=256)]),
                  blocks_per_chunk=2)
    with pytest.raises(OverflowError):
        k.Transfer(plan, device="cuda", device_index=2**40)
    try:
        L.cuda_lib()  # loading it attaches the 'cuda' device to libkvoffload
    except k.KvoError:
        pytest.skip("no CUDA device library in this build")
    with pytest.raises(k.KvoError) as e:
        k.Transfer(plan, device="cuda", device_index=3)
    assert "device_index 3" in e.value.message


def test_cuda_device_without_its_library_fails_clearly(monkeypatch):
    """CudaDevice needs the CUDA device library (KVO_CUDA_LIBRARY, or
    libkvoffload_cuda.so next to libkvoffload.so): without it, KVO_ENOTSUP
    saying where it looked."""
    monkeypatch.setattr(L, "_cuda", None)
    monkeypatch.setenv("KVO_CUDA_LIBRARY", "/nonexistent/libkvoffload_cuda.so")
    with pytest.raises(k.KvoError) as e:
        k.CudaDevice(0)
    assert e.value.code == L.KVO_ENOTSUP and "/nonexistent/libkvoffload_cuda.so" in e.value.message
    monkeypatch.delenv("KVO_CUDA_LIBRARY")
    if L._find_cuda_library() is not None or hasattr(L.lib, "kvo_cuda_create"):
        pytest.skip("a CUDA device library is there")
    with pytest.raises(k.KvoError) as e:
        k.CudaDevice(0)
    assert e.value.code == L.KVO_ENOTSUP and "KVO_CUDA_LIBRARY" in e.value.message


def test_model_plan_dicts_and_legacy_block_size():
    m = k.Model("mix", 4, [dict(name="a", tokens_per_block=12, layers=3, page_bytes=1000),
                           dict(name="b", tokens_per_block=16, layers=2, page_bytes=2048, kind="sliding",
                                window=100)])
    p = k.Plan(m, blocks_per_chunk=4)
    assert [g["tokens_per_chunk"] for g in p.groups] == [48, 64]
    assert p.groups[1]["kind"] == "sliding" and p.groups[1]["window_chunks"] == 3
    assert p.groups[0]["chunk_bytes"] == 3 * 4 * 1000 and p.groups[0]["slot_bytes"] % 4096 == 0
    d = p.to_dict()
    assert d["groups"][0]["name"] == "a" and p.fingerprint_hex in str(d)
    # block_size (tokens per chunk) giving the same chunking -> the same fingerprint
    m1 = k.Model("one", 16, [dict(name="f", tokens_per_block=16, layers=2, page_bytes=512)])
    assert k.Plan(m1, block_size=64).fingerprint == k.Plan(m1, blocks_per_chunk=4).fingerprint
    assert k.Plan(m1, block_size=32).fingerprint != k.Plan(m1, blocks_per_chunk=4).fingerprint


def test_errors_carry_code_and_message():
    m1 = k.Model("one", 16, [dict(name="f", tokens_per_block=16, layers=2, page_bytes=512)])
    with pytest.raises(k.KvoError) as e:
        k.Plan(m1, block_size=64, blocks_per_chunk=4)
    assert e.value.code == L.KVO_EINVAL and e.value.name == "KVO_EINVAL"
    assert "block_size" in e.value.message
    with pytest.raises(k.KvoError) as e:
        k.Model.open("no-such-preset-or-file")
    assert e.value.code in (L.KVO_ENOTFOUND, L.KVO_EIO)
    assert e.value.message


def test_presets_open():
    names = k.Model.presets()
    assert "llama-3.1-8b" in names
    m = k.Model.open("llama-3.1-8b")
    assert m.to_dict()["groups"]


def test_keys_prefix_property():
    p = small_plan(bpc=2)
    toks = np.arange(200, dtype=np.uint32)
    u_all = p.hash_tokens(toks)
    u_pre = p.hash_tokens(toks[:100])
    assert len(u_all) == 200 // 16 and np.array_equal(u_all[: len(u_pre)], u_pre)
    keys = p.chunk_keys(0, u_all)
    assert len(keys) == len(u_all) // 2
    assert keys["lo"][0] == u_all[1][0] and keys["group"][0] == 0
    assert not np.array_equal(p.hash_tokens(toks + 1)[0], u_all[0])


def test_store_batch_cycle_eviction_and_events():
    p = small_plan()
    slot = p.groups[0]["slot_bytes"]
    s = k.Store(p, 4 * slot, event_capacity=64)
    a = k.make_keys(list(range(1, 5)), 0)
    need, slots, ev, _ = s.prepare_store(a)
    assert need.all() and len(set(slots["offset"].tolist())) == 4 and len(ev) == 0
    assert (s.lookup(a) == k.PENDING).all()
    s.complete_store(a)
    assert (s.lookup(a) == k.READY).all()
    pinned = s.prepare_load(a[:1])
    assert pinned["offset"][0] == slots["offset"][0]
    s.touch(a[1:2])
    b = k.make_keys([10, 11], 0)
    need, slots_b, ev, evs = s.prepare_store(b)
    assert need.all() and len(ev) == 2
    # LRU: key 1 pinned, key 2 touched -> 3 and 4 go
    assert sorted(ev["lo"].tolist()) == [3, 4]
    assert set(slots_b["offset"].tolist()) == set(evs["offset"].tolist())
    s.complete_store(b, ok=False)
    assert (s.lookup(b) == k.MISS).all()
    s.complete_load(a[:1])
    with pytest.raises(k.KvoError) as e:
        s.complete_load(a[:1])
    assert e.value.code == L.KVO_ESTATE
    kinds = [t for t, _ in s.drain_events()]
    assert kinds[0] == "stored" and "evicted" in kinds and "removed" in kinds
    st = s.stats()
    assert st["entries"] == 2 and st["groups"][0]["slot_bytes"] == slot


def test_store_policy_names_and_the_removed_ones():
    # every policy there is stores and hits; "branch" is an alias of
    # "prefix"; "ensemble" is gone and its error names what to use instead;
    # the removed policy's parameters are accepted and ignored
    p = small_plan()
    slot = p.groups[0]["slot_bytes"]
    keys = k.make_keys([1, 2, 3], 0)
    for name in ["lru", "arc", "s3fifo", "prefix", "branch"]:
        s = k.Store(p, 8 * slot, policy=name, policy_admission=True, lookups_per_key=True)
        need, _, _, _ = s.prepare_store(keys)
        assert need.all(), name
        s.complete_store(keys)
        assert (s.lookup(keys) == k.READY).all(), name
        s.close()
    with pytest.raises(k.KvoError) as e:
        k.Store(p, 8 * slot, policy="ensemble")
    assert e.value.code == L.KVO_EINVAL and "prefix" in e.value.message


def test_store_rejects_foreign_group():
    s = k.Store(small_plan(), 1 << 20)
    with pytest.raises(k.KvoError) as e:
        s.lookup(k.make_keys([1], 5))
    assert e.value.code == L.KVO_EINVAL


def _engine(p, num_blocks):
    g = p.groups[0]
    page = g["page_bytes"]
    # two layers as two segments of one buffer
    buf = np.random.default_rng(1).integers(0, 255, size=2 * num_blocks * page, dtype=np.uint8)
    segs = [dict(group=0, base=buf.ctypes.data + i * num_blocks * page, num_blocks=num_blocks, block_stride=page,
                 page_bytes=page) for i in range(2)]
    return buf, segs


def test_transfer_store_then_load_roundtrip():
    p = small_plan(bpc=2)
    buf, segs = _engine(p, 8)
    t = k.Transfer(p, threads=2)
    t.set_layout(segs)
    arena = k.Arena(4 * p.groups[0]["slot_bytes"])
    slot_b = p.groups[0]["slot_bytes"]
    j = t.submit(k.STORE, [dict(group=0, engine_blocks=[1, 2], slot=arena.base, slot_bytes=slot_b)])
    t.wait([j])
    orig = buf.copy()
    j2 = t.submit(k.LOAD, [dict(group=0, engine_blocks=[5, 6], slot=arena.base, slot_bytes=slot_b)])
    t.wait([j2])
    res = {r["job_id"]: r for r in t.poll()}
    assert res[j]["status"] == 0 and res[j2]["status"] == 0 and res[j2]["bytes"] == p.groups[0]["chunk_bytes"]
    page = p.groups[0]["page_bytes"]
    view = buf.reshape(2, 8, page)
    o = orig.reshape(2, 8, page)
    assert np.array_equal(view[:, 5:7], o[:, 1:3])
    assert np.array_equal(view[:, 0:5], o[:, 0:5])
    with pytest.raises(k.KvoError) as e:
        t.submit(k.LOAD, [dict(group=0, engine_blocks=[99], slot=arena.base, slot_bytes=slot_b)])
    assert e.value.code == L.KVO_EINVAL
    t.close()


def test_file_tier_write_read(tmp_path):
    p = small_plan()
    g = p.groups[0]
    ft = k.FileTier(str(tmp_path / "ft"), p, 16 * g["slot_bytes"])
    src = k.Arena(2 * g["slot_bytes"])
    src.view(0, g["chunk_bytes"])[:] = np.arange(g["chunk_bytes"]) % 251
    keys = k.make_keys([7], 0)
    assert ft.write(keys, [src.base])[0] == 0
    ft.flush()
    assert ft.lookup(keys)[0] == k.READY
    res = ft.read(keys, [src.base + g["slot_bytes"]], [42])
    assert res[0] == 0
    comps = []
    while not comps:
        ft.wait(5000)
        comps = ft.poll()
    assert comps[0]["result"] == 0 and comps[0]["user_data"] == 42
    assert np.array_equal(src.view(g["slot_bytes"], g["chunk_bytes"]), src.view(0, g["chunk_bytes"]))
    assert ft.stats()["writes"] == 1
    ft.close()


def redis_url():
    """The test cluster's URL (tools/test-python.sh starts one and sets
    KVO_TEST_REDIS), or skip."""
    a = os.environ.get("KVO_TEST_REDIS")
    if not a:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-python.sh starts a Redis Cluster when redis-server exists)")
    return f"redis://{a}"


def _remote_done(rt, want):
    out = []
    deadline = time.time() + 20
    while len(out) < want and time.time() < deadline:
        rt.wait(1000)
        out += rt.poll()
    assert len(out) == want, out
    return out


def test_remote_tier_put_exists_get(tmp_path):
    url = redis_url()
    p = small_plan()
    g = p.groups[0]
    prefix = f"pytest{os.getpid()}"
    try:
        rt = k.RemoteTier(url, p, key_prefix=prefix)
    except k.KvoError as e:
        if e.code == L.KVO_ENOTSUP:
            pytest.skip("library built without hiredis")
        raise
    src = k.Arena(3 * g["slot_bytes"])
    src.view(0, g["chunk_bytes"])[:] = (np.arange(g["chunk_bytes"]) * 7) % 253
    keys = k.make_keys([11, 12], 0)
    assert rt.put(keys[:1], [src.base])[0] == 0
    assert rt.flush(20000) == 0
    assert rt.key_name(keys[:1]).startswith(prefix + ":")
    assert list(rt.exists(keys, [1, 2])) == [0, 0]
    got = {c["user_data"]: c["result"] for c in _remote_done(rt, 2)}
    assert got == {1: 0, 2: L.KVO_ENOTFOUND}
    dst = src.base + g["slot_bytes"]
    assert rt.get(keys[:1], [dst], [5])[0] == 0
    c = _remote_done(rt, 1)[0]
    assert c["result"] == 0 and c["user_data"] == 5 and c["bytes"] == g["chunk_bytes"]
    assert np.array_equal(src.view(g["slot_bytes"], g["chunk_bytes"]), src.view(0, g["chunk_bytes"]))
    st = rt.stats()
    assert st["puts"] == 1 and st["gets"] == 1 and st["exists_hits"] == 1 and st["exists_misses"] == 1
    # another layout never sees these values
    other = k.RemoteTier(url, p, key_prefix=prefix, layout_hash=0x1234)
    assert other.get(keys[:1], [src.base + 2 * g["slot_bytes"]], [9])[0] == 0
    assert _remote_done(other, 1)[0]["result"] == L.KVO_ENOTFOUND
    other.close()
    rt.close()
    src.close()


def test_connector_store_and_hit():
    p = small_plan(bpc=2)
    g = p.groups[0]
    buf, segs = _engine(p, 16)
    c = k.Connector(p, 16 * g["slot_bytes"])
    c.set_layout(segs)
    toks = list(range(1000, 1000 + 96))
    c.add_request(1, toks)
    assert c.lookup(1)["status"] == 0
    table = [list(range(6))]
    c.update(1, 96, table)
    c.wait_request(1)
    c.finish(1, 96, None)
    c.poll()
    orig = buf.copy()
    c.add_request(2, toks)
    r = c.lookup(2)
    # the hit leaves the prompt's last token to compute: 95 of 96 tokens, the
    # last loaded block only partly valid (docs/lookup.md)
    assert r["status"] == 1 and r["tokens"] == 95
    nb = -(-r["tokens"] // 16)  # whole blocks are loaded
    c.load(2, r["tokens"], [list(range(8, 14))])
    c.wait_request(2)
    comps = c.poll()
    assert any(x["type"] == 1 and x["status"] == 0 and x["tokens_valid"] == r["tokens"] for x in comps)
    page = g["page_bytes"]
    v, o = buf.reshape(2, 16, page), orig.reshape(2, 16, page)
    assert np.array_equal(v[:, 8:8 + nb], o[:, 0:nb])
    assert np.array_equal(v[:, 8 + nb:], o[:, 8 + nb:])
    st = c.stats()
    assert st["lookup_hits"] == 1 and st["host"]["entries"] == 3
    # one tenant so far (no salt): its row holds every count; another salt,
    # another row, under the label Python computes the same way
    c.add_request(3, toks, cache_salt=b"tenant-secret")
    assert c.lookup(3)["status"] == 0   # the salt's namespace: no hit
    ts = c.tenant_stats()
    lab = k.cascade.tenant_label(b"tenant-secret")
    assert list(ts) == ["default", lab] and "secret" not in lab
    d = ts["default"]
    assert (d["requests"], d["hit_tokens"], d["loaded_tokens"]) == (2, 95, 95) and d["stored_chunks"] >= 3, d
    assert ts[lab]["requests"] == 1 and ts[lab]["lookup_tokens"] == 96 and ts[lab]["hit_tokens"] == 0, ts[lab]
    c.close()


# ---------------------------------------------------------------- shm --

def test_shared_arena_two_mappings_and_unlink(tmp_path):
    fp = small_plan().fingerprint
    a = k.SharedArena("t1", 1 << 16, fp, expected=2, directory=str(tmp_path))
    assert a.creator and a.linked
    b = k.SharedArena("t1", 1 << 16, fp, expected=2, directory=str(tmp_path))
    assert not b.creator and not a.linked  # everyone attached: the name is gone
    assert a.instance == b.instance
    a.view()[:3] = [7, 8, 9]
    assert list(b.view()[:3]) == [7, 8, 9]
    # a new arena under the same name is a different region
    c = k.SharedArena("t1", 1 << 16, fp, expected=1, directory=str(tmp_path))
    assert c.creator and c.instance != a.instance and list(c.view()[:3]) == [0, 0, 0]
    for x in (a, b, c):
        x.close()
    assert os.listdir(tmp_path) == []


def test_shared_arena_refuses_other_configuration(tmp_path):
    fp = small_plan().fingerprint
    a = k.SharedArena("t2", 1 << 16, fp, expected=3, directory=str(tmp_path))
    with pytest.raises(k.KvoError) as e:
        k.SharedArena("t2", 1 << 16, fp ^ 1, expected=3, directory=str(tmp_path))
    assert e.value.code == L.KVO_ESTATE and "plan" in e.value.message
    with pytest.raises(k.KvoError) as e:
        k.SharedArena("t2", 1 << 17, fp, expected=3, directory=str(tmp_path))
    assert e.value.code == L.KVO_ESTATE
    a.close()
    assert os.listdir(tmp_path) == []  # the creator removes a name nobody else took


def test_shared_arena_crash_leaves_nothing(tmp_path):
    """A creator SIGKILLed before the others attached leaves a file whose
    processes are all dead: the next start (or sweep_stale) removes it."""
    fp = small_plan().fingerprint
    code = ("import sys, time, kvoffload as k; "
            f"a = k.SharedArena('t3', 1 << 16, {fp}, expected=2, directory={str(tmp_path)!r}); "
            "print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    assert os.listdir(tmp_path) == ["kvoffload-t3"]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert shm.sweep_stale(str(tmp_path)) == 1
    assert os.listdir(tmp_path) == []
    # and when all attached, a SIGKILL of every process leaves nothing at all
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    b = k.SharedArena("t3", 1 << 16, fp, expected=2, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    b.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", [2**64 + 1, -1])
def test_request_ids_out_of_range_refused(value):
    """A request id must fit uint64_t: ctypes would truncate 2**64 + 1 to 1."""
    plan = small_plan()
    conn = k.Connector(plan, 4 << 20)
    with pytest.raises((OverflowError, ValueError), match="req_id"):
        conn.add_request(value, list(range(64)))
    for call in (lambda: conn.lookup(value), lambda: conn.abort(value), lambda: conn.preempt(value),
                 lambda: conn.request_stats(value), lambda: conn.finish(value, 0)):
        with pytest.raises((OverflowError, ValueError), match="req_id"):
            call()
    with pytest.raises(OverflowError, match="local_tokens"):
        conn.lookup(1, 2**64)
    with pytest.raises(ValueError, match="tables"):
        conn.load(1, 0, [np.array([-1], dtype=np.int64)])
    with pytest.raises(OverflowError, match="cap"):
        conn.poll(1 << 40)
    conn.close()


def test_other_ints_refused_at_the_boundary(tmp_path):
    plan = small_plan()
    with pytest.raises(ValueError, match="group"):
        plan.chunk_keys(-1, np.zeros(4, dtype="<u8"))  # would index the last group
    with pytest.raises(OverflowError, match="parent"):
        plan.hash_tokens(list(range(32)), parent=1 << 128)
    ft = k.FileTier(str(tmp_path), plan, 64 << 20)
    with pytest.raises(OverflowError, match="timeout_ms"):
        ft.flush(1 << 62)
    ft.close()
    xfer = k.Transfer(plan, threads=1)
    with pytest.raises(OverflowError, match=r"segments\[0\].base"):
        xfer.set_layout([dict(group=0, base=1 << 64, num_blocks=4, block_stride=1024, page_bytes=1024)])
    with pytest.raises(ValueError, match="direction"):
        xfer.submit(5, [])
    with pytest.raises(OverflowError, match=r"ops\[0\].first_block"):
        xfer.submit(k.STORE, [dict(group=0, first_block=1 << 32, engine_blocks=[0], slot=0, slot_bytes=1024)])
    with pytest.raises(OverflowError, match="timeout_ns"):
        xfer.wait([], timeout_ns=1 << 63)
    xfer.close()
