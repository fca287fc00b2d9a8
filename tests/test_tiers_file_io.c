/* File tier: round trips (threads, io_uring, buffered, named temporaries),
 * persistence across a restart, write completions and the event fd, create
 * and remove/read errors, fsync policies, many threads on one tier, and the
 * engine -> transfer -> host slot -> file path and back.  The plans, keys
 * and helpers are tests/file_tier_fixture.h's. */
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
#include "core/xxh.h"

/* A tier on backend io with direct, under subdir sub, for a plan of
 * ftf_plan(name, page, true) (*plan: the caller destroys it). */
static kvo_file_tier *io_tier(const char *name, uint64_t page, const char *sub, kvo_file_io_kind io,
                              kvo_file_direct_mode direct, kvo_plan **plan) {
    *plan = ftf_plan(name, page, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir(sub), *plan);
    p.io = io;
    p.direct = direct;
    return ftf_create_or_skip(&p, *plan);
}

/* The chunk file of key k verifies with the public checker. */
static void check_verifies(kvo_file_tier *t, const kvo_plan *plan, const kvo_chunk_key *k) {
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), k, path, sizeof path));
    kvo_chunk_key vk;
    uint64_t vb = 0;
    ASSERT_OK(kvo_file_verify(path, plan, &vk, &vb));
    ASSERT_TRUE(kvo_chunk_key_eq(&vk, k));
    ASSERT_EQ_U64(vb, kvo_plan_group(plan, k->group)->chunk_bytes);
}

