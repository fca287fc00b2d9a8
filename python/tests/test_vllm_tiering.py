"""kvoffload's file and Redis Cluster tiers as secondary tiers of vLLM's
TieringOffloadingSpec (kvoffload.vllm.tiering), against vLLM's own types:
its SecondaryTierFactory, TieringOffloadingManager and CPU primary tier (a
real SharedOffloadRegion in /dev/shm), and its scheduler and connector with
tests/e2e/tiering_shim.py's CPU copy worker (vLLM's own worker refuses the
CPU platform: see the shim).  Skipped where vLLM has no tiering."""
import os
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.v1.kv_offload.tiering.base")

from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvoffload.vllm.compat import EVENT_FIELDS  # noqa: E402
from kvoffload.vllm.tiering import KvoffloadFileTier, KvoffloadRedisTier, tier_layout_hash  # noqa: E402
from test_vllm import keys_of, make_config  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = 16384   # make_config: 8192 bytes per block, 2 blocks per chunk (a multiple of the page size)
MOD = "kvoffload.vllm.tiering"


def file_tier_cfg(root, capacity=64 * ROW, **kw):
    return {"type": "KvoffloadFileTier", "module_path": MOD, "root_dir": str(root), "capacity_bytes": capacity, **kw}


def redis_tier_cfg(prefix, **kw):
    redis = os.environ.get("KVO_TEST_REDIS")
    if not redis:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-python.sh starts a Redis Cluster)")
    # RETRY while answers are out, and answers reused, as long as a test runs
    # on a loaded machine: the assertions count questions, not time
    return {"type": "KvoffloadRedisTier", "module_path": MOD, "url": f"redis://{redis}",
            "key_prefix": f"{prefix}-{os.getpid()}-{time.monotonic_ns()}", "lookup_budget_us": 600_000_000,
            "answer_ttl_ms": 600000, **kw}


def tiering(tiers, primary_chunks=4, events=False, **cfg_kw):
    """vLLM's TieringOffloadingSpec and its manager over the given secondary tiers."""
    cfg = make_config(extra={"spec_name": "TieringOffloadingSpec",
                             "spec_module_path": "vllm.v1.kv_offload.tiering.spec",
                             "cpu_bytes_to_use": primary_chunks * ROW, "secondary_tiers": tiers},
                      events=events, **cfg_kw)
    spec = TieringOffloadingSpec(cfg)
    m = spec.get_manager()
    assert isinstance(m, TieringOffloadingManager)
    return spec, m


def rows(m):
    return np.asarray(m.primary_tier.get_kv_memoryview())


def step(m):
    m.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def store(m, keys, rc, seed):
    """GPU -> primary as vLLM's worker would (random bytes into the rows),
    then complete_store, which cascades to the secondary tiers."""
    out = m.prepare_store(keys, rc)
    assert out is not None and list(out.keys_to_store) == list(keys)
    data = {}
    r = rows(m)
    rng = np.random.default_rng(seed)
    for k, c in zip(keys, out.store_spec.chunk_ids):
        r[c] = rng.integers(-128, 127, r.shape[1], dtype=np.int8).view(r.dtype)
        data[k] = r[c].copy()
    m.complete_store(keys, rc)
    return data


def settle(m, tier=None, rounds=2000):
    """Step until no job is in flight (and the tier's writes landed)."""
    for _ in range(rounds):
        step(m)
        if tier is not None:
            tier.tier.flush(1000)
        if not m.has_pending_work():
            step(m)
            return
        time.sleep(0.002)
    raise AssertionError("jobs never finished")


def promote(m, key, rc, rounds=2000):
    """lookup until HIT (promotion from a secondary tier), or the final MISS."""
    for _ in range(rounds):
        r = m.lookup(key, rc)
        if r in (LookupResult.HIT, LookupResult.MISS):
            return r
        step(m)
        time.sleep(0.002)
    raise AssertionError(f"{key!r} never settled")


def loaded_bytes(m, key, rc):
    (c,) = m.prepare_load([key], rc).chunk_ids
    b = rows(m)[c].copy()
    m.complete_load([key], rc)
    return b


def stored(tiers, n, **kw):
    """vLLM's tiering over tiers with n chunks stored and cascaded (a request
    open): (manager, first secondary tier, request context, keys, bytes)."""
    _, m = tiering(tiers, **kw)
    tier = m.secondary_tiers[0]
    rc = ReqContext("r1")
    m.on_new_request(rc)
    a = keys_of(1, n)
    data = store(m, a, rc, seed=1)
    settle(m, tier)
    return m, tier, rc, a, data


