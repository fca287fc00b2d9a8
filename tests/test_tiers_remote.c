/* Remote tier (Redis Cluster): slot vectors, round trips, routing, MOVED and
 * ASK (by hand and during a redis-cli reshard under traffic), SIGKILL of a
 * master under loads and stores, corrupt values, passwords, the whole
 * cluster down, back-pressure.
 *
 * The shared cluster comes from env KVO_TEST_REDIS (host:port of a seed, e.g.
 * 127.0.0.1:7000, as tools/ci-redis.sh starts it); without it every test but
 * the slot vectors is SKIPPED.  Tests that break a cluster start their own
 * private one with tools/redis-cluster.sh on ports above the shared one
 * (base + 10, 20, ...; loopback only) and stop it at exit, also on failure.
 * Every wait is bounded; no test asserts a duration. */
#include "kvo_test.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvoffload/kvo_remote_tier.h"
#include "tiers/file_internal.h"

#define CHUNK_PAGE 16384u /* 2 layers x 2 blocks x 16 KiB = 64 KiB chunks */

static char priv_dir[8][512];
static int n_priv;

static void stop_private(void) {
    for (int i = 0; i < n_priv; i++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "%s/tools/redis-cluster.sh stop %s >/dev/null 2>&1", KVO_SOURCE_DIR, priv_dir[i]);
        if (system(cmd) != 0) fprintf(stderr, "could not stop %s\n", priv_dir[i]);
    }
    n_priv = 0;
}

/* The shared cluster's seed port, or skip. */
static int shared_port(void) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#endif
    const char *a = getenv("KVO_TEST_REDIS");
    if (!a || !a[0]) SKIP("KVO_TEST_REDIS not set (tools/ci-redis.sh starts a cluster and sets it)");
    const char *colon = strrchr(a, ':');
    if (!colon || strncmp(a, "127.0.0.1:", 10) != 0) FAILF("KVO_TEST_REDIS must be 127.0.0.1:port, is %s", a);
    return atoi(colon + 1);
}

/* Start a private cluster at shared port + offset (password may be NULL). */
static int private_cluster(int offset, const char *password) {
    int port = shared_port() + offset;
    if (n_priv == 0) atexit(stop_private);
    /* not under kvo_test_tmpdir(): that is removed when a test passes, before
     * the atexit handler reads the pid files */
    const char *tmp = getenv("TMPDIR");
    snprintf(priv_dir[n_priv], sizeof priv_dir[0], "%s/kvo-rcluster-%d-XXXXXX", tmp ? tmp : "/tmp", port);
    if (!mkdtemp(priv_dir[n_priv])) FAILF("mkdtemp %s", priv_dir[n_priv]);
    char cmd[1400], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/tools/redis-cluster.sh start %s %d %s 2>&1", KVO_SOURCE_DIR, priv_dir[n_priv++],
             port, password ? password : "");
    int rc = kvo_test_run(cmd, &out);
    if (rc != 0) FAILF("cannot start a private cluster on %d: %s", port, out ? out : "");
    free(out);
    return port;
}

/* redis-cli on 127.0.0.1:port; output (malloc'd) into *out when not NULL. */
static int rcli(int port, const char *password, const char *args, char **out) {
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s%s%sredis-cli -h 127.0.0.1 -p %d %s 2>&1", password ? "REDISCLI_AUTH='" : "",
             password ? password : "", password ? "' " : "", port, args);
    int rc = kvo_test_run(cmd, &o);
    if (out) *out = o;
    else free(o);
    return rc;
}

static kvo_plan *make_plan_named(const char *model) {
    kvo_model *m = NULL;
    if (kvo_model_create(model, 16, &m)) FAILF("model: %s", kvo_last_error());
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "full");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = CHUNK_PAGE;
    if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    kvo_plan *p = NULL;
    if (kvo_plan_create(m, &pp, &p)) FAILF("plan: %s", kvo_last_error());
    kvo_model_destroy(m);
    return p;
}

