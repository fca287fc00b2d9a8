/* `kvoffload replay`: Belady's MIN against a brute-force optimum, the store's
 * LRU against a reference LRU written here, the Mooncake trace's figures
 * (shared/traces/README.md), the prefix policy's claims (docs/replay.md)
 * within the noise between neighbouring capacities, and the command's
 * errors and plot. */
#include <stdlib.h>

#include <jansson.h>

#include "replay_test_util.h"

/* Run replay --json and return the hits of (policy, capacity). */
typedef struct rows {
    char pol[64][16];
    uint64_t cap[64], hits[64], blocks[64];
    double rate[64];
    size_t n;
} rows;

static void replay(const char *path, const char *args, rows *out) {
    char cmd[2048], *text = NULL;
    snprintf(cmd, sizeof cmd, "'%s' replay --trace '%s' --json --quiet %s 2>&1", KVO_CLI_PATH, path, args);
    int rc = kvo_test_run(cmd, &text);
    if (rc) FAILF("replay exit %d: %s", rc, text);
    out->n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) FAILF("not JSON: %s", line);
        if (out->n == 64) FAILF("too many rows");
        snprintf(out->pol[out->n], 16, "%s", json_string_value(json_object_get(j, "policy")));
        out->cap[out->n] = (uint64_t)json_integer_value(json_object_get(j, "capacity_blocks"));
        out->hits[out->n] = (uint64_t)json_integer_value(json_object_get(j, "hits"));
        out->blocks[out->n] = (uint64_t)json_integer_value(json_object_get(j, "blocks"));
        out->rate[out->n] = json_real_value(json_object_get(j, "hit_rate"));
        out->n++;
        json_decref(j);
    }
    free(text);
}

static size_t row(const rows *r, const char *pol, uint64_t cap) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->pol[i], pol) && r->cap[i] == cap) return i;
    FAILF("no row for %s at %llu", pol, (unsigned long long)cap);
}

/* ---------------------------------------------------------------- MIN -- */

/* The best prefix hit count over every choice of what to keep: after each
 * request the cache holds the request's blocks plus any subset of what it
 * held, at most cap blocks.  Blocks are renumbered 0..nb-1 (nb <= 12). */
static uint64_t brute(const trace *t, size_t cap) {
    uint32_t map[256];
    size_t nb = 0;
    memset(map, 0xFF, sizeof map);
    uint32_t req[MAXREQ];
    for (size_t r = 0; r < t->n; r++) {
        req[r] = 0;
        for (size_t i = 0; i < t->len[r]; i++) {
            uint32_t id = t->id[r][i];
            if (map[id] == UINT32_MAX) map[id] = (uint32_t)nb++;
            req[r] |= 1u << map[id];
        }
    }
    if (nb > 12) FAILF("brute force: %zu blocks", nb);
    size_t ns = (size_t)1 << nb;
    int64_t *best = malloc(ns * sizeof *best), *nbest = malloc(ns * sizeof *nbest);
    for (size_t s = 0; s < ns; s++) best[s] = -1;
    best[0] = 0;
    for (size_t r = 0; r < t->n; r++) {
        for (size_t s = 0; s < ns; s++) nbest[s] = -1;
        for (size_t s = 0; s < ns; s++) {
            if (best[s] < 0) continue;
            int64_t h = 0;
            while ((size_t)h < t->len[r] && (s >> map[t->id[r][h]] & 1)) h++;
            uint32_t rest = (uint32_t)s & ~req[r];
            /* every subset of the rest */
            for (uint32_t sub = rest;; sub = (sub - 1) & rest) {
                uint32_t ns2 = sub | req[r];
                if ((size_t)__builtin_popcount(ns2) <= cap && best[s] + h > nbest[ns2]) nbest[ns2] = best[s] + h;
                if (!sub) break;
            }
        }
        int64_t *tmp = best; best = nbest; nbest = tmp;
    }
    int64_t m = 0;
    for (size_t s = 0; s < ns; s++) if (best[s] > m) m = best[s];
    free(best);
    free(nbest);
    return (uint64_t)m;
}

/* Replay t with `args` (4 capacities caps[]) and compare policy `pol`'s hits
 * with want(t, cap) at each. */
