/* `kvoffload bench file`: file-tier write and read bandwidth for chunks of
 * 256 KiB to 8 MiB against the raw bandwidth of the same file system doing
 * the same work in the same run: as many threads as the tier has writers,
 * one O_DIRECT file per chunk of the tier's file size in the same 256
 * fan-out directories; new files for the first fill (the tier creates a
 * file per chunk), in-place overwrites of existing files for the writes
 * once the quota is full (each evicts an old chunk, whose file the tier
 * recycles), whole-file reads for the reads; the writes from a ring of
 * buffers as large as the tier's writes in flight (see raw_job).  Only bytes that reached a
 * file count; a write or read that was dropped or failed makes the run exit
 * non-zero.  Also the index rebuild time at startup against a bare walk of
 * the same tree (kvo_file_walk without stat: readdir and name parsing).
 *
 *   kvoffload bench file [--json] [--dir DIR] [--total-mib N] [--sizes K,K..]
 *                        [--rebuild-files N] [--io auto|uring|threads] [--depth N]
 *                        [--reps N]
 *
 * Within one round the raw limit and the tier take turns in slices of
 * at least 64 MiB and 32 chunks through each phase (first fill, reads,
 * full-quota writes), each side timed on its own slices, so that a stall of
 * the shared disk or CPU longer than a slice hits both alike (whole passes
 * one after the other see different machines: ratios moved 0.5-1.8 between
 * runs).  --reps rounds per size (3 by default), each figure the median of
 * its rounds.
 *
 * --dir defaults to $KVO_BENCH_DIR, else /var/tmp (a real disk; /tmp may be a
 * tmpfs).  --rebuild-files defaults to 20000 (use 100000 for the issue's
 * figure; it takes a while on a shared machine).  Everything the benchmark
 * writes is removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}
static void rm_rf(const char *path) { nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static kvo_plan *bench_plan(uint64_t chunk_bytes) {
    char name[64];
    snprintf(name, sizeof name, "bench-file-%llu", (unsigned long long)chunk_bytes);
    return kvo_bench_plan_one(name, chunk_bytes / 2, 2);
}

static kvo_chunk_key bkey(uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 1;
    k.hash.hi = i ^ 0x5555aaaa5555aaaaull;
    return k;
}

/* Queue one chunk write; on back-pressure (KVO_EAGAIN) wait `us` and retry
 * (the benchmark waits instead of dropping).  The final result: 0 queued,
 * else the write was dropped (KVO_ENOSPC, KVO_EEXIST...). */
static int write_wait(kvo_file_tier *t, const kvo_chunk_key *k, const void *src, unsigned us) {
    for (;;) {
        int r = 0;
        kvo_file_tier_write(t, k, &src, 1, NULL, &r, NULL);
        if (r != KVO_EAGAIN) return r;
        usleep(us);
    }
}

/* Writes that did not reach a file between two stats snapshots: dropped
 * by the worker (ENOSPC, EIO) or for the quota.  Back-pressure drops are
 * not here: write_wait retries them. */
static uint64_t g_backpressure; /* writes the tier refused for back-pressure (and write_wait retried) */

static uint64_t async_drops(const kvo_file_tier_stats *a, const kvo_file_tier_stats *b) {
    return (b->dropped_nospace - a->dropped_nospace) + (b->dropped_io - a->dropped_io) +
           (b->dropped_quota - a->dropped_quota);
}

/* Completions left after a flush (write completions, with --writes
 * borrowed): drained so that the read slices see only theirs. */
static void drain_completions(kvo_file_tier *t) {
    kvo_file_completion c[64];
    size_t m = 0;
    do {
        m = 0;
        (void)kvo_file_tier_poll(t, c, 64, &m);
    } while (m);
}

/* A write slice's end: the caller's CPU since c0 (its thread inside the
 * writes and back-pressure waits), the flush (the slice's seconds since t0),
 * the completions left drained, and the counts against the stats a taken
 * at its start: *ok the writes that reached a file, *dropped those refused
 * at once (refused) or dropped later, *recycled those that overwrote an
 * evicted file. */
