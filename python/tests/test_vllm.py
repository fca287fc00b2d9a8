"""kvoffload.vllm against vLLM's (0.33 or 0.32) own types, factory, managers and
connector (tools/test-python.sh --vllm)."""
import dataclasses
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm

from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,  # noqa: E402
                                     GPULoadStoreSpec, LoadStoreSpec, LookupResult, OffloadingEvent,
                                     OffloadingManager, OffloadPolicy, PrepareStoreOutput, ReqContext,
                                     make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,  # noqa: E402
                                       OffloadingModelConfig, OffloadingParallelConfig)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

import kvoffload as k  # noqa: E402
import workloads  # noqa: E402
from kvoffload import vllm as kvo_vllm  # noqa: E402
from kvoffload.vllm import KvoffloadLoadStoreSpec, KvoffloadOffloadingManager, KvoffloadOffloadingSpec  # noqa: E402
from kvoffload.vllm.compat import EVENT_HAS_METADATA_ONLY, GROUP_HAS_WINDOW  # noqa: E402

_counter = [0]


def make_config(groups=((16, None),), bpc=2, tokens_per_hash=16, kv_bytes=8192, extra=None, events=True):
    """An OffloadingConfig as build_offloading_config makes it; groups are
    (tokens_per_block, sliding_window_size_in_chunks or None; vLLM 0.32 has
    no windows, every group is full there)."""
    _counter[0] += 1
    ex = {"spec_name": "KvoffloadOffloadingSpec", "spec_module_path": "kvoffload.vllm",
          "cpu_bytes_to_use": 64 * 16384, "kvo_arena_processes": 2}
    ex.update(extra or {})
    par = OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                   data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                   is_parallelism_agnostic=True)
    return OffloadingConfig(
        groups=tuple(OffloadingGroupConfig(tokens_per_block=t, layer_names=(f"g{i}.l0", f"g{i}.l1"), group_id=i,
                                           **({"sliding_window_size_in_chunks": w} if GROUP_HAS_WINDOW else {}))
                     for i, (t, w) in enumerate(groups)),
        worker_kv_bytes_per_block=kv_bytes, enable_kv_cache_events=events, extra_config=ex,
        engine_id=f"kvotest-{os.getpid()}-{_counter[0]}", model=OffloadingModelConfig("test/model", "float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_hash, blocks_per_chunk=bpc), parallel=par)


def keys_of(seq_id, n, group=0):
    return [make_offload_key(int(seq_id * 1000 + i).to_bytes(32, "little"), group) for i in range(n)]


# ----------------------------------------------------------- the factory --

def test_factory_builds_spec_from_kv_transfer_config():
    from vllm.config import KVTransferConfig
    ktc = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                           kv_connector_extra_config={"spec_name": "KvoffloadOffloadingSpec",
                                                      "spec_module_path": "kvoffload.vllm",
                                                      "cpu_bytes_to_use": 1 << 20, "blocks_per_chunk": 2})
    cfg = make_config(extra=dict(ktc.kv_connector_extra_config))
    spec = OffloadingSpecFactory.create_spec(cfg)
    assert isinstance(spec, KvoffloadOffloadingSpec)
    assert spec.plan.groups[0]["blocks_per_chunk"] == 2
    m = spec.get_manager()
    assert isinstance(m, OffloadingManager) and m is spec.get_manager()
    m.shutdown()


def test_spec_requires_capacity():
    with pytest.raises(k.KvoError) as e:
        KvoffloadOffloadingSpec(make_config(extra={"cpu_bytes_to_use": 0}))
    assert "cpu_bytes_to_use" in e.value.message


def test_spec_refuses_tenant_quotas():
    """The spec's manager calls carry no tenant, so it cannot keep a tenant's
    part: tenant_host_bytes is refused, naming the connector that can."""
    spec = KvoffloadOffloadingSpec(make_config(extra={"tenant_host_bytes": {"t-0123456789ab": 1 << 16},
                                                      "kvo_scheduler_maps_arena": False}))
    with pytest.raises(k.KvoError) as e:
        spec.get_manager()
    assert e.value.code == k._lib.KVO_ENOTSUP and "KvoffloadConnector" in e.value.message


# ------------------------------------------------------ manager contract --

def new_manager(cfg=None, **extra):
    """A manager alone (no arena: the scheduler does not map one)."""
    cfg = cfg or make_config(extra=extra)
    cfg = OffloadingConfig(**{**cfg.__dict__, "extra_config": {**cfg.extra_config, "kvo_scheduler_maps_arena": False}})
    spec = KvoffloadOffloadingSpec(cfg)
    assert spec.get_manager().arena is None
    return spec, spec.get_manager()


def test_manager_contract_with_vllm_types():
    spec, m = new_manager()
    rc = ReqContext("r1")
    m.on_new_request(rc)
    keys = keys_of(1, 4)
    assert [m.lookup(x, rc) for x in keys] == [LookupResult.MISS] * 4
    out = m.prepare_store(keys, rc)
    assert isinstance(out, PrepareStoreOutput) and out.keys_to_store == keys and out.evicted_keys == []
    assert isinstance(out.store_spec, LoadStoreSpec) and len(out.store_spec.offsets) == 4
    assert len(set(out.store_spec.offsets.tolist())) == 4
    assert m.lookup(keys[0], rc) == LookupResult.HIT_PENDING
    again = m.prepare_store(keys, rc)  # present keys are not stored twice
    assert again.keys_to_store == []
    m.complete_store(keys, rc)
    assert [m.lookup(x, rc) for x in keys] == [LookupResult.HIT] * 4
    ls = m.prepare_load(keys[:2], rc)
    assert isinstance(ls, KvoffloadLoadStoreSpec)
    assert ls.offsets.tolist() == out.store_spec.offsets[:2].tolist()
    m.touch(keys[:2], rc)
    m.complete_load(keys[:2], rc)
    ev = list(m.take_events())
    assert len(ev) == 1 and isinstance(ev[0], OffloadingEvent) and not ev[0].removed and ev[0].keys == keys
    # failed store: keys removed, a metadata-only removal event (vLLM 0.32:
    # none, like its CPU manager)
    bad = keys_of(2, 2)
    m.prepare_store(bad, rc)
    m.complete_store(bad, rc, success=False)
    assert [m.lookup(x, rc) for x in bad] == [LookupResult.MISS] * 2
    ev = list(m.take_events())
    if EVENT_HAS_METADATA_ONLY:
        assert ev[-1].removed and ev[-1].metadata_only and ev[-1].keys == bad
    else:
        assert ev == []
    m.on_request_finished(rc)
    m.reset_cache()
    assert m.lookup(keys[0], rc) == LookupResult.MISS
    m.shutdown()


def test_manager_eviction_and_full_cache():
    # 4 chunks of capacity
    spec, m = new_manager(cpu_bytes_to_use=4 * 16384)
    rc = ReqContext("r")
    a = keys_of(1, 4)
    m.complete_store(m.prepare_store(a, rc).keys_to_store, rc)
    m.prepare_load(a[:1], rc)           # pinned
    m.touch(a[1:2], rc)                 # recent
    b = keys_of(2, 2)
    out = m.prepare_store(b, rc)
    assert sorted(out.evicted_keys) == sorted(a[2:4])
    ev = list(m.take_events())
    assert any(e.removed and sorted(e.keys) == sorted(a[2:4]) for e in ev)
    # room for one of four (a[1] READY, a[0] pinned, b PENDING): the
    # cascade stores the leading part that fits; nothing fits: vLLM's
    # "cannot store" is None
    c = keys_of(3, 4)
    out = m.prepare_store(c, rc)
    assert out.keys_to_store == c[:1] and out.evicted_keys == a[1:2]
    assert m.prepare_store(keys_of(4, 4), rc) is None
    assert m.stats()["stores"]["rejected"] == 3 + 4
    m.shutdown()


@pytest.mark.parametrize("groups,tph", [(((12, None), (16, None)), 4),      # 12/16-token groups
                                        (((16, None), (16, 3)), 16),        # full + sliding
                                        (((16, None), (32, 2)), 16)])
def test_manager_mixed_groups(groups, tph):
    cfg = make_config(groups=groups, tokens_per_hash=tph, bpc=2)
    spec, m = new_manager(cfg)
    assert [g["tokens_per_chunk"] for g in spec.plan.groups] == [t * 2 for t, _ in groups]
    kinds = [g["kind"] for g in spec.plan.groups]
    assert kinds == ["full" if w is None or not GROUP_HAS_WINDOW else "sliding" for _, w in groups]
    rc = ReqContext("r")
    keys = keys_of(1, 3, group=0) + keys_of(1, 2, group=1)
    out = m.prepare_store(keys, rc)
    assert out.keys_to_store == keys and out.store_spec.groups.tolist() == [0, 0, 0, 1, 1]
    m.complete_store(keys, rc)
    assert all(m.lookup(x, rc) == LookupResult.HIT for x in keys)
    # a group id vLLM does not offload is refused
    with pytest.raises(Exception):
        m.lookup(make_offload_key(b"x" * 32, 7), rc)
    m.shutdown()


def test_block_size_legacy_equals_blocks_per_chunk():
    # vLLM turns block_size into blocks_per_chunk (build_offloading_config);
    # the resulting plans are the same
    a = KvoffloadOffloadingSpec(make_config(bpc=4, extra={"block_size": 64}))
    b = KvoffloadOffloadingSpec(make_config(bpc=4, extra={"blocks_per_chunk": 4}))
    assert a.plan.fingerprint == b.plan.fingerprint
    assert a.plan.groups[0]["tokens_per_chunk"] == 64


# --------------------------------------------------------- same as vLLM --

def run_cycle(m, requests):
    """Per request: lookup until the first miss, load the hits, store the
    rest (peer_vllm_manager's cycle).  Returns the hit count per request."""
    hits = []
    for rid, keys in enumerate(requests):
        rc = ReqContext(f"r{rid}")
        m.on_new_request(rc)
        n = 0
        for x in keys:
            if m.lookup(x, rc) != LookupResult.HIT:
                break
            n += 1
        if n:
            m.prepare_load(keys[:n], rc)
            m.touch(keys[:n], rc)
            m.complete_load(keys[:n], rc)
        out = m.prepare_store(keys[n:], rc) if n < len(keys) else None
        if out is not None and out.keys_to_store:
            m.complete_store(out.keys_to_store, rc)
        m.on_request_finished(rc)
        hits.append(n)
    return hits


def test_same_hits_as_vllm_cpu_manager():
    rng = np.random.default_rng(7)
    prefixes = [keys_of(p, 12) for p in range(6)]
    reqs = []
    for i in range(60):
        p = prefixes[int(rng.integers(0, 6))]
        reqs.append(p[: int(rng.integers(2, 12))] + keys_of(100 + i, int(rng.integers(0, 4))))
    # ample capacity: both keep everything, hits must match exactly
    ours = new_manager(cpu_bytes_to_use=1000 * 16384)[1]
    theirs = CPUOffloadingManager(num_chunks=1000, cache_policy="lru")
    assert run_cycle(ours, reqs) == run_cycle(theirs, reqs)
    # under eviction pressure (40 chunks): same capacity in chunks; vLLM's LRU
    # ranks a request's keys by position (tails evicted first) while the C
    # store orders by last use, so single hits may differ; the totals stay close
    ours = new_manager(cpu_bytes_to_use=40 * 16384)[1]
    theirs = CPUOffloadingManager(num_chunks=40, cache_policy="lru")
    h1, h2 = run_cycle(ours, reqs), run_cycle(theirs, reqs)
    assert sum(h1) > 0 and sum(h2) > 0
    assert abs(sum(h1) - sum(h2)) <= 0.25 * max(sum(h1), sum(h2)), (sum(h1), sum(h2))


def run_request_level(m, requests, per_key=True):
    """vLLM's scheduler: lookups one key at a time up to the first miss
    (per_key; else the batched prefix_hits), the hits loaded, then
    prepare_store of the whole request (the hits present: not stored
    again).  Returns the hits."""
    hits = 0
    for rid, keys in enumerate(requests):
        rc = ReqContext(f"r{rid}")
        m.on_new_request(rc)
        if per_key:
            n = 0
            while n < len(keys) and m.lookup(keys[n], rc) == LookupResult.HIT:
                n += 1
        else:
            n = m.prefix_hits(keys)
        if n:
            m.prepare_load(keys[:n], rc)
            m.complete_load(keys[:n], rc)
        out = m.prepare_store(keys, rc)
        if out is not None and out.keys_to_store:
            m.complete_store(out.keys_to_store, rc)
        m.on_request_finished(rc)
        hits += n
    return hits


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "prefix", "branch"])
def test_prefix_hits_batched_equals_the_per_key_lookups(policy):
    """prefix_hits (one cascade lookup of the request as a chain) answers
    what vLLM's per-key lookup loop finds, with every policy name the spec
    takes; chunk-level offloading whatever the policy.  "branch" is taken
    as the library names it (an alias of prefix where the library has no
    branch policy of its own; where it has one, it learns from lookups, and
    vLLM's per-key lookups name no request: not the same hits)."""
    cap = dict(cpu_bytes_to_use=120 * 16384, eviction_policy=policy)
    reqs = [[make_offload_key(i.to_bytes(32, "little"), 0) for i in r] for r in workloads.conversations(5, 600)]
    m1, m2 = new_manager(**cap)[1], new_manager(**cap)[1]
    assert m1.on_new_request(ReqContext("x")).policy == OffloadPolicy.CHUNK_LEVEL
    per_key = run_request_level(m1, reqs)
    batched = run_request_level(m2, reqs, per_key=False)
    assert per_key > 0 and batched > 0
    if policy != "branch":
        assert batched == per_key
        assert m1.store.stats()["entries"] == m2.store.stats()["entries"]
    m1.shutdown()
    m2.shutdown()


