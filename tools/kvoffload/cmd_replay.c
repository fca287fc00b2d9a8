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
#define RP_MAXENG 1024

static void rp_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload replay --trace FILE --capacity LIST [--model M] [--policy LIST]\n"
            "                        [--no-min] [--ignore-present] [--json] [--plot FILE.png]\n"
            "                        [--quiet]\n"
            "       kvoffload replay --trace FILE --capacity LIST --engines N [--routing LIST]\n"
            "                        [--shared-capacity LIST] [--shared-policy P] [--prefix-blocks K] ...\n\n"
            "Replays a Mooncake-format trace (one {\"hash_ids\": [..]} per line, 512-token blocks)\n"
            "through the store at each capacity and prints the prefix hit rate per policy, with\n"
            "Belady's MIN (offline optimum) and the infinite cache.\n"
            "  --capacity LIST  comma-separated capacities, or a sweep FROM:TO:COUNT (linear);\n"
            "                   in 512-token blocks, or in bytes with a suffix (B, KiB, MiB, GiB,\n"
            "                   KB, MB, GB) when --model is given\n"
            "  --model M        preset or kvoffload-model/1 file: bytes per block from its plan\n"
            "  --policy LIST    store policies of lru, arc, s3fifo, prefix (branch: an alias\n"
            "                   of prefix; default lru,arc,s3fifo,prefix)\n"
            "  --no-min         skip Belady's MIN\n"
            "  --ignore-present vLLM's manager: hits touched, present blocks not touched by a\n"
            "                   store (LRU 42.39 %% at 10k blocks on the Mooncake trace)\n"
            "  --json           one JSON object per (policy, capacity) line\n"
            "  --plot FILE      hit rate vs capacity as a PNG (needs cairo)\n"
            "  --quiet          no progress on stderr\n"
            "Fleets (docs/replay.md, \"Fleets\"): N engines, each with a host tier of --capacity\n"
            "(per engine), optionally sharing one remote tier; hit rates per engine and fleet,\n"
            "blocks (bytes with --model) read from and written to the shared tier, the same\n"
            "without it, and one pool of the fleet's whole capacity for reference.\n"
            "  --engines N          1..%d engines (fleet mode; --policy default lru, no MIN)\n"
            "  --routing LIST       round-robin,session,prefix-hash (default all three); session:\n"
            "                       the lines' session_id, else conversations inferred from prefixes\n"
            "  --shared-capacity LIST  the shared tier's capacities, like --capacity; 0 = none\n"
            "                       (always replayed); --plot draws hit rate against it\n"
            "  --shared-policy P    the shared tier's policy (default lru, as Redis allkeys-lru)\n"
            "  --prefix-blocks K    prefix-hash routes on the first K blocks (default 1)\n"
            "Exit status: 0 success, 2 invalid usage or trace, 1 other failure.\n", RP_MAXENG);
}

typedef struct rp_opts {
    const char *trace, *model, *plot;
    int json, quiet, no_min, ignore_present, pol_given;
    kvo_policy_kind pol[RP_MAXPOL];
    size_t npol;
    uint64_t cap[RP_MAXCAP];
    size_t ncap;
    uint64_t block_bytes; /* 0: no model */
    /* fleets: engines 0 = the single-cache replay */
    size_t engines, prefix_blocks, nshared;
    int routes[RP_ROUTE_COUNT];
    size_t nroutes;
    kvo_policy_kind shared_pol;
    uint64_t shared[RP_MAXCAP + 1];
} rp_opts;

