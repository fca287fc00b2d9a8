/*
 * The struct_size convention (kvo_common.h) on every params and statistics
 * struct: the defaults and the KVO_*_STATS_INIT initialisers set it; a
 * struct without it (0, as from memset) is refused by create / get_stats
 * with a message naming the initialiser; a statistics struct from an older,
 * shorter header is filled only up to its struct_size (the bytes past it are
 * left alone); a params struct cut short reads defaults past its size.
 */
#include <stdlib.h>

#include "connector_sim.h"

static kvo_plan *tiny_plan(void) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 2, true, false}};
    return sim_plan("tiny", 16, gs, 1);
}

KVO_TEST(defaults_and_initialisers_set_it) {
    ASSERT_EQ_U64(kvo_plan_default_params().struct_size, sizeof(kvo_plan_params));
    ASSERT_EQ_U64(kvo_store_default_params().struct_size, sizeof(kvo_store_params));
    ASSERT_EQ_U64(kvo_arena_default_params().struct_size, sizeof(kvo_arena_params));
    ASSERT_EQ_U64(kvo_transfer_default_params().struct_size, sizeof(kvo_transfer_params));
    ASSERT_EQ_U64(kvo_file_tier_default_params().struct_size, sizeof(kvo_file_tier_params));
    ASSERT_EQ_U64(kvo_connector_default_params().struct_size, sizeof(kvo_connector_params));
    kvo_store_stats a = KVO_STORE_STATS_INIT;
    kvo_transfer_stats b = KVO_TRANSFER_STATS_INIT;
    kvo_file_tier_stats c = KVO_FILE_TIER_STATS_INIT;
    kvo_connector_stats d = KVO_CONNECTOR_STATS_INIT;
    kvo_request_stats e = KVO_REQUEST_STATS_INIT;
    ASSERT_EQ_U64(a.struct_size, sizeof a);
    ASSERT_EQ_U64(b.struct_size, sizeof b);
    ASSERT_EQ_U64(c.struct_size, sizeof c);
    ASSERT_EQ_U64(d.struct_size, sizeof d);
    ASSERT_EQ_U64(e.struct_size, sizeof e);
}

KVO_TEST(create_refuses_a_struct_without_it) {
    kvo_plan *plan = tiny_plan();
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = plan;
    sp.capacity_bytes = 1u << 20;
    sp.struct_size = 0;
    kvo_store *st = NULL;
    ASSERT_ERR(kvo_store_create(&sp, &st), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "kvo_store_default_params");
    ASSERT_NULL(st);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.struct_size = 3;
    kvo_transfer *tr = NULL;
    ASSERT_ERR(kvo_transfer_create(&tp, &tr), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "struct_size is 3");
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = plan;
    cp.host_bytes = 4u << 20;
    cp.struct_size = 0;
    kvo_connector *c = NULL;
    ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
    kvo_plan_params pp = kvo_plan_default_params();
    pp.struct_size = 0;
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("llama-3.1-8b", &m));
    kvo_plan *p2 = NULL;
    ASSERT_ERR(kvo_plan_create(m, &pp, &p2), KVO_EINVAL);
    ASSERT_OK(kvo_plan_create(m, NULL, &p2)); /* NULL: the defaults */
    kvo_plan_destroy(p2);
    kvo_model_destroy(m);
    kvo_arena_params ap = kvo_arena_default_params();
    ap.struct_size = 0;
    kvo_arena *ar = NULL;
    ASSERT_ERR(kvo_arena_create(&ap, &ar), KVO_EINVAL);
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    fp.struct_size = 0;
    kvo_file_tier *ft = NULL;
    ASSERT_ERR(kvo_file_tier_create(&fp, &ft), KVO_EINVAL);
    kvo_plan_destroy(plan);
}

/* kvo_request_desc: the initialiser sets it; 0, or a size short of the
 * first layout, is refused naming the initialiser. */
KVO_TEST(request_desc_follows_it) {
    kvo_request_desc d0 = KVO_REQUEST_DESC_INIT;
    ASSERT_EQ_U64(d0.struct_size, sizeof d0);
    kvo_plan *plan = tiny_plan();
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = plan;
    cp.host_bytes = 4u << 20;
    kvo_connector *c = NULL;
    ASSERT_OK(kvo_connector_create(&cp, &c));
    uint32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint32_t)i;
    kvo_request_desc d = {.id = 1, .tokens = tok, .n_tokens = 64}; /* struct_size 0 */
    ASSERT_ERR(kvo_connector_add_request(c, &d), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_REQUEST_DESC_INIT");
    d.struct_size = offsetof(kvo_request_desc, offload_prompt_only); /* short of the first layout */
    ASSERT_ERR(kvo_connector_add_request(c, &d), KVO_EINVAL);
    d.struct_size = sizeof d;
    ASSERT_OK(kvo_connector_add_request(c, &d));
    kvo_connector_destroy(c);
    kvo_plan_destroy(plan);
}

/* A params struct exactly as long as the first layout works. */
KVO_TEST(create_accepts_the_full_struct) {
    kvo_plan *plan = tiny_plan();
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = plan;
    sp.capacity_bytes = 1u << 20;
    kvo_store *st = NULL;
    ASSERT_OK(kvo_store_create(&sp, &st));
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(st, &ss));
    ASSERT_EQ_U64(ss.capacity_bytes, 1u << 20);
    ASSERT_EQ_U64(ss.struct_size, sizeof ss);
    kvo_store_destroy(st);
    kvo_plan_destroy(plan);
}

KVO_TEST(get_stats_checks_and_fills_only_struct_size_bytes) {
    sim s;
    sim_init(&s, tiny_plan(), NULL, 64);
    /* without struct_size: refused, untouched */
    kvo_connector_stats cs;
    memset(&cs, 0xAB, sizeof cs);
    cs.struct_size = 0;
    ASSERT_ERR(kvo_connector_get_stats(s.c, &cs), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_CONNECTOR_STATS_INIT");
    ASSERT_EQ_U64(cs.requests_added, UINT64_C(0xABABABABABABABAB));
    /* whole: filled */
    kvo_connector_stats full = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &full));
    ASSERT_EQ_U64(full.host.capacity_bytes, 8u << 20);
    ASSERT_EQ_U64(full.struct_size, sizeof full);
    /* a struct from a (hypothetical) newer header, longer than this
     * library's: filled up to this library's size, the tail untouched */
    struct {
        kvo_transfer_stats st;
        uint64_t newer_field;
    } big;
    memset(&big, 0xCD, sizeof big);
    big.st.struct_size = sizeof big;
    ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &big.st));
    ASSERT_EQ_U64(big.st.jobs_submitted, 0);
    ASSERT_EQ_U64(big.newer_field, UINT64_C(0xCDCDCDCDCDCDCDCD));
    ASSERT_EQ_U64(big.st.struct_size, sizeof big);
    /* request stats: the same check */
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 7, .tokens = (uint32_t[]){1, 2, 3}, .n_tokens = 3}));
    kvo_request_stats rs;
    memset(&rs, 0, sizeof rs);
    ASSERT_ERR(kvo_connector_request_stats(s.c, 7, &rs), KVO_EINVAL);
    kvo_request_stats rs2 = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 7, &rs2));
    ASSERT_EQ_U64(rs2.prompt_tokens, 3);
    ASSERT_OK(kvo_connector_abort(s.c, 7));
    sim_destroy(&s);
}
