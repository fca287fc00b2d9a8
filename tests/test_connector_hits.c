/*
 * Issue 11's hit examples through the real connector (lookup, load, the
 * simulated engine's bytes), not only through kvo_agree: every example
 * gives at least vLLM's hit, and every loaded block (including a last block
 * that is only partly below the hit) holds exactly the engine's bytes.
 * docs/lookup.md has the before/after table these tests back.
 */
#include <time.h>
#include <unistd.h>

#include "connector_rules_util.h"
#include "kvoffload/kvo_remote_tier.h"

/* Two full groups, 12- and 16-token blocks, one block per chunk. */
static kvo_plan *plan_12_16(void) {
    sim_group gs[] = {{"a12", KVO_GROUP_FULL, 12, 0, 1, true, false}, {"b16", KVO_GROUP_FULL, 16, 0, 1, true, false}};
    return sim_plan("m12-16", 4, gs, 2);
}

KVO_TEST(vllm_12_16_prompt_48_all_stored) {
    sim s;
    sim_init(&s, plan_12_16(), NULL, 64);
    ASSERT_EQ_U64(kvo_connector_step(s.c), 48); /* the old rule's only candidate, 48, is not below 48 */
    uint32_t tok[48];
    cr_tokens(tok, 48, 1);
    sim_req r;
    kvo_lookup_result lr = cr_stored_then_load(&s, tok, 48, 5, 0, &r);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 47); /* vLLM: 47 */
    ASSERT_EQ_U64(lr.tokens_host, 47);
    /* the engine recomputes token 47 over the tail of each last block */
    cr_compute(&s, &r, 48, 1);
    for (size_t g = 0; g < 2; g++)
        for (uint64_t i = 0; i < r.tn[g]; i++) ASSERT_TRUE(sim_block_ok(&s, &r, g, i));
    cr_finish(&s, &r);
    sim_destroy(&s);
}

KVO_TEST(vllm_12_16_prompt_85_local_48) {
    sim s;
    sim_init(&s, plan_12_16(), NULL, 64);
    uint32_t tok[85];
    cr_tokens(tok, 85, 2);
    sim_req r;
    kvo_lookup_result lr = cr_stored_then_load(&s, tok, 85, 7, 48, &r);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 80); /* vLLM: 80; the step rule: 48 */
    ASSERT_EQ_U64(lr.local_tokens, 48);
    cr_compute(&s, &r, 85, 5);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.tokens_loaded, 32);
    cr_finish(&s, &r);
    sim_destroy(&s);
}

/* Full groups with 512- and 1024-token chunks and a sliding group (64-token
 * blocks, window 128); a 5000-token prompt whose sliding chunks were evicted
 * except the windows before 3904 and 3968 (not multiples of 1024). */
KVO_TEST(vllm_three_groups_at_3904_3968) {
    sim_group gs[] = {{"f512", KVO_GROUP_FULL, 512, 0, 1, true, false},
                      {"f1024", KVO_GROUP_FULL, 1024, 0, 1, true, false},
                      {"swa", KVO_GROUP_SLIDING, 64, 128, 1, true, false}};
    sim s;
    sim_init(&s, sim_plan("three", 64, gs, 3), NULL, 256);
    ASSERT_EQ_U64(kvo_connector_step(s.c), 1024);
    enum { N = 5000 };
    uint32_t *tok = malloc(N * sizeof *tok);
    cr_tokens(tok, N, 3);
    sim_req a;
    cr_add(&s, &a, 1, tok, N, NULL);
    cr_compute(&s, &a, N, 500);
    sim_drain(&s);
    uint8_t st[128];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 1, 2, st, sizeof st), N / 64); /* every sliding chunk stored */
    for (uint64_t ch = 0; ch < N / 64; ch++)
        if (ch < 59 || ch > 61) cr_remove_chunk(&s, 1, 2, ch); /* keep [3776, 3968) */
    cr_finish(&s, &a);
    sim_req r;
    cr_add(&s, &r, 2, tok, N, NULL);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 3968); /* the step rule: no hit */
    ASSERT_EQ_INT(lr.limiting_group, 2);
    ASSERT_OK(kvo_connector_load(s.c, 2, 0, NULL, 0)); /* decline: unpins */
    /* only the window before 3904 left */
    sim_req keep;
    cr_add(&s, &keep, 3, tok, N, NULL);
    cr_remove_chunk(&s, 3, 2, 61);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &keep);
    lr = cr_lookup_load(&s, &r, 0);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 3904);
    cr_compute(&s, &r, N, 700);
    cr_finish(&s, &r);
    free(tok);
    sim_destroy(&s);
}

