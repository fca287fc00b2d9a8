/* `kvoffload bench file`: file-tier write and read bandwidth for chunks of
 * 256 KiB to 8 MiB against the raw bandwidth of the same file system measured
 * in the same run (plain O_DIRECT sequential writes and reads of the same
 * total bytes in pieces of the chunk size, one file, one thread), writes
 * again once the quota is full (each evicts an old chunk, whose file is
 * recycled), and the index rebuild time at startup against a bare walk of
 * the same tree (kvo_file_walk without stat: readdir and name parsing).
 *
 *   kvoffload bench file [--json] [--dir DIR] [--total-mib N] [--sizes K,K..]
 *                        [--rebuild-files N] [--io auto|uring|threads] [--depth N]
 *
 * --dir defaults to $KVO_BENCH_DIR, else /var/tmp (a real disk; /tmp may be a
 * tmpfs).  --rebuild-files defaults to 20000 (use 100000 for the issue's
 * figure; it takes a while on a shared machine).  Everything the benchmark
 * writes is removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
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
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    char name[64];
    snprintf(name, sizeof name, "bench-file-%llu", (unsigned long long)chunk_bytes);
    if (kvo_model_create(name, 16, &m)) return NULL;
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "kv");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = chunk_bytes / 2;
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    if (kvo_model_add_group(m, &g) || kvo_plan_create(m, &pp, &p)) p = NULL;
    kvo_model_destroy(m);
    return p;
}

static kvo_chunk_key bkey(uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 1;
    k.hash.hi = i ^ 0x5555aaaa5555aaaaull;
    return k;
}

/* Queue one chunk write; on back-pressure wait `us` and retry (the benchmark
 * waits instead of dropping). */
static void write_wait(kvo_file_tier *t, const kvo_chunk_key *k, const void *src, unsigned us) {
    for (;;) {
        int r = 0;
        kvo_file_tier_write(t, k, &src, 1, NULL, &r, NULL);
        if (r != KVO_EAGAIN) return;
        usleep(us);
    }
}

/* Raw O_DIRECT sequential write then read of total bytes in `piece` pieces.
 * Returns 0 and bandwidths in bytes/s, or -1. */
static int raw_bw(const char *dir, uint64_t total, uint64_t piece, bool *direct, double *wbw, double *rbw) {
    char path[4096];
    snprintf(path, sizeof path, "%s/raw.%ld", dir, (long)getpid());
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, piece)) return -1;
    memset(buf, 0xa5, piece);
    *direct = true;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) {
        *direct = false;
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (fd < 0) {
        free(buf);
        return -1;
    }
    double t0 = kvo_bench_now();
    for (uint64_t off = 0; off < total; off += piece)
        if (pwrite(fd, buf, piece, (off_t)off) != (ssize_t)piece) {
            close(fd);
            unlink(path);
            free(buf);
            return -1;
        }
    close(fd);
    *wbw = (double)total / (kvo_bench_now() - t0);
    fd = open(path, O_RDONLY | (*direct ? O_DIRECT : 0));
    t0 = kvo_bench_now();
    for (uint64_t off = 0; fd >= 0 && off < total; off += piece)
        if (pread(fd, buf, piece, (off_t)off) != (ssize_t)piece) break;
    *rbw = (double)total / (kvo_bench_now() - t0);
    if (fd >= 0) close(fd);
    unlink(path);
    free(buf);
    return 0;
}

static uint32_t g_depth = 0; /* --depth: queue depth / threads; 0 = defaults */