# ------------------------------------------------------------- the worker --

def make_kv(num_blocks, page, n_tensors=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-128, 127, (num_blocks, page), dtype=torch.int8, generator=g) for _ in range(n_tensors)]


def test_worker_store_load_bytes_cpu_tensors():
    """Two groups overlaid on the same tensors (vLLM's hybrid layout), CPU
    tensors as the KV cache: stored chunks load back byte for byte, also
    from the middle of a chunk."""
    page = 2048
    cfg = make_config(groups=((16, None), (16, 2)), bpc=2, kv_bytes=2 * page,
                      extra={"cpu_bytes_to_use": 32 * 16384})
    spec = KvoffloadOffloadingSpec(cfg)
    m = spec.get_manager()
    tensors = make_kv(64, page)
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in tensors],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]] * 2)
    w = spec.get_worker(kv)
    orig = [t.clone() for t in tensors]
    rc = ReqContext("r")
    keys = keys_of(1, 2, 0) + keys_of(1, 1, 1)
    out = m.prepare_store(keys, rc)
    src = GPULoadStoreSpec([2, 3, 4, 5, 10, 11], group_sizes=[4, 2], block_indices=[0, 2])
    assert w.submit_store(1, src, out.store_spec)
    w.wait({1})
    res = w.get_finished()
    assert [(r.job_id, r.success) for r in res] == [(1, True)]
    assert res[0].transfer_size == 6 * 2 * page
    # vLLM's kv_offload_*_time counts only results that carry a time
    assert res[0].transfer_time is not None and res[0].transfer_time > 0
    m.complete_store(keys, rc)
    # load everything into other blocks
    ls = m.prepare_load(keys, rc)
    dst = GPULoadStoreSpec([20, 21, 22, 23, 26, 27], group_sizes=[4, 2], block_indices=[0, 2])
    assert w.submit_load(2, ls, dst)
    w.wait({2})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(2, True)]
    m.complete_load(keys, rc)
    for t, o in zip(tensors, orig):
        assert torch.equal(t[20:24], o[2:6]) and torch.equal(t[26:28], o[10:12])
        assert torch.equal(t[:20], o[:20]) and torch.equal(t[28:], o[28:])
    # a load starting mid-chunk (block index 1): chunk 0 from its 2nd block
    ls = m.prepare_load(keys[:2], rc)
    dst = GPULoadStoreSpec([40, 41, 42], group_sizes=[3, 0], block_indices=[1, 0])
    assert w.submit_load(3, ls, dst)
    w.wait({3})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(3, True)]
    m.complete_load(keys[:2], rc)
    for t, o in zip(tensors, orig):
        assert torch.equal(t[40:43], o[3:6])
    # the scheduler's arena sees the worker's bytes (same shared memory)
    off = int(out.store_spec.offsets[0])
    assert bytes(m.arena.view(off, page * 2)) == orig[0][2:4].numpy().tobytes()
    w.shutdown()
    m.shutdown()