KVO_TEST(one_group_prompt_256_hits_255) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, true, false}};
    sim s;
    sim_init(&s, sim_plan("one", 16, gs, 1), NULL, 64);
    uint32_t tok[256];
    cr_tokens(tok, 256, 4);
    (void)cr_run(&s, 1, tok, 256, 64, NULL);
    kvo_lookup_result lr = cr_run(&s, 2, tok, 256, 64, NULL);
    ASSERT_EQ_U64(lr.tokens, 255); /* vLLM 255; the step rule 240 */
    sim_destroy(&s);
}

/* vLLM's Mamba-hybrid case: 4-token attention blocks, 16-token state
 * blocks, a previous request of 28 tokens, a 40-token prompt sharing them.
 * The previous request hands the state at the end of its prompt (28, not a
 * block boundary) to kvo_connector_store_snapshot when `snapshot`; the new
 * request's lookup returns the hit.  With ft, a file tier (write-through)
 * behind the host tier, which forgets everything before the lookup: the hit
 * comes from files, the snapshot's too (*ft: the tier); with rt the same
 * with the remote tier of KVO_TEST_REDIS (skipped without it).  s->plan is
 * then the caller's to destroy after the tier.  restart >= 0 (with a tier):
 * instead of clearing the host tier, a new connector (a restarted process)
 * does the lookup, with snapshot_groups = restart. */