/* One capacity: blocks, or bytes with a suffix (needs block_bytes). */
static int rp_parse_one(const char *s, size_t len, uint64_t block_bytes, uint64_t min, uint64_t *out) {
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
    if (v < (double)min || v > 1e9 || (v < 1 && v > 0)) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* --capacity (min 1) or --shared-capacity (min 0) into cap[*ncap].  A refusal
 * says which part is wrong and what would be accepted. */
static int rp_parse_caps(const char *opt, const char *s, uint64_t block_bytes, uint64_t min, uint64_t *cap,
                         size_t *ncap) {
    const char *c1 = strchr(s, ':');
    char why[256] = "";
    *ncap = 0;
    if (c1) {
        const char *c2 = strchr(c1 + 1, ':');
        uint64_t a = 0, b = 0, n;
        char *end;
        int ra = -1, rb = -1;
        if (!c2) {
            snprintf(why, sizeof why, "a sweep has three parts, FROM:TO:COUNT");
        } else if ((ra = rp_parse_one(s, (size_t)(c1 - s), block_bytes, min, &a)) ||
                   (rb = rp_parse_one(c1 + 1, (size_t)(c2 - c1 - 1), block_bytes, min, &b))) {
            const char *part = ra ? s : c1 + 1;
            int len = (int)(ra ? c1 - s : c2 - c1 - 1);
            snprintf(why, sizeof why, "%s '%.*s' is not a capacity (%llu..1e9 blocks%s)", ra ? "FROM" : "TO", len,
                     part, (unsigned long long)min, block_bytes ? ", or bytes: 64GiB" : "; bytes need --model");
        } else if (b < a) {
            snprintf(why, sizeof why, "FROM %llu is above TO %llu: a sweep goes up (e.g. %llu:%llu:%s)",
                     (unsigned long long)a, (unsigned long long)b, (unsigned long long)b, (unsigned long long)a,
                     c2 + 1);
        } else if ((n = strtoull(c2 + 1, &end, 10)) < 2 || n > RP_MAXCAP || *end || end == c2 + 1) {
            snprintf(why, sizeof why, "COUNT '%s' must be an integer in 2..%d", c2 + 1, RP_MAXCAP);
        } else {
            for (uint64_t i = 0; i < n; i++) cap[(*ncap)++] = a + (b - a) * i / (n - 1);
            return 0;
        }
        goto bad;
    }
    for (const char *p = s; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (*ncap == RP_MAXCAP) {
            snprintf(why, sizeof why, "more than %d capacities", RP_MAXCAP);
            goto bad;
        }
        int r = rp_parse_one(p, len, block_bytes, min, &cap[*ncap]);
        if (r == -2) {
            fprintf(stderr, "kvoffload replay: %s '%.*s' is in bytes: give --model to convert it to blocks, "
                            "or give blocks (e.g. 10000)\n", opt, (int)len, p);
            return KVO_EXIT_USAGE;
        }
        if (r) {
            snprintf(why, sizeof why, "'%.*s' is not a capacity (%llu..1e9 blocks)", (int)len, p,
                     (unsigned long long)min);
            goto bad;
        }
        (*ncap)++;
        p += len + (q != NULL);
    }
    if (*ncap) return 0;
    snprintf(why, sizeof why, "no capacity given");
bad:
    fprintf(stderr, "kvoffload replay: %s '%s': %s; give a list of capacities (%llu..1e9 blocks, e.g. "
                    "1000,10000,30000) or a sweep FROM:TO:COUNT (FROM <= TO, e.g. 1000:50000:20, COUNT 2..%d)\n",
            opt, s, why, (unsigned long long)min, RP_MAXCAP);
    return KVO_EXIT_USAGE;
}

static int rp_parse_routes(const char *s, rp_opts *o) {
    o->nroutes = 0;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p), k = 0;
        while (k < RP_ROUTE_COUNT && (strlen(rp_routing_names[k]) != len || strncmp(p, rp_routing_names[k], len))) k++;
        if (k == RP_ROUTE_COUNT || o->nroutes == RP_ROUTE_COUNT) {
            fprintf(stderr, "kvoffload replay: --routing '%s' is not a list of round-robin, session, prefix-hash\n", s);
            return KVO_EXIT_USAGE;
        }
        o->routes[o->nroutes++] = (int)k;
        p += len + (q != NULL);
    }
    return 0;
}

