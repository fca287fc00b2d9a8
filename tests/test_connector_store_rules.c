/*
 * The connector's store rules and controls (issue 11, sections 3 and 4):
 * skipped stores retried (pressure, then room: the whole prefix ends up
 * stored), the REACHABLE sliding policy, complete_store of READY keys,
 * per-request max_load_tokens / max_offload_tokens / offload_prompt_only,
 * max_hit_tokens, and kvo_connector_reset with requests in flight.
 */
#include "connector_rules_util.h"
#include "file_tier_fixture.h"
#include "store/store_internal.h"

static kvo_plan *plan_one(void) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 1, true, false}};
    return sim_plan("one16", 16, gs, 1);
}

/* A file tier for plan p under the test's temporary directory (the file
 * tier tests' parameters, file_tier_fixture.h). */
static kvo_file_tier *tmp_tier(const kvo_plan *p) {
    kvo_file_tier_params fp = ftf_params(ftf_subdir("tier"), p);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&fp, &t));
    return t;
}

/* Pin every READY entry of the host store (another reader); returns them. */
static size_t pin_all(kvo_store *st, kvo_chunk_key *keys, size_t cap) {
    uint64_t cur = 0;
    size_t n = 0;
    do {
        kvo_store_entry e[64];
        size_t k = 0;
        ASSERT_OK(kvo_store_scan(st, &cur, e, 64, &k));
        for (size_t i = 0; i < k && n < cap; i++)
            if (e[i].state == KVO_READY) keys[n++] = e[i].key;
    } while (cur);
    kvo_slot *sl = malloc((n + 1) * sizeof *sl);
    if (n) ASSERT_OK(kvo_store_prepare_load(st, keys, n, sl));
    free(sl);
    return n;
}

/* A connector whose host tier (8 slots) request 1 filled with 40 chunks of
 * 641 tokens (seed), every entry then pinned (*np of them, in pinned). */
static void init_pressured(sim *s, uint64_t seed, kvo_chunk_key *pinned, size_t *np) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.host_bytes = 8 * 4096;
    sim_init(s, plan_one(), &cp, 128);
    uint32_t t1[641];
    cr_tokens(t1, 641, seed);
    (void)cr_run(s, 1, t1, 641, 64, NULL);
    *np = pin_all(kvo_connector_store(s->c), pinned, 64);
    ASSERT_GT_U64(*np, 3);
}

/* A host tier of a few slots, filled by request 1 and pinned; request 2's
 * stores are skipped, then room comes back: at_finish false retries at the
 * next update, true at finish.  Either way all of request 2 ends up stored. */
static void pressure_then_room(bool at_finish) {
    sim s;
    kvo_chunk_key pinned[64];
    size_t np = 0;
    init_pressured(&s, 10, pinned, &np);
    uint32_t t2[65];
    cr_tokens(t2, 65, 11);
    sim_req r;
    cr_add(&s, &r, 2, t2, 65, NULL);
    cr_compute(&s, &r, at_finish ? 64 : 32, 64);
    sim_drain(&s);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.stores_skipped, at_finish ? 4 : 2);
    uint8_t st[8];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 0, st, 8), 0);
    ASSERT_OK(kvo_store_complete_load(kvo_connector_store(s.c), pinned, np)); /* room again */
    if (!at_finish) cr_compute(&s, &r, 64, 64);
    sim_drain(&s);
    if (!at_finish) ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 0, st, 8), 4);
    cr_finish(&s, &r);
    /* the whole prefix is stored: a new request hits all of it */
    kvo_lookup_result lr = cr_run(&s, 3, t2, 65, 64, NULL);
    ASSERT_EQ_U64(lr.tokens, 64);
    sim_destroy(&s);
}

KVO_TEST(skipped_stores_are_retried_at_the_next_update) { pressure_then_room(false); }
KVO_TEST(skipped_stores_are_retried_at_finish) { pressure_then_room(true); }

/* A skipped chunk whose blocks the engine freed is dropped, not retried
 * forever. */
