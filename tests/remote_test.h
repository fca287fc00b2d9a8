/* Helpers of the remote-tier tests (test_tiers_remote*.c): the shared
 * cluster from env KVO_TEST_REDIS (skip without it), private clusters started
 * with tools/redis-cluster.sh and stopped at exit, a small plan, and
 * synchronous put/get/exists wrappers that bound every wait and fail on
 * wrong bytes.  Plans, keys and their bytes are tests/file_tier_fixture.h's
 * (shared with the file-tier tests). */
#ifndef KVO_REMOTE_TEST_H
#define KVO_REMOTE_TEST_H

#include "kvo_test.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvoffload/kvo_remote_tier.h"
#include "file_tier_fixture.h"

#if !KVO_HAVE_REDIS
/* Without hiredis the tier's test hook does not exist; every test that
 * calls it skips first (shared_port), so this is never reached. */
static inline void kvo__remote_test_hold_puts(kvo_remote_tier *t, bool hold) {
    (void)t;
    (void)hold;
}
#endif

#define CHUNK_PAGE 16384u /* 2 layers x 2 blocks x 16 KiB = 64 KiB chunks */

static char priv_dir[8][512];
static int n_priv;

static inline void stop_private(void) {
    for (int i = 0; i < n_priv; i++) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "%s/tools/redis-cluster.sh stop %s >/dev/null 2>&1", KVO_SOURCE_DIR, priv_dir[i]);
        if (system(cmd) != 0) fprintf(stderr, "could not stop %s\n", priv_dir[i]);
    }
    n_priv = 0;
}

/* The shared cluster's seed port, or skip. */
static inline int shared_port(void) {
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
static inline int private_cluster(int offset, const char *password) {
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
static inline int rcli(int port, const char *password, const char *args, char **out) {
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s%s%sredis-cli -h 127.0.0.1 -p %d %s 2>&1", password ? "REDISCLI_AUTH='" : "",
             password ? password : "", password ? "' " : "", port, args);
    int rc = kvo_test_run(cmd, &o);
    if (out) *out = o;
    else free(o);
    return rc;
}

/* The remote tests' plan: one group of 64 KiB chunks (file_tier_fixture.h). */
static inline kvo_plan *make_plan(void) { return ftf_plan("remote-test", CHUNK_PAGE, false); }

static inline uint64_t chunk_bytes(const kvo_plan *p) { return kvo_plan_group(p, 0)->chunk_bytes; }

/* A key prefix unique to this test run (runs may share the cluster). */
static inline const char *prefix(const char *test) {
    static char buf[96];
    snprintf(buf, sizeof buf, "kvotest-%s-%d-%llx", test, (int)getpid(), (unsigned long long)kvo_test_rand());
    return buf;
}

/* A tier on 127.0.0.1:port under key prefix pfx, with a fleet secret and a
 * previous one (NULL: as the params default, i.e. the environment; "":
 * none). */
static inline kvo_remote_tier *open_tier_sealed(int port, const kvo_plan *plan, const char *pfx,
                                                const char *userpass, const char *secret, const char *previous) {
    char url[256];
    snprintf(url, sizeof url, "redis://%s%s127.0.0.1:%d", userpass ? userpass : "", userpass ? "@" : "", port);
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    p.url = url;
    p.plan = plan;
    p.key_prefix = pfx;
    p.io_threads = 2;
    p.io_timeout_ms = 1000;
    p.down_backoff_ms = 200;
    p.secret = secret;
    p.secret_previous = previous;
    kvo_remote_tier *t = NULL;
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    return t;
}

static inline kvo_remote_tier *open_tier(int port, const kvo_plan *plan, const char *test, const char *userpass) {
    return open_tier_sealed(port, plan, prefix(test), userpass, NULL, NULL);
}

/* Store keys first..first+n-1 (ftf_fill bytes), waiting for the queue when
 * back-pressure drops one; flush.  Returns how many were queued. */
static inline size_t put_range(kvo_remote_tier *t, const kvo_plan *plan, uint64_t first, size_t n) {
    uint64_t cb = chunk_bytes(plan);
    unsigned char *buf = malloc(cb);
    size_t queued = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_chunk_key k = ftf_key(first + i, 0);
        ftf_fill(buf, cb, &k);
        const void *src = buf;
        size_t q = 0;
        int r = 0;
        ASSERT_OK(kvo_remote_tier_put(t, &k, &src, 1, NULL, &r, &q));
        if (r == KVO_EAGAIN) { /* queue full: let it drain, try once more */
            ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(60000)));
            ASSERT_OK(kvo_remote_tier_put(t, &k, &src, 1, NULL, &r, &q));
        }
        queued += q;
    }
    free(buf);
    ASSERT_OK(kvo_remote_tier_flush(t, KVO_MS(60000)));
    return queued;
}

