/* Scaffolding shared by the reference-engine tests (test_engine*.c): small
 * engines and synthetic workloads, result comparison and cleanup. */
#ifndef KVO_ENGINE_TEST_H
#define KVO_ENGINE_TEST_H

#include <stdlib.h>

#include "kvo_engine.h"
#include "kvo_test.h"

#define ENG_OK(expr) do { int rc_ = (expr); if (rc_ != 0) \
    FAILF("%s returned %d (%s): %s", #expr, rc_, kvo_error_name(rc_), kvo_eng_last_error()); } while (0)

static uint32_t g_hash_tokens; /* 0: the shape's hash unit */

/* An engine of a preset shape, small enough to be fast under sanitizers. */
static inline kvo_eng *mk_engine(const char *shape, uint64_t budget) {
    kvo_eng_config c;
    ENG_OK(kvo_eng_shape_config(shape, &c));
    if (g_hash_tokens) c.tokens_per_hash = g_hash_tokens;
    c.budget_tokens = budget;
    c.max_seq = 1024;
    c.d_model = 32;
    c.n_heads = 2;
    c.d_ff = 64;
    kvo_eng *e = NULL;
    ENG_OK(kvo_eng_create(&c, &e));
    return e;
}

/* n synthetic multi-turn conversations of tptb-token trace blocks. */
static inline kvo_eng_workload *mk_workload(size_t n, uint32_t tptb) {
    kvo_eng_workload_params wp = kvo_eng_workload_default_params();
    wp.trace_path = NULL;
    wp.max_requests = n;
    wp.tokens_per_trace_block = tptb;
    wp.max_new_tokens = 3;
    kvo_eng_workload *w = NULL;
    ENG_OK(kvo_eng_workload_load(&wp, &w));
    return w;
}

static inline void assert_same(const kvo_eng_result *a, const kvo_eng_result *b, size_t n) {
    char why[256];
    if (kvo_eng_results_compare(a, b, n, 512, why, sizeof why)) FAILF("runs differ: %s", why);
}

/* Free n results and their calloc'ed array. */
static inline void drop(kvo_eng_result *r, size_t n) {
    kvo_eng_results_free(r, n);
    free(r);
}

#endif
