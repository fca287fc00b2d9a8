/*
 * Transfer engine: ordering between jobs that touch the same memory.  A load
 * from a slot waits for the store into it, a store into an engine block
 * reads the bytes from before a later load into it, a writer waits for more
 * readers than the tracked list holds, loads are started before stores, and
 * the dependency table grows and shrinks with thousands of resources.
 */
#include <stdlib.h>

#include "transfer/transfer_internal.h"
#include "xfer_test_util.h"

KVO_TEST(load_waits_for_store_chain) {
    /* store blk a -> slot1, load slot1 -> blk b, store b -> slot2, load slot2
     * -> blk c, ... all submitted at once: the last block must equal the
     * first.  Also a store after a load of the same block sees the load. */
    for (int rep = 0; rep < 20; rep++) {
        xt_simple S;
        xt_simple_open(&S, 1, 4, 4096);
        const kvo_group_plan *gp = kvo_plan_group(S.p, 2); /* the 9000-byte group */
        enum { HOPS = 12 };
        unsigned char *slots[HOPS];
        uint64_t blk[HOPS + 1], ids[2 * HOPS];
        for (int i = 0; i <= HOPS; i++) blk[i] = (uint64_t)i;
        unsigned char *page0 = malloc(gp->chunk_bytes), *got = malloc(gp->chunk_bytes);
        xt_gather_block(&S.L, 2, 0, page0);
        for (int i = 0; i < HOPS; i++) {
            slots[i] = malloc(gp->slot_bytes);
            kvo_xfer_op st = {2, 0, 1, &blk[i], slots[i], gp->slot_bytes};
            kvo_xfer_op ld = {2, 0, 1, &blk[i + 1], slots[i], gp->slot_bytes};
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[2 * i]));
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[2 * i + 1]));
        }
        ASSERT_OK(kvo_transfer_wait(S.t, ids, 2 * HOPS, -1));
        kvo_xfer_result r[2 * HOPS];
        size_t n;
        ASSERT_OK(kvo_transfer_poll(S.t, r, 2 * HOPS, &n));
        ASSERT_EQ_U64(n, 2 * HOPS);
        for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(r[i].status, 0);
        for (int i = 1; i <= HOPS; i++) {
            xt_gather_block(&S.L, 2, blk[i], got);
            ASSERT_MEM_EQ(got, page0, gp->chunk_bytes);
        }
        for (int i = 0; i < HOPS; i++) free(slots[i]);
        free(page0);
        free(got);
        xt_simple_close(&S);
    }
}

KVO_TEST(store_before_load_into_same_block_reads_old_bytes) {
    /* Write-after-read: store blk 3 -> slotA (reads the old bytes), then load
     * slotB -> blk 3.  slotA must hold the old bytes. */
    for (int rep = 0; rep < 20; rep++) {
        xt_simple S;
        xt_simple_open(&S, 1, 4, 4096);
        const kvo_group_plan *gp = kvo_plan_group(S.p, 2);
        unsigned char *old = malloc(gp->chunk_bytes), *got = malloc(gp->chunk_bytes);
        xt_gather_block(&S.L, 2, 3, old);
        unsigned char *A = malloc(gp->slot_bytes), *B = malloc(gp->slot_bytes);
        memset(B, 0x5A, gp->slot_bytes);
        uint64_t b3 = 3, ids[2];
        kvo_xfer_op st = {2, 0, 1, &b3, A, gp->slot_bytes}, ld = {2, 0, 1, &b3, B, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
        ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
        ASSERT_MEM_EQ(A, old, gp->chunk_bytes);
        xt_gather_block(&S.L, 2, 3, got);
        ASSERT_MEM_EQ(got, B, gp->chunk_bytes);
        free(old);
        free(got);
        free(A);
        free(B);
        xt_simple_close(&S);
    }
}

KVO_TEST(many_readers_then_writer) {
    /* More loads from one slot than the tracked readers (4), then a store to
     * that slot: every load must see the old slot bytes. */
    xt_simple S;
    xt_simple_open(&S, 1, 3, 4096);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 2);
    unsigned char *got = malloc(gp->chunk_bytes);
    unsigned char *slot = malloc(gp->slot_bytes);
    xt_fill_random(slot, gp->slot_bytes);
    unsigned char *old = malloc(gp->slot_bytes);
    memcpy(old, slot, gp->slot_bytes);
    uint64_t blk[10], ids[11];
    for (int i = 0; i < 10; i++) {
        blk[i] = (uint64_t)i;
        kvo_xfer_op ld = {2, 0, 1, &blk[i], slot, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[i]));
    }
    /* Cancel the load that took the place of the fifth in the reader list:
     * the store below must still wait for the fifth. */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[5]));
    uint64_t b15 = 15;
    kvo_xfer_op st = {2, 0, 1, &b15, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[10]));
    kvo_transfer_stats stt = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &stt));
    ASSERT_GE_U64(stt.dep_waits, 1);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 11, -1));
    for (int i = 0; i < 10; i++) {
        if (i == 5) continue;
        xt_gather_block(&S.L, 2, blk[i], got);
        ASSERT_MEM_EQ(got, old, gp->chunk_bytes);
    }
    xt_gather_block(&S.L, 2, 15, got);
    ASSERT_MEM_EQ(slot, got, gp->chunk_bytes);
    free(old);
    free(got);
    free(slot);
    xt_simple_close(&S);
}

