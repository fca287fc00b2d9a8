/* `kvoffload bench cascade`: a request's prefix promoted through the
 * cascade from a lower tier into host slots, against a raw batched read of
 * the same bytes from that tier, measured in the same run.
 *
 *   kvoffload bench cascade [--json] [--chunks N] [--chunk-kib K] [--reps N]
 *                           [--dir DIR] [--depth N] [--remote redis://host:port[,...]]
 *
 * The prefix: N chunks (default 256) of K KiB (default 256) of one group,
 * present only in the file tier (then, with --remote, only in the Redis
 * Cluster tier); --depth sets the file tier's queue_depth (reads in flight,
 * default the tier's own).  The cascade's time runs from kvo_cascade_lookup(PREFIX |
 * PROMOTE) of the whole prefix, with an empty host tier, until every
 * promotion's completion was polled (the engine's view: the keys are READY
 * in host slots, verified).  The limits do the same reads without the
 * cascade and without verification:
 *  - file: open each chunk file (O_DIRECT when the tier uses it) and read
 *    its payload with io_uring into aligned buffers, as many reads in
 *    flight as the tier keeps (its queue_depth: the same parallelism, so
 *    the ratio is the cascade's and the tier's own cost), or threads doing
 *    pread where io_uring is not built;
 *  - remote: the tier's key names read with pipelined GETs (bench_redis.c,
 *    the same limit as bench remote's), as many threads as the tier has
 *    workers, each with a connection per master, in batches of the tier's
 *    batch size (the values: header and payload, not checked).
 * Figures: cascade.file.<K>KiB.qd<D>, cascade.remote.<K>KiB (the cascade
 * knows the cluster holds the prefix: its presence answers are cached, as
 * an engine's lookups keep them) and cascade.remote_cold.<K>KiB (a fresh
 * cascade: the lookup asks the cluster, waits for the answers, then
 * promotes) in GB/s of payload,
 * ratio to the raw read (goal >= 0.83), medians of --reps rounds (default
 * 5) in which the raw read and the cascade alternate going first.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "kvoffload/kvo_cascade.h"
#include "kvoffload/kvo_remote_tier.h"

#if KVO_HAVE_URING
#include <liburing.h>
#endif
#include "bench_redis.h"

#define BC_REPS_MAX 25

typedef struct bc_cfg {
    uint64_t chunks, chunk;
    uint32_t reps, depth; /* depth: the file tier's queue_depth (0: its default) */
    const char *dir, *remote;
} bc_cfg;

static kvo_chunk_key bc_key(uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 0xcafe;
    k.hash.hi = (i + (uint64_t)getpid()) ^ 0x5555aaaa5555aaaaull;
    return k;
}

/* The cascade's pass: lookup with promotion of every key (waiting for the
 * cluster's presence answers when wait_ns > 0), then poll until every
 * completion came.  Seconds, or -1 (a promotion failed). */
static double bc_cascade_pass(kvo_cascade *c, const kvo_chunk_key *keys, uint64_t n, int64_t wait_ns) {
    uint8_t *st = malloc(n * 2);
    kvo_cascade_completion cq[64];
    (void)kvo_cascade_invalidate(c, UINT64_MAX, NULL); /* an empty host tier */
    double t0 = kvo_bench_now();
    kvo_cascade_lookup_result r;
    kvo_cascade_wait w = {0};
    int rc = kvo_cascade_lookup(c, keys, n, KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE, wait_ns ? &w : NULL, wait_ns, st,
                                st + n, &r);
    uint64_t done = 0, failed = rc != 0 || r.promoting != n;
    int why = rc ? rc : failed ? KVO_EAGAIN : 0;
    while (!failed && done < n) {
        size_t m = 0;
        if (kvo_cascade_poll(c, cq, 64, &m)) break;
        for (size_t i = 0; i < m; i++)
            if (cq[i].result) {
                failed++;
                why = cq[i].result;
            }
        done += m;
        if (!m) (void)kvo_cascade_wait_events(c, KVO_MS(1000));
    }
    double dt = kvo_bench_now() - t0;
    free(st);
    if (failed)
        fprintf(stderr, "kvoffload bench cascade: %llu of %llu promotions failed (%s; %zu of them started)\n",
                (unsigned long long)failed, (unsigned long long)n, kvo_error_name(why), rc ? 0 : r.promoting);
    return failed ? -1.0 : dt;
}

