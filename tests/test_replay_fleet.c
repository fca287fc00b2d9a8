/* `kvoffload replay --engines N`: a fleet of one engine is the single-cache
 * replay; the counts add up; a shared tier never costs a hit and, holding
 * every block, gives the infinite cache; routing keeps sessions and prefixes
 * together (docs/replay.md, "Fleets"). */
#include <jansson.h>

#include "replay_test_util.h"

#define MAXROWS 96
#define MAXENG 8

typedef struct frow {
    char routing[16];
    uint64_t shared_cap, requests, blocks, hits, local, shared, writes, hits0;
    size_t ne;
    uint64_t e_req[MAXENG], e_blocks[MAXENG], e_hits[MAXENG], e_local[MAXENG];
} frow;

typedef struct frows {
    frow r[MAXROWS];
    size_t n;
} frows;

static uint64_t u64(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    if (!json_is_integer(v)) FAILF("no integer \"%s\"", k);
    return (uint64_t)json_integer_value(v);
}

/* Run replay --json on path with args (fleet mode) and parse every line. */
static void fleet(const char *path, const char *args, frows *out) {
    char cmd[2048], *text = NULL;
    snprintf(cmd, sizeof cmd, "'%s' replay --trace '%s' --json --quiet %s 2>&1", KVO_CLI_PATH, path, args);
    int rc = kvo_test_run(cmd, &text);
    if (rc) FAILF("replay exit %d: %s", rc, text);
    out->n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) FAILF("not JSON: %s", line);
        if (out->n == MAXROWS) FAILF("too many rows");
        frow *f = &out->r[out->n++];
        memset(f, 0, sizeof *f);
        snprintf(f->routing, sizeof f->routing, "%s", json_string_value(json_object_get(j, "routing")));
        f->shared_cap = u64(j, "shared_capacity_blocks");
        f->requests = u64(j, "requests");
        f->blocks = u64(j, "blocks");
        f->hits = u64(j, "hits");
        f->local = u64(j, "local_hits");
        f->shared = u64(j, "shared_hits");
        f->writes = u64(j, "shared_writes");
        f->hits0 = u64(j, "hits_no_shared");
        json_t *pe = json_object_get(j, "per_engine");
        f->ne = json_array_size(pe);
        if (f->ne > MAXENG) FAILF("%zu engines", f->ne);
        for (size_t e = 0; e < f->ne; e++) {
            json_t *o = json_array_get(pe, e);
            f->e_req[e] = u64(o, "requests");
            f->e_blocks[e] = u64(o, "blocks");
            f->e_hits[e] = u64(o, "hits");
            f->e_local[e] = u64(o, "local_hits");
            if (u64(o, "shared_hits") + f->e_local[e] != f->e_hits[e]) FAILF("engine %zu: hits != local + shared", e);
        }
        json_decref(j);
    }
    free(text);
}

static const frow *frow_at(const frows *r, const char *routing, uint64_t shared) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->r[i].routing, routing) && r->r[i].shared_cap == shared) return &r->r[i];
    FAILF("no row for %s with %llu shared blocks", routing, (unsigned long long)shared);
}

/* Hits of `replay --policy pol --capacity cap extra` (the single cache) and
 * of the infinite cache. */
static void single(const char *path, const char *pol, uint64_t cap, const char *extra, uint64_t *hits, uint64_t *inf) {
    char args[512], *text = NULL;
    snprintf(args, sizeof args, "--trace '%s' --json --quiet --no-min --policy %s --capacity %llu %s", path, pol,
             (unsigned long long)cap, extra);
    ASSERT_EQ_INT(run_cli(args, &text), 0);
    *hits = *inf = UINT64_MAX;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) FAILF("not JSON: %s", line);
        const char *p = json_string_value(json_object_get(j, "policy"));
        if (!strcmp(p, pol)) *hits = u64(j, "hits");
        if (!strcmp(p, "infinite")) *inf = u64(j, "hits");
        json_decref(j);
    }
    free(text);
    if (*hits == UINT64_MAX || *inf == UINT64_MAX) FAILF("no rows for %s", pol);
}

/* Counts on every row: engines' requests and blocks add up to the trace's,
 * hits = local + shared, nothing above the infinite cache; the shared tier
 * never costs an engine a hit and never changes the host tiers. */
