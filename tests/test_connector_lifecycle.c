/*
 * A request's life and the connector's API contract: create's errors,
 * unit-hash mode and cache salts, bad input failing one request only, a
 * token count too large to hash, block reuse during a store (wait_blocks),
 * preemption mid-load and resuming, and the connector's hash table against
 * a reference.
 */
#include "connector_fixture.h"

KVO_TEST(create_errors) {
    kvo_connector *c = NULL;
    kvo_connector_params p = kvo_connector_default_params();
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    kvo_plan *plan = two_group_plan();
    p.plan = plan;
    p.host_bytes = 16;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "host_bytes");
    p.host_bytes = 1 << 20;
    p.checkpoint_interval = 24;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "checkpoint_interval");
    p.checkpoint_interval = 0;
    p.scratch_groups = UINT64_C(1) << 5;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    p.scratch_groups = 0;
    ASSERT_OK(kvo_connector_create(&p, &c));
    ASSERT_EQ_U64(kvo_connector_step(c), 16);
    /* no layout: loads and updates are refused */
    uint32_t tok[64] = {0};
    ASSERT_OK(kvo_connector_add_request(c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 64}));
    uint64_t blk[4] = {0, 1, 2, 3};
    kvo_block_table t[2] = {{blk, 4}, {blk, 4}};
    ASSERT_ERR(kvo_connector_update(c, 1, 64, t, 2), KVO_ESTATE);
    kvo_connector_destroy(c);
    kvo_connector_destroy(NULL);
    kvo_plan_destroy(plan);
}

KVO_TEST(unit_hash_mode_and_salts) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    /* engine-provided unit hashes (16 tokens each) */
    kvo_u128 units[25];
    for (int i = 0; i < 25; i++) units[i] = (kvo_u128){(uint64_t)i * 977 + 1, (uint64_t)i};
    uint32_t tok[400];
    fill_tokens(tok, 400, 6); /* the sim's byte patterns still come from tokens */
    sim_req a;
    sim_req_init(&a, 1);
    sim_req_tokens(&a, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 1, .unit_hashes = units, .n_units = 25, .prompt_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    sim_compute(&s, &a, 400);
    do_update(&s, &a);
    sim_drain(&s);
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, 1), KVO_ESTATE);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    sim_req_free(&s, &a);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .unit_hashes = units, .n_units = 25,
                                                                   .prompt_tokens = 401}));
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 384);
    /* another tenant salt: no hit */
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 3, .unit_hashes = units, .n_units = 25,
                                                                   .prompt_tokens = 401, .cache_salt = "t2",
                                                                   .cache_salt_len = 2}));
    ASSERT_OK(kvo_connector_lookup(s.c, 3, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 0);
    /* token mode with the same tokens does not collide with hash mode */
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 4, .tokens = tok, .n_tokens = 400}));
    ASSERT_OK(kvo_connector_lookup(s.c, 4, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 0);
    ASSERT_ERR(kvo_connector_append_unit_hashes(s.c, 2, units, 1, 500), KVO_EINVAL);
    ASSERT_OK(kvo_connector_append_unit_hashes(s.c, 2, units, 1, 417));
    for (uint64_t id = 2; id <= 4; id++) ASSERT_OK(kvo_connector_abort(s.c, id));
    sim_destroy(&s);
}