def finished(tier, rounds=2000):
    """The tier's next non-empty batch of job results."""
    for _ in range(rounds):
        got = list(tier.get_finished_jobs())
        if got:
            return got
        time.sleep(0.002)
    raise AssertionError("no job finished")


def evict_all(m, rc, seed, tier=None):
    """Fill the primary tier with other chunks (the first ones are evicted);
    with a tier, until its writes of them landed too."""
    n = m.primary_tier._num_chunks
    store(m, keys_of(seed, n), rc, seed)
    settle(m, tier)


# ------------------------------------------------------------------ file tier --

def test_file_tier_promotes_byte_exact_after_primary_eviction(tmp_path):
    m, tier, rc, a, data = stored([file_tier_cfg(tmp_path / "f")], 4)
    assert isinstance(tier, KvoffloadFileTier) and tier.medium is Medium.STORAGE
    try:
        assert tier.stats()["writes"] == 4
        evict_all(m, rc, seed=50)
        assert [m.primary_tier.lookup(k, rc) for k in a] == [LookupResult.MISS] * 4
        for k in a[:2]:
            assert promote(m, k, rc) == LookupResult.HIT
            assert np.array_equal(loaded_bytes(m, k, rc), data[k])
        assert tier.stats()["reads"] == 2
        # vLLM's tiering metrics counted the tier's reads and writes, with time
        stats = m.get_stats()
        assert stats is not None and not stats.is_empty()
        never = keys_of(9, 1)[0]
        assert m.lookup(never, rc) == LookupResult.MISS
        m.on_request_finished(rc)
    finally:
        m.shutdown()


def test_file_tier_corrupt_value_is_a_miss_never_wrong_bytes(tmp_path):
    m, tier, rc, a, _ = stored([file_tier_cfg(tmp_path / "f")], 2)
    try:
        evict_all(m, rc, seed=50, tier=tier)   # every file written before the walk
        n = 0
        for d, _, files in os.walk(tier.tier.dir):
            for f in files:
                p = os.path.join(d, f)
                if os.path.getsize(p) >= ROW:
                    with open(p, "r+b") as fh:   # one payload byte flipped
                        fh.seek(os.path.getsize(p) - 1)
                        b = fh.read(1)
                        fh.seek(-1, os.SEEK_CUR)
                        fh.write(bytes([b[0] ^ 0x5A]))
                    n += 1
        assert n == 2 + 4   # a, and the chunks that pushed it out of the primary tier
        for k in a:
            assert promote(m, k, rc) == LookupResult.MISS
            assert m.primary_tier.lookup(k, rc) == LookupResult.MISS
        st = tier.stats()
        assert st["reads"] == 0 and st["corrupt_removed"] == 2
        m.on_request_finished(rc)
    finally:
        m.shutdown()


def test_file_tier_is_capacity_bounded(tmp_path):
    spec, m = tiering([file_tier_cfg(tmp_path / "f", capacity=3 * ROW)], primary_chunks=8)
    tier = m.secondary_tiers[0]
    try:
        rc = ReqContext("r1")
        m.on_new_request(rc)
        a = keys_of(1, 8)
        for i in range(0, 8, 2):
            store(m, a[i:i + 2], rc, seed=i)
            settle(m, tier)
        st = tier.stats()
        assert st["writes"] == 8 and st["evictions"] >= 5 and st["bytes_used"] <= 3 * ROW
        # least recently written first (the two writes of a pair land in either order)
        got = [tier.lookup(k, rc) for k in a]
        assert got[:4] == [LookupResult.MISS] * 4 and got[6:] == [LookupResult.HIT] * 2
        assert sorted(got[4:6], key=lambda x: x.value) == sorted([LookupResult.HIT, LookupResult.MISS],
                                                                key=lambda x: x.value), got
        m.on_request_finished(rc)
    finally:
        m.shutdown()


