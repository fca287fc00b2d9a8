/* Each eviction policy's own behaviour. */
#include <math.h>

#include "store_test_util.h"

static kvo_store *mk(kvo_plan **p, kvo_policy_kind pol, uint64_t chunks) {
    static const uint64_t pg[] = {4096};
    *p = st_plan(1, pg);
    return st_store(*p, chunks * 4096, pol);
}

/* mk, with kvo_store_params.policy_admission and lookups_per_key */
static kvo_store *mk_with(kvo_plan **p, kvo_policy_kind pol, uint64_t chunks, bool admission, bool per_key) {
    static const uint64_t pg[] = {4096};
    *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = *p;
    sp.capacity_bytes = chunks * 4096;
    sp.policy = pol;
    sp.policy_admission = admission;
    sp.lookups_per_key = per_key;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    return s;
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
    /* no lookups, so no scores: every shadow votes alike, and only LRU's
     * shadow evicts the hot keys (one vote against six for the scan's) */
    ASSERT_EQ_INT(scan_survivors(KVO_POLICY_ENSEMBLE), 4);
    /* no lookups, so no branch points: the branch policy is LRU */
    ASSERT_EQ_INT(scan_survivors(KVO_POLICY_BRANCH), 0);
}

/* The branch policy (policy_branch.c): a request as a prefix cache sees it,
 * looked up then stored. */
static void request(kvo_store *s, const uint64_t *ids, size_t n) {
    kvo_chunk_key c[8];
    uint8_t st[8];
    for (size_t i = 0; i < n; i++) c[i] = st_key(0, ids[i]);
    ASSERT_OK(kvo_store_lookup(s, c, n, st));
    st_put(s, c, n);
}

/* nreq one-off requests of 5 chunks each, from key `first` on */
static void one_offs(kvo_store *s, uint64_t first, uint64_t nreq) {
    for (uint64_t r = 0; r < nreq; r++) {
        uint64_t one_off[5];
        for (uint64_t i = 0; i < 5; i++) one_off[i] = first + 5 * r + i;
        request(s, one_off, 5);
    }
}

/* How many of a 4-chunk prefix survive a flood of one-off requests (200
 * chunks through a 32-chunk store) after two requests shared it, going on
 * differently (branched: 2), the second the first again (a repeat: 1) or
 * the first and more (a conversation's next turn: 4), or one request used
 * it (0), or one request used it, was flushed out by 40 chunks, and a
 * second came back to it (3: its root a remembered ghost, a prefix coming
 * back; then all 6 chunks count). */
static int branch_prefix_survivors(kvo_policy_kind pol, int shape) {
    kvo_plan *p;
    kvo_store *s = mk(&p, pol, 32);
    const uint64_t a[8] = {1, 2, 3, 4, 10, 11, 12, 13}, b[6] = {1, 2, 3, 4, 20, 21};
    request(s, a, 6);
    if (shape == 3) {
        one_offs(s, 100000, 8);
        ASSERT_FALSE(ready(s, 1));
    }
    if (shape) request(s, shape == 2 ? b : a, shape == 4 ? 8 : 6);
    one_offs(s, 1000, 40);
    int n = 0;
    for (size_t i = 0; i < (shape == 3 ? 6u : 4u); i++) n += ready(s, a[i]);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return n;
}

KVO_TEST(branch_protects_the_prefix_requests_branch_from) {
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_BRANCH, 2), 4);
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_LRU, 2), 0);
    /* a request repeated whole (its lookup ends at a known leaf) */
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_BRANCH, 1), 4);
    /* a chain extended, or used once: recency alone, as LRU */
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_BRANCH, 4), 0);
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_BRANCH, 0), 0);
    /* a whole request coming back after its eviction: all 6 chunks kept */
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_BRANCH, 3), 6);
    ASSERT_EQ_INT(branch_prefix_survivors(KVO_POLICY_LRU, 3), 0);
}