static void check_counts(const frows *r, size_t engines, uint64_t nreq, uint64_t nblocks, uint64_t inf) {
    for (size_t i = 0; i < r->n; i++) {
        const frow *f = &r->r[i], *none = frow_at(r, f->routing, 0);
        uint64_t req = 0, blocks = 0, hits = 0;
        ASSERT_EQ_U64(f->ne, engines);
        for (size_t e = 0; e < f->ne; e++) {
            req += f->e_req[e], blocks += f->e_blocks[e], hits += f->e_hits[e];
            ASSERT_EQ_U64(f->e_local[e], none->e_local[e]);
            if (f->e_hits[e] < none->e_hits[e])
                FAILF("%s, %llu shared: engine %zu hits %llu < %llu without the shared tier", f->routing,
                      (unsigned long long)f->shared_cap, e, (unsigned long long)f->e_hits[e],
                      (unsigned long long)none->e_hits[e]);
        }
        ASSERT_EQ_U64(req, nreq);
        ASSERT_EQ_U64(blocks, nblocks);
        ASSERT_EQ_U64(f->blocks, nblocks);
        ASSERT_EQ_U64(hits, f->hits);
        ASSERT_EQ_U64(f->local + f->shared, f->hits);
        ASSERT_EQ_U64(f->hits0, none->hits);
        ASSERT_TRUE(f->hits <= inf);
        if (!f->shared_cap) ASSERT_EQ_U64(f->shared + f->writes, 0);
        else ASSERT_TRUE(f->writes > 0);
    }
}

/* One engine without a shared tier is the single-cache replay, for every
 * routing and policy; with a shared tier that holds every block, every
 * routing of four engines hits as often as the infinite cache. */
KVO_TEST(one_engine_is_the_single_replay_and_a_full_shared_tier_the_infinite_cache) {
    for (int iter = 0; iter < 6; iter++) {
        trace t;
        uint32_t next = 0;
        gen(&t, MAXREQ, MAXLEN, &next);
        uint64_t nblocks = 0;
        for (size_t r = 0; r < t.n; r++) nblocks += t.len[r];
        const char *path = write_trace(&t, "fleet.jsonl");
        static const char *const pols[] = {"lru", "arc", "s3fifo", "prefix"};
        for (int k = 0; k < 5; k++) {
            /* the fifth: vLLM's manager (--ignore-present) on the prefix policy */
            const char *pol = pols[k < 4 ? k : 3], *extra = k < 4 ? "" : "--ignore-present";
            uint64_t cap = 6 + kvo_test_rand() % 30, want, inf;
            single(path, pol, cap, extra, &want, &inf);
            char args[256];
            snprintf(args, sizeof args, "--engines 1 --policy %s --capacity %llu %s", pol, (unsigned long long)cap,
                     extra);
            frows r;
            fleet(path, args, &r);
            ASSERT_EQ_U64(r.n, 3);
            for (size_t i = 0; i < r.n; i++) ASSERT_EQ_U64(r.r[i].hits, want);
            check_counts(&r, 1, t.n, nblocks, inf);
            snprintf(args, sizeof args, "--engines 4 --policy %s --capacity %llu --shared-capacity 3,%u %s", pol,
                     (unsigned long long)cap / 4 + 1, next, extra);
            fleet(path, args, &r);
            ASSERT_EQ_U64(r.n, 9);
            check_counts(&r, 4, t.n, nblocks, inf);
            for (size_t i = 0; i < r.n; i++)
                if (r.r[i].shared_cap == next && r.r[i].hits != inf)
                    FAILF("iteration %d, %s %s, %s: %llu hits with a shared tier of every block, infinite cache %llu",
                          iter, pol, extra, r.r[i].routing, (unsigned long long)r.r[i].hits, (unsigned long long)inf);
        }
    }
}

/* Conversations: routing by session (given or inferred) keeps a
 * conversation's turns on one engine and beats round-robin, which spreads
 * them; shared tiers of growing size add hits to every routing. */
static void chat(bool sessions) {
    uint64_t distinct;
    const char *path = write_workload("fleet-chat.jsonl", true, sessions, &distinct);
    char args[256];
    uint64_t per = distinct / 40 + 1;
    snprintf(args, sizeof args, "--engines 4 --capacity %llu --shared-capacity %llu,%llu,%llu",
             (unsigned long long)per, (unsigned long long)per, (unsigned long long)(4 * per),
             (unsigned long long)(16 * per));
    frows r;
    fleet(path, args, &r);
    ASSERT_EQ_U64(r.n, 12);
    const frow *rr = frow_at(&r, "round-robin", 0), *ss = frow_at(&r, "session", 0);
    for (size_t i = 0; getenv("KVO_TEST_VERBOSE") && i < r.n; i++)
        printf("chat%s, 4 x %llu: %s, %llu shared: %.4f\n", sessions ? " (session ids)" : "", (unsigned long long)per,
               r.r[i].routing, (unsigned long long)r.r[i].shared_cap, (double)r.r[i].hits / (double)r.r[i].blocks);
    if (ss->hits < rr->hits + rr->blocks / 20)
        FAILF("session routing %llu hits, round-robin %llu of %llu blocks: sessions should stay together",
              (unsigned long long)ss->hits, (unsigned long long)rr->hits, (unsigned long long)rr->blocks);
    uint64_t inf, lru;
    single(path, "lru", per, "", &lru, &inf);
    check_counts(&r, 4, r.r[0].requests, r.r[0].blocks, inf);
    for (int q = 0; q < 3; q++) {
        const char *name = q == 0 ? "round-robin" : q == 1 ? "session" : "prefix-hash";
        /* larger than a host tier (one as large holds what the host tiers hold) */
        for (uint64_t m = 4; m <= 16; m *= 4) ASSERT_TRUE(frow_at(&r, name, m * per)->hits > frow_at(&r, name, 0)->hits);
    }
}

