/* Remote tier (Redis Cluster), on the shared cluster: slot vectors, round
 * trips, routing, corrupt values, back-pressure, parameters, TTL.  The fault
 * tests (MOVED/ASK, reshard, master kill, passwords, cluster down) are in
 * test_tiers_remote_faults.c; helpers in remote_test.h.
 *
 * The shared cluster comes from env KVO_TEST_REDIS (host:port of a seed, e.g.
 * 127.0.0.1:7000, as tools/test.sh starts it); without it every test but
 * the slot vectors is SKIPPED.  Tests that break a cluster start their own
 * private one with tools/redis-cluster.sh on ports above the shared one
 * (base + 10, 20, ...; loopback only) and stop it at exit, also on failure.
 * Every wait is bounded; no test asserts a duration. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "remote_test.h"

/* ------------------------------------------------------------------ tests */

#if KVO_HAVE_REDIS
#include <hiredis/hiredis.h>

#include "tiers/remote/remote_internal.h"
#endif

/* The reader's own path for a GET whose whole value is already in hiredis's
 * buffer (reply.c, mk_string): header and payload land in the sink, the
 * payload checksum is the one of its bytes, and a reply of another length
 * stays a heap string.  No cluster: bytes are fed to the reader directly. */
KVO_TEST(reader_sink_takes_a_whole_value) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#else
    enum { HDR = 4096, PAY = 200000 };
    size_t n = HDR + PAY;
    char *wire = malloc(n + 64), *hdr = malloc(HDR), *dst = malloc(PAY);
    ASSERT_TRUE(wire && hdr && dst);
    int head = snprintf(wire, 64, "$%zu\r\n", n);
    for (size_t i = 0; i < n; i++) wire[head + i] = (char)(i * 131u + (i >> 9));
    memcpy(wire + head + n, "\r\n", 2);
    redisContext ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.reader = redisReaderCreate();
    ASSERT_TRUE(ctx.reader != NULL);
    kvo__rc_reader_setup(&ctx, n);
    kvo__rc_cmd cmd;
    memset(&cmd, 0, sizeof cmd);
    cmd.sink_hdr = hdr;
    cmd.sink_dst = dst;
    cmd.sink_hdr_len = HDR;
    cmd.sink_len = PAY;
    ctx.reader->privdata = &cmd;
    ASSERT_EQ_INT(redisReaderFeed(ctx.reader, wire, (size_t)head + n + 2), REDIS_OK);
    redisReply *r = NULL;
    ASSERT_EQ_INT(redisReaderGetReply(ctx.reader, (void **)&r), REDIS_OK);
    ASSERT_TRUE(r != NULL);
    ASSERT_TRUE(r->str == NULL); /* the bytes are in the sink */
    ASSERT_EQ_U64(r->len, n);
    ASSERT_TRUE(memcmp(hdr, wire + head, HDR) == 0);
    ASSERT_TRUE(memcmp(dst, wire + head + HDR, PAY) == 0);
    ASSERT_EQ_U64(cmd.sink_sum, XXH3_64bits(wire + head + HDR, PAY));
    freeReplyObject(r);
    /* one byte short: not the sink's length, a heap string as usual */
    head = snprintf(wire, 64, "$%zu\r\n", n - 1);
    for (size_t i = 0; i < n - 1; i++) wire[head + i] = (char)i;
    memcpy(wire + head + n - 1, "\r\n", 2);
    ASSERT_EQ_INT(redisReaderFeed(ctx.reader, wire, (size_t)head + n + 1), REDIS_OK);
    ASSERT_EQ_INT(redisReaderGetReply(ctx.reader, (void **)&r), REDIS_OK);
    ASSERT_TRUE(r != NULL && r->str != NULL);
    ASSERT_EQ_U64(r->len, n - 1);
    freeReplyObject(r);
    redisReaderFree(ctx.reader);
    free(wire);
    free(hdr);
    free(dst);
#endif
}