KVO_TEST(skipped_store_without_blocks_is_dropped) {
    sim s;
    kvo_chunk_key pinned[64];
    size_t np = 0;
    init_pressured(&s, 12, pinned, &np);
    uint32_t t2[65];
    cr_tokens(t2, 65, 13);
    sim_req r;
    cr_add(&s, &r, 2, t2, 65, NULL);
    cr_compute(&s, &r, 32, 32);
    sim_drain(&s);
    ASSERT_OK(kvo_store_complete_load(kvo_connector_store(s.c), pinned, np));
    sim_free_block(&s, 0, r.tab[0][0]); /* chunk 0's block gone */
    r.tab[0][0] = KVO_NO_BLOCK;
    cr_compute(&s, &r, 64, 32);
    sim_drain(&s);
    uint8_t st[8];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 0, st, 8), 3);
    ASSERT_EQ_INT(st[0], 0);
    kvo__req *q = kvo__conn_req_get(s.c, 2);
    ASSERT_EQ_U64(q->n_retry, 0);
    cr_finish(&s, &r);
    sim_destroy(&s);
}

/* With a state group, sliding chunks are kept only before reachable
 * boundaries (multiples of the state block), and hits stay the same. */
KVO_TEST(reachable_sliding_store_keeps_only_usable_chunks) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 1, true, false},
                      {"swa", KVO_GROUP_SLIDING, 16, 16, 1, true, false},
                      {"state", KVO_GROUP_STATE, 64, 0, 1, true, false}};
    uint32_t tok[300];
    cr_tokens(tok, 300, 14);
    size_t kept[2];
    uint64_t hit[2];
    for (int pol = 0; pol < 2; pol++) {
        kvo_connector_params cp = kvo_connector_default_params();
        ASSERT_EQ_INT(cp.sliding_store, KVO_SLIDING_STORE_REACHABLE);
        if (pol) cp.sliding_store = KVO_SLIDING_STORE_ALL;
        sim s;
        sim_init(&s, sim_plan("reach", 16, gs, 3), &cp, 128);
        sim_req a;
        cr_add(&s, &a, 1, tok, 256, NULL);
        cr_compute(&s, &a, 256, 32);
        sim_drain(&s);
        uint8_t st[16];
        kept[pol] = cr_ready_chunks(&s, 1, 1, st, 16);
        if (!pol)
            for (int ch = 0; ch < 16; ch++) ASSERT_EQ_INT(st[ch], ch % 4 == 3); /* [48,64), [112,128), ... */
        cr_finish(&s, &a);
        hit[pol] = cr_run(&s, 2, tok, 300, 50, NULL).tokens;
        sim_destroy(&s);
    }
    ASSERT_EQ_U64(kept[0], 4);
    ASSERT_EQ_U64(kept[1], 16);
    ASSERT_EQ_U64(hit[0], 256);
    ASSERT_EQ_U64(hit[1], 256);
}

KVO_TEST(complete_store_of_ready_keys_is_a_noop) {
    sim s;
    sim_init(&s, plan_one(), NULL, 16);
    kvo_store *st = kvo_connector_store(s.c);
    kvo_chunk_key k[2];
    memset(k, 0, sizeof k);
    k[0].group = 0;
    k[0].hash.lo = 1;
    k[1].group = 0;
    k[1].hash.lo = 2;
    uint8_t need[2];
    kvo_slot sl[2];
    ASSERT_OK(kvo_store_prepare_store(st, k, 1, need, sl, NULL, NULL, 0, NULL));
    ASSERT_OK(kvo_store_complete_store(st, k, 1, true));
    ASSERT_OK(kvo_store_complete_store(st, k, 1, true));  /* READY: no-op */
    ASSERT_OK(kvo_store_complete_store(st, k, 1, false)); /* not removed either */
    kvo_store_entry e;
    ASSERT_OK(kvo_store_peek(st, &k[0], &e));
    ASSERT_EQ_INT(e.state, KVO_READY);
    /* a READY key beside a PENDING one: the PENDING one completes */
    ASSERT_OK(kvo_store_prepare_store(st, &k[1], 1, need, sl, NULL, NULL, 0, NULL));
    ASSERT_OK(kvo_store_complete_store(st, k, 2, true));
    ASSERT_OK(kvo_store_peek(st, &k[1], &e));
    ASSERT_EQ_INT(e.state, KVO_READY);
    kvo_chunk_key absent = k[0];
    absent.hash.lo = 3;
    ASSERT_ERR(kvo_store_complete_store(st, &absent, 1, true), KVO_ESTATE);
    sim_destroy(&s);
}