static void check_hits(const trace *t, const char *file, const char *args, const uint64_t caps[4], const char *pol,
                       uint64_t (*want)(const trace *, size_t), int iter) {
    rows r;
    replay(write_trace(t, file), args, &r);
    for (size_t c = 0; c < 4; c++) {
        uint64_t w = want(t, caps[c]), got = r.hits[row(&r, pol, caps[c])];
        if (got != w) FAILF("iteration %d, capacity %llu: %s %llu hits, expected %llu", iter,
                            (unsigned long long)caps[c], pol, (unsigned long long)got, (unsigned long long)w);
    }
}

KVO_TEST(min_equals_brute_force_optimum) {
    static const uint64_t caps[] = {4, 5, 6, 8};
    for (int iter = 0; iter < 40; iter++) {
        trace t;
        uint32_t next = 0;
        do { next = 0; gen(&t, 6 + kvo_test_rand() % 6, 4, &next); } while (next > 12);
        check_hits(&t, "min.jsonl", "--policy lru --capacity 4,5,6,8", caps, "min", brute, iter);
    }
}

/* ---------------------------------------------------------------- LRU -- */

/* The store's LRU, written independently: a request's present blocks are
 * used (in request order), then room is made by dropping the least recently
 * used blocks not in the request, then its new blocks join (in order). */
static uint64_t ref_lru(const trace *t, size_t cap) {
    uint32_t list[MAXREQ * MAXLEN]; /* list[0] = least recent */
    size_t n = 0;
    uint64_t hits = 0;
    for (size_t r = 0; r < t->n; r++) {
        size_t len = t->len[r];
        int present[MAXLEN];
        for (size_t i = 0; i < len; i++) {
            present[i] = 0;
            for (size_t k = 0; k < n; k++) present[i] |= list[k] == t->id[r][i];
        }
        size_t h = 0;
        while (h < len && present[h]) h++;
        hits += h;
        size_t nnew = 0;
        for (size_t i = 0; i < len; i++) nnew += !present[i];
        /* evict from the cold end, skipping the request's blocks */
        for (size_t k = 0; k < n && n + nnew > cap;) {
            int in = 0;
            for (size_t i = 0; i < len; i++) in |= list[k] == t->id[r][i];
            if (in) { k++; continue; }
            memmove(list + k, list + k + 1, (n - k - 1) * sizeof *list);
            n--;
        }
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < len; i++) {
                if (present[i] != !pass) continue;
                for (size_t k = 0; k < n; k++)
                    if (list[k] == t->id[r][i]) { memmove(list + k, list + k + 1, (n - k - 1) * sizeof *list); n--; break; }
                list[n++] = t->id[r][i];
            }
    }
    return hits;
}

KVO_TEST(lru_equals_reference_lru) {
    static const uint64_t caps[] = {8, 12, 20, 40};
    for (int iter = 0; iter < 20; iter++) {
        trace t;
        uint32_t next = 0;
        gen(&t, MAXREQ, MAXLEN, &next);
        check_hits(&t, "lru.jsonl", "--policy lru --no-min --capacity 8,12,20,40", caps, "lru", ref_lru, iter);
    }
}

/* ---------------------------------------------------- the Mooncake trace -- */

