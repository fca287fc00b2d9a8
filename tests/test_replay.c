/* `kvoffload replay`: Belady's MIN against a brute-force optimum, the store's
 * LRU against a reference LRU written here, the Mooncake trace's figures
 * (shared/traces/README.md), the prefix policy's goals (docs/replay.md), and
 * the command's errors and plot. */
#include <stdlib.h>

#include <jansson.h>

#include "kvo_test.h"

#define MAXREQ 64
#define MAXLEN 8

typedef struct trace {
    uint32_t id[MAXREQ][MAXLEN];
    size_t len[MAXREQ], n;
} trace;

/* Requests that follow a prefix tree: each extends a random earlier request's
 * prefix with fresh blocks (ids chained as in the Mooncake trace). */
static void gen(trace *t, size_t nreq, size_t maxlen, uint32_t *next_id) {
    t->n = nreq;
    for (size_t r = 0; r < nreq; r++) {
        size_t keep = 0;
        if (r && kvo_test_rand() % 4) {
            size_t from = kvo_test_rand() % r;
            keep = kvo_test_rand() % (t->len[from] + 1);
            for (size_t i = 0; i < keep; i++) t->id[r][i] = t->id[from][i];
        }
        size_t len = keep + kvo_test_rand() % (maxlen - keep + 1);
        if (len == 0) len = 1;
        for (size_t i = keep; i < len; i++) t->id[r][i] = (*next_id)++;
        t->len[r] = len;
    }
}

static const char *write_trace(const trace *t, const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", kvo_test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f) FAILF("cannot write %s", path);
    for (size_t r = 0; r < t->n; r++) {
        fprintf(f, "{\"timestamp\": %zu, \"input_length\": %zu, \"hash_ids\": [", r, t->len[r] * 512);
        for (size_t i = 0; i < t->len[r]; i++) fprintf(f, "%s%u", i ? ", " : "", t->id[r][i]);
        fprintf(f, "]}\n");
    }
    fclose(f);
    return path;
}

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

KVO_TEST(min_equals_brute_force_optimum) {
    for (int iter = 0; iter < 40; iter++) {
        trace t;
        uint32_t next = 0;
        do { next = 0; gen(&t, 6 + kvo_test_rand() % 6, 4, &next); } while (next > 12);
        rows r;
        replay(write_trace(&t, "min.jsonl"), "--policy lru --capacity 4,5,6,8", &r);
        static const uint64_t caps[] = {4, 5, 6, 8};
        for (size_t c = 0; c < 4; c++) {
            uint64_t want = brute(&t, caps[c]), got = r.hits[row(&r, "min", caps[c])];
            if (got != want) FAILF("iteration %d, capacity %llu: MIN %llu hits, optimum %llu", iter,
                                   (unsigned long long)caps[c], (unsigned long long)got, (unsigned long long)want);
            ASSERT_LE_U64(r.hits[row(&r, "lru", caps[c])], want);
        }
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
    for (int iter = 0; iter < 20; iter++) {
        trace t;
        uint32_t next = 0;
        gen(&t, MAXREQ, MAXLEN, &next);
        rows r;
        replay(write_trace(&t, "lru.jsonl"), "--policy lru --no-min --capacity 8,12,20,40", &r);
        static const uint64_t caps[] = {8, 12, 20, 40};
        for (size_t c = 0; c < 4; c++) {
            uint64_t want = ref_lru(&t, caps[c]), got = r.hits[row(&r, "lru", caps[c])];
            if (got != want) FAILF("iteration %d, capacity %llu: store LRU %llu hits, reference %llu", iter,
                                   (unsigned long long)caps[c], (unsigned long long)got, (unsigned long long)want);
        }
    }
}