static kvo_plan *make_plan(void) { return make_plan_named("remote-test"); }

static uint64_t chunk_bytes(const kvo_plan *p) { return kvo_plan_group(p, 0)->chunk_bytes; }

static kvo_chunk_key key_n(uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 12345;
    k.hash.hi = ~i * 0xbf58476d1ce4e5b9ull;
    return k;
}

static void fill_key(unsigned char *buf, uint64_t n, const kvo_chunk_key *k) {
    uint64_t s = k->hash.lo ^ k->hash.hi;
    for (uint64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(s >> 56);
    }
}

/* A key prefix unique to this test run (runs may share the cluster). */
static const char *prefix(const char *test) {
    static char buf[96];
    snprintf(buf, sizeof buf, "kvotest-%s-%d-%llx", test, (int)getpid(), (unsigned long long)kvo_test_rand());
    return buf;
}

static kvo_remote_tier *open_tier(int port, const kvo_plan *plan, const char *test, const char *userpass) {
    char url[256];
    snprintf(url, sizeof url, "redis://%s%s127.0.0.1:%d", userpass ? userpass : "", userpass ? "@" : "", port);
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    p.url = url;
    p.plan = plan;
    p.key_prefix = prefix(test);
    p.io_threads = 2;
    p.io_timeout_ms = 1000;
    p.down_backoff_ms = 200;
    kvo_remote_tier *t = NULL;
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    return t;
}

/* Store keys first..first+n-1 (fill_key bytes), waiting for the queue when
 * back-pressure drops one; flush.  Returns how many were queued. */
static size_t put_range(kvo_remote_tier *t, const kvo_plan *plan, uint64_t first, size_t n) {
    uint64_t cb = chunk_bytes(plan);
    unsigned char *buf = malloc(cb);
    size_t queued = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_chunk_key k = key_n(first + i);
        fill_key(buf, cb, &k);
        const void *src = buf;
        size_t q = 0;
        int r = 0;
        ASSERT_OK(kvo_remote_tier_put(t, &k, &src, 1, NULL, &r, &q));
        if (r == KVO_EAGAIN) { /* queue full: let it drain, try once more */
            ASSERT_OK(kvo_remote_tier_flush(t, 60000));
            ASSERT_OK(kvo_remote_tier_put(t, &k, &src, 1, NULL, &r, &q));
        }
        queued += q;
    }
    free(buf);
    ASSERT_OK(kvo_remote_tier_flush(t, 60000));
    return queued;
}

/* Load keys first..first+n-1; results[i]; a hit must hold the right bytes
 * (wrong bytes fail the test).  Returns the number of hits. */
static size_t get_range(kvo_remote_tier *t, const kvo_plan *plan, uint64_t first, size_t n, int *results) {
    uint64_t cb = chunk_bytes(plan);
    unsigned char *bufs = malloc(cb * n), *want = malloc(cb);
    size_t queued = 0, hits = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_chunk_key k = key_n(first + i);
        void *dst = bufs + i * cb;
        uint64_t ud = i;
        int r = 0;
        ASSERT_OK(kvo_remote_tier_get(t, &k, &dst, 1, &ud, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        queued++;
        if (results) results[i] = 1; /* not completed */
    }
    for (size_t done = 0; done < queued;) {
        ASSERT_OK(kvo_remote_tier_wait(t, 30000)); /* bounded: never hangs */
        kvo_remote_completion c[16];
        size_t m = kvo_remote_tier_poll(t, c, 16);
        for (size_t j = 0; j < m; j++) {
            ASSERT_EQ_U64(c[j].op, KVO_REMOTE_OP_GET);
            ASSERT_LT_U64(c[j].user_data, n);
            if (results) results[c[j].user_data] = c[j].result;
            if (c[j].result == 0) {
                kvo_chunk_key k = key_n(first + c[j].user_data);
                ASSERT_TRUE(kvo_chunk_key_eq(&k, &c[j].key));
                fill_key(want, cb, &k);
                ASSERT_MEM_EQ(bufs + c[j].user_data * cb, want, cb);
                ASSERT_EQ_U64(c[j].bytes, cb);
                hits++;
            } else {
                ASSERT_TRUE(c[j].result == KVO_ENOTFOUND || c[j].result == KVO_EIO || c[j].result == KVO_ECORRUPT);
            }
        }
        done += m;
    }
    free(bufs);
    free(want);
    return hits;
}

/* exists for one key: the completion's result. */
static int exists_one(kvo_remote_tier *t, const kvo_chunk_key *k) {
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_exists(t, k, 1, NULL, NULL, &q));
    ASSERT_EQ_U64(q, 1);
    ASSERT_OK(kvo_remote_tier_wait(t, 30000));
    kvo_remote_completion c;
    ASSERT_EQ_U64(kvo_remote_tier_poll(t, &c, 1), 1);
    ASSERT_EQ_U64(c.op, KVO_REMOTE_OP_EXISTS);
    return c.result;
}

