/*
 * Transfer engine under concurrency: four submitter threads and a poller on
 * the event fd (every job succeeds and copies its own blocks), and
 * submitters racing a thread that keeps re-registering another group's
 * tensors and canceling (their jobs never fail).  Also run under TSan.
 */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>

#include "xfer_test_util.h"

typedef struct cthread {
    xt_simple *S;
    int idx;
    int fails;
} cthread;

static void *submitter(void *arg) {
    cthread *c = arg;
    xt_simple *S = c->S;
    const kvo_group_plan *gp = kvo_plan_group(S->p, 0);
    const kvo_segment *k0 = xt_gseg(&S->L, 0, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    unsigned char *want = malloc(gp->layers * gp->page_bytes);
    /* Thread idx owns engine blocks 4*idx .. 4*idx+3 of group 0. */
    for (int it = 0; it < 40; it++) {
        uint64_t src = (uint64_t)(4 * c->idx + it % 2), dst = (uint64_t)(4 * c->idx + 2 + it % 2), ids[2];
        kvo_xfer_op st = {0, 0, 1, &src, slot, gp->slot_bytes}, ld = {0, 0, 1, &dst, slot, gp->slot_bytes};
        int rc;
        while ((rc = kvo_transfer_submit(S->t, KVO_XFER_STORE, &st, 1, &ids[0])) == KVO_EAGAIN) {
        }
        if (rc) { c->fails++; break; }
        while ((rc = kvo_transfer_submit(S->t, KVO_XFER_LOAD, &ld, 1, &ids[1])) == KVO_EAGAIN) {
        }
        if (rc) { c->fails++; break; }
        if (kvo_transfer_wait(S->t, ids, 2, -1)) { c->fails++; break; }
        for (size_t s = 0; xt_gseg(&S->L, 0, s); s++) {
            const kvo_segment *sg = xt_gseg(&S->L, 0, s);
            if (memcmp((unsigned char *)sg->base + dst * sg->block_stride,
                       (unsigned char *)sg->base + src * sg->block_stride, sg->page_bytes))
                c->fails++;
        }
    }
    (void)k0;
    free(want);
    free(slot);
    return NULL;
}

static void *poller(void *arg) {
    xt_simple *S = arg;
    kvo_xfer_result r[32];
    size_t n, total = 0;
    int fd = kvo_transfer_event_fd(S->t);
    while (total < 4 * 80) {
        struct pollfd pf = {fd, POLLIN, 0};
        poll(&pf, 1, 10);
        if (kvo_transfer_poll(S->t, r, 32, &n)) break;
        for (size_t i = 0; i < n; i++)
            if (r[i].status != 0) return (void *)1;
        total += n;
    }
    return NULL;
}

KVO_TEST(many_concurrent_jobs) {
    xt_simple S;
    xt_simple_open(&S, 1, 3, 8);
    pthread_t th[4], pt;
    cthread c[4];
    pthread_create(&pt, NULL, poller, &S);
    for (int i = 0; i < 4; i++) {
        c[i] = (cthread){&S, i, 0};
        pthread_create(&th[i], NULL, submitter, &c[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    void *prc;
    pthread_join(pt, &prc);
    ASSERT_NULL(prc);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(c[i].fails, 0);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &st));
    ASSERT_EQ_U64(st.jobs_ok, 4 * 80);
    xt_simple_close(&S);
}

KVO_TEST(concurrent_layout_changes_and_cancels) {
    /* Submitters on group 1 while another thread keeps re-registering
     * group 0's tensors and canceling: group-1 jobs never fail. */
    xt_simple S;
    xt_simple_open(&S, 3, 2, 256);
    const kvo_group_plan *g1 = kvo_plan_group(S.p, 1);
    unsigned char *slot = malloc(g1->slot_bytes);
    unsigned char *mem2 = malloc(S.L.bytes);
    memcpy(mem2, S.L.mem, S.L.bytes);
    xt_layout N = S.L;
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    uint64_t blk[3] = {1, 2, 3};
    kvo_xfer_op op1 = {1, 0, 3, blk, slot, g1->slot_bytes};
    uint64_t ids[200];
    for (int i = 0; i < 200; i++) {
        ASSERT_OK(kvo_transfer_submit(S.t, i % 2 ? KVO_XFER_LOAD : KVO_XFER_STORE, &op1, 1, &ids[i]));
        if (i % 20 == 0) ASSERT_OK(kvo_transfer_set_layout(S.t, (i / 20) % 2 ? S.L.segs : N.segs, N.n));
        if (i % 7 == 3) (void)kvo_transfer_cancel(S.t, ids[i]);
        if (i % 50 == 49) {
            ASSERT_OK(kvo_transfer_wait(S.t, ids, (size_t)i + 1, -1));
            kvo_xfer_result r[64];
            size_t n;
            do {
                ASSERT_OK(kvo_transfer_poll(S.t, r, 64, &n));
                for (size_t k = 0; k < n; k++)
                    ASSERT_TRUE(r[k].status == 0 || r[k].status == KVO_ECANCELED);
            } while (n);
        }
    }
    free(slot);
    xt_simple_close(&S);
    free(mem2);
}