/* A count option in lo..hi. */
static int rp_parse_count(const char *opt, const char *s, size_t lo, size_t hi, size_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || *end || v < lo || v > hi) {
        fprintf(stderr, "kvoffload replay: %s '%s' is not a number in %zu..%zu\n", opt, s, lo, hi);
        return KVO_EXIT_USAGE;
    }
    *out = (size_t)v;
    return 0;
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
        o->pol_given = 1;
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
    const char *shared = NULL;
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
        else if (v && !strcmp(a, "--engines")) rc = rp_parse_count(a, argv[++i], 1, RP_MAXENG, &o->engines);
        else if (v && !strcmp(a, "--prefix-blocks")) rc = rp_parse_count(a, argv[++i], 1, 1u << 20, &o->prefix_blocks);
        else if (v && !strcmp(a, "--routing")) rc = rp_parse_routes(argv[++i], o);
        else if (v && !strcmp(a, "--shared-capacity")) shared = argv[++i];
        else if (v && !strcmp(a, "--shared-policy")) {
            rc = kvo_policy_parse(argv[++i], &o->shared_pol);
            if (rc) return kvo_cli_fail("replay", rc);
        }
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
    if (!o->engines && (shared || o->nroutes || o->prefix_blocks)) {
        fprintf(stderr, "kvoffload replay: --routing, --shared-capacity and --prefix-blocks need --engines N\n");
        return KVO_EXIT_USAGE;
    }
    int rc = rp_parse_caps("--capacity", *caps, o->block_bytes, 1, o->cap, &o->ncap);
    if (!rc && shared) rc = rp_parse_caps("--shared-capacity", shared, o->block_bytes, 0, o->shared + 1, &o->nshared);
    if (rc || !o->engines) return rc;
    /* the host-only fleet first, then the shared capacities asked for */
    size_t w = 1;
    for (size_t i = 1; i <= o->nshared; i++)
        if (o->shared[i]) o->shared[w++] = o->shared[i];
    o->shared[0] = 0;
    o->nshared = w;
    if (!o->prefix_blocks) o->prefix_blocks = 1;
    if (!o->nroutes)
        for (int k = 0; k < RP_ROUTE_COUNT; k++) o->routes[o->nroutes++] = k;
    if (!o->pol_given) o->pol[0] = KVO_POLICY_LRU, o->npol = 1;
    return 0;
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

/* ------------------------------------------------------------ fleets -- */

static double rp_rate(uint64_t hits, uint64_t blocks) { return blocks ? (double)hits / (double)blocks : 0; }

