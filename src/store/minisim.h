/*
 * The prefix policy's miniature simulations (minisim.c) and the victim rule
 * they share with the policy (policy_prefix.c).  A leaf: keys are 64-bit
 * mixes, and nothing here knows the store.
 */
#ifndef KVO_STORE_MINISIM_H
#define KVO_STORE_MINISIM_H

#include "core/internal.h"

/* Evicted keys the prefix policy remembers per key the store can hold (its
 * ghost_cap, and the same in its simulations). */
#define KVO__PREFIX_GHOSTS 4u
/* The prefix policy's settings, one simulation each: the age gap in eighths
 * of the cache size (UINT32_MAX: infinite; 0: LRU) ... */
#define KVO__MINI_N 10
extern const uint32_t kvo__mini_knob8[KVO__MINI_N];
/* ... and the ghost window, in cache sizes (at most KVO__PREFIX_GHOSTS): a
 * key stored again counts as reused when it was evicted at most that many
 * cache sizes of evictions ago. */
extern const uint8_t kvo__mini_ghostw[KVO__MINI_N];
/* The knob k8 (eighths of a cache of `size` keys) as an age gap in uses. */
static inline uint64_t kvo__prefix_gap(uint32_t k8, uint64_t size) {
    return k8 == UINT32_MAX ? UINT64_MAX : (uint64_t)k8 * size / 8;
}
/* The victim rule: M's oldest (last used at stamp m) rather than P's oldest
 * (stamp p) when it is older by more than gap uses. */
static inline bool kvo__prefix_take_m(uint32_t p, uint32_t m, uint64_t gap) {
    int32_t d = (int32_t)(p - m);
    return d > 0 && (uint64_t)d > gap;
}
typedef struct kvo__mini kvo__mini;
/* Simulations for a store of at most max_entries keys: ~4 MiB whatever the
 * size.  0 or KVO_ENOMEM (message set). */
int kvo__mini_create(kvo__mini **out, uint64_t max_entries);
void kvo__mini_destroy(kvo__mini *m);
/* One use of the key whose kvo__key_mix is mix, by a store now holding
 * `resident` keys, which hit (hit) or missed it; updates the simulations
 * when the key is in the sample. */
void kvo__mini_ref(kvo__mini *m, uint64_t mix, uint64_t resident, bool hit);
/* The setting in force (an index into kvo__mini_knob8). */
uint32_t kvo__mini_best(const kvo__mini *m);

#endif