static double write_slice_end(kvo_file_tier *t, const kvo_file_tier_stats *a, uint64_t refused, double t0, double c0,
                              uint64_t *ok, uint64_t *dropped, uint64_t *recycled, double *caller_cpu) {
    *caller_cpu += kvo_bench_thread_cpu() - c0;
    kvo_file_tier_flush(t, -1);
    double dt = kvo_bench_now() - t0;
    drain_completions(t);
    kvo_file_tier_stats b = KVO_FILE_TIER_STATS_INIT;
    kvo_file_tier_get_stats(t, &b);
    *ok += b.writes - a->writes;
    *dropped += refused + async_drops(a, &b);
    g_backpressure += b.dropped_backpressure - a->dropped_backpressure;
    *recycled += b.recycled_files - a->recycled_files;
    return dt;
}

/* Write chunks first..first+n-1 and flush: seconds, and the counts of
 * write_slice_end (back-pressure is waited out, not counted). */
static double tier_write_slice(kvo_file_tier *t, uint64_t first, uint64_t n, unsigned char *src, uint64_t *ok,
                               uint64_t *dropped, uint64_t *recycled, double *caller_cpu) {
    kvo_file_tier_stats a = KVO_FILE_TIER_STATS_INIT;
    kvo_file_tier_get_stats(t, &a);
    uint64_t refused = 0;
    double t0 = kvo_bench_now(), c0 = kvo_bench_thread_cpu();
    for (uint64_t i = first; i < first + n; i++) {
        kvo_chunk_key k = bkey(i);
        src[0] = (unsigned char)i;
        refused += write_wait(t, &k, src, 50) != 0;
    }
    return write_slice_end(t, &a, refused, t0, c0, ok, dropped, recycled, caller_cpu);
}

/* tier_write_slice with borrowed writes (kvo_file_tier_write_borrowed):
 * chunk i comes from the payload part of one of the nring file images of
 * ring (stride bytes apart, the raw limit's ring), lent to the tier until
 * its completion hands the image back (user data: its index). */
static double tier_write_borrowed_slice(kvo_file_tier *t, uint64_t first, uint64_t n, unsigned char *ring,
                                        uint64_t nring, uint64_t stride, uint64_t *ok, uint64_t *dropped,
                                        uint64_t *recycled, double *caller_cpu) {
    kvo_file_tier_stats a = KVO_FILE_TIER_STATS_INIT;
    kvo_file_tier_get_stats(t, &a);
    uint64_t refused = 0, free_list[64], n_free = 0;
    for (uint64_t r = 0; r < nring && r < 64; r++) free_list[n_free++] = r;
    double t0 = kvo_bench_now(), c0 = kvo_bench_thread_cpu();
    for (uint64_t i = first; i < first + n;) {
        kvo_file_completion c[64];
        size_t m = 0;
        if (!n_free) kvo_file_tier_wait(t, KVO_MS(1000));
        (void)kvo_file_tier_poll(t, c, 64, &m);
        for (size_t j = 0; j < m; j++) free_list[n_free++] = c[j].user_data;
        if (!n_free) continue;
        uint64_t slot = free_list[--n_free];
        kvo_chunk_key k = bkey(i);
        unsigned char *src = ring + slot * stride + KVO_FILE_HEADER_BYTES;
        src[0] = (unsigned char)i;
        const void *sp = src;
        int r = 0;
        kvo_file_tier_write_borrowed(t, &k, &sp, NULL, 1, &slot, &r, NULL);
        if (r == KVO_EAGAIN) { /* back-pressure: the image is still ours; wait */
            free_list[n_free++] = slot;
            usleep(50);
            continue;
        }
        if (r != 0) {
            refused++;
            free_list[n_free++] = slot;
        }
        i++;
    }
    return write_slice_end(t, &a, refused, t0, c0, ok, dropped, recycled, caller_cpu);
}

/* Read chunks first..first+n-1 with up to RD_DEPTH in flight, verified:
 * seconds; *ok counts the reads that succeeded, *dropped the others. */