static void round_trip(kvo_file_io_kind io, kvo_file_direct_mode direct) {
    kvo_plan *plan = NULL;
    kvo_file_tier *t = io_tier("ft-rt", 5000, "rt", io, direct, &plan);
    if (io == KVO_FILE_IO_URING) ASSERT_EQ_STR(kvo_file_tier_backend(t), "io_uring");
    if (io == KVO_FILE_IO_THREADS) ASSERT_EQ_STR(kvo_file_tier_backend(t), "threads");
    kvo_chunk_key keys[12];
    for (int i = 0; i < 12; i++) keys[i] = ftf_key((uint64_t)i, (uint32_t)(i % 2));
    uint8_t st[12];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 12, st));
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(st[i], KVO_MISS);
    ftf_write_keys(t, plan, keys, 12);
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 12, st));
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(st[i], KVO_READY);
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], i % 3 != 0), 0);
    /* writing again is skipped */
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0);
    unsigned char *buf = calloc(1, g0->chunk_bytes);
    const void *src = buf;
    int r = 0;
    ASSERT_OK(kvo_file_tier_write(t, &keys[0], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, KVO_EEXIST);
    free(buf);
    /* a group that is not offloaded is rejected */
    kvo_chunk_key bad = ftf_key(1, 2);
    ASSERT_ERR(kvo_file_tier_lookup(t, &bad, 1, st), KVO_EINVAL);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.writes, 12);
    ASSERT_EQ_U64(s.reads, 12);
    ASSERT_EQ_U64(s.files, 12);
    ASSERT_EQ_U64(s.corrupt_removed, 0);
    check_verifies(t, plan, &keys[3]); /* with the public checker */
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(round_trip_threads) { round_trip(KVO_FILE_IO_THREADS, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(round_trip_uring) { round_trip(KVO_FILE_IO_URING, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(round_trip_buffered) { round_trip(KVO_FILE_IO_AUTO, KVO_FILE_DIRECT_OFF); }
KVO_TEST(round_trip_named_temps) {
    atomic_store(&kvo__file_test_no_tmpfile, 1);
    round_trip(KVO_FILE_IO_THREADS, KVO_FILE_DIRECT_AUTO);
    atomic_store(&kvo__file_test_no_tmpfile, 0);
}

/* Borrowed writes: the file comes straight from the caller's memory (no
 * staging copy; writes_borrowed), byte-exact on read, verified by the
 * public checker; a source the file cannot take in place (the padded
 * "swa" group; with O_DIRECT, a misaligned one) is copied as by
 * kvo_file_tier_write and reads back as well. */
static void borrowed(kvo_file_io_kind io, kvo_file_direct_mode direct) {
    kvo_plan *plan = NULL;
    kvo_file_tier *t = io_tier("ft-bw", 4096, "bw", io, direct, &plan);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0), *g1 = kvo_plan_group(plan, 1);
    ASSERT_EQ_U64(g0->slot_bytes, g0->chunk_bytes);
    ASSERT_LT_U64(g1->chunk_bytes, g1->slot_bytes);
    enum { N = 8 };
    kvo_chunk_key keys[N + 3];
    unsigned char *bufs[N + 3];
    const void *srcs[N + 3];
    for (int i = 0; i < N + 3; i++) {
        keys[i] = ftf_key((uint64_t)i + 500, i < N + 1 ? 0 : 1);
        uint64_t cb = kvo_plan_group(plan, keys[i].group)->chunk_bytes;
        bufs[i] = ftf_aligned_buf(cb + 64);
        unsigned char *src = bufs[i] + (i == N ? 16 : 0); /* key N: misaligned */
        ftf_fill(src, cb, &keys[i]);
        srcs[i] = src;
    }
    int res[N + 3];
    size_t q = 0;
    ASSERT_OK(kvo_file_tier_write_borrowed(t, keys, srcs, NULL, N + 3, NULL, res, &q));
    ASSERT_EQ_U64(q, N + 3);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000))); /* the sources are the tier's until here */
    /* every borrowed write reports (params.write_completions is off here) */
    kvo_file_completion c[N + 3];
    size_t got = 0;
    ASSERT_OK(kvo_file_tier_poll(t, c, N + 3, &got));
    ASSERT_EQ_U64(got, N + 3);
    for (size_t i = 0; i < got; i++) {
        ASSERT_EQ_INT(c[i].op, KVO_FILE_OP_WRITE);
        ASSERT_EQ_INT(c[i].result, 0);
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.writes, N + 3);
    ASSERT_EQ_U64(s.writes_borrowed, N + (kvo_file_tier_direct(t) ? 0 : 1)); /* key N copied under O_DIRECT */
    ASSERT_EQ_U64(s.staging_bytes, 0);
    for (int i = 0; i < N + 3; i++) {
        memset(bufs[i], 0, 16); /* the files do not depend on the sources any more */
        ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], i % 2 == 0), 0);
    }
    check_verifies(t, plan, &keys[1]);
    char path[KVO__FILE_PATH_MAX];
    /* the same key again: skipped, as by kvo_file_tier_write */
    ASSERT_OK(kvo_file_tier_write_borrowed(t, keys, srcs, NULL, 1, NULL, res, &q));
    ASSERT_EQ_INT(res[0], KVO_EEXIST);
    ASSERT_ERR(kvo_file_tier_write_borrowed(t, NULL, srcs, NULL, 1, NULL, res, &q), KVO_EINVAL);
    ASSERT_OK(kvo_file_tier_poll(t, c, N + 3, &got));
    ASSERT_EQ_U64(got, 0); /* nothing queued: nothing reported */
    /* sums as the caller took them: a source that changed since writes no file */
    kvo_chunk_key nk[2] = {ftf_key(900, 0), ftf_key(901, 0)};
    uint64_t cb = g0->chunk_bytes, sums[2];
    for (int i = 0; i < 2; i++) {
        ftf_fill(bufs[i], cb, &nk[i]);
        sums[i] = XXH3_64bits(bufs[i], cb);
        srcs[i] = bufs[i];
    }
    bufs[1][cb / 2] ^= 1; /* changed after its sum was taken */
    uint64_t ud[2] = {1, 2};
    ASSERT_OK(kvo_file_tier_write_borrowed(t, nk, srcs, sums, 2, ud, res, &q));
    ASSERT_EQ_U64(q, 2);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    ASSERT_OK(kvo_file_tier_poll(t, c, N + 3, &got));
    ASSERT_EQ_U64(got, 2);
    for (size_t i = 0; i < got; i++) ASSERT_EQ_INT(c[i].result, c[i].user_data == 1 ? 0 : KVO_ECORRUPT);
    uint8_t st[2];
    ASSERT_OK(kvo_file_tier_lookup(t, nk, 2, st));
    ASSERT_EQ_INT(st[0], KVO_READY);
    ASSERT_EQ_INT(st[1], KVO_MISS);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &nk[0], true), 0);
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &nk[1], path, sizeof path));
    ASSERT_TRUE(access(path, F_OK) != 0); /* no file */
    for (int i = 0; i < N + 3; i++) free(bufs[i]);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(borrowed_writes_threads) { borrowed(KVO_FILE_IO_THREADS, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(borrowed_writes_uring) { borrowed(KVO_FILE_IO_URING, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(borrowed_writes_buffered) { borrowed(KVO_FILE_IO_AUTO, KVO_FILE_DIRECT_OFF); }

KVO_TEST(restart_persistence) {
    kvo_plan *plan = ftf_plan("ft-restart", 3000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("rs"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[20];
    for (int i = 0; i < 20; i++) keys[i] = ftf_key((uint64_t)i + 100, (uint32_t)(i % 2));
    ftf_write_keys(t, plan, keys, 20);
    kvo_file_tier_destroy(t);

    t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 20);
    ASSERT_EQ_U64(s.files, 20);
    uint8_t st[20];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 20, st));
    for (int i = 0; i < 20; i++) ASSERT_EQ_INT(st[i], KVO_READY);
    for (int i = 0; i < 20; i += 3) ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], true), 0);
    kvo_file_tier_destroy(t);

    /* a different layout gets its own namespace: no hits, no interference */
    kvo_plan *other = ftf_plan("ft-restart", 3001, true);
    kvo_file_tier_params p2 = ftf_params(ftf_subdir("rs"), other);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(other);
    kvo_plan_destroy(plan);
}

