/* Traces for the tests of `kvoffload replay` (tests/test_replay*.c): random
 * prefix trees, the generated chat and document workloads, the Mooncake
 * trace, and running the command. */
#ifndef KVO_REPLAY_TEST_UTIL_H
#define KVO_REPLAY_TEST_UTIL_H

#include <math.h>
#include <stdlib.h>

#include "kvo_test.h"

#define MAXREQ 64
#define MAXLEN 8

typedef struct trace {
    uint32_t id[MAXREQ][MAXLEN];
    size_t len[MAXREQ], n;
} trace;

/* Requests that follow a prefix tree: each extends a random earlier request's
 * prefix with fresh blocks (ids chained as in the Mooncake trace). */
static inline void gen(trace *t, size_t nreq, size_t maxlen, uint32_t *next_id) {
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

static inline const char *write_trace(const trace *t, const char *name) {
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

/* Written as a trace file, seeded by the test seed:
 * chat: conversations arrive ~every 0.7 time units; each has 1 + Exp(3)
 *   turns, 90 units apart on average, each turn the previous prompt plus 1-4
 *   new blocks, after one of 8 shared 4-block system prompts.  Reuse is
 *   recent: LRU is hard to beat and protecting reused blocks hurts.
 * docs: 1500 documents of 8-60 blocks, picked with Zipf(0.9) popularity,
 *   each request adding a 1-3-block question.  Popular documents among
 *   one-off ones: protection wins.
 * With sessions, chat lines carry their conversation as "session_id".
 * *distinct gets the number of distinct blocks. */
static inline double rnd01(void) { return (double)(kvo_test_rand() >> 11) / 9007199254740992.0; }
static inline double rexp(double mean) { return -mean * log(1.0 - rnd01()); }

static inline const char *write_workload(const char *name, bool chat, bool sessions, uint64_t *distinct) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", kvo_test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f) FAILF("cannot write %s", path);
    enum { NCONV = 1500, NDOC = 1500, NREQ = 4000, MAXB = 160 };
    uint32_t next = 0;
    static uint32_t ids[NCONV > NDOC ? NCONV : NDOC][MAXB];
    static size_t len[NCONV > NDOC ? NCONV : NDOC];
    static double when[NCONV];
    static int left[NCONV];
    if (chat) {
        uint32_t sys[8][4];
        for (int p = 0; p < 8; p++) for (int b = 0; b < 4; b++) sys[p][b] = next++;
        double t = 0;
        for (int c = 0; c < NCONV; c++) {
            t += rexp(0.7);
            when[c] = t;
            left[c] = 1 + (int)rexp(3.0);
            if (left[c] > 30) left[c] = 30;
            memcpy(ids[c], sys[kvo_test_rand() % 8], sizeof sys[0]);
            len[c] = 4;
        }
        for (;;) { /* the conversation whose turn comes first */
            int c = -1;
            for (int k = 0; k < NCONV; k++)
                if (left[k] > 0 && (c < 0 || when[k] < when[c])) c = k;
            if (c < 0) break;
            size_t add = 1 + kvo_test_rand() % 4;
            for (size_t b = 0; b < add && len[c] < MAXB; b++) ids[c][len[c]++] = next++;
            if (sessions) fprintf(f, "{\"session_id\": %d, ", c);
            else fprintf(f, "{");
            fprintf(f, "\"hash_ids\": [");
            for (size_t b = 0; b < len[c]; b++) fprintf(f, "%s%u", b ? ", " : "", ids[c][b]);
            fprintf(f, "]}\n");
            left[c]--;
            when[c] += rexp(90.0);
        }
    } else {
        static double cdf[NDOC];
        double sum = 0;
        for (int d = 0; d < NDOC; d++) {
            len[d] = 8 + kvo_test_rand() % 53;
            for (size_t b = 0; b < len[d]; b++) ids[d][b] = next++;
            sum += 1.0 / pow(d + 1, 0.9);
            cdf[d] = sum;
        }
        for (int r = 0; r < NREQ; r++) {
            double u = rnd01() * sum;
            int d = 0;
            while (d < NDOC - 1 && cdf[d] < u) d++;
            fprintf(f, "{\"hash_ids\": [");
            for (size_t b = 0; b < len[d]; b++) fprintf(f, "%u, ", ids[d][b]);
            size_t q = 1 + kvo_test_rand() % 3;
            for (size_t b = 0; b < q; b++) fprintf(f, "%s%u", b ? ", " : "", next++);
            fprintf(f, "]}\n");
        }
    }
    fclose(f);
    *distinct = next;
    return path;
}

static inline const char *mooncake(void) {
    const char *path = kvo_test_shared_path("traces/mooncake_synthetic_trace.jsonl");
    FILE *f = fopen(path, "r");
    if (!f) SKIP("trace not readable: %s", path);
    fclose(f);
    return path;
}

static inline int run_cli(const char *args, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' replay %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

#endif