KVO_TEST(crc16_slots) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#endif
    /* CRC16-XMODEM("123456789") = 0x31C3: the check value of the algorithm */
    ASSERT_EQ_U64(kvo_remote_key_slot("123456789", 9), 0x31C3u & 16383u);
    /* slots Redis itself reports (CLUSTER KEYSLOT) */
    ASSERT_EQ_U64(kvo_remote_key_slot("foo", 3), 12182);
    ASSERT_EQ_U64(kvo_remote_key_slot("bar", 3), 5061);
    ASSERT_EQ_U64(kvo_remote_key_slot("", 0), 0);
    /* hash tags: the first {...} that is not empty */
    const char *a = "{user1000}.following", *b = "{user1000}.followers";
    ASSERT_EQ_U64(kvo_remote_key_slot(a, strlen(a)), kvo_remote_key_slot(b, strlen(b)));
    ASSERT_EQ_U64(kvo_remote_key_slot(a, strlen(a)), kvo_remote_key_slot("user1000", 8));
    const char *c = "foo{bar}{zap}";
    ASSERT_EQ_U64(kvo_remote_key_slot(c, strlen(c)), kvo_remote_key_slot("bar", 3));
    const char *d = "foo{}{bar}"; /* empty tag: the whole key */
    ASSERT_NE_U64(kvo_remote_key_slot(d, strlen(d)), kvo_remote_key_slot("bar", 3));
    const char *e = "foo{{bar}}zap"; /* tag is "{bar" */
    ASSERT_EQ_U64(kvo_remote_key_slot(e, strlen(e)), kvo_remote_key_slot("{bar", 4));
    for (int i = 0; i < 1000; i++) {
        char k[32];
        int n = snprintf(k, sizeof k, "key:%d", i);
        ASSERT_LT_U64(kvo_remote_key_slot(k, (size_t)n), 16384);
    }
}

KVO_TEST(roundtrip) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "roundtrip", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 40), 40);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.puts, 40);
    ASSERT_EQ_U64(s.put_bytes, 40 * chunk_bytes(plan));
    ASSERT_EQ_U64(s.pending_writes, 0);
    ASSERT_EQ_U64(s.staging_bytes, 0);
    int res[40];
    ASSERT_EQ_U64(get_range(t, plan, 0, 40, res), 40);
    kvo_chunk_key k0 = ftf_key(0, 0), kx = ftf_key(1000, 0);
    ASSERT_EQ_INT(exists_one(t, &k0), 0);
    ASSERT_EQ_INT(exists_one(t, &kx), KVO_ENOTFOUND);
    ASSERT_EQ_U64(get_range(t, plan, 1000, 3, res), 0);
    for (int i = 0; i < 3; i++) ASSERT_EQ_INT(res[i], KVO_ENOTFOUND);
    s = stats(t);
    ASSERT_EQ_U64(s.gets, 40);
    ASSERT_EQ_U64(s.get_misses, 3);
    ASSERT_EQ_U64(s.exists_hits, 1);
    ASSERT_EQ_U64(s.exists_misses, 1);
    ASSERT_EQ_U64(s.nodes, 3); /* the masters */
    ASSERT_EQ_U64(s.moved, 0);
    /* the event fd is readable while completions wait */
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_exists(t, &k0, 1, NULL, NULL, &q));
    ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
    uint64_t v = 0;
    ASSERT_EQ_INT(read(kvo_remote_tier_event_fd(t), &v, sizeof v), (long long)sizeof v);
    kvo_remote_completion c;
    {
        size_t np_ = 99;
        ASSERT_OK(kvo_remote_tier_poll(t, &c, 1, &np_));
        ASSERT_EQ_U64(np_, 1);
    }
    ASSERT_EQ_INT(kvo_remote_tier_wait(t, -1), KVO_ENOTFOUND); /* nothing in flight */
    /* a bad key and NULL destinations are refused, nothing queued */
    kvo_chunk_key bad = ftf_key(1, 0);
    bad.group = 7;
    int r = 0;
    void *nul = NULL;
    ASSERT_OK(kvo_remote_tier_get(t, &bad, &nul, 1, NULL, &r, &q));
    ASSERT_EQ_INT(r, KVO_EINVAL);
    ASSERT_EQ_U64(q, 0);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Reading your own writes: gets and exists queued while the puts of their
 * keys are still pending (held queued by the test hook) wait on those puts
 * (reads_after_put) instead of going to Redis, where the keys are not yet;
 * released, every get holds its key's bytes and the exists says present. */