KVO_TEST(write_completions_and_event_fd) {
    kvo_plan *plan = ftf_plan("ft-ev", 5000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("ev"), plan);
    p.write_completions = true;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_ERR(kvo_file_tier_wait(t, 0), KVO_ENOTFOUND);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    kvo_chunk_key keys[3] = {ftf_key(1, 0), ftf_key(2, 0), ftf_key(3, 0)};
    const void *srcs[3] = {buf, buf, buf};
    uint64_t ud[3] = {11, 22, 33};
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, 3, ud, NULL, NULL));
    int fd = kvo_file_tier_event_fd(t);
    ASSERT_TRUE(fd >= 0);
    uint64_t sum = 0;
    int got = 0;
    for (int spin = 0; spin < 100 && got < 3; spin++) {
        struct pollfd pf = {fd, POLLIN, 0};
        poll(&pf, 1, 1000);
        kvo_file_completion c[3];
        size_t n = 0;
        ASSERT_OK(kvo_file_tier_poll(t, c, 3, &n));
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ_INT(c[i].op, KVO_FILE_OP_WRITE);
            ASSERT_EQ_INT(c[i].result, 0);
            sum += c[i].user_data;
        }
        got += (int)n;
    }
    ASSERT_EQ_INT(got, 3);
    ASSERT_EQ_U64(sum, 66);
    struct pollfd pf = {fd, POLLIN, 0};
    ASSERT_EQ_INT(poll(&pf, 1, 0), 0); /* drained */
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(create_errors) {
    kvo_plan *plan = ftf_plan("ft-err", 5000, true);
    kvo_file_tier *t = NULL;
    /* a root below a regular file cannot be created */
    const char *file = ftf_subdir("plainfile");
    FILE *f = fopen(file, "w");
    fclose(f);
    char root[1100];
    snprintf(root, sizeof root, "%s/sub", file);
    kvo_file_tier_params p = ftf_params(root, plan);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "plainfile");
    /* quota below one chunk */
    p = ftf_params(ftf_subdir("ce"), plan);
    p.quota_bytes = 4096;
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "quota");
    /* no root, no plan */
    p = ftf_params(NULL, plan);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    p = ftf_params(ftf_subdir("ce"), NULL);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    /* a manifest of another format version */
    p = ftf_params(ftf_subdir("ce"), plan);
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char man[KVO__FILE_PATH_MAX + 32];
    snprintf(man, sizeof man, "%s/manifest.json", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    char *text = kvo_test_read_file(man, NULL);
    ASSERT_NOT_NULL(text);
    ASSERT_CONTAINS(text, "\"format_version\": 1");
    ASSERT_CONTAINS(text, "ft-err");
    char *pos = strstr(text, "\"format_version\": 1");
    pos[strlen("\"format_version\": ")] = '7';
    f = fopen(man, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_ESTATE);
    ASSERT_CONTAINS(kvo_last_error(), "version 7");
    kvo_plan_destroy(plan);
}

