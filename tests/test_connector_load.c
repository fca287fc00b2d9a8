/*
 * Loads: a PENDING hit (stores still in flight) means ask again later; an
 * injected load failure lists exactly the blocks it wrote as invalid and a
 * failed store leaves nothing READY; a corrupt slot (verify_checksums) is
 * detected and never loaded again; a local prefix that ends mid-chunk loads
 * only the rest (the sliding group only its window); stores skip rather
 * than evict the chunks a pending load has pinned.
 */
#include "connector_fixture.h"

KVO_TEST(pending_means_ask_again_later) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 1);
    sim_req a, b;
    prefill(&s, &a, 1, tok, 400, false); /* stores submitted, results not polled */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_PENDING);
    ASSERT_EQ_U64(lr.tokens, 0);
    ASSERT_EQ_U64(lr.tokens_if_pending, 384);
    /* PENDING pins nothing; load is refused */
    ASSERT_ERR(kvo_connector_load(s.c, 2, 384, NULL, 0), KVO_ESTATE);
    sim_drain(&s);
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    alloc_for_load(&s, &b, 0, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &b, 384);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.pending_lookups, 1);
    ASSERT_EQ_U64(rs.tokens_loaded, 384);
    ASSERT_EQ_U64(rs.tokens_computed, 16);
    ASSERT_GT_U64(rs.bytes_loaded, 0);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &a);
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

KVO_TEST(injected_load_failure_gives_invalid_blocks) {
    sim s;
    uint32_t tok[400];
    sim_two_stored(&s, NULL, 512, tok, 2);
    sim_req b;
    kvo__connector_inject_failures(s.c, 1, 0);
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, KVO_EIO);
    ASSERT_EQ_U64(cp.tokens_valid, 0);
    /* the invalid blocks are exactly the blocks the load wrote */
    size_t expect = 0;
    for (size_t g = 0; g < 2; g++)
        for (size_t i = 0; i < b.tn[g]; i++) expect += b.tab[g][i] != KVO_NO_BLOCK;
    ASSERT_EQ_U64(cp.n_invalid_blocks, expect);
    uint64_t ids[64];
    size_t n = 0, tot = 0;
    for (uint32_t g = 0; g < 2; g++) {
        ASSERT_OK(kvo_connector_invalid_blocks(s.c, 2, g, ids, 64, &n));
        for (size_t i = 0; i < n && i < 64; i++) {
            bool found = false;
            for (size_t k = 0; k < b.tn[g]; k++) found |= b.tab[g][k] == ids[i];
            ASSERT_TRUE(found);
        }
        tot += n;
    }
    ASSERT_EQ_U64(tot, expect);
    /* the engine recomputes; the request goes on normally */
    b.computed = 0;
    compute_to(&s, &b, 400, 100);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.load_failures, 1);
    ASSERT_EQ_U64(rs.tokens_loaded, 0);
    finish_req(&s, &b);
    sim_req_free(&s, &b);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.load_failures, 1);
    /* a failed store removes its chunks: nothing half-written is ever READY */
    kvo__connector_inject_failures(s.c, 0, 1);
    uint32_t tok2[200];
    fill_tokens(tok2, 200, 99);
    sim_req c2;
    prefill(&s, &c2, 3, tok2, 200, true);
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(st.stores_failed, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &c2);
    sim_destroy(&s);
}

