/*
 * `kvoffload demo`: the reference engine runs a Mooncake-derived multi-turn
 * workload twice, once recomputing every prompt (no reuse at all) and once
 * with prefix reuse through the kvoffload connector (host tier + file tier)
 * under memory pressure, and checks that every generated token and the final
 * logits match bit for bit.  Exit 0 on a match, 1 on any difference or
 * failure, 2 on bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kvo_engine.h"
#include "kvo_engine_offload.h"

static void kvo__demo_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload demo [options]\n\n"
            "Runs the reference engine (a small hybrid transformer, random weights) on a\n"
            "multi-turn workload from the Mooncake trace twice: recomputing everything, and\n"
            "with KV offloading to host memory and files under memory pressure; prints\n"
            "tokens computed vs loaded, hit rate, TTFT, throughput, bytes moved, and whether\n"
            "every generated token and the final logits matched bit for bit.\n\n"
            "  --shape NAME       engine shape: single, hybrid, hybrid-state (default), tiny-blocks,\n"
            "                     coprime (12/16-token full + 20-token sliding blocks, 4-token hash),\n"
            "                     coprime-state (12 full + 20 sliding + 16-token state blocks)\n"
            "  --requests N       requests to run (default 48)\n"
            "  --trace FILE       Mooncake JSONL trace (default: the bundled data/mooncake_sample.jsonl;\n"
            "                     synthetic conversations when none is found)\n"
            "  --block-tokens N   tokens per 512-token trace block (default 16)\n"
            "  --max-blocks N     prompt cap in trace blocks (default 48)\n"
            "  --max-new N        tokens generated per request at most (default 4)\n"
            "  --engine-tokens N  engine KV budget in tokens (default: twice the longest request;\n"
            "                     at least one block of every group)\n"
            "  --chunk-tokens N   offload chunk size in tokens (default 64; a group whose block size\n"
            "                     does not divide it gets ceil(N / block) blocks per chunk)\n"
            "  --host-mib N       host tier size (default 4)\n"
            "  --file-mib N       file tier size (default 64; 0 = no file tier)\n"
            "  --file-dir DIR     file tier directory (default: a temporary directory, removed after,\n"
            "                     also when the demo is killed)\n"
            "  --file-mode M      through (default): every stored chunk is also written to a file;\n"
            "                     back: a chunk is written only when the host tier evicts it\n"
            "  --remote URL       also a remote tier: redis://host:port[,host:port...] (a Redis Cluster;\n"
            "                     docs/remote-tier.md); run 2 then loads from it what an earlier engine stored\n"
            "  --remote-prefix P  the remote keys' namespace (default kvo-demo-SHAPE-SEED)\n"
            "  --remote-budget-us N  how long a lookup may wait for the remote tier's presence answers\n"
            "                     before it answers with what the host and file tiers hold (default 20000;\n"
            "                     raise it on a slow network or a loaded machine)\n"
            "  --phase P          with --remote: both (default): a first engine stores the workload, then\n"
            "                     run 2 (a fresh engine, empty host and file tiers) loads it; store: run 2\n"
            "                     only stores (for another process to load); load: run 2 loads what another\n"
            "                     process stored\n"
            "  --concurrency N    requests running at once (default 4)\n"
            "  --evict-every N    also force engine-cache eviction after every N requests (default 0)\n"
            "  --hash-tokens N    the model's hash unit in tokens (default: the shape's, 16 or 4; e.g. 64 puts tiny-blocks'\n"
            "                     4-token group under a 64-token hash)\n"
            "  --seed N           weights seed (default 1234)\n"
            "  --json             print the figures as one JSON object\n"
            "  --quiet            no progress on stderr\n"
            "  --config FILE      take chunk size, host and file tier sizes, file directory and mode (and\n"
            "                     remote_url, remote_key_prefix, remote_lookup_budget_us) from a\n"
            "                     kvo_config JSON file (docs/config.md; vLLM and LMCache names work);\n"
            "                     options given on the command line win\n"
            "  --metrics FILE     at the end, write the offload run's connector metrics to FILE as\n"
            "                     Prometheus text (FILE ending in .json: as JSON; docs/metrics.md)\n"
            "Options take their value as --opt VALUE or --opt=VALUE.\n"
            "Exit status: 0 outputs matched, 1 a difference or a failure, 2 bad usage or input.\n");
}

typedef struct kvo__demo_prog {
    const char *label;
    bool quiet;
    double last;
} kvo__demo_prog;

static double kvo__demo_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void kvo__demo_progress(void *ctx, size_t done, size_t total) {
    kvo__demo_prog *p = ctx;
    if (p->quiet) return;
    double now = kvo__demo_now();
    if (done != total && now - p->last < 1.0) return;
    p->last = now;
    fprintf(stderr, "  %s: %zu/%zu requests\n", p->label, done, total);
}

/* TTFT of a class of requests: count, mean, nearest-rank p50/p90/p99 and
 * the maximum.  p99 only with n >= 100 (below that it is just the maximum:
 * has_p99 false). */
typedef struct kvo__demo_lat {
    size_t n;
    double mean, p50, p90, p99, max;
    bool has_p99;
} kvo__demo_lat;

typedef struct kvo__demo_sum {
    uint64_t computed, local, loaded, loaded_file, failures, gen, bytes_loaded, bytes_stored, loaded_remote;
    double wall, queue_mean;
    kvo__demo_lat all, cold, warm; /* TTFT from arrival: all, cold, warm requests */
} kvo__demo_sum;