KVO_TEST(remove_and_read_errors) {
    kvo_plan *plan = ftf_plan("ft-rm", 5000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("rm"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k = ftf_key(5, 1);
    ftf_write_keys(t, plan, &k, 1);
    ASSERT_OK(kvo_file_tier_remove(t, &k, 1));
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k, true), KVO_ENOTFOUND);
    /* a file removed behind the tier's back: a miss, and the index forgets it */
    kvo_chunk_key k2 = ftf_key(6, 1);
    ftf_write_keys(t, plan, &k2, 1);
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &k2, path, sizeof path));
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k2, true), KVO_ENOTFOUND);
    ASSERT_OK(kvo_file_tier_lookup(t, &k2, 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    /* NULL arguments */
    ASSERT_ERR(kvo_file_tier_write(t, &k, NULL, 1, NULL, NULL, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_file_tier_read(t, NULL, NULL, 1, NULL, NULL, NULL), KVO_EINVAL);
    kvo_file_tier_destroy(t);
    kvo_file_tier_destroy(NULL);
    kvo_plan_destroy(plan);
}

/* Several threads write, read, look up, touch and remove on one tier with a
 * quota small enough to evict all the time (and ThreadSanitizer watching):
 * every successful read has exactly the key's bytes, nothing is corrupt, the
 * quota holds. */
typedef struct conc_ctx {
    kvo_file_tier *t;
    const kvo_plan *plan;
    int id;
    int failures;
    uint64_t reads_ok;
} conc_ctx;

static uint64_t conc_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void *conc_writer(void *arg) {
    conc_ctx *c = arg;
    uint64_t seed = (uint64_t)c->id * 977 + 1;
    const kvo_group_plan *g0 = kvo_plan_group(c->plan, 0);
    unsigned char *buf = malloc(g0->chunk_bytes);
    for (int i = 0; i < 150; i++) {
        kvo_chunk_key k = ftf_key(conc_rand(&seed) % 40, (uint32_t)(conc_rand(&seed) % 2));
        const kvo_group_plan *g = kvo_plan_group(c->plan, k.group);
        ftf_fill(buf, g->chunk_bytes, &k);
        const void *src = buf;
        int r = 0;
        if (kvo_file_tier_write(c->t, &k, &src, 1, NULL, &r, NULL)) c->failures++;
        if (r != 0 && r != KVO_EEXIST && r != KVO_EAGAIN && r != KVO_ENOSPC) c->failures++;
        if (i % 10 == 0) {
            uint8_t st;
            kvo_file_tier_lookup(c->t, &k, 1, &st);
            kvo_file_tier_touch(c->t, &k, 1);
        }
        if (i % 37 == 0) kvo_file_tier_remove(c->t, &k, 1); /* may be busy: fine */
    }
    free(buf);
    return NULL;
}

static void *conc_reader(void *arg) {
    conc_ctx *c = arg;
    uint64_t seed = 4242;
    const kvo_group_plan *g0 = kvo_plan_group(c->plan, 0);
    unsigned char *dst = ftf_aligned_buf(g0->slot_bytes);
    unsigned char *want = malloc(g0->chunk_bytes);
    for (int i = 0; i < 200; i++) {
        kvo_chunk_key k = ftf_key(conc_rand(&seed) % 40, (uint32_t)(conc_rand(&seed) % 2));
        void *d = dst;
        int r = 0;
        if (kvo_file_tier_read(c->t, &k, &d, 1, NULL, &r, NULL)) c->failures++;
        if (r != 0) continue; /* miss or pending */
        kvo_file_completion comp;
        size_t got = 0;
        while (!got) {
            kvo_file_tier_wait(c->t, KVO_MS(1000));
            ASSERT_OK(kvo_file_tier_poll(c->t, &comp, 1, &got));
        }
        if (comp.result == 0) {
            const kvo_group_plan *g = kvo_plan_group(c->plan, k.group);
            ftf_fill(want, g->chunk_bytes, &k);
            if (memcmp(dst, want, g->chunk_bytes) != 0) c->failures++;
            c->reads_ok++;
        } else if (comp.result != KVO_ENOTFOUND) {
            c->failures++; /* never corrupt, never an I/O error */
        }
    }
    free(want);
    free(dst);
    return NULL;
}

KVO_TEST(concurrent_threads) {
    kvo_plan *plan = ftf_plan("ft-conc", 6000, true);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("conc"), plan);
    p.quota_bytes = 12 * g0->slot_bytes;
    p.io_threads = 3;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { NW = 3 };
    pthread_t th[NW + 1];
    conc_ctx ctx[NW + 1];
    for (int i = 0; i <= NW; i++) {
        ctx[i] = (conc_ctx){t, plan, i, 0, 0};
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, i < NW ? conc_writer : conc_reader, &ctx[i]), 0);
    }
    for (int i = 0; i <= NW; i++) pthread_join(th[i], NULL);
    for (int i = 0; i <= NW; i++) ASSERT_EQ_INT(ctx[i].failures, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    /* The writers may outrun the disk so far that every write found the
     * quota full of pending writes (dropped with ENOSPC, no eviction): write
     * more keys one at a time so the quota surely turns over. */
    unsigned char *buf = malloc(g0->chunk_bytes);
    for (uint64_t i = 100; i < 100 + 16; i++) {
        kvo_chunk_key k = ftf_key(i, 0);
        ftf_fill(buf, g0->chunk_bytes, &k);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    free(buf);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_EQ_U64(s.corrupt_removed, 0);
    ASSERT_GT_U64(s.writes, 0);
    ASSERT_GT_U64(s.evictions, 0);
    /* every indexed key reads back right after all that churn */
    for (uint64_t i = 0; i < 40; i++)
        for (uint32_t gi = 0; gi < 2; gi++) {
            kvo_chunk_key k = ftf_key(i, gi);
            uint8_t st;
            ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
            if (st == KVO_READY) ASSERT_EQ_INT(ftf_read_key(t, plan, &k, true), 0);
        }
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Engine blocks -> transfer -> host slot -> file; restart; file -> host slot
 * -> transfer -> other engine blocks: byte-exact, nothing else touched.  The
 * tier is namespaced by the engine's slot layout hash too. */
static void xfer_wait(kvo_transfer *x, uint64_t job) {
    ASSERT_OK(kvo_transfer_wait(x, &job, 1, -1));
    kvo_xfer_result r;
    size_t n = 0;
    ASSERT_OK(kvo_transfer_poll(x, &r, 1, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(r.status, 0);
}

static int wait_read(kvo_file_tier *t) {
    kvo_file_completion c;
    size_t got = 0;
    while (!got) {
        kvo_file_tier_wait(t, KVO_MS(5000));
        ASSERT_OK(kvo_file_tier_poll(t, &c, 1, &got));
    }
    return c.result;
}

KVO_TEST(round_trip_engine_transfer_file) {
    kvo_plan *plan = ftf_plan("ft-xfer", 5000, true);
    const kvo_group_plan *gf = kvo_plan_group(plan, 0), *gs = kvo_plan_group(plan, 1);
    enum { NB = 8 };
    /* engine memory: group 0 as two per-layer tensors, group 1 as one */
    uint64_t bytes0 = NB * gf->page_bytes, bytes1 = NB * gs->page_bytes;
    unsigned char *src = malloc(2 * bytes0 + bytes1), *dst = malloc(2 * bytes0 + bytes1);
    for (uint64_t i = 0; i < 2 * bytes0 + bytes1; i++) src[i] = (unsigned char)(kvo_test_rand() >> 56);
    memset(dst, 0xab, 2 * bytes0 + bytes1);
    kvo_segment seg_src[3] = {{0, src, NB, gf->page_bytes, gf->page_bytes},
                              {0, src + bytes0, NB, gf->page_bytes, gf->page_bytes},
                              {1, src + 2 * bytes0, NB, gs->page_bytes, gs->page_bytes}};
    kvo_segment seg_dst[3] = {{0, dst, NB, gf->page_bytes, gf->page_bytes},
                              {0, dst + bytes0, NB, gf->page_bytes, gf->page_bytes},
                              {1, dst + 2 * bytes0, NB, gs->page_bytes, gs->page_bytes}};
    kvo_transfer_params xp = kvo_transfer_default_params();
    xp.plan = plan;
    kvo_transfer *x1 = NULL, *x2 = NULL;
    ASSERT_OK(kvo_transfer_create(&xp, &x1));
    ASSERT_OK(kvo_transfer_create(&xp, &x2));
    ASSERT_OK(kvo_transfer_set_layout(x1, seg_src, 3));
    ASSERT_OK(kvo_transfer_set_layout(x2, seg_dst, 3));
    uint64_t lh = 0;
    ASSERT_OK(kvo_transfer_layout_hash(x1, &lh));

    /* store: group 0 blocks {1,2}, group 1 blocks {6,7} into host slots */
    unsigned char *slot0 = ftf_aligned_buf(gf->slot_bytes), *slot1 = ftf_aligned_buf(gs->slot_bytes);
    uint64_t b0[2] = {1, 2}, b1[2] = {6, 7};
    kvo_xfer_op ops[2] = {{0, 0, 2, b0, slot0, gf->slot_bytes}, {1, 0, 2, b1, slot1, gs->slot_bytes}};
    uint64_t job = 0;
    ASSERT_OK(kvo_transfer_submit(x1, KVO_XFER_STORE, ops, 2, &job));
    xfer_wait(x1, job);

    kvo_file_tier_params p = ftf_params(ftf_subdir("xfer"), plan);
    p.layout_hash = lh;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char lhx[17];
    snprintf(lhx, sizeof lhx, "%016llx", (unsigned long long)lh);
    ASSERT_CONTAINS(kvo_file_tier_dir(t), lhx);
    kvo_chunk_key keys[2] = {ftf_key(77, 0), ftf_key(78, 1)};
    const void *srcs[2] = {slot0, slot1};
    int res[2];
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, 2, NULL, res, NULL));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(res[1], 0);
    memset(slot0, 0x11, gf->slot_bytes); /* the tier copied: reuse at once */
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_destroy(t);

    /* another slot layout sees nothing of it */
    kvo_file_tier_params p2 = p;
    p2.layout_hash = lh ^ 1;
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    uint8_t st[2];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 2, st));
    ASSERT_EQ_INT(st[0], KVO_MISS);
    kvo_file_tier_destroy(t);

    /* restart; file -> fresh host slots -> the other engine's blocks */
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 2, st));
    ASSERT_EQ_INT(st[0], KVO_READY);
    ASSERT_EQ_INT(st[1], KVO_READY);
    unsigned char *in0 = ftf_aligned_buf(gf->slot_bytes), *in1 = ftf_aligned_buf(gs->slot_bytes);
    void *dsts[2] = {in0, in1};
    ASSERT_OK(kvo_file_tier_read(t, keys, dsts, 2, NULL, res, NULL));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(wait_read(t), 0);
    ASSERT_EQ_INT(wait_read(t), 0);
    uint64_t d0[2] = {5, 3}, d1[2] = {0, 4};
    kvo_xfer_op lops[2] = {{0, 0, 2, d0, in0, gf->slot_bytes}, {1, 0, 2, d1, in1, gs->slot_bytes}};
    ASSERT_OK(kvo_transfer_submit(x2, KVO_XFER_LOAD, lops, 2, &job));
    xfer_wait(x2, job);
    /* every target page equals its source page; every other byte untouched */
    for (int s = 0; s < 3; s++) {
        const kvo_segment *a = &seg_src[s], *b = &seg_dst[s];
        const uint64_t *from = s < 2 ? b0 : b1, *to = s < 2 ? d0 : d1;
        for (uint64_t blk = 0; blk < NB; blk++) {
            const unsigned char *got = (const unsigned char *)b->base + blk * b->block_stride;
            int k = blk == to[0] ? 0 : blk == to[1] ? 1 : -1;
            if (k >= 0) {
                ASSERT_MEM_EQ(got, (const unsigned char *)a->base + from[k] * a->block_stride, a->page_bytes);
            } else {
                for (uint64_t i = 0; i < b->page_bytes; i++)
                    if (got[i] != 0xab) FAILF("segment %d block %llu byte %llu was touched", s,
                                              (unsigned long long)blk, (unsigned long long)i);
            }
        }
    }
    /* a file copied into another slot layout's namespace does not load there */
    char from[KVO__FILE_PATH_MAX], to[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[1], from, sizeof from));
    kvo_file_tier_destroy(t);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[1], to, sizeof to));
    kvo_file_tier_destroy(t);
    char cmd[3 * KVO__FILE_PATH_MAX];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", to, from, to);
    ASSERT_EQ_INT(kvo_test_run(cmd, NULL), 0);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), KVO_ECORRUPT);
    kvo_file_tier_stats fs = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &fs));
    ASSERT_EQ_U64(fs.corrupt_removed, 1);
    kvo_file_tier_destroy(t);
    kvo_transfer_destroy(x1);
    kvo_transfer_destroy(x2);
    free(in0);
    free(in1);
    free(slot0);
    free(slot1);
    free(src);
    free(dst);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsync_policies) {
    kvo_plan *plan = ftf_plan("ft-fsync", 5000, true);
    for (int pol = KVO_FILE_FSYNC_NONE; pol <= KVO_FILE_FSYNC_FULL; pol++) {
        char name[32];
        snprintf(name, sizeof name, "fsync%d", pol);
        kvo_file_tier_params p = ftf_params(ftf_subdir(name), plan);
        p.fsync = (kvo_file_fsync_policy)pol;
        kvo_file_tier *t = NULL;
        ASSERT_OK(kvo_file_tier_create(&p, &t));
        kvo_chunk_key k[2] = {ftf_key(1, 0), ftf_key(2, 1)};
        ftf_write_keys(t, plan, k, 2);
        ASSERT_EQ_INT(ftf_read_key(t, plan, &k[0], true), 0);
        ASSERT_EQ_INT(ftf_read_key(t, plan, &k[1], false), 0);
        kvo_file_tier_destroy(t);
    }
    ASSERT_EQ_STR(kvo_file_fsync_name(KVO_FILE_FSYNC_FULL), "full");
    ASSERT_EQ_STR(kvo_file_io_name(KVO_FILE_IO_THREADS), "threads");
    kvo_file_tier_params bad = ftf_params(ftf_subdir("badp"), plan);
    bad.fsync = (kvo_file_fsync_policy)7;
    kvo_file_tier *t = NULL;
    ASSERT_ERR(kvo_file_tier_create(&bad, &t), KVO_EINVAL);
    kvo_plan_destroy(plan);
}
