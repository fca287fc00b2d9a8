/* Test helper for the transfer-device tests: a plan with one group "kv" of
 * `layers` layers of `page`-byte pages, blocks_per_chunk = bpc. */
#ifndef KVO_XFER_TEST_UTIL_H
#define KVO_XFER_TEST_UTIL_H

#include "kvo_test.h"

static inline kvo_plan *xt_one_group_plan(uint32_t layers, uint64_t page, uint32_t bpc) {
    kvo_model *m;
    ASSERT_OK(kvo_model_create("xfer-test", 16, &m));
    kvo_group_desc d = kvo_group_desc_default();
    snprintf(d.name, sizeof d.name, "kv");
    d.tokens_per_block = 16;
    d.layers = layers;
    d.page_bytes = page;
    ASSERT_OK(kvo_model_add_group(m, &d));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = bpc;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    return p;
}

#endif