def test_worker_refuses_geometry_larger_than_slots():
    page = 4096
    cfg = make_config(kv_bytes=page)  # scheduler believes one page per block
    spec = KvoffloadOffloadingSpec(cfg)
    spec.arena_expected = 1
    tensors = make_kv(8, page)
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in tensors],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    with pytest.raises(k.KvoError) as e:
        spec.get_worker(kv)
    assert e.value.code == k._lib.KVO_ELAYOUT and "kvo_group_bytes_per_block" in e.value.message


@pytest.mark.parametrize("zero_copy", [False, True])
def test_file_tier_promotes_after_host_eviction(tmp_path, zero_copy):
    """Write-through to files, the host tier evicts, a lookup reads the
    chunk back from its file; zero_copy (kvo_file_zero_copy): the host slots
    are lent to the tier (no staging copy), pinned until the step that sees
    the writes complete."""
    page = 2048
    # chunks of 2 blocks x 2 pages = 8 KiB: a 4-chunk host tier
    cfg = make_config(kv_bytes=2 * page, extra={"cpu_bytes_to_use": 4 * 8192, "kvo_file_root": str(tmp_path),
                                                "kvo_file_bytes": 64 * 16384, "kvo_file_zero_copy": zero_copy})
    spec = KvoffloadOffloadingSpec(cfg)
    m = spec.get_manager()
    tensors = make_kv(32, page)
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in tensors],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    w = spec.get_worker(kv)
    orig = [t.clone() for t in tensors]
    rc = ReqContext("r")
    a = keys_of(1, 2)
    out = m.prepare_store(a, rc)
    assert w.submit_store(1, GPULoadStoreSpec([4, 5, 6, 7], group_sizes=[4], block_indices=[0]), out.store_spec)
    w.wait({1})
    w.get_finished()
    m.complete_store(a, rc)           # write-through to files
    if zero_copy:
        assert m.store.stats()["pinned"] == 2     # lent until a step sees them written (no poll yet)
    m.file_tier.flush()
    m.on_schedule_end(None)           # the step sees the writes complete
    assert m.store.stats()["pinned"] == 0 and not m.has_pending_work()
    fs = m.stats()["file"]
    assert fs["writes"] == 2 and fs["writes_borrowed"] == (2 if zero_copy else 0) and fs["staging_bytes"] == 0
    assert m.stats()["stores"]["file_lent"] == (2 if zero_copy else 0)
    filler = keys_of(2, 4)            # evicts a from the 4-chunk host tier
    m.complete_store(m.prepare_store(filler, rc).keys_to_store, rc)
    assert m.store.lookup(m._ckeys(a)).tolist() == [k.MISS, k.MISS]
    m.file_tier.flush()               # (zero_copy: the filler's slots are lent until here:
    m.on_schedule_end(None)           # no room to read a back into before)
    first = m.lookup(a[0], rc)
    assert first == LookupResult.HIT_PENDING          # read from the file tier started
    for _ in range(500):
        if not m.has_pending_work():
            break
        m.file_tier.wait(100)
    assert m.lookup(a[0], rc) == LookupResult.HIT
    ls = m.prepare_load(a[:1], rc)
    assert w.submit_load(2, ls, GPULoadStoreSpec([20, 21], group_sizes=[1 * 2], block_indices=[0]))
    w.wait({2})
    assert w.get_finished()[0].success
    for t, o in zip(tensors, orig):
        assert torch.equal(t[20:22], o[4:6])
    w.shutdown()
    m.shutdown()


