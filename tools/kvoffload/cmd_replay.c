/* `kvoffload replay`: capacity planning.  Replays a Mooncake-format trace
 * through the real store at each capacity and policy, against Belady's MIN and
 * the infinite cache (engine: replay.c, replay_min.c; plot: replay_plot.c;
 * docs/replay.md). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "replay.h"

#define RP_MAXCAP 256
#define RP_MAXPOL 8
#define RP_BLOCK_TOKENS 512

static void rp_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload replay --trace FILE --capacity LIST [--model M] [--policy LIST]\n"
            "                        [--no-min] [--ignore-present] [--json] [--plot FILE.png] [--quiet]\n\n"
            "Replays a Mooncake-format trace (one {\"hash_ids\": [..]} per line, 512-token blocks)\n"
            "through the store at each capacity and prints the prefix hit rate per policy, with\n"
            "Belady's MIN (offline optimum) and the infinite cache.\n"
            "  --capacity LIST  comma-separated capacities, or a sweep FROM:TO:COUNT (linear);\n"
            "                   in 512-token blocks, or in bytes with a suffix (B, KiB, MiB, GiB,\n"
            "                   KB, MB, GB) when --model is given\n"
            "  --model M        preset or kvoffload-model/1 file: bytes per block from its plan\n"
            "  --policy LIST    store policies (default lru,arc,s3fifo,prefix)\n"
            "  --no-min         skip Belady's MIN\n"
            "  --ignore-present vLLM's manager: hits touched, present blocks not touched by a\n"
            "                   store (LRU 42.39 %% at 10k blocks on the Mooncake trace)\n"
            "  --json           one JSON object per (policy, capacity) line\n"
            "  --plot FILE      hit rate vs capacity as a PNG (needs cairo)\n"
            "  --quiet          no progress on stderr\n"
            "Exit status: 0 success, 2 invalid usage or trace, 1 other failure.\n");
}

typedef struct rp_opts {
    const char *trace, *model, *plot;
    int json, quiet, no_min, ignore_present;
    kvo_policy_kind pol[RP_MAXPOL];
    size_t npol;
    uint64_t cap[RP_MAXCAP];
    size_t ncap;
    uint64_t block_bytes; /* 0: no model */
} rp_opts;