static int kvo__cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Cold requests: no earlier request of the workload shares their first
 * `unit` tokens (the smallest block of any group), so neither run can reuse
 * anything for them; every other request is warm (a hit was possible, if
 * the caches kept it).  cold: w->n flags. */
static void kvo__demo_cold(const kvo_eng_workload *w, const kvo_eng_config *c, bool *cold) {
    uint32_t unit = UINT32_MAX;
    for (uint32_t g = 0; g < c->n_groups; g++)
        if (c->groups[g].tokens_per_block < unit) unit = c->groups[g].tokens_per_block;
    for (size_t i = 0; i < w->n; i++) {
        const kvo_eng_request *q = &w->reqs[i];
        cold[i] = true;
        if (q->prompt_len < unit) continue; /* not one whole block: nothing to reuse */
        for (size_t j = 0; j < i && cold[i]; j++)
            if (w->reqs[j].prompt_len >= unit && !memcmp(w->reqs[j].prompt, q->prompt, unit * sizeof *q->prompt))
                cold[i] = false;
    }
}

/* Percentiles of the requests whose cold flag equals `want` (all when
 * want < 0); t is scratch for w->n doubles. */
static void kvo__demo_lat_of(const kvo_eng_result *r, size_t n, const bool *cold, int want, double *t,
                             kvo__demo_lat *l) {
    memset(l, 0, sizeof *l);
    for (size_t i = 0; i < n; i++)
        if (want < 0 || cold[i] == (want == 1)) t[l->n++] = r[i].ttft_s;
    if (!l->n) return;
    qsort(t, l->n, sizeof *t, kvo__cmp_dbl);
    for (size_t i = 0; i < l->n; i++) l->mean += t[i] / (double)l->n;
    const double q[3] = {0.50, 0.90, 0.99};
    double *out[3] = {&l->p50, &l->p90, &l->p99};
    for (int k = 0; k < 3; k++) {
        size_t rank = (size_t)ceil(q[k] * (double)l->n);
        *out[k] = t[rank ? rank - 1 : 0];
    }
    l->max = t[l->n - 1];
    l->has_p99 = l->n >= 100;
}

static void kvo__demo_summarize(const kvo_eng_result *r, size_t n, double wall, const bool *cold, kvo__demo_sum *s) {
    memset(s, 0, sizeof *s);
    s->wall = wall;
    for (size_t i = 0; i < n; i++) {
        s->computed += r[i].tokens_computed;
        s->local += r[i].tokens_local;
        s->loaded += r[i].tokens_loaded;
        s->loaded_file += r[i].tokens_loaded_file;
        s->loaded_remote += r[i].tokens_loaded_remote;
        s->failures += r[i].load_failures;
        s->gen += r[i].n_gen;
        s->bytes_loaded += r[i].bytes_loaded;
        s->bytes_stored += r[i].bytes_stored;
        s->queue_mean += r[i].queue_s / (double)n;
    }
    double *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) return;
    kvo__demo_lat_of(r, n, cold, -1, t, &s->all);
    kvo__demo_lat_of(r, n, cold, 1, t, &s->cold);
    kvo__demo_lat_of(r, n, cold, 0, t, &s->warm);
    free(t);
}

/* One class's TTFT as JSON members (p99 null below 100 requests). */
static void kvo__demo_lat_json(const char *name, const kvo__demo_lat *l) {
    printf("\"%s\":{\"n\":%zu,\"mean_ms\":%.3f,\"p50_ms\":%.3f,\"p90_ms\":%.3f,\"max_ms\":%.3f,\"p99_ms\":", name,
           l->n, l->mean * 1e3, l->p50 * 1e3, l->p90 * 1e3, l->max * 1e3);
    if (l->has_p99) printf("%.3f}", l->p99 * 1e3);
    else printf("null}");
}

/* One class's TTFT rows of the table: mean, p50, p90, p99 (n >= 100) or
 * max; "-" where a class is empty. */
static void kvo__demo_lat_rows(const char *what, const kvo__demo_lat *a, const kvo__demo_lat *b) {
    char label[64];
    snprintf(label, sizeof label, "TTFT %s: n", what);
    printf("%-34s %16zu %16zu\n", label, a->n, b->n);
    if (!a->n) return;
    const char *names[4] = {"mean", "p50", "p90", a->has_p99 ? "p99" : "max (n<100: no p99)"};
    double va[4] = {a->mean, a->p50, a->p90, a->has_p99 ? a->p99 : a->max};
    double vb[4] = {b->mean, b->p50, b->p90, b->has_p99 ? b->p99 : b->max};
    for (int k = 0; k < 4; k++) {
        snprintf(label, sizeof label, "  %s (ms)", names[k]);
        printf("%-34s %16.2f %16.2f\n", label, va[k] * 1e3, vb[k] * 1e3);
    }
    if (a->has_p99) printf("%-34s %16.2f %16.2f\n", "  max (ms)", a->max * 1e3, b->max * 1e3);
}

static int kvo__rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The temporary file-tier directory must not outlive the demo, however it
 * ends: a signal handler cannot walk a directory tree (opendir, nftw and
 * remove are not async-signal-safe) and cannot stop the tier's threads, so a
 * watcher process does it.  Forked while the demo is still single-threaded,
 * it ignores the terminal's signals (Ctrl-C reaches the whole process group)
 * and blocks reading a pipe whose only write end the demo holds.  The demo
 * writes one byte once it has removed the directory itself; end of file
 * without that byte means the demo died (SIGTERM, SIGINT, SIGKILL, a crash),
 * and the watcher removes the directory then.  Returns the watcher's pid (0
 * when none could be started: the demo still cleans up on a normal exit). */