static int tier_bw(const char *dir, kvo_file_io_kind io, uint64_t total, uint64_t chunk, bool *direct, double *wbw,
                   double *rbw, double *cbw, const char **backend) {
    kvo_plan *plan = bench_plan(chunk);
    if (!plan) return -1;
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    uint64_t n = total / chunk;
    if (n < 4) n = 4;
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = dir;
    p.plan = plan;
    p.io = io;
    p.quota_bytes = (n + 4) * g->slot_bytes;
    p.max_staging_bytes = 16 * (g->slot_bytes + KVO_FILE_HEADER_BYTES);
    if (p.max_staging_bytes < (64ull << 20)) p.max_staging_bytes = 64ull << 20;
    p.max_pending_writes = 64;
    p.log_interval_s = 3600;
    if (g_depth) {
        p.queue_depth = g_depth;
        p.io_threads = g_depth;
    }
    kvo_file_tier *t = NULL;
    if (kvo_file_tier_create(&p, &t)) {
        fprintf(stderr, "bench file: %s\n", kvo_last_error());
        kvo_plan_destroy(plan);
        return -1;
    }
    *direct = kvo_file_tier_direct(t);
    *backend = kvo_file_tier_backend(t);
    unsigned char *src = NULL;
    if (posix_memalign((void **)&src, 4096, g->slot_bytes)) return -1;
    memset(src, 0x3c, g->slot_bytes);
    double t0 = kvo_bench_now();
    for (uint64_t i = 0; i < n; i++) {
        kvo_chunk_key k = bkey(i);
        src[0] = (unsigned char)i;
        write_wait(t, &k, src, 50);
    }
    kvo_file_tier_flush(t, -1);
    *wbw = (double)(n * chunk) / (kvo_bench_now() - t0);
    kvo_file_tier_stats st;
    kvo_file_tier_get_stats(t, &st);
    uint64_t written = st.writes;

    /* reads: keep up to `depth` in flight */
    enum { DEPTH = 8 };
    unsigned char *dst[DEPTH];
    for (int i = 0; i < DEPTH; i++)
        if (posix_memalign((void **)&dst[i], 4096, g->slot_bytes)) return -1;
    int busy[DEPTH] = {0};
    uint64_t next = 0, done = 0, ok = 0;
    t0 = kvo_bench_now();
    while (done < n) {
        for (int s = 0; s < DEPTH && next < n; s++) {
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
        kvo_file_completion c[DEPTH];
        kvo_file_tier_wait(t, 1000);
        size_t m = kvo_file_tier_poll(t, c, DEPTH);
        for (size_t i = 0; i < m; i++) {
            busy[c[i].user_data] = 0;
            done++;
            ok += c[i].result == 0;
        }
    }
    *rbw = (double)(ok * chunk) / (kvo_bench_now() - t0);
    if (written != n || ok != n)
        fprintf(stderr, "bench file: %llu of %llu chunks written, %llu read back\n", (unsigned long long)written,
                (unsigned long long)n, (unsigned long long)ok);
    /* churn: the quota is full, every new chunk evicts an old one (whose file
     * is recycled) */
    t0 = kvo_bench_now();
    for (uint64_t i = 0; i < n; i++) {
        kvo_chunk_key k = bkey(n + i);
        write_wait(t, &k, src, 50);
    }
    kvo_file_tier_flush(t, -1);
    *cbw = (double)(n * chunk) / (kvo_bench_now() - t0);
    for (int i = 0; i < DEPTH; i++) free(dst[i]);
    free(src);
    char ns[4096];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    rm_rf(ns);
    kvo_plan_destroy(plan);
    return 0;
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
    kvo_file_tier_stats st;
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
                   "File-tier write/read bandwidth vs raw O_DIRECT of the same bytes, and the index\n"
                   "rebuild time per file vs a bare readdir.  Defaults: --dir $KVO_BENCH_DIR or /var/tmp,\n"
                   "--total-mib 256, --sizes 256,1024,4096,8192, --rebuild-files 20000 (0: skip).\n");
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
            for (char *tok = strtok(tmp, ","); tok && n_sizes < 16; tok = strtok(NULL, ",")) {
                uint64_t kib;
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
    for (int s = 0; s < n_sizes && rc == 0; s++) {
        uint64_t chunk = sizes[s];
        uint64_t tot = total < 4 * chunk ? 4 * chunk : total;
        bool rdirect = false, tdirect = false;
        double rw = 0, rr = 0, tw = 0, tr = 0, tc = 0;
        const char *backend = "?";
        /* raw, tier, raw, tier: the best of two each, so that the noise of a
         * shared disk and the order do not favour one side */
        for (int rep = 0; rep < 2; rep++) {
            double a = 0, b = 0, c = 0, d = 0, e = 0;
            if (raw_bw(work, tot, chunk, &rdirect, &a, &b) ||
                tier_bw(work, io, tot, chunk, &tdirect, &c, &d, &e, &backend)) {
                fprintf(stderr, "kvoffload bench file: failed at %llu KiB chunks\n", (unsigned long long)(chunk >> 10));
                rc = KVO_EXIT_FAIL;
                break;
            }
            if (a > rw) rw = a;
            if (b > rr) rr = b;
            if (c > tw) tw = c;
            if (d > tr) tr = d;
            if (e > tc) tc = e;
        }
        if (rc) break;
        char name[128];
        snprintf(name, sizeof name, "file.write.%lluKiB.%s%s", (unsigned long long)(chunk >> 10), backend,
                 tdirect ? ".direct" : ".buffered");
        kvo_bench_report(o, name, tw / 1e9, "GB/s", rdirect ? "raw_odirect_write" : "raw_buffered_write", rw / 1e9);
        snprintf(name, sizeof name, "file.read.%lluKiB.%s%s", (unsigned long long)(chunk >> 10), backend,
                 tdirect ? ".direct" : ".buffered");
        kvo_bench_report(o, name, tr / 1e9, "GB/s", rdirect ? "raw_odirect_read" : "raw_buffered_read", rr / 1e9);
        snprintf(name, sizeof name, "file.write_full_quota.%lluKiB.%s%s", (unsigned long long)(chunk >> 10), backend,
                 tdirect ? ".direct" : ".buffered");
        kvo_bench_report(o, name, tc / 1e9, "GB/s", rdirect ? "raw_odirect_write" : "raw_buffered_write", rw / 1e9);
    }
    if (rc == 0 && rebuild_files > 0 && rebuild(o, work, rebuild_files) != 0) rc = KVO_EXIT_FAIL;
    rm_rf(work);
    return rc;
}