/* ----------------------------------------------------------- file tier -- */

typedef struct bc_files {
    char (*path)[4096];
    uint64_t n, bytes; /* payload bytes read per file (the slot) */
    uint32_t depth;    /* reads in flight */
    bool direct;
    unsigned char *bufs; /* n aligned buffers */
} bc_files;

#if KVO_HAVE_URING
/* Open every file and read its payload (offset KVO_FILE_HEADER_BYTES) with
 * io_uring, f->depth reads in flight.  Seconds, or -1. */
static double bc_raw_files(const bc_files *f) {
    const uint64_t DEPTH = f->depth;
    struct io_uring ring;
    if (io_uring_queue_init((unsigned)DEPTH, &ring, 0)) return -1.0;
    int *fds = malloc(f->n * sizeof *fds);
    double t0 = kvo_bench_now();
    uint64_t next = 0, done = 0, inflight = 0;
    int failed = 0;
    while (done < f->n && !failed) {
        while (inflight < DEPTH && next < f->n) {
            fds[next] = open(f->path[next], O_RDONLY | O_CLOEXEC | (f->direct ? O_DIRECT : 0));
            if (fds[next] < 0) {
                failed = 1;
                break;
            }
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_read(sqe, fds[next], f->bufs + next * f->bytes, (unsigned)f->bytes, KVO_FILE_HEADER_BYTES);
            io_uring_sqe_set_data64(sqe, next);
            next++;
            inflight++;
        }
        if (io_uring_submit_and_wait(&ring, 1) < 0) {
            failed = 1;
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            uint64_t i = io_uring_cqe_get_data64(cqe);
            if (cqe->res < (int)f->bytes) failed = 1;
            close(fds[i]);
            seen++;
        }
        io_uring_cq_advance(&ring, seen);
        done += seen;
        inflight -= seen;
    }
    double dt = kvo_bench_now() - t0;
    io_uring_queue_exit(&ring);
    free(fds);
    return failed ? -1.0 : dt;
}
#else
typedef struct bc_raw_arg {
    const bc_files *f;
    uint64_t id, threads;
    int failed;
} bc_raw_arg;

static void *bc_raw_file_thread(void *p) {
    bc_raw_arg *a = p;
    for (uint64_t i = a->id; i < a->f->n; i += a->threads) {
        int fd = open(a->f->path[i], O_RDONLY | O_CLOEXEC | (a->f->direct ? O_DIRECT : 0));
        unsigned char *dst = a->f->bufs + i * a->f->bytes;
        if (fd < 0 || pread(fd, dst, a->f->bytes, KVO_FILE_HEADER_BYTES) < (ssize_t)a->f->bytes)
            a->failed = 1;
        if (fd >= 0) close(fd);
    }
    return NULL;
}

/* Without io_uring: f->depth threads doing pread.  Seconds, or -1. */
static double bc_raw_files(const bc_files *f) {
    pthread_t th[64];
    bc_raw_arg a[64];
    uint32_t T = f->depth > 64 ? 64 : f->depth;
    double t0 = kvo_bench_now();
    for (uint32_t i = 0; i < T; i++) {
        a[i] = (bc_raw_arg){f, (uint64_t)i, T, 0};
        pthread_create(&th[i], NULL, bc_raw_file_thread, &a[i]);
    }
    int failed = 0;
    for (uint32_t i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        failed |= a[i].failed;
    }
    double dt = kvo_bench_now() - t0;
    return failed ? -1.0 : dt;
}
#endif

static void bc_size_name(uint64_t size, char *out, size_t cap) {
    if (size % (1u << 20) == 0) snprintf(out, cap, "%lluMiB", (unsigned long long)(size >> 20));
    else snprintf(out, cap, "%lluKiB", (unsigned long long)(size >> 10));
}

