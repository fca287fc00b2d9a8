/*
 * The store's key mix and its batch probes' prefetch rule, alone so that a
 * program outside the library can use the very functions the index uses:
 * bench/bench_store_bare.c (the bare-index limit of `kvoffload bench store`)
 * probes its table with them, so a change here changes both sides of that
 * comparison.  Depends only on the public kvo_chunk_key.  Not installed.
 */
#ifndef KVO_STORE_KEY_MIX_H
#define KVO_STORE_KEY_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "kvoffload/kvo.h"

/* A full 64-bit mix of the key (murmur3's finalizer over lo, hi and group):
 * keys are XXH3 outputs in production, but engines may hand in their own
 * unit hashes and tests use structured ones; probe lengths must not depend
 * on that. */
static inline uint64_t kvo__key_mix(const kvo_chunk_key *k) {
    uint64_t h = k->hash.lo ^ (k->hash.hi * UINT64_C(0x9E3779B97F4A7C15)) ^ ((uint64_t)k->group << 56);
    h ^= h >> 33;
    h *= UINT64_C(0xFF51AFD7ED558CCD);
    h ^= h >> 33;
    h *= UINT64_C(0xC4CEB9FE1A85EC53);
    h ^= h >> 33;
    return h;
}

/* Table slots per entry the table must hold, at least (rounded up to a
 * power of two): a load factor of at most 1/4.  At 1/2 linear probing's
 * runs made the exits of probes and of
 * backward-shift deletions branch at random, a misprediction or two per key:
 * vLLM's store cycle at 10k blocks ran 14 % faster at 1/4 (the bare index as
 * much), for 16 more bytes per entry beside its 64-byte entry (and the KV
 * chunk of kilobytes to megabytes the entry describes). */
#define KVO__INDEX_SLOTS_PER_ITEM 4

/* Batch probes prefetch each key's table slot 8 keys ahead and, 4 ahead, the
 * entry its slot names (the slot cached by then): the entry index to
 * prefetch for a key of mix h, or UINT32_MAX for none.  Tables of 8-byte
 * slots (tag << 32 | entry, ~0 empty) over nent entries.  walk (a table and
 * entries larger than KVO__PIPE_WALK_BYTES, which caches do not hold):
 * the first slot of the key's run whose tag matches, within 4 slots, so that
 * a miss whose home slot holds another key fetches nothing.  Otherwise the
 * home slot's entry when its tag matches, else entry 0 (cached), without a
 * branch: when everything is cached the walk's branches, taken at random
 * (empty or not, match or not), cost a misprediction per key for nothing
 * (vLLM's store cycle at 10k blocks: 1.2 MiB of table and entries, +11-14 %
 * without them), while at 1e6 keys (96 MiB) the walk's prefetch kept touches
 * at 0.88 of the bare index, 0.73 with the home slot's alone (measured with
 * the table half full, before KVO__INDEX_SLOTS_PER_ITEM was 4). */
#define KVO__PIPE_WALK_BYTES (UINT64_C(4) << 20)
/* The rule's choice for a table of `slots` 8-byte slots over `entries`
 * 64-byte entries (the store's and the bare index's). */
static inline bool kvo__pipe_walks(uint64_t slots, uint64_t entries) {
    return slots * 8 + entries * 64 > KVO__PIPE_WALK_BYTES;
}
static inline uint32_t kvo__pipe_ahead(const uint64_t *tab, uint64_t mask, uint64_t h, bool walk, uint32_t nent) {
    uint64_t tag = h & 0xFFFFFFFFu;
    if (!walk) {
        uint64_t v = tab[h & mask];
        uint32_t e = (v >> 32) == tag ? (uint32_t)v : 0;
        return e < nent ? e : 0; /* an empty slot's tag can match */
    }
    for (uint64_t j = h, t = 0; t < 4; t++, j++) {
        uint64_t v = tab[j & mask];
        if (v == UINT64_MAX) break;
        if ((v >> 32) == tag) return (uint32_t)v;
    }
    return UINT32_MAX;
}

#endif