/* The branch policy's ages (requests since an entry's last use) are 16-bit
 * differences of request epochs: a prefix left in P, unused, through 70,000
 * one-off requests reads 20,000 after 20,000 of them, then at least 2^15 and
 * never as young as a wrapped 70,000 - 2^16 = 4,464. */
KVO_TEST(branch_ages_do_not_wrap) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_BRANCH, 32);
    const uint64_t a[6] = {1, 2, 3, 4, 10, 11}, b[6] = {1, 2, 3, 4, 20, 21};
    request(s, a, 6);
    request(s, b, 6); /* 1-4: a branch point's prefix, in P */
    kvo_chunk_key k1 = st_key(0, 1);
    uint32_t e = kvo__index_find(s, &k1);
    ASSERT_TRUE(e != KVO__NIL);
    one_offs(s, 1000, 20000);
    ASSERT_EQ_U64(kvo__branch_age(s, e), 20000);
    for (int step = 0; step < 10; step++) {
        one_offs(s, 1000 + 5 * (20000 + 5000 * (uint64_t)step), 5000);
        ASSERT_TRUE(ready(s, 1)); /* still the same entry */
        ASSERT_EQ_U64(kvo__index_find(s, &k1), e);
        unsigned age = kvo__branch_age(s, e), want = 25000 + 5000 * (unsigned)step;
        if (want < 0x8000u)
            ASSERT_EQ_U64(age, want);
        else
            ASSERT_TRUE(age >= 0x8000u && age < 0xC000u);
    }
    request(s, a, 4); /* a use: age 0 again */
    ASSERT_EQ_U64(kvo__branch_age(s, e), 0);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* Policy admission (kvo_store_params.policy_admission): 7 documents of 4
 * chunks, each asked two questions (so marked, in P: 28 chunks of a 32-chunk
 * store), then a one-off request of 6 chunks.  Q holds 4 chunks (questions),
 * so with admission the one-off's first 4 chunks are stored in their place
 * and its last 2, whose room would come from the documents, are turned away
 * (MISS, counted); without it all 6 are stored and 2 document chunks go. */