static pid_t kvo__demo_watch(const char *dir, int *wfd) {
    int fds[2];
    *wfd = -1;
    if (pipe2(fds, O_CLOEXEC) != 0) return 0;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return 0;
    }
    if (pid == 0) {
        static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_IGN);
        close(fds[1]);
        int devnull = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && devnull >= 0; fd++) dup2(devnull, fd); /* release the caller's pipes */
        char b;
        ssize_t n;
        while ((n = read(fds[0], &b, 1)) < 0 && errno == EINTR) {}
        if (n == 0) nftw(dir, kvo__rm_cb, 16, FTW_DEPTH | FTW_PHYS);
        _exit(0);
    }
    close(fds[0]);
    *wfd = fds[1];
    return pid;
}

/* The bundled sample: next to the working directory or the executable. */

static const char *kvo__find_sample(char *buf, size_t cap) {
    static const char *rel = "data/mooncake_sample.jsonl";
    if (access(rel, R_OK) == 0) return rel;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    static const char *ups[] = {"/", "/../", "/../../", "/../share/kvoffload/"};
    for (size_t i = 0; i < sizeof ups / sizeof ups[0]; i++) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s%s%s", exe, ups[i], rel);
        if (access(cand, R_OK) == 0) {
            char real[PATH_MAX];
            snprintf(buf, cap, "%s", realpath(cand, real) ? real : cand);
            return buf;
        }
    }
    return NULL;
}

static int kvo__demo_to_file(const char *d, size_t n, void *f) { return fwrite(d, 1, n, f) == n ? 0 : -1; }

/* --metrics FILE: the connector's metrics (Prometheus text; JSON for *.json). */
static int kvo__demo_metrics(const char *path, kvo_connector *conn) {
    size_t n = strlen(path);
    unsigned fmt = n > 5 && !strcmp(path + n - 5, ".json") ? KVO_STATS_JSON : KVO_STATS_PROMETHEUS;
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kvoffload demo: --metrics: cannot create '%s': %s\n", path, strerror(errno));
        return -1;
    }
    int rc = kvo_connector_stats_write(conn, fmt, kvo__demo_to_file, f);
    if (fclose(f) && !rc) rc = KVO_EIO;
    if (rc) fprintf(stderr, "kvoffload demo: --metrics: writing '%s' failed: %s\n", path, kvo_last_error());
    return rc;
}

static int kvo__demo_fail(const char *what) {
    fprintf(stderr, "kvoffload demo: %s: %s\n", what, kvo_eng_last_error());
    return KVO_EXIT_FAIL;
}

typedef struct kvo__demo_opts {
    const char **shape, **trace, **file_dir, **metrics;
    uint64_t *requests, *block_tokens, *max_blocks, *max_new, *engine_tokens, *chunk, *host_mib, *file_mib, *conc,
        *evict_every, *seed, *hash_tokens, *remote_budget_us;
    bool *json, *quiet;
    kvo_file_mode *file_mode;
    const char **remote, **remote_prefix, **phase;
} kvo__demo_opts;

/* --config FILE: the offload settings the demo has (chunk size, host and file
 * tier sizes, file directory and mode) taken from a kvo_config file, except
 * where the command line gave them.  host/file sizes round up to MiB. */
static int kvo__demo_config(const char *path, const kvo__demo_opts *o, const bool *given) {
    kvo_config *cfg = NULL;
    int rc = kvo_cli_input_file("demo", "--config", path);
    if (rc) return rc;
    if ((rc = kvo_config_from_file(path, &cfg))) return kvo_cli_fail("demo", rc);
    kvo_plan_params pp = kvo_plan_default_params();
    kvo_connector_params cp = kvo_connector_default_params();
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    pp.block_size = 0;
    cp.host_bytes = 0;
    cp.remote_lookup_budget_us = 0;
    fp.quota_bytes = 0;
    kvo_config_apply_plan(cfg, &pp);
    kvo_config_apply_connector(cfg, &cp);
    kvo_config_apply_file_tier(cfg, &fp);
    if (pp.block_size && !given['c']) *o->chunk = pp.block_size;
    if (pp.blocks_per_chunk && !pp.block_size && !given['c'])
        fprintf(stderr, "kvoffload demo: %s: blocks_per_chunk %llu not used: the demo's chunks are set in tokens "
                "(block_size in the config, or --chunk-tokens; now %llu)\n", path,
                (unsigned long long)pp.blocks_per_chunk, (unsigned long long)*o->chunk);
    if (cp.host_bytes && !given['H']) *o->host_mib = (cp.host_bytes + (1u << 20) - 1) >> 20;
    if (cp.remote_lookup_budget_us && !given['U']) *o->remote_budget_us = cp.remote_lookup_budget_us;
    if (!given['m']) *o->file_mode = cp.file_mode;
    if (kvo_config_has_file_tier(cfg) && !given['d']) {
        static char dir[4096];
        snprintf(dir, sizeof dir, "%s", fp.root);
        *o->file_dir = dir;
    }
    if (fp.quota_bytes && !given['F']) *o->file_mib = (fp.quota_bytes + (1u << 20) - 1) >> 20;
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    rp.url = NULL;
    rp.key_prefix = NULL;
    kvo_config_apply_remote_tier(cfg, &rp);
    static char url[1024], pfx[128];
    if (rp.url && !given['R']) {
        snprintf(url, sizeof url, "%s", rp.url);
        *o->remote = url;
    }
    if (rp.key_prefix && !given['P']) {
        snprintf(pfx, sizeof pfx, "%s", rp.key_prefix);
        *o->remote_prefix = pfx;
    }
    kvo_config_destroy(cfg);
    return 0;
}

