/* File tier: space: ENOSPC (injected and on a small tmpfs), quota
 * eviction and recycling, the fan-out at create, mixed chunk sizes, a
 * bound on the number of files, and the eviction order after a restart.
 * The plans, keys and helpers are tests/file_tier_fixture.h's. */
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

static void check_nospace(kvo_file_tier *t, const kvo_plan *plan, int expect_some_ok) {
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_stats s0 = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s0));
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t i = 0; i < 40; i++) {
        kvo_chunk_key k = ftf_key(i + 7000, 0);
        ftf_fill(buf, g->chunk_bytes, &k);
        const void *src = buf;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL));
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    free(buf);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    uint64_t writes = s.writes - s0.writes, nospace = s.dropped_nospace - s0.dropped_nospace;
    ASSERT_GT_U64(nospace, 0);
    ASSERT_EQ_U64(writes + nospace + s.dropped_io - s0.dropped_io, 40);
    ASSERT_EQ_U64(s.files, s0.files + writes);
    if (expect_some_ok) ASSERT_GT_U64(writes, 0);
    /* what was written reads back; what was dropped is a miss */
    uint64_t ok = 0;
    for (uint64_t i = 0; i < 40; i++) {
        kvo_chunk_key k = ftf_key(i + 7000, 0);
        uint8_t st;
        ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
        if (st == KVO_READY) {
            ASSERT_EQ_INT(ftf_read_key(t, plan, &k, true), 0);
            ok++;
        }
    }
    ASSERT_EQ_U64(ok, writes);
}

KVO_TEST(enospc_injected) {
    kvo_plan *plan = ftf_plan("ft-nospc", 8000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("ns"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo__file_tier_inject_write_error(ENOSPC, 5);
    check_nospace(t, plan, 1);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_nospace, 5);
    kvo__file_tier_inject_write_error(EIO, 2);
    const kvo_group_plan *g = kvo_plan_group(plan, 1);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    for (int i = 0; i < 3; i++) {
        kvo_chunk_key k = ftf_key(60000 + (uint64_t)i, 1);
        const void *src = buf;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL));
    }
    free(buf);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_io, 2);
    kvo__file_tier_inject_write_error(0, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(enospc_small_tmpfs) {
    kvo_plan *plan = ftf_plan("ft-tmpfs", 8000, true);
    const char *mnt = ftf_small_tmpfs("mnt", "256k", plan);
    kvo_file_tier_params p = ftf_params(mnt, plan);
    kvo_file_tier *t = NULL;
    int rc = kvo_file_tier_create(&p, &t);
    if (rc == 0) {
        /* O_DIRECT on tmpfs depends on the kernel (6.6+ has it): probed, whatever it is */
        /* a quota above what the file system holds is clamped: old files are
         * evicted instead of new writes failing */
        kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
        ASSERT_OK(kvo_file_tier_get_stats(t, &s));
        ASSERT_LT_U64(s.quota_bytes, 256 * 1024);
        const kvo_group_plan *g = kvo_plan_group(plan, 0);
        kvo_chunk_key keys[12];
        for (int i = 0; i < 12; i++) {
            keys[i] = ftf_key((uint64_t)i + 90000, 0);
            ftf_write_keys(t, plan, &keys[i], 1);
        }
        ASSERT_OK(kvo_file_tier_get_stats(t, &s));
        ASSERT_GT_U64(s.evictions, 0);
        ASSERT_EQ_U64(s.dropped_nospace, 0);
        ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[11], true), 0);
        /* another writer fills the disk (after this tier emptied itself, so
         * that no eviction can make room): writes fail with ENOSPC, dropped */
        ASSERT_OK(kvo_file_tier_remove(t, keys, 12));
        const char *ballast = ftf_fill_disk(mnt);
        (void)g;
        check_nospace(t, plan, 0);
        unlink(ballast);
        kvo_file_tier_destroy(t);
    }
    umount2(mnt, MNT_DETACH);
    ASSERT_OK(rc);
    kvo_plan_destroy(plan);
}