static kvo_remote_tier_stats stats(kvo_remote_tier *t) {
    kvo_remote_tier_stats s;
    ASSERT_OK(kvo_remote_tier_get_stats(t, &s));
    return s;
}

/* ------------------------------------------------------------------ tests */

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
    kvo_chunk_key k0 = key_n(0), kx = key_n(1000);
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
    ASSERT_OK(kvo_remote_tier_wait(t, 30000));
    uint64_t v = 0;
    ASSERT_EQ_INT(read(kvo_remote_tier_event_fd(t), &v, sizeof v), (long long)sizeof v);
    kvo_remote_completion c;
    ASSERT_EQ_U64(kvo_remote_tier_poll(t, &c, 1), 1);
    ASSERT_EQ_INT(kvo_remote_tier_wait(t, -1), KVO_ENOTFOUND); /* nothing in flight */
    /* a bad key and NULL destinations are refused, nothing queued */
    kvo_chunk_key bad = key_n(1);
    bad.group = 7;
    int r = 0;
    void *nul = NULL;
    ASSERT_OK(kvo_remote_tier_get(t, &bad, &nul, 1, NULL, &r, &q));
    ASSERT_EQ_INT(r, KVO_EINVAL);
    ASSERT_EQ_U64(q, 0);
    kvo_remote_tier_destroy(t);
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
        kvo_chunk_key k = key_n((uint64_t)i);
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
            kvo_chunk_key k = key_n((uint64_t)i);
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
        kvo_chunk_key k = key_n(i);
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
        kvo_chunk_key k = key_n(i);
        ASSERT_EQ_INT(exists_one(t, &k), KVO_ENOTFOUND); /* deleted */
    }
    /* stored again: a hit */
    ASSERT_EQ_U64(put_range(t, plan, 0, 1), 1);
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);
    /* well-formed values that belong elsewhere, SET under key 0's name: another
     * key's header, another layout hash, another plan (fingerprint) */
    uint64_t cb = chunk_bytes(plan);
    unsigned char *val = malloc(KVO_REMOTE_HEADER_BYTES + cb);
    kvo_chunk_key k0 = key_n(0), k1 = key_n(1);
    kvo_plan *other = make_plan_named("remote-test-other"); /* same geometry, other fingerprint */
    char name[160], path[600], cmd[1200];
    ASSERT_OK(kvo_remote_tier_key_name(t, &k0, name, sizeof name));
    snprintf(path, sizeof path, "%s/value.bin", kvo_test_tmpdir());
    for (int v = 0; v < 3; v++) {
        const kvo_plan *wp = v == 2 ? other : plan;
        kvo__file_hdr h;
        fill_key(val + KVO_REMOTE_HEADER_BYTES, cb, &k0);
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

/* Port of the master owning key k (EXISTS answers 1 there: k is stored). */
static int owner_port(kvo_remote_tier *t, int base, const kvo_chunk_key *k) {
    char name[160], args[256];
    ASSERT_OK(kvo_remote_tier_key_name(t, k, name, sizeof name));
    snprintf(args, sizeof args, "exists %s", name);
    for (int n = 0; n < 6; n++) {
        char *o = NULL;
        rcli(base + n, NULL, args, &o);
        bool yes = o && o[0] == '1';
        free(o);
        if (yes) return base + n;
    }
    FAILF("no node holds the key");
}

static void node_id(int port, char out[64]) {
    char *o = NULL;
    ASSERT_EQ_INT(rcli(port, NULL, "cluster myid", &o), 0);
    ASSERT_NOT_NULL(o);
    size_t n = strcspn(o, "\r\n");
    ASSERT_TRUE(n > 0 && n < 64);
    memcpy(out, o, n);
    out[n] = 0;
    free(o);
}

static bool is_master(int port) {
    char *role = NULL;
    rcli(port, NULL, "role", &role);
    bool m = role && !strncmp(role, "master", 6);
    free(role);
    return m;
}

/* A slot migrated by hand: a new key of a MIGRATING slot goes to the
 * importing node through ASK + ASKING; after the migration the old owner
 * answers MOVED and the map follows. */
KVO_TEST(ask_moved) {
    int base = private_cluster(20, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "ask", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 1), 1);
    kvo_chunk_key k1 = key_n(0);
    char n1[160];
    ASSERT_OK(kvo_remote_tier_key_name(t, &k1, n1, sizeof n1));
    uint32_t slot = kvo_remote_key_slot(n1, strlen(n1));
    int src = owner_port(t, base, &k1), dst = -1;
    for (int n = 0; n < 6 && dst < 0; n++)
        if (base + n != src && is_master(base + n)) dst = base + n;
    ASSERT_TRUE(dst > 0);
    char src_id[64], dst_id[64], args[512];
    node_id(src, src_id);
    node_id(dst, dst_id);
    snprintf(args, sizeof args, "cluster setslot %u importing %s", slot, src_id);
    ASSERT_EQ_INT(rcli(dst, NULL, args, NULL), 0);
    snprintf(args, sizeof args, "cluster setslot %u migrating %s", slot, dst_id);
    ASSERT_EQ_INT(rcli(src, NULL, args, NULL), 0);
    /* another key of the same slot, not stored yet */
    uint64_t i2 = 1;
    char n2[160];
    for (;; i2++) {
        kvo_chunk_key k = key_n(i2);
        ASSERT_OK(kvo_remote_tier_key_name(t, &k, n2, sizeof n2));
        if (kvo_remote_key_slot(n2, strlen(n2)) == slot) break;
        ASSERT_LT_U64(i2, 10000000);
    }
    ASSERT_EQ_U64(put_range(t, plan, i2, 1), 1);
    ASSERT_EQ_U64(stats(t).puts, 2);
    ASSERT_GE_U64(stats(t).asked, 1);
    ASSERT_EQ_U64(get_range(t, plan, i2, 1, NULL), 1); /* ASK again: served by dst */
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);  /* still on src */
    char *o = NULL;
    /* finish the migration */
    snprintf(args, sizeof args, "migrate 127.0.0.1 %d \"\" 0 5000 keys %s", dst, n1);
    ASSERT_EQ_INT(rcli(src, NULL, args, &o), 0);
    free(o);
    for (int n = 0; n < 6; n++) {
        if (!is_master(base + n)) continue;
        snprintf(args, sizeof args, "cluster setslot %u node %s", slot, dst_id);
        rcli(base + n, NULL, args, NULL);
    }
    uint64_t moved0 = stats(t).moved;
    ASSERT_EQ_U64(get_range(t, plan, 0, 1, NULL), 1);
    ASSERT_EQ_U64(get_range(t, plan, i2, 1, NULL), 1);
    ASSERT_GT_U64(stats(t).moved, moved0);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* redis-cli --cluster reshard moves 1000 slots while loads and stores run:
 * no wrong bytes ever, every stored key readable afterwards, redirections
 * followed. */