KVO_TEST(bad_input_fails_one_request_only) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[200];
    fill_tokens(tok, 200, 7);
    kvo_lookup_result lr;
    kvo_block_table t[2] = {{NULL, 0}, {NULL, 0}};
    bool busy;
    ASSERT_ERR(kvo_connector_lookup(s.c, 5, 0, &lr), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_load(s.c, 5, 0, t, 2), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_update(s.c, 5, 0, t, 2), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_finish(s.c, 5, 0, NULL, 0, &busy), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_preempt(s.c, 5), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_abort(s.c, 5), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1}), KVO_EINVAL);
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 0}),
               KVO_EINVAL);
    ASSERT_ERR(kvo_connector_add_request(
                   s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .unit_hashes = (kvo_u128[1]){{1, 2}}, .n_units = 1,
                                            .prompt_tokens = 40}),
               KVO_EINVAL);
    /* a healthy request next to a misbehaving one */
    sim_req good, bad;
    prefill(&s, &good, 10, tok, 200, true);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 11, .tokens = tok, .n_tokens = 200}));
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 11, .tokens = tok, .n_tokens = 200}),
               KVO_EEXIST);
    sim_req_init(&bad, 11);
    sim_req_tokens(&bad, tok, 200);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_ESTATE); /* no lookup */
    ASSERT_ERR(kvo_connector_update(s.c, 11, 300, t, 2), KVO_EINVAL); /* beyond the tokens */
    ASSERT_ERR(kvo_connector_update(s.c, 11, 100, t, 2), KVO_EINVAL); /* tables too short */
    ASSERT_CONTAINS(kvo_last_error(), "block table");
    ASSERT_ERR(kvo_connector_update(s.c, 11, 100, t, 1), KVO_EINVAL); /* group count */
    ASSERT_OK(kvo_connector_lookup(s.c, 11, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 192);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 160, t, 2), KVO_EINVAL); /* not the hit */
    sim_table_len(&s, &bad, 0, 11);
    sim_table_len(&s, &bad, 1, 11);
    sim_tables(&s, &bad, t);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_EINVAL); /* tables too short */
    ASSERT_CONTAINS(kvo_last_error(), "11 entries");
    alloc_for_load(&s, &bad, 0, 192);
    bad.tab[0][3] = KVO_NO_BLOCK; /* a hole where a block is to be loaded */
    sim_tables(&s, &bad, t);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_NO_BLOCK");
    bad.tab[0][3] = sim_alloc(&s, 0);
    sim_tables(&s, &bad, t);
    ASSERT_OK(kvo_connector_load(s.c, 11, 192, t, 2));
    ASSERT_ERR(kvo_connector_update(s.c, 11, 0, t, 2), KVO_ESTATE); /* load in flight */
    ASSERT_ERR(kvo_connector_lookup(s.c, 11, 0, &lr), KVO_ESTATE);
    ASSERT_ERR(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy), KVO_ESTATE);
    kvo_completion cp = sim_wait_completion(&s, 11, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &bad, 192);
    ASSERT_ERR(kvo_connector_wait_blocks(s.c, &(kvo_block_ref){9, 0}, 1), KVO_EINVAL);
    uint64_t ids[4];
    size_t n;
    ASSERT_ERR(kvo_connector_invalid_blocks(s.c, 11, 7, ids, 4, &n), KVO_EINVAL);
    /* the good request is unaffected */
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 10, &rs));
    ASSERT_EQ_U64(rs.chunks_stored, 6 + 12);
    finish_req(&s, &good);
    ASSERT_OK(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy));
    ASSERT_FALSE(busy);
    ASSERT_ERR(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy), KVO_ENOTFOUND);
    sim_req_free(&s, &good);
    sim_req_free(&s, &bad);
    /* router events: stored chunks */
    kvo_store_event ev[64];
    uint64_t dropped = 0;
    size_t ne = kvo_connector_drain_events(s.c, ev, 64, &dropped);
    ASSERT_GT_U64(ne, 0);
    ASSERT_EQ_INT(ev[0].type, KVO_EVENT_STORED);
    sim_destroy(&s);
}

/* A token count whose unit hashes could not be held in memory (their byte
 * count overflows size_t) fails before any token is read, and leaves the
 * request as it was. */
KVO_TEST(huge_token_count_fails_cleanly) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[40];
    fill_tokens(tok, 40, 3);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 40}));
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, SIZE_MAX), KVO_ENOMEM);
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, SIZE_MAX / 2), KVO_ENOMEM);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    ASSERT_EQ_U64(rs.tokens, 40);
    ASSERT_OK(kvo_connector_append_tokens(s.c, 1, tok, 8));
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    ASSERT_EQ_U64(rs.tokens, 48);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    sim_destroy(&s);
}

