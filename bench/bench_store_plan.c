/*
 * The store benchmarks' plan: one full-attention group of 16-token blocks,
 * 4 KiB pages, one block per chunk (so one slot size and an exact LRU).
 * Its own file so that bench/cg/bench_store_cycle_cg.c, built by hand
 * outside the CLI, runs the same plan as `kvoffload bench store`.
 */
#include <stdio.h>

#include "bench_store.h"

kvo_plan *kvo__bs_plan(void) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "kv");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = 4096;
    if (kvo_model_create("bench", 16, &m) || kvo_model_add_group(m, &g)) return NULL;
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    int rc = kvo_plan_create(m, &pp, &p);
    kvo_model_destroy(m);
    return rc ? NULL : p;
}
