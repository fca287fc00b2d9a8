/* `kvoffload replay`: Belady's MIN against a brute-force optimum, the store's
 * LRU against a reference LRU written here, the Mooncake trace's figures
 * (shared/traces/README.md), the prefix policy's goals (docs/replay.md), and
 * the command's errors and plot. */
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

/* shared/traces/README.md: LRU 42.35 % at 10k blocks, infinite 64.0 %.  MIN
 * 0.6174 (the 0.6157 broke parent/child ties the wrong way: see
 * replay_min.c); the prefix policy beats LRU by two points (0.4471,
 * docs/replay.md). */
KVO_TEST(mooncake_10k_lru_min_infinite_prefix) {
    rows r;
    replay(mooncake(), "--policy lru,prefix --capacity 10000", &r);
    NEAR(r.rate[row(&r, "lru", 10000)], 0.4235, 0.00005);
    NEAR(r.rate[row(&r, "min", 10000)], 0.6174, 0.00005);
    NEAR(r.rate[row(&r, "infinite", 10000)], 0.6396, 0.00005);
    ASSERT_EQ_U64(r.blocks[row(&r, "lru", 10000)], 121877);
    double pre = r.rate[row(&r, "prefix", 10000)];
    if (getenv("KVO_TEST_VERBOSE")) printf("prefix at 10k: %.4f\n", pre);
    ASSERT_TRUE(pre >= r.rate[row(&r, "lru", 10000)] + 0.015);
    ASSERT_TRUE(pre <= r.rate[row(&r, "min", 10000)]);
}

/* vLLM's manager (--ignore-present: hits touched, present blocks left alone
 * by a store): LRU 0.4239 at 10k blocks, the figure issue 17 quotes and
 * tests/test_store_trace.c measures through the store directly; prefix keeps
 * its lead. */
KVO_TEST(mooncake_10k_ignore_present_is_vllms_lru) {
    rows r;
    replay(mooncake(), "--policy lru,prefix --capacity 10000 --no-min --ignore-present", &r);
    NEAR(r.rate[row(&r, "lru", 10000)], 0.4239, 0.00005);
    ASSERT_TRUE(r.rate[row(&r, "prefix", 10000)] >= r.rate[row(&r, "lru", 10000)] + 0.015);
}

/* Over a 15-point sweep the prefix policy never hits less than LRU, never
 * more than MIN, and MIN never more than the infinite cache. */
KVO_TEST(mooncake_sweep_prefix_never_below_lru) {
    rows r;
    replay(mooncake(), "--policy lru,prefix --capacity 1000:43000:15", &r);
    for (uint64_t c = 1000; c <= 43000; c += 3000) {
        size_t l = row(&r, "lru", c), p = row(&r, "prefix", c), m = row(&r, "min", c);
        if (r.hits[p] < r.hits[l] || r.hits[p] > r.hits[m] || r.hits[m] > r.hits[row(&r, "infinite", c)])
            FAILF("capacity %llu: lru %.4f prefix %.4f min %.4f", (unsigned long long)c, r.rate[l], r.rate[p],
                  r.rate[m]);
    }
}

/* ------------------------------------------------ two other workloads -- */

/* On both, at 2 % to 50 % of the distinct blocks, the prefix policy never
 * hits less than LRU (checked over 40 seeds for chat, 10 for docs:
 * docs/replay.md), and on docs it wins by 3 points or more at 2 %. */
static void workload_vs_lru(bool chat, const char *pol) {
    uint64_t distinct;
    const char *path = write_workload(chat ? "chat.jsonl" : "docs.jsonl", chat, false, &distinct);
    static const double frac[] = {0.02, 0.05, 0.1, 0.2, 0.3, 0.5};
    uint64_t caps[6];
    char args[512];
    int o = snprintf(args, sizeof args, "--no-min --policy lru,%s --capacity ", pol);
    for (int i = 0; i < 6; i++) {
        caps[i] = (uint64_t)(frac[i] * (double)distinct);
        o += snprintf(args + o, sizeof args - (size_t)o, "%s%llu", i ? "," : "", (unsigned long long)caps[i]);
    }
    rows r;
    replay(path, args, &r);
    for (int i = 0; i < 6; i++) {
        size_t l = row(&r, "lru", caps[i]), p = row(&r, pol, caps[i]);
        double lru = r.rate[l], pre = r.rate[p];
        if (getenv("KVO_TEST_VERBOSE")) printf("%s %llu: lru %.4f %s %.4f\n", chat ? "chat" : "docs",
                                               (unsigned long long)caps[i], lru, pol, pre);
        if (r.hits[p] < r.hits[l])
            FAILF("capacity %llu: lru %.4f %s %.4f", (unsigned long long)caps[i], lru, pol, pre);
        if (!chat && i == 0 && pre < lru + 0.03)
            FAILF("docs at %llu: %s %.4f, LRU %.4f: protection should win", (unsigned long long)caps[i], pol, pre,
                  lru);
    }
}