/* Parse the demo's options (getopt_long: --opt VALUE or --opt=VALUE).
 * 0, -1 after --help, or an exit status. */
static int kvo__demo_options(int argc, char **argv, const kvo__demo_opts *o) {
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'}, {"json", no_argument, NULL, 'j'}, {"quiet", no_argument, NULL, 'q'},
        {"shape", required_argument, NULL, 's'}, {"trace", required_argument, NULL, 't'},
        {"file-dir", required_argument, NULL, 'd'}, {"file-mode", required_argument, NULL, 'm'},
        {"requests", required_argument, NULL, 'r'}, {"block-tokens", required_argument, NULL, 'b'},
        {"max-blocks", required_argument, NULL, 'B'}, {"max-new", required_argument, NULL, 'n'},
        {"engine-tokens", required_argument, NULL, 'e'}, {"chunk-tokens", required_argument, NULL, 'c'},
        {"host-mib", required_argument, NULL, 'H'}, {"file-mib", required_argument, NULL, 'F'},
        {"concurrency", required_argument, NULL, 'C'}, {"evict-every", required_argument, NULL, 'E'},
        {"seed", required_argument, NULL, 'S'}, {"hash-tokens", required_argument, NULL, 'T'},
        {"config", required_argument, NULL, 'K'}, {"remote", required_argument, NULL, 'R'},
        {"remote-prefix", required_argument, NULL, 'P'}, {"phase", required_argument, NULL, 'p'},
        {"metrics", required_argument, NULL, 'M'}, {"remote-budget-us", required_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    /* value options: the variable and the accepted range */
    static const struct { int c; const char *name; uint64_t lo, hi; } ranges[] = {
        {'r', "--requests", 1, 100000}, {'b', "--block-tokens", 1, 512}, {'B', "--max-blocks", 1, 4096},
        {'n', "--max-new", 1, 4096}, {'e', "--engine-tokens", 1, 1u << 24}, {'c', "--chunk-tokens", 1, 1u << 20},
        {'H', "--host-mib", 1, 1u << 20}, {'F', "--file-mib", 0, 1u << 24}, {'C', "--concurrency", 1, 1024},
        {'E', "--evict-every", 0, 1u << 20}, {'S', "--seed", 0, UINT64_MAX}, {'T', "--hash-tokens", 1, 1u << 16},
        {'U', "--remote-budget-us", 1, 60000000},
    };
    uint64_t *vars[] = {o->requests, o->block_tokens, o->max_blocks, o->max_new, o->engine_tokens, o->chunk,
                        o->host_mib, o->file_mib, o->conc, o->evict_every, o->seed, o->hash_tokens,
                        o->remote_budget_us};
    bool given[128] = {false};
    const char *config = NULL;
    int c, rc = 0;
    kvo_cli_getopt_reset();
    while (!rc && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c > 0 && c < 128) given[c] = true;
        switch (c) {
        case 'h': kvo__demo_usage(stdout); return -1;
        case 'j': *o->json = true; break;
        case 'q': *o->quiet = true; break;
        case 's': *o->shape = optarg; break;
        case 't': *o->trace = optarg; break;
        case 'd': *o->file_dir = optarg; break;
        case 'K': config = optarg; break;
        case 'R': *o->remote = optarg; break;
        case 'P': *o->remote_prefix = optarg; break;
        case 'p':
            if (strcmp(optarg, "both") && strcmp(optarg, "store") && strcmp(optarg, "load")) {
                fprintf(stderr, "kvoffload demo: --phase is '%s'; use both, store or load\n", optarg);
                return KVO_EXIT_USAGE;
            }
            *o->phase = optarg;
            break;
        case 'M': *o->metrics = optarg; break;
        case 'm':
            if (strcmp(optarg, "through") && strcmp(optarg, "back")) {
                fprintf(stderr, "kvoffload demo: --file-mode is '%s'; use through or back\n", optarg);
                return KVO_EXIT_USAGE;
            }
            *o->file_mode = !strcmp(optarg, "back") ? KVO_FILE_WRITE_BACK : KVO_FILE_WRITE_THROUGH;
            break;
        case '?': case ':': return kvo_cli_bad_option("demo", c, argv);
        default:
            for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
                if (ranges[i].c == c) rc = kvo_cli_parse_u64(ranges[i].name, optarg, ranges[i].lo, ranges[i].hi, vars[i]);
            break;
        }
    }
    if (rc) return rc;
    if (optind < argc) {
        fprintf(stderr, "kvoffload demo: unexpected argument '%s' (kvoffload demo --help)\n", argv[optind]);
        return KVO_EXIT_USAGE;
    }
    if (config && (rc = kvo__demo_config(config, o, given)) != 0) return rc;
    if ((given['P'] || given['p']) && !*o->remote) {
        fprintf(stderr, "kvoffload demo: --%s needs --remote redis://host:port (or remote_url in --config)\n",
                given['p'] ? "phase" : "remote-prefix");
        return KVO_EXIT_USAGE;
    }
    return 0;
}

/* --remote, phase both: engine A (its own engine and connector, empty host
 * and file tiers) runs the workload and stores it in the remote tier, then
 * waits until the puts are sent; its results must match the recompute run.
 * Run 2 then starts from empty host and file tiers and loads from the
 * remote tier what A stored.  0 or the failure (reported). */
