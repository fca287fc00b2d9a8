/* File tier: back-pressure: a full write queue and slow writes drop stores
 * (counted, never waited for), and staging memory is shared between
 * groups.  The plans, keys and helpers are tests/file_tier_fixture.h's. */
#include "kvo_test.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "file_tier_fixture.h"

KVO_TEST(backpressure_drops) {
    kvo_plan *plan = ftf_plan("ft-bp", 30000, true);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("bp"), plan);
    p.max_pending_writes = 2;
    p.io = KVO_FILE_IO_THREADS;
    p.io_threads = 1;
    p.fsync = KVO_FILE_FSYNC_DATA; /* slow writes */
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { N = 40 };
    kvo_chunk_key keys[N];
    const void *srcs[N];
    int res[N];
    unsigned char *buf = calloc(1, g->chunk_bytes);
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key((uint64_t)i + 40000, 0);
        srcs[i] = buf;
    }
    size_t queued = 0;
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, N, NULL, res, &queued));
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(30000)));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GE_U64(queued, 2);
    ASSERT_LT_U64(queued, N);
    ASSERT_EQ_U64(s.dropped_backpressure, N - queued);
    ASSERT_EQ_U64(s.writes, queued);
    int eagain = 0;
    for (int i = 0; i < N; i++) eagain += res[i] == KVO_EAGAIN;
    ASSERT_EQ_INT(eagain, (int)(N - queued));
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Staging memory is shared by the groups: idle buffers of one group are given
 * back when another group needs room. */
KVO_TEST(staging_shared_between_groups) {
    kvo_plan *plan = ftf_plan("ft-stage", 20000, true);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0), *g1 = kvo_plan_group(plan, 1);
    kvo_file_tier_params p = ftf_params(ftf_subdir("stage"), plan);
    p.max_staging_bytes = 2 * (g0->slot_bytes + KVO_FILE_HEADER_BYTES);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key a[2] = {ftf_key(1, 0), ftf_key(2, 0)};
    ftf_write_keys(t, plan, a, 2);
    kvo_chunk_key b[3] = {ftf_key(3, 1), ftf_key(4, 1), ftf_key(5, 1)};
    for (int i = 0; i < 3; i++) {
        unsigned char *buf = malloc(g1->chunk_bytes);
        ftf_fill(buf, g1->chunk_bytes, &b[i]);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &b[i], &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        free(buf);
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_backpressure, 0);
    ASSERT_LE_U64(s.staging_bytes, p.max_staging_bytes);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &b[2], true), 0);
    ftf_write_keys(t, plan, (kvo_chunk_key[]){ftf_key(6, 0)}, 1);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* While recent writes took longer than write_latency_limit_ms, new writes
 * are dropped (as long as one is still queued) instead of piling up. */
KVO_TEST(backpressure_latency) {
    kvo_plan *plan = ftf_plan("ft-lat", 5000, true);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("lat"), plan);
    p.write_latency_limit_ms = 2;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    atomic_store(&kvo__file_test_write_delay_us, 20000);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    const void *src = buf;
    kvo_chunk_key k[4] = {ftf_key(1, 0), ftf_key(2, 0), ftf_key(3, 0), ftf_key(4, 0)};
    int r = 1;
    ASSERT_OK(kvo_file_tier_write(t, &k[0], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000))); /* latency now ~20 ms */
    /* k[1] takes 300 ms, so it is surely still queued when k[2] arrives,
     * however slow this machine (sanitizers, parallel tests) is. */
    atomic_store(&kvo__file_test_write_delay_us, 300000);
    ASSERT_OK(kvo_file_tier_write(t, &k[1], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0); /* nothing queued: admitted */
    ASSERT_OK(kvo_file_tier_write(t, &k[2], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, KVO_EAGAIN); /* k[1] still queued and writes are slow */
    atomic_store(&kvo__file_test_write_delay_us, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_backpressure, 1);
    ASSERT_GT_U64(s.write_latency_ns, 2000000);
    ASSERT_EQ_U64(s.writes, 2);
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}
