/*
 * The connector end to end with a simulated engine (tests/connector_sim.h,
 * tests/connector_fixture.h): multi-turn conversations for every preset
 * geometry (scaled down) and random group mixes (co-prime block sizes
 * among them), with the engine's blocks evicted between turns; every
 * lookup's hit is compared with the agreement computed from what was
 * stored, and every loaded byte with the bytes the engine wrote for those
 * tokens.  Plus a non-cacheable group, and three scheduler threads with a
 * poller thread.
 */
#include <pthread.h>
#include <time.h>

#include "connector_fixture.h"

KVO_TEST(presets_conversations_hit_and_load_exact_bytes) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        const char *name = kvo_model_preset_name(i);
        kvo_plan *p = sim_preset_plan(name);
        uint64_t scratch = noncacheable_mask(p);
        kvo_connector_params cp = kvo_connector_default_params();
        cp.scratch_groups = scratch;
        sim s;
        sim_init(&s, p, &cp, 1024);
        conv_opts o = {3, 300 + 7 * (size_t)i, 150, 40, scratch, true};
        uint64_t hit = run_conversation(&s, 1000, &o);
        if (hit == 0) FAILF("preset %s: no hit in a 3-turn conversation", name);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.load_failures, 0);
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.host.pending, 0);
        ASSERT_EQ_U64(st.requests_live, 0);
        ASSERT_GT_U64(st.chunks_stored, 0);
        ASSERT_EQ_U64(st.tokens_loaded, hit);
        sim_destroy(&s);
    }
}

KVO_TEST(noncacheable_group_blocks_hits_by_default) {
    kvo_plan *p = sim_preset_plan("deepseek-v4-flash-like");
    ASSERT_NE_U64(noncacheable_mask(p), 0);
    sim s;
    sim_init(&s, p, NULL, 1024);
    conv_opts o = {3, 400, 200, 20, 0, true};
    ASSERT_EQ_U64(run_conversation(&s, 1, &o), 0);
    /* the stores still happened: a connector declaring the group scratch on
     * the same arena would hit; here just check the reason */
    uint32_t tok[600];
    for (int i = 0; i < 600; i++) tok[i] = (uint32_t)i;
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 99, .tokens = tok, .n_tokens = 600};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 99, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    ASSERT_EQ_INT(lr.reason, KVO_AGREE_NONCACHEABLE);
    ASSERT_OK(kvo_connector_abort(s.c, 99));
    sim_destroy(&s);
    /* a cacheable group cannot be declared scratch */
    p = sim_preset_plan("gemma-4-31b-like");
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = p;
    cp.host_bytes = 1 << 20;
    cp.scratch_groups = 1;
    kvo_connector *c = NULL;
    ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "sliding");
    kvo_plan_destroy(p);
}

/* Random group mixes: 1-5 groups of random kinds, block sizes, windows and
 * flags (some non-cacheable, declared scratch; some draft). */
static uint32_t gcd_u32(uint32_t a, uint32_t b) {
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Multi-turn conversations over random group mixes with block sizes from
 * tpbs, every hit compared with the brute-force rule and loaded byte-exact. */
static void random_mixes(const uint32_t *tpbs, size_t ntpb, int iters) {
    for (int iter = 0; iter < iters; iter++) {
        size_t ng = 1 + kvo_test_rand() % 5;
        uint32_t tph = (uint32_t[]){4, 8, 16}[kvo_test_rand() % 3];
        sim_group gs[SIM_MAXG];
        char names[SIM_MAXG][8];
        bool any_cacheable = false;
        for (size_t g = 0; g < ng; g++) {
            snprintf(names[g], sizeof names[g], "g%zu", g);
            gs[g].name = names[g];
            gs[g].kind = (kvo_group_kind)(kvo_test_rand() % 3);
            gs[g].tpb = tpbs[kvo_test_rand() % ntpb];
            gs[g].window = gs[g].kind == KVO_GROUP_SLIDING ? 8 + (uint32_t)(kvo_test_rand() % 120) : 0;
            uint32_t minb = tph / gcd_u32(gs[g].tpb, tph); /* chunk tokens a multiple of tph */
            gs[g].bpc = minb * (1 + (uint32_t)(kvo_test_rand() % 2));
            gs[g].cacheable = kvo_test_rand() % 8 != 0;
            gs[g].draft = kvo_test_rand() % 6 == 0;
            any_cacheable |= gs[g].cacheable;
        }
        if (!any_cacheable) gs[0].cacheable = true;
        kvo_plan *p = sim_plan("mix", tph, gs, ng);
        uint64_t scratch = noncacheable_mask(p);
        kvo_connector_params cp = kvo_connector_default_params();
        cp.scratch_groups = scratch;
        sim s;
        sim_init(&s, p, &cp, 2048);
        conv_opts o = {3, 200 + kvo_test_rand() % 200, 60 + kvo_test_rand() % 100, 10 + kvo_test_rand() % 30, scratch,
                       true};
        (void)run_conversation(&s, 100 * (uint64_t)iter, &o);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.load_failures, 0);
        sim_destroy(&s);
    }
}

