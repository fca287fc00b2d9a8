/*
 * Transfer engine: what kvo_transfer_create and kvo_transfer_submit refuse
 * (each error names what was wrong, and a refused submit queues nothing),
 * the queue limit, empty jobs, and allocation failures at every allocation
 * of a round trip (each fails cleanly with KVO_ENOMEM; ASan finds leaks).
 */
#include <stdlib.h>

#include "fail_alloc.h"
#include "xfer_test_util.h"

KVO_TEST(submit_errors_queue_nothing) {
    xt_simple S;
    xt_simple_open(&S, 3, 2, 16);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    memset(slot, XT_POISON, gp->slot_bytes);
    unsigned char *before = malloc(S.L.bytes);
    memcpy(before, S.L.mem, S.L.bytes);
    uint64_t ok[3] = {0, 1, 2}, bad[3] = {0, XT_NBLK, 2}, dup[3] = {5, 6, 5};
    uint64_t id = 12345;
    kvo_xfer_op op = {0, 0, 3, bad, slot, gp->slot_bytes};
    /* bad block id */
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "engine block 16");
    ASSERT_CONTAINS(kvo_last_error(), "full");
    /* bad id in the second op only: the first is not queued either */
    kvo_xfer_op two[2] = {{0, 0, 3, ok, slot, gp->slot_bytes}, {0, 0, 3, bad, slot, gp->slot_bytes}};
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, two, 2, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "op 1");
    /* slot too small */
    op = (kvo_xfer_op){0, 0, 3, ok, slot, gp->chunk_bytes - 1};
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "cannot hold");
    op.slot_bytes = gp->slot_bytes;
    op.slot = NULL;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.slot = slot;
    /* blocks beyond the chunk */
    op.first_block = 1;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not within the chunk");
    op.first_block = UINT32_MAX;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.first_block = 0;
    /* not offloaded, unknown group */
    op.group = 3;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not offloaded");
    op.group = 9;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.group = 0;
    /* NULL engine blocks, bad direction, NULL args */
    op.engine_blocks = NULL;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.engine_blocks = ok;
    ASSERT_ERR(kvo_transfer_submit(S.t, (kvo_xfer_dir)7, &op, 1, &id), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, NULL, 1, &id), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, NULL), KVO_EINVAL);
    /* a load writing one engine block twice */
    op.engine_blocks = dup;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "written twice");
    /* two ops sharing a slot: must be one group; stores must not overlap */
    {
        const kvo_group_plan *g1 = kvo_plan_group(S.p, 1);
        (void)g1;
        kvo_xfer_op sh[2] = {{0, 0, 2, ok, slot, gp->slot_bytes}, {0, 1, 2, ok + 1, slot, gp->slot_bytes}};
        ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, sh, 2, &id), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "overlap");
        sh[1].group = 1;
        sh[1].first_block = 2;
        sh[1].n_blocks = 1;
        ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, sh, 2, &id), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "one slot");
    }
    /* ...but a store may read one engine block into two chunk positions */
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(xt_wait_one(S.t, id).status, 0);

    /* Nothing of the failed submits ran: engine untouched, one job counted. */
    ASSERT_MEM_EQ(S.L.mem, before, S.L.bytes);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &st));
    ASSERT_EQ_U64(st.jobs_submitted, 1);
    ASSERT_EQ_U64(id, 1);
    free(before);
    free(slot);
    xt_simple_close(&S);
}

