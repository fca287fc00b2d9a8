/* Randomized model-based test: long random operation sequences against a
 * simple reference model (key -> state, pins, slot).  After every operation:
 * the store's internal invariants, no two slots overlap, bytes within
 * capacity, every key's state and pins equal the model's, pinned and pending
 * keys are never evicted, and evictions only name READY unpinned keys outside
 * the batch. */
#include "store_test_util.h"

#define NK 240
#define NG 4
static const uint64_t PAGES_MIXED[NG] = {4096, 8192, 3 * 4096, 10 * 4096};
/* every group of one slot size: one slot class, where prepare_store hands
 * victims' slots (under LRU their entries) to new keys and only the class's
 * busy count is kept (store_prepare.c, slots.c) */
static const uint64_t PAGES_ONE[NG] = {4096, 4096, 4096, 4096};
static const uint64_t *PAGES = PAGES_MIXED;

typedef struct mkey {
    kvo_chunk_key key;
    uint8_t state; /* KVO_MISS / KVO_PENDING / KVO_READY */
    uint32_t pins;
    kvo_slot slot;
} mkey;

static mkey M[NK];

static size_t find(const kvo_chunk_key *k) {
    for (size_t i = 0; i < NK; i++) if (kvo_chunk_key_eq(&M[i].key, k)) return i;
    FAILF("unknown key");
}

static size_t pick(size_t *out, size_t max, int want_state, bool distinct) {
    static size_t cand[NK];
    size_t nc = 0;
    for (size_t i = 0; i < NK; i++) if (want_state < 0 || M[i].state == want_state) cand[nc++] = i;
    if (!nc) return 0;
    size_t n = 1 + (size_t)(kvo_test_rand() % max), w = 0;
    for (; w < n; w++) {
        if (distinct) {
            if (nc == 0) break;
            size_t j = (size_t)(kvo_test_rand() % nc);
            out[w] = cand[j];
            cand[j] = cand[--nc];
        } else {
            out[w] = cand[kvo_test_rand() % nc];
        }
    }
    return w;
}

static void compare_all(kvo_store *s) {
    for (size_t i = 0; i < NK; i++) {
        kvo_store_entry e;
        int rc = kvo_store_peek(s, &M[i].key, &e);
        if (M[i].state == KVO_MISS) {
            if (rc != KVO_ENOTFOUND) FAILF("key %zu: model MISS, store has it (rc %d)", i, rc);
            continue;
        }
        if (rc) FAILF("key %zu: model state %d, store: %s", i, M[i].state, kvo_last_error());
        if (e.state != M[i].state || e.pins != M[i].pins || e.slot.offset != M[i].slot.offset ||
            e.slot.bytes != M[i].slot.bytes)
            FAILF("key %zu: state %d/%d pins %u/%u offset %llu/%llu", i, e.state, M[i].state, e.pins, M[i].pins,
                  (unsigned long long)e.slot.offset, (unsigned long long)M[i].slot.offset);
    }
}

/* kvo_store_params.policy_admission for the next runs; the runs count the
 * keys the policy turned away (need 0 while the model says MISS, matched
 * against store_not_admitted) */
static bool ADMISSION;
static uint64_t n_refused;

static uint64_t not_admitted(kvo_store *s) {
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    return ss.store_not_admitted;
}

