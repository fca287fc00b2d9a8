/* Each eviction policy's own behaviour. */
#include <math.h>

#include "store_test_util.h"

static kvo_store *mk(kvo_plan **p, kvo_policy_kind pol, uint64_t chunks) {
    static const uint64_t pg[] = {4096};
    *p = st_plan(1, pg);
    return st_store(*p, chunks * 4096, pol);
}

static bool ready(kvo_store *s, uint64_t i) { return st_state(s, st_key(0, i)) == KVO_READY; }
static size_t put1(kvo_store *s, uint64_t i) { kvo_chunk_key k = st_key(0, i); return st_put(s, &k, 1); }
static void touch1(kvo_store *s, uint64_t i) { kvo_chunk_key k = st_key(0, i); ASSERT_OK(kvo_store_touch(s, &k, 1)); }

KVO_TEST(lru_order) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_LRU, 4);
    for (uint64_t i = 0; i < 4; i++) put1(s, i);
    touch1(s, 1);
    touch1(s, 0); /* recency now (old -> new): 2 3 1 0 */
    kvo_chunk_key k[2] = {st_key(0, 10), st_key(0, 11)};
    kvo_chunk_key ev[4];
    kvo_slot evs[4];
    uint8_t need[2];
    kvo_slot sl[2];
    size_t nev;
    ASSERT_OK(kvo_store_prepare_store(s, k, 2, need, sl, ev, evs, 4, &nev));
    ASSERT_EQ_U64(nev, 2);
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[0], &(kvo_chunk_key){st_key(0, 2).hash, 0, 0}));
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[1], &(kvo_chunk_key){st_key(0, 3).hash, 0, 0}));
    ASSERT_OK(kvo_store_complete_store(s, k, 2, true));
    /* a load counts as a use: 1 was older than 0, but after loading 1, 0 goes first */
    kvo_chunk_key k1 = st_key(0, 1);
    kvo_slot ld;
    ASSERT_OK(kvo_store_prepare_load(s, &k1, 1, &ld));
    ASSERT_OK(kvo_store_complete_load(s, &k1, 1));
    put1(s, 12);
    ASSERT_FALSE(ready(s, 0));
    ASSERT_TRUE(ready(s, 1));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* Hot keys (used twice) survive a long scan of one-off keys under ARC and
 * S3-FIFO; under LRU they do not. */
static int scan_survivors(kvo_policy_kind pol) {
    kvo_plan *p;
    kvo_store *s = mk(&p, pol, 16);
    for (uint64_t i = 0; i < 4; i++) put1(s, i);
    for (uint64_t i = 0; i < 4; i++) touch1(s, i);
    for (uint64_t i = 100; i < 300; i++) put1(s, i);
    int n = 0;
    for (uint64_t i = 0; i < 4; i++) n += ready(s, i);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return n;
}

KVO_TEST(scan_resistance) {
    ASSERT_EQ_INT(scan_survivors(KVO_POLICY_LRU), 0);
    ASSERT_EQ_INT(scan_survivors(KVO_POLICY_ARC), 4);
    ASSERT_EQ_INT(scan_survivors(KVO_POLICY_S3FIFO), 4);
}

/* The policies' names: "branch" is an alias of prefix (the enum value too);
 * "ensemble" was removed, and its name and enum value are refused with a
 * message that names prefix. */