/* Report the medians of a pair of passes (seconds) as GB/s of payload. */
static void bc_report(const kvo_bench_out *o, const char *tier, const bc_cfg *c, double *raw, double *casc,
                      uint32_t reps, uint32_t depth) {
    double bytes = (double)(c->chunks * c->chunk);
    double r = kvo_bench_median(raw, reps), t = kvo_bench_median(casc, reps);
    char sn[48], name[96], lim[96];
    bc_size_name(c->chunk, sn, sizeof sn);
    if (depth) snprintf(sn + strlen(sn), sizeof sn - strlen(sn), ".qd%u", depth);
    snprintf(name, sizeof name, "cascade.%s.%s", tier, sn);
    snprintf(lim, sizeof lim, "raw_%s_read.%s", tier, sn);
    kvo_bench_report(o, name, bytes / t / 1e9, "GB/s", lim, bytes / r / 1e9);
}

static int bc_file(const bc_cfg *c, kvo_plan *plan, const kvo_chunk_key *keys, const kvo_bench_out *o) {
    char root[4096];
    snprintf(root, sizeof root, "%s/kvo-bench-cascade-%d", c->dir, (int)getpid());
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    fp.root = root;
    fp.plan = plan;
    fp.quota_bytes = (c->chunks + 8) * g->slot_bytes;
    fp.max_staging_bytes = UINT64_C(256) << 20;
    fp.max_pending_writes = 1024;
    fp.log_interval_s = 3600;
    if (c->depth) fp.queue_depth = c->depth;
    kvo_file_tier *ft = NULL;
    kvo_cascade *casc = NULL;
    int rc = kvo_file_tier_create(&fp, &ft);
    bc_files f = {0};
    unsigned char *src = malloc(g->chunk_bytes);
    if (rc) goto out;
    for (uint64_t i = 0; i < g->chunk_bytes; i++) src[i] = (unsigned char)(i * 131 + 7);
    for (uint64_t i = 0; i < c->chunks; i++) {
        const void *s = src;
        int r = KVO_EAGAIN;
        while (!rc && r == KVO_EAGAIN) {
            rc = kvo_file_tier_write(ft, &keys[i], &s, 1, NULL, &r, NULL);
            if (r == KVO_EAGAIN) (void)kvo_file_tier_flush(ft, KVO_MS(1000));
        }
        if (!rc && r) rc = r;
    }
    if (!rc) rc = kvo_file_tier_flush(ft, -1);
    if (rc) goto out;
    kvo_cascade_params cp = kvo_cascade_default_params();
    cp.plan = plan;
    cp.host_bytes = (c->chunks + 8) * g->slot_bytes;
    cp.file_tier = ft;
    if ((rc = kvo_cascade_create(&cp, &casc))) goto out;
    f.n = c->chunks;
    f.bytes = g->slot_bytes;
    f.direct = kvo_file_tier_direct(ft);
    f.depth = fp.queue_depth ? fp.queue_depth : 4;
    f.path = malloc(c->chunks * sizeof *f.path);
    if (posix_memalign((void **)&f.bufs, 4096, c->chunks * g->slot_bytes)) f.bufs = NULL;
    if (!f.path || !f.bufs) {
        rc = KVO_ENOMEM;
        goto out;
    }
    memset(f.bufs, 0, c->chunks * g->slot_bytes);
    for (uint64_t i = 0; i < c->chunks; i++)
        (void)kvo_file_chunk_path(kvo_file_tier_dir(ft), &keys[i], f.path[i], sizeof f.path[i]);
    double raw[BC_REPS_MAX], tier[BC_REPS_MAX];
    for (uint32_t r = 0; r < c->reps && !rc; r++) {
        bool raw_first = r % 2 == 0;
        if (raw_first) raw[r] = bc_raw_files(&f);
        tier[r] = bc_cascade_pass(casc, keys, c->chunks, 0);
        if (!raw_first) raw[r] = bc_raw_files(&f);
        if (raw[r] < 0 || tier[r] < 0) rc = KVO_EIO;
    }
    if (!rc) bc_report(o, "file", c, raw, tier, c->reps, f.depth);
out:
    if (rc) fprintf(stderr, "kvoffload bench cascade: file tier: %s\n", kvo_last_error());
    kvo_cascade_destroy(casc);
    kvo_file_tier_destroy(ft);
    free(f.path);
    free(f.bufs);
    free(src);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "kvoffload bench cascade: could not remove %s\n", root);
    return rc ? -1 : 0;
}