static kvo_lookup_result mamba_run(sim *s, const uint32_t *tok, bool snapshot, kvo_file_tier **ft,
                                   kvo_remote_tier **rt, int restart) {
    sim_group gs[] = {{"attn", KVO_GROUP_FULL, 4, 0, 1, true, false}, {"mamba", KVO_GROUP_STATE, 16, 0, 1, true, false}};
    kvo_connector_params cp = kvo_connector_default_params();
    cp.min_hit_tokens = 4;
    kvo_plan *plan = sim_plan("mamba", 4, gs, 2);
    if (ft) {
        char root[1024];
        snprintf(root, sizeof root, "%s/snapfiles", kvo_test_tmpdir());
        kvo_file_tier_params fp = kvo_file_tier_default_params();
        fp.root = root;
        fp.plan = plan;
        fp.quota_bytes = 16ull << 20;
        fp.log_interval_s = 3600;
        ASSERT_OK(kvo_file_tier_create(&fp, ft));
        cp.file_tier = *ft;
        cp.file_mode = KVO_FILE_WRITE_THROUGH;
        cp.verify_checksums = true;
    }
    if (rt) {
        const char *seed = getenv("KVO_TEST_REDIS");
        if (!seed || !seed[0]) {
            kvo_plan_destroy(plan);
            SKIP("KVO_TEST_REDIS not set (tools/test.sh starts a cluster)");
        }
        char url[160], pfx[64];
        snprintf(url, sizeof url, "redis://%s", seed);
        snprintf(pfx, sizeof pfx, "snap%ld-%llu", (long)getpid(), (unsigned long long)kvo_test_seed());
        kvo_remote_tier_params rp = kvo_remote_tier_default_params();
        rp.url = url;
        rp.plan = plan;
        rp.key_prefix = pfx;
        rp.io_threads = 2;
        ASSERT_OK(kvo_remote_tier_create(&rp, rt));
        cp.remote_tier = *rt;
        cp.verify_checksums = true;
        cp.remote_lookup_budget_us = 5000000; /* lookups wait for the cluster's answers */
    }
    sim_init(s, plan, &cp, 64);
    s->keep_plan = ft || rt;
    sim_req a;
    cr_add(s, &a, 1, tok, 28, NULL);
    cr_compute(s, &a, 28, 4);
    uint64_t spare = sim_alloc(s, 1);
    if (snapshot) {
        /* the engine's state after 28 tokens, in a block of its own */
        uint8_t buf[4096];
        ASSERT_LE_U64(s->page[1], sizeof buf);
        for (uint32_t l = 0; l < s->layers[1]; l++) {
            sim_pattern(tok, 28, 1, l, 0, buf, s->page[1]);
            memcpy(sim_page(s, 1, l, spare), buf, s->page[1]);
        }
        ASSERT_ERR(kvo_connector_store_snapshot(s->c, 1, 0, 28, spare), KVO_EINVAL); /* not a state group */
        ASSERT_ERR(kvo_connector_store_snapshot(s->c, 1, 1, 30, spare), KVO_EINVAL); /* not a unit end */
        ASSERT_ERR(kvo_connector_store_snapshot(s->c, 1, 1, 32, spare), KVO_EINVAL); /* beyond the units */
        ASSERT_OK(kvo_connector_store_snapshot(s->c, 1, 1, 28, spare));
    }
    cr_finish(s, &a);
    sim_free_block(s, 1, spare);
    if (ft) ASSERT_OK(kvo_file_tier_flush(*ft, -1));
    if (rt) ASSERT_OK(kvo_remote_tier_flush(*rt, KVO_MS(20000)));
    if ((ft || rt) && restart >= 0) {
        sim_destroy(s);
        cp.snapshot_groups = (uint64_t)restart;
        sim_init(s, plan, &cp, 64);
        s->keep_plan = true;
    } else if (ft || rt) {
        kvo_store_clear(kvo_connector_store(s->c)); /* only the lower tier remembers */
    }
    sim_req r;
    cr_add(s, &r, 2, tok, 40, NULL);
    kvo_lookup_result lr;
    for (int i = 0; i < 20000; i++) { /* remote: PENDING while presence answers are out */
        ASSERT_OK(kvo_connector_lookup(s->c, 2, 0, &lr));
        if (lr.status != KVO_HIT_PENDING) break;
        (void)kvo_connector_poll(s->c, NULL, 0, &(size_t){0});
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    if (ft || rt) ASSERT_EQ_U64(lr.tokens_host, 0);
    uint64_t b = lr.tokens;
    for (size_t g = 0; g < 2; g++) {
        uint64_t tpb = g ? 16 : 4, nb = (b + tpb - 1) / tpb;
        sim_table_len(s, &r, g, (size_t)nb);
        for (uint64_t i = 0; i < nb; i++) r.tab[g][i] = sim_alloc(s, g);
    }
    kvo_block_table t[2];
    sim_tables(s, &r, t);
    ASSERT_OK(kvo_connector_load(s->c, 2, b, t, 2));
    kvo_completion c = sim_wait_completion(s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(c.status, 0);
    ASSERT_EQ_U64(c.tokens_valid, b);
    for (uint64_t i = 0; i < b / 4; i++) ASSERT_TRUE(sim_block_ok(s, &r, 0, i));
    /* the state at b, byte-exact, in the entry of the block holding b - 1 */
    uint8_t want[4096];
    for (uint32_t l = 0; l < s->layers[1]; l++) {
        sim_pattern(tok, b, 1, l, 0, want, s->page[1]);
        ASSERT_TRUE(memcmp(sim_page(s, 1, l, r.tab[1][(b - 1) / 16]), want, s->page[1]) == 0);
    }
    /* the engine goes on from b (the state block fully computed at 32) */
    r.computed = b;
    cr_compute(s, &r, 40, 4);
    ASSERT_TRUE(sim_block_ok(s, &r, 1, 1));
    cr_finish(s, &r);
    return lr;
}

KVO_TEST(mamba_hybrid_snapshot_at_28) {
    uint32_t tok[40];
    cr_tokens(tok, 40, 5);
    sim s;
    kvo_lookup_result lr = mamba_run(&s, tok, true, NULL, NULL, -1);
    ASSERT_EQ_U64(lr.tokens, 28); /* vLLM: 28 */
    sim_destroy(&s);
}

/* The snapshot case through a lower tier, the host tier empty at the
 * lookup (remote: false = files, true = the cluster): the snapshot at 28
 * was written through with the chunks, the lookup still hits 28 from that
 * tier (it used to stop at the block boundary, 16: snapshots were looked up
 * in the host store only), and the load reads the snapshot from there. */
static void mamba_snapshot_from_tier(bool remote) {
    uint32_t tok[40];
    cr_tokens(tok, 40, remote ? 6 : 5);
    sim s;
    kvo_file_tier *ft = NULL;
    kvo_remote_tier *rt = NULL;
    kvo_lookup_result lr = mamba_run(&s, tok, true, remote ? NULL : &ft, remote ? &rt : NULL, -1);
    ASSERT_EQ_U64(lr.tokens, 28);
    ASSERT_EQ_U64(remote ? lr.tokens_remote : lr.tokens_file, 28);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(remote ? st.remote_reads : st.file_reads, 7); /* 7 attention chunks and the snapshot */
    kvo_plan *plan = s.plan;
    sim_destroy(&s);
    kvo_file_tier_destroy(ft);
    kvo_remote_tier_destroy(rt);
    kvo_plan_destroy(plan);
}

KVO_TEST(mamba_hybrid_snapshot_from_files) { mamba_snapshot_from_tier(false); }
/* The cluster answers presence like for chunks (lookups PENDING meanwhile). */
KVO_TEST(mamba_hybrid_snapshot_from_remote) { mamba_snapshot_from_tier(true); }

/* A restarted process (a new connector on yesterday's files) knows of no
 * snapshot until it stores one: by default its lookups do not ask for them
 * (16, the block boundary); snapshot_groups says the tiers hold some (28).
 * A mask naming a group that is not an offloaded state group is refused. */
KVO_TEST(mamba_hybrid_snapshot_after_restart) {
    for (int told = 0; told < 2; told++) {
        uint32_t tok[40];
        cr_tokens(tok, 40, 7 + (uint64_t)told); /* other prompts: the first round's files stay */
        sim s;
        kvo_file_tier *ft = NULL;
        kvo_lookup_result lr = mamba_run(&s, tok, true, &ft, NULL, told ? 2 : 0);
        ASSERT_EQ_U64(lr.tokens, (uint64_t)(told ? 28 : 16));
        ASSERT_EQ_U64(lr.tokens_file, lr.tokens);
        kvo_plan *plan = s.plan;
        if (told) {
            kvo_connector_params cp = kvo_connector_default_params();
            cp.plan = plan;
            cp.host_bytes = 1u << 20;
            cp.snapshot_groups = 1; /* the attention group */
            kvo_connector *c = NULL;
            ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
            ASSERT_CONTAINS(kvo_last_error(), "'attn'");
            cp.snapshot_groups = 4; /* beyond the plan */
            ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
        }
        sim_destroy(&s);
        kvo_file_tier_destroy(ft);
        kvo_plan_destroy(plan);
    }
}

KVO_TEST(mamba_hybrid_block_snapshots_only) {
    uint32_t tok[40];
    cr_tokens(tok, 40, 5);
    sim s;
    kvo_lookup_result lr = mamba_run(&s, tok, false, NULL, NULL, -1);
    ASSERT_EQ_U64(lr.tokens, 16); /* no snapshot at 28: the block boundary */
    sim_destroy(&s);
}

/* A snapshot key never equals a chunk key: the chunk key at the same
 * position (a 16-token state block ending at 16) stays a different entry. */
KVO_TEST(snapshot_key_differs_from_chunk_key) {
    uint32_t tok[40];
    cr_tokens(tok, 40, 9);
    sim s;
    (void)mamba_run(&s, tok, false, NULL, NULL, -1);
    sim_req a;
    cr_add(&s, &a, 3, tok, 40, NULL);
    cr_compute(&s, &a, 16, 4);
    uint8_t st[4];
    (void)cr_ready_chunks(&s, 3, 1, st, 4);
    ASSERT_TRUE(st[0]); /* the state block ending at 16 is stored */
    kvo_store_stats s0 = KVO_STORE_STATS_INIT, s1 = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(kvo_connector_store(s.c), &s0));
    uint64_t spare = sim_alloc(&s, 1);
    ASSERT_OK(kvo_connector_store_snapshot(s.c, 3, 1, 16, spare));
    ASSERT_OK(kvo_connector_wait_request(s.c, 3));
    ASSERT_OK(kvo_store_get_stats(kvo_connector_store(s.c), &s1));
    ASSERT_EQ_U64(s1.stores, s0.stores + 1); /* a new entry, not "present" */
    ASSERT_EQ_U64(s1.store_skipped_present, s0.store_skipped_present);
    cr_finish(&s, &a);
    sim_free_block(&s, 1, spare);
    sim_destroy(&s);
}

/* A draft (EAGLE / MTP) group next to a full group: a hit needs the draft
 * chunk holding token b, and the load still writes only blocks below b.
 * While a request decodes, a draft chunk is stored only once a token
 * beyond it is computed; finish stores the last one (as vLLM does). */
KVO_TEST(draft_group_needs_the_chunk_of_token_b) {
    sim_group gs[] = {{"target", KVO_GROUP_FULL, 16, 0, 1, true, false},
                      {"draft", KVO_GROUP_FULL, 16, 0, 1, true, true}};
    sim s;
    sim_init(&s, sim_plan("eagle", 16, gs, 2), NULL, 64);
    uint32_t tok[80];
    cr_tokens(tok, 80, 6);
    sim_req a;
    cr_add(&s, &a, 1, tok, 64, NULL);
    cr_compute(&s, &a, 64, 16);
    sim_drain(&s);
    uint8_t st[8];
    ASSERT_EQ_U64(cr_ready_chunks(&s, 1, 0, st, 8), 4);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 1, 1, st, 8), 3); /* [48, 64) waits for token 64 */
    cr_finish(&s, &a);
    sim_req b;
    cr_add(&s, &b, 2, tok, 80, NULL);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 2, 1, st, 8), 4); /* stored at finish */
    kvo_lookup_result lr = cr_lookup_load(&s, &b, 0);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    /* 64 would need draft chunk 4 (token 64); vLLM: 48 (drops the last
     * draft block) */
    ASSERT_EQ_U64(lr.tokens, 63);
    ASSERT_EQ_INT(lr.limiting_group, 1);
    cr_compute(&s, &b, 80, 1);
    cr_finish(&s, &b);
    /* decoding one token at a time */
    uint32_t t2[80];
    cr_tokens(t2, 80, 7);
    sim_req c;
    cr_add(&s, &c, 3, t2, 80, NULL);
    cr_compute(&s, &c, 64, 16);
    sim_drain(&s);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 3, 1, st, 8), 3);
    cr_compute(&s, &c, 65, 1);
    sim_drain(&s);
    ASSERT_EQ_U64(cr_ready_chunks(&s, 3, 1, st, 8), 4);
    cr_finish(&s, &c);
    sim_destroy(&s);
}