def _store_blocks(m, w, rc, keys, first_block, job):
    """prepare_store keys (one chunk of one block each) and copy blocks
    first_block.. into the slots; the store stays PENDING (not completed)."""
    out = m.prepare_store(keys, rc)
    assert out is not None, "the batch was refused: stores lost"
    assert out.keys_to_store == keys
    n = len(keys)
    assert w.submit_store(job, GPULoadStoreSpec(list(range(first_block, first_block + n)), group_sizes=[n],
                                                block_indices=[0]), out.store_spec)
    w.wait({job})
    assert all(r.success for r in w.get_finished())
    return out


@pytest.mark.parametrize("queue", [0, 16])
def test_step_larger_than_free_host_slots_loses_no_store(tmp_path, queue):
    """One scheduler step offers S = 96 chunks while the host tier's free
    slots are fewer (a loaded prefix pinned, the previous step's stores
    still PENDING): the step's chunks go through the staging area and, like
    every other store, reach the file tier; nothing is lost to host
    staging or to the file tier's write queue (S + S + 8 writes at once:
    more than its old bound of 64; queue 16: a tiny queue, its refusals are
    retried at the next steps).  The staged chunks load back byte for byte."""
    page, S, W = 1024, 96, 8
    base = make_config(bpc=1, kv_bytes=2 * page)
    slot = kvo_vllm.build_plan(base).groups[0]["slot_bytes"]
    extra = {"cpu_bytes_to_use": (S + 2 * W) * slot, "kvo_step_tokens": S * 16,
             "kvo_file_root": str(tmp_path), "kvo_file_bytes": 1024 * slot}
    if queue:
        extra["kvo_file_max_pending_writes"] = queue
    spec = KvoffloadOffloadingSpec(make_config(bpc=1, kv_bytes=2 * page, extra=extra))
    assert getattr(spec, "staging_bytes", S * slot) == S * slot            # one step of stores, kept for stores
    m = spec.get_manager()
    tensors = make_kv(2 * S + 3 * W + 8, page)
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in tensors],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    w = spec.get_worker(kv)
    orig = [t.clone() for t in tensors]
    rc = ReqContext("r")
    loaded, warm, a, b = keys_of(1, W), keys_of(2, W), keys_of(3, S), keys_of(4, S)
    _store_blocks(m, w, rc, loaded, 0, 1)
    m.complete_store(loaded, rc)
    m.prepare_load(loaded, rc)                        # pinned: a load in flight
    _store_blocks(m, w, rc, warm, W, 2)               # last step's stores, PENDING
    _store_blocks(m, w, rc, a, 2 * W, 3)
    host = m.store.stats()
    free_host = host["capacity_bytes"] - host["bytes_used"]         # fewer than S slots (for the fix: see below)
    _store_blocks(m, w, rc, b, 2 * W + S, 4)
    for ks in (warm, a, b):
        m.complete_store(ks, rc)
    m.complete_load(loaded, rc)
    for _ in range(2000):                             # vLLM steps while the manager has work
        m.on_schedule_end(None)
        if not m.has_pending_work():
            break
        m.file_tier.flush(100)                        # a pace, not a deadline: 0 or KVO_ETIMEDOUT
    assert m.file_tier.flush() == 0
    everything = loaded + warm + a + b
    assert m.file_tier.lookup(m._ckeys(everything)).tolist() == [k.READY] * len(everything)
    assert m.stats()["file"]["writes"] == len(everything)
    st = m.stats()["stores"]
    assert free_host < S * slot and st["staged"] > 0, (free_host, st)   # B went through the staging area
    assert st["rejected"] == 0 and st["file_lost"] == 0 and st["retry_now"] == 0, st
    if queue:
        assert st["file_deferred"] > 0, st           # the tiny queue refused, the retries got through
    # vLLM's keys are kept for the chunks the host tier holds (its events name
    # them), not for staged ones, which never enter it
    assert len(m._names) <= m.store.stats()["entries"], (len(m._names), m.store.stats()["entries"])
    # a staged chunk (never in the host tier) loads back from the file tier
    assert m.store.lookup(m._ckeys(b[-2:])).tolist() == [k.MISS, k.MISS]
    assert m.lookup(b[-2], rc) == LookupResult.HIT_PENDING
    for _ in range(500):
        if not m.has_pending_work():
            break
        m.file_tier.wait(100)
    assert m.lookup(b[-2], rc) == LookupResult.HIT
    ls = m.prepare_load(b[-2:-1], rc)
    assert w.submit_load(5, ls, GPULoadStoreSpec([2 * S + 3 * W], group_sizes=[1], block_indices=[0]))
    w.wait({5})
    assert w.get_finished()[0].success
    for t, o in zip(tensors, orig):
        assert torch.equal(t[2 * S + 3 * W], o[2 * W + 2 * S - 2])
    w.shutdown()
    m.shutdown()