/* One capacity: blocks, or bytes with a suffix (needs block_bytes). */
static int rp_parse_one(const char *s, size_t len, uint64_t block_bytes, uint64_t *out) {
    char buf[64], *end;
    if (len == 0 || len >= sizeof buf) return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    if (buf[0] < '0' || buf[0] > '9') return -1;
    double v = strtod(buf, &end);
    static const struct { const char *sfx; double mul; } units[] = {
        {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    if (*end) {
        size_t u = 0;
        while (u < sizeof units / sizeof units[0] && strcasecmp(end, units[u].sfx)) u++;
        if (u == sizeof units / sizeof units[0] || !block_bytes) return -2;
        v = v * units[u].mul / (double)block_bytes;
    }
    if (v < 1 || v > 1e9) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int rp_parse_caps(const char *s, rp_opts *o) {
    const char *c1 = strchr(s, ':');
    if (c1) {
        const char *c2 = strchr(c1 + 1, ':');
        uint64_t a, b, n;
        char *end;
        if (!c2 || rp_parse_one(s, (size_t)(c1 - s), o->block_bytes, &a) ||
            rp_parse_one(c1 + 1, (size_t)(c2 - c1 - 1), o->block_bytes, &b) || b < a)
            goto bad;
        n = strtoull(c2 + 1, &end, 10);
        if (*end || n < 2 || n > RP_MAXCAP) goto bad;
        for (uint64_t i = 0; i < n; i++) o->cap[o->ncap++] = a + (b - a) * i / (n - 1);
        return 0;
    }
    for (const char *p = s; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        int r = o->ncap < RP_MAXCAP ? rp_parse_one(p, len, o->block_bytes, &o->cap[o->ncap]) : -1;
        if (r == -2) {
            fprintf(stderr, "kvoffload replay: capacity '%.*s' is in bytes: give --model to convert it to blocks, "
                            "or give blocks (e.g. 10000)\n", (int)len, p);
            return KVO_EXIT_USAGE;
        }
        if (r) goto bad;
        o->ncap++;
        p += len + (q != NULL);
    }
    if (o->ncap) return 0;
bad:
    fprintf(stderr, "kvoffload replay: --capacity '%s' is not a list of capacities (1..1e9 blocks, e.g. "
                    "1000,10000,30000) or a sweep FROM:TO:COUNT (e.g. 1000:50000:20, COUNT 2..%d)\n", s, RP_MAXCAP);
    return KVO_EXIT_USAGE;
}

static int rp_parse_pols(const char *s, rp_opts *o) {
    o->npol = 0;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        char name[32];
        if (len == 0 || len >= sizeof name || o->npol == RP_MAXPOL) {
            fprintf(stderr, "kvoffload replay: --policy '%s' is not a list of at most %d policies "
                            "(e.g. lru,arc,s3fifo,prefix)\n", s, RP_MAXPOL);
            return KVO_EXIT_USAGE;
        }
        memcpy(name, p, len);
        name[len] = 0;
        int rc = kvo_policy_parse(name, &o->pol[o->npol++]);
        if (rc) return kvo_cli_fail("replay", rc);
        p += len + (q != NULL);
    }
    return 0;
}

/* Bytes of one 512-token block for a model: every offloaded group's slot
 * bytes, scaled from its chunk's tokens to 512. */
static int rp_model_bytes(const char *model, uint64_t *out) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    kvo_plan_params pp = kvo_plan_default_params();
    int rc = kvo_model_open(model, &m);
    if (!rc) rc = kvo_plan_create(m, &pp, &p);
    double b = 0;
    for (size_t g = 0; !rc && g < kvo_plan_num_groups(p); g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        if (gp->offloaded && gp->tokens_per_chunk)
            b += (double)gp->slot_bytes * RP_BLOCK_TOKENS / (double)gp->tokens_per_chunk;
    }
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    *out = (uint64_t)(b + 0.5);
    return rc;
}

static void rp_emit(const rp_opts *o, const char *name, uint64_t cap, const rp_result *r) {
    double hr = r->blocks ? (double)r->hits / (double)r->blocks : 0;
    uint64_t miss = r->blocks - r->hits;
    if (o->json) {
        printf("{\"policy\": \"%s\", \"capacity_blocks\": %llu, \"hit_rate\": %.6f, \"hits\": %llu, "
               "\"blocks\": %llu, \"blocks_loaded\": %llu, \"blocks_recomputed\": %llu, \"evictions\": %llu",
               name, (unsigned long long)cap, hr, (unsigned long long)r->hits, (unsigned long long)r->blocks,
               (unsigned long long)r->hits, (unsigned long long)miss, (unsigned long long)r->evictions);
        if (o->block_bytes)
            printf(", \"capacity_bytes\": %llu, \"bytes_loaded\": %llu, \"bytes_recomputed\": %llu",
                   (unsigned long long)(cap * o->block_bytes), (unsigned long long)(r->hits * o->block_bytes),
                   (unsigned long long)(miss * o->block_bytes));
        printf("}\n");
    } else if (o->block_bytes) {
        printf("  %-9s %10llu %8.2f %% %14.3f %14.3f %12llu\n", name, (unsigned long long)cap, 100 * hr,
               (double)(r->hits * o->block_bytes) / 1e9, (double)(miss * o->block_bytes) / 1e9,
               (unsigned long long)r->evictions);
    } else {
        printf("  %-9s %10llu %8.2f %% %12llu %12llu %12llu\n", name, (unsigned long long)cap, 100 * hr,
               (unsigned long long)r->hits, (unsigned long long)miss, (unsigned long long)r->evictions);
    }
    fflush(stdout);
}

static int rp_parse(int argc, char **argv, rp_opts *o, const char **caps) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            rp_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--no-min")) o->no_min = 1;
        else if (!strcmp(a, "--ignore-present")) o->ignore_present = 1;
        else if (v && !strcmp(a, "--trace")) o->trace = argv[++i];
        else if (v && !strcmp(a, "--model")) o->model = argv[++i];
        else if (v && !strcmp(a, "--plot")) o->plot = argv[++i];
        else if (v && !strcmp(a, "--capacity")) *caps = argv[++i];
        else if (v && !strcmp(a, "--policy")) rc = rp_parse_pols(argv[++i], o);
        else {
            fprintf(stderr, "kvoffload replay: unknown or incomplete option '%s'\n", a);
            rp_usage(stderr);
            return KVO_EXIT_USAGE;
        }
        if (rc) return rc;
    }
    if (!o->trace || !*caps) {
        fprintf(stderr, "kvoffload replay: --trace and --capacity are required\n");
        rp_usage(stderr);
        return KVO_EXIT_USAGE;
    }
    int bad = kvo_cli_input_file("replay", "--trace", o->trace); /* bad input files: exit 2 */
    if (bad || (o->model && (bad = kvo_cli_model_input("replay", o->model)))) return bad;
    if (o->model) {
        int rc = rp_model_bytes(o->model, &o->block_bytes);
        if (rc) return kvo_cli_fail("replay", rc);
    }
    return rp_parse_caps(*caps, o);
}

