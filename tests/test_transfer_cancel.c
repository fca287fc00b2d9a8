/*
 * Transfer engine: cancel, wait with a timeout, the event fd, close, and
 * layout changes.  A canceled job fails the jobs that depend on it and
 * still counts against the queue while ordered; close cancels what is
 * queued; a new layout fails only the jobs of the groups it moved, and
 * stops a running job of such a group after its current unit.
 */
#include <poll.h>
#include <stdlib.h>

#include "transfer/transfer_internal.h"
#include "xfer_test_util.h"

static bool fd_readable(int fd) {
    struct pollfd pf = {fd, POLLIN, 0};
    return poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

KVO_TEST(cancel_wait_and_event_fd) {
    xt_simple S;
    xt_simple_open(&S, 1, 2, 64);
    int fd = kvo_transfer_event_fd(S.t);
    ASSERT_GE_INT(fd, 0);
    ASSERT_FALSE(fd_readable(fd));
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes), *other = malloc(gp->slot_bytes);
    uint64_t b1 = 1, b2 = 2, b3 = 3, ids[4];
    kvo_xfer_op st = {0, 0, 1, &b1, slot, gp->slot_bytes};
    kvo_xfer_op ld = {0, 0, 1, &b2, slot, gp->slot_bytes};      /* reads what st writes */
    kvo_xfer_op ind = {0, 0, 1, &b3, other, gp->slot_bytes};    /* independent */
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &ind, 1, &ids[2]));
    /* Paused: nothing finishes; wait times out. */
    ASSERT_ERR(kvo_transfer_wait(S.t, &ids[2], 1, 20 * 1000 * 1000), KVO_ETIMEDOUT);
    ASSERT_FALSE(fd_readable(fd));
    /* Cancel the store: the load that reads its slot fails too. */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[0]));
    ASSERT_TRUE(fd_readable(fd));
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[0]), KVO_EBUSY); /* finished (canceled) */
    ASSERT_ERR(kvo_transfer_cancel(S.t, 999), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_transfer_wait(S.t, (uint64_t[]){999}, 1, 0), KVO_ENOTFOUND);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 3, -1));
    kvo_xfer_result r[8];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 3);
    ASSERT_FALSE(fd_readable(fd));
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].job_id == ids[0]) { ASSERT_EQ_INT(r[i].status, KVO_ECANCELED); seen |= 1; }
        if (r[i].job_id == ids[1]) { ASSERT_EQ_INT(r[i].status, KVO_ECANCELED); seen |= 2; }
        if (r[i].job_id == ids[2]) {
            ASSERT_EQ_INT(r[i].status, 0);
            ASSERT_EQ_U64(r[i].bytes, gp->layers * gp->page_bytes);
            seen |= 4;
        }
    }
    ASSERT_EQ_INT(seen, 7);
    /* Results already polled still count as finished for wait. */
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 3, 0));
    /* Cancel a waiting job whose predecessor runs: the predecessor's
     * successors stay ordered after it. */
    kvo__transfer_pause(S.t, true);
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[1]));
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].job_id == ids[1] ? r[0].status : r[1].status, KVO_ECANCELED);
    ASSERT_EQ_INT(r[0].job_id == ids[0] ? r[0].status : r[1].status, 0);
    free(slot);
    free(other);
    xt_simple_close(&S);
}

KVO_TEST(close_cancels_queued_jobs) {
    xt_simple S;
    xt_simple_open(&S, 1, 2, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b = 1, ids[2];
    kvo_xfer_op st = {0, 0, 1, &b, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &st, 1, &ids[1]));
    kvo_transfer_close(S.t);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]), KVO_ECLOSED);
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, KVO_ECANCELED);
    ASSERT_EQ_INT(r[1].status, KVO_ECANCELED);
    free(slot);
    xt_simple_close(&S);
}

KVO_TEST(canceled_jobs_still_ordered_count_against_the_queue) {
    xt_simple S;
    xt_simple_open(&S, 1, 2, 4);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b[8] = {0, 1, 2, 3, 4, 5, 6, 7}, id[8];
    kvo_xfer_result r[8];
    size_t n;
    kvo_xfer_op st = {0, 0, 1, &b[0], slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[0]));
    for (int i = 1; i <= 3; i++) {
        kvo_xfer_op ld = {0, 0, 1, &b[i], slot, gp->slot_bytes};
        if (i < 3) {
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &id[i]));
            ASSERT_OK(kvo_transfer_cancel(S.t, id[i])); /* waits for the store: stays ordered */
            ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
            ASSERT_EQ_U64(n, 1);
            ASSERT_EQ_INT(r[0].status, KVO_ECANCELED);
        } else {
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &id[i]));
        }
    }
    /* 1 store + 2 canceled-but-ordered + 1 load = 4 = max_queued_jobs. */
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[4]), KVO_EAGAIN);
    ASSERT_CONTAINS(kvo_last_error(), "canceled");
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, (uint64_t[]){id[0], id[3]}, 2, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, 0);
    ASSERT_EQ_INT(r[1].status, 0);
    /* Room again once the canceled ones have left the order. */
    for (int tries = 0;; tries++) {
        int rc = kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[4]);
        if (rc == 0) break;
        ASSERT_EQ_INT(rc, KVO_EAGAIN);
        ASSERT_LT_INT(tries, 1000000);
    }
    ASSERT_OK(kvo_transfer_wait(S.t, &id[4], 1, -1));
    unsigned char *got = malloc(gp->chunk_bytes), *want = malloc(gp->chunk_bytes);
    xt_gather_block(&S.L, 0, 0, want);
    xt_gather_block(&S.L, 0, 3, got);
    ASSERT_MEM_EQ(got, want, gp->chunk_bytes);
    free(got);
    free(want);
    free(slot);
    xt_simple_close(&S);
}