/* One fleet line (text or JSON) for shared capacity index s; cells of all. */
static void rp_fleet_emit(const rp_opts *o, int route, kvo_policy_kind pol, uint64_t cap, size_t s,
                          const rp_fleet_cell *cells, double pooled) {
    size_t N = o->engines;
    const rp_fleet_cell *row = cells + s * N, *none = cells;
    uint64_t req = 0, blocks = 0, lh = 0, sh = 0, puts = 0, base = 0;
    for (size_t e = 0; e < N; e++) {
        req += row[e].requests, blocks += row[e].blocks, lh += row[e].local_hits;
        sh += row[e].shared_hits, puts += row[e].shared_puts, base += none[e].local_hits;
    }
    double hr = rp_rate(lh + sh, blocks), hr0 = rp_rate(base, blocks), gain = hr0 > 0 ? hr / hr0 : 0;
    uint64_t bb = o->block_bytes, sc = o->shared[s];
    if (o->json) {
        printf("{\"routing\": \"%s\", \"engines\": %zu, \"policy\": \"%s\", \"shared_policy\": \"%s\", "
               "\"capacity_blocks\": %llu, \"shared_capacity_blocks\": %llu, \"requests\": %llu, \"blocks\": %llu, "
               "\"hits\": %llu, \"hit_rate\": %.6f, \"local_hits\": %llu, \"shared_hits\": %llu, "
               "\"shared_writes\": %llu, \"hits_no_shared\": %llu, \"hit_rate_no_shared\": %.6f, "
               "\"gain_vs_no_shared\": %.4f, \"pooled_hit_rate\": %.6f",
               rp_routing_names[route], N, kvo_policy_name(pol), kvo_policy_name(o->shared_pol),
               (unsigned long long)cap, (unsigned long long)sc, (unsigned long long)req, (unsigned long long)blocks,
               (unsigned long long)(lh + sh), hr, (unsigned long long)lh, (unsigned long long)sh,
               (unsigned long long)puts, (unsigned long long)base, hr0, gain, pooled);
        if (bb)
            printf(", \"capacity_bytes\": %llu, \"shared_capacity_bytes\": %llu, \"bytes_from_shared\": %llu, "
                   "\"bytes_to_shared\": %llu, \"bytes_recomputed\": %llu",
                   (unsigned long long)(cap * bb), (unsigned long long)(sc * bb), (unsigned long long)(sh * bb),
                   (unsigned long long)(puts * bb), (unsigned long long)((blocks - lh - sh) * bb));
        printf(", \"per_engine\": [");
        for (size_t e = 0; e < N; e++)
            printf("%s{\"requests\": %llu, \"blocks\": %llu, \"hits\": %llu, \"local_hits\": %llu, "
                   "\"shared_hits\": %llu, \"hit_rate\": %.6f}", e ? ", " : "", (unsigned long long)row[e].requests,
                   (unsigned long long)row[e].blocks, (unsigned long long)(row[e].local_hits + row[e].shared_hits),
                   (unsigned long long)row[e].local_hits, (unsigned long long)row[e].shared_hits,
                   rp_rate(row[e].local_hits + row[e].shared_hits, row[e].blocks));
        printf("]}\n");
    } else {
        printf("  %-11s %-7s %9llu %10llu %8.2f %% %8.2f %% %6.3fx %8.2f %% ", rp_routing_names[route],
               kvo_policy_name(pol), (unsigned long long)cap, (unsigned long long)sc, 100 * hr, 100 * hr0, gain,
               100 * pooled);
        if (bb) printf("%12.3f %12.3f\n", (double)(sh * bb) / 1e9, (double)(puts * bb) / 1e9);
        else printf("%12llu %12llu\n", (unsigned long long)sh, (unsigned long long)puts);
        printf("    per engine, hit rate %% (requests):");
        for (size_t e = 0; e < N; e++)
            printf(" %.2f (%llu)", 100 * rp_rate(row[e].local_hits + row[e].shared_hits, row[e].blocks),
                   (unsigned long long)row[e].requests);
        printf("\n");
    }
    fflush(stdout);
}

/* Every (policy, capacity, routing), all shared capacities per pass; the
 * plot: fleet hit rate against shared capacity per routing (and policy and
 * capacity when several), one pool of the fleet's capacity dashed. */
