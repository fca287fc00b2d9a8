"""Request traces the policy tests generate (ids only; each test makes its
own keys from them)."""
import numpy as np


def conversations(seed: int, n: int = 1500) -> list[list[int]]:
    """Requests of 12 conversations going on at once (the shape of
    tests/test_store_policy.c's chat workload): each turn the previous prompt
    and 1-4 new chunks, after one of 4 shared 2-chunk system prompts (ids
    0-7), 1-8 turns a conversation, at most 60 chunks."""
    rng = np.random.default_rng(seed)
    nxt, conv, left, reqs = 100, [[] for _ in range(12)], [0] * 12, []
    for _ in range(n):
        c = int(rng.integers(0, 12))
        if left[c] == 0 or len(conv[c]) > 56:
            s = 2 * int(rng.integers(0, 4))
            conv[c], left[c] = [s, s + 1], int(rng.integers(1, 9))
        for _ in range(int(rng.integers(1, 5))):
            conv[c].append(nxt)
            nxt += 1
        left[c] -= 1
        reqs.append(list(conv[c]))
    return reqs