KVO_TEST(quota_eviction) {
    kvo_plan *plan = ftf_plan("ft-quota", 10000, true);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("q"), plan);
    p.quota_bytes = 4 * g->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[12];
    for (int i = 0; i < 12; i++) {
        keys[i] = ftf_key((uint64_t)i + 3000, 0);
        ftf_write_keys(t, plan, &keys[i], 1);
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_GT_U64(s.files, 0);
    ASSERT_LE_U64(s.files, 4);
    ASSERT_EQ_U64(s.evictions, 12 - s.files);
    /* files on disk match the index; the newest key is there */
    uint64_t on_disk = 0;
    for (int i = 0; i < 12; i++) {
        char path[KVO__FILE_PATH_MAX];
        struct stat st;
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path, sizeof path));
        on_disk += stat(path, &st) == 0;
    }
    ASSERT_EQ_U64(on_disk, s.files);
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[11], 1, &st));
    ASSERT_EQ_INT(st, KVO_READY);
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[0], 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    /* once full, writes overwrite evicted files in place; the bytes are
     * still exactly right */
    ASSERT_GT_U64(s.recycled_files, 0);
    for (int i = 0; i < 12; i++) {
        ASSERT_OK(kvo_file_tier_lookup(t, &keys[i], 1, &st));
        if (st == KVO_READY) ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], i % 2 == 0), 0);
    }
    char ns[KVO__FILE_PATH_MAX];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    /* files kept for recycling are gone with the tier */
    ASSERT_EQ_INT(ftf_count_temps(ns), 0);

    /* a restart with a smaller quota evicts down to it */
    p.quota_bytes = 2 * g->slot_bytes;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.files, 2);
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* The 256 fan-out directories exist right after create; once the quota is
 * full, a burst of writes queued faster than the writers run still
 * overwrites evicted files (the pool is as large as the write queue), and
 * the bytes read back are exact. */
