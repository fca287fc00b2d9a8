"""kvoffload.lmcache through LMCache 0.5.6's own native_plugin adapter code:
NativePluginL2AdapterConfig.from_dict and the factory build a
NativeConnectorL2Adapter around our connector; stores, lookups and loads go
through the adapter's tasks and eventfds with LMCache's ObjectKey and
TensorMemoryObj.  Run by tools/test-engines.sh; skipped where lmcache is not
installed unless KVO_TEST_ENGINES=1."""
import os
import select
import time

import pytest

if os.environ.get("KVO_TEST_ENGINES") != "1":
    pytest.importorskip("lmcache")
import torch  # noqa: E402

from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import (  # noqa: E402
    NativeConnectorL2Adapter, _object_key_to_string)
from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (  # noqa: E402
    NativePluginL2AdapterConfig, _create_native_plugin_l2_adapter)
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402

from kvoffload.lmcache import KvoffloadL2Connector  # noqa: E402

OBJ = 64 << 10  # bytes of one object (a chunk of KV)


def obj(nbytes=OBJ, fill=None, seed=0):
    raw = torch.zeros(nbytes, dtype=torch.uint8)
    if fill is None:
        raw.copy_(torch.randint(0, 256, (nbytes,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    else:
        raw.fill_(fill)
    meta = MemoryObjMetadata(shape=torch.Size([nbytes]), dtype=torch.uint8, address=0, phy_size=nbytes, ref_count=1)
    return TensorMemoryObj(raw, meta, None)


def okey(i, model="tiny/model", rank=0, group=0):
    return ObjectKey(chunk_hash=i.to_bytes(8, "little") * 4, model_name=model, kv_rank=rank, object_group_id=group)


def adapter(params, max_gb=0.0):
    cfg = NativePluginL2AdapterConfig.from_dict({"type": "native_plugin", "module_path": "kvoffload.lmcache",
                                                 "class_name": "KvoffloadL2Connector", "adapter_params": params,
                                                 "max_capacity_gb": max_gb})
    a = _create_native_plugin_l2_adapter(cfg)
    assert isinstance(a, NativeConnectorL2Adapter)
    return a


def wait_fd(fd, timeout=20.0):
    r, _, _ = select.select([fd], [], [], timeout)
    assert r, "no completion arrived through the eventfd"
    os.eventfd_read(fd)


def store(a, keys, objs):
    """A store task through the adapter; its L2StoreResult (the bytes LMCache
    accounted, -1 for a failed task)."""
    tid = a.submit_store_task(keys, objs)
    deadline = time.time() + 20
    while time.time() < deadline:
        wait_fd(a.get_store_event_fd())
        done = a.pop_completed_store_tasks()
        if tid in done:
            return int(done[tid])
    raise AssertionError("store task never completed")


def nbytes(objs):
    return sum(o.raw_data.numel() for o in objs)


def lookup(a, keys):
    tid = a.submit_lookup_and_lock_task(keys, {})
    deadline = time.time() + 20
    while time.time() < deadline:
        wait_fd(a.get_lookup_and_lock_event_fd())
        bm = a.query_lookup_and_lock_result(tid)
        if bm is not None:
            a.submit_unlock([k for i, k in enumerate(keys) if bm.test(i)])
            return [bm.test(i) for i in range(len(keys))]
    raise AssertionError("lookup task never completed")


def load(a, keys, objs):
    tid = a.submit_load_task(keys, objs)
    deadline = time.time() + 20
    while time.time() < deadline:
        wait_fd(a.get_load_event_fd())
        bm = a.query_load_result(tid)
        if bm is not None:
            return [bm.test(i) for i in range(len(keys))]
    raise AssertionError("load task never completed")


def kvc_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".kvc")]


def test_round_trip_exists_and_restart(tmp_path):
    params = dict(file_root=str(tmp_path), file_bytes=16 << 20)
    a = adapter(params)
    keys = [okey(i) for i in range(6)]
    objs = [obj(seed=i) for i in range(6)]
    assert lookup(a, keys) == [False] * 6
    assert store(a, keys[:4], objs[:4]) == nbytes(objs[:4])
    a._client.flush()
    assert lookup(a, keys) == [True] * 4 + [False] * 2
    out = [obj(fill=0) for _ in range(6)]
    assert load(a, keys, out) == [True] * 4 + [False] * 2
    for o, want in zip(out[:4], objs[:4]):
        assert torch.equal(o.raw_data, want.raw_data)
    assert torch.count_nonzero(out[4].raw_data) == 0
    # another key of the same chunk (other rank, other group, other model) is another object
    assert lookup(a, [okey(0, rank=1), okey(0, group=1), okey(0, model="other")]) == [False] * 3
    a.close()
    # a restart (new adapter, same directory) finds the objects again
    b = adapter(dict(file_root=str(tmp_path), file_bytes=16 << 20))
    assert lookup(b, keys[:4]) == [True] * 4
    out = [obj(fill=0) for _ in range(4)]
    assert load(b, keys[:4], out) == [True] * 4
    assert all(torch.equal(o.raw_data, w.raw_data) for o, w in zip(out, objs))
    b.close()


def test_partial_objects_and_size_mismatch_are_exact(tmp_path):
    a = adapter(dict(file_root=str(tmp_path), file_bytes=16 << 20, object_bytes=OBJ))
    small = obj(1000, seed=3)
    assert store(a, [okey(1)], [small]) == 1000
    a._client.flush()
    out = obj(1000, fill=0)
    assert load(a, [okey(1)], [out]) == [True]
    assert torch.equal(out.raw_data, small.raw_data)
    wrong = obj(OBJ, fill=7)  # a buffer of another size: a miss, its bytes untouched
    assert load(a, [okey(1)], [wrong]) == [False]
    assert int(wrong.raw_data.min()) == 7 and int(wrong.raw_data.max()) == 7
    too_big = obj(OBJ + 1, seed=4)  # larger than this store's objects: not stored
    store(a, [okey(2)], [too_big])
    assert lookup(a, [okey(2)]) == [False]
    a.close()


def test_capacity_bound_respected(tmp_path):
    quota = 8 * (OBJ + 4096 + 16)  # about eight objects on disk
    a = adapter(dict(file_root=str(tmp_path), file_bytes=quota), max_gb=quota / (1 << 30))
    keys = [okey(i) for i in range(40)]
    for s in range(0, 40, 8):
        assert store(a, keys[s: s + 8], [obj(seed=i) for i in range(s, s + 8)]) == 8 * OBJ
        a._client.flush()
    st = a._client.stats()["file"]
    assert st["bytes_used"] <= st["quota_bytes"] <= quota
    assert st["evictions"] >= 30
    found = lookup(a, keys)
    assert 0 < sum(found) <= 9
    assert found[-1]  # the newest survive
    # what is left reads back byte-exact
    live = [i for i, f in enumerate(found) if f]
    out = [obj(fill=0) for _ in live]
    assert load(a, [keys[i] for i in live], out) == [True] * len(live)
    assert all(torch.equal(o.raw_data, obj(seed=i).raw_data) for o, i in zip(out, live))
    usage = a.get_usage()  # LMCache's own accounting of what it stored through us
    assert usage.total_capacity_bytes == int(quota / (1 << 30) * (1 << 30))
    a.close()


def test_corrupted_object_is_a_miss(tmp_path):
    a = adapter(dict(file_root=str(tmp_path), file_bytes=16 << 20))
    assert store(a, [okey(5)], [obj(seed=5)]) == OBJ
    a._client.flush()
    (f,) = kvc_files(tmp_path)
    with open(f, "r+b") as fh:
        fh.seek(4096 + 100)
        b = fh.read(1)
        fh.seek(4096 + 100)
        fh.write(bytes([b[0] ^ 0x01]))
    out = obj(fill=9)
    assert load(a, [okey(5)], [out]) == [False]
    assert int(out.raw_data.min()) == 9 and int(out.raw_data.max()) == 9
    assert lookup(a, [okey(5)]) == [False]
    a.close()


def test_delete_and_eventfd_is_cleared(tmp_path):
    c = KvoffloadL2Connector(file_root=str(tmp_path), file_bytes=16 << 20)
    fd = c.event_fd()
    keys = [_object_key_to_string(okey(i)) for i in range(3)]
    assert keys[0].startswith("tiny/model@00000000@0@")
    bufs = [obj(seed=i).byte_array for i in range(3)]
    f1 = c.submit_batch_set(keys, bufs)
    select.select([fd], [], [], 20)
    got = []
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        select.select([fd], [], [], 1)
        got = c.drain_completions()
    assert got == [(f1, True, "", [True, True, True])]
    # drained: the eventfd is not readable any more (LMCache polls it, never reads it)
    assert select.select([fd], [], [], 0)[0] == []
    c.flush()
    f2 = c.submit_batch_exists(keys)
    select.select([fd], [], [], 20)
    assert c.drain_completions() == [(f2, True, "", [True, True, True])]
    f3 = c.submit_batch_delete(keys[:1])
    select.select([fd], [], [], 20)
    assert c.drain_completions() == [(f3, True, "", [True])]
    f4 = c.submit_batch_exists(keys)
    select.select([fd], [], [], 20)
    assert c.drain_completions() == [(f4, True, "", [False, True, True])]
    assert select.select([fd], [], [], 0)[0] == []
    c.close()


def test_redis_cluster_objects_between_servers(tmp_path):
    a_ = os.environ.get("KVO_TEST_REDIS")
    if not a_:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-engines.sh starts a Redis Cluster)")
    params = dict(redis_url=f"redis://{a_}", redis_prefix=f"lmc{os.getpid()}{time.time_ns() % 100000}",
                  object_bytes=OBJ)
    a = adapter(params)
    keys = [okey(i) for i in range(5)]
    objs = [obj(seed=10 + i) for i in range(5)]
    assert store(a, keys, objs) == nbytes(objs)
    a._client.flush()
    b = adapter(dict(params, file_root=str(tmp_path), file_bytes=16 << 20))  # another server
    assert lookup(b, keys + [okey(99)]) == [True] * 5 + [False]
    out = [obj(fill=0) for _ in range(5)]
    assert load(b, keys, out) == [True] * 5
    assert all(torch.equal(o.raw_data, w.raw_data) for o, w in zip(out, objs))
    a.close()
    b.close()