KVO_TEST(policy_names_aliases_and_removed_ones) {
    static const char *const names[] = {"lru", "arc", "s3fifo", "prefix"};
    for (int i = 0; i < 4; i++) {
        kvo_policy_kind k;
        ASSERT_OK(kvo_policy_parse(names[i], &k));
        ASSERT_EQ_STR(kvo_policy_name(k), names[i]);
    }
    kvo_policy_kind k = KVO_POLICY_LRU;
    ASSERT_OK(kvo_policy_parse("branch", &k));
    ASSERT_EQ_INT(k, KVO_POLICY_PREFIX);
    ASSERT_EQ_STR(kvo_policy_name(KVO_POLICY_BRANCH), "prefix");
    ASSERT_EQ_INT(kvo_policy_parse("ensemble", &k), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "prefix");
    ASSERT_EQ_INT(kvo_policy_parse("fifo", &k), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "prefix");
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 64 * 4096;
    sp.policy = KVO_POLICY_ENSEMBLE;
    kvo_store *s = NULL;
    ASSERT_EQ_INT(kvo_store_create(&sp, &s), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "PREFIX");
    ASSERT_TRUE(s == NULL);
    sp.policy = KVO_POLICY_BRANCH; /* the prefix policy: its lists */
    ASSERT_OK(kvo_store_create(&sp, &s));
    for (uint64_t i = 0; i < 100; i++) put1(s, i);
    ASSERT_GT_U64(kvo__store_list_len(s, "g"), 0);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(arc_ghosts_bounded_and_p_adapts) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_ARC, 8);
    uint64_t c = 8;
    /* a stream of unique keys: T1 cycles, B1 fills up to its bound */
    for (uint64_t i = 0; i < 100; i++) {
        put1(s, i);
        uint64_t t1 = kvo__store_list_len(s, "t1"), t2 = kvo__store_list_len(s, "t2");
        uint64_t b1 = kvo__store_list_len(s, "b1"), b2 = kvo__store_list_len(s, "b2");
        ASSERT_LE_U64(t1 + b1, c);
        ASSERT_LE_U64(b1 + b2, c);
        ASSERT_LE_U64(t1 + t2, c);
    }
    ASSERT_EQ_U64(kvo__store_list_len(s, "t1"), 8);
    ASSERT_EQ_U64(kvo__store_list_len(s, "b1"), 0); /* |T1| + |B1| <= c */
    ASSERT_EQ_U64(kvo__arc_p(s), 0);
    /* make room in T1 by moving keys to T2 (touch), then evict into B1 */
    for (uint64_t i = 92; i < 96; i++) touch1(s, i);   /* T2: 92..95 */
    for (uint64_t i = 200; i < 204; i++) put1(s, i);   /* evicts 96..99 from T1 into B1 */
    ASSERT_EQ_U64(kvo__store_list_len(s, "b1"), 4);
    ASSERT_FALSE(ready(s, 96));
    /* storing a B1 ghost again: p grows, the key goes to T2 */
    put1(s, 96);
    ASSERT_GT_U64(kvo__arc_p(s), 0);
    ASSERT_EQ_U64(kvo__store_list_len(s, "t2"), 5);
    uint64_t p1 = kvo__arc_p(s);
    /* move every resident key to T2 (touch): T1 is empty, so the next victim
     * comes from T2 and its key goes to B2 */
    kvo_store_entry all[16];
    size_t n;
    uint64_t cur = 0;
    ASSERT_OK(kvo_store_scan(s, &cur, all, 16, &n));
    for (size_t i = 0; i < n; i++) ASSERT_OK(kvo_store_touch(s, &all[i].key, 1));
    ASSERT_EQ_U64(kvo__store_list_len(s, "t1"), 0);
    kvo_chunk_key nk = st_key(0, 400), ev[2];
    kvo_slot evs[2], sl;
    uint8_t need;
    size_t nev;
    ASSERT_OK(kvo_store_prepare_store(s, &nk, 1, &need, &sl, ev, evs, 2, &nev));
    ASSERT_OK(kvo_store_complete_store(s, &nk, 1, true));
    ASSERT_EQ_U64(nev, 1);
    ASSERT_EQ_U64(kvo__store_list_len(s, "b2"), 1);
    /* storing the B2 ghost again: p shrinks, the key goes to T2 */
    ASSERT_OK(kvo_store_prepare_store(s, &ev[0], 1, &need, &sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 1);
    ASSERT_OK(kvo_store_complete_store(s, &ev[0], 1, true));
    ASSERT_LT_U64(kvo__arc_p(s), p1);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(s3fifo_small_main_ghost) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_S3FIFO, 10);
    for (uint64_t i = 0; i < 10; i++) put1(s, i);
    ASSERT_EQ_U64(kvo__store_list_len(s, "s"), 10); /* new keys enter S */
    ASSERT_EQ_U64(kvo__store_list_len(s, "m"), 0);
    touch1(s, 0); /* used while in S */
    put1(s, 10);  /* S's oldest (0) was used: moved to M; 1 is evicted into G */
    ASSERT_TRUE(ready(s, 0));
    ASSERT_FALSE(ready(s, 1));
    ASSERT_EQ_U64(kvo__store_list_len(s, "m"), 1);
    ASSERT_EQ_U64(kvo__store_list_len(s, "g"), 1);
    /* a G ghost stored again enters M directly */
    put1(s, 1);
    ASSERT_TRUE(ready(s, 1));
    ASSERT_EQ_U64(kvo__store_list_len(s, "m"), 2);
    /* G stays bounded under a long stream */
    for (uint64_t i = 1000; i < 1200; i++) {
        put1(s, i);
        ASSERT_LE_U64(kvo__store_list_len(s, "g"), 10);
    }
    /* M entries without further use eventually leave (no ghost from M) */
    ASSERT_EQ_U64(kvo__store_list_len(s, "g"), 10);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(s3fifo_main_second_chance) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_S3FIFO, 40);
    for (uint64_t i = 0; i < 40; i++) put1(s, i);
    for (uint64_t i = 0; i < 40; i++) touch1(s, i);
    /* all 40 were used while in S: they move to M until S is under 10 % of
     * the entries (37 moved, 3 left), then M's oldest (0) is the victim */
    put1(s, 40);
    ASSERT_EQ_U64(kvo__store_list_len(s, "m"), 36);
    ASSERT_EQ_U64(kvo__store_list_len(s, "s"), 4);
    ASSERT_FALSE(ready(s, 0));
    /* S is under 10 %: victims come from M, FIFO with a second chance */
    touch1(s, 2);
    put1(s, 41);
    put1(s, 42);
    ASSERT_FALSE(ready(s, 1));
    ASSERT_TRUE(ready(s, 2)); /* used in M: reinserted instead of evicted */
    ASSERT_FALSE(ready(s, 3));
    ASSERT_EQ_U64(kvo__store_list_len(s, "g"), 0); /* no ghosts from M */
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(pinned_keys_leave_the_queues) {
    static const kvo_policy_kind pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    for (int pi = 0; pi < 4; pi++) {
        kvo_plan *p;
        kvo_store *s = mk(&p, pols[pi], 4);
        for (uint64_t i = 0; i < 4; i++) put1(s, i);
        kvo_chunk_key k0 = st_key(0, 0);
        kvo_slot ld;
        ASSERT_OK(kvo_store_prepare_load(s, &k0, 1, &ld));
        for (uint64_t i = 10; i < 40; i++) put1(s, i);
        ASSERT_TRUE(ready(s, 0));
        ASSERT_OK(kvo_store_complete_load(s, &k0, 1));
        st_check(s);
        kvo_store_destroy(s);
        kvo_plan_destroy(p);
    }
}

