/* Internal declarations of the connector layer (also used by its tests). */
#ifndef KVO_CONNECTOR_INTERNAL_H
#define KVO_CONNECTOR_INTERNAL_H

#include "core/internal.h"

/* The default min_hit_tokens: the largest tokens_per_chunk of an offloaded
 * group (0 when none is offloaded). */
uint64_t kvo__agree_min_hit_default(const kvo_plan *plan);

/* ---- map.c: uint64 -> (pointer, two uint64) table over core/hmap.c ---- */
typedef struct kvo__map_entry {
    uint64_t key, key_hi; /* kvo__hmap's two-word key (key_hi always 0) */
    uint32_t used;
    uint64_t a, b;
    void *p;
} kvo__map_entry;

typedef struct kvo__map {
    kvo__map_entry *e;
    size_t cap, n;
} kvo__map;

int kvo__map_init(kvo__map *m, size_t cap_hint);
void kvo__map_free(kvo__map *m);
/* Entry of key or NULL.  Entry pointers die at the next put or del. */
kvo__map_entry *kvo__map_get(const kvo__map *m, uint64_t key);
/* Insert key (values zeroed) or find it: 0 inserted, 1 existed, <0 error. */
int kvo__map_put(kvo__map *m, uint64_t key, kvo__map_entry **out);
void kvo__map_del(kvo__map *m, kvo__map_entry *e);
/* Grow so that `extra` more inserts cannot fail (nor grow). */
int kvo__map_reserve(kvo__map *m, size_t extra);

/* ---- test hooks (connector.c) ---- */
/* The next n load jobs of c complete as failed (KVO_EIO) whatever the copy
 * did; the next n store jobs likewise when stores is true. */
void kvo__connector_inject_failures(kvo_connector *c, uint32_t loads, uint32_t stores);

#endif