static int rp_fleet_main(const rp_opts *o, const rp_trace *t) {
    size_t N = o->engines, S = o->nshared, nline = o->npol * o->ncap, ncurves = nline * (o->nroutes + 1);
    rp_fleet_cell *cells = malloc(S * N * sizeof *cells);
    double *rates = calloc(ncurves * S, sizeof *rates);
    char (*names)[64] = calloc(ncurves, sizeof *names);
    int rc = cells && rates && names ? 0 : KVO_ENOMEM;
    if (!o->json)
        printf("fleet of %zu engines, shared tier %s, prefix-hash on %zu block%s; pooled: one %s cache of "
               "engines x host + shared blocks\n  %-11s %-7s %9s %10s %10s %10s %7s %10s %12s %12s\n",
               N, kvo_policy_name(o->shared_pol), o->prefix_blocks, o->prefix_blocks > 1 ? "s" : "",
               o->npol == 1 ? kvo_policy_name(o->pol[0]) : "host-policy", "routing", "policy", "host", "shared",
               "hit rate", "no shared", "gain", "pooled", o->block_bytes ? "from sh. GB" : "from shared",
               o->block_bytes ? "to sh. GB" : "to shared");
    for (size_t k = 0; !rc && k < nline; k++) {
        kvo_policy_kind pol = o->pol[k / o->ncap];
        uint64_t cap = o->cap[k % o->ncap];
        double *pooled = rates + (nline * o->nroutes + k) * S;
        for (size_t s = 0; !rc && s < S; s++) {
            rp_result r;
            rc = rp_replay_store(t, pol, cap * N + o->shared[s], o->ignore_present, &r);
            pooled[s] = rp_rate(r.hits, r.blocks);
        }
        if (nline == 1) snprintf(names[nline * o->nroutes + k], 64, "one pool");
        else snprintf(names[nline * o->nroutes + k], 64, "one pool, %s %llu", kvo_policy_name(pol),
                      (unsigned long long)cap);
        for (size_t q = 0; !rc && q < o->nroutes; q++) {
            rp_fleet_params fp = {.engines = N, .prefix_blocks = o->prefix_blocks, .routing = (rp_routing)o->routes[q],
                                  .pol = pol, .shared_pol = o->shared_pol, .cap = cap,
                                  .ignore_present = o->ignore_present != 0,
                                  .shared_caps = o->shared, .nshared = S};
            rc = rp_replay_fleet(t, &fp, cells, NULL);
            double *curve = rates + (k * o->nroutes + q) * S;
            for (size_t s = 0; !rc && s < S; s++) {
                uint64_t h = 0, b = 0;
                for (size_t e = 0; e < N; e++)
                    h += cells[s * N + e].local_hits + cells[s * N + e].shared_hits, b += cells[s * N + e].blocks;
                curve[s] = rp_rate(h, b);
                rp_fleet_emit(o, o->routes[q], pol, cap, s, cells, pooled[s]);
            }
            if (nline == 1) snprintf(names[k * o->nroutes + q], 64, "%s", rp_routing_names[o->routes[q]]);
            else snprintf(names[k * o->nroutes + q], 64, "%s, %s %llu", rp_routing_names[o->routes[q]],
                          kvo_policy_name(pol), (unsigned long long)cap);
            if (!rc && !o->quiet)
                fprintf(stderr, "replay: %zu/%zu fleet %s, %s at %llu blocks per engine: %.2f %% host only, "
                        "%.2f %% with %llu shared\n", k * o->nroutes + q + 1, nline * o->nroutes,
                        rp_routing_names[o->routes[q]], kvo_policy_name(pol), (unsigned long long)cap,
                        100 * curve[0], 100 * curve[S - 1], (unsigned long long)o->shared[S - 1]);
        }
    }
    if (rc) rc = kvo_cli_fail("replay", rc);
    if (!rc && o->plot) {
        rp_curve *cv = calloc(ncurves, sizeof *cv);
        double xs[RP_MAXCAP + 1];
        char err[512], title[256];
        for (size_t s = 0; s < S; s++) xs[s] = (double)o->shared[s];
        for (size_t c = 0; cv && c < ncurves; c++)
            cv[c] = (rp_curve){.name = names[c], .hit_rate = rates + c * S, .dashed = c >= nline * o->nroutes};
        const char *base = strrchr(o->trace, '/');
        snprintf(title, sizeof title, "fleet of %zu engines, %llu blocks each: %s", N,
                 (unsigned long long)o->cap[0], base ? base + 1 : o->trace);
        if (o->ncap > 1) snprintf(title, sizeof title, "fleet of %zu engines: %s", N, base ? base + 1 : o->trace);
        if (!cv) rc = kvo_cli_fail("replay", KVO_ENOMEM);
        else if (rp_plot_png(o->plot, title, "shared tier capacity (512-token blocks)", xs, S, cv, ncurves, err,
                             sizeof err)) {
            fprintf(stderr, "kvoffload replay: --plot: %s\n", err);
            rc = KVO_EXIT_FAIL;
        }
        free(cv);
    }
    free(cells); free(rates); free(names);
    return rc;
}

int kvo_cmd_replay(int argc, char **argv) {
    rp_opts o;
    memset(&o, 0, sizeof o);
    static const kvo_policy_kind defpol[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};
    memcpy(o.pol, defpol, sizeof defpol);
    o.npol = sizeof defpol / sizeof defpol[0];
    o.shared_pol = KVO_POLICY_LRU;
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
        printf("\n");
    }
    if (o.engines) {
        rc = rp_fleet_main(&o, &t);
        rp_trace_free(&t);
        return rc;
    }
    if (!o.json) {
        printf("  %-9s %10s %10s %14s %14s %12s\n", "policy", "blocks", "hit rate",
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
            cv[k].dashed = k >= o.npol;
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
