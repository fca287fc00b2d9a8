/*
 * The connector's tables: request id -> request, job id -> job,
 * (group, block) -> in-flight stores, read id -> read.  A thin typed wrapper
 * over the library's one hash map (src/core/hmap.c: linear probing,
 * backward-shift deletion, load <= 1/2): the key is (key, 0), the entry
 * kvo__map_entry.  The connector's struct keeps plain e/cap/n fields, which
 * it iterates; each call views them as a kvo__hmap and writes back what
 * changed.  Not thread-safe: the connector holds its lock around every call.
 */
#include <stddef.h>

#include "connector/connector_internal.h"
#include "core/hmap.h"

_Static_assert(offsetof(kvo__map_entry, key) == 0 && offsetof(kvo__map_entry, key_hi) == 8 &&
                   offsetof(kvo__map_entry, used) == KVO__HMAP_USED_OFF,
               "kvo__map_entry must start like a kvo__hmap entry");

static kvo__hmap kvo__map_view(const kvo__map *m) {
    return (kvo__hmap){(unsigned char *)m->e, sizeof(kvo__map_entry), m->cap, m->n};
}

static void kvo__map_store(kvo__map *m, const kvo__hmap *h) {
    m->e = (kvo__map_entry *)h->e;
    m->cap = h->cap;
    m->n = h->n;
}

int kvo__map_init(kvo__map *m, size_t cap_hint) {
    kvo__hmap h;
    int rc = kvo__hmap_init(&h, sizeof(kvo__map_entry), cap_hint ? cap_hint : 1, "connector table");
    kvo__map_store(m, &h);
    return rc;
}

void kvo__map_free(kvo__map *m) {
    kvo__hmap h = kvo__map_view(m);
    kvo__hmap_free(&h);
    kvo__map_store(m, &h);
}

kvo__map_entry *kvo__map_get(const kvo__map *m, uint64_t key) {
    kvo__hmap h = kvo__map_view(m);
    return kvo__hmap_find(&h, key, 0);
}

/* Room for extra + 1 inserts, as the connector has always reserved. */
int kvo__map_reserve(kvo__map *m, size_t extra) {
    kvo__hmap h = kvo__map_view(m);
    int rc = kvo__hmap_reserve(&h, extra + 1, 16, "connector table");
    kvo__map_store(m, &h);
    return rc;
}

int kvo__map_put(kvo__map *m, uint64_t key, kvo__map_entry **out) {
    kvo__map_entry *e = kvo__map_get(m, key);
    if (e) {
        *out = e;
        return 1;
    }
    kvo__hmap h = kvo__map_view(m);
    int rc = kvo__hmap_reserve(&h, 1, 16, "connector table");
    kvo__map_store(m, &h);
    if (rc) return rc;
    bool existed;
    *out = kvo__hmap_insert(&h, key, 0, &existed);
    kvo__map_store(m, &h);
    return 0;
}

void kvo__map_del(kvo__map *m, kvo__map_entry *e) {
    kvo__hmap h = kvo__map_view(m);
    kvo__hmap_erase(&h, e);
    kvo__map_store(m, &h);
}