/* prefix: starts as LRU; on hot keys among scans of one-off keys its
 * simulations find that protecting reused keys hits more, and the hot keys
 * then survive the scans (under LRU they never do); the ghost history is
 * bounded by 4 x the store's size. */
KVO_TEST(prefix_learns_protection_under_scans) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_PREFIX, 64);
    ASSERT_EQ_STR(kvo_policy_name(KVO_POLICY_PREFIX), "prefix");
    kvo_policy_kind pk;
    ASSERT_OK(kvo_policy_parse("prefix", &pk));
    ASSERT_EQ_INT(pk, KVO_POLICY_PREFIX);
    ASSERT_EQ_U64(kvo__prefix_knob(s), 0); /* LRU until shown otherwise */
    uint64_t next = 1000;
    int survived = 0;
    for (int round = 0; round < 40; round++) {
        int n = 0;
        for (uint64_t i = 0; i < 16; i++) n += ready(s, i);
        if (round >= 30) survived += n;
        for (uint64_t i = 0; i < 16; i++) put1(s, i); /* a use, or stored again */
        for (int j = 0; j < 80; j++) put1(s, next++);
        ASSERT_LE_U64(kvo__store_list_len(s, "g"), 4 * 64);
    }
    ASSERT_TRUE(kvo__prefix_knob(s) > 0);
    ASSERT_EQ_INT(survived, 10 * 16);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* Each key is used twice, 24 new keys apart, in a 64-chunk store: LRU hits
 * every second use, while protecting reused (now dead) keys would starve the
 * new ones.  prefix must stay with recency and hit as often as LRU. */
