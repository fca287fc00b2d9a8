#!/usr/bin/env python3
"""Benchmark: kvoffload's vLLM manager vs vLLM's own CPUOffloadingManager
(LRU), same trace, same capacity in chunks, same run.

Replays a Mooncake-format trace (../shared/traces; one chunk per 512-token
hash id, keys are 32-byte hashes + group like vLLM's OffloadKey).  Per
request, the cycle of shared/tools/peer_vllm_manager.py: look keys up until
the first miss, prepare_load + complete_load + touch the hits, prepare_store
all keys, complete_store the ones to store.  Key operations counted as there:
lookups + 3 * hits + 2 * keys.

Contenders:
  vllm_cpu        vLLM 0.33's CPUOffloadingManager(cache_policy="lru")
  kvo_vllm_api    KvoffloadOffloadingManager through vLLM's interface (one
                  C call per lookup, batched calls for the rest)
  kvo_batched     the same manager with the prefix lookup batched
                  (prefix_hits: one C call per request)
Prints one JSON object with absolute key ops/s, hit rates and the ratios
against vllm_cpu.
"""
import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

import kvoffload as k  # noqa: E402
from kvoffload.vllm import KvoffloadOffloadingManager  # noqa: E402

HIT = LookupResult.HIT


def run(m, reqs, batched):
    ops = hits = refs = 0
    t0 = time.perf_counter()
    for i, keys in enumerate(reqs):
        rc = ReqContext(str(i))
        m.on_new_request(rc)
        if batched:
            n = m.prefix_hits(keys)
            ops += min(n + 1, len(keys))
        else:
            n = 0
            for key in keys:
                ops += 1
                if m.lookup(key, rc) != HIT:
                    break
                n += 1
        if n:
            hit = keys[:n]
            m.prepare_load(hit, rc)
            m.complete_load(hit, rc)
            m.touch(hit, rc)
        out = m.prepare_store(keys, rc)
        if out is not None and out.keys_to_store:
            m.complete_store(out.keys_to_store, rc)
        m.on_request_finished(rc)
        ops += 3 * n + 2 * len(keys)
        hits += n
        refs += len(keys)
    dt = time.perf_counter() - t0
    return {"key_ops": ops, "seconds": round(dt, 3), "key_ops_per_s": round(ops / dt),
            "prefix_hit_rate": round(hits / refs, 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=os.path.join(HERE, "..", "..", "..", "shared", "traces",
                                                    "mooncake_synthetic_trace.jsonl"))
    ap.add_argument("--capacity", type=int, default=10000, help="chunks (512-token blocks)")
    ap.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each; the best is reported")
    a = ap.parse_args()
    reqs = []
    with open(a.trace) as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            reqs.append([make_offload_key(h.to_bytes(32, "little"), 0) for h in ids])
            if a.requests and len(reqs) >= a.requests:
                break
    page = 512 * 128 * 1024 // 512  # any size: the manager only accounts slots
    plan = k.Plan(k.Model("bench", 512, [dict(name="g0", tokens_per_block=512, layers=1, page_bytes=page)]),
                  blocks_per_chunk=1)
    slot = plan.groups[0]["slot_bytes"]
    res = {}
    contenders = [("vllm_cpu", lambda: CPUOffloadingManager(num_chunks=a.capacity, cache_policy="lru"), False),
                  ("kvo_vllm_api", lambda: KvoffloadOffloadingManager(plan, a.capacity * slot, [0]), False),
                  ("kvo_batched", lambda: KvoffloadOffloadingManager(plan, a.capacity * slot, [0]), True)]
    for _ in range(a.repeat):
        for name, make, batched in contenders:
            gc.collect()
            r = run(make(), reqs, batched)
            if name not in res or r["key_ops_per_s"] > res[name]["key_ops_per_s"]:
                res[name] = r
    base = res["vllm_cpu"]["key_ops_per_s"]
    out = {"trace": os.path.basename(a.trace), "requests": len(reqs), "capacity_chunks": a.capacity,
           "results": res,
           "ratio_kvo_vllm_api_vs_vllm_cpu": round(res["kvo_vllm_api"]["key_ops_per_s"] / base, 2),
           "ratio_kvo_batched_vs_vllm_cpu": round(res["kvo_batched"]["key_ops_per_s"] / base, 2)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