#define NEAR(v, ref, tol) do { double v_ = (v); if (v_ < (ref) - (tol) || v_ > (ref) + (tol)) \
    FAILF("%s = %.4f, expected %.4f +- %.4f", #v, v_, (double)(ref), (double)(tol)); } while (0)

/* Tolerances of the hit-rate tests below.  A heuristic's hit rate moves by
 * layout luck from one capacity to the next: between capacities 200 blocks
 * apart on Mooncake (a 211-point sweep, 1,000..43,000) the prefix policy's
 * gap to LRU, or to the best of LRU, ARC and S3-FIFO, changes by 0.07
 * points at the median, 0.5 at the 90th percentile and 1.1 at most; between
 * capacities 0.5 % of the blocks apart on the generated traces (20 seeds of
 * tools/replay_oracles.py --generate) by 0.15 / 0.66 / 0.93 on docs and
 * 0.03 / 0.30 / 1.14 on chat.  So the tests compare means over several
 * capacities, and ask a policy to stay within the 90th percentile of that
 * noise of what is claimed for it (docs/replay.md), never for exact hits at
 * one capacity.  A broken policy misses by far more (the negative controls
 * of the commit that set these tolerances): evicting the reused keys first
 * puts prefix 29 points below LRU around 10k blocks and 15-30 below on the
 * generated traces; protection without the fall back to LRU 1.5 below LRU
 * on chat (and test_store_policy.c's prefix tests fail). */
#define NEIGHBOUR_NOISE 0.6 /* points: the 90th percentile above, rounded up */

/* Capacities lo, lo + step, ..., hi as a --capacity list into args. */
static size_t cap_list(char *args, size_t len, uint64_t lo, uint64_t hi, uint64_t step, uint64_t *caps) {
    size_t n = 0, o = strlen(args);
    for (uint64_t c = lo; c <= hi; c += step, n++) {
        caps[n] = c;
        o += (size_t)snprintf(args + o, len - o, "%s%llu", n ? "," : "", (unsigned long long)c);
    }
    return n;
}

/* Mean over caps[0..n) of (pol's hits - the best of `others`' hits), in
 * points of the blocks; *worst gets the lowest single gap. */
static double mean_gap(const rows *r, const char *pol, const char *const *others, size_t nothers,
                       const uint64_t *caps, size_t n, double *worst) {
    double sum = 0;
    *worst = 1e9;
    for (size_t i = 0; i < n; i++) {
        uint64_t best = 0;
        for (size_t j = 0; j < nothers; j++) {
            uint64_t h = r->hits[row(r, others[j], caps[i])];
            if (h > best) best = h;
        }
        size_t p = row(r, pol, caps[i]);
        double gap = 100.0 * ((double)r->hits[p] - (double)best) / (double)r->blocks[p];
        if (getenv("KVO_TEST_VERBOSE")) printf("%llu: %s %.4f, gap %+.2f points\n", (unsigned long long)caps[i], pol,
                                               r->rate[p], gap);
        sum += gap;
        if (gap < *worst) *worst = gap;
    }
    return sum / (double)n;
}

static const char *const LRU[] = {"lru"};
static const char *const THREE[] = {"lru", "arc", "s3fifo"};

/* shared/traces/README.md: LRU 42.35 % at 10k blocks, infinite 64.0 %.  MIN
 * 0.6174 (the 0.6157 broke parent/child ties the wrong way: see
 * replay_min.c).  LRU, MIN and the infinite cache are exact algorithms:
 * their figures are checked to the last digit. */
KVO_TEST(mooncake_10k_lru_min_infinite) {
    rows r;
    replay(mooncake(), "--policy lru --capacity 10000", &r);
    NEAR(r.rate[row(&r, "lru", 10000)], 0.4235, 0.00005);
    NEAR(r.rate[row(&r, "min", 10000)], 0.6174, 0.00005);
    NEAR(r.rate[row(&r, "infinite", 10000)], 0.6396, 0.00005);
    ASSERT_EQ_U64(r.blocks[row(&r, "lru", 10000)], 121877);
}

/* The prefix policy around 10k blocks (9,000..11,000, five capacities):
 * 1.87 points above LRU on average (1.44 at the least), never above MIN;
 * asked: 1.87 - 2 x NEIGHBOUR_NOISE on average.  The same with vLLM's
 * manager (--ignore-present: LRU 0.4239 at 10k, the figure
 * tests/test_store_trace.c measures through the store directly): 2.0
 * points on average. */
static void mooncake_prefix_around_10k(const char *extra, double lead) {
    char args[512];
    uint64_t caps[8];
    snprintf(args, sizeof args, "--policy lru,prefix %s --capacity ", extra);
    size_t n = cap_list(args, sizeof args, 9000, 11000, 500, caps);
    rows r;
    replay(mooncake(), args, &r);
    double worst, mean = mean_gap(&r, "prefix", LRU, 1, caps, n, &worst);
    if (mean < lead - 2 * NEIGHBOUR_NOISE)
        FAILF("prefix %+.2f points from LRU on average at 9k-11k blocks (%+.2f asked)", mean,
              lead - 2 * NEIGHBOUR_NOISE);
    for (size_t i = 0; i < n && !strstr(extra, "--no-min"); i++)
        ASSERT_TRUE(r.hits[row(&r, "prefix", caps[i])] <= r.hits[row(&r, "min", caps[i])]);
}

KVO_TEST(mooncake_prefix_leads_lru_around_10k) { mooncake_prefix_around_10k("", 1.87); }

KVO_TEST(mooncake_10k_ignore_present_is_vllms_lru) {
    rows r;
    replay(mooncake(), "--policy lru --capacity 10000 --no-min --ignore-present", &r);
    NEAR(r.rate[row(&r, "lru", 10000)], 0.4239, 0.00005);
    mooncake_prefix_around_10k("--no-min --ignore-present", 2.0);
}

/* The bound against LRU: over a 15-point sweep (1,000..43,000) the prefix
 * policy is never more than NEIGHBOUR_NOISE below LRU (measured: at or above
 * it everywhere on a 211-point sweep), and MIN never hits more than the
 * infinite cache. */
KVO_TEST(mooncake_sweep_prefix_never_below_lru) {
    rows r;
    replay(mooncake(), "--policy lru,prefix --capacity 1000:43000:15", &r);
    for (uint64_t c = 1000; c <= 43000; c += 3000) {
        size_t l = row(&r, "lru", c), p = row(&r, "prefix", c), m = row(&r, "min", c);
        double gap = 100.0 * ((double)r.hits[p] - (double)r.hits[l]) / (double)r.blocks[p];
        if (gap < -NEIGHBOUR_NOISE || r.hits[p] > r.hits[m] || r.hits[m] > r.hits[row(&r, "infinite", c)])
            FAILF("capacity %llu: lru %.4f prefix %.4f min %.4f", (unsigned long long)c, r.rate[l], r.rate[p],
                  r.rate[m]);
    }
}

/* ------------------------------------------------ two other workloads -- */

/* Replay policies `pols` (no MIN) at caps[i] = frac[i] x distinct, i < n. */
static void replay_fractions(const char *path, uint64_t distinct, const char *pols, const double *frac, size_t n,
                             uint64_t *caps, rows *r) {
    char args[512];
    int o = snprintf(args, sizeof args, "--no-min --policy %s --capacity ", pols);
    for (size_t i = 0; i < n; i++) {
        caps[i] = (uint64_t)(frac[i] * (double)distinct);
        o += snprintf(args + o, sizeof args - (size_t)o, "%s%llu", i ? "," : "", (unsigned long long)caps[i]);
    }
    replay(path, args, r);
}

/* The generated workloads (replay_test_util.h; a new trace at each test
 * seed) at 2 % to 50 % of the distinct blocks: the prefix policy is never
 * more than NEIGHBOUR_NOISE below LRU at a capacity (20 seeds of each: 0.02
 * points below at worst), and on docs at 2 % it leads LRU by protection
 * (10.6 points at the least over those seeds; 3 asked). */
static void workload_vs_lru(bool chat) {
    uint64_t distinct;
    const char *path = write_workload(chat ? "chat.jsonl" : "docs.jsonl", chat, false, &distinct);
    static const double frac[] = {0.02, 0.05, 0.1, 0.2, 0.3, 0.5};
    uint64_t caps[6];
    rows r;
    replay_fractions(path, distinct, "lru,prefix", frac, 6, caps, &r);
    for (int i = 0; i < 6; i++) {
        double worst, gap = mean_gap(&r, "prefix", LRU, 1, &caps[i], 1, &worst);
        if (gap < -NEIGHBOUR_NOISE)
            FAILF("%s at %llu blocks: prefix %+.2f points from LRU", chat ? "chat" : "docs",
                  (unsigned long long)caps[i], gap);
        if (!chat && i == 0 && gap < 3)
            FAILF("docs at %llu blocks: prefix only %+.2f points from LRU: protection should win",
                  (unsigned long long)caps[i], gap);
    }
}

KVO_TEST(chat_workload_prefix_never_below_lru) { workload_vs_lru(true); }
KVO_TEST(docs_workload_prefix_beats_lru) { workload_vs_lru(false); }

/* -------------------------------------- against the best of the three -- */

/* Mooncake at 14,000-23,000 blocks, where protection leads LRU by less and
 * S3-FIFO and ARC lead the prefix policy (docs/replay.md): 0.40 points below
 * the best of the three on average over the 211-point sweep's capacities
 * there, 1.01 at worst.  Asked, over 16,000..22,000 (seven capacities): the
 * mean within 0.40 + NEIGHBOUR_NOISE.  A prefix policy that protected
 * nothing or the wrong keys would be LRU or worse: 2-4 points below. */
KVO_TEST(mooncake_prefix_near_best_of_three_above_14k) {
    char args[512] = "--no-min --policy lru,arc,s3fifo,prefix --capacity ";
    uint64_t caps[8];
    size_t n = cap_list(args, sizeof args, 16000, 22000, 1000, caps);
    rows r;
    replay(mooncake(), args, &r);
    double worst, mean = mean_gap(&r, "prefix", THREE, 3, caps, n, &worst);
    if (mean < -(0.40 + NEIGHBOUR_NOISE))
        FAILF("prefix %+.2f points from the best of three on average (worst %+.2f)", mean, worst);
}

/* Documents (Zipf popularity among one-off questions) at 5, 10, 20 and 30 %
 * of the blocks: frequency decides there, which the prefix policy's two
 * recency lists do not see; over 20 seeds its mean gap to the best of the
 * three (S3-FIFO or ARC) is -1.08..-0.14 points.  Asked: the mean within
 * 1.08 + NEIGHBOUR_NOISE / 2 (the noise of a mean of four capacities). */
KVO_TEST(docs_prefix_near_best_of_three) {
    uint64_t distinct;
    const char *path = write_workload("docs3.jsonl", false, false, &distinct);
    static const double frac[] = {0.05, 0.1, 0.2, 0.3};
    uint64_t caps[4];
    rows r;
    replay_fractions(path, distinct, "lru,arc,s3fifo,prefix", frac, 4, caps, &r);
    double worst, mean = mean_gap(&r, "prefix", THREE, 3, caps, 4, &worst);
    if (mean < -(1.08 + NEIGHBOUR_NOISE / 2))
        FAILF("prefix %+.2f points from the best of three on average (worst %+.2f)", mean, worst);
}

/* ------------------------------------------------------ command errors -- */

/* `replay --trace path extra` fails with exit status rc and says `what`. */
static void expect_fail(const char *path, const char *extra, int rc, const char *what) {
    char args[1024], *out = NULL;
    snprintf(args, sizeof args, "--trace '%s' %s", path, extra);
    ASSERT_EQ_INT(run_cli(args, &out), rc);
    ASSERT_CONTAINS(out, what);
    free(out);
}

KVO_TEST(cli_errors_bytes_and_plot) {
    trace t;
    uint32_t next = 0;
    gen(&t, 20, 6, &next);
    const char *path = write_trace(&t, "cli.jsonl");
    char args[1024], *out = NULL;
    expect_fail(path, "--capacity 1GiB", 2, "--model");
    expect_fail(path, "--capacity 10:5:3", 2, "FROM:TO:COUNT");
    expect_fail(path, "--capacity 10 --policy lru,fifo", 2, "fifo");
    /* bytes with a model: capacity_bytes and bytes_loaded in the JSON */
    snprintf(args, sizeof args, "--trace '%s' --model %s --capacity 1GiB --policy lru --json --quiet", path,
             kvo_model_preset_name(0));
    ASSERT_EQ_INT(run_cli(args, &out), 0);
    ASSERT_CONTAINS(out, "\"capacity_bytes\"");
    ASSERT_CONTAINS(out, "\"bytes_loaded\"");
    free(out);
    /* a broken line names the file and line */
    char bad[512];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", kvo_test_tmpdir());
    FILE *f = fopen(bad, "w");
    fprintf(f, "{\"hash_ids\": [1, 2]}\n{\"hash_ids\": [1, \"x\"]}\n");
    fclose(f);
    expect_fail(bad, "--capacity 10", 2, "bad.jsonl:2");
    /* --plot: a PNG, or (a build without cairo) a clear error */
    char png[512];
    snprintf(png, sizeof png, "%s/hit.png", kvo_test_tmpdir());
    /* fontconfig (under cairo's text) keeps its caches for the life of the
     * process by design: not a leak of ours, so LeakSanitizer is off here */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" '%s' replay "
             "--trace '%s' --capacity 5:30:4 --quiet --plot '%s' 2>&1", KVO_CLI_PATH, path, png);
    int rc = kvo_test_run(cmd, &out);
    if (rc == 0) {
        size_t len = 0;
        char *img = kvo_test_read_file(png, &len);
        ASSERT_NOT_NULL(img);
        ASSERT_GT_U64(len, 1000);
        ASSERT_MEM_EQ(img, "\x89PNG\r\n\x1a\n", 8);
        free(img);
    } else {
        ASSERT_EQ_INT(rc, 1);
        ASSERT_CONTAINS(out, "without cairo");
    }
    free(out);
}