KVO_TEST(layout_change_fails_only_affected_jobs) {
    xt_simple S;
    xt_simple_open(&S, 1, 2, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *g0 = kvo_plan_group(S.p, 0), *g1 = kvo_plan_group(S.p, 1);
    unsigned char *s0 = malloc(g0->slot_bytes), *s1 = malloc(g1->slot_bytes);
    memset(s1, XT_POISON, g1->slot_bytes);
    uint64_t b = 4, ids[2], h0, h1;
    kvo_xfer_op o0 = {0, 0, 1, &b, s0, g0->slot_bytes}, o1 = {1, 0, 1, &b, s1, g1->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o0, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o1, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h0));
    /* Move group 0 to a new tensor: same shapes, other memory. */
    xt_layout N = S.L;
    unsigned char *mem2 = malloc(S.L.bytes);
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h1));
    ASSERT_EQ_U64(h0, h1); /* same pages in the same order: same slot bytes */
    /* the engine-free computation agrees, and tells page lists apart */
    uint64_t h2;
    ASSERT_OK(kvo_layout_hash(S.p, N.segs, N.n, &h2));
    ASSERT_EQ_U64(h2, h1);
    kvo_segment dsegs[64];
    ASSERT_LE_U64(N.n, 64);
    memcpy(dsegs, N.segs, N.n * sizeof *dsegs);
    for (size_t i = 0; i < N.n; i++)
        if (dsegs[i].group == 0) { dsegs[i].page_bytes += 1; break; }
    ASSERT_OK(kvo_layout_hash(S.p, dsegs, N.n, &h2));
    ASSERT_NE_U64(h2, h1);
    dsegs[0].group = 999;
    ASSERT_ERR(kvo_layout_hash(S.p, dsegs, N.n, &h2), KVO_EINVAL);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    for (size_t i = 0; i < n; i++) {
        if (r[i].job_id == ids[0]) ASSERT_EQ_INT(r[i].status, KVO_ESTATE);
        else ASSERT_EQ_INT(r[i].status, 0);
    }
    unsigned char *got = malloc(g1->chunk_bytes);
    xt_gather_block(&S.L, 1, 4, got);
    ASSERT_MEM_EQ(s1, got, g1->chunk_bytes);
    free(got);
    /* Reordering a group's segments changes the slot format: new hash. */
    kvo_segment tmp = N.segs[0];
    N.segs[0] = N.segs[1];
    N.segs[1] = tmp;
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h1));
    ASSERT_EQ_U64(h0, h1); /* K and V halves have equal pages: still the same format */
    free(mem2);
    free(s0);
    free(s1);
    xt_simple_close(&S);
}

KVO_TEST(layout_change_stops_running_job) {
    /* A job of many units on group 0 is started (one unit claimed), then
     * group 0's tensors move: the job fails with KVO_ESTATE after that unit,
     * nothing more is copied, a job of group 1 still succeeds. */
    xt_simple S;
    xt_simple_open(&S, 1, 1, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *g0 = kvo_plan_group(S.p, 0), *g1 = kvo_plan_group(S.p, 1);
    enum { OPS = 8 };
    unsigned char *slots = malloc(OPS * g0->slot_bytes), *s1 = malloc(g1->slot_bytes);
    memset(slots, XT_POISON, OPS * g0->slot_bytes);
    uint64_t blk[OPS], ids[2];
    kvo_xfer_op ops[OPS];
    for (int i = 0; i < OPS; i++) {
        blk[i] = (uint64_t)i;
        ops[i] = (kvo_xfer_op){0, 0, 1, &blk[i], slots + i * g0->slot_bytes, g0->slot_bytes};
    }
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, ops, OPS, &ids[0]));
    kvo_xfer_op o1 = {1, 0, 1, &blk[3], s1, g1->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o1, 1, &ids[1]));
    kvo__transfer_allow_units(S.t, 1);
    while (kvo__transfer_units_allowed(S.t) != 0) { /* until the unit is claimed */
    }
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[0]), KVO_EBUSY); /* running */
    xt_layout N = S.L;
    unsigned char *mem2 = malloc(S.L.bytes);
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    /* Returned: the job is over (nothing of it runs any more). */
    kvo_xfer_result r[2];
    size_t n;
    ASSERT_OK(kvo_transfer_wait(S.t, &ids[0], 1, 0));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_U64(r[0].job_id, ids[0]);
    ASSERT_EQ_INT(r[0].status, KVO_ESTATE);
    /* At most the claimed unit was copied: 3 segments per op (K/V of 3
     * layers = 6 segments) -> 48 units; one of them ran. */
    size_t touched = 0;
    for (size_t i = 0; i < OPS * g0->slot_bytes; i++) touched += slots[i] != XT_POISON;
    ASSERT_LE_U64(touched, 100);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, &ids[1], 1, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(r[0].status, 0);
    free(mem2);
    free(slots);
    free(s1);
    xt_simple_close(&S);
}
