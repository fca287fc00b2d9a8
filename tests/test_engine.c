/* The reference engine alone: determinism regardless of batch composition
 * and step split, engine prefix-cache reuse and recompute after eviction give
 * bit-identical tokens and logits, for every shape. */
#include "engine_test.h"

static kvo_eng_result *run(kvo_eng *e, const kvo_eng_workload *w, const kvo_eng_run_params *p) {
    kvo_eng_result *res = calloc(w->n, sizeof *res);
    ASSERT_NOT_NULL(res);
    ENG_OK(kvo_eng_run(e, w->reqs, w->n, p, res));
    return res;
}

static uint64_t sum_local(const kvo_eng_result *r, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += r[i].tokens_local;
    return s;
}

/* Shapes: every preset, baseline (no reuse, one request at a time) vs
 * prefix cache with batching, vs forced eviction after every request. */
static void check_shape_w(const char *shape, uint32_t tptb) {
    kvo_eng_workload *w = mk_workload(10, tptb);
    kvo_eng *e = mk_engine(shape, 1024);
    kvo_eng_run_params base = kvo_eng_run_default_params();
    base.prefix_cache = false;
    base.max_running = 1;
    base.prefill_chunk = 1000;
    kvo_eng_result *a = run(e, w, &base);
    ASSERT_EQ_U64(sum_local(a, w->n), 0);

    kvo_eng_destroy(e);
    e = mk_engine(shape, 1024);
    kvo_eng_run_params cached = kvo_eng_run_default_params();
    cached.max_running = 3;
    cached.prefill_chunk = 13; /* odd steps: chunks cross block boundaries */
    kvo_eng_result *b = run(e, w, &cached);
    assert_same(a, b, w->n);
    ASSERT_GT_U64(sum_local(b, w->n), 0); /* multi-turn prefixes were reused */

    kvo_eng_run_params evict = cached;
    evict.evict_every = 1;
    evict.max_running = 1;
    kvo_eng_evict_cached(e); /* blocks left from the previous run */
    kvo_eng_result *c = run(e, w, &evict);
    assert_same(a, c, w->n);
    ASSERT_EQ_U64(sum_local(c, w->n), 0); /* everything recomputed after eviction */

    drop(a, w->n);
    drop(b, w->n);
    drop(c, w->n);
    kvo_eng_destroy(e);
    kvo_eng_workload_free(w);
}

static void check_shape(const char *shape) { check_shape_w(shape, 6); }

KVO_TEST(single_exact) { check_shape("single"); }
KVO_TEST(hybrid_exact) { check_shape("hybrid"); }
KVO_TEST(hybrid_state_exact) { check_shape("hybrid-state"); }
KVO_TEST(tiny_blocks_exact) { check_shape("tiny-blocks"); }
/* 12/16/20-token blocks: local hits only at multiples of 240, so longer
 * trace blocks (prompts up to 960 tokens) */
KVO_TEST(coprime_exact) { check_shape_w("coprime", 20); }
KVO_TEST(coprime_state_exact) { check_shape_w("coprime-state", 20); }

/* A tight budget: cached blocks are evicted under pressure by allocation,
 * outputs stay identical. */
KVO_TEST(pressure_evicts) {
    kvo_eng_workload *w = mk_workload(10, 6);
    kvo_eng *e = mk_engine("hybrid-state", 1024);
    kvo_eng_run_params base = kvo_eng_run_default_params();
    base.prefix_cache = false;
    kvo_eng_result *a = run(e, w, &base);
    kvo_eng_destroy(e);
    /* just enough for the longest request */
    e = mk_engine("hybrid-state", ((w->max_prompt + w->max_new) / 64 + 2) * 64);
    kvo_eng_run_params p = kvo_eng_run_default_params();
    kvo_eng_result *b = run(e, w, &p);
    assert_same(a, b, w->n);
    kvo_eng_stats st;
    kvo_eng_get_stats(e, &st);
    ASSERT_GT_U64(st.block_evictions, 0);
    drop(a, w->n);
    drop(b, w->n);
    kvo_eng_destroy(e);
    kvo_eng_workload_free(w);
}

/* The engine describes itself to the library: model groups with page bytes,
 * one segment per layer, and a chunk plan over it. */