KVO_TEST(max_load_and_max_hit_tokens_cap_the_hit) {
    uint32_t tok[256];
    cr_tokens(tok, 256, 15);
    for (int which = 0; which < 2; which++) {
        kvo_connector_params cp = kvo_connector_default_params();
        if (which) cp.max_hit_tokens = 70;
        sim s;
        sim_init(&s, plan_one(), &cp, 64);
        (void)cr_run(&s, 1, tok, 256, 64, NULL);
        kvo_request_desc d = KVO_REQUEST_DESC_INIT;
        if (!which) d.max_load_tokens = 100;
        kvo_lookup_result lr = cr_run(&s, 2, tok, 256, 64, &d);
        ASSERT_EQ_U64(lr.tokens, which ? 70 : 100);
        /* a cap below a chunk still gives the capped hit */
        d.max_load_tokens = 5;
        lr = cr_run(&s, 3, tok, 256, 64, &d);
        ASSERT_EQ_U64(lr.tokens, 5);
        /* local 48 + 100 */
        d.max_load_tokens = which ? 0 : 100;
        sim_req r;
        cr_add(&s, &r, 4, tok, 256, &d);
        lr = cr_lookup_load(&s, &r, 48);
        ASSERT_EQ_U64(lr.tokens, which ? 70 : 148);
        cr_compute(&s, &r, 256, 64);
        cr_finish(&s, &r);
        sim_destroy(&s);
    }
}

KVO_TEST(max_offload_tokens_and_prompt_only_limit_stores) {
    sim s;
    sim_init(&s, plan_one(), NULL, 128);
    uint32_t tok[256];
    cr_tokens(tok, 256, 16);
    kvo_request_desc d = KVO_REQUEST_DESC_INIT;
    d.max_offload_tokens = 100;
    sim_req r;
    cr_add(&s, &r, 1, tok, 256, &d);
    cr_compute(&s, &r, 256, 64);
    sim_drain(&s);
    uint8_t st[16];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 1, 0, st, 16), 6); /* chunks ending at or before 100 */
    cr_finish(&s, &r);
    /* prompt only: a 64-token prompt, 64 generated tokens */
    uint32_t t2[128];
    cr_tokens(t2, 128, 17);
    d.max_offload_tokens = 0;
    d.offload_prompt_only = true;
    cr_add(&s, &r, 2, t2, 64, &d);
    cr_compute(&s, &r, 64, 64);
    ASSERT_OK(kvo_connector_append_tokens(s.c, 2, t2 + 64, 64));
    sim_req_tokens(&r, t2 + 64, 64);
    cr_compute(&s, &r, 128, 16);
    sim_drain(&s);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 0, st, 16), 4);
    cr_finish(&s, &r);
    /* both: the smaller limit */
    d.max_offload_tokens = 40;
    cr_tokens(t2, 64, 20);
    cr_add(&s, &r, 3, t2, 64, &d);
    cr_compute(&s, &r, 64, 64);
    sim_drain(&s);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 3, 0, st, 16), 2);
    cr_finish(&s, &r);
    sim_destroy(&s);
}

