/*
 * The one open-addressing hash map of the library (src/core/hmap.c): two-word
 * keys (k0, k1), entries of a size the user chooses.  See hmap.c's essay.
 */
#ifndef KVO_CORE_HMAP_H
#define KVO_CORE_HMAP_H

#include <stdbool.h>

#include "core/internal.h"

/* Every entry type kept in a kvo__hmap begins with these members, in this
 * order (the map reads them as plain uint64_t / uint32_t words, so any struct
 * starting this way is fine):
 *     uint64_t k0, k1;   key
 *     uint32_t used;     0: empty slot (the map sets and clears it)
 * The bytes after `used` belong to the user; an insert zeroes them. */
#define KVO__HMAP_USED_OFF 16
#define KVO__HMAP_MIN_ESZ 20

typedef struct kvo__hmap {
    unsigned char *e;  /* cap entries of esz bytes, or NULL while cap is 0 */
    size_t esz;        /* entry size in bytes (a multiple of 8) */
    size_t cap;        /* 0 or a power of two */
    size_t n;          /* used entries; n * 2 <= cap always */
} kvo__hmap;

/* A full mix of both key words (keys are often small consecutive integers:
 * request ids, block ids, addresses). */
static inline uint64_t kvo__hmap_hash(uint64_t k0, uint64_t k1) {
    uint64_t x = k0 * UINT64_C(0x9E3779B97F4A7C15) ^ (k1 + UINT64_C(0x632BE59BD9B4E019)) * UINT64_C(0xC2B2AE3D27D4EB4F);
    x ^= x >> 29;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 32;
    return x;
}

/* Backward-shift deletion's test: may the entry at j, whose home slot is
 * `home`, stay where it is while the hole is at i?  True when home lies
 * cyclically in (i, j].  Shared with the store's index (index.c). */
static inline bool kvo__hmap_stays(uint64_t i, uint64_t home, uint64_t j) {
    return i <= j ? (home > i && home <= j) : (home > i || home <= j);
}

/* An empty map of esz-byte entries with room for cap_hint entries (cap_hint
 * 0: no table until the first reserve).  0 or KVO_ENOMEM (message names what). */
int kvo__hmap_init(kvo__hmap *m, size_t esz, size_t cap_hint, const char *what);
void kvo__hmap_free(kvo__hmap *m);

/* The entry of (k0, k1) or NULL.  Entry pointers die at the next insert,
 * erase or growth. */
void *kvo__hmap_find(const kvo__hmap *m, uint64_t k0, uint64_t k1);
/* Find (k0, k1), or insert it with its user bytes zeroed (*existed says
 * which).  Room must have been reserved (kvo__hmap_reserve or _rehash):
 * this never allocates and never fails. */
void *kvo__hmap_insert(kvo__hmap *m, uint64_t k0, uint64_t k1, bool *existed);
/* Remove the entry e points at (backward shift: other entries may move). */
void kvo__hmap_erase(kvo__hmap *m, void *e);

/* Capacity needed so that `extra` more inserts keep the load <= 1/2: m->cap
 * when it already suffices, else a power of two >= min_cap; 0 on overflow. */
size_t kvo__hmap_cap_for(const kvo__hmap *m, size_t extra, size_t min_cap);
/* Move every entry into ntab (ncap zeroed entries, ncap >= kvo__hmap_cap_for)
 * and return the old table for the caller to free.  For callers that must
 * allocate with a lock dropped (the transfer engine). */
void *kvo__hmap_rehash(kvo__hmap *m, void *ntab, size_t ncap);
/* Grow (doubling, from min_cap when empty) so that `extra` more inserts need
 * no growth.  0 or KVO_ENOMEM with a message naming `what`. */
int kvo__hmap_reserve(kvo__hmap *m, size_t extra, size_t min_cap, const char *what);

#endif