KVO_TEST(model_and_segments) {
    kvo_eng *e = mk_engine("hybrid-state", 1024);
    const kvo_model *m = kvo_eng_model(e);
    ASSERT_EQ_U64(kvo_model_num_groups(m), 3);
    const kvo_group_desc *g2 = kvo_model_group(m, 2);
    ASSERT_EQ_INT(g2->kind, KVO_GROUP_STATE);
    ASSERT_EQ_U64(g2->page_bytes, 32 * sizeof(float));
    size_t ns = 0;
    const kvo_segment *s = kvo_eng_segments(e, &ns);
    ASSERT_EQ_U64(ns, 4);
    for (size_t i = 0; i < ns; i++) {
        const kvo_group_desc *g = kvo_model_group(m, s[i].group);
        ASSERT_EQ_U64(s[i].page_bytes, g->page_bytes);
        ASSERT_EQ_U64(s[i].num_blocks, kvo_eng_num_blocks(e, s[i].group));
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.block_size = 64;
    kvo_plan *plan = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &plan));
    ASSERT_EQ_U64(kvo_plan_group(plan, 0)->blocks_per_chunk, 4);
    ASSERT_EQ_U64(kvo_plan_group(plan, 1)->blocks_per_chunk, 2);
    ASSERT_EQ_U64(kvo_plan_group(plan, 2)->blocks_per_chunk, 1);
    kvo_plan_destroy(plan);
    kvo_eng_destroy(e);
}

/* The bundled Mooncake sample: conversations share prefixes exactly. */
KVO_TEST(mooncake_sample) {
    kvo_eng_workload_params wp = kvo_eng_workload_default_params();
    wp.trace_path = KVO_SOURCE_DIR "/data/mooncake_sample.jsonl";
    wp.max_requests = 20;
    kvo_eng_workload *w = NULL;
    ENG_OK(kvo_eng_workload_load(&wp, &w));
    ASSERT_EQ_U64(w->n, 20);
    /* some later request starts with an earlier one's first 16 tokens */
    int shared = 0;
    for (size_t i = 1; i < w->n && !shared; i++)
        for (size_t j = 0; j < i && !shared; j++)
            if (!memcmp(w->reqs[i].prompt, w->reqs[j].prompt, 16 * sizeof(uint32_t))) shared = 1;
    ASSERT_TRUE(shared);
    for (size_t i = 0; i < w->n; i++) {
        ASSERT_LE_U64(w->reqs[i].prompt_len, 48 * 16);
        for (uint32_t t = 0; t < w->reqs[i].prompt_len; t++) ASSERT_LT_U64(w->reqs[i].prompt[t], 512);
    }
    kvo_eng_workload_free(w);
    /* bad input: a clear error, no crash */
    const char *bad = kvo_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/bad.jsonl", bad);
    FILE *f = fopen(path, "w");
    fputs("{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n{\"input_length\": \"x\"}\n", f);
    fclose(f);
    wp.trace_path = path;
    ASSERT_EQ_INT(kvo_eng_workload_load(&wp, &w), KVO_EPARSE);
    ASSERT_CONTAINS(kvo_eng_last_error(), "line 2");
}

/* Requests that cannot fit are refused with the budget that would work. */
KVO_TEST(budget_too_small) {
    kvo_eng *e = mk_engine("single", 64);
    uint32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = (uint32_t)i;
    kvo_eng_request q = {1, toks, 200, 2};
    kvo_eng_result res;
    ASSERT_EQ_INT(kvo_eng_run(e, &q, 1, NULL, &res), KVO_ENOSPC);
    ASSERT_CONTAINS(kvo_eng_last_error(), "raise the budget");
    q.prompt_len = 20;
    toks[5] = 9999;
    ASSERT_EQ_INT(kvo_eng_run(e, &q, 1, NULL, &res), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_eng_last_error(), "vocab");
    kvo_eng_destroy(e);
}

/* The comparison is sensitive: corrupting cached engine blocks that a later
 * run reuses must show up as a difference. */
KVO_TEST(corruption_detected) {
    kvo_eng_workload *w = mk_workload(6, 8);
    kvo_eng *e = mk_engine("hybrid-state", 1024);
    kvo_eng_run_params base = kvo_eng_run_default_params();
    base.prefix_cache = false;
    kvo_eng_result *a = run(e, w, &base);
    kvo_eng_run_params cached = kvo_eng_run_default_params();
    kvo_eng_result *b = run(e, w, &cached); /* fills the engine cache */
    assert_same(a, b, w->n);
    size_t ns = 0;
    const kvo_segment *s = kvo_eng_segments(e, &ns);
    for (size_t i = 0; i < ns; i++) {
        float *f = s[i].base;
        size_t nf = s[i].num_blocks * s[i].page_bytes / sizeof(float);
        for (size_t k = 0; k < nf; k += 7) f[k] += 0.25f;
    }
    kvo_eng_result *c = run(e, w, &cached);
    uint64_t local = 0;
    for (size_t i = 0; i < w->n; i++) local += c[i].tokens_local;
    ASSERT_GT_U64(local, 0);
    ASSERT_NE_U64(kvo_eng_results_compare(a, c, w->n, 512, NULL, 0), 0);
    drop(a, w->n);
    drop(b, w->n);
    drop(c, w->n);
    kvo_eng_destroy(e);
    kvo_eng_workload_free(w);
}
