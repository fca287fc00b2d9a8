/*
 * A small open-addressing hash map from uint64 keys to two uint64 values,
 * used by the connector for its request table (id -> request), its job table
 * (job id -> job) and its block map ((group, block) -> in-flight stores).
 *
 * Linear probing with backward-shift deletion (no tombstones), so lookups
 * stay short however many inserts and deletes happen; the table doubles at
 * half load.  Keys are mixed with a 64-bit finaliser because request ids and
 * block ids are small consecutive integers.  Not thread-safe: the connector
 * holds its lock around every call.
 */
#include "connector/connector_internal.h"

static uint64_t kvo__mix64(uint64_t x) {
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

int kvo__map_init(kvo__map *m, size_t cap_hint) {
    size_t cap = 16;
    while (cap < cap_hint * 2) cap <<= 1;
    m->e = kvo__calloc(cap, sizeof *m->e);
    if (!m->e) return kvo__error(KVO_ENOMEM, "connector: out of memory for a table of %zu entries", cap);
    m->cap = cap;
    m->n = 0;
    return 0;
}

void kvo__map_free(kvo__map *m) {
    kvo__free(m->e);
    m->e = NULL;
    m->cap = m->n = 0;
}

kvo__map_entry *kvo__map_get(const kvo__map *m, uint64_t key) {
    size_t mask = m->cap - 1;
    for (size_t i = kvo__mix64(key) & mask;; i = (i + 1) & mask) {
        kvo__map_entry *e = &m->e[i];
        if (!e->used) return NULL;
        if (e->key == key) return e;
    }
}

static int kvo__map_grow(kvo__map *m) {
    size_t ncap = m->cap * 2;
    kvo__map_entry *ne = kvo__calloc(ncap, sizeof *ne);
    if (!ne) return kvo__error(KVO_ENOMEM, "connector: out of memory growing a table to %zu entries", ncap);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].used) continue;
        size_t j = kvo__mix64(m->e[i].key) & (ncap - 1);
        while (ne[j].used) j = (j + 1) & (ncap - 1);
        ne[j] = m->e[i];
    }
    kvo__free(m->e);
    m->e = ne;
    m->cap = ncap;
    return 0;
}

int kvo__map_reserve(kvo__map *m, size_t extra) {
    while ((m->n + extra + 1) * 2 > m->cap) {
        int rc = kvo__map_grow(m);
        if (rc) return rc;
    }
    return 0;
}

int kvo__map_put(kvo__map *m, uint64_t key, kvo__map_entry **out) {
    kvo__map_entry *e = kvo__map_get(m, key);
    if (e) {
        *out = e;
        return 1;
    }
    if ((m->n + 1) * 2 > m->cap) {
        int rc = kvo__map_grow(m);
        if (rc) return rc;
    }
    size_t mask = m->cap - 1;
    size_t i = kvo__mix64(key) & mask;
    while (m->e[i].used) i = (i + 1) & mask;
    e = &m->e[i];
    e->used = 1;
    e->key = key;
    e->a = e->b = 0;
    e->p = NULL;
    m->n++;
    *out = e;
    return 0;
}

void kvo__map_del(kvo__map *m, kvo__map_entry *e) {
    size_t mask = m->cap - 1;
    size_t i = (size_t)(e - m->e);
    m->e[i].used = 0;
    m->n--;
    /* backward shift: move later entries of the run into the hole when their
     * home position does not lie cyclically in (hole, j]. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->e[j].used) break;
        size_t home = kvo__mix64(m->e[j].key) & mask;
        bool in_between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (in_between) continue;
        m->e[i] = m->e[j];
        m->e[j].used = 0;
        i = j;
    }
}