KVO_TEST(chat_session_routing_beats_round_robin) { chat(false); }
KVO_TEST(chat_session_ids_route_conversations) { chat(true); }

/* A trace whose requests all share their first block (prefix-hash) or one
 * session_id (session): every request lands on one engine. */
KVO_TEST(routing_keeps_prefixes_and_sessions_on_one_engine) {
    char path[512];
    snprintf(path, sizeof path, "%s/fleet-one.jsonl", kvo_test_tmpdir());
    FILE *f = fopen(path, "w");
    if (!f) FAILF("cannot write %s", path);
    for (int r = 0; r < 40; r++) fprintf(f, "{\"session_id\": \"user-7\", \"hash_ids\": [0, %d, %d]}\n", 1000 + r, 2000 + r);
    fclose(f);
    frows r;
    fleet(path, "--engines 4 --capacity 10 --prefix-blocks 1", &r);
    for (int q = 1; q < 3; q++) {
        const frow *w = frow_at(&r, q == 1 ? "session" : "prefix-hash", 0);
        size_t busy = 0;
        for (size_t e = 0; e < w->ne; e++) busy += w->e_req[e] > 0;
        ASSERT_EQ_U64(busy, 1);
        ASSERT_EQ_U64(w->hits, 39); /* block 0 hits from the second request on */
    }
    const frow *w = frow_at(&r, "round-robin", 0);
    for (size_t e = 0; e < w->ne; e++) ASSERT_EQ_U64(w->e_req[e], 10);
    ASSERT_EQ_U64(w->hits, 36);
    /* on two blocks, prefix-hash spreads them */
    fleet(path, "--engines 4 --capacity 10 --prefix-blocks 2 --routing prefix-hash", &r);
    ASSERT_EQ_U64(r.n, 1);
    size_t busy = 0;
    for (size_t e = 0; e < r.r[0].ne; e++) busy += r.r[0].e_req[e] > 0;
    ASSERT_TRUE(busy > 1);
}

KVO_TEST(fleet_cli_errors_and_plot) {
    trace t;
    uint32_t next = 0;
    gen(&t, 20, 6, &next);
    const char *path = write_trace(&t, "fleet-cli.jsonl");
    char args[1024], *out = NULL;
    static const struct { const char *extra, *what; } bad[] = {
        {"--capacity 10 --engines 0", "--engines"},
        {"--capacity 10 --engines 2 --routing round-robin,random", "--routing"},
        {"--capacity 10 --shared-capacity 100", "need --engines"},
        {"--capacity 10 --engines 2 --shared-capacity 1GiB", "--model"},
        {"--capacity 10 --engines 2 --shared-capacity 5:1:3", "FROM:TO:COUNT"},
        {"--capacity 10 --engines 2 --shared-policy fifo", "fifo"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--trace '%s' %s", path, bad[i].extra);
        ASSERT_EQ_INT(run_cli(args, &out), 2);
        ASSERT_CONTAINS(out, bad[i].what);
        free(out);
    }
    /* a malformed session_id names the line */
    char badp[512];
    snprintf(badp, sizeof badp, "%s/fleet-bad.jsonl", kvo_test_tmpdir());
    FILE *f = fopen(badp, "w");
    fprintf(f, "{\"hash_ids\": [1]}\n{\"session_id\": [1], \"hash_ids\": [1, 2]}\n");
    fclose(f);
    snprintf(args, sizeof args, "--trace '%s' --capacity 10 --engines 2", badp);
    ASSERT_EQ_INT(run_cli(args, &out), 2);
    ASSERT_CONTAINS(out, "fleet-bad.jsonl:2");
    free(out);
    /* bytes with a model; the text output */
    snprintf(args, sizeof args, "--trace '%s' --model %s --capacity 1GiB --engines 2 --shared-capacity 2GiB "
             "--json --quiet", path, kvo_model_preset_name(0));
    ASSERT_EQ_INT(run_cli(args, &out), 0);
    ASSERT_CONTAINS(out, "\"bytes_from_shared\"");
    ASSERT_CONTAINS(out, "\"shared_capacity_bytes\"");
    free(out);
    snprintf(args, sizeof args, "--trace '%s' --capacity 10 --engines 3 --shared-capacity 20 --quiet", path);
    ASSERT_EQ_INT(run_cli(args, &out), 0);
    ASSERT_CONTAINS(out, "per engine");
    ASSERT_CONTAINS(out, "prefix-hash");
    free(out);
    /* --plot: hit rate against the shared capacity */
    char png[512], cmd[2048];
    snprintf(png, sizeof png, "%s/fleet.png", kvo_test_tmpdir());
    snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" '%s' replay "
             "--trace '%s' --capacity 5 --engines 2 --shared-capacity 5:30:4 --quiet --plot '%s' 2>&1",
             KVO_CLI_PATH, path, png);
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