KVO_TEST(reset_drops_everything_with_requests_in_flight) {
    sim s;
    sim_init(&s, plan_one(), NULL, 256);
    uint32_t tok[129], t2[129];
    cr_tokens(tok, 129, 18);
    cr_tokens(t2, 129, 19);
    (void)cr_run(&s, 1, tok, 129, 64, NULL);
    /* in flight: a pinned hit (2) and a request computing (3) */
    sim_req a, b;
    cr_add(&s, &a, 2, tok, 129, NULL);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 128);
    cr_add(&s, &b, 3, t2, 129, NULL);
    cr_compute(&s, &b, 64, 64);
    uint64_t removed = 0;
    ASSERT_OK(kvo_connector_reset(s.c, &removed));
    ASSERT_GT_U64(removed, 0);
    /* the pinned hit's load completes at once as canceled, nothing written */
    for (uint64_t i = 0; i < 8; i++) {
        sim_table_len(&s, &a, 0, 8);
        a.tab[0][i] = sim_alloc(&s, 0);
    }
    kvo_block_table t[1];
    sim_tables(&s, &a, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 128, t, 1));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, KVO_ECANCELED);
    ASSERT_EQ_U64(cp.tokens_valid, 0);
    ASSERT_EQ_U64(cp.n_invalid_blocks, 0);
    /* request 3 (before the reset) stores nothing more; its first chunks
     * (stored or in flight at the reset) are gone */
    cr_compute(&s, &b, 129, 64);
    sim_drain(&s);
    ASSERT_OK(kvo_connector_lookup(s.c, 3, 0, &lr)); /* an old request hits nothing */
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    uint8_t st[16];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 3, 0, st, 16), 0);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 0, st, 16), 0);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &cs));
    ASSERT_EQ_U64(cs.host.entries, 0);
    cr_finish(&s, &b);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &a);
    /* nothing hits; requests after the reset store and hit normally */
    ASSERT_EQ_U64(cr_run(&s, 4, tok, 129, 64, NULL).tokens, 0);
    ASSERT_EQ_U64(cr_run(&s, 5, tok, 129, 64, NULL).tokens, 128);
    sim_destroy(&s);
}

/* With a file tier: after a reset nothing stored before it is hit, not even
 * from files (new requests use the next epoch's namespace); files written
 * after it hit as usual. */
KVO_TEST(reset_hides_file_tier_chunks) {
    kvo_plan *p = plan_one();
    kvo_file_tier *t = tmp_tier(p);
    kvo_connector_params cp = kvo_connector_default_params();
    cp.file_tier = t;
    sim s;
    sim_init(&s, p, &cp, 256);
    s.keep_plan = true; /* the tier uses it until destroyed */
    uint32_t tok[129];
    cr_tokens(tok, 129, 21);
    (void)cr_run(&s, 1, tok, 129, 64, NULL);
    ASSERT_OK(kvo_file_tier_flush(t, -1));
    ASSERT_OK(kvo_connector_reset(s.c, NULL));
    kvo_lookup_result lr = cr_run(&s, 2, tok, 129, 64, NULL);
    ASSERT_EQ_U64(lr.tokens, 0);
    ASSERT_EQ_U64(lr.tokens_file, 0);
    ASSERT_OK(kvo_file_tier_flush(t, -1));
    /* stored after the reset: hits, from files once the host forgets */
    ASSERT_OK(kvo_connector_reset(s.c, NULL)); /* host cleared; epoch 2 */
    (void)cr_run(&s, 3, tok, 129, 64, NULL);
    ASSERT_OK(kvo_file_tier_flush(t, -1));
    (void)kvo_store_clear(kvo_connector_store(s.c));
    lr = cr_run(&s, 4, tok, 129, 64, NULL);
    ASSERT_EQ_U64(lr.tokens, 128);
    ASSERT_EQ_U64(lr.tokens_file, 128);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* Policy admission (kvo_store_params.policy_admission) lets the branch policy
 * turn chunks away from the host tier; a file or remote tier is written from
 * host slots and would never see them, so the connector sets it only when
 * the host tier is its last. */
KVO_TEST(policy_admission_only_on_a_last_host_tier) {
    kvo_plan *p = plan_one();
    kvo_file_tier *t = tmp_tier(p);
    for (int with_tier = 0; with_tier < 2; with_tier++) {
        kvo_connector_params cp = kvo_connector_default_params();
        cp.policy = KVO_POLICY_BRANCH;
        cp.file_tier = with_tier ? t : NULL;
        sim s;
        sim_init(&s, p, &cp, 64);
        s.keep_plan = true;
        ASSERT_EQ_INT(kvo_connector_store(s.c)->params.policy_admission, !with_tier);
        sim_destroy(&s);
    }
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}
