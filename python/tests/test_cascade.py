"""The Python binding of the cascade (kvoffload.cascade) against the real
library: the structs' sizes, namespaces, the host tier over a file tier,
promotion, the direct calls."""
import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import kvoffload as k
from kvoffload import _lib as L
from kvoffload import cascade as kc

HERE = os.path.dirname(os.path.abspath(__file__))


def small_plan(page_bytes=4096):
    return k.Plan(k.Model("casc", 16, [dict(name="full", tokens_per_block=16, layers=2, page_bytes=page_bytes)]),
                  blocks_per_chunk=2)


def test_struct_sizes_match_c(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    root = os.path.join(HERE, "..", "..")
    incs = ["-I", os.path.join(root, "include")]
    for d in [os.path.join(os.path.dirname(k.LIBRARY_PATH), "include"), os.path.join(root, "build", "include")]:
        if os.path.exists(os.path.join(d, "kvoffload", "kvo_version.h")):
            incs += ["-I", d]
    names = {"kvo_namespace_desc": kc.NamespaceDesc, "kvo_cascade_params": kc.CascadeParams,
             "kvo_cascade_wait": kc.CascadeWait, "kvo_cascade_lookup_result": kc.CascadeLookupResult,
             "kvo_cascade_completion": kc.CascadeCompletion, "kvo_cascade_tier_stats": kc.CascadeTierStats,
             "kvo_cascade_stats": kc.CascadeStats, "kvo_cascade_tenant": L.CascadeTenant,
             "kvo_store_params": L.StoreParams, "kvo_connector_params": L.ConnectorParams}
    src = tmp_path / "sizes.c"
    src.write_text('#include <stdio.h>\n#include "kvoffload/kvo.h"\nint main(void){' +
                   "".join(f'printf("{n} %zu\\n", sizeof({n}));' for n in names) + "return 0;}\n")
    exe = tmp_path / "sizes"
    subprocess.run([cc, *incs, str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        name, size = line.split()
        assert ctypes.sizeof(names[name]) == int(size), name


def test_namespaces_keep_models_and_tenants_apart():
    p = small_plan()
    a = kc.namespace_id(p, engine="vllm", model="/models/客户甲/llama", dtype="bfloat16")
    b = kc.namespace_id(p, engine="vllm", model="/models/客户乙/llama", dtype="bfloat16")
    assert a != b
    assert kc.namespace_id(p, engine="vllm", model="acme/x") != kc.namespace_id(p, engine="vllm", model="acme:x")
    assert kc.namespace_id(p, model="m", tenant="t1") != kc.namespace_id(p, model="m", tenant="t2")
    assert kc.namespace_id(p, model="m") == kc.namespace_id(p, model=b"m")
    ka = kc.namespace_keys(a, [b"block-hash-1", b"block-hash-2"])
    kb = kc.namespace_keys(b, [b"block-hash-1", b"block-hash-2"])
    assert ka.dtype == k.KEY_DTYPE and len(ka) == 2
    assert not np.array_equal(ka, kb)
    assert np.array_equal(ka, kc.namespace_keys(a, np.frombuffer(b"block-hash-1block-hash-2", np.uint8).reshape(2, 12)))


def _fill(c, slot, key_i, nbytes):
    v = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(c.base + int(slot["offset"])))
    v[:] = (np.arange(nbytes) * 7 + key_i) % 251


def test_host_over_file_store_promote_load(tmp_path):
    p = small_plan()
    g = p.groups[0]
    ft = k.FileTier(str(tmp_path), p, 64 << 20)
    c = kc.Cascade(p, 4 * g["slot_bytes"], file_tier=ft)
    keys = k.make_keys(list(range(1, 9)), 0)
    for part in (keys[:4], keys[4:]):  # the second half evicts the first from the 4 host slots
        need, slots = c.prepare_store(part)
        assert (need == kc.HOST).all()
        for i, s in enumerate(slots):
            _fill(c, s, int(part[i]["lo"]), g["chunk_bytes"])
        c.complete_store(part)
    c.flush(20000)
    st, tiers, r = c.lookup(keys)
    assert r["prefix"] == 8 and r["file"] == 4 and r["host"] == 4
    st, tiers, r = c.lookup(keys[:4], kc.PREFIX | kc.PROMOTE)
    assert r["promoting"] == 4
    got = []
    for _ in range(400):
        got += list(c.poll())
        if len(got) == 4:
            break
        c.wait_events(50)
    assert len(got) == 4 and all(x["result"] == 0 and x["tier"] == kc.TIER_FILE for x in got)
    slots = c.prepare_load(keys[:4])
    for i, s in enumerate(slots):
        v = np.ctypeslib.as_array((ctypes.c_uint8 * g["chunk_bytes"]).from_address(c.base + int(s["offset"])))
        assert np.array_equal(v, (np.arange(g["chunk_bytes"]) * 7 + i + 1) % 251)
    c.complete_load(keys[:4])
    s = c.stats()
    assert s["file"]["promotions"] == 4 and s["file"]["writes"] == 8
    c.close()
    ft.close()


def test_tenant_parts_by_label(tmp_path):
    """tenant_host_bytes: alice's keys (tagged with her part) stay while the
    shared part churns; her own traffic evicts only her own; host_stats and
    host_events cover every part; a salt in place of a label is refused."""
    p = small_plan()
    slot = p.groups[0]["slot_bytes"]
    alice = kc.tenant_label("alice-secret")
    c = kc.Cascade(p, 8 * slot, tenant_host_bytes={alice: 4 * slot}, event_capacity=64)
    assert c.tenant_part("alice-secret") == 1 and c.tenant_part("bob") == 0 and c.tenant_part(None) == 0
    mine = k.make_keys(list(range(1, 7)), 0)
    mine["tenant"] = 1
    theirs = k.make_keys(list(range(100, 120)), 0)

    def store(keys):
        for i in range(0, len(keys), 2):
            need, slots = c.prepare_store(keys[i:i + 2])
            assert (need == kc.HOST).all()
            c.complete_store(keys[i:i + 2])
    store(mine[:4])
    store(theirs)          # 20 chunks through the shared 4 slots
    assert (c.lookup(mine[:4], 0)[0] == k.READY).all()
    store(mine[4:])        # alice's own: evicts her oldest two
    st = c.lookup(mine, 0)[0]
    assert list(st) == [k.MISS, k.MISS, k.READY, k.READY, k.READY, k.READY], st
    untagged = mine.copy()
    untagged["tenant"] = 0
    assert (c.lookup(untagged, 0)[0] == k.MISS).all()   # another part's key is a miss
    hs = c.host_stats()
    assert hs["capacity_bytes"] == 8 * slot and hs["entries"] == 8, hs
    ev = c.host_events()
    assert ((ev["type"] == 2) & (ev["key"]["tenant"] == 1)).sum() == 2   # alice's two evictions, tagged
    c.close()
    with pytest.raises(L.KvoError, match="not a tenant label"):
        kc.Cascade(p, 8 * slot, tenant_host_bytes={"alice-secret": 4 * slot})


def test_direct_calls_without_a_host_tier(tmp_path):
    p = small_plan()
    g = p.groups[0]
    ft = k.FileTier(str(tmp_path), p, 64 << 20)
    c = kc.Cascade(p, file_tier=ft)
    keys = k.make_keys([11, 12, 13], 0)
    src = np.zeros((3, g["chunk_bytes"]), dtype=np.uint8)
    src[:] = np.arange(3)[:, None] + 1
    res = c.write(keys[:2], [src[0].ctypes.data, src[1].ctypes.data], timeout_ms=20000)
    assert list(res) == [0, 0]
    c.flush(20000)
    dst = np.zeros((3, g["slot_bytes"]), dtype=np.uint8)
    res = c.read(keys, [d.ctypes.data for d in dst], user_data=[1, 2, 3])
    assert res[0] == 0 and res[1] == 0 and res[2] == L.KVO_ENOTFOUND
    got = []
    for _ in range(400):
        got += list(c.poll())
        if len(got) == 2:
            break
        c.wait_events(50)
    assert sorted(int(x["user_data"]) for x in got) == [1, 2]
    assert (dst[0, :g["chunk_bytes"]] == 1).all() and (dst[1, :g["chunk_bytes"]] == 2).all()
    c.remove(keys[:1])
    st, _, r = c.lookup(keys)
    assert r["prefix"] == 0 and st[1] == k.READY
    with pytest.raises(k.KvoError) as e:
        c.prepare_store(keys)
    assert e.value.code == L.KVO_EINVAL
    c.close()
    ft.close()


def test_string_ids_hash_whole_whatever_the_batch():
    """An id's key does not depend on the other ids of its batch (ids of
    other lengths once padded it), and an id ending in zeros is not the
    shorter one."""
    p = small_plan()
    ns = kc.namespace_id(p, engine="sglang", model="m")
    alone = kc.namespace_keys(ns, ["ab"])
    mixed = kc.namespace_keys(ns, ["ab", "abcdef", b"ab\0"])
    assert np.array_equal(mixed[:1], alone)
    assert not np.array_equal(mixed[2:3], alone)
    assert np.array_equal(kc.namespace_keys(ns, [b"ab"], id_len=3), mixed[2:3])  # padded on request


def test_engine_cascade_read_wait_from_threads(tmp_path):
    """engine_cascade owns its tiers (closed after it); read_wait from
    several threads at once: each gets its own keys' results, verified
    bytes in its memory, a miss for a key no tier holds."""
    import threading
    p = small_plan()
    g = p.groups[0]
    c = kc.engine_cascade(p, file=dict(root=str(tmp_path), quota_bytes=64 << 20, shared=True))
    ft = c.file_tier
    keys = k.make_keys(list(range(1, 41)), 0)
    src = np.zeros((40, g["chunk_bytes"]), dtype=np.uint8)
    src[:] = (np.arange(40)[:, None] * 3 + 1) % 251
    assert (c.write(keys, [r.ctypes.data for r in src], timeout_ms=20000) == 0).all()
    c.flush(20000)
    assert c.held(keys).all() and not c.held(k.make_keys([999], 0)).any()
    errors = []

    def reader(part):
        try:
            ks = np.concatenate([keys[part::4], k.make_keys([1000 + part], 0)])
            dst = np.zeros((len(ks), g["slot_bytes"]), dtype=np.uint8)
            for _ in range(5):
                res = c.read_wait(ks, [d.ctypes.data for d in dst])
                assert (res[:-1] == 0).all() and res[-1] == L.KVO_ENOTFOUND
                assert np.array_equal(dst[:-1, :g["chunk_bytes"]], src[part::4])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    res = c.remove_wait(np.concatenate([keys[:2], k.make_keys([999], 0)]))
    assert list(res) == [0, 0, L.KVO_ENOTFOUND]
    assert not c.held(keys[:2]).any() and c.held(keys[2:]).all()
    assert not c._router.mine   # no user data left waiting: misses and refusals included
    c.close(flush_ms=20000)
    with pytest.raises(k.KvoError):   # the owned tier closed with it
        ft.stats()