/* --------------------------------------------------------- remote tier -- */

#if KVO_HAVE_REDIS
/* The raw pass's key names: the tier's own. */
static void bc_name(uint64_t i, char *out, size_t cap, const void *ctx) {
    snprintf(out, cap, "%s", ((const char (*)[128])ctx)[i]);
}

static int bc_remote(const bc_cfg *c, kvo_plan *plan, const kvo_chunk_key *keys, const kvo_bench_out *o) {
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    char pfx[64];
    snprintf(pfx, sizeof pfx, "kvobench-cascade-%d", (int)getpid());
    rp.url = c->remote;
    rp.plan = plan;
    rp.key_prefix = pfx;
    rp.ttl_s = 600; /* the benchmark's keys leave on their own */
    rp.max_staging_bytes = UINT64_C(256) << 20;
    rp.max_pending_writes = 1024;
    rp.max_pending_reads = (uint32_t)(c->chunks + 64);
    kvo_remote_tier *rt = NULL;
    kvo_cascade *casc = NULL;
    kvo_bench_redis *m = calloc(1, sizeof *m);
    char (*names)[128] = malloc(c->chunks * sizeof *names);
    unsigned char *src = malloc(g->chunk_bytes);
    int rc = !m || !src || !names ? KVO_ENOMEM : kvo_remote_tier_create(&rp, &rt);
    if (rc) goto out;
    for (uint64_t i = 0; i < g->chunk_bytes; i++) src[i] = (unsigned char)(i * 131 + 7);
    for (uint64_t i = 0; i < c->chunks && !rc; i++) {
        const void *s = src;
        int r = KVO_EAGAIN;
        while (!rc && r == KVO_EAGAIN) {
            rc = kvo_remote_tier_put(rt, &keys[i], &s, 1, NULL, &r, NULL);
            if (r == KVO_EAGAIN) (void)kvo_remote_tier_flush(rt, KVO_MS(1000));
        }
        if (!rc && r) rc = r;
    }
    if (!rc) rc = kvo_remote_tier_flush(rt, -1);
    kvo_cascade_params cp = kvo_cascade_default_params();
    cp.plan = plan;
    cp.host_bytes = (c->chunks + 8) * g->slot_bytes;
    cp.remote_tier = rt;
    cp.remote_lookup_budget_us = 60u * 1000 * 1000;
    cp.remote_exists_ttl_ms = 600u * 1000; /* the warm figure's answers outlive the run */
    if (!rc) rc = kvo_cascade_create(&cp, &casc);
    if (rc) goto out;
    /* the warm figure: the cascade knows that the prefix is there (one round
     * of presence answers) before the clock runs, as an engine's lookups keep
     * them; the cold one asks (a fresh cascade each round, made before its
     * clock runs) and waits for the answers inside the pass */
    uint8_t *st = malloc(c->chunks * 2);
    kvo_cascade_wait w = {0};
    rc = kvo_cascade_lookup(casc, keys, c->chunks, KVO_CASCADE_PREFIX, &w, KVO_MS(30000), st, st + c->chunks, NULL);
    free(st);
    if (rc) goto out;
    char why[512];
    if (kvo_bench_redis_open(c->remote, m, why, sizeof why)) {
        rc = kvo__error(KVO_EIO, "the raw limit: %s", why);
        goto out;
    }
    for (uint64_t i = 0; i < c->chunks; i++) (void)kvo_remote_tier_key_name(rt, &keys[i], names[i], 128);
    double raw[BC_REPS_MAX], tier[BC_REPS_MAX], cold[BC_REPS_MAX];
    for (uint32_t r = 0; r < c->reps && !rc; r++) {
        bool raw_first = r % 2 == 0;
        uint64_t bytes = 0;
        kvo_cascade *fresh = NULL;
        cp.remote_exists_ttl_ms = kvo_cascade_default_params().remote_exists_ttl_ms;
        if ((rc = kvo_cascade_create(&cp, &fresh))) break;
        if (raw_first) raw[r] = kvo_bench_redis_pass(m, rp.io_threads, rp.batch_max, c->chunks, bc_name, names, NULL, 0,
                                                     &bytes);
        tier[r] = bc_cascade_pass(casc, keys, c->chunks, 0);
        cold[r] = bc_cascade_pass(fresh, keys, c->chunks, KVO_MS(30000));
        if (!raw_first) raw[r] = kvo_bench_redis_pass(m, rp.io_threads, rp.batch_max, c->chunks, bc_name, names, NULL,
                                                      0, &bytes);
        kvo_cascade_destroy(fresh);
        if (raw[r] < 0 || tier[r] < 0 || cold[r] < 0) rc = KVO_EIO;
    }
    if (!rc) bc_report(o, "remote", c, raw, tier, c->reps, 0);
    if (!rc) bc_report(o, "remote_cold", c, raw, cold, c->reps, 0);
out:
    if (rc) fprintf(stderr, "kvoffload bench cascade: remote tier: %s\n", kvo_last_error());
    kvo_cascade_destroy(casc);
    kvo_remote_tier_destroy(rt);
    if (m) memset(&m->url, 0, sizeof m->url); /* no copy of the password left */
    free(m);
    free(names);
    free(src);
    return rc ? -1 : 0;
}
#endif