KVO_TEST(reads_right_after_puts_see_them) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "ryw", NULL);
    enum { N = 32 };
    uint64_t cb = chunk_bytes(plan);
    unsigned char *bufs = malloc(2 * N * cb), *want = malloc(cb);
    ASSERT_NOT_NULL(bufs);
    ASSERT_NOT_NULL(want);
    kvo_chunk_key keys[N];
    const void *srcs[N];
    void *dsts[N];
    uint64_t ud[N];
    for (size_t i = 0; i < N; i++) {
        keys[i] = ftf_key(i, 0);
        ftf_fill(bufs + i * cb, cb, &keys[i]);
        srcs[i] = bufs + i * cb;
        dsts[i] = bufs + (N + i) * cb;
        ud[i] = i;
    }
    int res[N];
    size_t q = 0;
    kvo__remote_test_hold_puts(t, true); /* the puts stay queued until released */
    ASSERT_OK(kvo_remote_tier_put(t, keys, srcs, N, NULL, res, &q));
    ASSERT_EQ_U64(q, N);
    ASSERT_OK(kvo_remote_tier_get(t, keys, dsts, N, ud, res, &q));
    ASSERT_EQ_U64(q, N);
    uint64_t eud = 99;
    ASSERT_OK(kvo_remote_tier_exists(t, &keys[N - 1], 1, &eud, res, &q));
    ASSERT_EQ_U64(q, 1);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.reads_after_put, N + 1); /* none went to Redis */
    ASSERT_EQ_U64(s.puts, 0);
    kvo__remote_test_hold_puts(t, false);
    size_t got = 0, seen_exists = 0;
    while (got < N + 1) {
        ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
        kvo_remote_completion c[N + 1];
        size_t m = 0;
        ASSERT_OK(kvo_remote_tier_poll(t, c, N + 1, &m));
        for (size_t j = 0; j < m; j++) {
            ASSERT_EQ_INT(c[j].result, 0);
            if (c[j].op == KVO_REMOTE_OP_EXISTS) {
                ASSERT_EQ_U64(c[j].user_data, 99);
                seen_exists++;
                continue;
            }
            ASSERT_EQ_U64(c[j].op, KVO_REMOTE_OP_GET);
            ftf_fill(want, cb, &keys[c[j].user_data]);
            ASSERT_MEM_EQ(bufs + (N + c[j].user_data) * cb, want, cb);
        }
        got += m;
    }
    ASSERT_EQ_U64(seen_exists, 1);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(60000)));
    s = stats(t);
    ASSERT_EQ_U64(s.puts, N);
    ASSERT_EQ_U64(s.gets, N);
    ASSERT_EQ_U64(s.get_misses, 0);
    /* once the puts are done, the reads go to Redis again */
    ASSERT_EQ_U64(get_range(t, plan, 0, 4, res), 4);
    ASSERT_EQ_U64(stats(t).reads_after_put, N + 1);
    free(bufs);
    free(want);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Two threads on one tier: one puts keys in order, 8 a call; the other gets
 * each key as soon as its put call returned.  Every get hits with the key's
 * bytes, whether it waited on the put in flight or came after it (the
 * waiter list under ThreadSanitizer too). */
typedef struct ryw_ctx {
    kvo_remote_tier *t;
    const kvo_plan *plan;
    uint64_t n;
    _Atomic uint64_t put_upto;
} ryw_ctx;