enum { RD_DEPTH = 8 };
static double tier_read_slice(kvo_file_tier *t, uint64_t first, uint64_t n, unsigned char *dst[RD_DEPTH],
                              uint64_t *ok, uint64_t *dropped) {
    int busy[RD_DEPTH] = {0};
    uint64_t next = first, done = 0, good = 0;
    double t0 = kvo_bench_now();
    while (done < n) {
        for (int s = 0; s < RD_DEPTH && next < first + n; s++) {
            if (busy[s]) continue;
            kvo_chunk_key k = bkey(next);
            void *d = dst[s];
            uint64_t ud = (uint64_t)s;
            int r = 0;
            kvo_file_tier_read(t, &k, &d, 1, &ud, &r, NULL);
            next++;
            if (r == 0) busy[s] = 1;
            else done++;
        }
        kvo_file_completion c[RD_DEPTH];
        kvo_file_tier_wait(t, KVO_MS(1000));
        size_t m = 0;
        (void)kvo_file_tier_poll(t, c, RD_DEPTH, &m);
        for (size_t i = 0; i < m; i++) {
            busy[c[i].user_data] = 0;
            done++;
            good += c[i].result == 0;
        }
    }
    double dt = kvo_bench_now() - t0;
    *ok += good;
    *dropped += n - good;
    return dt;
}

/* The same-work raw limit: `threads` threads (the tier's writer threads)
 * each taking chunk numbers from a shared counter and moving one whole file
 * per chunk (4096-byte header + payload slot, the tier's file size) with
 * O_DIRECT, in the same 256 fan-out directories (made before the clock
 * starts).  RAW_NEW creates each file (O_CREAT|O_EXCL, as the tier's first
 * fill makes a new inode per chunk), RAW_OVERWRITE overwrites the existing
 * files in place (the tier's recycled files once the quota is full),
 * RAW_READ reads them whole.  Only the payload bytes are counted, as for the
 * tier.  Writes take chunk i's bytes from ring[i % nring], a ring of file
 * images as large as the tier's writes in flight (max_pending_writes, within
 * its staging memory): the same memory each side's disk writes come from.
 * RAW_OVERWRITE_HOT overwrites from each thread's one buffer instead: on
 * this project's VMs a virtual disk
 * writes a few reused, cache-resident buffers 1.3-1.4x faster than the same
 * bytes from a 16-64 MiB ring, a case no offload has (each chunk is written
 * once, from its own slot); reported beside, as `.vs_hot_buffers`.  Reads go
 * into each thread's buffer, as the tier's into its few destinations. */
enum { RAW_NEW, RAW_OVERWRITE, RAW_READ, RAW_OVERWRITE_HOT };

typedef struct raw_job {
    const char *dir;
    uint64_t first, n, chunk, file_bytes;
    int mode;
    bool direct;
    unsigned char *bufs;          /* one file image per thread, made and
                                     pre-faulted before any clock starts */
    unsigned char *ring;          /* nring file images, the same */
    uint64_t nring;
    atomic_uint_fast64_t next, moved;
    atomic_uint started;          /* threads of this slice: each its buffer */
    atomic_int failed;
} raw_job;

static void raw_path(const raw_job *j, uint64_t i, char *out, size_t cap) {
    snprintf(out, cap, "%s/%02x/raw.%llu", j->dir, (unsigned)(i & 0xff), (unsigned long long)i);
}

static void *raw_worker(void *arg) {
    raw_job *j = arg;
    unsigned char *buf = j->bufs + (uint64_t)atomic_fetch_add(&j->started, 1) * j->file_bytes;
    char path[4096];
    for (;;) {
        uint64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n || atomic_load(&j->failed)) break;
        raw_path(j, j->first + i, path, sizeof path);
        int flags = j->mode == RAW_READ ? O_RDONLY : j->mode == RAW_NEW ? O_WRONLY | O_CREAT | O_EXCL : O_WRONLY;
        int fd = open(path, flags | O_CLOEXEC | (j->direct ? O_DIRECT : 0), 0644);
        const unsigned char *from = j->mode == RAW_OVERWRITE_HOT ? buf : j->ring + ((j->first + i) % j->nring) * j->file_bytes;
        ssize_t r = -1;
        if (fd >= 0) {
            r = j->mode == RAW_READ ? pread(fd, buf, j->file_bytes, 0) : pwrite(fd, from, j->file_bytes, 0);
            close(fd);
        }
        if (r != (ssize_t)j->file_bytes) {
            atomic_store(&j->failed, 1);
            break;
        }
        atomic_fetch_add(&j->moved, j->chunk);
    }
    return NULL;
}

