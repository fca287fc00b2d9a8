/*
 * Transfer layer: the host copy routine chosen by measurement
 * (src/transfer/copy_auto.c).  The decision follows the medians of the
 * samples, per direction, once both candidates have theirs; small units do
 * not count; a decision is final; and an engine with nontemporal = -1 copies
 * exactly the same bytes while it measures and after it decided, reporting
 * "auto (measuring)" and then the kind it chose.
 */
#include <stdlib.h>

#include "kvo_test.h"
#include "transfer/copy_auto.h"
#include "xfer_test_util.h"

#define UNIT (UINT64_C(256) << 10)

/* n samples of `kind` in direction dir at gbps (bytes per ns). */
static void feed(int dir, kvo__copy_kind kind, int n, double gbps) {
    for (int i = 0; i < n; i++) kvo__copy_auto_sample(dir, kind, UNIT, (uint64_t)((double)UNIT / gbps));
}

KVO_TEST(decides_per_direction_by_the_median) {
    kvo__copy_kind best = kvo__copy_best(), k;
    if (best == KVO__COPY_MEMCPY) {
        ASSERT_TRUE(kvo__copy_auto_decided(0, &k)); /* nothing to choose from */
        ASSERT_EQ_INT(k, KVO__COPY_MEMCPY);
        return;
    }
    kvo__copy_auto_reset();
    ASSERT_FALSE(kvo__copy_auto_decided(0, &k));
    ASSERT_EQ_STR(kvo__copy_auto_name(), "auto (measuring)");
    ASSERT_TRUE(kvo__copy_auto_streams());
    /* Stores: memcpy faster by median although its sum is worse (a few huge
     * stalls, as a descheduled worker gives). */
    feed(0, best, 64, 3.0);
    feed(0, KVO__COPY_MEMCPY, 60, 5.0);
    ASSERT_FALSE(kvo__copy_auto_decided(0, &k));      /* memcpy has 60 of 64 */
    kvo__copy_auto_sample(0, KVO__COPY_MEMCPY, 4096, 1); /* under 64 KiB: ignored */
    ASSERT_FALSE(kvo__copy_auto_decided(0, &k));
    feed(0, KVO__COPY_MEMCPY, 4, 0.01);
    ASSERT_TRUE(kvo__copy_auto_decided(0, &k));
    ASSERT_EQ_INT(k, KVO__COPY_MEMCPY);
    /* Loads are still open; streaming wins there. */
    ASSERT_FALSE(kvo__copy_auto_decided(1, &k));
    ASSERT_EQ_STR(kvo__copy_auto_name(), "auto (measuring)");
    feed(1, KVO__COPY_MEMCPY, 64, 2.0);
    feed(1, best, 64, 4.0);
    ASSERT_TRUE(kvo__copy_auto_decided(1, &k));
    ASSERT_EQ_INT(k, best);
    ASSERT_EQ_STR(kvo__copy_auto_name(), best == KVO__COPY_AVX2 ? "store memcpy, load avx2-stream"
                                                              : "store memcpy, load sse2-stream");
    ASSERT_TRUE(kvo__copy_auto_streams());
    /* Final: later samples change nothing. */
    feed(0, best, 64, 100.0);
    ASSERT_TRUE(kvo__copy_auto_decided(0, &k));
    ASSERT_EQ_INT(k, KVO__COPY_MEMCPY);
    kvo__copy_auto_reset();
    feed(0, best, 64, 1.0);
    feed(0, KVO__COPY_MEMCPY, 64, 1.5);
    feed(1, best, 64, 1.0);
    feed(1, KVO__COPY_MEMCPY, 64, 1.5);
    ASSERT_EQ_STR(kvo__copy_auto_name(), "memcpy");
    ASSERT_FALSE(kvo__copy_auto_streams());
    kvo__copy_auto_reset();
}

KVO_TEST(candidates_alternate) {
    kvo__copy_kind a = kvo__copy_auto_candidate(0), b = kvo__copy_auto_candidate(1);
    ASSERT_EQ_INT(a, kvo__copy_best());
    ASSERT_EQ_INT(b, KVO__COPY_MEMCPY);
    ASSERT_EQ_INT(kvo__copy_auto_candidate(2), a);
}

/* An engine with nontemporal -1 stores and loads 64 chunks of 1 MiB (four
 * 256 KiB pages each, shuffled) per round: exact bytes in every round, the
 * first rounds measuring, until both directions are decided. */
KVO_TEST(auto_engine_exact_while_measuring_and_after) {
    enum { PAGE = 256 << 10, BPC = 4, NCH = 32, NBLK = BPC * NCH };
    kvo__copy_auto_reset();
    kvo_plan *p = xt_one_group_plan(1, PAGE, BPC);
    ASSERT_TRUE(p != NULL);
    unsigned char *eng = malloc((size_t)NBLK * PAGE), *slots = malloc((size_t)NBLK * PAGE);
    unsigned char *orig = malloc((size_t)NBLK * PAGE);
    ASSERT_TRUE(eng && slots && orig);
    xt_fill_random(eng, (size_t)NBLK * PAGE);
    memcpy(orig, eng, (size_t)NBLK * PAGE);
    uint64_t ids[NBLK];
    for (uint64_t i = 0; i < NBLK; i++) ids[i] = (i * 37) % NBLK; /* 37 is prime to 128: a permutation */
    kvo_xfer_op ops[NCH];
    for (int c = 0; c < NCH; c++)
        ops[c] = (kvo_xfer_op){0, 0, BPC, ids + (size_t)c * BPC, slots + (size_t)c * BPC * PAGE,
                               (uint64_t)BPC * PAGE};
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 2;
    ASSERT_EQ_INT(tp.nontemporal, -1);
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_segment seg = {0, eng, NBLK, PAGE, PAGE};
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    if (kvo__copy_best() != KVO__COPY_MEMCPY) ASSERT_EQ_STR(st.copy_kind, "auto (measuring)");
    kvo__copy_kind k;
    int rounds = 0;
    bool decided = false;
    for (; rounds < 8 && !decided; rounds++) {
        memset(slots, 0xA5, (size_t)NBLK * PAGE);
        uint64_t id;
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops, NCH, &id));
        ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
        for (uint64_t b = 0; b < NBLK; b++)
            if (memcmp(slots + b * PAGE, orig + ids[b] * PAGE, PAGE)) FAILF("round %d: slot page %llu differs", rounds,
                                                                          (unsigned long long)b);
        memset(eng, 0x5A, (size_t)NBLK * PAGE);
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, ops, NCH, &id));
        ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
        ASSERT_MEM_EQ(eng, orig, (size_t)NBLK * PAGE);
        decided = kvo__copy_auto_decided(0, &k) && kvo__copy_auto_decided(1, &k);
    }
    /* 64 units of each candidate per direction: 2 x 16 MiB, one round (two if
     * the workers split the units unevenly). */
    ASSERT_TRUE(decided);
    ASSERT_TRUE(rounds <= 2);
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_TRUE(strcmp(st.copy_kind, "auto (measuring)") != 0);
    ASSERT_EQ_STR(st.copy_kind, kvo__copy_auto_name());
    kvo_transfer_destroy(t);
    /* A fixed choice is reported as such. */
    tp.nontemporal = 0;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_STR(st.copy_kind, "memcpy");
    ASSERT_FALSE(st.nontemporal);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
    free(eng);
    free(slots);
    free(orig);
    kvo__copy_auto_reset();
}