static void *ryw_putter(void *arg) {
    ryw_ctx *x = arg;
    uint64_t cb = chunk_bytes(x->plan);
    unsigned char *buf = malloc(8 * cb);
    ASSERT_NOT_NULL(buf);
    for (uint64_t i = 0; i < x->n; i += 8) {
        kvo_chunk_key k[8];
        const void *src[8];
        for (int j = 0; j < 8; j++) {
            k[j] = ftf_key(7000 + i + (uint64_t)j, 0);
            ftf_fill(buf + (uint64_t)j * cb, cb, &k[j]);
            src[j] = buf + (uint64_t)j * cb;
        }
        int r[8];
        ASSERT_OK(kvo_remote_tier_put(x->t, k, src, 8, NULL, r, NULL));
        for (int j = 0; j < 8; j++)
            while (r[j] == KVO_EAGAIN) { /* queue full: let it drain */
                ASSERT_OK(kvo_remote_tier_flush(x->t, KVO_MS(60000)));
                ASSERT_OK(kvo_remote_tier_put(x->t, &k[j], &src[j], 1, NULL, &r[j], NULL));
            }
        atomic_store(&x->put_upto, i + 8);
    }
    free(buf);
    return NULL;
}

KVO_TEST(reads_racing_puts_from_another_thread) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    ryw_ctx x = {open_tier(port, plan, "ryw-mt", NULL), plan, 256, 0};
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, ryw_putter, &x), 0);
    int res[1];
    for (uint64_t next = 0; next < x.n;) {
        uint64_t upto = atomic_load(&x.put_upto);
        if (next == upto) {
            sched_yield();
            continue;
        }
        for (; next < upto; next++) ASSERT_EQ_U64(get_range(x.t, plan, 7000 + next, 1, res), 1);
    }
    pthread_join(th, NULL);
    kvo_remote_tier_stats s = stats(x.t);
    ASSERT_EQ_U64(s.get_misses, 0);
    ASSERT_EQ_U64(s.gets, x.n);
    kvo_remote_tier_destroy(x.t);
    kvo_plan_destroy(plan);
}

/* Our slot of every key equals the server's (CLUSTER KEYSLOT), values land
 * on every master, and no MOVED is needed with a fresh map. */
KVO_TEST(slot_routing) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "routing", NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/keyslot.txt", kvo_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    uint32_t ours[64];
    for (int i = 0; i < 64; i++) {
        char name[160];
        kvo_chunk_key k = ftf_key((uint64_t)i, 0);
        ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
        ours[i] = kvo_remote_key_slot(name, strlen(name));
        fprintf(f, "CLUSTER KEYSLOT %s\n", name);
    }
    fclose(f);
    char cmd[800], *out = NULL;
    snprintf(cmd, sizeof cmd, "redis-cli -h 127.0.0.1 -p %d < %s", port, path);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 0);
    char *p = out;
    for (int i = 0; i < 64; i++) {
        char *end;
        long v = strtol(p, &end, 10);
        ASSERT_TRUE(end != p);
        ASSERT_EQ_U64((uint64_t)v, ours[i]);
        p = end;
    }
    free(out);
    ASSERT_EQ_U64(put_range(t, plan, 0, 64), 64);
    ASSERT_EQ_U64(get_range(t, plan, 0, 64, NULL), 64);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.moved, 0);
    ASSERT_EQ_U64(s.asked, 0);
    /* every master holds some of our keys: count per node with SCAN-free
     * EXISTS on each master (non-owners answer MOVED). */
    int masters_with_keys = 0;
    for (int n = 0; n < 6; n++) {
        char *role = NULL;
        rcli(port + n, NULL, "role", &role);
        bool master = role && !strncmp(role, "master", 6);
        free(role);
        if (!master) continue;
        int held = 0;
        for (int i = 0; i < 64; i++) {
            char name[160], args[256], *o = NULL;
            kvo_chunk_key k = ftf_key((uint64_t)i, 0);
            ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
            snprintf(args, sizeof args, "exists %s", name);
            rcli(port + n, NULL, args, &o);
            held += o && o[0] == '1';
            free(o);
        }
        masters_with_keys += held > 0;
    }
    ASSERT_EQ_INT(masters_with_keys, 3);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Flipped payload byte, flipped header byte, truncation, a foreign value:
 * each a miss (KVO_ECORRUPT), counted, and deleted. */
