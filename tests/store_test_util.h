/* Helpers shared by the store tests (synthetic plans, keys, invariant checks). */
#ifndef KVO_STORE_TEST_UTIL_H
#define KVO_STORE_TEST_UTIL_H

#include <stdlib.h>

#include "kvo_test.h"
#include "store/store_internal.h"

/* A plan with n groups, group i's chunk = pages[i] bytes (1 layer, 1 block of
 * 16 tokens, tokens_per_hash 16); pages[i] == 0 -> a non-cacheable group. */
static inline kvo_plan *st_plan(size_t n, const uint64_t *pages) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    if (kvo_model_create("store-test", 16, &m)) FAILF("model: %s", kvo_last_error());
    for (size_t i = 0; i < n; i++) {
        kvo_group_desc g = kvo_group_desc_default();
        snprintf(g.name, sizeof g.name, "g%zu", i);
        g.tokens_per_block = 16;
        g.layers = 1;
        g.page_bytes = pages[i] ? pages[i] : 4096;
        g.cacheable = pages[i] != 0;
        if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    if (kvo_plan_create(m, &pp, &p)) FAILF("plan: %s", kvo_last_error());
    kvo_model_destroy(m);
    return p;
}

static inline kvo_plan *st_preset_plan(const char *name, uint64_t block_size) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    if (kvo_model_preset(name, &m)) FAILF("preset: %s", kvo_last_error());
    kvo_plan_params pp = kvo_plan_default_params();
    pp.block_size = block_size;
    if (kvo_plan_create(m, &pp, &p)) FAILF("plan: %s", kvo_last_error());
    kvo_model_destroy(m);
    return p;
}

static inline kvo_chunk_key st_key(uint32_t g, uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    uint64_t h = (i + 1) * UINT64_C(0x9E3779B97F4A7C15);
    h ^= h >> 31;
    h *= UINT64_C(0xBF58476D1CE4E5B9);
    h ^= h >> 27;
    k.hash.lo = h;
    k.hash.hi = i;
    k.group = g;
    return k;
}

static inline kvo_store *st_store(const kvo_plan *p, uint64_t cap, kvo_policy_kind pol) {
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = cap;
    sp.policy = pol;
    sp.event_capacity = 1024;
    kvo_store *s = NULL;
    if (kvo_store_create(&sp, &s)) FAILF("store: %s", kvo_last_error());
    return s;
}

/* Store keys fully (prepare + complete ok); returns evictions. */
static inline size_t st_put(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    uint8_t need[256];
    kvo_slot slots[256];
    kvo_chunk_key ev[1024];
    kvo_slot evs[1024];
    size_t nev = 0;
    if (n > 256) FAILF("st_put: batch too big");
    int rc = kvo_store_prepare_store(s, keys, n, need, slots, ev, evs, 1024, &nev);
    if (rc) FAILF("prepare_store: %s", kvo_last_error());
    kvo_chunk_key todo[256];
    size_t m = 0;
    for (size_t i = 0; i < n; i++) if (need[i]) todo[m++] = keys[i];
    if (m && kvo_store_complete_store(s, todo, m, true)) FAILF("complete_store: %s", kvo_last_error());
    return nev;
}

static inline uint8_t st_state(kvo_store *s, kvo_chunk_key k) {
    kvo_store_entry e;
    if (kvo_store_peek(s, &k, &e)) return KVO_MISS;
    return e.state;
}

static int st_cmp_off(const void *a, const void *b) {
    const kvo_store_entry *x = a, *y = b;
    return x->slot.offset < y->slot.offset ? -1 : x->slot.offset > y->slot.offset;
}

/* Internal invariants + no two slots overlap + all within capacity. */
static inline void st_check(kvo_store *s) {
    if (kvo__store_check(s)) FAILF("store check: %s", kvo_last_error());
    kvo_store_stats st = KVO_STORE_STATS_INIT;
    if (kvo_store_get_stats(s, &st)) FAILF("stats");
    size_t cap = (size_t)st.entries + 1, n = 0, got;
    kvo_store_entry *all = malloc(cap * sizeof *all);
    uint64_t cur = 0, bytes = 0;
    do {
        if (kvo_store_scan(s, &cur, all + n, cap - n, &got)) FAILF("scan: %s", kvo_last_error());
        n += got;
    } while (cur && n < cap);
    if (n != st.entries) FAILF("scan saw %zu entries, stats say %llu", n, (unsigned long long)st.entries);
    qsort(all, n, sizeof *all, st_cmp_off);
    for (size_t i = 0; i < n; i++) {
        bytes += all[i].slot.bytes;
        if (all[i].slot.offset + all[i].slot.bytes > st.capacity_bytes) FAILF("slot beyond capacity");
        if (all[i].slot.offset % KVO_SLOT_ALIGN) FAILF("slot offset not aligned");
        if (i && all[i - 1].slot.offset + all[i - 1].slot.bytes > all[i].slot.offset)
            FAILF("slots overlap: %llu+%llu > %llu", (unsigned long long)all[i - 1].slot.offset,
                  (unsigned long long)all[i - 1].slot.bytes, (unsigned long long)all[i].slot.offset);
    }
    if (bytes != st.bytes_used || bytes > st.capacity_bytes) FAILF("bytes %llu vs %llu", (unsigned long long)bytes,
                                                                  (unsigned long long)st.bytes_used);
    free(all);
}

#endif