int kvo_bench_cascade(int argc, char **argv, const kvo_bench_out *o) {
    bc_cfg c = {256, 256u << 10, 5, 0, NULL, NULL};
    const char *tmp = getenv("TMPDIR");
    c.dir = tmp && tmp[0] ? tmp : "/var/tmp";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--chunks") && v) c.chunks = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--chunk-kib") && v) c.chunk = strtoull(argv[++i], NULL, 10) << 10;
        else if (!strcmp(a, "--reps") && v) c.reps = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--dir") && v) c.dir = argv[++i];
        else if (!strcmp(a, "--depth") && v) c.depth = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--remote") && v) c.remote = argv[++i];
        else {
            fprintf(stderr, "usage: kvoffload bench cascade [--json] [--chunks N] [--chunk-kib K] [--reps N] "
                            "[--dir DIR] [--depth N] [--remote redis://host:port[,...]]\n");
            return 2;
        }
    }
    if (!c.chunks || c.chunks > 65536 || c.chunk < 8192 || c.chunk % 8192 || !c.reps || c.reps > BC_REPS_MAX) {
        fprintf(stderr, "kvoffload bench cascade: --chunks takes 1..65536, --chunk-kib a multiple of 8 from 8, "
                        "--reps 1..%d\n",
                BC_REPS_MAX);
        return 2;
    }
    kvo_plan *plan = kvo_bench_plan_one("bench-cascade", c.chunk / 2, 2);
    kvo_chunk_key *keys = malloc(c.chunks * sizeof *keys);
    if (!plan || !keys) {
        fprintf(stderr, "kvoffload bench cascade: %s\n", plan ? "out of memory" : kvo_last_error());
        kvo_plan_destroy(plan);
        free(keys);
        return 1;
    }
    for (uint64_t i = 0; i < c.chunks; i++) keys[i] = bc_key(i);
    int rc = bc_file(&c, plan, keys, o);
    if (c.remote) {
#if KVO_HAVE_REDIS
        rc |= bc_remote(&c, plan, keys, o);
#else
        fprintf(stderr, "kvoffload bench cascade: built without hiredis: --remote is not available\n");
        rc = -1;
#endif
    }
    free(keys);
    kvo_plan_destroy(plan);
    return rc ? 1 : 0;
}