KVO_TEST(corrupt_value) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "corrupt", NULL);
    const char *damage[] = {"setrange %s 9000 X", "setrange %s 40 X", "set %s short", "set %s hello-not-kvo",
                            "setrange %s 70000 X"};
    size_t nd = sizeof damage / sizeof damage[0];
    ASSERT_EQ_U64(put_range(t, plan, 0, nd), nd);
    for (size_t i = 0; i < nd; i++) {
        char name[160], args[400];
        kvo_chunk_key k = ftf_key(i, 0);
        ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
        snprintf(args, sizeof args, damage[i], name);
        char full[450];
        snprintf(full, sizeof full, "-c %s", args);
        ASSERT_EQ_INT(rcli(port, NULL, full, NULL), 0);
    }
    int res[8];
    ASSERT_EQ_U64(get_range(t, plan, 0, nd, res), 0);
    for (size_t i = 0; i < nd; i++) ASSERT_EQ_INT(res[i], KVO_ECORRUPT);
    ASSERT_EQ_U64(stats(t).corrupt_deleted, nd);
    for (size_t i = 0; i < nd; i++) {
        kvo_chunk_key k = ftf_key(i, 0);
        ASSERT_EQ_INT(exists_one(t, &k), KVO_ENOTFOUND); /* deleted */
    }
    /* stored again: a hit */
    ASSERT_EQ_U64(put_range(t, plan, 0, 1), 1);
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);
    /* well-formed values that belong elsewhere, SET under key 0's name: another
     * key's header, another layout hash, another plan (fingerprint) */
    uint64_t cb = chunk_bytes(plan);
    unsigned char *val = malloc(KVO_REMOTE_HEADER_BYTES + cb);
    kvo_chunk_key k0 = ftf_key(0, 0), k1 = ftf_key(1, 0);
    kvo_plan *other = ftf_plan("remote-test-other", CHUNK_PAGE, false); /* same geometry, other fingerprint */
    char name[160], path[600], cmd[1200];
    ASSERT_OK(kvo_remote_tier_key_name(t, &k0, name, sizeof name));
    snprintf(path, sizeof path, "%s/value.bin", kvo_test_tmpdir());
    for (int v = 0; v < 3; v++) {
        const kvo_plan *wp = v == 2 ? other : plan;
        kvo__file_hdr h;
        ftf_fill(val + KVO_REMOTE_HEADER_BYTES, cb, &k0);
        uint64_t sum = XXH3_64bits(val + KVO_REMOTE_HEADER_BYTES, cb);
        kvo__file_hdr_init(&h, wp, v == 1 ? 0x1234 : 0, kvo_plan_group(wp, 0), v == 0 ? &k1 : &k0, sum);
        kvo__file_hdr_encode(&h, val);
        FILE *f = fopen(path, "wb");
        ASSERT_NOT_NULL(f);
        ASSERT_EQ_U64(fwrite(val, 1, KVO_REMOTE_HEADER_BYTES + cb, f), KVO_REMOTE_HEADER_BYTES + cb);
        fclose(f);
        snprintf(cmd, sizeof cmd, "redis-cli -c -h 127.0.0.1 -p %d -x set %s < %s", port, name, path);
        ASSERT_EQ_INT(kvo_test_run(cmd, NULL), 0);
        int r1 = 0;
        ASSERT_EQ_U64(get_range(t, plan, 0, 1, &r1), 0);
        ASSERT_EQ_INT(r1, KVO_ECORRUPT);
        ASSERT_EQ_INT(exists_one(t, &k0), KVO_ENOTFOUND);
    }
    ASSERT_EQ_U64(stats(t).corrupt_deleted, nd + 3);
    free(val);
    kvo_plan_destroy(other);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Stores beyond max_pending_writes or staging memory are dropped at once
 * (KVO_EAGAIN, counted); reads beyond max_pending_reads in flight, or beyond
 * the completion ring while nobody polls, are refused. */