/* A job submitted while nothing else is unfinished keeps its resources out
 * of the table until a later job arrives (kvo__xlink): the later job must
 * still be ordered after it, whether it is unstarted or running, and whether
 * a non-conflicting job came between them. */
KVO_TEST(lone_job_is_linked_when_another_arrives) {
    for (int started = 0; started < 2; started++) {
        xt_simple S;
        xt_simple_open(&S, 1, 1, 64);
        kvo__transfer_pause(S.t, true);
        const kvo_group_plan *gp = kvo_plan_group(S.p, 2);
        unsigned char *old = malloc(gp->chunk_bytes), *got = malloc(gp->chunk_bytes);
        xt_gather_block(&S.L, 2, 3, old);
        unsigned char *A1 = malloc(gp->slot_bytes), *A2 = malloc(gp->slot_bytes), *B = malloc(gp->slot_bytes),
                      *C = malloc(gp->slot_bytes);
        memset(B, 0x5A, gp->slot_bytes);
        uint64_t b3 = 3, b4 = 4, b7 = 7, ids[3];
        /* A: two ops (two units), stores blocks 3 and 4 (reads them). */
        kvo_xfer_op a[2] = {{2, 0, 1, &b3, A1, gp->slot_bytes}, {2, 0, 1, &b4, A2, gp->slot_bytes}};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, a, 2, &ids[0]));
        if (started) { /* A running: one unit claimed, one left */
            kvo__transfer_allow_units(S.t, 1);
            while (kvo__transfer_units_allowed(S.t) != 0) {
            }
            ASSERT_ERR(kvo_transfer_cancel(S.t, ids[0]), KVO_EBUSY);
        }
        kvo_transfer_stats s0 = KVO_TRANSFER_STATS_INIT, s1 = KVO_TRANSFER_STATS_INIT;
        ASSERT_OK(kvo_transfer_get_stats(S.t, &s0));
        /* An unrelated store (block 7 -> C): no dependency. */
        kvo_xfer_op c = {2, 0, 1, &b7, C, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &c, 1, &ids[1]));
        ASSERT_OK(kvo_transfer_get_stats(S.t, &s1));
        ASSERT_EQ_U64(s1.dep_waits, s0.dep_waits);
        /* A load into block 3 (write after A's read) must wait for A. */
        kvo_xfer_op ld = {2, 0, 1, &b3, B, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[2]));
        ASSERT_OK(kvo_transfer_get_stats(S.t, &s1));
        ASSERT_EQ_U64(s1.dep_waits, s0.dep_waits + 1);
        kvo__transfer_pause(S.t, false);
        ASSERT_OK(kvo_transfer_wait(S.t, ids, 3, -1));
        ASSERT_MEM_EQ(A1, old, gp->chunk_bytes);
        xt_gather_block(&S.L, 2, 3, got);
        ASSERT_MEM_EQ(got, B, gp->chunk_bytes);
        /* Alone again (nothing unfinished): a canceled lone job leaves no
         * trace, and the next lone job is ordered before a later one. */
        ASSERT_OK(kvo_transfer_poll(S.t, (kvo_xfer_result[3]){{0}}, 3, &(size_t){0}));
        kvo__transfer_pause(S.t, true);
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, a, 2, &ids[0]));
        ASSERT_OK(kvo_transfer_cancel(S.t, ids[0]));
        ASSERT_OK(kvo_transfer_get_stats(S.t, &s0));
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, a, 1, &ids[2])); /* reads block 3 after the load */
        ASSERT_OK(kvo_transfer_get_stats(S.t, &s1));
        ASSERT_EQ_U64(s1.dep_waits, s0.dep_waits + 1);
        kvo__transfer_pause(S.t, false);
        ASSERT_OK(kvo_transfer_wait(S.t, &ids[1], 2, -1));
        ASSERT_MEM_EQ(A1, B, gp->chunk_bytes);
        free(old);
        free(got);
        free(A1);
        free(A2);
        free(B);
        free(C);
        xt_simple_close(&S);
    }
}

