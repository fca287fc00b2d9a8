/*
 * The sliding_store CHECKPOINTS policy: it stores far fewer sliding-window
 * chunks than ALL and still hits, and with checkpoint_interval a prompt
 * that diverges mid-way from a stored one hits at the last checkpoint
 * before the divergence.
 */
#include "connector_fixture.h"

KVO_TEST(checkpoint_policy_stores_fewer_sliding_chunks_and_still_hits) {
    uint64_t stored[3];
    for (int pol = 0; pol < 3; pol++) {
        sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, true, false},
                          {"swa", KVO_GROUP_SLIDING, 16, 32, 1, true, false}};
        kvo_connector_params cp = kvo_connector_default_params();
        cp.sliding_store = pol ? KVO_SLIDING_STORE_CHECKPOINTS : KVO_SLIDING_STORE_ALL;
        cp.checkpoint_interval = pol == 2 ? 128 : 0; /* plus a window every 128 tokens */
        sim s;
        sim_init(&s, sim_plan("ck", 16, gs, 2), &cp, 1024);
        conv_opts o = {3, 800, 200, 30, 0, pol == 0};
        uint64_t hit = run_conversation(&s, 10, &o);
        ASSERT_GT_U64(hit, 0);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        stored[pol] = st.host.groups[1].chunks;
        sim_destroy(&s);
    }
    ASSERT_LT_U64(stored[1] * 2, stored[0]);
    ASSERT_LT_U64(stored[1], stored[2]);
    ASSERT_LT_U64(stored[2], stored[0]);
}

/* Periodic checkpoints serve a prompt that diverges mid-way from a stored one:
 * with windows kept every 128 tokens the hit lands on the last checkpoint
 * before the divergence; with only end-of-prompt checkpoints nothing hits. */
KVO_TEST(checkpoint_interval_serves_divergent_prompts) {
    for (int with_interval = 0; with_interval < 2; with_interval++) {
        sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, true, false},
                          {"swa", KVO_GROUP_SLIDING, 16, 32, 1, true, false}};
        kvo_connector_params cp = kvo_connector_default_params();
        cp.sliding_store = KVO_SLIDING_STORE_CHECKPOINTS;
        cp.checkpoint_interval = with_interval ? 128 : 0;
        sim s;
        sim_init(&s, sim_plan("ckdiv", 16, gs, 2), &cp, 1024);
        uint32_t tok[800], tok2[600];
        fill_tokens(tok, 800, 30);
        memcpy(tok2, tok, 500 * sizeof *tok);
        fill_tokens(tok2 + 500, 100, 31);
        sim_req a;
        prefill(&s, &a, 1, tok, 800, true);
        kvo_block_table t[SIM_MAXG];
        sim_tables(&s, &a, t);
        bool busy;
        ASSERT_OK(kvo_connector_finish(s.c, 1, 800, t, 2, &busy));
        if (busy) (void)sim_wait_completion(&s, 1, KVO_COMPLETION_RELEASED);
        sim_req_free(&s, &a);
        ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok2, .n_tokens = 600}));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
        ASSERT_EQ_U64(lr.tokens, with_interval ? 384 : 0);
        ASSERT_OK(kvo_connector_abort(s.c, 2));
        sim_destroy(&s);
    }
}
