/*
 * The library's one open-addressing hash map: two-word keys, user-sized
 * entries.  Users: the connector's request, job, block and read tables
 * (src/connector/map.c wraps it), the transfer engine's dependency table and
 * its duplicate-write check (src/transfer/).  The store's index keeps its own
 * 8-byte-slot table (src/store/index.c) because it keys entries that live in
 * the store's pool, but shares kvo__hmap_stays() below.
 *
 * Layout: one array of cap entries (cap a power of two), each esz bytes:
 * key words k0, k1 at offsets 0 and 8, a uint32 `used` flag at offset 16,
 * then the user's fields.  An entry lives at or after its home slot
 * hash(k0, k1) & (cap - 1), with no empty slot in between (linear probing).
 * Keys are compared as whole words, so every (k0, k1) pair is a valid key;
 * emptiness is the flag, not a reserved key.
 *
 * Invariants: n * 2 <= cap (load <= 1/2, so a hit averages ~1.5 probes and
 * a miss ~2.5); no tombstones: deletion shifts the following entries of the
 * run back into the hole when that does not move them before their home
 * (Knuth 6.4, algorithm R), so probe lengths never degrade with churn.
 *
 * Why this design: entries inline (no per-entry allocation, one cache line
 * per probe for the transfer engine's 64-byte entries); inserts never
 * allocate, growth is a separate step (kvo__hmap_reserve, or
 * kvo__hmap_cap_for + kvo__hmap_rehash for a caller that allocates with its
 * lock dropped), so a caller can reserve before committing to anything and
 * then insert without failure paths.  Not thread-safe: callers lock.
 */
#include "core/hmap.h"

static inline uint64_t *kvo__hmap_key(unsigned char *p) { return (uint64_t *)p; }
static inline uint32_t *kvo__hmap_used(unsigned char *p) { return (uint32_t *)(p + KVO__HMAP_USED_OFF); }

int kvo__hmap_init(kvo__hmap *m, size_t esz, size_t cap_hint, const char *what) {
    assert(esz >= KVO__HMAP_MIN_ESZ && esz % 8 == 0);
    m->e = NULL;
    m->esz = esz;
    m->cap = m->n = 0;
    return cap_hint ? kvo__hmap_reserve(m, cap_hint, 16, what) : 0;
}

void kvo__hmap_free(kvo__hmap *m) {
    kvo__free(m->e);
    m->e = NULL;
    m->cap = m->n = 0;
}

void *kvo__hmap_find(const kvo__hmap *m, uint64_t k0, uint64_t k1) {
    if (!m->cap) return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = kvo__hmap_hash(k0, k1) & mask;; i = (i + 1) & mask) {
        unsigned char *p = m->e + i * m->esz;
        if (!*kvo__hmap_used(p)) return NULL;
        const uint64_t *k = kvo__hmap_key(p);
        if (k[0] == k0 && k[1] == k1) return p;
    }
}

void *kvo__hmap_insert(kvo__hmap *m, uint64_t k0, uint64_t k1, bool *existed) {
    size_t mask = m->cap - 1;
    size_t i = kvo__hmap_hash(k0, k1) & mask;
    unsigned char *p;
    for (;; i = (i + 1) & mask) {
        p = m->e + i * m->esz;
        if (!*kvo__hmap_used(p)) break;
        const uint64_t *k = kvo__hmap_key(p);
        if (k[0] == k0 && k[1] == k1) {
            *existed = true;
            return p;
        }
    }
    assert((m->n + 1) * 2 <= m->cap);
    memset(p, 0, m->esz);
    kvo__hmap_key(p)[0] = k0;
    kvo__hmap_key(p)[1] = k1;
    *kvo__hmap_used(p) = 1;
    m->n++;
    *existed = false;
    return p;
}

void kvo__hmap_erase(kvo__hmap *m, void *e) {
    size_t mask = m->cap - 1, i = (size_t)((unsigned char *)e - m->e) / m->esz, j = i;
    for (;;) {
        j = (j + 1) & mask;
        unsigned char *q = m->e + j * m->esz;
        if (!*kvo__hmap_used(q)) break;
        const uint64_t *k = kvo__hmap_key(q);
        if (kvo__hmap_stays(i, kvo__hmap_hash(k[0], k[1]) & mask, j)) continue;
        memcpy(m->e + i * m->esz, q, m->esz);
        i = j;
    }
    *kvo__hmap_used(m->e + i * m->esz) = 0;
    m->n--;
}

size_t kvo__hmap_cap_for(const kvo__hmap *m, size_t extra, size_t min_cap) {
    size_t need;
    if (__builtin_add_overflow(m->n, extra, &need) || need > SIZE_MAX / 2) return 0;
    if (m->cap && need * 2 <= m->cap) return m->cap;
    size_t cap = m->cap ? m->cap : (min_cap ? min_cap : 16);
    while (need * 2 > cap) {
        if (cap > (SIZE_MAX / m->esz) / 4) return 0;
        cap *= 2;
    }
    return cap;
}

void *kvo__hmap_rehash(kvo__hmap *m, void *ntab, size_t ncap) {
    unsigned char *old = m->e, *nt = ntab;
    size_t mask = ncap - 1;
    assert(m->n * 2 <= ncap);
    for (size_t i = 0; i < m->cap; i++) {
        unsigned char *p = old + i * m->esz;
        if (!*kvo__hmap_used(p)) continue;
        const uint64_t *k = kvo__hmap_key(p);
        size_t j = kvo__hmap_hash(k[0], k[1]) & mask;
        while (*kvo__hmap_used(nt + j * m->esz)) j = (j + 1) & mask;
        memcpy(nt + j * m->esz, p, m->esz);
    }
    m->e = nt;
    m->cap = ncap;
    return old;
}

int kvo__hmap_reserve(kvo__hmap *m, size_t extra, size_t min_cap, const char *what) {
    size_t ncap = kvo__hmap_cap_for(m, extra, min_cap);
    if (ncap && ncap == m->cap) return 0;
    void *nt = ncap ? kvo__calloc(ncap, m->esz) : NULL;
    if (!nt)
        return kvo__error(KVO_ENOMEM, "%s: out of memory for a table of %zu entries of %zu bytes (%zu used)", what,
                          ncap, m->esz, m->n);
    kvo__free(kvo__hmap_rehash(m, nt, ncap));
    return 0;
}