KVO_TEST(corrupt_slot_is_detected_never_loaded) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.verify_checksums = true;
    sim s;
    uint32_t tok[400];
    sim_two_stored(&s, &cp, 512, tok, 3);
    sim_req b;
    /* flip one byte in one stored chunk of the full group */
    kvo_store *st = kvo_connector_store(s.c);
    kvo_store_entry ents[256];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(st, &cur, ents, 256, &n));
    ASSERT_GT_U64(n, 0);
    size_t victim = n;
    for (size_t i = 0; i < n; i++)
        if (ents[i].key.group == 0) victim = i;
    ASSERT_LT_U64(victim, n);
    uint8_t *slot = kvo_arena_slot(kvo_connector_arena(s.c), ents[victim].slot);
    slot[5] ^= 0x40;
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    kvo_completion c1 = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(c1.status, KVO_ECORRUPT);
    ASSERT_EQ_U64(c1.tokens_valid, 0);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &cs));
    ASSERT_EQ_U64(cs.checksum_failures, 1);
    ASSERT_EQ_U64(cs.host.pinned, 0);
    /* the corrupt chunk (only it) is gone: the next lookup stops right below
     * it (the keys are recomputed here from the documented format) */
    kvo_u128 units[25];
    size_t nu = 0;
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(kvo_plan_fingerprint(s.plan), NULL, 0), tok, 400, 16, NULL, 0,
                              units, 25, &nu));
    kvo_chunk_key keys[12];
    ASSERT_EQ_U64(kvo_chunk_keys(kvo_plan_group(s.plan, 0), units, nu, keys, 12), 12);
    size_t vc = 12;
    for (size_t i = 0; i < 12; i++)
        if (kvo_chunk_key_eq(&keys[i], &ents[victim].key)) vc = i;
    ASSERT_LT_U64(vc, 12);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, vc * 32);
    ASSERT_LT_U64(lr.tokens, hit);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

KVO_TEST(local_prefix_loads_only_the_rest) {
    sim s;
    uint32_t tok[400];
    sim_two_stored(&s, NULL, 512, tok, 5);
    sim_req b;
    /* the engine holds tokens [0, 48) (its own prefix cache), in blocks marked
     * 0x77; L = 48 is mid-chunk for the full group (32-token chunks) */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    uint64_t L = 48;
    for (size_t g = 0; g < 2; g++) {
        sim_table_len(&s, &b, g, L / 16);
        for (size_t i = 0; i < L / 16; i++) {
            b.tab[g][i] = sim_alloc(&s, g);
            for (uint32_t l = 0; l < s.layers[g]; l++) memset(sim_page(&s, g, l, b.tab[g][i]), 0x77, s.page[g]);
        }
    }
    kvo_lookup_result lr;
    ASSERT_ERR(kvo_connector_lookup(s.c, 2, 40, &lr), KVO_EINVAL); /* not a multiple of the step */
    ASSERT_OK(kvo_connector_lookup(s.c, 2, L, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.local_tokens, L);
    alloc_for_load(&s, &b, L, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    for (size_t g = 0; g < 2; g++) {
        for (size_t i = 0; i < L / 16; i++) /* the engine's own blocks untouched */
            for (uint32_t l = 0; l < s.layers[g]; l++) {
                uint8_t *pg = sim_page(&s, g, l, b.tab[g][i]);
                for (uint64_t k = 0; k < s.page[g]; k++) ASSERT_EQ_INT(pg[k], 0x77);
            }
        for (size_t i = L / 16; i < 384 / 16; i++)
            if (b.tab[g][i] != KVO_NO_BLOCK) ASSERT_TRUE(sim_block_ok(&s, &b, g, i));
    }
    /* the sliding group loaded only its window [336, 384) */
    for (size_t i = L / 16; i < 384 / 16; i++) ASSERT_EQ_INT(b.tab[1][i] != KVO_NO_BLOCK, i >= 336 / 16);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.local_tokens, L);
    ASSERT_EQ_U64(rs.tokens_loaded, 384 - L);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

/* A host tier full of chunks pinned by a pending load: new stores that would
 * need to evict them are skipped and counted, and the pinned hit still loads
 * the right bytes. */
KVO_TEST(stores_skip_rather_than_evict_pinned) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.host_bytes = 48 * 4096; /* 48 slots of 4 KiB */
    sim s;
    uint32_t tok[400], other[400];
    sim_two_stored(&s, &cp, 1024, tok, 20); /* 12 + 25 = 37 chunks */
    fill_tokens(other, 400, 21);
    sim_req b, c2;
    /* pin the hit (15 chunks), then store another 37 chunks */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400}));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 384);
    prefill(&s, &c2, 3, other, 400, true);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(st.stores_skipped_nospace, 0);
    ASSERT_GE_U64(st.host.pinned, 15);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 3, &rs));
    ASSERT_EQ_U64(rs.stores_skipped, st.stores_skipped_nospace);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &c2);
    alloc_for_load(&s, &b, 0, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cpl = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cpl.status, 0);
    check_loaded(&s, &b, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_GT_U64(st.host.evictions, 0);
    sim_destroy(&s);
}