KVO_TEST(loads_run_before_stores) {
    xt_simple S;
    xt_simple_open(&S, 1, 1, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *a = malloc(gp->slot_bytes), *b = malloc(gp->slot_bytes);
    memset(b, 1, gp->slot_bytes);
    uint64_t b1 = 1, b2 = 2, ids[2];
    kvo_xfer_op st = {0, 0, 1, &b1, a, gp->slot_bytes}, ld = {0, 0, 1, &b2, b, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    kvo__transfer_allow_units(S.t, 1);
    while (kvo__transfer_units_allowed(S.t) != 0) {
    }
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[1]), KVO_EBUSY); /* the later load started */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[0]));             /* the earlier store did not */
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    free(a);
    free(b);
    xt_simple_close(&S);
}

KVO_TEST(dependency_table_many_resources) {
    /* Three jobs of 4000 blocks each, all queued before any runs (the table
     * grows past its first size and later shrinks entry by entry): store
     * engine -> slots A (block order P), load slots A -> engine (order Q),
     * store engine -> slots B (order P); engine and B are checked against a
     * model computed here. */
    enum { NB = 4000, BPC = 100, PAGE = 72, NC = NB / BPC };
    kvo_plan *p = xt_one_group_plan(1, PAGE, BPC);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    unsigned char *eng = malloc(NB * PAGE), *orig = malloc(NB * PAGE);
    unsigned char *A = malloc(NC * gp->slot_bytes), *B = malloc(NC * gp->slot_bytes);
    xt_fill_random(eng, NB * PAGE);
    memcpy(orig, eng, NB * PAGE);
    uint64_t *P = malloc(sizeof(uint64_t) * NB), *Q = malloc(sizeof(uint64_t) * NB);
    for (uint64_t i = 0; i < NB; i++) P[i] = Q[i] = i;
    for (uint64_t i = NB - 1; i > 0; i--) {
        uint64_t k = kvo_test_rand() % (i + 1), x = P[i];
        P[i] = P[k];
        P[k] = x;
        k = kvo_test_rand() % (i + 1);
        x = Q[i];
        Q[i] = Q[k];
        Q[k] = x;
    }
    kvo_segment seg = {0, eng, NB, PAGE, PAGE};
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 2;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    kvo__transfer_pause(t, true);
    kvo_xfer_op ops[3][NC];
    for (int c = 0; c < NC; c++) {
        ops[0][c] = (kvo_xfer_op){0, 0, BPC, P + c * BPC, A + c * gp->slot_bytes, gp->slot_bytes};
        ops[1][c] = (kvo_xfer_op){0, 0, BPC, Q + c * BPC, A + c * gp->slot_bytes, gp->slot_bytes};
        ops[2][c] = (kvo_xfer_op){0, 0, BPC, P + c * BPC, B + c * gp->slot_bytes, gp->slot_bytes};
    }
    uint64_t ids[3];
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops[0], NC, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, ops[1], NC, &ids[1]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops[2], NC, &ids[2]));
    kvo__transfer_pause(t, false);
    ASSERT_OK(kvo_transfer_wait(t, ids, 3, -1));
    /* Model: A[i] = orig[P[i]]; eng[Q[i]] = A[i]; B[i] = eng[P[i]]. */
    unsigned char *model = malloc(NB * PAGE);
    memcpy(model, orig, NB * PAGE);
    for (uint64_t i = 0; i < NB; i++) memcpy(model + Q[i] * PAGE, orig + P[i] * PAGE, PAGE);
    ASSERT_MEM_EQ(eng, model, NB * PAGE);
    for (uint64_t i = 0; i < NB; i++) {
        uint64_t c = i / BPC, b = i % BPC;
        ASSERT_MEM_EQ(B + c * gp->slot_bytes + b * PAGE, model + P[i] * PAGE, PAGE);
    }
    kvo_xfer_result r[3];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(t, r, 3, &n));
    ASSERT_EQ_U64(n, 3);
    for (int i = 0; i < 3; i++) ASSERT_EQ_INT(r[i].status, 0);
    kvo_transfer_destroy(t);
    free(model);
    free(P);
    free(Q);
    free(A);
    free(B);
    free(eng);
    free(orig);
    kvo_plan_destroy(p);
}