KVO_TEST(block_reuse_during_store_is_never_torn) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    for (int round = 0; round < 20; round++) {
        uint32_t tok[300];
        fill_tokens(tok, 300, 10 + (uint32_t)round);
        sim_req a, b;
        prefill(&s, &a, 1, tok, 300, false); /* stores in flight */
        /* the engine reuses every block at once: wait, then overwrite */
        kvo_block_ref refs[128];
        size_t nr = 0;
        for (size_t g = 0; g < 2; g++)
            for (size_t i = 0; i < a.tn[g]; i++) refs[nr++] = (kvo_block_ref){(uint32_t)g, a.tab[g][i]};
        ASSERT_OK(kvo_connector_wait_blocks(s.c, refs, nr));
        for (size_t g = 0; g < 2; g++)
            for (size_t i = 0; i < a.tn[g]; i++)
                for (uint32_t l = 0; l < s.layers[g]; l++) memset(sim_page(&s, g, l, a.tab[g][i]), 0x11, s.page[g]);
        ASSERT_OK(kvo_connector_abort(s.c, 1));
        sim_req_free(&s, &a);
        sim_drain(&s);
        uint64_t hit;
        lookup_and_load(&s, &b, 2, tok, 300, &hit);
        kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
        ASSERT_EQ_INT(cp.status, 0);
        check_loaded(&s, &b, hit);
        ASSERT_OK(kvo_connector_abort(s.c, 2));
        sim_req_free(&s, &b);
    }
    sim_destroy(&s);
}

KVO_TEST(preemption_mid_load) {
    sim s;
    uint32_t tok[400];
    sim_two_stored(&s, NULL, 512, tok, 4);
    sim_req b;
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    ASSERT_OK(kvo_connector_preempt(s.c, 2)); /* blocks may be freed now */
    sim_release(&s, &b);
    kvo_completion cps[16];
    size_t n = 0;
    sim_drain(&s);
    ASSERT_OK(kvo_connector_poll(s.c, cps, 16, &n));
    for (size_t i = 0; i < n; i++) ASSERT_NE_U64(cps[i].request, 2); /* no completion for it */
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    /* resumed later: the same hit, loaded completely */
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, hit);
    alloc_for_load(&s, &b, 0, hit);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, hit, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &b, hit);
    b.computed = hit;
    compute_to(&s, &b, 400, 50);
    finish_req(&s, &b);
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

/* The connector's hash map against a direct-indexed reference: random puts,
 * gets and deletes (backward-shift deletion keeps every key reachable). */
KVO_TEST(map_matches_reference) {
    enum { K = 3000 };
    static uint64_t ref[K];
    static bool have[K];
    memset(have, 0, sizeof have);
    kvo__map m;
    ASSERT_OK(kvo__map_init(&m, 4));
    size_t n = 0;
    for (int op = 0; op < 200000; op++) {
        uint64_t k = kvo_test_rand() % K;
        uint64_t key = k * 64 + (k % 7); /* clustered keys like block ids */
        int what = (int)(kvo_test_rand() % 3);
        if (what == 0) {
            kvo__map_entry *e = NULL;
            int rc = kvo__map_put(&m, key, &e);
            ASSERT_EQ_INT(rc, have[k] ? 1 : 0);
            if (!have[k]) n++;
            have[k] = true;
            e->a = ref[k] = kvo_test_rand();
        } else if (what == 1) {
            kvo__map_entry *e = kvo__map_get(&m, key);
            if (have[k]) {
                ASSERT_NOT_NULL(e);
                ASSERT_EQ_U64(e->a, ref[k]);
                kvo__map_del(&m, e);
                have[k] = false;
                n--;
            } else {
                ASSERT_NULL(e);
            }
        } else {
            kvo__map_entry *e = kvo__map_get(&m, key);
            ASSERT_EQ_INT(e != NULL, have[k]);
            if (e) ASSERT_EQ_U64(e->a, ref[k]);
        }
        ASSERT_EQ_U64(m.n, n);
    }
    for (uint64_t k = 0; k < K; k++) {
        kvo__map_entry *e = kvo__map_get(&m, k * 64 + (k % 7));
        ASSERT_EQ_INT(e != NULL, have[k]);
    }
    ASSERT_OK(kvo__map_reserve(&m, 1000));
    size_t cap = m.cap;
    for (uint64_t k = 0; k < 1000; k++) {
        kvo__map_entry *e;
        ASSERT_GE_INT(kvo__map_put(&m, UINT64_C(1) << 40 | k, &e), 0);
    }
    ASSERT_EQ_U64(m.cap, cap); /* reserved room: no growth */
    kvo__map_free(&m);
}