def test_password_in_redis_url_warned_without_the_secret(tmp_path, caplog):
    """LMCache logs its configuration, adapter_params with it: a password in
    redis_url is warned about (once, redacted)."""
    import logging
    from kvoffload import core
    core._password_warned.discard("redis_url")
    params = dict(file_root=str(tmp_path), file_bytes=16 << 20, object_bytes=OBJ,
                  redis_url="redis://u:Lmc@Secret9@127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        try:
            adapter(params).close()
        except Exception:  # nothing listens on port 1: only the warning matters here
            pass
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "redis_url" in text and "KVO_REDIS_PASSWORD" in text
    assert "Secret9" not in text


def test_without_object_bytes_a_first_partial_object_turns_no_full_one_away(tmp_path):
    """No object_bytes: the first object stored is a last, partial chunk
    (1000 bytes).  The full objects after it are stored and found, byte for
    byte, and after a restart too (the first object fixed the size for good:
    every full one was refused, lookup 0/8)."""
    params = dict(file_root=str(tmp_path), file_bytes=16 << 20)
    a = adapter(params)
    assert store(a, [okey(100)], [obj(1000, seed=100)]) == 1000
    keys = [okey(i) for i in range(8)]
    objs = [obj(seed=i) for i in range(8)]
    assert store(a, keys, objs) == nbytes(objs)
    a._client.flush()
    assert lookup(a, keys) == [True] * 8
    out = [obj(fill=0) for _ in range(8)]
    assert load(a, keys, out) == [True] * 8
    assert all(torch.equal(o.raw_data, w.raw_data) for o, w in zip(out, objs))
    # partial objects after the size is set take a full value, byte-exact
    tail = obj(3000, seed=9)
    assert store(a, [okey(9)], [tail]) == 3000
    a._client.flush()
    got = obj(3000, fill=0)
    assert load(a, [okey(9)], [got]) == [True] and torch.equal(got.raw_data, tail.raw_data)
    a.close()
    b = adapter(params)   # a restart
    assert lookup(b, keys) == [True] * 8
    out = [obj(fill=0) for _ in range(8)]
    assert load(b, keys, out) == [True] * 8
    assert all(torch.equal(o.raw_data, w.raw_data) for o, w in zip(out, objs))
    b.close()


def test_salted_keys_are_apart(tmp_path):
    """LMCache's cache_salt (a tenant) ends the key: an object stored under
    one salt is found under that salt only."""
    a = adapter(dict(file_root=str(tmp_path), file_bytes=16 << 20, object_bytes=OBJ))
    k1 = ObjectKey(chunk_hash=b"\x07" * 32, model_name="tiny/model", kv_rank=0, object_group_id=0, cache_salt="u1")
    k2 = ObjectKey(chunk_hash=b"\x07" * 32, model_name="tiny/model", kv_rank=0, object_group_id=0, cache_salt="u2")
    o = obj(seed=7)
    assert store(a, [k1], [o]) == OBJ
    a._client.flush()
    assert lookup(a, [k1, k2, okey(7)]) == [True, False, False]
    # each tenant's counters, by label (never the salt)
    from kvoffload.tenants import tenant_label
    t = a._client.stats()["tenants"]
    u1, u2, d = t[tenant_label("u1")], t[tenant_label("u2")], t["default"]
    assert (u1["set_keys"], u1["stored_keys"], u1["lookup_keys"], u1["hit_keys"]) == (1, 1, 1, 1), u1
    assert (u2["set_keys"], u2["lookup_keys"], u2["hit_keys"]) == (0, 1, 0), u2
    assert (d["lookup_keys"], d["hit_keys"]) == (1, 0), d
    a.close()


def test_tenant_file_part_keeps_its_objects(tmp_path):
    """tenant_file_bytes gives salt u1 a file tier of its own
    (file_root/tenants/<label>): 40 objects of u2 overflow the shared tier
    (room for 8) and u1's 4 objects stay, loaded byte-exact; the control (no
    part) loses them."""
    from kvoffload.tenants import tenant_label
    quota = 8 * (OBJ + 4096 + 16)
    held = {}
    for with_part in (True, False):
        params = dict(file_root=str(tmp_path / f"r{int(with_part)}"), file_bytes=quota, object_bytes=OBJ)
        if with_part:
            params["tenant_file_bytes"] = {tenant_label("u1"): quota}
        a = adapter(params)
        mine = [ObjectKey(chunk_hash=bytes([i]) * 32, model_name="tiny/model", kv_rank=0, object_group_id=0,
                          cache_salt="u1") for i in range(4)]
        assert store(a, mine, [obj(seed=100 + i) for i in range(4)]) == 4 * OBJ
        a._client.flush()
        for s in range(0, 40, 8):
            theirs = [ObjectKey(chunk_hash=(1000 + i).to_bytes(4, "little") * 8, model_name="tiny/model", kv_rank=0,
                                object_group_id=0, cache_salt="u2") for i in range(s, s + 8)]
            assert store(a, theirs, [obj(seed=i) for i in range(s, s + 8)]) == 8 * OBJ
            a._client.flush()
        held[with_part] = sum(lookup(a, mine))
        if with_part:
            out = [obj(fill=0) for _ in mine]
            assert load(a, mine, out) == [True] * 4
            assert all(torch.equal(o.raw_data, obj(seed=100 + i).raw_data) for i, o in enumerate(out))
            assert kvc_files(tmp_path / "r1" / "tenants" / tenant_label("u1"))
        a.close()
    assert held == {True: 4, False: 0}, held


def _stored_over_cluster(tmp_path, seed):
    """An adapter over a file tier and the cluster with 4 objects stored:
    (its params, the adapter, the keys, the objects)."""
    a_ = os.environ.get("KVO_TEST_REDIS")
    if not a_:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-engines.sh starts a Redis Cluster)")
    params = dict(redis_url=f"redis://{a_}", redis_prefix=f"lmcdel{os.getpid()}{time.time_ns() % 100000}",
                  object_bytes=OBJ, file_root=str(tmp_path), file_bytes=16 << 20)
    a = adapter(params, max_gb=1.0)
    keys = [okey(i) for i in range(4)]
    objs = [obj(seed=seed + i) for i in range(4)]
    assert store(a, keys, objs) == nbytes(objs)
    a._client.flush()
    assert a.get_usage().total_bytes_used == nbytes(objs)
    return params, a, keys, objs


