"""kvoffload.sglang through SGLang 0.5.23's own classes: the dynamic-backend
factory builds the back end, SGLang's host pools (MHA, MLA, Mamba) hold the
pages in CPU memory, PoolTransfer drives the hybrid (v2) calls.  Every round
trip compares bytes.  Run by tools/test-engines.sh (the engines venv);
skipped where sglang is not installed unless KVO_TEST_ENGINES=1."""
import os
import time

import pytest

if os.environ.get("KVO_TEST_ENGINES") != "1":
    pytest.importorskip("sglang")
import torch  # noqa: E402

from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorageConfig, PoolHitPolicy, PoolName,  # noqa: E402
                                                  PoolTransfer)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

import kvoffload as k  # noqa: E402
from kvoffload.sglang import KvoffloadHiCacheStorage  # noqa: E402

PS = 4  # tokens per page
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def mha_host(layout, layers=3, heads=2, dim=8, dtype=torch.float16, tokens=256):
    dev = MHATokenToKVPool(tokens, PS, dtype, heads, dim, layers, "cpu", False, start_layer=0, end_layer=layers - 1)
    return MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2, 0, PS, layout, pin_memory=False,
                                device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                end_layer=dev.end_layer)


def mla_host(layout, layers=2):
    dev = MLATokenToKVPool(256, PS, torch.bfloat16, 16, 8, layers, "cpu", False, start_layer=0, end_layer=layers - 1)
    return MLATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2, 0, PS, layout, pin_memory=False,
                                device_capacity_tokens=dev.size, start_layer=dev.start_layer,
                                end_layer=dev.end_layer, target_layer_num=layers)


def mamba_host(slots=16):
    info = MambaStateBufferInfo(temporal=torch.zeros(2, slots, 4, 8, dtype=torch.float32),
                                conv=(torch.zeros(2, slots, 6, 3, dtype=torch.bfloat16),))
    return MambaPoolHost(info, 2, 0, device_capacity=slots, pin_memory=False, layout="page_first")


def randomize(host, seed=0):
    g = torch.Generator().manual_seed(seed)
    bufs = [host.kv_buffer] if hasattr(host, "kv_buffer") and host.kv_buffer is not None else []
    if isinstance(host, MambaPoolHost):
        bufs = [host.temporal_buffer, *host.conv_buffer]
    for b in bufs:
        raw = b.view(torch.uint8) if b.is_contiguous() else None
        assert raw is not None
        raw.copy_(torch.randint(0, 256, raw.shape, generator=g, dtype=torch.uint8))


def page(host, idx):
    return host.get_data_page(idx * host.page_size, flat=True).contiguous().view(torch.uint8).clone()


def indices(host, pages):
    return torch.cat([torch.arange(p * host.page_size, (p + 1) * host.page_size) for p in pages]).to(torch.int64)


def config(extra, tp_rank=0, tp_size=1, mla=False, model="tiny/model"):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name=model, extra_config=extra)


def dynamic(extra):
    return dict(backend_name="kvoffload", module_path="kvoffload.sglang", class_name="KvoffloadHiCacheStorage",
                **extra)


def build(host, extra, **kw):
    """As SGLang's cache controller does: factory, then register the host pool."""
    cfg = config(dynamic(extra), **kw)
    be = StorageBackendFactory.create_backend("dynamic", cfg, host)
    be.register_mem_pool_host(host)
    return be


def redis_url():
    a = os.environ.get("KVO_TEST_REDIS")
    if not a:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-engines.sh starts a Redis Cluster)")
    return f"redis://{a}"


def kvc_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".kvc")]