static int kvo__demo_remote_store(const kvo_eng_config *cfg, const kvo_eng_conn_params *cp,
                                  const kvo_eng_workload *w, const kvo_eng_run_params *base,
                                  const kvo_eng_result *ra, bool quiet, uint64_t evict_every) {
    kvo_eng *e = NULL;
    kvo_eng_conn *conn = NULL;
    kvo_eng_result *r = calloc(w->n, sizeof *r);
    kvo_eng_conn_params p = *cp;
    p.file_dir = NULL; /* A's own host tier only: run 2 must not find its files */
    int rc = r ? 0 : KVO_ENOMEM;
    if (!rc && (rc = kvo_eng_create(cfg, &e)) != 0) (void)kvo__demo_fail("engine A");
    if (!rc && (rc = kvo_eng_conn_create(e, &p, &conn)) != 0) (void)kvo__demo_fail("engine A");
    if (!rc) {
        kvo__demo_prog pg = {"engine A (stores to the remote tier)", quiet, 0};
        kvo_eng_run_params rp = *base;
        rp.prefix_cache = true;
        rp.offload = kvo_eng_conn_offload(conn);
        rp.release_align = (uint32_t)kvo_eng_conn_chunk_tokens(conn);
        rp.evict_every = (uint32_t)evict_every;
        rp.on_done_ctx = &pg;
        if ((rc = kvo_eng_run(e, w->reqs, w->n, &rp, r)) != 0) (void)kvo__demo_fail("engine A run");
        else if ((rc = kvo_eng_conn_flush(conn)) != 0) (void)kvo__demo_fail("engine A remote flush");
    }
    char why[256];
    if (!rc && kvo_eng_results_compare(ra, r, w->n, cfg->vocab, why, sizeof why)) {
        fprintf(stderr, "kvoffload demo: engine A differs from the recompute run: %s\n", why);
        rc = KVO_ECORRUPT;
    }
    kvo_eng_conn_destroy(conn);
    kvo_eng_destroy(e);
    if (r) kvo_eng_results_free(r, w->n);
    free(r);
    return rc;
}