/* One raw slice: chunks first..first+n-1; seconds, or -1. */
static double raw_slice(raw_job *j, int mode, uint32_t threads, uint64_t first, uint64_t n) {
    pthread_t th[64];
    if (threads > 64) threads = 64;
    j->mode = mode;
    j->first = first;
    j->n = n;
    atomic_store(&j->next, 0);
    atomic_store(&j->moved, 0);
    atomic_store(&j->started, 0);
    uint32_t started = 0;
    double t0 = kvo_bench_now();
    for (; started < threads; started++)
        if (pthread_create(&th[started], NULL, raw_worker, j)) break;
    for (uint32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    double dt = kvo_bench_now() - t0;
    if (started == 0 || atomic_load(&j->failed) || atomic_load(&j->moved) != n * j->chunk) return -1;
    return dt;
}

static uint32_t g_depth = 0; /* --depth: queue depth / threads; 0 = defaults */
#define FILE_REPS_MAX 25
static uint32_t g_reps = 3;  /* --reps: rounds of raw and tier per size */
static bool g_borrowed = false; /* --writes borrowed: the tier's writes lend their sources */


/* One round for one chunk size, raw and tier interleaved slice by slice.
 * The raw limit's files (a directory of 256 fan-out directories) and the
 * tier (quota n + 4 chunks) are made first; then each phase moves its n
 * chunks in slices of at least 64 MiB and 32 chunks, a raw slice and a
 * tier slice in turn (the first of each pair alternating), each side timed
 * on its own slices only.  So a stall of the shared disk or CPU lasting
 * longer than a slice (tens of milliseconds) hits both sides alike, where
 * whole passes one after the other (before) saw different machines.
 * Phases: the first fill (new files both sides), reads of every chunk, then
 * n more chunk writes with the quota full (each evicts an old chunk whose
 * file the tier recycles) against in-place overwrites of the raw files.
 * bw[] gets payload bytes/s: raw new, raw overwrite, raw read, tier write,
 * tier read, tier full-quota write, raw overwrite from hot buffers (run in
 * the same slices of the full-quota phase); *recycled_frac the fraction of the
 * full-quota writes that recycled a file.  *dropped counts writes that did
 * not reach a file and reads that failed.  0, or -1. */
enum { PH_FILL, PH_READ, PH_CHURN };
static int pair_bw(const char *work, kvo_file_io_kind io, uint64_t n, uint64_t chunk, uint64_t file_bytes,
                   uint32_t threads, uint32_t round, bool *rdirect, bool *tdirect, double bw[7],
                   double *recycled_frac, double *caller_us, const char **backend, uint64_t *dropped) {
    char dir[4096], sub[4200];
    snprintf(dir, sizeof dir, "%s/raw.%ld", work, (long)getpid());
    if (mkdir(dir, 0755) != 0) return -1;
    for (unsigned b = 0; b < 256; b++) {
        snprintf(sub, sizeof sub, "%s/%02x", dir, b);
        if (mkdir(sub, 0755) != 0) {
            rm_rf(dir);
            return -1;
        }
    }
    raw_job j;
    memset(&j, 0, sizeof j);
    j.dir = dir;
    j.chunk = chunk;
    j.file_bytes = file_bytes;
    if (threads > 64) threads = 64;
    if (posix_memalign((void **)&j.bufs, 4096, threads * file_bytes)) {
        rm_rf(dir);
        return -1;
    }
    memset(j.bufs, 0xa5, threads * file_bytes); /* pre-faulted, like the tier's staging */
    /* the tier below: staging for 16 files or 64 MiB, 64 writes queued at
     * most; the ring: as many file images as it can have writes in flight */
    uint64_t staging = 16 * file_bytes < (UINT64_C(64) << 20) ? UINT64_C(64) << 20 : 16 * file_bytes;
    const uint32_t pending = 64;
    j.nring = staging / file_bytes < pending ? staging / file_bytes : pending;
    if (posix_memalign((void **)&j.ring, 4096, j.nring * file_bytes)) {
        free(j.bufs);
        rm_rf(dir);
        return -1;
    }
    memset(j.ring, 0xa5, j.nring * file_bytes);
    /* O_DIRECT as the tier decides it: refused here (tmpfs): buffered */
    snprintf(sub, sizeof sub, "%s/probe", dir);
    int fd = open(sub, O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    j.direct = fd >= 0;
    if (fd >= 0) close(fd);
    unlink(sub);
    *rdirect = j.direct;

    kvo_plan *plan = bench_plan(chunk);
    if (!plan) {
        free(j.bufs);
        free(j.ring);
        rm_rf(dir);
        return -1;
    }
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = work;
    p.plan = plan;
    p.io = io;
    p.quota_bytes = (n + 4) * g->slot_bytes;
    p.max_staging_bytes = staging;
    p.max_pending_writes = pending;
    p.log_interval_s = 3600;
    p.write_completions = g_borrowed; /* a lent image comes back with its completion */
    if (g_depth) {
        p.queue_depth = g_depth;
        p.io_threads = g_depth;
    }
    kvo_file_tier *t = NULL;
    unsigned char *src = NULL, *dst[RD_DEPTH] = {0};
    int rc = -1;
    if (kvo_file_tier_create(&p, &t)) {
        fprintf(stderr, "bench file: %s\n", kvo_last_error());
        goto out;
    }
    *tdirect = kvo_file_tier_direct(t);
    *backend = kvo_file_tier_backend(t);
    if (posix_memalign((void **)&src, 4096, g->slot_bytes)) goto out;
    memset(src, 0x3c, g->slot_bytes);
    for (int i = 0; i < RD_DEPTH; i++)
        if (posix_memalign((void **)&dst[i], 4096, g->slot_bytes)) goto out;
    /* slices of at least 64 MiB and 32 chunks: each tier slice starts with
     * one staging copy before its first write and ends with a drain (the
     * flush), and the raw slice with its threads' last files; with 8-chunk
     * slices that fill and drain cost the tier 20-50 % at 4-8 MiB chunks */
    uint64_t per = (UINT64_C(64) << 20) / chunk;
    if (per < 32) per = 32;
    uint64_t recycled = 0;
    double caller_cpu = 0;
    for (int ph = PH_FILL; ph <= PH_CHURN; ph++) {
        double rsec = 0, tsec = 0, hsec = 0;
        uint64_t tok = 0;
        for (uint64_t first = 0, sl = 0; first < n; first += per, sl++) {
            uint64_t m = n - first < per ? n - first : per;
            for (int half = 0; half < 2; half++) {
                if ((half == 0) == ((sl + round) % 2 == 0)) {
                    int mode = ph == PH_FILL ? RAW_NEW : ph == PH_READ ? RAW_READ : RAW_OVERWRITE;
                    double d = raw_slice(&j, mode, threads, first, m);
                    if (d < 0) goto out;
                    rsec += d;
                    if (ph == PH_CHURN) { /* and the same files from the threads' own buffers */
                        if ((d = raw_slice(&j, RAW_OVERWRITE_HOT, threads, first, m)) < 0) goto out;
                        hsec += d;
                    }
                } else if (ph == PH_READ) {
                    tsec += tier_read_slice(t, first, m, dst, &tok, dropped);
                } else { /* the full-quota writes are chunks n..2n-1: each evicts one */
                    double cc = 0;
                    uint64_t from = ph == PH_FILL ? first : n + first;
                    tsec += g_borrowed ? tier_write_borrowed_slice(t, from, m, j.ring, j.nring, file_bytes, &tok, dropped,
                                                                   &recycled, &cc)
                                       : tier_write_slice(t, from, m, src, &tok, dropped, &recycled, &cc);
                    if (ph == PH_CHURN) caller_cpu += cc;
                }
            }
        }
        int raw_k = ph == PH_FILL ? 0 : ph == PH_READ ? 2 : 1;
        bw[raw_k] = (double)(n * chunk) / rsec;
        bw[3 + ph] = (double)(tok * chunk) / tsec;
        if (ph == PH_CHURN) bw[6] = (double)(n * chunk) / hsec;
    }
    *recycled_frac = (double)recycled / (double)n;
    *caller_us = caller_cpu / (double)n * 1e6;
    rc = 0;
out:
    for (int i = 0; i < RD_DEPTH; i++) free(dst[i]);
    free(src);
    if (t) {
        char ns[4096];
        snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
        kvo_file_tier_destroy(t);
        rm_rf(ns);
    }
    kvo_plan_destroy(plan);
    free(j.bufs);
    free(j.ring);
    rm_rf(dir);
    return rc;
}

static int count_entry(const kvo_file_walk_entry *e, void *ctx) {
    (void)e;
    (*(uint64_t *)ctx)++;
    return 0;
}

/* The walk alone (kvo_file_walk without stat: one readdir per fan-out
 * directory, names classified), the floor under the rebuild's scan. */
static double readdir_tree(const char *ns) {
    double t0 = kvo_bench_now();
    uint64_t count = 0;
    kvo_file_walk(ns, 0, count_entry, &count);
    return kvo_bench_now() - t0;
}

static int rebuild(const kvo_bench_out *o, const char *dir, uint64_t files) {
    kvo_plan *plan = bench_plan(4096);
    if (!plan) return -1;
    kvo_bench_progress(o, "index rebuild over %llu files vs a bare readdir", (unsigned long long)files);
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = dir;
    p.plan = plan;
    p.quota_bytes = (files + 16) * 4096;
    p.direct = KVO_FILE_DIRECT_OFF;
    p.max_pending_writes = 1024;
    p.log_interval_s = 3600;
    kvo_file_tier *t = NULL;
    if (kvo_file_tier_create(&p, &t)) {
        fprintf(stderr, "bench file: %s\n", kvo_last_error());
        return -1;
    }
    unsigned char buf[4096];
    memset(buf, 1, sizeof buf);
    for (uint64_t i = 0; i < files; i++) {
        kvo_chunk_key k = bkey(i);
        write_wait(t, &k, buf, 100);
    }
    kvo_file_tier_flush(t, -1);
    char ns[4096];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    double bare = readdir_tree(ns);
    double t0 = kvo_bench_now();
    if (kvo_file_tier_create(&p, &t)) return -1;
    double dt = kvo_bench_now() - t0;
    kvo_file_tier_stats st = KVO_FILE_TIER_STATS_INIT;
    kvo_file_tier_get_stats(t, &st);
    kvo_file_tier_destroy(t);
    double scan = (double)st.scan_ns * 1e-9;
    double per = st.scanned_files ? scan / (double)st.scanned_files : 0;
    char name[96];
    snprintf(name, sizeof name, "file.index_rebuild.%llu_files", (unsigned long long)st.scanned_files);
    kvo_bench_report(o, name, scan * 1e3, "ms", NULL, 0);
    kvo_bench_report(o, "file.index_rebuild.per_file", per * 1e6, "us", "readdir_only_us",
                     files ? bare / (double)files * 1e6 : 0);
    /* the whole create: probes, manifest, staging memory pre-faulted, scan */
    kvo_bench_report(o, "file.create_with_rebuild", dt * 1e3, "ms", NULL, 0);
    rm_rf(ns);
    kvo_plan_destroy(plan);
    return 0;
}

int kvo_bench_file(int argc, char **argv, const kvo_bench_out *o) {
    const char *dir = getenv("KVO_BENCH_DIR");
    if (!dir) dir = "/var/tmp";
    uint64_t total_mib = 256, rebuild_files = 20000;
    kvo_file_io_kind io = KVO_FILE_IO_AUTO;
    uint64_t sizes[16] = {256 << 10, 1 << 20, 4 << 20, 8 << 20};
    int n_sizes = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: kvoffload bench file [--json] [--dir DIR] [--total-mib N] [--sizes KIB,KIB...]\n"
                   "                            [--rebuild-files N] [--io auto|uring|threads] [--depth N]\n"
                   "                            [--reps N] [--writes copy|borrowed]\n"
                   "File-tier write/read bandwidth vs raw O_DIRECT of the same bytes, and the index\n"
                   "rebuild time per file vs a bare readdir.  Defaults: --dir $KVO_BENCH_DIR or /var/tmp,\n"
                   "--total-mib 256, --sizes 256,1024,4096,8192, --rebuild-files 20000 (0: skip),\n"
                   "--reps 3 (rounds of raw and tier, alternating; each figure the median round),\n"
                   "--writes copy (kvo_file_tier_write; borrowed: kvo_file_tier_write_borrowed from the\n"
                   "raw limit's ring of file images, each lent until its completion; figures *_borrowed).\n");
            return 0;
        } else if (!strcmp(a, "--dir") && v) {
            dir = v;
            i++;
        } else if (!strcmp(a, "--total-mib") && v) {
            if (kvo_cli_parse_u64(a, v, 1, 1 << 20, &total_mib)) return KVO_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--depth") && v) {
            uint64_t d;
            if (kvo_cli_parse_u64(a, v, 1, 256, &d)) return KVO_EXIT_USAGE;
            g_depth = (uint32_t)d;
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            uint64_t r;
            if (kvo_cli_parse_u64(a, v, 1, FILE_REPS_MAX, &r)) return KVO_EXIT_USAGE;
            g_reps = (uint32_t)r;
            i++;
        } else if (!strcmp(a, "--writes") && v) {
            if (!strcmp(v, "copy") || !strcmp(v, "borrowed")) g_borrowed = !strcmp(v, "borrowed");
            else {
                fprintf(stderr, "kvoffload bench file: --writes takes copy or borrowed\n");
                return KVO_EXIT_USAGE;
            }
            i++;
        } else if (!strcmp(a, "--rebuild-files") && v) {
            if (kvo_cli_parse_u64(a, v, 0, 10000000, &rebuild_files)) return KVO_EXIT_USAGE;
            i++;
        } else if (!strcmp(a, "--io") && v) {
            if (!strcmp(v, "auto")) io = KVO_FILE_IO_AUTO;
            else if (!strcmp(v, "uring")) io = KVO_FILE_IO_URING;
            else if (!strcmp(v, "threads")) io = KVO_FILE_IO_THREADS;
            else {
                fprintf(stderr, "kvoffload bench file: --io takes auto, uring or threads\n");
                return KVO_EXIT_USAGE;
            }
            i++;
        } else if (!strcmp(a, "--sizes") && v) {
            n_sizes = 0;
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", v);
            for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ",")) {
                uint64_t kib;
                if (n_sizes == 16) {  /* never dropped silently */
                    fprintf(stderr, "kvoffload bench file: --sizes takes at most 16 sizes, got more: '%s'\n", v);
                    return KVO_EXIT_USAGE;
                }
                if (kvo_cli_parse_u64("--sizes", tok, 4, 1 << 20, &kib)) return KVO_EXIT_USAGE;
                sizes[n_sizes++] = kib << 10;
            }
            i++;
        } else {
            fprintf(stderr, "kvoffload bench file: unknown option '%s'\n", a);
            return KVO_EXIT_USAGE;
        }
    }
    char work[4096];
    snprintf(work, sizeof work, "%s/kvoffload-bench-file.%ld", dir, (long)getpid());
    if (mkdir(work, 0755) != 0) {
        fprintf(stderr, "kvoffload bench file: cannot create %s: %s\n", work, strerror(errno));
        return KVO_EXIT_FAIL;
    }
    int rc = 0;
    uint64_t total = total_mib << 20;
    /* the raw limit runs as many threads as the tier has writers (and reads
     * in flight: io_threads, or queue_depth on the ring) */
    uint32_t threads = g_depth ? g_depth : kvo_file_tier_default_params().io_threads;
    uint64_t dropped = 0;
    kvo_bench_log_expect("dropping stores"); /* the saturation's back-pressure notes: counted below */
    for (int s = 0; s < n_sizes && rc == 0; s++) {
        uint64_t chunk = sizes[s];
        uint64_t tot = total < 4 * chunk ? 4 * chunk : total, n = tot / chunk;
        kvo_plan *plan = bench_plan(chunk);
        if (!plan) {
            rc = KVO_EXIT_FAIL;
            break;
        }
        uint64_t file_bytes = KVO_FILE_HEADER_BYTES + kvo_plan_group(plan, 0)->slot_bytes;
        kvo_plan_destroy(plan);
        bool rdirect = false, tdirect = false;
        /* per round: raw new, raw overwrite, raw read, tier write, tier read,
         * tier full-quota write, recycled fraction, caller CPU, raw overwrite
         * from hot buffers; each figure is the median of its rounds */
        double v[9][FILE_REPS_MAX];
        const char *backend = "?";
        kvo_bench_progress(o, "%llu KiB chunks: raw files and the tier, %u rounds", (unsigned long long)(chunk >> 10),
                           g_reps);
        g_backpressure = 0;
        for (uint32_t rep = 0; rep < g_reps && rc == 0; rep++) {
            double bw[7];
            if (pair_bw(work, io, n, chunk, file_bytes, threads, rep, &rdirect, &tdirect, bw, &v[6][rep], &v[7][rep],
                        &backend, &dropped)) {
                fprintf(stderr, "kvoffload bench file: failed at %llu KiB chunks\n", (unsigned long long)(chunk >> 10));
                rc = KVO_EXIT_FAIL;
                break;
            }
            for (int k = 0; k < 6; k++) v[k][rep] = bw[k];
            v[8][rep] = bw[6];
        }
        if (rc) break;
        double med[9];
        for (int k = 0; k < 9; k++) med[k] = kvo_bench_median(v[k], g_reps);
        double rn = med[0], ro = med[1], rr = med[2], tw = med[3], tr = med[4], tc = med[5], rf = med[6];
        if (rc) break;
        char name[128], lim[64];
        const char *how = rdirect ? "odirect" : "buffered";
        unsigned long long kib = (unsigned long long)(chunk >> 10);
        const char *mode = tdirect ? ".direct" : ".buffered";
        const char *wb = g_borrowed ? "_borrowed" : "";
        snprintf(name, sizeof name, "file.write%s.%lluKiB.%s%s", wb, kib, backend, mode);
        snprintf(lim, sizeof lim, "raw_%s_new_files_%ut", how, threads);
        kvo_bench_report(o, name, tw / 1e9, "GB/s", lim, rn / 1e9);
        snprintf(name, sizeof name, "file.read.%lluKiB.%s%s", kib, backend, mode);
        snprintf(lim, sizeof lim, "raw_%s_read_files_%ut", how, threads);
        kvo_bench_report(o, name, tr / 1e9, "GB/s", lim, rr / 1e9);
        snprintf(name, sizeof name, "file.write_full_quota%s.%lluKiB.%s%s", wb, kib, backend, mode);
        snprintf(lim, sizeof lim, "raw_%s_overwrite_files_%ut", how, threads);
        kvo_bench_report(o, name, tc / 1e9, "GB/s", lim, ro / 1e9);
        snprintf(name, sizeof name, "file.write_full_quota%s.%lluKiB.vs_hot_buffers", wb, kib);
        snprintf(lim, sizeof lim, "raw_%s_overwrite_hot_buffers_%ut", how, threads);
        kvo_bench_report(o, name, tc / 1e9, "GB/s", lim, med[8] / 1e9);
        snprintf(name, sizeof name, "file.write_full_quota%s.%lluKiB.recycled", wb, kib);
        kvo_bench_report(o, name, rf, "fraction", NULL, 0);
        /* the engine's side of a write at a full quota: CPU time of the
         * calling thread per chunk (staging copy, quota index, eviction) */
        snprintf(name, sizeof name, "file.write_full_quota%s.%lluKiB.caller_cpu_per_chunk", wb, kib);
        kvo_bench_report(o, name, med[7], "us", NULL, 0);
        /* the tier's writes are issued faster than the disk takes them (a
         * deliberate saturation): the tier refuses some for back-pressure
         * (its "dropping stores" log lines, counted here, not printed) and
         * the benchmark retries them; per chunk written, all rounds */
        snprintf(name, sizeof name, "file.write%s.%lluKiB.backpressure_refusals_per_chunk", wb, kib);
        kvo_bench_report(o, name, (double)g_backpressure / (double)(2 * n * g_reps), "refusals", NULL, 0);
    }
    uint64_t notes = kvo_bench_log_expect(NULL);
    if (notes)
        kvo_bench_progress(o, "%llu library notes \"dropping stores\" (back-pressure, expected under this saturation) "
                           "counted in *.backpressure_refusals_per_chunk", (unsigned long long)notes);
    if (dropped) {
        fprintf(stderr, "kvoffload bench file: %llu chunk writes or reads did not reach a file (dropped or failed): "
                "the figures count only bytes that did; failing\n", (unsigned long long)dropped);
        if (rc == 0) rc = KVO_EXIT_FAIL;
    }
    if (rc == 0 && rebuild_files > 0 && rebuild(o, work, rebuild_files) != 0) rc = KVO_EXIT_FAIL;
    rm_rf(work);
    return rc;
}