def test_host_below_one_step_is_refused_at_create():
    """cpu_bytes_to_use below one scheduler step of stores: refused at
    create, naming the step and the minimum."""
    slot = kvo_vllm.build_plan(make_config(bpc=2)).groups[0]["slot_bytes"]
    cfg = make_config(bpc=2, extra={"cpu_bytes_to_use": 100 * slot, "kvo_step_tokens": 4096})
    with pytest.raises(k.KvoError) as e:
        KvoffloadOffloadingSpec(cfg)
    # 4096 tokens / 32 tokens per chunk = 128 chunks
    assert e.value.code == k._lib.KVO_EINVAL
    assert "4096 tokens" in e.value.message and "128 chunks" in e.value.message
    assert f"cpu_bytes_to_use >= {128 * slot}" in e.value.message
    KvoffloadOffloadingSpec(make_config(bpc=2, extra={"cpu_bytes_to_use": 128 * slot,
                                                      "kvo_step_tokens": 4096})).get_manager().shutdown()


# ------------------------------------- vLLM's scheduler and connector --

def _scenario(engine):
    """A few requests sharing prefixes; a filler request in between evicts
    the earlier ones from the (small) GPU prefix cache, so later requests
    must load their prefix from the offload tier."""
    import random
    rng = random.Random(3)
    p1 = [rng.randrange(1000) for _ in range(256)]
    p2 = [rng.randrange(1000) for _ in range(160)]
    seq = [("a", p1 + [1] * 20), ("b", p2 + [2] * 5), ("fill1", [rng.randrange(1000) for _ in range(600)]),
           ("c", p1 + [3] * 40), ("d", p2[:128] + [4] * 30), ("fill2", [rng.randrange(1000) for _ in range(600)]),
           ("e", p1[:200] + p2[:50])]
    for rid, toks in seq:
        engine.add(rid, toks)
        engine.run()
    return engine.hits