KVO_TEST(reshard_during_traffic) {
    int base = private_cluster(10, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "reshard", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 200), 200);
    int from = -1, to = -1;
    for (int n = 0; n < 6; n++)
        if (is_master(base + n)) {
            if (from < 0) from = base + n;
            else if (to < 0) to = base + n;
        }
    ASSERT_TRUE(from > 0 && to > 0);
    char from_id[64], to_id[64], cmd[1600], done[600];
    node_id(from, from_id);
    node_id(to, to_id);
    snprintf(done, sizeof done, "%s/reshard.done", kvo_test_tmpdir());
    snprintf(cmd, sizeof cmd, "(redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s --cluster-to %s "
             "--cluster-slots 1000 --cluster-yes --cluster-pipeline 10 > %s/reshard.log 2>&1; echo $? > %s) &",
             base, from_id, to_id, kvo_test_tmpdir(), done);
    ASSERT_EQ_INT(system(cmd), 0);
    int res[200];
    uint64_t round = 0, next_key = 1000;
    while (!file_exists(done)) {
        ASSERT_LT_U64(round++, 2000); /* bounded */
        get_range(t, plan, 0, 200, res);              /* wrong bytes fail inside */
        put_range(t, plan, next_key, 10);
        next_key += 10;
    }
    char *o = kvo_test_read_file(done, NULL);
    ASSERT_NOT_NULL(o);
    ASSERT_EQ_INT(atoi(o), 0);
    free(o);
    ASSERT_EQ_U64(get_range(t, plan, 0, 200, res), 200);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_GT_U64(s.moved + s.asked, 0);
    ASSERT_EQ_U64(s.dropped_io, 0);
    /* stores made during the reshard are all there */
    ASSERT_EQ_U64(get_range(t, plan, 1000, (size_t)(next_key - 1000 > 200 ? 200 : next_key - 1000), NULL),
                  next_key - 1000 > 200 ? 200 : next_key - 1000);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* SIGKILL of a master under loads and stores: loads are hits with the right
 * bytes or misses, stores to the dead master are dropped and counted, and
 * traffic resumes once its replica is promoted. */