def test_tier_job_results_carry_bytes_and_time(tmp_path):
    """What vLLM's kv_offload_tiering_{read,write}_{bytes,time} count: each
    JobResult's transfer_bytes (the payload) and transfer_time."""
    spec, m = tiering([])
    try:
        view = m.primary_tier.get_kv_memoryview()
        tier = SecondaryTierFactory.create_secondary_tier(file_tier_cfg(tmp_path / "f"), view, spec)
        assert isinstance(tier, KvoffloadFileTier) and tier.tier_type == "KvoffloadFileTier"
        r = rows(m)
        r[0:2] = np.arange(2 * ROW, dtype=np.uint32).astype(np.int8).reshape(2, ROW).view(r.dtype)
        rc = ReqContext("r")
        keys = keys_of(3, 2)
        tier.submit_store(TransferJob(job_id=7, keys=keys, chunk_ids=np.array([0, 1]), is_promotion=False,
                                      req_context=rc))
        (res,) = list(tier.get_finished_jobs())
        assert res.job_id == 7 and res.success and res.transfer_bytes == 2 * ROW
        assert res.transfer_time is not None and res.transfer_time >= 0
        assert tier.tier.flush(5000) == 0
        tier.submit_load(TransferJob(job_id=8, keys=keys, chunk_ids=np.array([3, 2]), is_promotion=True,
                                     req_context=rc))
        (res,) = finished(tier)
        assert res.job_id == 8 and res.success and res.successful_keys is None
        assert res.transfer_bytes == 2 * ROW and res.transfer_time > 0
        assert np.array_equal(r[3], r[0]) and np.array_equal(r[2], r[1])
        # a load of a key the tier never held fails, and its row is not reported
        tier.submit_load(TransferJob(job_id=9, keys=[keys[0], keys_of(4, 1)[0]], chunk_ids=np.array([2, 3]),
                                     is_promotion=True, req_context=rc))
        (res,) = finished(tier)
        assert not res.success and list(res.successful_keys) == [keys[0]] and res.transfer_bytes == ROW
        with pytest.raises(Exception):  # chunk ids outside the primary rows are refused before C sees them
            tier.submit_store(TransferJob(job_id=10, keys=keys[:1], chunk_ids=np.array([len(r)]),
                                          is_promotion=False, req_context=rc))
        tier.shutdown()
    finally:
        m.shutdown()


def test_stores_that_find_staging_full_are_retried(tmp_path):
    """Staging memory for one chunk: a store job of six is accepted in part
    (KVO_EAGAIN for the rest), retried at each poll while writes are in
    flight, and reported once all six are written; a load gets them all."""
    spec, m = tiering([], primary_chunks=12)
    try:
        view = m.primary_tier.get_kv_memoryview()
        tier = SecondaryTierFactory.create_secondary_tier(
            file_tier_cfg(tmp_path / "f", max_staging_bytes=ROW, io_threads=1), view, spec)
        r = rows(m)
        r[0:6] = np.random.default_rng(3).integers(-128, 127, (6, ROW), dtype=np.int8).view(r.dtype)
        keys = keys_of(5, 6)
        tier.submit_store(TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(6), is_promotion=False,
                                      req_context=ReqContext("r")))
        (res,) = finished(tier)
        assert res.job_id == 1 and res.success and res.transfer_bytes == 6 * ROW
        assert tier.tier.flush(5000) == 0
        st = tier.stats()
        # the staging memory refused some (back-pressure): the cascade wrote them later
        assert st["writes"] == 6 and st["dropped_backpressure"] > 0, st
        assert st["cascade"]["file"]["writes_deferred"] > 0 and st["cascade"]["file"]["writes_dropped"] == 0, st
        tier.submit_load(TransferJob(job_id=2, keys=keys, chunk_ids=np.arange(6, 12), is_promotion=True,
                                     req_context=ReqContext("r")))
        (res,) = finished(tier)
        assert res.success and np.array_equal(r[6:12], r[0:6])
        tier.shutdown()
    finally:
        m.shutdown()


def test_file_tier_events(tmp_path):
    """enable_kv_events: one stored event per chunk that reached the files,
    from take_events of vLLM's manager, with the fields this vLLM has."""
    m, tier, rc, a, _ = stored([file_tier_cfg(tmp_path / "f", enable_kv_events=True)], 3, events=True)
    try:
        for _ in range(100):  # the write completions
            tier.get_finished_jobs()
            if tier.events:
                break
            time.sleep(0.01)
        ev = [e for e in m.take_events() if e.medium is Medium.STORAGE]
        assert sorted(k for e in ev for k in e.keys) == sorted(a)
        assert all(not e.removed for e in ev)
        if "ownership" in EVENT_FIELDS:
            assert all(e.ownership == "KvoffloadFileTier" for e in ev)
        assert list(m.take_events()) == []
        m.on_request_finished(rc)
    finally:
        m.shutdown()
    # without vLLM's kv_events_config the tier sends none
    spec, m = tiering([file_tier_cfg(tmp_path / "g", enable_kv_events=True)], events=False)
    try:
        assert m.secondary_tiers[0].events is None
    finally:
        m.shutdown()