/* One pipelined batch whose replies mix values received straight into the
 * caller's buffers (the right length), nils, short values and longer ones
 * (read through hiredis's reader): no reply takes another's bytes, every
 * hit holds its own bytes (get_range checks them). */
KVO_TEST(mixed_replies_in_one_batch) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "mixed", NULL);
    enum { N = 12 };
    ASSERT_EQ_U64(put_range(t, plan, 0, N), N);
    for (int i = 0; i < N; i++) {
        const char *how = i % 3 == 1 ? "del %s" : i == 2 ? "set %s x" : i == 5 ? "append %s tail" : i == 8 ? "set %s -ERR" : NULL;
        if (!how) continue;
        char name[160], args[400], full[450];
        kvo_chunk_key k = ftf_key((uint64_t)i, 0);
        ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
        snprintf(args, sizeof args, how, name);
        snprintf(full, sizeof full, "-c %s", args);
        ASSERT_EQ_INT(rcli(port, NULL, full, NULL), 0);
    }
    for (int pass = 0; pass < 2; pass++) { /* the second: after the corrupt ones were deleted */
        int res[N];
        size_t hits = get_range(t, plan, 0, N, res);
        for (int i = 0; i < N; i++) {
            int want = i % 3 == 1 ? KVO_ENOTFOUND : (i == 2 || i == 5 || i == 8) ? (pass ? KVO_ENOTFOUND : KVO_ECORRUPT) : 0;
            if (res[i] != want) FAILF("pass %d key %d: %s, expected %s", pass, i, kvo_error_name(res[i]), kvo_error_name(want));
        }
        ASSERT_EQ_U64(hits, 5);
    }
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(backpressure) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    p.url = url;
    p.plan = plan;
    p.key_prefix = prefix("bp");
    p.io_threads = 1;
    p.max_pending_writes = 2;
    p.max_pending_reads = 2;
    kvo_remote_tier *t = NULL;
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    uint64_t cb = chunk_bytes(plan);
    unsigned char *buf = malloc(cb);
    memset(buf, 7, cb);
    enum { N = 64 };
    kvo_chunk_key keys[N];
    const void *srcs[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key((uint64_t)i, 0);
        srcs[i] = buf;
    }
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_put(t, keys, srcs, N, NULL, res, &q));
    ASSERT_LE_U64(q, N);
    size_t dropped = 0;
    for (int i = 0; i < N; i++) {
        ASSERT_TRUE(res[i] == 0 || res[i] == KVO_EAGAIN);
        dropped += res[i] == KVO_EAGAIN;
    }
    ASSERT_GT_U64(dropped, 0);
    ASSERT_EQ_U64(dropped + q, N);
    ASSERT_EQ_U64(stats(t).dropped_backpressure, dropped);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(60000)));
    /* reads: at most 2 in flight or waiting to be polled */
    unsigned char *dsts = malloc(cb * N);
    void *dp[N];
    for (int i = 0; i < N; i++) dp[i] = dsts + (size_t)i * cb;
    ASSERT_OK(kvo_remote_tier_get(t, keys, dp, N, NULL, res, &q));
    ASSERT_GE_U64(q, 2);
    ASSERT_LE_U64(q, 4); /* ops free again once done; the completion ring (4) bounds the rest */
    ASSERT_EQ_U64(stats(t).refused_reads, N - q);
    for (int i = 0; i < N; i++) ASSERT_TRUE(res[i] == 0 || res[i] == KVO_EAGAIN);
    kvo_remote_tier_destroy(t); /* with completions unpolled */
    free(buf);
    free(dsts);
    kvo_plan_destroy(plan);
}

/* Parameters refused before any connection: bad URLs, key prefixes, no plan;
 * the password never appears in a message. */