/* Load keys first..first+n-1; results[i]; a hit must hold the right bytes
 * (wrong bytes fail the test).  Returns the number of hits. */
static inline size_t get_range(kvo_remote_tier *t, const kvo_plan *plan, uint64_t first, size_t n, int *results) {
    uint64_t cb = chunk_bytes(plan);
    unsigned char *bufs = malloc(cb * n), *want = malloc(cb);
    size_t queued = 0, hits = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_chunk_key k = ftf_key(first + i, 0);
        void *dst = bufs + i * cb;
        uint64_t ud = i;
        int r = 0;
        ASSERT_OK(kvo_remote_tier_get(t, &k, &dst, 1, &ud, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        queued++;
        if (results) results[i] = 1; /* not completed */
    }
    for (size_t done = 0; done < queued;) {
        ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000))); /* bounded: never hangs */
        kvo_remote_completion c[16];
        size_t m = 0;
        ASSERT_OK(kvo_remote_tier_poll(t, c, 16, &m));
        for (size_t j = 0; j < m; j++) {
            ASSERT_EQ_U64(c[j].op, KVO_REMOTE_OP_GET);
            ASSERT_LT_U64(c[j].user_data, n);
            if (results) results[c[j].user_data] = c[j].result;
            if (c[j].result == 0) {
                kvo_chunk_key k = ftf_key(first + c[j].user_data, 0);
                ASSERT_TRUE(kvo_chunk_key_eq(&k, &c[j].key));
                ftf_fill(want, cb, &k);
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
static inline int exists_one(kvo_remote_tier *t, const kvo_chunk_key *k) {
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_exists(t, k, 1, NULL, NULL, &q));
    ASSERT_EQ_U64(q, 1);
    ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(30000)));
    kvo_remote_completion c;
    {
        size_t np_ = 99;
        ASSERT_OK(kvo_remote_tier_poll(t, &c, 1, &np_));
        ASSERT_EQ_U64(np_, 1);
    }
    ASSERT_EQ_U64(c.op, KVO_REMOTE_OP_EXISTS);
    return c.result;
}

static inline kvo_remote_tier_stats stats(kvo_remote_tier *t) {
    kvo_remote_tier_stats s = KVO_REMOTE_TIER_STATS_INIT;
    ASSERT_OK(kvo_remote_tier_get_stats(t, &s));
    return s;
}

/* Port of the master owning key k (EXISTS answers 1 there: k is stored). */
static inline int owner_port(kvo_remote_tier *t, int base, const kvo_chunk_key *k) {
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

static inline void node_id(int port, char out[64]) {
    char *o = NULL;
    ASSERT_EQ_INT(rcli(port, NULL, "cluster myid", &o), 0);
    ASSERT_NOT_NULL(o);
    size_t n = strcspn(o, "\r\n");
    ASSERT_TRUE(n > 0 && n < 64);
    memcpy(out, o, n);
    out[n] = 0;
    free(o);
}

static inline bool is_master(int port) {
    char *role = NULL;
    rcli(port, NULL, "role", &role);
    bool m = role && !strncmp(role, "master", 6);
    free(role);
    return m;
}

static inline bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}


#endif
