/* The transfer engine reuses a retired job's memory for the next submit and
 * clears its dependency table in one pass when the last job retires
 * (transfer_queue.c): jobs of changing sizes and directions, one after the
 * other and overlapping, must still copy the right bytes, keep a load
 * behind the store of the same engine block, and refuse a load that writes
 * one engine block twice. */
#include <stdlib.h>

#include "kvo_test.h"
#include "xfer_test_util.h"

#define PAGE 256
#define BPC 8
#define NBLK 64

/* Submit k jobs of nops ops each (job i: dirs[i], ops[i]) at once, wait for
 * all of them and check that each succeeded. */
static void run_jobs(kvo_transfer *t, size_t k, const kvo_xfer_dir *dirs, kvo_xfer_op (*ops)[4], size_t nops) {
    uint64_t ids[2];
    for (size_t i = 0; i < k; i++) ASSERT_OK(kvo_transfer_submit(t, dirs[i], ops[i], nops, &ids[i]));
    ASSERT_OK(kvo_transfer_wait(t, ids, k, -1));
    kvo_xfer_result r[2];
    size_t got;
    ASSERT_OK(kvo_transfer_poll(t, r, k, &got));
    ASSERT_EQ_U64(got, k);
    for (size_t i = 0; i < k; i++) ASSERT_EQ_INT(r[i].status, 0);
}

KVO_TEST(reused_job_memory_copies_and_checks_right) {
    kvo_plan *p = xt_one_group_plan(1, PAGE, BPC);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    unsigned char *eng = malloc(NBLK * PAGE), *slots = malloc(NBLK / BPC * gp->slot_bytes);
    for (size_t i = 0; i < NBLK * PAGE; i++) eng[i] = (unsigned char)(i * 7 + i / PAGE);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 2;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_segment seg = {0, eng, NBLK, PAGE, PAGE};
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    uint64_t src[NBLK / 2], dst[NBLK / 2];
    unsigned char *want = malloc(PAGE);
    for (int rep = 0; rep < 24; rep++) {
        size_t nops = 1 + (size_t)(rep * 5 % 4); /* 1..4 chunks: sizes go up and down */
        size_t nb = nops * BPC;
        for (size_t b = 0; b < nb; b++) {
            src[b] = (b * 3 + (size_t)rep) % (NBLK / 2);        /* distinct within [0, 32) */
            dst[b] = NBLK / 2 + (b * 5 + (size_t)rep) % (NBLK / 2); /* distinct within [32, 64) */
        }
        kvo_xfer_op ops[2][4]; /* store, load */
        static const kvo_xfer_dir dirs[2] = {KVO_XFER_STORE, KVO_XFER_LOAD};
        for (size_t c = 0; c < nops; c++) {
            ops[0][c] = (kvo_xfer_op){0, 0, BPC, src + c * BPC, slots + c * gp->slot_bytes, gp->slot_bytes};
            ops[1][c] = (kvo_xfer_op){0, 0, BPC, dst + c * BPC, slots + c * gp->slot_bytes, gp->slot_bytes};
        }
        if (rep % 3 == 0) { /* overlapping: the load waits for the store */
            run_jobs(t, 2, dirs, ops, nops);
        } else {
            run_jobs(t, 1, &dirs[0], &ops[0], nops);
            run_jobs(t, 1, &dirs[1], &ops[1], nops);
        }
        for (size_t b = 0; b < nb; b++) {
            memcpy(want, eng + src[b] * PAGE, PAGE);
            ASSERT_MEM_EQ(eng + dst[b] * PAGE, want, PAGE);
        }
        /* a load writing one engine block twice is refused, whatever the
         * reused memory held before */
        uint64_t dup[BPC];
        for (size_t b = 0; b < BPC; b++) dup[b] = NBLK / 2 + b;
        dup[BPC - 1] = dup[(size_t)rep % (BPC - 1)];
        kvo_xfer_op bad = {0, 0, BPC, dup, slots, gp->slot_bytes};
        uint64_t id;
        ASSERT_EQ_INT(kvo_transfer_submit(t, KVO_XFER_LOAD, &bad, 1, &id), KVO_EINVAL);
        /* the engine's own blocks are unchanged below 32 */
        for (size_t i = 0; i < NBLK / 2 * PAGE; i++)
            if (eng[i] != (unsigned char)(i * 7 + i / PAGE)) FAILF("engine byte %zu changed", i);
    }
    kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &ts));
    ASSERT_EQ_U64(ts.jobs_ok, 48);
    kvo_transfer_destroy(t);
    free(want);
    free(eng);
    free(slots);
    kvo_plan_destroy(p);
}