def test_factory_builds_kvoffload_backend(tmp_path):
    host = mha_host("page_first")
    be = build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24))
    assert isinstance(be, KvoffloadHiCacheStorage)
    assert be.stores["kv"].fmt == "flat"  # the base calls: SGLang's flat pages
    be.close()
    with pytest.raises(ValueError, match="kvo_file_root"):
        build(host, {})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_zero_copy_round_trip_mha(tmp_path, layout):
    host = mha_host(layout)
    randomize(host, 1)
    be = build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1))
    st = be.stores["kv"]
    assert st.fmt == "segments"  # the transfer engine gathers the pages
    keys = [f"h{i}" for i in range(6)]
    src = [3, 9, 4, 20, 21, 7]
    want = [page(host, p) for p in src]
    assert be.batch_exists(keys) == 0
    assert be.batch_set_v1(keys, indices(host, src)) == [True] * 6
    be.flush()
    assert be.batch_exists(keys) == 6
    assert be.batch_exists(keys[:3] + ["absent"] + keys[3:]) == 3
    dst = [40, 41, 60, 2, 33, 50]
    before = [page(host, p) for p in dst]
    assert all(not torch.equal(a, b) for a, b in zip(before, want))
    got = be.batch_get_v1(keys + ["absent"], indices(host, dst + [70]))
    assert got == [True] * 6 + [False]
    for p, w in zip(dst, want):
        assert torch.equal(page(host, p), w)
    be.close()


def test_a_controller_batch_is_stored_whole(tmp_path):
    """SGLang backs up 128 pages per call (STORAGE_BATCH_SIZE), more than the
    file tier queues at once (64 writes): the back end waits instead of
    dropping pages."""
    host = mha_host("page_first", tokens=1024)
    randomize(host, 11)
    be = build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 26, interface_v1=1))
    keys = [f"b{i}" for i in range(128)]
    assert be.batch_set_v1(keys, indices(host, list(range(128)))) == [True] * 128
    be.flush()
    assert be.batch_exists(keys) == 128
    assert be.batch_get_v1(keys, indices(host, list(range(200, 328)))) == [True] * 128
    assert all(torch.equal(page(host, 200 + i), page(host, i)) for i in range(128))
    assert be.get_stats()["kv"]["file"]["writes"] == 128
    be.close()


def test_base_get_set_flat_pages(tmp_path):
    host = mha_host("layer_first")
    randomize(host, 2)
    be = build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24))
    vals = [host.get_data_page(p * PS) for p in (5, 6, 7)]
    assert be.batch_set(["a", "b", "c"], vals)
    assert be.set("d", host.get_data_page(8 * PS))
    be.flush()
    assert be.exists("a") and not be.exists("zz")
    out = be.batch_get(["a", "b", "c", "zz"], [host.get_dummy_flat_data_page() for _ in range(4)])
    assert out[3] is None
    for o, v in zip(out[:3], vals):
        assert torch.equal(o.view(torch.uint8), v.contiguous().view(torch.uint8))
    d = be.get("d", host.get_dummy_flat_data_page())
    assert torch.equal(d.view(torch.uint8), host.get_data_page(8 * PS).contiguous().view(torch.uint8))
    # the controller's generic path: set_from_flat_data_page of what get returned
    host.set_from_flat_data_page(30 * PS, out[0])
    assert torch.equal(page(host, 30), page(host, 5))
    be.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mla_pages_are_shared_by_tp_ranks(tmp_path, layout):
    host = mla_host(layout)
    randomize(host, 3)
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    r0 = build(host, extra, mla=True, tp_rank=0, tp_size=2)
    assert r0.batch_set_v1(["p0", "p1"], indices(host, [1, 2])) == [True, True]
    r0.flush()
    want = [page(host, 1), page(host, 2)]
    r0.close()
    other = mla_host(layout)
    r1 = build(other, extra, mla=True, tp_rank=1, tp_size=2)  # MLA KV is replicated: rank 1 reads rank 0's
    assert r1.batch_get_v1(["p0", "p1"], indices(other, [10, 11])) == [True, True]
    assert torch.equal(page(other, 10), want[0]) and torch.equal(page(other, 11), want[1])
    r1.close()