KVO_TEST(bad_params) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#endif
    kvo_plan *plan = make_plan();
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    kvo_remote_tier *t = NULL;
    p.plan = plan;
    const char *bad[] = {"http://127.0.0.1:7000", "redis://", "redis://127.0.0.1:0", "redis://127.0.0.1:99999",
                         "redis://127.0.0.1:70x0", "redis://:Secret-Pw-99@", "redis://u:Secret-Pw-99@:7000",
                         "redis://127.0.0.1:7000,,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.url = bad[i];
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
        ASSERT_TRUE(strstr(kvo_last_error(), "Secret-Pw-99") == NULL);
        ASSERT_NULL(t);
    }
    p.url = "redis://127.0.0.1:7000";
    const char *prefixes[] = {"has space", "br{ace}", "tab\there"};
    for (size_t i = 0; i < 3; i++) {
        p.key_prefix = prefixes[i];
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "key_prefix");
    }
    p.key_prefix = NULL;
    p.plan = NULL;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
    ASSERT_ERR(kvo_remote_tier_create(NULL, &t), KVO_EINVAL);
    kvo_remote_tier_destroy(NULL);
    kvo_plan_destroy(plan);
}

/* ttl_s: values expire (the server's TTL is set and within ttl_s); 0 keeps
 * them without expiry. */
KVO_TEST(ttl) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    for (int with = 0; with < 2; with++) {
        kvo_remote_tier_params p = kvo_remote_tier_default_params();
        p.url = url;
        p.plan = plan;
        p.key_prefix = prefix("ttl");
        p.ttl_s = with ? 300 : 0;
        kvo_remote_tier *t = NULL;
        ASSERT_OK(kvo_remote_tier_create(&p, &t));
        ASSERT_EQ_U64(put_range(t, plan, 0, 4), 4);
        for (int i = 0; i < 4; i++) {
            char name[160], args[256], *o = NULL;
            kvo_chunk_key k = ftf_key((uint64_t)i, 0);
            ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
            snprintf(args, sizeof args, "-c ttl %s", name);
            ASSERT_EQ_INT(rcli(port, NULL, args, &o), 0);
            long ttl = strtol(o, NULL, 10);
            free(o);
            if (with) {
                ASSERT_GT_INT(ttl, 0);
                ASSERT_LE_INT(ttl, 300);
            } else {
                ASSERT_EQ_INT(ttl, -1); /* no expiry */
            }
        }
        ASSERT_EQ_U64(get_range(t, plan, 0, 4, NULL), 4);
        kvo_remote_tier_destroy(t);
    }
    kvo_plan_destroy(plan);
}

/* Completions of n removes (op REMOVE): results by user data. */
static void collect_removes(kvo_remote_tier *t, size_t n, int *results) {
    for (size_t got = 0; got < n;) {
        ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
        kvo_remote_completion c[16];
        size_t m = 0;
        ASSERT_OK(kvo_remote_tier_poll(t, c, 16, &m));
        for (size_t j = 0; j < m; j++) {
            ASSERT_EQ_U64(c[j].op, KVO_REMOTE_OP_REMOVE);
            ASSERT_LT_U64(c[j].user_data, n);
            ASSERT_EQ_U64(c[j].bytes, 0);
            results[c[j].user_data] = c[j].result;
        }
        got += m;
    }
}

/* kvo_remote_tier_remove (issue 47: LMCache's L2 usage never fell because
 * the Redis tier had no delete): present keys are deleted (0), absent ones
 * say so (KVO_ENOTFOUND); afterwards exists and get miss, the other keys
 * stay, and the counters add up. */