KVO_TEST(chat_workload_prefix_never_below_lru) { workload_vs_lru(true, "prefix"); }
KVO_TEST(docs_workload_prefix_beats_lru) { workload_vs_lru(false, "prefix"); }

/* -------------------------------------- against the best of the three -- */

/* Policy `pol` against the best of LRU, ARC and S3-FIFO at each of
 * caps[0..n), counted in hits: fails when it is more than `points` below
 * (docs/replay.md, "Against the best of LRU, ARC and S3-FIFO"); a negative
 * `points` asks it to lead by at least that much. */
static void near_best_of_three(const char *path, const char *pol, const uint64_t *caps, size_t n, double points) {
    char args[512];
    int o = snprintf(args, sizeof args, "--no-min --policy lru,arc,s3fifo,%s --capacity ", pol);
    for (size_t i = 0; i < n; i++)
        o += snprintf(args + o, sizeof args - (size_t)o, "%s%llu", i ? "," : "", (unsigned long long)caps[i]);
    rows r;
    replay(path, args, &r);
    for (size_t i = 0; i < n; i++) {
        uint64_t best = 0;
        const char *bp = "";
        static const char *const three[] = {"lru", "arc", "s3fifo"};
        for (int j = 0; j < 3; j++) {
            size_t k = row(&r, three[j], caps[i]);
            if (r.hits[k] > best) best = r.hits[k], bp = three[j];
        }
        size_t p = row(&r, pol, caps[i]);
        double gap = 100.0 * ((double)r.hits[p] - (double)best) / (double)r.blocks[p];
        if (getenv("KVO_TEST_VERBOSE")) printf("%llu: %s %.4f, best %s, gap %+.2f points\n",
                                               (unsigned long long)caps[i], pol, r.rate[p], bp, gap);
        if (gap < -points)
            FAILF("capacity %llu: %s %.4f is %+.2f points from %s (%+.2f asked)", (unsigned long long)caps[i], pol,
                  r.rate[p], gap, bp, -points);
    }
}


/* Mooncake above ~14k blocks, where protection leads LRU by only 2-5 %: the
 * former fixed 5 % margin stayed with LRU there (1.4-2.1 points below
 * S3-FIFO at these capacities); the guarded 1 % margin follows protection
 * (0.5-0.7 below; 0.2-0.6 with leaf-first order). */
KVO_TEST(mooncake_prefix_near_best_of_three_above_14k) {
    static const uint64_t caps[] = {16400, 19400, 22400};
    near_best_of_three(mooncake(), "prefix", caps, 3, 1.0);
}

/* Documents (Zipf popularity among one-off questions): the short ghost
 * window (W = 1) closes most of the gap to S3-FIFO (before: 1.9-3.6 points
 * below it at these capacities; then 0.3-1.2; with leaf-first order and no
 * hysteresis between settings +0.1..-0.7, and at most 1.3 below over ten
 * seeds). */
/* Policy `pol` on the docs workload (file `name`) at 5-30 % of its blocks. */
static void docs_near_best_of_three(const char *name, const char *pol, double points) {
    uint64_t distinct;
    const char *path = write_workload(name, false, false, &distinct);
    static const double frac[] = {0.05, 0.1, 0.2, 0.3};
    uint64_t caps[4];
    for (int i = 0; i < 4; i++) caps[i] = (uint64_t)(frac[i] * (double)distinct);
    near_best_of_three(path, pol, caps, 4, points);
}

KVO_TEST(docs_prefix_near_best_of_three) { docs_near_best_of_three("docs3.jsonl", "prefix", 1.5); }

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