def _extra(spec_name, **kw):
    mod = "kvoffload.vllm" if spec_name == "KvoffloadOffloadingSpec" else "vllm.v1.kv_offload.cpu.spec"
    d = {"spec_name": spec_name, "spec_module_path": mod, "cpu_bytes_to_use": 1 << 23}
    d.update(kw)
    return d


@pytest.fixture(scope="module")
def sim():
    import vllm_engine_sim
    return vllm_engine_sim


@pytest.mark.parametrize("policy", ["lru", "prefix"])
def test_connector_scheduler_runs_requests_and_loads_stored_bytes(sim, policy):
    eid = f"kvo-sim-{os.getpid()}-1{policy}"
    e = sim.Engine(_extra("KvoffloadOffloadingSpec", eviction_policy=policy), engine_id=eid)
    try:
        hits = _scenario(e)
        # c and d hit what a and b stored; the loads filled blocks whose bytes
        # equal what computing them gives (checked block by block)
        assert hits["c"] >= 240 and hits["d"] == 128 and hits["a"] == 0
        assert e.load_jobs >= 3 and e.loaded_blocks_checked >= 30
        m = e.connector.scheduler.manager
        assert m.store.stats()["entries"] > 0
        # chunk-level offers each chunk once (all stored: no eviction here)
        assert m.stats()["stores"]["offered"] == m.store.stats()["entries"]
    finally:
        e.shutdown()
    assert not os.path.exists(f"/dev/shm/kvoffload-{eid}-dp0")


@pytest.mark.parametrize("extra", [{}, {"blocks_per_chunk": 4}, {"block_size": 32}])
def test_same_hits_as_vllm_cpu_spec(sim, extra):
    """vLLM's own CPUOffloadingSpec (its worker needs a GPU: jobs are marked
    done without copies) and ours give the same hits in the same run."""
    ours = sim.Engine(_extra("KvoffloadOffloadingSpec", **extra), engine_id=f"kvo-sim-{os.getpid()}-o{len(extra)}")
    try:
        h_ours = _scenario(ours)
    finally:
        ours.shutdown()
    theirs = sim.Engine(_extra("CPUOffloadingSpec", **extra), engine_id=f"kvo-sim-{os.getpid()}-v{len(extra)}",
                        fake_worker=True)
    try:
        h_theirs = _scenario(theirs)
    finally:
        theirs.shutdown()
    assert h_ours == h_theirs
    assert sum(h_ours.values()) > 0


def test_spec_reads_the_step_from_vllms_config(sim):
    """The step comes from vLLM's own max_num_batched_tokens (2048 in the
    simulated engine: 128 chunks of 16 tokens) when kvo_step_tokens is not
    given: a host tier below it is refused at engine start."""
    with pytest.raises(k.KvoError) as e:
        sim.Engine(_extra("KvoffloadOffloadingSpec", cpu_bytes_to_use=1 << 16),
                   engine_id=f"kvo-sim-{os.getpid()}-small")
    assert "2048 tokens" in e.value.message and "128 chunks" in e.value.message