/* A hit inside a block: the tables must hold the block holding token b - 1
 * (ceil(b / tpb) entries); one entry short is refused, nothing issued. */
KVO_TEST(load_needs_the_partly_valid_last_block) {
    sim s;
    sim_init(&s, plan_12_16(), NULL, 64);
    uint32_t tok[48];
    cr_tokens(tok, 48, 8);
    (void)cr_run(&s, 1, tok, 48, 48, NULL);
    sim_req r;
    cr_add(&s, &r, 2, tok, 48, NULL);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 47);
    sim_table_len(&s, &r, 0, 3); /* 47 tokens of 12-token blocks need 4 */
    sim_table_len(&s, &r, 1, 3);
    for (size_t g = 0; g < 2; g++)
        for (size_t i = 0; i < 3; i++) r.tab[g][i] = sim_alloc(&s, g);
    kvo_block_table t[2];
    sim_tables(&s, &r, t);
    ASSERT_ERR(kvo_connector_load(s.c, 2, 47, t, 2), KVO_EINVAL);
    ASSERT_NOT_NULL(strstr(kvo_last_error(), "a12"));
    sim_table_len(&s, &r, 0, 4);
    r.tab[0][3] = sim_alloc(&s, 0);
    sim_tables(&s, &r, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 47, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_TRUE(sim_block_ok(&s, &r, 0, 3)); /* whole block, tail included */
    r.computed = 47;
    cr_compute(&s, &r, 48, 1);
    cr_finish(&s, &r);
    sim_destroy(&s);
}