static int sliding_reuse_hits(kvo_policy_kind pol, uint32_t *knob) {
    kvo_plan *p;
    kvo_store *s = mk(&p, pol, 64);
    int hits = 0;
    for (uint64_t i = 0; i < 4000; i++) {
        put1(s, i);
        if (i >= 24) {
            hits += ready(s, i - 24);
            put1(s, i - 24);
        }
    }
    *knob = kvo__prefix_knob(s);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return hits;
}

KVO_TEST(prefix_keeps_recency_when_it_wins) {
    uint32_t knob;
    int lru = sliding_reuse_hits(KVO_POLICY_LRU, &knob);
    int pre = sliding_reuse_hits(KVO_POLICY_PREFIX, &knob);
    if (getenv("KVO_TEST_VERBOSE")) printf("lru %d prefix %d knob %u\n", lru, pre, knob);
    ASSERT_TRUE(lru > 3900);
    ASSERT_TRUE(pre >= lru - 40); /* within 1 % */
    ASSERT_TRUE(knob != UINT32_MAX);
}

/* One slot size: prepare_store's victims are exactly the LRU tail, in LRU
 * order, exactly as many as the batch's new keys lack room for, also for a
 * batch larger than the eviction walk's budget (32 segments) and with a
 * small segment (several slots each, so that victims empty whole segments
 * and leave others partly used).  store_prepare.c, kvo__ps_plan_one. */
