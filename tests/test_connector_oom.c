/*
 * Out of memory (tests/fail_alloc.h): every call fails cleanly while a
 * request stores and another loads, an abort that cannot allocate changes
 * nothing, and a failed load lists its invalid blocks without allocating.
 */
#include "connector_fixture.h"
#include "fail_alloc.h"
#include "transfer/transfer_internal.h"

/* Allocation failures while a request stores and another loads: every call
 * fails cleanly (0 or KVO_ENOMEM), an accepted load always completes, loaded
 * bytes are exact, and nothing stays pinned or pending (leaks: ASan). */
static bool ok_or_nomem(int rc) {
    if (rc != 0 && rc != KVO_ENOMEM) FAILF("expected 0 or KVO_ENOMEM, got %d (%s)", rc, kvo_error_name(rc));
    return rc == 0;
}

KVO_TEST(allocation_failures_are_clean) {
    uint32_t tok[400];
    fill_tokens(tok, 400, 9);
    bool done = false;
    for (long k = 0; k < 400 && !done; k++) {
        sim s;
        fa_install(-1); /* before the connector exists, as kvo_set_allocator requires */
        sim_init(&s, two_group_plan(), NULL, 512);
        fa_arm(k);
        sim_req a, b;
        sim_req_init(&a, 1);
        sim_req_tokens(&a, tok, 400);
        sim_req_init(&b, 2);
        sim_req_tokens(&b, tok, 400);
        if (ok_or_nomem(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 400}))) {
            sim_compute(&s, &a, 400);
            kvo_block_table t[SIM_MAXG];
            sim_tables(&s, &a, t);
            (void)ok_or_nomem(kvo_connector_update(s.c, 1, 400, t, s.ng));
            sim_drain(&s);
            bool busy = false;
            if (!ok_or_nomem(kvo_connector_finish(s.c, 1, 400, t, s.ng, &busy))) ASSERT_OK(kvo_connector_abort(s.c, 1));
            else if (busy) (void)sim_wait_completion(&s, 1, KVO_COMPLETION_RELEASED);
        }
        sim_drain(&s);
        bool loaded = false;
        if (ok_or_nomem(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400}))) {
            kvo_lookup_result lr;
            if (ok_or_nomem(kvo_connector_lookup(s.c, 2, 0, &lr)) && lr.status == KVO_HIT) {
                alloc_for_load(&s, &b, 0, lr.tokens);
                kvo_block_table t[SIM_MAXG];
                sim_tables(&s, &b, t);
                if (ok_or_nomem(kvo_connector_load(s.c, 2, lr.tokens, t, s.ng))) {
                    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
                    if (cp.status == 0) {
                        check_loaded(&s, &b, lr.tokens);
                        loaded = true;
                    } else {
                        ASSERT_EQ_U64(cp.tokens_valid, 0);
                    }
                }
            }
            ASSERT_OK(kvo_connector_abort(s.c, 2));
        }
        sim_drain(&s);
        done = loaded && fa_allocations() <= k; /* nothing failed */
        fa_arm(-1);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.host.pending, 0);
        sim_req_free(&s, &a);
        sim_req_free(&s, &b);
        sim_destroy(&s);
        ASSERT_OK(kvo_set_allocator(NULL));
    }
    ASSERT_TRUE(done);
}

/* Abort that runs out of memory while copies are in flight fails with
 * KVO_ENOMEM and changes nothing: the request is still there, and a retry
 * waits for its copies. */
KVO_TEST(abort_out_of_memory_changes_nothing) {
    sim s;
    fa_install(-1);
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 10);
    sim_req a;
    kvo__transfer_pause(kvo_connector_transfer(s.c), true); /* the store stays in flight */
    prefill(&s, &a, 1, tok, 400, false);
    kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &ts));
    ASSERT_GT_U64(ts.jobs_queued, 0);
    fa_arm(0);
    int rc = kvo_connector_abort(s.c, 1);
    fa_arm(-1);
    ASSERT_ERR(rc, KVO_ENOMEM);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    kvo__transfer_pause(kvo_connector_transfer(s.c), false);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    ASSERT_ERR(kvo_connector_request_stats(s.c, 1, &rs), KVO_ENOTFOUND);
    ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &ts));
    ASSERT_EQ_U64(ts.jobs_queued, 0);
    sim_drain(&s);
    sim_req_free(&s, &a);
    sim_destroy(&s);
    ASSERT_OK(kvo_set_allocator(NULL));
}

/* A failed load lists its blocks as invalid even when memory is short when
 * it completes: the list's room is taken when the load is accepted. */
KVO_TEST(failed_load_lists_invalid_blocks_without_allocating) {
    sim s;
    fa_install(-1);
    uint32_t tok[400];
    sim_two_stored(&s, NULL, 512, tok, 11);
    sim_req b;
    kvo__connector_inject_failures(s.c, 1, 0);
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    fa_arm(0); /* the first allocation after the load was accepted fails */
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    fa_arm(-1);
    ASSERT_EQ_INT(cp.status, KVO_EIO);
    ASSERT_GT_U64(cp.n_invalid_blocks, 0);
    uint64_t ids[64];
    size_t n = 0, tot = 0;
    for (uint32_t g = 0; g < 2; g++) {
        ASSERT_OK(kvo_connector_invalid_blocks(s.c, 2, g, ids, 64, &n));
        tot += n;
    }
    ASSERT_EQ_U64(tot, cp.n_invalid_blocks);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_drain(&s);
    sim_req_free(&s, &b);
    sim_destroy(&s);
    ASSERT_OK(kvo_set_allocator(NULL));
}