KVO_TEST(remove_deletes_keys) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "remove", NULL);
    enum { N = 10 };
    ASSERT_EQ_U64(put_range(t, plan, 0, N), N);
    kvo_chunk_key keys[N];
    uint64_t ud[N];
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key((uint64_t)(i < 6 ? i : 100 + i), 0); /* 0..5 stored, 4 never stored */
        ud[i] = (uint64_t)i;
    }
    int res[N];
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_remove(t, keys, N, ud, res, &q));
    ASSERT_EQ_U64(q, N);
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(res[i], 0);
    int done[N];
    collect_removes(t, N, done);
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(done[i], i < 6 ? 0 : KVO_ENOTFOUND);
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(exists_one(t, &keys[i]), KVO_ENOTFOUND);
    int gr[N];
    ASSERT_EQ_U64(get_range(t, plan, 0, N, gr), N - 6); /* 6..9 stay */
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(gr[i], KVO_ENOTFOUND);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.removes, 6);
    ASSERT_EQ_U64(s.remove_misses, 4);
    ASSERT_EQ_U64(s.remove_errors, 0);
    ASSERT_EQ_U64(s.pending_reads, 0);
    /* bad arguments */
    ASSERT_ERR(kvo_remote_tier_remove(t, NULL, 1, NULL, NULL, NULL), KVO_EINVAL);
    kvo_chunk_key bad = ftf_key(1, 7); /* a group the plan does not have */
    ASSERT_OK(kvo_remote_tier_remove(t, &bad, 1, NULL, res, &q));
    ASSERT_EQ_INT(res[0], KVO_EINVAL);
    ASSERT_EQ_U64(q, 0);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* A remove queued while the put of its key is still pending waits for the
 * put and deletes after it: the put never lands after the DEL.  Removes
 * are served with the reads, ahead of the puts, so without the wait the
 * DEL would run first and the value would stay. */
KVO_TEST(remove_after_a_pending_put_deletes_it) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "remove-put", NULL);
    uint64_t cb = chunk_bytes(plan);
    enum { N = 4 };
    unsigned char *buf = malloc(cb);
    kvo_chunk_key keys[N];
    uint64_t ud[N];
    kvo__remote_test_hold_puts(t, true);
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key((uint64_t)i, 0);
        ud[i] = (uint64_t)i;
        ftf_fill(buf, cb, &keys[i]);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_remote_tier_put(t, &keys[i], &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
    }
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_remove(t, keys, N, ud, NULL, &q));
    ASSERT_EQ_U64(q, N);
    ASSERT_EQ_U64(stats(t).removes + stats(t).remove_misses, 0); /* waiting on the held puts */
    kvo__remote_test_hold_puts(t, false);
    int done[N];
    collect_removes(t, N, done);
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(done[i], 0); /* each found the put's value */
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    ASSERT_EQ_U64(stats(t).puts, N);
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(exists_one(t, &keys[i]), KVO_ENOTFOUND);
    free(buf);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* wait and flush say why they fail (kvo_last_error), like every other
 * call: nothing in flight, a timeout with reads or puts still running. */
KVO_TEST(wait_and_flush_set_the_last_error) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "wait-err", NULL);
    kvo__error(KVO_EIO, "stale");
    ASSERT_ERR(kvo_remote_tier_wait(t, -1), KVO_ENOTFOUND);
    ASSERT_CONTAINS(kvo_last_error(), "nothing in flight");
    kvo__remote_test_hold_puts(t, true); /* a put that cannot finish yet */
    uint64_t cb = chunk_bytes(plan);
    unsigned char *buf = calloc(1, cb);
    kvo_chunk_key k = ftf_key(1, 0);
    const void *src = buf;
    ASSERT_OK(kvo_remote_tier_put(t, &k, &src, 1, NULL, NULL, NULL));
    kvo__error(KVO_EIO, "stale");
    ASSERT_ERR(kvo_remote_tier_flush(t, KVO_MS(1)), KVO_ETIMEDOUT);
    ASSERT_CONTAINS(kvo_last_error(), "1 puts still queued");
    void *dst = buf;
    ASSERT_OK(kvo_remote_tier_get(t, &k, &dst, 1, NULL, NULL, NULL)); /* waits on the held put */
    kvo__error(KVO_EIO, "stale");
    ASSERT_ERR(kvo_remote_tier_wait(t, KVO_MS(1)), KVO_ETIMEDOUT);
    ASSERT_CONTAINS(kvo_last_error(), "no completion within 1 ms");
    kvo__remote_test_hold_puts(t, false);
    ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(30000)));
    free(buf);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}
