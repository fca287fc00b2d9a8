/* `kvoffload bench`: dispatch to the benchmarks in bench/, and what they
 * share: figures, progress lines, the library log during a benchmark. */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **, const kvo_bench_out *);
    const char *help;
} kvo__benches[] = {
    {"store", kvo_bench_store, "index and prefix-hash throughput"},
    {"transfer", kvo_bench_transfer, "block gather/scatter bandwidth vs the copy ceiling"},
    {"file", kvo_bench_file, "file-tier bandwidth vs raw O_DIRECT, index rebuild time"},
    {"ttft", kvo_bench_ttft, "time to first token: loaded vs recomputed prefix"},
    {"remote", kvo_bench_remote, "remote-tier (Redis Cluster) bandwidth vs raw pipelined hiredis"},
    {"cascade", kvo_bench_cascade, "a prefix promoted from the file or Redis tier vs a raw batched read"},
};

double kvo_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int kvo__bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double kvo_bench_median(double *v, size_t n) {
    qsort(v, n, sizeof *v, kvo__bench_cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

kvo_plan *kvo_bench_plan_one(const char *name, uint64_t page_bytes, uint32_t blocks_per_chunk) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    if (kvo_model_create(name, 16, &m)) return NULL;
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "kv");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = page_bytes;
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = blocks_per_chunk;
    if (kvo_model_add_group(m, &g) || kvo_plan_create(m, &pp, &p)) p = NULL;
    kvo_model_destroy(m);
    return p;
}

double kvo_bench_thread_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kvo_bench_report(const kvo_bench_out *o, const char *name, double value, const char *unit,
                      const char *limit_name, double limit) {
    bool na = isnan(value);
    if (o->json) {
        if (na) printf("{\"name\":\"%s\",\"value\":null,\"unit\":\"%s\"", name, unit);
        else printf("{\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\"", name, value, unit);
        if (limit_name && na) printf(",\"limit_name\":\"%s\",\"limit\":%.6g,\"ratio\":null", limit_name, limit);
        else if (limit_name)
            printf(",\"limit_name\":\"%s\",\"limit\":%.6g,\"ratio\":%.4f", limit_name, limit,
                   limit > 0 ? value / limit : 0.0);
        printf("}\n");
    } else {
        if (na) printf("%-48s %14s %-8s", name, "n/a", unit);
        else printf("%-48s %14.4g %-8s", name, value, unit);
        if (limit_name && na) printf("  of %s (%.4g)", limit_name, limit);
        else if (limit_name)
            printf("  %5.1f%% of %s (%.4g)", limit > 0 ? 100.0 * value / limit : 0.0, limit_name, limit);
        printf("\n");
    }
    fflush(stdout);
}

void kvo_bench_progress(const kvo_bench_out *o, const char *fmt, ...) {
    if (o->quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvoffload bench %s [%.1f s]: ", o->name ? o->name : "", kvo_bench_now() - o->t0);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char *kvo__bench_needle;
static _Atomic uint64_t kvo__bench_expected;

static void kvo__bench_log(kvo_log_level level, const char *msg, void *ctx) {
    (void)ctx;
    if (kvo__bench_needle && strstr(msg, kvo__bench_needle)) atomic_fetch_add(&kvo__bench_expected, 1);
    else fprintf(stderr, "kvoffload: %s: %s\n", kvo_log_level_name(level), msg);
}

uint64_t kvo_bench_log_expect(const char *needle) {
    uint64_t n = atomic_exchange(&kvo__bench_expected, 0);
    kvo__bench_needle = needle;
    kvo_set_log(needle ? kvo__bench_log : NULL, NULL, KVO_LOG_WARN);
    return n;
}

int kvo_cmd_bench(int argc, char **argv) {
    kvo_bench_out o = {false, false, NULL, kvo_bench_now()};
    const char *which = NULL;
    int sub_argc = 0;
    char *sub_argv[64];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) o.json = true;
        else if (!strcmp(argv[i], "--quiet")) o.quiet = true;
        else if (which && sub_argc < 63 && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")))
            sub_argv[sub_argc++] = argv[i]; /* the benchmark's own help */
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvoffload bench <name> [--json] [--quiet] [options]\n\n"
                   "--json: one JSON object per figure; --quiet: no progress lines on stderr (one before\n"
                   "each figure measured).  A figure without meaning in a run prints n/a (JSON null).\n\n"
                   "benchmarks:\n");
            for (size_t b = 0; b < sizeof kvo__benches / sizeof kvo__benches[0]; b++)
                printf("  %-9s %s\n", kvo__benches[b].name, kvo__benches[b].help);
            return 0;
        } else if (!which && argv[i][0] != '-') {
            which = o.name = argv[i];
            sub_argv[sub_argc++] = argv[i];
        } else if (sub_argc < 63) sub_argv[sub_argc++] = argv[i];
    }
    sub_argv[sub_argc] = NULL;
    if (!which) {
        fprintf(stderr, "kvoffload bench: name a benchmark (kvoffload bench --help)\n");
        return KVO_EXIT_USAGE;
    }
    for (size_t b = 0; b < sizeof kvo__benches / sizeof kvo__benches[0]; b++)
        if (!strcmp(which, kvo__benches[b].name)) return kvo__benches[b].fn(sub_argc, sub_argv, &o);
    fprintf(stderr, "kvoffload bench: unknown benchmark '%s' (kvoffload bench --help)\n", which);
    return KVO_EXIT_USAGE;
}