def test_delete_never_claims_deleted_what_a_tier_holds(tmp_path):
    """Over a file tier and the cluster: a deleted key leaves the file tier
    and the cluster (a DEL waited for), and is reported deleted exactly when
    no tier holds it any more: another server loads none of them, and
    LMCache's usage (which falls by what the completion reports deleted)
    keeps the bytes of exactly those another server still loads.  Through
    the adapter: its demux thread takes every completion of the client."""
    params, a, keys, objs = _stored_over_cluster(tmp_path, 20)
    a.delete(keys)
    assert not a._client.stats()["file"]["files"]   # gone from the file tier
    other = adapter(dict(params, file_root=str(tmp_path / "other")))
    out = [obj(fill=0) for _ in range(4)]
    held = load(other, keys, out)
    assert held == [False] * 4   # gone from the cluster too ...
    # ... and so reported deleted: no byte of them is still counted
    assert a.get_usage().total_bytes_used == nbytes([o for o, h in zip(objs, held) if h])
    other.close()
    a.close()


def test_delete_over_the_cluster_frees_lmcache_usage(tmp_path):
    """LMCache deletes what its eviction chose: the values leave the cluster
    too, so its L2 usage falls (it stayed at what was stored: 200 % of
    max_capacity_gb after eviction ran)."""
    params, a, keys, objs = _stored_over_cluster(tmp_path, 30)
    a.delete(keys)
    assert a.get_usage().total_bytes_used == 0
    other = adapter(dict(params, file_root=str(tmp_path / "other")))
    assert lookup(other, keys) == [False] * 4
    other.close()
    a.close()