static void admission_run(bool admission, int *docs_kept, int *one_off_kept, uint64_t *refused) {
    kvo_plan *p;
    kvo_store *s = mk_with(&p, KVO_POLICY_BRANCH, 32, admission, false);
    for (uint64_t d = 0; d < 7; d++)
        for (uint64_t q = 0; q < 2; q++) {
            const uint64_t r[5] = {100 * d + 1, 100 * d + 2, 100 * d + 3, 100 * d + 4, 100 * d + 50 + q};
            request(s, r, 5);
        }
    const uint64_t one_off[6] = {9001, 9002, 9003, 9004, 9005, 9006};
    request(s, one_off, 6);
    *docs_kept = *one_off_kept = 0;
    for (uint64_t d = 0; d < 7; d++)
        for (uint64_t i = 1; i <= 4; i++) *docs_kept += ready(s, 100 * d + i);
    for (int i = 0; i < 6; i++) *one_off_kept += ready(s, one_off[i]) << i;
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    *refused = ss.store_not_admitted;
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(branch_admission_keeps_the_prefixes_from_a_one_off_request) {
    int docs, one_off;
    uint64_t refused;
    admission_run(true, &docs, &one_off, &refused);
    ASSERT_EQ_INT(docs, 28);
    ASSERT_EQ_INT(one_off, 0x0F); /* the first 4 chunks, a prefix that still hits */
    ASSERT_EQ_U64(refused, 2);
    admission_run(false, &docs, &one_off, &refused);
    ASSERT_EQ_INT(docs, 26);
    ASSERT_EQ_INT(one_off, 0x3F);
    ASSERT_EQ_U64(refused, 0);
}

/* A request as the branch policy learns it, however the caller splits it
 * into calls (policy_branch.c's request epochs, lookups_per_key).  The
 * workloads, in memory (ids from 1; a request at most 64 chunks):
 *   docs: 60 documents of 4-12 chunks, Zipf(0.9)-popular, each request one
 *     of them and a new 1-2-chunk question (protection pays);
 *   chat: 12 conversations going on at once, each turn the previous prompt
 *     and 1-4 new chunks after one of 4 shared 2-chunk system prompts, 1-8
 *     turns, then a new conversation (recency pays: LRU is hard to beat).
 * How each request is made:
 *   WHOLE: a lookup of all of it, then prepare_store of all (the replay);
 *   LOADED: the same, the hits also loaded (prepare_load, complete_load) and
 *     touched before the store (the connector; vLLM's manager);
 *   PER_KEY: one-key lookups up to the first miss, the hits loaded, then
 *     prepare_store of all of it (vLLM's OffloadingManager interface with
 *     request-level offloading). */
enum { WHOLE, LOADED, PER_KEY };

/* the workload's own generator (splitmix64), restarted for each run */
static uint64_t wl_state;
static uint64_t wl_rand(void) {
    uint64_t z = (wl_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t next_request(bool chat, uint64_t *ids, uint64_t *next) {
    static uint64_t conv[12][64], doc[60][12];
    static size_t conv_n[12], conv_left[12], doc_n[60];
    static double cdf[60];
    if (*next == 0) { /* a new run */
        *next = 1;
        double sum = 0;
        for (int d = 0; d < 60; d++) {
            doc_n[d] = 4 + wl_rand() % 9;
            for (size_t b = 0; b < doc_n[d]; b++) doc[d][b] = (*next)++;
            sum += 1.0 / pow(d + 1, 0.9);
            cdf[d] = sum;
        }
        for (int c = 0; c < 12; c++) conv_left[c] = 0;
    }
    size_t n = 0;
    if (chat) {
        int c = (int)(wl_rand() % 12);
        if (conv_left[c] == 0 || conv_n[c] > 56) { /* a new conversation: 1 of 4 system prompts */
            uint64_t sys = 1 + 2 * (wl_rand() % 4);
            conv[c][0] = sys;
            conv[c][1] = sys + 1;
            conv_n[c] = 2;
            conv_left[c] = 1 + wl_rand() % 8;
        }
        if (*next < 9) *next = 9;
        for (size_t add = 1 + wl_rand() % 4; add; add--) conv[c][conv_n[c]++] = (*next)++;
        conv_left[c]--;
        memcpy(ids, conv[c], conv_n[c] * sizeof *ids);
        return conv_n[c];
    }
    double u = (double)(wl_rand() >> 11) / 9007199254740992.0 * cdf[59];
    int d = 0;
    while (d < 59 && cdf[d] < u) d++;
    for (size_t b = 0; b < doc_n[d]; b++) ids[n++] = doc[d][b];
    for (size_t q = 1 + wl_rand() % 2; q; q--) ids[n++] = (*next)++;
    return n;
}

static uint64_t calls_run(kvo_policy_kind pol, bool chat, int how, bool per_key_param, uint64_t seed) {
    kvo_plan *p;
    kvo_store *s = mk_with(&p, pol, 120, false, per_key_param);
    wl_state = seed;
    uint64_t next = 0, hits = 0, ids[64];
    kvo_chunk_key c[64];
    uint8_t st[64];
    kvo_slot sl[64];
    for (int r = 0; r < 3000; r++) {
        size_t n = next_request(chat, ids, &next), h = 0;
        for (size_t i = 0; i < n; i++) c[i] = st_key(0, ids[i]);
        if (how == PER_KEY) {
            for (; h < n; h++) {
                ASSERT_OK(kvo_store_lookup(s, &c[h], 1, st));
                if (st[0] != KVO_READY) break;
            }
        } else {
            ASSERT_OK(kvo_store_lookup(s, c, n, st));
            while (h < n && st[h] == KVO_READY) h++;
        }
        if (h && how != WHOLE) {
            ASSERT_OK(kvo_store_prepare_load(s, c, h, sl));
            ASSERT_OK(kvo_store_complete_load(s, c, h));
            if (how == LOADED) ASSERT_OK(kvo_store_touch(s, c, h));
        }
        st_put(s, c, n);
        hits += h;
    }
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return hits;
}

KVO_TEST(branch_learns_a_request_once_however_it_is_called) {
    uint64_t seed = kvo_test_rand();
    for (int chat = 0; chat < 2; chat++) {
        /* loads and touches of a request's hits are not more uses of them:
         * the same hits as the replay's lookup-and-store, to the chunk */
        uint64_t whole = calls_run(KVO_POLICY_BRANCH, chat, WHOLE, false, seed);
        ASSERT_EQ_U64(calls_run(KVO_POLICY_BRANCH, chat, LOADED, false, seed), whole);
        ASSERT_TRUE(whole > 0);
    }
    /* one-key lookups name no request: with lookups_per_key the policy
     * learns from the stores, within 1 % of what whole-request lookups give
     * (without it each one-key lookup of an evicted chunk counts as a prefix
     * coming back: on the conversations 38 % fewer hits, protecting finished
     * ones); on documents it still protects them (LRU: 25 % fewer) */
    for (int chat = 0; chat < 2; chat++) {
        uint64_t whole = calls_run(KVO_POLICY_BRANCH, chat, WHOLE, false, seed);
        uint64_t per_key = calls_run(KVO_POLICY_BRANCH, chat, PER_KEY, true, seed);
        ASSERT_TRUE(per_key >= whole - whole / 100);
        if (!chat) ASSERT_TRUE(per_key > calls_run(KVO_POLICY_LRU, chat, PER_KEY, true, seed) + whole / 10);
        /* the parameter is the branch policy's: the ensemble, which scores
         * its shadows by each looked-up key, is the same with it */
        ASSERT_EQ_U64(calls_run(KVO_POLICY_ENSEMBLE, chat, PER_KEY, true, seed),
                      calls_run(KVO_POLICY_ENSEMBLE, chat, PER_KEY, false, seed));
    }
}

/* Dead-end classes (policy_branch.c).  Twenty documents of 4 chunks, each
 * asked five times with a new one-chunk question: a question is stored as
 * the continuation of a resident document (class CONT | LEAF) and never
 * used again, so its class is learnt dead.  Then, with the cache full (P
 * holds the twenty, 80 chunks, leaving 40), new documents asked once with a
 * question (a request with no resident prefix: class LEAF), and between
 * them the old ones
 * asked again with new questions: those go to D and are evicted first, so
 * Q holds the new documents and their questions, 5 chunks each, and the
 * last 8 documents are all still stored.  Before D, Q held them in LRU
 * order with the old documents' questions, 6 chunks a document, and 27 of
 * the 32 chunks were. */
static uint64_t dead_end_run(bool admission) {
    kvo_plan *p;
    kvo_store *s = mk_with(&p, KVO_POLICY_BRANCH, 120, admission, false);
    uint64_t question = 1, hits = 0;
    kvo_chunk_key c[5];
    uint8_t st[5];
    for (int r = 0; r < 100 + 2 * 60; r++) {
        bool fresh = r >= 100 && r % 2 == 0; /* a new document, B_(r - 100) / 2 */
        uint64_t doc = fresh ? 100 + (uint64_t)(r - 100) / 2 : (uint64_t)r % 20;
        for (int k = 0; k < 4; k++) c[k] = st_key(0, 1000000 + 16 * doc + (uint64_t)k);
        c[4] = st_key(0, question++);
        ASSERT_OK(kvo_store_lookup(s, c, 5, st));
        if (r >= 20 && !fresh) hits += st[0] == KVO_READY && st[3] == KVO_READY;
        st_put(s, c, 5);
    }
    uint64_t kept = 0; /* chunks of the last eight new documents still stored */
    for (uint64_t doc = 152; doc < 160; doc++)
        for (uint64_t k = 0; k < 4; k++) kept += ready(s, 1000000 + 16 * doc + k);
    ASSERT_EQ_U64(hits, 80 + 60); /* the twenty documents are never lost */
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return kept;
}

KVO_TEST(branch_evicts_dead_end_classes_first) {
    for (int admission = 0; admission < 2; admission++) {
        uint64_t kept = dead_end_run(admission);
        if (getenv("KVO_TEST_VERBOSE")) printf("admission %d: %llu of 32 kept\n", admission, (unsigned long long)kept);
        ASSERT_EQ_U64(kept, 32);
    }
}

/* The ensemble's shadows hold exactly what their policies hold running
 * alone (follow.c): each shadow against a twin store of its policy and
 * parameters (a prefix setting: a store made as a shadow of nothing), key
 * by key after every call of a random run of lookups and stores of short
 * chains, touches and removals. */
KVO_TEST(ensemble_shadows_equal_their_policies_alone) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_ENSEMBLE, 16);
    uint32_t n = kvo__follow_shadows(s);
    ASSERT_EQ_U64(n, 7);
    kvo_store *twin[KVO__FOLLOW_MAX];
    for (uint32_t i = 0; i < n; i++) {
        kvo_store *h = kvo__follow_shadow(s, i);
        kvo__shadow_of alone = {NULL, 0, h->pfx_force, NULL};
        ASSERT_OK(kvo__store_create_shadow(&h->params, &alone, &twin[i]));
    }
    uint64_t differ = 0;
    for (int step = 0; step < 3000; step++) {
        kvo_chunk_key k[6];
        uint8_t st[6];
        uint64_t at = kvo_test_rand() % 48, len = 1 + kvo_test_rand() % 6, op = kvo_test_rand() % 20;
        for (uint64_t j = 0; j < len; j++) k[j] = st_key(0, (at + j) % 48);
        if (op < 16) {
            ASSERT_OK(kvo_store_lookup(s, k, len, st));
            st_put(s, k, len);
        } else if (op < 19) {
            ASSERT_OK(kvo_store_touch(s, k, len));
        } else {
            ASSERT_OK(kvo_store_remove(s, k, len));
        }
        for (uint32_t i = 0; i < n; i++) {
            if (op < 16) {
                ASSERT_OK(kvo_store_lookup(twin[i], k, len, st));
                st_put(twin[i], k, len);
            } else if (op < 19) {
                ASSERT_OK(kvo_store_touch(twin[i], k, len));
            } else {
                ASSERT_OK(kvo_store_remove(twin[i], k, len));
            }
            for (uint64_t key = 0; key < 48; key++)
                differ += st_state(kvo__follow_shadow(s, i), st_key(0, key)) != st_state(twin[i], st_key(0, key));
        }
        st_check(s);
    }
    ASSERT_EQ_U64(differ, 0);
    for (uint32_t i = 0; i < n; i++) kvo_store_destroy(twin[i]);
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
        uint64_t t1 = kvo__store_queue_len(s, KVO__Q_T1), t2 = kvo__store_queue_len(s, KVO__Q_T2);
        uint64_t b1 = kvo__store_queue_len(s, KVO__Q_B1), b2 = kvo__store_queue_len(s, KVO__Q_B2);
        ASSERT_LE_U64(t1 + b1, c);
        ASSERT_LE_U64(b1 + b2, c);
        ASSERT_LE_U64(t1 + t2, c);
    }
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_T1), 8);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_B1), 0); /* |T1| + |B1| <= c */
    ASSERT_EQ_U64(kvo__store_arc_p(s), 0);
    /* make room in T1 by moving keys to T2 (touch), then evict into B1 */
    for (uint64_t i = 92; i < 96; i++) touch1(s, i);   /* T2: 92..95 */
    for (uint64_t i = 200; i < 204; i++) put1(s, i);   /* evicts 96..99 from T1 into B1 */
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_B1), 4);
    ASSERT_FALSE(ready(s, 96));
    /* storing a B1 ghost again: p grows, the key goes to T2 */
    put1(s, 96);
    ASSERT_GT_U64(kvo__store_arc_p(s), 0);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_T2), 5);
    uint64_t p1 = kvo__store_arc_p(s);
    /* move every resident key to T2 (touch): T1 is empty, so the next victim
     * comes from T2 and its key goes to B2 */
    kvo_store_entry all[16];
    size_t n;
    uint64_t cur = 0;
    ASSERT_OK(kvo_store_scan(s, &cur, all, 16, &n));
    for (size_t i = 0; i < n; i++) ASSERT_OK(kvo_store_touch(s, &all[i].key, 1));
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_T1), 0);
    kvo_chunk_key nk = st_key(0, 400), ev[2];
    kvo_slot evs[2], sl;
    uint8_t need;
    size_t nev;
    ASSERT_OK(kvo_store_prepare_store(s, &nk, 1, &need, &sl, ev, evs, 2, &nev));
    ASSERT_OK(kvo_store_complete_store(s, &nk, 1, true));
    ASSERT_EQ_U64(nev, 1);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_B2), 1);
    /* storing the B2 ghost again: p shrinks, the key goes to T2 */
    ASSERT_OK(kvo_store_prepare_store(s, &ev[0], 1, &need, &sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 1);
    ASSERT_OK(kvo_store_complete_store(s, &ev[0], 1, true));
    ASSERT_LT_U64(kvo__store_arc_p(s), p1);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(s3fifo_small_main_ghost) {
    kvo_plan *p;
    kvo_store *s = mk(&p, KVO_POLICY_S3FIFO, 10);
    for (uint64_t i = 0; i < 10; i++) put1(s, i);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_S), 10); /* new keys enter S */
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_M), 0);
    touch1(s, 0); /* used while in S */
    put1(s, 10);  /* S's oldest (0) was used: moved to M; 1 is evicted into G */
    ASSERT_TRUE(ready(s, 0));
    ASSERT_FALSE(ready(s, 1));
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_M), 1);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_G), 1);
    /* a G ghost stored again enters M directly */
    put1(s, 1);
    ASSERT_TRUE(ready(s, 1));
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_M), 2);
    /* G stays bounded under a long stream */
    for (uint64_t i = 1000; i < 1200; i++) {
        put1(s, i);
        ASSERT_LE_U64(kvo__store_queue_len(s, KVO__Q_G), 10);
    }
    /* M entries without further use eventually leave (no ghost from M) */
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_G), 10);
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
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_M), 36);
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_S), 4);
    ASSERT_FALSE(ready(s, 0));
    /* S is under 10 %: victims come from M, FIFO with a second chance */
    touch1(s, 2);
    put1(s, 41);
    put1(s, 42);
    ASSERT_FALSE(ready(s, 1));
    ASSERT_TRUE(ready(s, 2)); /* used in M: reinserted instead of evicted */
    ASSERT_FALSE(ready(s, 3));
    ASSERT_EQ_U64(kvo__store_queue_len(s, KVO__Q_G), 0); /* no ghosts from M */
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
    ASSERT_EQ_U64(kvo__store_prefix_knob(s), 0); /* LRU until shown otherwise */
    uint64_t next = 1000;
    int survived = 0;
    for (int round = 0; round < 40; round++) {
        int n = 0;
        for (uint64_t i = 0; i < 16; i++) n += ready(s, i);
        if (round >= 30) survived += n;
        for (uint64_t i = 0; i < 16; i++) put1(s, i); /* a use, or stored again */
        for (int j = 0; j < 80; j++) put1(s, next++);
        ASSERT_LE_U64(kvo__store_queue_len(s, KVO__Q_G), 4 * 64);
    }
    ASSERT_TRUE(kvo__store_prefix_knob(s) > 0);
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
    *knob = kvo__store_prefix_knob(s);
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
    for (int how = 0; how < 8; how++) {
        kvo_plan *p;
        kvo_store *s = mk(&p, how < 4 ? KVO_POLICY_PREFIX : KVO_POLICY_BRANCH, 64); /* branch: ops.leaf_first too */
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