def test_mha_ranks_and_layouts_never_share_values(tmp_path):
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    host = mha_host("page_first")
    randomize(host, 4)
    r0 = build(host, extra, tp_rank=0, tp_size=2)
    assert all(r0.batch_set_v1(["x", "y"], indices(host, [1, 2])))
    r0.flush()
    assert r0.batch_exists(["x", "y"]) == 2
    r1 = build(mha_host("page_first"), extra, tp_rank=1, tp_size=2)  # MHA heads are sharded per rank
    assert r1.batch_exists(["x", "y"]) == 0
    lf = build(mha_host("layer_first"), extra, tp_rank=0, tp_size=2)  # same rank, other host layout
    assert lf.batch_exists(["x", "y"]) == 0
    other_model = build(mha_host("page_first"), extra, tp_rank=0, tp_size=2, model="other/model")
    assert other_model.batch_exists(["x"]) == 0
    for b in (r0, r1, lf, other_model):
        b.close()


def test_restart_finds_pages_again(tmp_path):
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    host = mha_host("page_first_direct")
    randomize(host, 5)
    keys = [f"r{i}" for i in range(10)]
    be = build(host, extra)
    assert all(be.batch_set_v1(keys, indices(host, list(range(10, 20)))))
    want = [page(host, p) for p in range(10, 20)]
    be.close()  # flushes; a new process would start here
    fresh = mha_host("page_first_direct")
    be2 = build(fresh, extra)
    assert be2.batch_exists(keys) == 10
    assert be2.batch_get_v1(keys, indices(fresh, list(range(40, 50)))) == [True] * 10
    for p, w in zip(range(40, 50), want):
        assert torch.equal(page(fresh, p), w)
    be2.close()


def test_corrupted_page_is_a_miss(tmp_path):
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    host = mha_host("page_first")
    randomize(host, 6)
    be = build(host, extra)
    assert all(be.batch_set_v1(["good", "bad"], indices(host, [1, 2])))
    be.flush()
    files = kvc_files(tmp_path)
    assert len(files) == 2
    # flip one payload byte of every file; reading must never deliver it
    for f in files:
        with open(f, "r+b") as fh:
            fh.seek(4096 + 17)
            b = fh.read(1)
            fh.seek(4096 + 17)
            fh.write(bytes([b[0] ^ 0xFF]))
    before = [page(host, 30), page(host, 31)]
    assert be.batch_get_v1(["good", "bad"], indices(host, [30, 31])) == [False, False]
    assert torch.equal(page(host, 30), before[0]) and torch.equal(page(host, 31), before[1])
    assert be.get_stats()["kv"]["file"]["corrupt_removed"] == 2
    assert be.batch_exists(["good"]) == 0  # removed on detection
    be.close()


def test_hybrid_pools_v2(tmp_path):
    """A hybrid (attention + Mamba) model: KV pages and Mamba states, each
    pool with its own transfer, as the hybrid cache controller calls them."""
    kv, mamba = mha_host("page_first"), mamba_host()
    randomize(kv, 7)
    randomize(mamba, 8)
    be = build(kv, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1))
    be.register_mem_host_pool_v2(kv, PoolName.KV)
    be.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    be.on_host_pools_registered()
    assert be.stores["mamba"].fmt == "segments"
    keys = [f"k{i}" for i in range(5)]
    kv_pages, state_slot = [3, 4, 5, 6, 7], 9
    want_kv = [page(kv, p) for p in kv_pages]
    want_state = page(mamba, state_slot)
    assert all(be.batch_set_v1(keys, indices(kv, kv_pages)))
    res = be.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([state_slot]),
                                        keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert res == {PoolName.MAMBA: [True]}
    be.flush()
    probe = PoolTransfer(name=PoolName.MAMBA, keys=keys[-1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    hit = be.batch_exists_v2(keys, [probe])
    assert hit.kv_hit_pages == 5 and hit.extra_pool_hit_pages == {PoolName.KV: 5, PoolName.MAMBA: 5}
    assert hit.restorable_prefix_pages == [5]  # the state exists only at the end of page 5
    # a prefix that ends where no state was stored has no restorable point
    assert be.batch_exists_v2(keys[:3], [probe]).kv_hit_pages == 0
    # restore into other host slots
    got = be.batch_get_v2([
        PoolTransfer(name=PoolName.KV, host_indices=indices(kv, [20, 21, 22, 23, 24]), keys=keys),
        PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([2]), keys=keys[-1:]),
    ])
    assert got == {PoolName.KV: [True] * 5, PoolName.MAMBA: [True]}
    for p, w in zip([20, 21, 22, 23, 24], want_kv):
        assert torch.equal(page(kv, p), w)
    assert torch.equal(page(mamba, 2), want_state)
    # a pool that was never registered is a miss, not an exception
    assert be.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=torch.tensor([0, 1, 2, 3]),
                                         keys=["k0"])]) == {PoolName.SWA: [False]}
    be.close()