def test_tier_namespace_follows_the_row_layout():
    c1 = make_config()
    s1 = TieringOffloadingSpec(c1)
    import dataclasses
    c2 = dataclasses.replace(c1, parallel=dataclasses.replace(c1.parallel, world_size=2, tp_size=2))
    s2 = TieringOffloadingSpec(c2)
    c3 = dataclasses.replace(c1, worker_kv_bytes_per_block=4096)
    assert len({tier_layout_hash(s1, ROW), tier_layout_hash(s2, ROW), tier_layout_hash(TieringOffloadingSpec(c3), ROW),
                tier_layout_hash(s1, 2 * ROW)}) == 4
    assert tier_layout_hash(s1, ROW) == tier_layout_hash(TieringOffloadingSpec(make_config()), ROW)


def test_file_tier_refuses_bad_config(tmp_path):
    with pytest.raises(Exception) as e:
        tiering([file_tier_cfg(tmp_path / "f", capacity=ROW - 1)])
    assert "capacity_bytes" in str(e.value)
    with pytest.raises(Exception) as e:
        tiering([{"type": "KvoffloadFileTier", "module_path": MOD, "capacity_bytes": ROW}])
    assert "root_dir" in str(e.value)


# ----------------------------------------------------------------- Redis tier --

def test_redis_tier_shares_chunks_between_engines():
    """Engine A's tiering cascades chunks to the cluster; engine B (its own
    empty primary tier) asks in one batch (RETRY), promotes (HIT) and holds
    the same bytes; a chunk nobody stored is a MISS once the answer lands."""
    cfg = redis_tier_cfg("tier-share")
    _, ma = tiering([cfg])
    rc = ReqContext("r")
    a = keys_of(1, 3)
    try:
        ma.on_new_request(rc)
        data = store(ma, a, rc, seed=3)
        settle(ma, ma.secondary_tiers[0])
        assert ma.secondary_tiers[0].stats()["puts"] == 3
        ma.on_request_finished(rc)
    finally:
        ma.shutdown()
    _, mb = tiering([dict(cfg)])
    tier = mb.secondary_tiers[0]
    assert isinstance(tier, KvoffloadRedisTier)
    try:
        mb.on_new_request(rc)
        never = keys_of(9, 1)[0]
        assert [mb.lookup(k, rc) for k in a + [never]] == [LookupResult.RETRY] * 4
        for k in a:
            assert promote(mb, k, rc) == LookupResult.HIT
            assert np.array_equal(loaded_bytes(mb, k, rc), data[k])
        assert promote(mb, never, rc) == LookupResult.MISS
        st = tier.stats()
        assert st["gets"] == 3 and st["exists_hits"] == 3 and st["exists_misses"] == 1
        mb.on_request_finished(rc)
    finally:
        mb.shutdown()


def test_redis_tier_events_on_acknowledged_puts():
    m, tier, rc, a, _ = stored([redis_tier_cfg("tier-events", enable_kv_events=True)], 2, events=True)
    try:
        for _ in range(200):
            tier.get_finished_jobs()
            if tier.events and sum(len(e.keys) for e in tier.events) == 2:
                break
            time.sleep(0.01)
        ev = [e for e in m.take_events() if e.medium is Medium.STORAGE]
        assert sorted(k for e in ev for k in e.keys) == sorted(a) and not any(e.removed for e in ev)
        m.on_request_finished(rc)
    finally:
        m.shutdown()


# ---------------------------------------- vLLM's scheduler and connector --

@pytest.fixture
def sim():
    import vllm_engine_sim
    return vllm_engine_sim


def test_tiering_through_vllms_scheduler_and_connector(sim, tmp_path):
    """vLLM's scheduler, OffloadingConnector and TieringOffloadingManager,
    the shim's CPU copy worker, kvoffload's file tier: a prompt computed,
    evicted from the device and from the primary tier, then loaded back
    through the file tier into the device blocks, which hold the bytes
    computing them gives (check_block)."""
    sys.path.insert(0, os.path.join(HERE, "e2e"))
    try:
        # the sim's chunk: 2 blocks x 2 layer tensors x 2048-byte pages (16
        # tokens, K and V, 2 heads x 16 dims, fp16) = 8192 bytes; 6 of them
        extra = {"spec_name": "CpuTieringOffloadingSpec", "spec_module_path": "tiering_shim",
                 "cpu_bytes_to_use": 6 * 8192, "blocks_per_chunk": 2,
                 "secondary_tiers": [file_tier_cfg(tmp_path / "f", capacity=64 << 20)]}
        e = sim.Engine(extra, num_blocks=24, engine_id=f"kvo-tier-sim-{os.getpid()}")
    finally:
        sys.path.remove(os.path.join(HERE, "e2e"))
    try:
        import random
        rng = random.Random(5)
        p1 = [rng.randrange(1000) for _ in range(160)]
        e.add("a", p1 + [1] * 8)
        e.run()
        for i in range(3):   # push p1 out of the device cache and the primary tier
            e.add(f"f{i}", [rng.randrange(1000) for _ in range(200)])
            e.run()
        m = e.connector.scheduler.manager
        tier = m.secondary_tiers[0]
        assert tier.tier.flush(5000) == 0
        reads = tier.stats()["reads"]
        e.add("b", p1 + [2] * 8)
        e.run()
        assert e.hits.get("b", 0) >= 128, e.hits
        assert tier.stats()["reads"] > reads
        assert e.loaded_blocks_checked > 0
    finally:
        e.shutdown()