KVO_TEST(master_kill) {
    int base = private_cluster(30, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "kill", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 100), 100);
    int victim = -1;
    for (int n = 1; n < 6 && victim < 0; n++)
        if (is_master(base + n)) victim = base + n;
    ASSERT_TRUE(victim > 0);
    char pidfile[700];
    snprintf(pidfile, sizeof pidfile, "%s/%d/redis.pid", priv_dir[n_priv - 1], victim);
    char *pid = kvo_test_read_file(pidfile, NULL);
    ASSERT_NOT_NULL(pid);
    ASSERT_EQ_INT(kill((pid_t)atoi(pid), SIGKILL), 0);
    free(pid);
    /* during the outage */
    int res[100];
    size_t hits = get_range(t, plan, 0, 100, res);
    ASSERT_LT_U64(hits, 100);
    put_range(t, plan, 1000, 60);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_GT_U64(s.dropped_io, 0);
    ASSERT_GT_U64(s.read_errors, 0);
    ASSERT_GT_U64(s.node_failures, 0);
    /* until the replica is promoted: every store lands and reads back */
    uint64_t key = 2000;
    bool resumed = false;
    for (int round = 0; round < 600 && !resumed; round++) {
        uint64_t puts0 = stats(t).puts;
        put_range(t, plan, key, 30);
        resumed = stats(t).puts - puts0 == 30 && get_range(t, plan, key, 30, NULL) == 30;
        key += 30;
        if (!resumed) usleep(100000);
    }
    ASSERT_TRUE(resumed);
    ASSERT_GT_U64(stats(t).slot_refreshes, 1);
    /* keys of the surviving masters never stopped hitting; the promoted
     * replica serves what it had replicated: never wrong bytes */
    get_range(t, plan, 0, 100, res);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* requirepass cluster: a wrong password is refused at create with a clear
 * message that does not contain it; the right one (url, env, ACL user)
 * works. */