def test_unsupported_layout_is_refused(tmp_path):
    host = mha_host("page_head")
    with pytest.raises(ValueError, match="page_head"):
        build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24))


def test_redis_cluster_shares_pages_between_engines(tmp_path):
    url = redis_url()
    extra = dict(kvo_redis_url=url, kvo_redis_prefix=f"sgl{os.getpid()}{time.time_ns() % 100000}",
                 interface_v1=1)
    try:
        a_host = mha_host("page_first")
        a = build(a_host, extra)
    except k.KvoError as e:
        if e.name == "KVO_ENOTSUP":
            pytest.skip("library built without hiredis")
        raise
    randomize(a_host, 9)
    keys = [f"c{i}" for i in range(8)]
    want = [page(a_host, p) for p in range(8)]
    assert all(a.batch_set_v1(keys, indices(a_host, list(range(8)))))
    a.flush()
    # engine b: another process with its own file tier; the cluster answers what its files lack
    b_host = mha_host("page_first")
    b = build(b_host, dict(extra, kvo_file_root=str(tmp_path / "b"), kvo_file_bytes=1 << 24))
    assert b.batch_exists(keys + ["nope"]) == 8
    assert b.batch_get_v1(keys, indices(b_host, list(range(30, 38)))) == [True] * 8
    for p, w in zip(range(30, 38), want):
        assert torch.equal(page(b_host, p), w)
    b.flush()
    assert len(kvc_files(tmp_path / "b")) == 8  # what the cluster gave is kept locally
    a.close()
    b.close()


def test_password_in_redis_url_warned_without_the_secret(tmp_path, caplog):
    """SGLang logs its server arguments, the extra config with them: a
    password in kvo_redis_url is warned about (once, redacted)."""
    import logging
    from kvoffload import core
    core._password_warned.discard("kvo_redis_url")
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24,
                 kvo_redis_url="redis://u:Sgl@Secret9@127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="kvoffload"):
        try:
            KvoffloadHiCacheStorage(config(dynamic(extra))).close()
        except Exception:  # nothing listens on port 1: only the warning matters here
            pass
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "kvo_redis_url" in text and "KVO_REDIS_PASSWORD" in text
    assert "Secret9" not in text


# ------------------------------------------------- ranks sharing one root --

@pytest.mark.parametrize("layout", LAYOUTS)
def test_mla_pages_one_rank_writes_are_seen_by_ranks_open_at_once(tmp_path, layout):
    """MLA at TP 4, the ranks (processes, here four back ends) sharing one
    kvo_file_root, all open before rank 0 backs pages up: MLA KV is
    replicated, so every rank finds and loads rank 0's pages (the file tier
    opened unshared answered from each rank's own index: exists 0/12)."""
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    hosts = [mla_host(layout) for _ in range(4)]
    ranks = [build(h, extra, mla=True, tp_rank=r, tp_size=4) for r, h in enumerate(hosts)]
    randomize(hosts[0], 21)
    keys = [f"m{i}" for i in range(12)]
    assert ranks[0].batch_set_v1(keys, indices(hosts[0], list(range(12)))) == [True] * 12
    ranks[0].flush()
    want = [page(hosts[0], p) for p in range(12)]
    for r in (1, 2, 3):
        assert ranks[r].batch_exists(keys) == 12, f"rank {r}"
        assert ranks[r].batch_get_v1(keys, indices(hosts[r], list(range(20, 32)))) == [True] * 12
        assert all(torch.equal(page(hosts[r], 20 + i), w) for i, w in enumerate(want))
    for b in ranks:
        b.close()