/* Run every (policy, capacity), MIN and the infinite cache; rates[curve][cap]. */
static int rp_run(const rp_opts *o, const rp_trace *t, double *rates, size_t ncurves) {
    rp_result inf;
    rp_replay_infinite(t, &inf);
    size_t done = 0, total = ncurves * o->ncap;
    for (size_t c = 0; c < o->ncap; c++) {
        for (size_t k = 0; k < ncurves; k++) {
            rp_result r;
            const char *name;
            int rc = 0;
            if (k < o->npol) {
                name = kvo_policy_name(o->pol[k]);
                rc = rp_replay_store(t, o->pol[k], o->cap[c], o->ignore_present, &r);
            } else if (k == o->npol && !o->no_min) {
                name = "min";
                rc = rp_replay_min(t, o->cap[c], &r);
            } else {
                name = "infinite";
                r = inf;
            }
            if (rc) return kvo_cli_fail("replay", rc);
            rates[k * o->ncap + c] = r.blocks ? (double)r.hits / (double)r.blocks : 0;
            rp_emit(o, name, o->cap[c], &r);
            if (!o->quiet)
                fprintf(stderr, "replay: %zu/%zu %s at %llu blocks: %.2f %%\n", ++done, total, name,
                        (unsigned long long)o->cap[c], 100 * rates[k * o->ncap + c]);
        }
    }
    return 0;
}

int kvo_cmd_replay(int argc, char **argv) {
    rp_opts o;
    memset(&o, 0, sizeof o);
    static const kvo_policy_kind defpol[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    memcpy(o.pol, defpol, sizeof defpol);
    o.npol = sizeof defpol / sizeof defpol[0];
    const char *caps = NULL;
    int rc = rp_parse(argc, argv, &o, &caps);
    if (rc) return rc < 0 ? 0 : rc;
    rp_trace t;
    char err[512];
    if (rp_trace_load(o.trace, &t, err, sizeof err)) {
        fprintf(stderr, "kvoffload replay: %s\n", err);
        return KVO_EXIT_USAGE;
    }
    if (!o.json) {
        printf("trace %s: %zu requests, %zu block references, %zu distinct blocks", o.trace, t.nreq, t.nids,
               t.ndistinct);
        if (o.block_bytes) printf(", %llu bytes per block (%s)", (unsigned long long)o.block_bytes, o.model);
        printf("\n  %-9s %10s %10s %14s %14s %12s\n", "policy", "blocks", "hit rate",
               o.block_bytes ? "loaded GB" : "hits", o.block_bytes ? "recomputed GB" : "misses", "evictions");
    }
    size_t ncurves = o.npol + (o.no_min ? 0 : 1) + 1;
    double *rates = calloc(ncurves * o.ncap, sizeof *rates);
    rc = rates ? rp_run(&o, &t, rates, ncurves) : kvo_cli_fail("replay", KVO_ENOMEM);
    if (!rc && o.plot) {
        rp_curve cv[RP_MAXPOL + 2];
        double xs[RP_MAXCAP];
        for (size_t c = 0; c < o.ncap; c++) xs[c] = (double)o.cap[c];
        for (size_t k = 0; k < ncurves; k++) {
            cv[k].name = k < o.npol ? kvo_policy_name(o.pol[k]) : (k == o.npol && !o.no_min) ? "min" : "infinite";
            cv[k].hit_rate = rates + k * o.ncap;
        }
        const char *base = strrchr(o.trace, '/');
        char title[256];
        snprintf(title, sizeof title, "prefix hit rate vs capacity: %s", base ? base + 1 : o.trace);
        if (rp_plot_png(o.plot, title, "capacity (512-token blocks)", xs, o.ncap, cv, ncurves, err, sizeof err)) {
            fprintf(stderr, "kvoffload replay: --plot: %s\n", err);
            rc = KVO_EXIT_FAIL;
        }
    }
    free(rates);
    rp_trace_free(&t);
    return rc;
}