# ------------------------------------- KV events through vLLM's connector --

def _events_engine(sim, kind, tmp_path):
    if kind == "kvoffload_spec":
        # a host tier of 6 chunks (evictions: removed events), below the
        # simulated engine's step (2048 tokens): say the step is 3 chunks,
        # or the spec refuses the size at create (docs/python.md, Host sizing)
        extra = {"spec_name": "KvoffloadOffloadingSpec", "spec_module_path": "kvoffload.vllm",
                 "cpu_bytes_to_use": 6 * 8192, "blocks_per_chunk": 2, "kvo_step_tokens": 3 * 32}
    else:
        extra = {"spec_name": "CpuTieringOffloadingSpec", "spec_module_path": "tiering_shim",
                 "cpu_bytes_to_use": 6 * 8192, "blocks_per_chunk": 2,
                 "secondary_tiers": [file_tier_cfg(tmp_path / "f", capacity=64 << 20, enable_kv_events=True)]}
    sys.path.insert(0, os.path.join(HERE, "e2e"))
    try:
        return sim.Engine(extra, num_blocks=24, engine_id=f"kvo-ev-{kind}-{os.getpid()}", kv_events=True)
    finally:
        sys.path.remove(os.path.join(HERE, "e2e"))


@pytest.mark.parametrize("kind", ["kvoffload_spec", "tiering_file"])
def test_kv_events_through_vllms_connector(sim, kind, tmp_path):
    """vLLM's KV cache events on (vLLM 0.32 and 0.33 alike): the offloading
    events of kvoffload's spec, or of vLLM's tiering with kvoffload's file
    tier, pass through vLLM's own event tracker (the connector's
    take_events) as BlockStored / BlockRemoved: chunks stored in host memory
    (CPU) and, with the tier, in the files (STORAGE, after the CPU copy);
    host evictions removed, and never a hash that was not stored."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    e = _events_engine(sim, kind, tmp_path)
    log = []   # vLLM's scheduler drains the connector's events every step: record them on the way
    orig = e.connector.take_events

    def recording():
        evs = list(orig())
        log.extend(evs)
        return evs

    e.connector.take_events = recording
    try:
        import random
        rng = random.Random(7)
        stored: dict[str, set] = {"CPU": set(), "STORAGE": set()}
        removed: dict[str, set] = {"CPU": set(), "STORAGE": set()}
        owners = set()

        def drain():
            if kind == "tiering_file":
                tier = e.connector.scheduler.manager.secondary_tiers[0]
                assert tier.tier.flush(5000) == 0
                for _ in range(100):
                    e.step()   # the manager polls the tier: its store jobs' completions become events
                    if not tier.has_pending_work():
                        break
                    time.sleep(0.005)
            e.step()
            evs = log[:]
            del log[:]
            for ev in evs:
                if isinstance(ev, BlockStored):
                    stored[ev.medium].update(ev.block_hashes)
                    if getattr(ev, "ownership", None):
                        owners.add(ev.ownership)
                elif isinstance(ev, BlockRemoved):
                    removed[ev.medium].update(ev.block_hashes)

        p1 = [rng.randrange(1000) for _ in range(160)]
        e.add("a", p1 + [1] * 8)
        e.run()
        drain()
        first = set(stored["CPU"])
        assert len(first) >= 5, stored   # p1's 10 blocks: 5 chunks of 2
        for i in range(3):               # push p1 out of host memory
            e.add(f"f{i}", [rng.randrange(1000) for _ in range(200)])
            e.run()
            drain()
        assert removed["CPU"] & first, "no host eviction was announced"
        assert removed["CPU"] <= stored["CPU"] and removed["STORAGE"] == set()
        if kind == "tiering_file":
            assert first <= stored["STORAGE"] <= stored["CPU"], (len(first), len(stored["STORAGE"]))
            if "ownership" in EVENT_FIELDS:
                assert owners == {"KvoffloadFileTier"}
        else:
            assert stored["STORAGE"] == set()
    finally:
        e.shutdown()