int kvo_cmd_demo(int argc, char **argv) {
    const char *shape = "hybrid-state", *trace = NULL, *file_dir = NULL, *metrics = NULL;
    uint64_t requests = 48, block_tokens = 16, max_blocks = 48, max_new = 4, engine_tokens = 0, chunk = 64,
             host_mib = 4, file_mib = 64, conc = 4, evict_every = 0, seed = 1234, hash_tokens = 0,
             remote_budget_us = 0;
    bool json = false, quiet = false;
    kvo_file_mode file_mode = KVO_FILE_WRITE_THROUGH;
    const char *remote = NULL, *remote_prefix = NULL, *phase = "both";
    int rc = kvo__demo_options(argc, argv, &(kvo__demo_opts){
        &shape, &trace, &file_dir, &metrics, &requests, &block_tokens, &max_blocks, &max_new, &engine_tokens, &chunk,
        &host_mib, &file_mib, &conc, &evict_every, &seed, &hash_tokens, &remote_budget_us, &json, &quiet, &file_mode, &remote,
        &remote_prefix, &phase});
    if (rc) return rc < 0 ? 0 : rc;
    kvo_eng_config cfg;
    if (kvo_eng_shape_config(shape, &cfg)) {
        fprintf(stderr, "kvoffload demo: %s\n", kvo_eng_last_error());
        return KVO_EXIT_USAGE;
    }
    cfg.seed = seed;
    if (hash_tokens) cfg.tokens_per_hash = (uint32_t)hash_tokens;

    /* the engine needs at least one block of every group */
    for (uint32_t g = 0; g < cfg.n_groups && engine_tokens; g++)
        if (engine_tokens < cfg.groups[g].tokens_per_block) {
            uint32_t min = 0;
            for (uint32_t k = 0; k < cfg.n_groups; k++)
                if (cfg.groups[k].tokens_per_block > min) min = cfg.groups[k].tokens_per_block;
            fprintf(stderr, "kvoffload demo: --engine-tokens is %llu, the minimum for shape '%s' is %u (one block "
                    "of every group; the workload may need more, default: twice the longest request)\n",
                    (unsigned long long)engine_tokens, shape, min);
            return KVO_EXIT_USAGE;
        }

    /* workload */
    char sample_buf[PATH_MAX + 64];
    if (trace && (rc = kvo_cli_input_file("demo", "--trace", trace))) return rc;
    if (!trace) trace = kvo__find_sample(sample_buf, sizeof sample_buf);
    kvo_eng_workload_params wp = kvo_eng_workload_default_params();
    wp.trace_path = trace;
    wp.max_requests = requests;
    wp.tokens_per_trace_block = (uint32_t)block_tokens;
    wp.max_trace_blocks = (uint32_t)max_blocks;
    wp.max_new_tokens = (uint32_t)max_new;
    wp.vocab = cfg.vocab;
    kvo_eng_workload *w = NULL;
    rc = kvo_eng_workload_load(&wp, &w);
    if (rc) {
        fprintf(stderr, "kvoffload demo: %s\n", kvo_eng_last_error());
        return kvo_cli_exit_code(rc);
    }
    uint64_t longest = (uint64_t)w->max_prompt + w->max_new;
    cfg.max_seq = (uint32_t)(longest + 16);
    cfg.budget_tokens = engine_tokens ? engine_tokens : 2 * longest + chunk;

    kvo_eng *base_e = NULL, *off_e = NULL;
    kvo_eng_conn *conn = NULL;
    kvo_eng_result *ra = calloc(w->n, sizeof *ra), *rb = calloc(w->n, sizeof *rb);
    char tmpdir[PATH_MAX] = "";
    int exit_code = KVO_EXIT_FAIL, watch_fd = -1;
    pid_t watcher = 0;
    if (!ra || !rb) {
        fprintf(stderr, "kvoffload demo: out of memory\n");
        goto out;
    }
    if (kvo_eng_create(&cfg, &base_e) || kvo_eng_create(&cfg, &off_e)) {
        rc = kvo__demo_fail("engine");
        goto out;
    }
    if (file_mib && !file_dir) {
        const char *t = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/kvoffload-demo-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmpdir)) {
            fprintf(stderr, "kvoffload demo: cannot create a temporary directory in %s: %s (use --file-dir)\n",
                    t && *t ? t : "/tmp", strerror(errno));
            tmpdir[0] = 0;
            goto out;
        }
        file_dir = tmpdir;
        watcher = kvo__demo_watch(tmpdir, &watch_fd); /* before the tiers start threads */
    }
    kvo_eng_conn_params cp = kvo_eng_conn_default_params();
    cp.chunk_tokens = chunk;
    cp.host_bytes = host_mib << 20;
    cp.file_dir = file_mib ? file_dir : NULL;
    cp.file_bytes = file_mib << 20;
    cp.file_mode = file_mode;
    char prefix_buf[128];
    if (remote) {
        /* the KV bytes depend on the weights (shape, seed): keep runs with
         * other weights apart */
        snprintf(prefix_buf, sizeof prefix_buf, "kvo-demo-%s-%llu", shape, (unsigned long long)seed);
        cp.remote_url = remote;
        cp.remote_prefix = remote_prefix ? remote_prefix : prefix_buf;
        cp.remote_lookup_budget_us = (uint32_t)remote_budget_us;
    }
    if ((rc = kvo_eng_conn_create(off_e, &cp, &conn)) != 0) {
        fprintf(stderr, "kvoffload demo: %s\n", kvo_eng_last_error());
        /* 2 for a setting refused (sizes, a URL); 1 for a failure (a server
         * out of reach, a directory not writable) */
        exit_code = kvo_cli_exit_code(rc);
        goto out;
    }

    /* header */
    const kvo_eng_config *c = kvo_eng_get_config(off_e);
    if (!json) {
        uint32_t layers = 0;
        printf("kvoffload demo: reference engine '%s': ", c->shape);
        for (uint32_t g = 0; g < c->n_groups; g++) {
            const kvo_eng_group_cfg *gc = &c->groups[g];
            layers += gc->layers;
            const char *kind = gc->kind == KVO_GROUP_FULL ? "full attention"
                               : gc->kind == KVO_GROUP_SLIDING ? "sliding-window attention"
                                                               : "recurrent state";
            printf("%s%s (%s", g ? ", " : "", gc->name, kind);
            if (gc->kind == KVO_GROUP_SLIDING) printf(" %u", gc->window);
            printf(", %u-token blocks, %u layer%s)", gc->tokens_per_block, gc->layers, gc->layers > 1 ? "s" : "");
        }
        printf("\n  %u layers, d_model %u, vocab %u, %.2fM fp32 parameters (random, seed %llu); "
               "%.0f KV bytes per token\n",
               layers, c->d_model, c->vocab, (double)kvo_eng_param_count(off_e) / 1e6, (unsigned long long)c->seed,
               (double)kvo_eng_kv_bytes(off_e, 1u << 20) / (double)(1u << 20));
        printf("workload: %zu requests from %s: %llu prompt tokens (longest %u), up to %u new tokens each\n", w->n,
               w->source, (unsigned long long)w->prompt_tokens, w->max_prompt, w->max_new);
        printf("engine KV budget: %llu tokens; offload: %llu-token chunks, host tier %llu MiB",
               (unsigned long long)c->budget_tokens, (unsigned long long)kvo_eng_conn_chunk_tokens(conn),
               (unsigned long long)host_mib);
        if (file_mib)
            printf(", file tier %llu MiB (write-%s) in %s", (unsigned long long)file_mib,
                   file_mode == KVO_FILE_WRITE_BACK ? "back" : "through", file_dir);
        printf("\n\n");
        fflush(stdout);
    }

    /* run 1: recompute everything */
    kvo__demo_prog pa = {"run 1/2 (recompute)", quiet, 0};
    kvo_eng_run_params p = kvo_eng_run_default_params();
    p.max_running = (uint32_t)conc;
    p.prefix_cache = false;
    p.on_done = kvo__demo_progress;
    p.on_done_ctx = &pa;
    double t0 = kvo__demo_now();
    if ((rc = kvo_eng_run(base_e, w->reqs, w->n, &p, ra)) != 0) {
        (void)kvo__demo_fail("run 1 (recompute)");
        if (rc == KVO_ENOSPC || rc == KVO_EINVAL) exit_code = KVO_EXIT_USAGE; /* budget too small */
        goto out;
    }
    double wall_a = kvo__demo_now() - t0;

    /* --remote, phase both: a first engine stores the workload in the
     * remote tier (its results must match too) */
    if (remote && !strcmp(phase, "both") &&
        kvo__demo_remote_store(&cfg, &cp, w, &p, ra, quiet, evict_every) != 0)
        goto out;

    /* run 2: engine prefix cache + offloading */
    kvo__demo_prog pb = {"run 2/2 (offload)", quiet, 0};
    p.prefix_cache = true;
    p.offload = kvo_eng_conn_offload(conn);
    p.release_align = (uint32_t)kvo_eng_conn_chunk_tokens(conn);
    p.evict_every = (uint32_t)evict_every;
    p.on_done_ctx = &pb;
    t0 = kvo__demo_now();
    if (kvo_eng_run(off_e, w->reqs, w->n, &p, rb)) {
        rc = kvo__demo_fail("run 2 (offload)");
        goto out;
    }
    double wall_b = kvo__demo_now() - t0;
    if (remote && kvo_eng_conn_flush(conn)) { /* puts sent before exit (phase store) */
        rc = kvo__demo_fail("remote tier flush");
        goto out;
    }

    kvo__demo_sum sa, sb;
    bool *cold = calloc(w->n ? w->n : 1, sizeof *cold);
    if (cold) kvo__demo_cold(w, c, cold);
    kvo__demo_summarize(ra, w->n, wall_a, cold, &sa);
    kvo__demo_summarize(rb, w->n, wall_b, cold, &sb);
    free(cold);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    (void)kvo_connector_get_stats(kvo_eng_conn_connector(conn), &cs);
    kvo_eng_stats es;
    kvo_eng_get_stats(off_e, &es);
    char why[256];
    size_t diff = kvo_eng_results_compare(ra, rb, w->n, c->vocab, why, sizeof why);
    uint64_t P = w->prompt_tokens, gen = sa.gen;
    double hit = P ? (double)(sb.local + sb.loaded) / (double)P : 0;
    uint64_t loaded_host = sb.loaded - sb.loaded_file - sb.loaded_remote;

    if (json) {
        printf("{\"shape\":\"%s\",\"params\":%llu,\"requests\":%zu,\"prompt_tokens\":%llu,\"generated_tokens\":%llu,"
               "\"engine_budget_tokens\":%llu,\"chunk_tokens\":%llu,\"host_mib\":%llu,\"file_mib\":%llu,"
               "\"file_mode\":\"%s\",\"file_writes\":%llu,\"file_writes_dropped\":%llu,",
               c->shape, (unsigned long long)kvo_eng_param_count(off_e), w->n, (unsigned long long)P,
               (unsigned long long)gen, (unsigned long long)c->budget_tokens,
               (unsigned long long)kvo_eng_conn_chunk_tokens(conn), (unsigned long long)host_mib,
               (unsigned long long)file_mib, file_mode == KVO_FILE_WRITE_BACK ? "back" : "through",
               (unsigned long long)cs.file_writes, (unsigned long long)cs.file_writes_dropped);
        const kvo__demo_sum *ss[2] = {&sa, &sb};
        const char *names[2] = {"recompute", "offload"};
        for (int k = 0; k < 2; k++) {
            const kvo__demo_sum *s = ss[k];
            printf("\"%s\":{\"tokens_computed\":%llu,\"tokens_engine_cache\":%llu,\"tokens_loaded_host\":%llu,"
                   "\"tokens_loaded_file\":%llu,\"tokens_loaded_remote\":%llu,\"load_failures\":%llu,"
                   "\"ttft_mean_ms\":%.3f,\"ttft_p50_ms\":%.3f,\"ttft_p90_ms\":%.3f,\"ttft_max_ms\":%.3f,\"ttft_p99_ms\":",
                   names[k], (unsigned long long)s->computed, (unsigned long long)s->local,
                   (unsigned long long)(s->loaded - s->loaded_file - s->loaded_remote),
                   (unsigned long long)s->loaded_file, (unsigned long long)s->loaded_remote,
                   (unsigned long long)s->failures, s->all.mean * 1e3, s->all.p50 * 1e3, s->all.p90 * 1e3,
                   s->all.max * 1e3);
            if (s->all.has_p99) printf("%.3f,", s->all.p99 * 1e3);
            else printf("null,");
            printf("\"queue_mean_ms\":%.3f,\"ttft\":{", s->queue_mean * 1e3);
            kvo__demo_lat_json("all", &s->all);
            printf(",");
            kvo__demo_lat_json("cold", &s->cold);
            printf(",");
            kvo__demo_lat_json("warm", &s->warm);
            printf("},\"wall_s\":%.3f,\"tokens_per_s\":%.1f,\"bytes_loaded\":%llu,\"bytes_stored\":%llu},", s->wall,
                   s->wall > 0 ? (double)(P + gen) / s->wall : 0, (unsigned long long)s->bytes_loaded,
                   (unsigned long long)s->bytes_stored);
        }
        if (remote)
            printf("\"remote\":{\"phase\":\"%s\",\"reads\":%llu,\"read_bytes\":%llu,\"read_failures\":%llu,"
                   "\"writes\":%llu,\"write_bytes\":%llu,\"writes_dropped\":%llu,\"exists_queries\":%llu,"
                   "\"lookups_pending\":%llu},",
                   phase, (unsigned long long)cs.remote_reads, (unsigned long long)cs.remote_read_bytes,
                   (unsigned long long)cs.remote_read_failures, (unsigned long long)cs.remote_writes,
                   (unsigned long long)cs.remote_write_bytes, (unsigned long long)cs.remote_writes_dropped,
                   (unsigned long long)cs.remote_exists, (unsigned long long)cs.remote_lookups_pending);
        printf("\"hit_rate\":%.4f,\"engine_block_evictions\":%llu,\"connector_call_errors\":%llu,"
               "\"stores_skipped\":%llu,\"match\":%s",
               hit, (unsigned long long)es.block_evictions, (unsigned long long)kvo_eng_conn_hook_errors(conn),
               (unsigned long long)(cs.stores_skipped_nospace + cs.stores_skipped_queue), diff ? "false" : "true");
        if (diff) printf(",\"difference\":\"%s\"", why);
        printf("}\n");
    } else {
        printf("%-34s %16s %16s\n", "", "recompute", "offload");
        printf("%-34s %16zu %16zu\n", "requests", w->n, w->n);
        printf("%-34s %16llu %16llu\n", "prompt tokens computed", (unsigned long long)sa.computed,
               (unsigned long long)sb.computed);
        printf("%-34s %16llu %16llu\n", "  reused from engine blocks", (unsigned long long)sa.local,
               (unsigned long long)sb.local);
        printf("%-34s %16llu %16llu\n", "  loaded from host tier",
               (unsigned long long)(sa.loaded - sa.loaded_file - sa.loaded_remote),
               (unsigned long long)loaded_host);
        printf("%-34s %16llu %16llu\n", "  loaded from file tier", (unsigned long long)sa.loaded_file,
               (unsigned long long)sb.loaded_file);
        if (remote)
            printf("%-34s %16llu %16llu\n", "  loaded from remote tier", (unsigned long long)sa.loaded_remote,
                   (unsigned long long)sb.loaded_remote);
        printf("%-34s %15.1f%% %15.1f%%\n", "hit rate (prompt tokens reused)", 0.0, 100.0 * hit);
        /* TTFT from arrival (every request arrives when its run starts) */
        printf("%-34s %16.2f %16.2f\n", "wait for a slot, mean (ms)", sa.queue_mean * 1e3, sb.queue_mean * 1e3);
        kvo__demo_lat_rows("from arrival, all", &sa.all, &sb.all);
        kvo__demo_lat_rows("cold (no hit possible)", &sa.cold, &sb.cold);
        kvo__demo_lat_rows("warm (hit possible)", &sa.warm, &sb.warm);
        printf("%-34s %16.0f %16.0f\n", "throughput (tokens/s)", wall_a > 0 ? (double)(P + gen) / wall_a : 0,
               wall_b > 0 ? (double)(P + gen) / wall_b : 0);
        printf("%-34s %16.2f %16.2f\n", "wall time (s)", wall_a, wall_b);
        printf("%-34s %16s %16.2f\n", "bytes loaded (MiB)", "-", (double)sb.bytes_loaded / 1048576.0);
        printf("%-34s %16s %16.2f\n", "bytes stored (MiB)", "-", (double)sb.bytes_stored / 1048576.0);
        printf("%-34s %16s %16llu\n", "loads failed -> recomputed", "-", (unsigned long long)sb.failures);
        printf("%-34s %16s %16llu\n", "engine blocks evicted", "-", (unsigned long long)es.block_evictions);
        printf("%-34s %16s %16llu\n", "host tier evictions", "-", (unsigned long long)cs.host.evictions);
        if (file_mib) {
            printf("%-34s %16s %16llu\n", "file tier writes", "-", (unsigned long long)cs.file_writes);
            printf("%-34s %16s %16llu\n", "file writes dropped", "-",
                   (unsigned long long)cs.file_writes_dropped);
        }
        if (remote) {
            printf("%-34s %16s %16.2f\n", "remote reads (MiB)", "-", (double)cs.remote_read_bytes / 1048576.0);
            printf("%-34s %16s %16llu\n", "remote read failures", "-",
                   (unsigned long long)cs.remote_read_failures);
            printf("%-34s %16s %16llu\n", "remote writes", "-", (unsigned long long)cs.remote_writes);
            printf("%-34s %16s %16llu\n", "remote writes dropped", "-",
                   (unsigned long long)cs.remote_writes_dropped);
        }
        printf("%-34s %16s %16llu\n", "stores skipped (no room)", "-",
               (unsigned long long)(cs.stores_skipped_nospace + cs.stores_skipped_queue));
        if (kvo_eng_conn_hook_errors(conn))
            printf("%-34s %16s %16llu\n", "connector calls failed", "-",
                   (unsigned long long)kvo_eng_conn_hook_errors(conn));
        printf("\n");
        if (diff)
            printf("verdict: MISMATCH: %s\n", why);
        else
            printf("verdict: MATCH: all %llu generated tokens of %zu requests and every request's final logits "
                   "(%u floats) are bit-identical with and without offloading\n",
                   (unsigned long long)gen, w->n, c->vocab);
    }
    exit_code = diff ? KVO_EXIT_FAIL : KVO_EXIT_OK;
    /* A demo that loaded nothing from any tier demonstrated nothing: every
     * prefix came from the engine's own cache or was recomputed. */
    if (!diff && sb.loaded == 0 && strcmp(phase, "store") != 0) {
        fprintf(stderr, "kvoffload demo: no prompt token was loaded from any tier (%llu engine evictions, "
                        "%.2f MiB stored): the workload never came back to an evicted prefix; use a trace with "
                        "repeated prefixes (--trace) or more requests (--requests)\n",
                (unsigned long long)es.block_evictions, (double)sb.bytes_stored / 1048576.0);
        exit_code = KVO_EXIT_FAIL;
    }
    if (metrics && kvo__demo_metrics(metrics, kvo_eng_conn_connector(conn))) exit_code = KVO_EXIT_FAIL;
out:
    (void)rc;
    kvo_eng_conn_destroy(conn);
    kvo_eng_destroy(base_e);
    kvo_eng_destroy(off_e);
    if (ra) kvo_eng_results_free(ra, w->n);
    if (rb) kvo_eng_results_free(rb, w->n);
    free(ra);
    free(rb);
    kvo_eng_workload_free(w);
    if (tmpdir[0]) nftw(tmpdir, kvo__rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (watcher > 0) {
        ssize_t n = write(watch_fd, "x", 1); /* removed: the watcher leaves it alone */
        (void)n;
        close(watch_fd);
        while (waitpid(watcher, NULL, 0) < 0 && errno == EINTR) {}
    }
    return exit_code;
}