KVO_TEST(fanout_at_create_and_recycling_burst) {
    kvo_plan *plan = ftf_plan("ft-burst", 10000, true);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("burst"), plan);
    p.quota_bytes = 24 * g->slot_bytes;
    p.max_pending_writes = 32;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    int dirs = 0;
    for (int b = 0; b < 256; b++) {
        char dirp[KVO__FILE_PATH_MAX + 8];
        struct stat st;
        snprintf(dirp, sizeof dirp, "%s/%02x", kvo_file_tier_dir(t), b);
        dirs += stat(dirp, &st) == 0 && S_ISDIR(st.st_mode);
    }
    ASSERT_EQ_INT(dirs, 256);
    kvo_chunk_key keys[44];
    for (int i = 0; i < 24; i++) keys[i] = ftf_key((uint64_t)i + 7000, 0);
    ftf_write_keys(t, plan, keys, 24);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_stats a = KVO_FILE_TIER_STATS_INIT, b = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &a));
    /* 20 writes queued at once (under max_pending_writes, more than the
     * old 16-file pool): each evicts one of the 24 (at most 20 are pending,
     * so one is always ready to evict) */
    for (int i = 24; i < 44; i++) keys[i] = ftf_key((uint64_t)i + 7000, 0);
    ftf_write_keys(t, plan, keys + 24, 20);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    ASSERT_OK(kvo_file_tier_get_stats(t, &b));
    ASSERT_EQ_U64(b.writes - a.writes, 20);
    ASSERT_EQ_U64(b.recycled_files - a.recycled_files, 20);
    /* which keys survive depends on which writes were still pending when
     * later ones evicted (pending files are never evicted): every key the
     * index holds reads back exactly */
    uint64_t ready = 0;
    for (int i = 0; i < 44; i++) {
        uint8_t st;
        ASSERT_OK(kvo_file_tier_lookup(t, &keys[i], 1, &st));
        if (st != KVO_READY) continue;
        ready++;
        ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], i % 2 == 0), 0);
    }
    ASSERT_EQ_U64(ready, b.files);
    ASSERT_GT_U64(ready, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* An evicted file stays under its name in the recycling pool until a writer
 * takes it; a key stored again meanwhile takes it back out of the pool, so
 * that no writer renames its file away afterwards and destroy does not
 * delete it (it used to: the key was then READY in the index with no file,
 * and gone after a restart). */
KVO_TEST(recycle_pool_restore_evicted_key) {
    kvo_plan *plan = ftf_plan("ft-pool", 10000, true);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0);
    char root[1024];
    snprintf(root, sizeof root, "%s", ftf_subdir("pool"));
    kvo_file_tier_params p = ftf_params(root, plan);
    p.quota_bytes = 4 * g0->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key a[4], b = ftf_key(900, 1);
    for (int i = 0; i < 4; i++) a[i] = ftf_key((uint64_t)i + 800, 0);
    ftf_write_keys(t, plan, a, 4);
    /* a smaller chunk evicts one of them (the policy's choice), and no
     * writer of its size takes the evicted file out of the pool */
    ftf_write_keys(t, plan, &b, 1);
    uint8_t st;
    int e = -1;
    for (int i = 0; i < 4 && e < 0; i++) {
        ASSERT_OK(kvo_file_tier_lookup(t, &a[i], 1, &st));
        if (st == KVO_MISS) e = i;
    }
    ASSERT_TRUE(e >= 0);
    char path[KVO__FILE_PATH_MAX];
    struct stat sb;
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &a[e], path, sizeof path));
    ASSERT_EQ_INT(stat(path, &sb), 0); /* pooled under its name, complete */
    ftf_write_keys(t, plan, &a[e], 1); /* stored again: out of the pool */
    ASSERT_EQ_INT(ftf_read_key(t, plan, &a[e], true), 0);
    kvo_file_tier_destroy(t);
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_OK(kvo_file_tier_lookup(t, &a[e], 1, &st));
    ASSERT_EQ_INT(st, KVO_READY);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &a[e], true), 0);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &b, false), 0);

    /* Churn: 8 keys through a quota of 3, each round stores the keys just
     * evicted again while writers recycle (and rename away) pooled files:
     * every key the index holds reads back exactly, and after a restart
     * too. */
    kvo_file_tier_destroy(t);
    p.quota_bytes = 3 * g0->slot_bytes;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k[8];
    for (int i = 0; i < 8; i++) k[i] = ftf_key((uint64_t)i + 500, 0);
    unsigned char *buf = malloc(g0->chunk_bytes);
    for (int round = 0; round < 60; round++)
        for (int i = 0; i < 8; i++) {
            kvo_chunk_key *kk = &k[(i * 3 + round) % 8];
            ftf_fill(buf, g0->chunk_bytes, kk);
            const void *src = buf;
            int r = 1;
            ASSERT_OK(kvo_file_tier_write(t, kk, &src, 1, NULL, &r, NULL));
            ASSERT_TRUE(r == 0 || r == KVO_EAGAIN || r == KVO_EEXIST || r == KVO_ENOSPC);
        }
    free(buf);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GT_U64(s.recycled_files, 0);
    for (int pass = 0; pass < 2; pass++) {
        uint64_t ready = 0;
        for (int i = 0; i < 8; i++) {
            ASSERT_OK(kvo_file_tier_lookup(t, &k[i], 1, &st));
            if (st != KVO_READY) continue;
            ready++;
            ASSERT_EQ_INT(ftf_read_key(t, plan, &k[i], i % 2 == 0), 0);
        }
        ASSERT_GT_U64(ready, 0);
        kvo_file_tier_destroy(t);
        t = NULL;
        if (pass == 0) ASSERT_OK(kvo_file_tier_create(&p, &t));
    }
    kvo_plan_destroy(plan);
}

