#!/usr/bin/env python3
"""Upper bounds for online eviction policies on a Mooncake-format trace.

docs/replay.md ("out of reach") quotes these figures: replays of the trace
with the store's model (per request, the prefix hits are its leading cached
blocks; then all its blocks are stored, present ones used), where the
eviction order is told something about the future.  Each line is a bound for
every online policy that knows less than the oracle does.

    python3 tools/replay_oracles.py [TRACE] [CAPACITY ...]

Defaults: ../shared/traces/mooncake_synthetic_trace.jsonl, 1000 10000.
The first line (LRU) reproduces `kvoffload replay` exactly (0.0825 / 0.4235).
Standard library only; seconds.
"""
import heapq
import json
import math
import sys
from collections import Counter, defaultdict


def load(path):
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def replay(reqs, cap, prio):
    """Evict the cached block of least prio(h, hist, t) (fixed between uses)."""
    heap, key, hist, hits, t = [], {}, {}, 0, 0
    for ids in reqs:
        k = 0
        while k < len(ids) and ids[k] in key:
            k += 1
        hits += k
        for h in ids:
            t += 1
            hs = hist.setdefault(h, [])
            hs.append(t)
            if h not in key:
                while len(key) >= cap:
                    p, v = heapq.heappop(heap)
                    if key.get(v) == p:
                        del key[v]
            p = prio(h, hs, t)
            key[h] = p
            heapq.heappush(heap, (p, h))
    return hits / sum(map(len, reqs))


def length_class(ids, j, k):
    """What a store sees when it stores block j of a request: its length
    (log2), whether it is the request's last block, whether the request's
    prefix was known (k > 0)."""
    if j == len(ids) - 1:
        return ("last",)
    return ("cont" if k else "fresh", int(math.log2(len(ids))))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "../shared/traces/mooncake_synthetic_trace.jsonl"
    caps = [int(c) for c in sys.argv[2:]] or [1000, 10000]
    reqs = load(path)
    total = Counter(h for ids in reqs for h in ids)
    last_t, t = {}, 0
    for ids in reqs:
        for h in ids:
            t += 1
            last_t[h] = t
    # each class's true reuse rate, measured over the whole trace (the oracle)
    cls, seen, stat = {}, set(), defaultdict(lambda: [0, 0])
    for ids in reqs:
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        for j, h in enumerate(ids):
            if h not in seen:
                c = length_class(ids, j, k)
                cls[h] = c
                stat[c][0] += 1
                stat[c][1] += total[h] > 1
        seen.update(ids)
    rate = {c: v[1] / v[0] for c, v in stat.items()}
    big = 1 << 40
    oracles = [
        ("nothing (LRU)", lambda h, hs, t: t),
        ("the whole past of every key (2Q, unbounded history)",
         lambda h, hs, t: t if len(hs) > 1 else t - big),
        ("the continuation rate of each length class",
         lambda h, hs, t: t if len(hs) > 1 else t - big if rate[cls[h]] > 0.4 else t - 2 * big),
        ("every key's total number of uses", lambda h, hs, t: total[h] * big + t),
        ("which keys are dead", lambda h, hs, t: (total[h] > len(hs)) * big + t),
        ("every key's remaining uses", lambda h, hs, t: (total[h] - len(hs)) * big + t),
        ("every key's rate of remaining uses",
         lambda h, hs, t: (total[h] - len(hs)) / (last_t[h] - t + 1) if total[h] > len(hs) else -1.0 / t),
    ]
    print("%-55s" % "the eviction order knows" + "".join("%10d" % c for c in caps))
    for name, prio in oracles:
        print("%-55s" % name + "".join("%10.4f" % replay(reqs, c, prio) for c in caps), flush=True)


if __name__ == "__main__":
    main()