def _multi_turn(engine):
    """Conversations that grow turn by turn (what a sliding-window group can
    hit: the window before the previous turn's end was stored), fillers in
    between evict the GPU prefix cache."""
    import random
    rng = random.Random(5)
    t1 = [rng.randrange(1000) for _ in range(200)]
    t2 = t1 + [rng.randrange(1000) for _ in range(90)]
    t3 = t2 + [rng.randrange(1000) for _ in range(70)]
    for rid, toks in [("t1", t1), ("f1", [rng.randrange(1000) for _ in range(600)]), ("t2", t2),
                      ("f2", [rng.randrange(1000) for _ in range(600)]), ("t3", t3)]:
        engine.add(rid, toks)
        engine.run()
    return engine.hits


def test_hybrid_full_and_sliding_groups_through_scheduler(sim):
    """A hybrid model (full-attention group + 64-token sliding-window group
    overlaid on one tensor): vLLM's scheduler stores and loads both groups
    through our spec, loaded blocks of both groups hold the right bytes, and
    the hits equal those of vLLM's CPU spec."""
    ours = sim.Engine(_extra("KvoffloadOffloadingSpec"), engine_id=f"kvo-sim-{os.getpid()}-h",
                      sliding_window=64, num_blocks=80)
    try:
        h_ours = _multi_turn(ours)
        assert h_ours["t2"] > 0 and h_ours["t3"] > h_ours["t2"]
        assert ours.load_jobs >= 2 and ours.loaded_blocks_checked > 0
        groups = [g["kind"] for g in ours.connector.scheduler.manager.plan.groups]
        assert groups == ["full", "sliding" if GROUP_HAS_WINDOW else "full"]
    finally:
        ours.shutdown()
    theirs = sim.Engine(_extra("CPUOffloadingSpec"), engine_id=f"kvo-sim-{os.getpid()}-hv",
                        sliding_window=64, num_blocks=80, fake_worker=True)
    try:
        assert _multi_turn(theirs) == h_ours
    finally:
        theirs.shutdown()


def test_gpu_tensors_need_the_cuda_device():
    if k._lib._find_cuda_library() is not None or hasattr(k._lib.lib, "kvo_cuda_create"):
        pytest.skip("the CUDA device library is there")
    page = 4096
    spec = KvoffloadOffloadingSpec(make_config(kv_bytes=2 * page))
    spec.arena_expected = 1
    meta = [torch.empty((8, page), dtype=torch.int8, device="meta") for _ in range(2)]
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in meta],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    with pytest.raises(k.KvoError) as e:
        spec.get_worker(kv)
    assert e.value.code == k._lib.KVO_ENOTSUP and "KVO_CUDA" in e.value.message


# ------------------------------------------------ the remote (Redis) tier --

def _redis_extra(prefix):
    """kv_connector_extra_config keys for the test cluster (tools/test-python.sh
    starts one and sets KVO_TEST_REDIS), or skip."""
    a = os.environ.get("KVO_TEST_REDIS")
    if not a:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-python.sh starts a Redis Cluster when redis-server exists)")
    try:  # a library built without hiredis
        k.RemoteTier(f"redis://{a}", k.Plan(k.Model("probe", 16, [dict(name="g", tokens_per_block=16, layers=1,
                                                                          page_bytes=512)])),
                     key_prefix="probe").close()
    except k.KvoError as e:
        if e.code == k._lib.KVO_ENOTSUP:
            pytest.skip("library built without hiredis")
        raise
    # answers reused and RETRY for answers out as long as a test runs on a
    # loaded machine: the assertions count questions and RETRYs, not time
    return {"kvo_redis_url": f"redis://{a}", "kvo_redis_prefix": f"{prefix}{os.getpid()}",
            "kvo_redis_answer_ttl_ms": 600000, "kvo_redis_lookup_budget_us": 600_000_000}


def _engine_parts(page, extra, seed):
    """A spec, its manager, two KV tensors (32 blocks of page bytes, random
    from seed, both groups' layers) and its worker."""
    spec = KvoffloadOffloadingSpec(make_config(kv_bytes=2 * page, extra=extra))
    m = spec.get_manager()
    ts = make_kv(32, page, seed=seed)
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in ts],
                           group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])
    return spec, m, ts, spec.get_worker(kv)


def _settle(m, rounds=500):
    for _ in range(rounds):
        if not m.has_pending_work():
            return
        m.remote_tier.wait(100)
    raise AssertionError("remote answers never landed")