KVO_TEST(one_slot_size_victims_are_the_lru_tail) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 2048 * 4096;
    sp.segment_bytes = 4 * 4096; /* 4 slots per segment: the walk budget is 128 slots */
    sp.policy = KVO_POLICY_LRU;
    kvo_store *s;
    ASSERT_OK(kvo_store_create(&sp, &s));
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    uint64_t fit = (ss.capacity_bytes - ss.bytes_reserved) / 4096;
    ASSERT_TRUE(fit > 600);
    /* fill to fit - 7 (7 free slots), in 16-key batches: LRU order = key order */
    uint64_t next = 0, oldest = 0;
    kvo_chunk_key b[512], ev[600];
    kvo_slot sl[512], evs[600];
    uint8_t need[512];
    while (next < fit - 7) {
        size_t n = 0;
        while (n < 16 && next < fit - 7) b[n++] = st_key(0, next++);
        st_put(s, b, n);
    }
    /* LRU order other than slot order: every key touched in a shuffled
     * order, so that a segment holds keys far apart in LRU order (a segment
     * reclaim would evict out of LRU order) */
    uint64_t nres = next, *order = malloc(nres * sizeof *order);
    ASSERT_TRUE(order != NULL);
    for (uint64_t i = 0; i < nres; i++) order[i] = i;
    for (uint64_t i = nres - 1; i > 0; i--) {
        uint64_t j = kvo_test_rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (uint64_t i = 0; i < nres; i++) {
        kvo_chunk_key k = st_key(0, order[i]);
        ASSERT_OK(kvo_store_touch(s, &k, 1));
    }
    static const size_t batches[] = {3, 20, 300, 1, 512}; /* 300, 512: over the walk budget */
    uint64_t free_slots = 7;
    for (size_t r = 0; r < sizeof batches / sizeof batches[0]; r++) {
        size_t n = batches[r], nev = 0;
        for (size_t i = 0; i < n; i++) b[i] = st_key(0, next + i);
        ASSERT_OK(kvo_store_prepare_store(s, b, n, need, sl, ev, evs, 600, &nev));
        uint64_t want = n > free_slots ? n - free_slots : 0;
        ASSERT_EQ_U64(nev, want);
        for (size_t v = 0; v < nev; v++) {
            /* the shuffled residents first, then the batches in order */
            uint64_t want_id = oldest + v < nres ? order[oldest + v] : oldest + v;
            kvo_chunk_key k = st_key(0, want_id);
            if (!kvo_chunk_key_eq(&ev[v], &k)) FAILF("batch %zu: victim %zu is not the LRU tail's key %llu", r, v,
                                                     (unsigned long long)want_id);
        }
        oldest += nev;
        free_slots -= n - nev;
        ASSERT_OK(kvo_store_complete_store(s, b, n, true));
        next += n;
        st_check(s);
    }
    free(order);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* The prefix policy takes a batch's uses deepest key first, so a request's
 * root is its newest chunk and eviction eats a chain from its leaf end: what
 * is left is a prefix that still hits.  For each way a batch is used (stored,
 * touched, loaded, stored again while present) a chain of 8 whose keys were
 * first stored one by one, root first (the root the oldest), loses its
 * deepest key first, and every shorter prefix stays.  In the batch's order
 * the root would go first and take every descendant's hits with it. */
static void chain_use(kvo_store *s, const kvo_chunk_key *c, size_t n, int how) {
    kvo_slot sl[8];
    if (how == 0) st_put(s, c, n);
    if (how == 1) ASSERT_OK(kvo_store_touch(s, c, n));
    if (how == 2) {
        ASSERT_OK(kvo_store_prepare_load(s, c, n, sl));
        ASSERT_OK(kvo_store_complete_load(s, c, n));
    }
    if (how == 3) ASSERT_EQ_U64(st_put(s, c, n), 0);
}

KVO_TEST(prefix_evicts_a_chain_from_its_leaf_end) {
    for (int how = 0; how < 4; how++) {
        kvo_plan *p;
        kvo_store *s = mk(&p, KVO_POLICY_PREFIX, 64);
        kvo_chunk_key c[8];
        for (uint64_t i = 0; i < 8; i++) c[i] = st_key(0, i);
        if (how % 4) /* present already, the root the oldest */
            for (uint64_t i = 0; i < 8; i++) put1(s, i);
        chain_use(s, c, 8, how % 4);
        /* one-off keys until the chain loses a key */
        uint64_t next = 1000;
        for (int k = 0; k < 8; k++) {
            while (ready(s, 7 - (uint64_t)k)) {
                for (int j = 0; j < 7 - k; j++)
                    if (!ready(s, (uint64_t)j)) FAILF("use %d: key %d went before key %d", how % 4, j, 7 - k);
                put1(s, next++);
                if (next > 100000) FAILF("use %d: the chain is never evicted", how % 4);
            }
        }
        kvo_store_destroy(s);
        kvo_plan_destroy(p);
    }
}

/* The order LRU evicts in after `ops`: every key stored, then store n new
 * keys one at a time and record which old key each evicts. */
static void lru_eviction_order(kvo_store *s, uint64_t first_new, size_t n, uint64_t *order) {
    for (size_t i = 0; i < n; i++) {
        kvo_chunk_key k = st_key(0, first_new + i), ev[2];
        uint8_t need;
        kvo_slot sl, evs[2];
        size_t nev = 0;
        ASSERT_OK(kvo_store_prepare_store(s, &k, 1, &need, &sl, ev, evs, 2, &nev));
        ASSERT_EQ_U64(nev, 1);
        order[i] = ev[0].hash.hi; /* st_key's index */
        ASSERT_OK(kvo_store_complete_store(s, &k, 1, true));
    }
}

/* vLLM's load cycle (prepare_load, complete_load, touch of the same keys):
 * the touch finds the keys leading the LRU list as a touch leaves them and
 * changes nothing (store.c, kvo__lru_leads); the list must then be the one
 * touching each key on its own gives, and a touch in another order must
 * still reorder. */
KVO_TEST(lru_touch_after_load_leaves_the_touch_order) {
    uint64_t order[3][8];
    for (int v = 0; v < 3; v++) {
        kvo_plan *p;
        kvo_store *s = mk(&p, KVO_POLICY_LRU, 8);
        for (uint64_t i = 0; i < 8; i++) put1(s, i);
        kvo_chunk_key k[3] = {st_key(0, 2), st_key(0, 5), st_key(0, 3)};
        kvo_slot sl[3];
        ASSERT_OK(kvo_store_prepare_load(s, k, 3, sl));
        ASSERT_OK(kvo_store_complete_load(s, k, 3));
        if (v == 0) {
            ASSERT_OK(kvo_store_touch(s, k, 3)); /* in place */
        } else if (v == 1) {
            for (int i = 0; i < 3; i++) ASSERT_OK(kvo_store_touch(s, &k[i], 1));
        } else {
            /* not as they lead: reordered (looked up first, so that the
             * touch resolves them from the memo and takes the check) */
            kvo_chunk_key r[3] = {k[2], k[1], k[0]};
            uint8_t st[3];
            ASSERT_OK(kvo_store_lookup(s, r, 3, st));
            ASSERT_OK(kvo_store_touch(s, r, 3));
        }
        lru_eviction_order(s, 100, 8, order[v]);
        st_check(s);
        kvo_store_destroy(s);
        kvo_plan_destroy(p);
    }
    static const uint64_t want[8] = {0, 1, 4, 6, 7, 2, 5, 3}, want_rev[8] = {0, 1, 4, 6, 7, 3, 5, 2};
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ_U64(order[0][i], want[i]);
        ASSERT_EQ_U64(order[1][i], want[i]);
        ASSERT_EQ_U64(order[2][i], want_rev[i]);
    }
}

