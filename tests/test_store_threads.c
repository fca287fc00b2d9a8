/* The store under concurrent callers (also run under ThreadSanitizer): several
 * threads store, load, touch and remove overlapping key sets; afterwards the
 * store's invariants hold and every slot is owned once. */
#include <pthread.h>

#include "store_test_util.h"

#define NT 4
#define NKEYS 400

typedef struct targ {
    kvo_store *s;
    int id;
    uint64_t seed;
    uint64_t stored, loaded;
} targ;

static uint64_t xr(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void *worker(void *arg) {
    targ *t = arg;
    kvo_chunk_key keys[16], todo[16];
    uint8_t need[16], st[16];
    kvo_slot sl[16];
    for (int it = 0; it < 3000; it++) {
        size_t n = 1 + xr(&t->seed) % 8;
        /* distinct keys: consecutive ids from a random start */
        uint64_t base = xr(&t->seed) % NKEYS;
        for (size_t i = 0; i < n; i++) keys[i] = st_key((uint32_t)((base + i) % 2), (base + i) % NKEYS);
        int op = (int)(xr(&t->seed) % 10);
        if (op < 4) {
            if (kvo_store_prepare_store(t->s, keys, n, need, sl, NULL, NULL, 0, NULL) == 0) {
                size_t m = 0;
                for (size_t i = 0; i < n; i++) if (need[i]) todo[m++] = keys[i];
                if (m) {
                    int rc = kvo_store_complete_store(t->s, todo, m, xr(&t->seed) % 8 != 0);
                    if (rc) { fprintf(stderr, "complete_store: %s\n", kvo_last_error()); abort(); }
                    t->stored += m;
                }
            }
        } else if (op < 7) {
            if (kvo_store_lookup(t->s, keys, n, st)) abort();
            size_t m = 0;
            for (size_t i = 0; i < n; i++) if (st[i] == KVO_READY) todo[m++] = keys[i];
            if (m) {
                int rc = kvo_store_prepare_load(t->s, todo, m, sl);
                if (rc == 0) {
                    t->loaded += m;
                    if (kvo_store_complete_load(t->s, todo, m)) abort();
                } else if (rc != KVO_ENOTFOUND && rc != KVO_EAGAIN) {
                    abort();
                }
            }
        } else if (op < 9) {
            if (kvo_store_touch(t->s, keys, n)) abort();
        } else {
            int rc = kvo_store_remove(t->s, keys, n);
            if (rc && rc != KVO_EBUSY) abort();
        }
        if (it % 500 == 0) {
            kvo_store_stats ss = KVO_STORE_STATS_INIT;
            if (kvo_store_get_stats(t->s, &ss)) abort();
            kvo_store_event ev[64];
            kvo_store_drain_events(t->s, ev, 64, NULL);
        }
    }
    return NULL;
}

KVO_TEST(concurrent_batches) {
    static const uint64_t pg[] = {4096, 8192};
    static const kvo_policy_kind pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    for (int pi = 0; pi < (int)(sizeof pols / sizeof pols[0]); pi++) {
        kvo_plan *p = st_plan(2, pg);
        kvo_store *s = st_store(p, 120 * 4096, pols[pi]);
        pthread_t th[NT];
        targ a[NT];
        for (int i = 0; i < NT; i++) {
            a[i] = (targ){s, i, kvo_test_seed() + (uint64_t)i * 7919 + (uint64_t)pi, 0, 0};
            ASSERT_EQ_INT(pthread_create(&th[i], NULL, worker, &a[i]), 0);
        }
        uint64_t stored = 0;
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            stored += a[i].stored;
        }
        ASSERT_GT_U64(stored, 100);
        kvo_store_stats ss = KVO_STORE_STATS_INIT;
        ASSERT_OK(kvo_store_get_stats(s, &ss));
        ASSERT_EQ_U64(ss.pinned, 0);
        ASSERT_EQ_U64(ss.pending, 0);
        ASSERT_GT_U64(ss.evictions, 0);
        st_check(s);
        kvo_store_destroy(s);
        kvo_plan_destroy(p);
    }
}