KVO_TEST(wrong_password) {
    const char *pw = "kvo-Right-Pw-4711";
    int base = private_cluster(50, pw);
    kvo_plan *plan = make_plan();
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    char url[256];
    snprintf(url, sizeof url, "redis://:Wrong-Pw-0815@127.0.0.1:%d", base);
    p.url = url;
    p.plan = plan;
    p.key_prefix = prefix("auth");
    kvo_remote_tier *t = NULL;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "authentication refused");
    ASSERT_TRUE(strstr(kvo_last_error(), "Wrong-Pw-0815") == NULL);
    ASSERT_NULL(t);
    /* no password at all: the server asks for one */
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", base);
    unsetenv("KVO_REDIS_PASSWORD");
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "NOAUTH");
    /* from the environment */
    setenv("KVO_REDIS_PASSWORD", pw, 1);
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    unsetenv("KVO_REDIS_PASSWORD");
    ASSERT_EQ_U64(put_range(t, plan, 0, 8), 8);
    ASSERT_EQ_U64(stats(t).puts, 8);
    ASSERT_EQ_U64(get_range(t, plan, 0, 8, NULL), 8);
    kvo_remote_tier_destroy(t);
    /* an ACL user, in the url */
    for (int n = 0; n < 6; n++)
        ASSERT_EQ_INT(rcli(base + n, pw, "acl setuser kvouser on '>userpw' '~*' '+@all'", NULL), 0);
    t = open_tier(base, plan, "acl", "kvouser:userpw");
    ASSERT_EQ_U64(put_range(t, plan, 0, 4), 4);
    ASSERT_EQ_U64(get_range(t, plan, 0, 4, NULL), 4);
    kvo_remote_tier_destroy(t);
    snprintf(url, sizeof url, "redis://kvouser:nope@127.0.0.1:%d", base);
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "kvouser");
    kvo_plan_destroy(plan);
}

/* The whole cluster down: every call returns at once, loads complete with
 * KVO_EIO (a miss), stores are dropped and counted, nothing hangs; a new
 * tier is refused clearly. */
KVO_TEST(cluster_down) {
    int base = private_cluster(40, NULL);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(base, plan, "down", NULL);
    ASSERT_EQ_U64(put_range(t, plan, 0, 20), 20);
    stop_private();
    int res[20];
    ASSERT_EQ_U64(get_range(t, plan, 0, 20, res), 0);
    for (int i = 0; i < 20; i++) ASSERT_EQ_INT(res[i], KVO_EIO);
    ASSERT_EQ_U64(put_range(t, plan, 100, 20), 20); /* queued, then dropped */
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.dropped_io, 20);
    ASSERT_EQ_U64(s.read_errors, 20);
    ASSERT_GT_U64(s.nodes_down, 0);
    kvo_chunk_key k = key_n(0);
    ASSERT_EQ_INT(exists_one(t, &k), KVO_EIO);
    kvo_remote_tier_destroy(t); /* returns: nothing waits on the dead nodes */
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d,127.0.0.1:%d", base, base + 1);
    p.url = url;
    p.plan = plan;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "cannot connect");
    kvo_plan_destroy(plan);
}

/* Stores beyond max_pending_writes or staging memory are dropped at once
 * (KVO_EAGAIN, counted); reads beyond max_pending_reads in flight, or beyond
 * the completion ring while nobody polls, are refused. */
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
        keys[i] = key_n((uint64_t)i);
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
    ASSERT_OK(kvo_remote_tier_flush(t, 60000));
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
            kvo_chunk_key k = key_n((uint64_t)i);
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