KVO_TEST(submit_without_layout_and_after_close) {
    kvo_plan *p = xt_plan(1);
    kvo_transfer_params tp = kvo_transfer_default_params();
    kvo_transfer *t;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_EINVAL); /* no plan */
    tp.plan = p;
    tp.threads = 0;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_EINVAL);
    tp.threads = 1;
    tp.device = "tpu";
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "host");
    tp.device = "host";
    tp.device_index = 1;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    tp.device_index = 0;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    uint64_t blk = 0, id;
    static unsigned char slot[8192];
    kvo_xfer_op op = {0, 0, 1, &blk, slot, sizeof slot};
    ASSERT_ERR(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id), KVO_ESTATE);
    uint64_t off;
    ASSERT_ERR(kvo_transfer_slot_offset(t, 0, 0, 0, &off), KVO_ESTATE);
    ASSERT_ERR(kvo_transfer_layout_hash(t, &off), KVO_ESTATE);
    kvo_transfer_close(t);
    kvo_transfer_close(t); /* idempotent */
    ASSERT_ERR(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id), KVO_ECLOSED);
    xt_layout L;
    xt_make_layout(&L, XT_L_CROSS);
    ASSERT_ERR(kvo_transfer_set_layout(t, L.segs, L.n), KVO_ECLOSED);
    kvo_transfer_destroy(t);
    kvo_transfer_destroy(NULL);
    free(L.mem);
    kvo_plan_destroy(p);
}

KVO_TEST(queue_limit_counts_unpolled_results) {
    xt_simple S;
    xt_simple_open(&S, 1, 1, 2);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 1);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b0 = 0, b1 = 1, id[3];
    kvo_xfer_op a = {1, 0, 1, &b0, slot, gp->slot_bytes}, b = {1, 0, 1, &b1, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &b, 1, &id[1]));
    ASSERT_OK(kvo_transfer_wait(S.t, id, 2, -1));
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[2]), KVO_EAGAIN);
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_U64(r[0].job_id, id[0]); /* oldest first */
    ASSERT_EQ_U64(r[1].job_id, id[1]);
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[2]));
    ASSERT_OK(kvo_transfer_wait(S.t, &id[2], 1, -1));
    /* the second store overwrote the first in the same slot: in order */
    free(slot);
    xt_simple_close(&S);
}

KVO_TEST(empty_job_completes) {
    xt_simple S;
    xt_simple_open(&S, 3, 1, 8);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, NULL, 0, &id));
    kvo_xfer_op empty = {2, 1, 0, NULL, NULL, 0};
    uint64_t id2;
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &empty, 1, &id2));
    ASSERT_OK(kvo_transfer_wait(S.t, (uint64_t[]){id, id2}, 2, -1));
    kvo_xfer_result r[2];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, 0);
    ASSERT_EQ_U64(r[0].bytes, 0);
    xt_simple_close(&S);
}

KVO_TEST(allocation_failures_are_clean) {
    /* Fail the k-th allocation for k = 0, 1, ...: every call fails cleanly
     * with KVO_ENOMEM (no leak: ASan) or the whole round trip succeeds. */
    kvo_plan *p = xt_plan(3);
    xt_layout L;
    xt_make_layout(&L, XT_L_SEPARATE);
    xt_fill_random(L.mem, L.bytes);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t blk[3] = {7, 2, 9};
    kvo_xfer_op op = {0, 0, 3, blk, slot, gp->slot_bytes};
    bool done = false;
    for (long k = 0; k < 1000 && !done; k++) {
        fa_install(k);
        kvo_transfer_params tp = kvo_transfer_default_params();
        tp.plan = p;
        tp.threads = 2;
        kvo_transfer *t = NULL;
        int rc = kvo_transfer_create(&tp, &t);
        uint64_t id[2];
        if (!rc) rc = kvo_transfer_set_layout(t, L.segs, L.n);
        if (!rc) rc = kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id[0]);
        if (!rc) rc = kvo_transfer_submit(t, KVO_XFER_LOAD, &op, 1, &id[1]);
        if (!rc) {
            ASSERT_OK(kvo_transfer_wait(t, id, 2, -1));
            kvo_xfer_result r[2];
            size_t n;
            ASSERT_OK(kvo_transfer_poll(t, r, 2, &n));
            ASSERT_EQ_U64(n, 2);
            ASSERT_EQ_INT(r[0].status, 0);
            ASSERT_EQ_INT(r[1].status, 0);
            done = fa_allocations() <= k; /* no allocation failed */
        } else {
            ASSERT_EQ_INT(rc, KVO_ENOMEM);
        }
        kvo_transfer_destroy(t);
        ASSERT_OK(kvo_set_allocator(NULL));
    }
    ASSERT_TRUE(done);
    free(slot);
    free(L.mem);
    kvo_plan_destroy(p);
}