KVO_TEST(random_group_mixes) {
    static const uint32_t tpbs[] = {1, 2, 4, 8, 16, 32};
    random_mixes(tpbs, 6, 12);
}

/* Co-prime block sizes (issue 11): hits at any token count, last blocks
 * only partly valid, still byte-exact and equal to the brute-force rule. */
KVO_TEST(random_coprime_group_mixes) {
    static const uint32_t tpbs[] = {3, 5, 12, 16, 24, 32, 48, 64};
    random_mixes(tpbs, 8, 12);
}

typedef struct thr_ctx {
    sim *s;
    pthread_mutex_t *engine_mu; /* the sim's allocator and memory tables */
    int idx;
    uint64_t hits;
} thr_ctx;

/* Each thread runs conversations sharing a common system prompt; every
 * connector call is made without the engine lock except the sim's own
 * allocations. */
static void *thr_main(void *arg) {
    thr_ctx *x = arg;
    sim *s = x->s;
    uint32_t tok[320];
    fill_tokens(tok, 256, 42); /* shared system prompt */
    for (int i = 256; i < 320; i++) tok[i] = (uint32_t)(x->idx * 1000 + i);
    for (int round = 0; round < 4; round++) {
        uint64_t id = (uint64_t)x->idx * 100 + (uint64_t)round;
        sim_req r;
        sim_req_init(&r, id);
        sim_req_tokens(&r, tok, 320);
        if (kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = 320})) abort();
        kvo_lookup_result lr;
        do {
            if (kvo_connector_lookup(s->c, id, 0, &lr)) abort();
            if (lr.status == KVO_HIT_PENDING) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
        } while (lr.status == KVO_HIT_PENDING);
        pthread_mutex_lock(x->engine_mu);
        if (lr.status == KVO_HIT) alloc_for_load(s, &r, 0, lr.tokens);
        kvo_block_table t[SIM_MAXG];
        sim_tables(s, &r, t);
        pthread_mutex_unlock(x->engine_mu);
        uint64_t have = 0;
        if (lr.status == KVO_HIT) {
            if (kvo_connector_load(s->c, id, lr.tokens, t, s->ng)) abort();
            /* wait for our completion: the poller thread moves it to us via
             * request stats */
            for (;;) {
                kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
                if (kvo_connector_request_stats(s->c, id, &rs)) abort();
                if (rs.tokens_loaded || rs.load_failures) {
                    have = rs.tokens_loaded;
                    break;
                }
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
            }
            pthread_mutex_lock(x->engine_mu);
            for (size_t g = 0; g < s->ng; g++)
                for (uint64_t i = 0; i < have / 16 && i < r.tn[g]; i++)
                    if (r.tab[g][i] != KVO_NO_BLOCK && !sim_block_ok(s, &r, g, i)) abort();
            pthread_mutex_unlock(x->engine_mu);
            x->hits += have;
        }
        /* loaded state reached ACTIVE once the completion was processed */
        r.computed = have;
        while (r.computed < 320) {
            pthread_mutex_lock(x->engine_mu);
            sim_compute(s, &r, r.computed + 64 > 320 ? 320 : r.computed + 64);
            sim_tables(s, &r, t);
            pthread_mutex_unlock(x->engine_mu);
            int rc;
            while ((rc = kvo_connector_update(s->c, id, r.computed, t, s->ng)) == KVO_ESTATE) {
                struct timespec ts = {0, 100000}; /* the load completion is being processed */
                nanosleep(&ts, NULL);
            }
            if (rc) abort();
        }
        bool busy;
        if (kvo_connector_finish(s->c, id, r.computed, t, s->ng, &busy)) abort();
        if (busy && kvo_connector_wait_request(s->c, id) && kvo_connector_wait_request(s->c, id) != KVO_ENOTFOUND)
            abort();
        pthread_mutex_lock(x->engine_mu);
        sim_req_free(s, &r);
        pthread_mutex_unlock(x->engine_mu);
    }
    return NULL;
}

static volatile int poller_stop;

static void *poller_main(void *arg) {
    sim *s = arg;
    while (!__atomic_load_n(&poller_stop, __ATOMIC_ACQUIRE)) {
        kvo_completion cp[32];
        size_t np = 0;
        (void)kvo_connector_poll(s->c, cp, 32, &np);
        if (np == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

KVO_TEST(threads_scheduler_and_poller) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 4096);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    thr_ctx ctx[3];
    pthread_t th[3], pt;
    __atomic_store_n(&poller_stop, 0, __ATOMIC_RELEASE);
    ASSERT_EQ_INT(pthread_create(&pt, NULL, poller_main, &s), 0);
    for (int i = 0; i < 3; i++) {
        ctx[i] = (thr_ctx){&s, &mu, i, 0};
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, thr_main, &ctx[i]), 0);
    }
    uint64_t hits = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        hits += ctx[i].hits;
    }
    __atomic_store_n(&poller_stop, 1, __ATOMIC_RELEASE);
    pthread_join(pt, NULL);
    ASSERT_GT_U64(hits, 0);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.load_failures, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    sim_destroy(&s);
}
