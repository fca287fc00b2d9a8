/*
 * The store's key mix, alone so that a program outside the library can use
 * the very function the index hashes with: bench/bench_store_bare.c (the
 * bare-index limit of `kvoffload bench store`) probes its table with it, so
 * a change here changes both sides of that comparison.  Depends only on the
 * public kvo_chunk_key.  Not installed.
 */
#ifndef KVO_STORE_KEY_MIX_H
#define KVO_STORE_KEY_MIX_H

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

#endif