static void run_model_x(kvo_policy_kind pol, uint64_t capacity, uint64_t seg_bytes, int steps, uint64_t min_evict,
                        size_t evcap, uint64_t max_entries) {
    kvo_plan *p = st_plan(NG, PAGES);
    kvo_store_params sp = kvo_store_default_params();
    sp.policy_admission = ADMISSION;
    sp.plan = p;
    sp.capacity_bytes = capacity;
    sp.policy = pol;
    sp.segment_bytes = seg_bytes;
    sp.max_entries = max_entries;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    for (size_t i = 0; i < NK; i++) {
        memset(&M[i], 0, sizeof M[i]);
        M[i].key = st_key((uint32_t)(i % NG), i);
    }
    size_t idx[32];
    kvo_chunk_key keys[32], ev[2048];
    kvo_slot slots[32], evs[2048];
    uint8_t need[32], st[32];
    uint64_t n_ok = 0, n_nospc = 0, n_evict = 0, n_range = 0;
    for (int step = 0; step < steps; step++) {
        int op = (int)(kvo_test_rand() % 100);
        size_t n;
        if (op < 15) { /* lookup */
            n = pick(idx, 16, -1, false);
            for (size_t i = 0; i < n; i++) keys[i] = M[idx[i]].key;
            ASSERT_OK(kvo_store_lookup(s, keys, n, st));
            for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(st[i], M[idx[i]].state);
        } else if (op < 45) { /* prepare_store */
            n = pick(idx, 8, -1, true);
            for (size_t i = 0; i < n; i++) keys[i] = M[idx[i]].key;
            size_t nev = 0;
            /* one class: feasible exactly when the busy keys (pending,
             * pinned, and the batch's present ones, which it protects) and
             * the new ones fit both the slots and the entry limit */
            uint64_t busy = 0, n_new = 0;
            for (size_t i = 0; i < NK; i++) busy += M[i].state == KVO_PENDING || M[i].pins;
            for (size_t i = 0; i < n; i++) {
                n_new += M[idx[i]].state == KVO_MISS;
                busy += M[idx[i]].state == KVO_READY && M[idx[i]].pins == 0;
            }
            uint64_t room = (uint64_t)s->sl.cls_k[0] * s->sl.nseg;
            if (s->max_entries < room) room = s->max_entries;
            bool feasible = n_new == 0 || busy + n_new <= room;
            uint64_t refused = not_admitted(s);
            int rc = kvo_store_prepare_store(s, keys, n, need, slots, ev, evs, evcap, &nev);
            refused = not_admitted(s) - refused;
            if (refused && (!ADMISSION || rc)) FAILF("%llu keys turned away (admission %d, rc %d)",
                                                     (unsigned long long)refused, ADMISSION, rc);
            n_refused += refused;
            /* keys turned away need no room: feasible with the others */
            if (!rc) feasible = n_new == refused || busy + n_new - refused <= room;
            if (s->sl.nclass == 1 && feasible != (rc != KVO_ENOSPC))
                FAILF("one class: %llu busy + %llu new of %llu: expected %s, got %d", (unsigned long long)busy,
                      (unsigned long long)n_new, (unsigned long long)room, feasible ? "room" : "ENOSPC", rc);
            if (rc == KVO_ENOSPC) {
                n_nospc++;
            } else if (rc == KVO_ERANGE) {
                /* too many evictions for the caller's buffer: nothing changed
                 * (compare_all below checks), the count says how many */
                if (nev <= evcap) FAILF("ERANGE with n_evicted %zu <= cap %zu", nev, evcap);
                n_range++;
            } else {
                ASSERT_OK(rc);
                n_ok++;
                n_evict += nev;
                for (size_t j = 0; j < nev; j++) {
                    size_t v = find(&ev[j]);
                    if (M[v].state != KVO_READY || M[v].pins) FAILF("evicted key %zu in state %d pins %u", v,
                                                                     M[v].state, M[v].pins);
                    for (size_t i = 0; i < n; i++) if (idx[i] == v) FAILF("evicted key %zu of the same batch", v);
                    ASSERT_EQ_U64(evs[j].offset, M[v].slot.offset);
                    M[v].state = KVO_MISS;
                }
                for (size_t i = 0; i < n; i++) {
                    mkey *m = &M[idx[i]];
                    if (!need[i] && m->state == KVO_MISS) refused--; /* turned away: stays a MISS */
                    else ASSERT_EQ_INT(need[i], m->state == KVO_MISS);
                    if (need[i]) {
                        m->state = KVO_PENDING;
                        m->slot = slots[i];
                        ASSERT_EQ_U64(slots[i].bytes, PAGES[m->key.group]);
                    }
                }
                if (refused) FAILF("store_not_admitted and the keys with need 0 that are MISSes differ by %lld",
                                   (long long)refused);
            }
        } else if (op < 65) { /* complete_store */
            n = pick(idx, 16, KVO_PENDING, true);
            if (!n) continue;
            bool ok = kvo_test_rand() % 5 != 0;
            for (size_t i = 0; i < n; i++) keys[i] = M[idx[i]].key;
            ASSERT_OK(kvo_store_complete_store(s, keys, n, ok));
            for (size_t i = 0; i < n; i++) M[idx[i]].state = ok ? KVO_READY : KVO_MISS;
        } else if (op < 75) { /* prepare_load, sometimes with a bad key */
            n = pick(idx, 8, KVO_READY, false);
            if (!n) continue;
            bool bad = kvo_test_rand() % 4 == 0;
            size_t bi = 0;
            for (size_t i = 0; i < n; i++) keys[i] = M[idx[i]].key;
            if (bad) {
                bi = (size_t)(kvo_test_rand() % NK);
                if (M[bi].state == KVO_READY) bad = false;
                else keys[n++] = M[bi].key;
            }
            int rc = kvo_store_prepare_load(s, keys, n, slots);
            if (bad) {
                ASSERT_EQ_INT(rc, M[bi].state == KVO_PENDING ? KVO_EAGAIN : KVO_ENOTFOUND);
            } else {
                ASSERT_OK(rc);
                for (size_t i = 0; i < n; i++) {
                    ASSERT_EQ_U64(slots[i].offset, M[idx[i]].slot.offset);
                    M[idx[i]].pins++;
                }
            }
        } else if (op < 87) { /* complete_load */
            n = 0;
            for (size_t t = 0; t < 8; t++) {
                size_t i = (size_t)(kvo_test_rand() % NK);
                if (M[i].pins == 0) continue;
                size_t dupc = 0;
                for (size_t j = 0; j < n; j++) dupc += idx[j] == i;
                if (dupc >= M[i].pins) continue;
                idx[n] = i;
                keys[n++] = M[i].key;
            }
            if (!n) continue;
            ASSERT_OK(kvo_store_complete_load(s, keys, n));
            for (size_t i = 0; i < n; i++) M[idx[i]].pins--;
        } else if (op < 93) { /* touch */
            n = pick(idx, 16, -1, false);
            for (size_t i = 0; i < n; i++) keys[i] = M[idx[i]].key;
            ASSERT_OK(kvo_store_touch(s, keys, n));
        } else if (op < 99) { /* remove */
            n = pick(idx, 4, -1, true);
            bool busy = false;
            for (size_t i = 0; i < n; i++) {
                keys[i] = M[idx[i]].key;
                busy |= M[idx[i]].state == KVO_PENDING || M[idx[i]].pins;
            }
            int rc = kvo_store_remove(s, keys, n);
            if (busy) {
                ASSERT_EQ_INT(rc, KVO_EBUSY);
            } else {
                ASSERT_OK(rc);
                for (size_t i = 0; i < n; i++) M[idx[i]].state = KVO_MISS;
            }
        } else { /* clear */
            size_t left = kvo_store_clear(s), busy = 0;
            for (size_t i = 0; i < NK; i++) {
                if (M[i].state == KVO_READY && M[i].pins == 0) M[i].state = KVO_MISS;
                busy += M[i].state != KVO_MISS;
            }
            ASSERT_EQ_U64(left, busy);
        }
        st_check(s);
        compare_all(s);
    }
    /* the run must have exercised eviction and both outcomes */
    ASSERT_GT_U64(n_ok, 0);
    ASSERT_GE_U64(n_evict, min_evict);
    ASSERT_GT_U64(n_nospc, 0);
    if (getenv("KVO_TEST_VERBOSE"))
        printf("ok %llu nospc %llu erange %llu evicted %llu reclaims %llu\n", (unsigned long long)n_ok,
               (unsigned long long)n_nospc, (unsigned long long)n_range, (unsigned long long)n_evict,
               (unsigned long long)kvo__store_reclaims(s));
    if (evcap < 8) ASSERT_GT_U64(n_range, 0);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

static void run_model(kvo_policy_kind pol, uint64_t capacity, uint64_t seg_bytes, int steps, uint64_t min_evict) {
    run_model_x(pol, capacity, seg_bytes, steps, min_evict, 2048, 0);
}

KVO_TEST(random_lru) { run_model(KVO_POLICY_LRU, 400 * 4096, 0, 4000, 200); }
KVO_TEST(random_arc) { run_model(KVO_POLICY_ARC, 400 * 4096, 0, 4000, 200); }
KVO_TEST(random_s3fifo) { run_model(KVO_POLICY_S3FIFO, 400 * 4096, 0, 4000, 200); }
KVO_TEST(random_prefix) { run_model(KVO_POLICY_PREFIX, 400 * 4096, 0, 4000, 200); }
KVO_TEST(random_prefix_small_evict_buffer_and_max_entries) {
    run_model_x(KVO_POLICY_PREFIX, 400 * 4096, 60 * 4096, 3000, 50, 3, 60);
}
/* few large segments: segments move between classes and reclaims run often */
KVO_TEST(random_lru_big_segments) { run_model(KVO_POLICY_LRU, 400 * 4096, 60 * 4096, 4000, 200); }
KVO_TEST(random_s3fifo_big_segments) { run_model(KVO_POLICY_S3FIFO, 400 * 4096, 60 * 4096, 4000, 200); }
/* a tiny store: mostly ENOSPC, all-or-nothing under pressure */
KVO_TEST(random_arc_tiny) { run_model(KVO_POLICY_ARC, 41 * 4096, 0, 3000, 0); }
/* small evicted[] buffers (ERANGE, nothing changed) and a bounded entry count */
KVO_TEST(random_arc_small_evict_buffer_and_max_entries) {
    run_model_x(KVO_POLICY_ARC, 400 * 4096, 0, 3000, 50, 3, 60);
}
KVO_TEST(random_s3fifo_max_entries) { run_model_x(KVO_POLICY_S3FIFO, 400 * 4096, 0, 3000, 50, 2048, 40); }
/* one slot class: LRU (victims' entries go to new keys), ARC (their slots),
 * a tiny store (ENOSPC exactly when the busy keys leave no room), small
 * evicted[] buffers with an entry limit */
KVO_TEST(random_one_class_lru) {
    PAGES = PAGES_ONE;
    run_model(KVO_POLICY_LRU, 100 * 4096, 0, 4000, 200);
    run_model(KVO_POLICY_LRU, 41 * 4096, 0, 3000, 0);
    run_model_x(KVO_POLICY_LRU, 100 * 4096, 16 * 4096, 3000, 50, 3, 60);
    PAGES = PAGES_MIXED;
}
KVO_TEST(random_one_class_arc_prefix) {
    PAGES = PAGES_ONE;
    run_model(KVO_POLICY_ARC, 100 * 4096, 0, 4000, 200);
    run_model(KVO_POLICY_PREFIX, 41 * 4096, 0, 3000, 0);
    PAGES = PAGES_MIXED;
}
/* policy admission is accepted and ignored by every policy (none turns a
 * key away): the runs store what they are given */
KVO_TEST(random_policy_admission_turns_nothing_away) {
    static const kvo_policy_kind pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    ADMISSION = true;
    n_refused = 0;
    for (int i = 0; i < 4; i++) run_model(pols[i], 400 * 4096, 0, 3000, 200);
    ADMISSION = false;
    ASSERT_EQ_U64(n_refused, 0);
}
