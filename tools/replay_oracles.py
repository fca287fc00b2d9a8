#!/usr/bin/env python3
"""Upper bounds for online eviction policies on a Mooncake-format trace.

docs/replay.md ("What no online policy reaches") quotes these figures: replays of the trace
with the store's model (per request, the prefix hits are its leading cached
blocks; then all its blocks are stored, present ones used), where the
eviction order is told something about the future.  Each line is a bound for
every online policy that knows less than the oracle does; the last line is
an online policy for reference (LFU on the past uses), not a bound.

    python3 tools/replay_oracles.py [TRACE] [CAPACITY ...]

Defaults: ../shared/traces/mooncake_synthetic_trace.jsonl, 1000 10000.
The first line (LRU) reproduces `kvoffload replay` exactly (0.0825 / 0.4235).
Standard library only; seconds.

    python3 tools/replay_oracles.py --generate chat|docs [SEED] > FILE

writes the generated workloads of docs/replay.md (the shapes of
tests/replay_test_util.h, another random generator): chat lines carry their
conversation as "session_id".

    python3 tools/replay_oracles.py --gaps [POLICY] < REPLAY.json

reads `kvoffload replay --json` lines (a sweep with lru, arc, s3fifo and
POLICY, default prefix) and prints docs/replay.md's gap figures, counted in
hits: capacities where POLICY is below the best of LRU, ARC and S3-FIFO, the
worst gap (points) and where, the mean gap, and capacities below LRU.
"""
import heapq
import json
import math
import random
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


def generate(kind, seed):
    """chat: 1500 conversations arriving ~every 0.7 time units, 1 + Exp(3)
    turns 90 units apart on average, each turn the previous prompt plus 1-4
    blocks, after one of 8 shared 4-block system prompts.  docs: 1500
    documents of 8-60 blocks picked with Zipf(0.9) popularity, 4000 requests
    each adding a 1-3-block question."""
    rng = random.Random(seed)
    nxt = 0
    out = sys.stdout
    if kind == "chat":
        sys_prompts = [list(range(4 * p, 4 * p + 4)) for p in range(8)]
        nxt = 32
        convs, t = [], 0.0
        for c in range(1500):
            t += rng.expovariate(1 / 0.7)
            convs.append([t, min(30, 1 + int(rng.expovariate(1 / 3.0))), list(rng.choice(sys_prompts)), c])
        heap = [(cv[0], cv[3]) for cv in convs]
        heapq.heapify(heap)
        while heap:
            when, c = heapq.heappop(heap)
            cv = convs[c]
            for _ in range(rng.randint(1, 4)):
                if len(cv[2]) < 160:
                    cv[2].append(nxt)
                    nxt += 1
            out.write(json.dumps({"session_id": c, "hash_ids": cv[2]}) + "\n")
            cv[1] -= 1
            if cv[1] > 0:
                heapq.heappush(heap, (when + rng.expovariate(1 / 90.0), c))
    else:
        docs = []
        for _ in range(1500):
            n = rng.randint(8, 60)
            docs.append(list(range(nxt, nxt + n)))
            nxt += n
        weights = [1 / (d + 1) ** 0.9 for d in range(1500)]
        for d in rng.choices(range(1500), weights, k=4000):
            q = rng.randint(1, 3)
            out.write(json.dumps({"hash_ids": docs[d] + list(range(nxt, nxt + q))}) + "\n")
            nxt += q


def margins(lines, pol):
    """A replay sweep's `kvoffload replay --json` lines, per capacity that has
    lru, arc, s3fifo and pol: (pol's hits, the best of the three's, lru's), in
    capacity order; and the trace's blocks."""
    hits, blocks = defaultdict(dict), 0
    for line in lines:
        if line.strip():
            o = json.loads(line)
            hits[o["capacity_blocks"]][o["policy"]] = o["hits"]
            blocks = o["blocks"]
    out = {}
    for c in sorted(hits):
        r = hits[c]
        if pol in r and all(p in r for p in ("lru", "arc", "s3fifo")):
            out[c] = (r[pol], max(r["lru"], r["arc"], r["s3fifo"]), r["lru"])
    return out, blocks


def gaps(lines, pol):
    """The gap figures of a replay sweep (see the module's doc)."""
    rows, blocks = margins(lines, pol)
    below = below_lru = n = 0
    total, worst, worst_lru, at = 0.0, 0.0, 0.0, None
    for c, (hits, best, lru) in rows.items():
        g = 100.0 * (hits - best) / blocks
        n += 1
        total += g
        below += hits < best
        if hits < lru:
            below_lru += 1
            worst_lru = min(worst_lru, 100.0 * (hits - lru) / blocks)
        if g < worst:
            worst, at = g, c
    if not n:
        return "no capacity with lru, arc, s3fifo and " + pol
    where = f" at {at}" if at is not None else ""
    return (f"{pol} below the best of lru/arc/s3fifo at {below}/{n} capacities, worst {worst:+.2f} points{where}, "
            f"mean {total / n:+.3f}; below lru at {below_lru} (worst {worst_lru:+.2f})")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--gaps":
        print(gaps(sys.stdin, sys.argv[2] if len(sys.argv) > 2 else "prefix"))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--generate":
        generate(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1)
        return
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
    # an online policy for reference, not a bound: LFU on the past uses (a new
    # key, used once, is evicted before any key used twice: its own request's
    # chunks first when the cache holds nothing else used once)
    print("%-55s" % "online: LFU on past uses (a reference, not a bound)"
          + "".join("%10.4f" % replay(reqs, c, lambda h, hs, t: len(hs) * big + t) for c in caps), flush=True)


if __name__ == "__main__":
    main()