def _rank_pages(root, quota, rank, phase, barrier, out):
    """One TP rank of an MHA model in a process of its own (the spawned
    child of the test below): phase "write" backs up 40 pages of its own,
    phase "read" (a restart) counts which of them it finds and checks their
    bytes.  The ranks meet at the barrier after opening their back ends."""
    host = mha_host("page_first")
    randomize(host, 100 + rank)
    be = build(host, dict(kvo_file_root=root, kvo_file_bytes=quota, interface_v1=1), tp_rank=rank, tp_size=2)
    barrier.wait(60)
    keys = [f"r{rank}-{i}" for i in range(40)]
    if phase == "write":
        out.put((rank, sum(be.batch_set_v1(keys, indices(host, list(range(40)))))))
        be.flush()
        barrier.wait(60)   # both ranks' pages written before either closes
    else:
        got = be.batch_get_v1(keys, indices(host, list(range(50, 90))))
        good = sum(1 for i, g in enumerate(got) if g and torch.equal(page(host, 50 + i), page(host, i)))
        out.put((rank, good))
        barrier.wait(60)
    be.close()


def _ranks(root, quota, phase):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    ps = [ctx.Process(target=_rank_pages, args=(root, quota, r, phase, barrier, out)) for r in (0, 1)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(300)
        assert p.exitcode == 0, f"rank process failed ({phase})"
    return dict(out.get(timeout=10) for _ in ps)


def test_two_ranks_sharing_a_root_keep_their_pages_over_a_restart(tmp_path):
    """Two TP-rank processes of one engine share a root and its quota (50
    pages): each backs up 40 pages of its own.  Their files stay within the
    quota, and a restart of both keeps every file they left and finds every
    page in them, byte for byte.  With a quota per process each rank kept
    its own 40 (80 files), and each restart scan took in the other's files
    and evicted down to its own quota (50 files left of 80, 24/26 hits)."""
    root = str(tmp_path)
    quota = 50 * 4096   # a page of mha_host's: 768 bytes, a 4 KiB slot on disk
    wrote = _ranks(root, quota, "write")
    assert wrote == {0: 40, 1: 40}
    before = len(kvc_files(root))
    assert 0 < before <= 50, f"{before} files for a quota of 50 pages"
    found = _ranks(root, quota, "read")
    assert len(kvc_files(root)) == before, "the restart removed files"
    assert found[0] + found[1] == before, (found, before)


# -------------------------------------------- namespaces: model and tenant --

def test_model_identity_is_whole_in_the_namespace(tmp_path):
    """A model path of 100 characters registers (the plan name once held
    it: over 63 bytes it failed with KVO_EINVAL), and model names that
    differ only in '/' and '-' (once folded to one) never share pages."""
    extra = dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1)
    long_name = "/models/" + "a" * 80 + "/Llama-3.1-8B-Instruct"
    host = mha_host("page_first")
    randomize(host, 31)
    be = build(host, extra, model=long_name)
    assert all(be.batch_set_v1(["p0", "p1"], indices(host, [1, 2])))
    be.flush()
    assert be.batch_exists(["p0", "p1"]) == 2
    be.close()
    a_host, b_host = mha_host("page_first"), mha_host("page_first")
    a = build(a_host, extra, model="acme/x-y")
    b = build(b_host, extra, model="acme-x/y")
    assert all(a.batch_set_v1(["q0"], indices(a_host, [3])))
    a.flush()
    assert a.batch_exists(["q0"]) == 1 and b.batch_exists(["q0"]) == 0
    assert b.batch_get_v1(["q0"], indices(b_host, [9])) == [False]
    a.close()
    b.close()