/* One large chunk evicts many small ones (more than fit one eviction list). */
KVO_TEST(quota_mixed_sizes) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("ft-mixed", 16, &m));
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "big");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = 200 * 4096;
    ASSERT_OK(kvo_model_add_group(m, &g));
    snprintf(g.name, sizeof g.name, "small");
    g.page_bytes = 2048;
    ASSERT_OK(kvo_model_add_group(m, &g));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    kvo_plan *plan = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &plan));
    kvo_model_destroy(m);
    const kvo_group_plan *big = kvo_plan_group(plan, 0), *small = kvo_plan_group(plan, 1);
    kvo_file_tier_params p = ftf_params(ftf_subdir("mixed"), plan);
    p.quota_bytes = 2 * big->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    uint64_t n_small = p.quota_bytes / small->slot_bytes;
    kvo_chunk_key *ks = malloc(n_small * sizeof *ks);
    for (uint64_t i = 0; i < n_small; i++) ks[i] = ftf_key(i + 123456, 1);
    ftf_write_keys(t, plan, ks, n_small);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GT_U64(s.files, 64);
    kvo_chunk_key kb[2] = {ftf_key(1, 0), ftf_key(2, 0)};
    ftf_write_keys(t, plan, kb, 2);
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_quota, 0);
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_GT_U64(s.evictions, 64);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &kb[1], true), 0);
    /* the evicted small files are gone from the disk, except those kept
     * under their names for recycling (at most the pool: max_pending_writes
     * files, max_staging_bytes bytes); those go at destroy */
    char ns[KVO__FILE_PATH_MAX];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    uint64_t present = 0;
    for (uint64_t i = 0; i < n_small; i++) {
        char path[KVO__FILE_PATH_MAX];
        struct stat st;
        ASSERT_OK(kvo_file_chunk_path(ns, &ks[i], path, sizeof path));
        present += stat(path, &st) == 0;
    }
    ASSERT_GE_U64(present + s.evictions, n_small);
    uint64_t kept = present + s.evictions - n_small;
    ASSERT_LE_U64(kept, p.max_pending_writes);
    ASSERT_LE_U64(kept * (small->slot_bytes + KVO_FILE_HEADER_BYTES), p.max_staging_bytes);
    kvo_file_tier_destroy(t);
    present = 0;
    for (uint64_t i = 0; i < n_small; i++) {
        char path[KVO__FILE_PATH_MAX];
        struct stat st;
        ASSERT_OK(kvo_file_chunk_path(ns, &ks[i], path, sizeof path));
        present += stat(path, &st) == 0;
    }
    ASSERT_EQ_U64(present + s.evictions, n_small);
    free(ks);
    kvo_plan_destroy(plan);
}

KVO_TEST(quota_max_files) {
    kvo_plan *plan = ftf_plan("ft-maxf", 3000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("maxf"), plan);
    p.max_files = 3;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) {
        keys[i] = ftf_key((uint64_t)i + 800, (uint32_t)(i % 2));
        ftf_write_keys(t, plan, &keys[i], 1);
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.files, 3);
    ASSERT_EQ_U64(s.evictions, 8 - s.files);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[7], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* After a restart the eviction order follows the files' age, not directory
 * order: with room for three, the three most recently used files stay. */
KVO_TEST(restart_keeps_newest) {
    kvo_plan *plan = ftf_plan("ft-age", 4000, true);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("age"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { N = 8 };
    kvo_chunk_key keys[N];
    for (int i = 0; i < N; i++) keys[i] = ftf_key((uint64_t)i * 31 + 5, 0);
    ftf_write_keys(t, plan, keys, N);
    /* ages: a permutation, so that directory order cannot give the answer */
    static const int age_rank[N] = {5, 0, 7, 2, 6, 1, 4, 3}; /* higher = newer */
    time_t now = time(NULL);
    for (int i = 0; i < N; i++) {
        char path[KVO__FILE_PATH_MAX];
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path, sizeof path));
        struct timespec ts[2] = {{now - 1000 + age_rank[i] * 10, 0}, {now - 1000 + age_rank[i] * 10, 0}};
        ASSERT_EQ_INT(utimensat(AT_FDCWD, path, ts, 0), 0);
    }
    kvo_file_tier_destroy(t);
    p.quota_bytes = 3 * g->slot_bytes;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    uint8_t st[N];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, N, st));
    for (int i = 0; i < N; i++)
        if ((st[i] == KVO_READY) != (age_rank[i] >= N - 3))
            FAILF("key %d (age rank %d): state %d", i, age_rank[i], st[i]);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}