/* A store of one slot size hands victim i's slot to new key i (under LRU the
 * victim's whole entry, store_prepare.c KVO__HO_ENTRY; under the ghost-keeping
 * policies the slot alone): each new key's slot is the one evicted[i]
 * reports, victims miss, the new keys are READY, and the invariants hold
 * (each slot's record names its entry) over many such batches. */
KVO_TEST(one_slot_size_new_keys_take_the_victims_slots) {
    static const kvo_policy_kind pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        kvo_plan *p;
        kvo_store *s = mk(&p, pols[pi], 16);
        for (uint64_t i = 0; i < 16; i++) put1(s, i);
        uint64_t next = 16;
        for (int round = 0; round < 40; round++) {
            size_t n = 1 + (size_t)round % 7, nev = 0;
            kvo_chunk_key k[8], ev[8];
            kvo_slot sl[8], evs[8];
            uint8_t need[8];
            for (size_t i = 0; i < n; i++) k[i] = st_key(0, next++);
            ASSERT_OK(kvo_store_prepare_store(s, k, n, need, sl, ev, evs, 8, &nev));
            ASSERT_EQ_U64(nev, n);
            for (size_t i = 0; i < n; i++) {
                ASSERT_TRUE(need[i]);
                ASSERT_EQ_U64(sl[i].offset, evs[i].offset);
                ASSERT_EQ_U64(st_state(s, ev[i]), KVO_MISS);
                ASSERT_EQ_U64(st_state(s, k[i]), KVO_PENDING);
            }
            st_check(s);
            ASSERT_OK(kvo_store_complete_store(s, k, n, round % 5 != 4)); /* some stores fail */
            for (size_t i = 0; i < n; i++) ASSERT_EQ_U64(st_state(s, k[i]), round % 5 != 4 ? KVO_READY : KVO_MISS);
            st_check(s);
            if (round % 5 == 4) /* refill what the failed store left empty */
                for (size_t i = 0; i < n; i++) put1(s, next++);
        }
        kvo_store_destroy(s);
        kvo_plan_destroy(p);
    }
}