def test_tenant_file_part_keeps_its_pages(tmp_path):
    """tenant_file_bytes gives tenant-1 a file tier of its own
    (kvo_file_root/tenants/<label>): tenant-2's 12 pages overflow the shared
    tier (room for 4) and tenant-1's 3 pages stay, loaded byte-exact; the
    control (no part) loses them."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
    from kvoffload.tenants import tenant_label
    host = mha_host("page_first")
    randomize(host, 43)
    probe = build(host, dict(kvo_file_root=str(tmp_path / "probe"), kvo_file_bytes=1 << 24, interface_v1=1))
    room = probe.stores["kv"].plan.groups[0]["slot_bytes"] + 4096   # a page's file
    probe.close()
    t1 = HiCacheStorageExtraInfo(extra_info={"extra_key": "tenant-1"})
    t2 = HiCacheStorageExtraInfo(extra_info={"extra_key": "tenant-2"})
    mine = ["m0", "m1", "m2"]
    held = {}
    for with_part in (True, False):
        extra = dict(kvo_file_root=str(tmp_path / f"r{int(with_part)}"), kvo_file_bytes=4 * room, interface_v1=1)
        if with_part:
            extra["tenant_file_bytes"] = {tenant_label("tenant-1"): 4 * room}
        be = build(host, extra)
        assert be.batch_set_v1(mine, indices(host, [1, 2, 3]), t1) == [True] * 3
        be.flush()
        for k in range(12):
            assert be.batch_set_v1([f"o{k}"], indices(host, [4 + k % 8]), t2) == [True]
            be.flush()
        held[with_part] = be.batch_exists(mine, t1)
        if with_part:
            assert be.batch_get_v1(mine, indices(host, [20, 21, 22]), t1) == [True] * 3
            assert torch.equal(page(host, 21), page(host, 2))
            assert any((tmp_path / "r1" / "tenants" / tenant_label("tenant-1")).iterdir())
        be.close()
    assert held == {True: 3, False: 0}, held


def test_tenants_never_share_pages(tmp_path):
    """SGLang's storage keys do not depend on a request's extra key (a
    tenant's salt): the back end keys pages by it where SGLang gives one
    (HiCacheStorageExtraInfo.extra_info["extra_key"]), so one tenant's page
    is never another's hit; without one, pages are shared as before."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
    host = mha_host("page_first")
    randomize(host, 41)
    be = build(host, dict(kvo_file_root=str(tmp_path), kvo_file_bytes=1 << 24, interface_v1=1))
    t1 = HiCacheStorageExtraInfo(extra_info={"extra_key": "tenant-1"})
    t2 = HiCacheStorageExtraInfo(extra_info={"extra_key": "tenant-2"})
    keys = ["s0", "s1", "s2"]
    assert be.batch_set_v1(keys, indices(host, [1, 2, 3]), t1) == [True] * 3
    be.flush()
    assert be.batch_exists(keys, t1) == 3
    assert be.batch_exists(keys, t2) == 0 and be.batch_exists(keys) == 0
    assert be.batch_get_v1(keys, indices(host, [10, 11, 12]), t2) == [False] * 3
    assert be.batch_get_v1(keys, indices(host, [10, 11, 12]), t1) == [True] * 3
    assert torch.equal(page(host, 10), page(host, 1))
    # each tenant's counters (by label, never the salt): what it asked and got
    from kvoffload.tenants import tenant_label
    st = be.get_stats()["kv"]["tenants"]
    assert "tenant-" not in repr(st), st
    r1, r2, d = st[tenant_label("tenant-1")], st[tenant_label("tenant-2")], st["default"]
    assert (r1["set_pages"], r1["stored_pages"], r1["lookups"], r1["hit_pages"]) == (3, 3, 1, 3), r1
    assert (r1["get_pages"], r1["loaded_pages"]) == (3, 3), r1
    assert (r2["lookups"], r2["lookup_pages"], r2["hit_pages"], r2["get_pages"], r2["loaded_pages"]) == \
        (1, 3, 0, 3, 0), r2
    assert (d["lookups"], d["hit_pages"], d["stored_pages"]) == (1, 0, 0), d
    be.close()