def test_remote_tier_shares_chunks_between_engines():
    """Engine A stores two chunks (write-through to the cluster); engine B,
    with its own arena and an empty host tier, asks (RETRY), reads (HIT_PENDING)
    and loads them byte for byte; a chunk nobody stored is a MISS once the
    answer lands; another parallel layout never shares values."""
    page = 2048
    rex = _redis_extra("vllm-share")
    rc = ReqContext("r")
    a = keys_of(1, 2)
    _spec_a, ma, ta, wa = _engine_parts(page, rex, seed=1)
    out = ma.prepare_store(a, rc)
    assert wa.submit_store(1, GPULoadStoreSpec([4, 5, 6, 7], group_sizes=[4], block_indices=[0]), out.store_spec)
    wa.wait({1})
    wa.get_finished()
    ma.complete_store(a, rc)
    assert ma.remote_tier.flush(20000) == 0
    assert ma.stats()["remote"]["puts"] == 2

    _spec_b, mb, tb, wb = _engine_parts(page, rex, seed=2)
    try:
        never = keys_of(9, 1)[0]
        assert [mb.lookup(x, rc) for x in a + [never]] == [LookupResult.RETRY] * 3
        # asked again: RETRY before the answer lands, HIT_PENDING once it has
        # (the read starts); never a second question (exists_hits below)
        assert mb.lookup(a[0], rc) in (LookupResult.RETRY, LookupResult.HIT_PENDING)
        _settle(mb)
        assert mb.lookup(never, rc) == LookupResult.MISS
        # a[0]'s read may have landed already (started by the second lookup)
        assert mb.lookup(a[0], rc) in (LookupResult.HIT_PENDING, LookupResult.HIT)
        assert mb.lookup(a[1], rc) == LookupResult.HIT_PENDING
        _settle(mb)
        assert [mb.lookup(x, rc) for x in a] == [LookupResult.HIT] * 2
        ls = mb.prepare_load(a, rc)
        assert wb.submit_load(2, ls, GPULoadStoreSpec([20, 21, 22, 23], group_sizes=[4], block_indices=[0]))
        wb.wait({2})
        assert wb.get_finished()[0].success
        mb.complete_load(a, rc)
        for t_b, t_a in zip(tb, ta):
            assert torch.equal(t_b[20:24], t_a[4:8])
        st = mb.stats()["remote"]
        assert st["gets"] == 2 and st["exists_hits"] == 2 and st["exists_misses"] == 1
    finally:
        wb.shutdown()
        mb.shutdown()
        wa.shutdown()
        ma.shutdown()
    # the slot layout depends on the world size: other values, other keys
    c1 = make_config(kv_bytes=2 * page)
    c2 = dataclasses.replace(c1, parallel=dataclasses.replace(c1.parallel, world_size=2, tp_size=2))
    assert kvo_vllm.layout_hash(c1) != kvo_vllm.layout_hash(c2)


def test_remote_answer_landing_after_own_put_is_present():
    """vLLM asks for a key (RETRY: EXISTS in flight), goes on to compute it
    (another group's key missed) and stores it before the answer lands;
    the answer, "absent" when asked, must not be remembered: once the host
    tier has dropped the chunk, a lookup reads it back from the cluster
    (a stale "absent" made it a MISS until remote_answer_ttl_ms passed)."""
    page = 2048
    rex = _redis_extra("vllm-asked")
    rc = ReqContext("r")
    a = keys_of(3, 1)
    _spec, m, ts, w = _engine_parts(page, rex, seed=3)
    try:
        assert m.lookup(a[0], rc) == LookupResult.RETRY
        out = m.prepare_store(a, rc)
        assert w.submit_store(1, GPULoadStoreSpec([4, 5], group_sizes=[2], block_indices=[0]), out.store_spec)
        w.wait({1})
        w.get_finished()
        m.complete_store(a, rc)
        assert m.remote_tier.flush(20000) == 0
        _settle(m)  # the EXISTS answer lands
        rs = m.stats()["remote"]
        assert rs["exists_misses"] + rs["exists_hits"] == 1   # answered (absent, unless Redis raced the put)
        m.store.remove(m._ckeys(a))                          # the host tier drops the chunk
        assert m.lookup(a[0], rc) == LookupResult.HIT_PENDING
        _settle(m)
        assert m.lookup(a[0], rc) == LookupResult.HIT
        ls = m.prepare_load(a, rc)
        assert w.submit_load(2, ls, GPULoadStoreSpec([20, 21], group_sizes=[2], block_indices=[0]))
        w.wait({2})
        assert w.get_finished()[0].success
        m.complete_load(a, rc)
        for t in ts:
            assert torch.equal(t[20:22], t[4:6])
    finally:
        w.shutdown()
        m.shutdown()


def test_remote_tier_through_vllms_scheduler(sim):
    """Two engines, one cluster: what engine 1 computed, engine 2 (its own
    host tier, empty) loads through vLLM's scheduler and connector, and the
    loaded blocks hold the bytes computing them gives."""
    rex = _redis_extra("vllm-sched")
    e1 = sim.Engine(_extra("KvoffloadOffloadingSpec", **rex), engine_id=f"kvo-sim-{os.getpid()}-r1")
    import random
    rng = random.Random(11)
    p1 = [rng.randrange(1000) for _ in range(256)]
    try:
        e1.add("a", p1 + [1] * 20)
        e1.run()
        m1 = e1.connector.scheduler.manager
        assert m1.remote_tier.flush(20000) == 0
        assert m1.stats()["remote"]["puts"] >= 8
    finally:
        e1.shutdown()
    e2 = sim.Engine(_extra("KvoffloadOffloadingSpec", **rex), engine_id=f"kvo-sim-{os.getpid()}-r2")
    try:
        e2.add("c", p1 + [3] * 40)
        e2.run()
        assert e2.hits["c"] >= 240
        assert e2.load_jobs >= 1 and e2.loaded_blocks_checked >= 15
        assert e2.connector.scheduler.manager.stats()["remote"]["gets"] >= 8
    finally:
        e2.shutdown()
