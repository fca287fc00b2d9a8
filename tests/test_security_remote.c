/* The remote tier against hostile or broken servers and leaky secrets
 * (issue 25 items 2, 4, 9):
 *  - a node that trickles its replies one byte at a time, each gap well under
 *    io_timeout_ms: create, a GET and a pipelined batch still end within
 *    their deadlines (per reply, per operation, per create) with KVO_EIO and
 *    the node is marked down (before, the gaps reset the timeout and a GET
 *    was held for as long as the node liked);
 *  - a password with '@' (raw or percent-encoded) reaches AUTH intact and is
 *    in no error message nor log line, also from `kvoffload bench remote`,
 *    which says that the password was refused; no malformed URL shape shows
 *    it either, and a URL with a password is warned about once;
 *  - a value of another type under a tier key (WRONGTYPE) is corrupt:
 *    counted, deleted, a miss.
 * A small Redis look-alike runs in the test on a loopback port: it answers
 * AUTH, CLUSTER SLOTS (all slots on itself), GET, SET, EXISTS and DEL, and
 * can trickle chosen replies.  The WRONGTYPE test also runs against the
 * shared cluster (KVO_TEST_REDIS) when there is one. */
#include "remote_test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>

/* ------------------------------------------------- the fake server -- */

#define FAKE_CONNS 32

typedef struct fake {
    int lfd, port;
    pthread_t th;
    atomic_bool stop;
    /* behaviour (set before start) */
    int gap_ms;                 /* trickle: milliseconds between two bytes */
    bool trickle_slots, trickle_get;
    const char *user, *password; /* AUTH must match (password NULL: none) */
    const char *get_reply;      /* RESP of every GET reply; NULL: nil */
    /* what happened */
    atomic_int auth_ok, auth_bad, gets, dels, conns;
    pthread_t conn_th[FAKE_CONNS];
    int conn_fd[FAKE_CONNS];
    atomic_int n_conn;
} fake;

typedef struct conn_arg {
    fake *f;
    int fd;
} conn_arg;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Send s (len bytes), one byte per gap when trickling.  false: peer gone. */
static bool send_reply(fake *f, int fd, const char *s, size_t len, bool trickle) {
    if (!trickle) return send(fd, s, len, MSG_NOSIGNAL) == (ssize_t)len;
    for (size_t i = 0; i < len && !atomic_load(&f->stop); i++) {
        if (send(fd, s + i, 1, MSG_NOSIGNAL) != 1) return false;
        sleep_ms(f->gap_ms);
    }
    return true;
}

/* One RESP array of bulk strings from buf[0..len): argc/argv (pointers into
 * buf, lengths in alen); returns the bytes used, 0 when incomplete, -1 when
 * malformed. */
static long parse_cmd(const char *buf, size_t len, int *argc, const char **argv, size_t *alen) {
    size_t off = 0;
    if (len < 4 || buf[0] != '*') return len && buf[0] != '*' ? -1 : 0;
    char *end;
    const char *nl = memchr(buf, '\n', len);
    if (!nl) return 0;
    long n = strtol(buf + 1, &end, 10);
    if (n <= 0 || n > 8) return -1;
    off = (size_t)(nl - buf) + 1;
    for (long i = 0; i < n; i++) {
        if (off >= len) return 0;
        if (buf[off] != '$') return -1;
        nl = memchr(buf + off, '\n', len - off);
        if (!nl) return 0;
        long l = strtol(buf + off + 1, &end, 10);
        if (l < 0) return -1;
        off = (size_t)(nl - buf) + 1;
        if (off + (size_t)l + 2 > len) return 0;
        argv[i] = buf + off;
        alen[i] = (size_t)l;
        off += (size_t)l + 2;
    }
    *argc = (int)n;
    return (long)off;
}

static bool arg_is(const char *a, size_t l, const char *s) { return l == strlen(s) && !strncasecmp(a, s, l); }

static void *conn_main(void *p) {
    conn_arg *ca = p;
    fake *f = ca->f;
    int fd = ca->fd;
    free(ca);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    bool authed = f->password == NULL;
    while (!atomic_load(&f->stop)) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        ssize_t r = recv(fd, buf + len, cap - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
        for (;;) {
            int argc = 0;
            const char *argv[8];
            size_t alen[8];
            long used = parse_cmd(buf, len, &argc, argv, alen);
            if (used < 0) goto out;
            if (used == 0) break;
            char out[512];
            const char *reply = out;
            bool trickle = false;
            if (arg_is(argv[0], alen[0], "AUTH")) {
                const char *u = argc == 3 ? argv[1] : "default", *pw = argv[argc - 1];
                size_t ul = argc == 3 ? alen[1] : 7, pl = alen[argc - 1];
                const char *want_u = f->user ? f->user : "default";
                bool ok = f->password && ul == strlen(want_u) && !memcmp(u, want_u, ul) && pl == strlen(f->password) &&
                          !memcmp(pw, f->password, pl);
                atomic_fetch_add(ok ? &f->auth_ok : &f->auth_bad, 1);
                authed |= ok;
                reply = ok ? "+OK\r\n" : "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
            } else if (!authed) {
                reply = "-NOAUTH Authentication required.\r\n";
            } else if (arg_is(argv[0], alen[0], "CLUSTER")) {
                snprintf(out, sizeof out, "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n", f->port);
                trickle = f->trickle_slots;
            } else if (arg_is(argv[0], alen[0], "GET")) {
                atomic_fetch_add(&f->gets, 1);
                reply = f->get_reply ? f->get_reply : "$-1\r\n";
                trickle = f->trickle_get;
            } else if (arg_is(argv[0], alen[0], "DEL")) {
                atomic_fetch_add(&f->dels, 1);
                reply = ":1\r\n";
            } else if (arg_is(argv[0], alen[0], "EXISTS")) {
                reply = ":0\r\n";
            } else if (arg_is(argv[0], alen[0], "SET") || arg_is(argv[0], alen[0], "ASKING")) {
                reply = "+OK\r\n";
            } else {
                reply = "-ERR unknown command\r\n";
            }
            if (!send_reply(f, fd, reply, strlen(reply), trickle)) goto out;
            memmove(buf, buf + used, len - (size_t)used);
            len -= (size_t)used;
        }
        if (len == cap) break;
    }
out:
    free(buf);
    return NULL;
}

static void *accept_main(void *p) {
    fake *f = p;
    while (!atomic_load(&f->stop)) {
        struct pollfd pf = {f->lfd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0) continue;
        int i = atomic_load(&f->n_conn);
        if (i == FAKE_CONNS) {
            close(fd);
            continue;
        }
        atomic_fetch_add(&f->conns, 1);
        conn_arg *ca = malloc(sizeof *ca);
        ca->f = f;
        ca->fd = fd;
        f->conn_fd[i] = fd;
        if (pthread_create(&f->conn_th[i], NULL, conn_main, ca) != 0) {
            free(ca);
            close(fd);
            continue;
        }
        atomic_store(&f->n_conn, i + 1);
    }
    return NULL;
}

/* Listen on an ephemeral loopback port and serve. */
static void fake_start(fake *f) {
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_TRUE(f->lfd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ_INT(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    ASSERT_EQ_INT(listen(f->lfd, 16), 0);
    socklen_t sl = sizeof a;
    ASSERT_EQ_INT(getsockname(f->lfd, (struct sockaddr *)&a, &sl), 0);
    f->port = ntohs(a.sin_port);
    ASSERT_EQ_INT(pthread_create(&f->th, NULL, accept_main, f), 0);
}

static void fake_stop(fake *f) {
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    int n = atomic_load(&f->n_conn);
    for (int i = 0; i < n; i++) {
        pthread_join(f->conn_th[i], NULL);
        close(f->conn_fd[i]);
    }
    close(f->lfd);
}

static kvo_remote_tier_params fake_params(const kvo_plan *plan, const char *url) {
    kvo_remote_tier_params p = kvo_remote_tier_default_params();
    p.url = url;
    p.plan = plan;
    p.key_prefix = "kvosec";
    p.io_threads = 1;
    p.connect_timeout_ms = 1000;
    p.io_timeout_ms = 300;
    p.down_backoff_ms = 60000; /* a node marked down stays down in the test */
    p.max_redirects = 1;
    return p;
}

/* A tier on the fake (batch_max 0: the default). */
static kvo_remote_tier *fake_tier(const fake *f, const kvo_plan *plan, uint32_t batch_max) {
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
    kvo_remote_tier_params p = fake_params(plan, url);
    p.batch_max = batch_max;
    kvo_remote_tier *t = NULL;
    ASSERT_OK(kvo_remote_tier_create(&p, &t));
    return t;
}

static void need_redis_build(void) {
#if !KVO_HAVE_REDIS
    SKIP("built without hiredis");
#endif
}

/* One GET of key i; the completion's result. */
static int get_one(kvo_remote_tier *t, const kvo_plan *plan, uint64_t i) {
    unsigned char *buf = malloc(chunk_bytes(plan));
    kvo_chunk_key k = ftf_key(i, 0);
    void *dst = buf;
    int r = 1;
    ASSERT_OK(kvo_remote_tier_get(t, &k, &dst, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(60000)));
    kvo_remote_completion c;
    size_t n = 0;
    ASSERT_OK(kvo_remote_tier_poll(t, &c, 1, &n));
    ASSERT_EQ_U64(n, 1);
    free(buf);
    return c.result;
}

/* ------------------------------------------------- item 2: deadlines -- */

/* The slot map trickles in (about 50 bytes, 50 ms apart: 2.5 s against an
 * io_timeout_ms of 300): create gives up on that node with KVO_EIO. */
KVO_TEST(trickled_cluster_slots_fail_create) {
    need_redis_build();
    fake f = {.gap_ms = 50, .trickle_slots = true};
    fake_start(&f);
    kvo_plan *plan = make_plan();
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f.port);
    kvo_remote_tier_params p = fake_params(plan, url);
    kvo_remote_tier *t = NULL;
    int rc = kvo_remote_tier_create(&p, &t);
    if (rc == 0) kvo_remote_tier_destroy(t);
    fake_stop(&f);
    ASSERT_EQ_INT(rc, KVO_EIO);
    ASSERT_NULL(t);
    ASSERT_CONTAINS(kvo_last_error(), "127.0.0.1");
    ASSERT_CONTAINS(kvo_last_error(), "timed out");
    kvo_plan_destroy(plan);
}

/* A GET whose reply trickles (a 100-byte value, 50 ms a byte: 5 s) ends with
 * KVO_EIO at its deadline, not with whatever the node finally sends (the
 * wrong-length value would have been KVO_ECORRUPT); the node is marked down,
 * so the next GET fails at once without reaching it. */
KVO_TEST(trickled_get_reply_hits_its_deadline) {
    need_redis_build();
    static char value[160];
    snprintf(value, sizeof value, "$100\r\n%0100d\r\n", 0);
    fake f = {.gap_ms = 50, .trickle_get = true, .get_reply = value};
    fake_start(&f);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = fake_tier(&f, plan, 0);
    int r1 = get_one(t, plan, 1);
    kvo_remote_tier_stats s = stats(t);
    int gets_seen = atomic_load(&f.gets);
    int r2 = get_one(t, plan, 2);
    int gets_after = atomic_load(&f.gets);
    kvo_remote_tier_destroy(t);
    fake_stop(&f);
    ASSERT_EQ_INT(r1, KVO_EIO);
    ASSERT_GE_U64(s.node_failures, 1);
    ASSERT_EQ_U64(s.nodes_down, 1);
    ASSERT_EQ_U64(s.corrupt_deleted, 0);
    ASSERT_EQ_INT(r2, KVO_EIO);
    ASSERT_EQ_INT(gets_after, gets_seen); /* down: not asked again */
    kvo_plan_destroy(plan);
}

/* A pipelined batch of 16 GETs whose nil replies each trickle in 200 ms
 * (5 bytes, 40 ms apart: every reply inside io_timeout_ms = 300) takes 3.2 s
 * in all; the operation's deadline, (max_redirects + 1) x io_timeout_ms =
 * 600 ms, ends the ones still unanswered with KVO_EIO instead of letting the
 * node hold them. */
KVO_TEST(trickled_batch_hits_the_operation_deadline) {
    need_redis_build();
    fake f = {.gap_ms = 40, .trickle_get = true};
    fake_start(&f);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = fake_tier(&f, plan, 16);
    enum { N = 16 };
    uint64_t cb = chunk_bytes(plan);
    unsigned char *bufs = malloc(N * cb);
    kvo_chunk_key keys[N];
    void *dsts[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key((uint64_t)i + 100, 0);
        dsts[i] = bufs + (size_t)i * cb;
    }
    size_t q = 0;
    ASSERT_OK(kvo_remote_tier_get(t, keys, dsts, N, NULL, res, &q));
    ASSERT_EQ_U64(q, N);
    size_t eio = 0, done = 0;
    while (done < N) {
        ASSERT_OK(kvo_remote_tier_wait(t, KVO_MS(60000)));
        kvo_remote_completion c[N];
        size_t m = 0;
        ASSERT_OK(kvo_remote_tier_poll(t, c, N, &m));
        for (size_t j = 0; j < m; j++) {
            ASSERT_TRUE(c[j].result == KVO_ENOTFOUND || c[j].result == KVO_EIO);
            eio += c[j].result == KVO_EIO;
        }
        done += m;
    }
    kvo_remote_tier_stats s = stats(t);
    kvo_remote_tier_destroy(t);
    fake_stop(&f);
    free(bufs);
    ASSERT_GT_U64(eio, 0);
    ASSERT_GE_U64(s.node_failures, 1);
    kvo_plan_destroy(plan);
}

/* --------------------------------------------- item 4: '@' in a secret -- */

static char *log_lines;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void capture_log(kvo_log_level level, const char *msg, void *ctx) {
    (void)level;
    (void)ctx;
    pthread_mutex_lock(&log_mu);
    size_t have = log_lines ? strlen(log_lines) : 0, add = strlen(msg);
    char *n = realloc(log_lines, have + add + 2);
    if (n) {
        memcpy(n + have, msg, add);
        n[have + add] = '\n';
        n[have + add + 1] = 0;
        log_lines = n;
    }
    pthread_mutex_unlock(&log_mu);
}

static void assert_no_secret(const char *text, const char *secret) {
    if (text && strstr(text, secret)) FAILF("the secret '%s' leaked: %s", secret, text);
}

/* Create against the fake with url; the result code.  Stats, the error
 * message and the log must never contain `secret`. */
static int create_with(fake *f, const kvo_plan *plan, const char *url, const char *secret) {
    kvo_remote_tier_params p = fake_params(plan, url);
    kvo_remote_tier *t = NULL;
    int rc = kvo_remote_tier_create(&p, &t);
    assert_no_secret(kvo_last_error(), secret);
    if (rc == 0) {
        ASSERT_EQ_INT(get_one(t, plan, 7), KVO_ENOTFOUND); /* it works */
        kvo_remote_tier_destroy(t);
    }
    (void)f;
    return rc;
}

KVO_TEST(password_with_at_sign_reaches_auth) {
    need_redis_build();
    kvo_set_log(capture_log, NULL, KVO_LOG_DEBUG);
    unsetenv("KVO_REDIS_PASSWORD");
    unsetenv("KVO_REDIS_USER");
    fake f = {.password = "Secret@99"};
    fake_start(&f);
    kvo_plan *plan = make_plan();
    char url[256];
    snprintf(url, sizeof url, "redis://:Secret@99@127.0.0.1:%d", f.port); /* raw '@' */
    ASSERT_OK(create_with(&f, plan, url, "Secret"));
    snprintf(url, sizeof url, "redis://:Secret%%4099@127.0.0.1:%d", f.port); /* percent-encoded */
    ASSERT_OK(create_with(&f, plan, url, "Secret"));
    ASSERT_GE_INT(atomic_load(&f.auth_ok), 2);
    ASSERT_EQ_INT(atomic_load(&f.auth_bad), 0);
    /* a wrong one is refused, by name of node and user, without itself */
    snprintf(url, sizeof url, "redis://:Wrong@Secret@127.0.0.1:%d", f.port);
    ASSERT_ERR(create_with(&f, plan, url, "Secret"), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "authentication refused");
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", f.port);
    ASSERT_CONTAINS(kvo_last_error(), where);
    fake_stop(&f);
    /* an ACL user and a password with '@' and ':' */
    fake g = {.user = "alice", .password = "p:w@d"};
    fake_start(&g);
    snprintf(url, sizeof url, "redis://alice:p:w@d@127.0.0.1:%d", g.port);
    ASSERT_OK(create_with(&g, plan, url, "p:w@d"));
    snprintf(url, sizeof url, "redis://alice:p%%3Aw%%40d@127.0.0.1:%d", g.port);
    ASSERT_OK(create_with(&g, plan, url, "p:w@d"));
    ASSERT_EQ_INT(atomic_load(&g.auth_bad), 0);
    fake_stop(&g);
    kvo_set_log(NULL, NULL, KVO_LOG_INFO);
    assert_no_secret(log_lines, "Secret");
    assert_no_secret(log_lines, "p:w@d");
    free(log_lines);
    log_lines = NULL;
    kvo_plan_destroy(plan);
}

/* Nobody listens: the message names the host and port only. */
KVO_TEST(unreachable_node_message_has_no_password) {
    need_redis_build();
    kvo_plan *plan = make_plan();
    kvo_remote_tier_params p = fake_params(plan, "redis://:pw@Secret99@127.0.0.1:1");
    kvo_remote_tier *t = NULL;
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
    assert_no_secret(kvo_last_error(), "Secret99");
    ASSERT_CONTAINS(kvo_last_error(), "127.0.0.1:1");
    /* a bad percent escape is refused without echoing the secret */
    p.url = "redis://:Secret99%zz@127.0.0.1:1";
    ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
    assert_no_secret(kvo_last_error(), "Secret99");
    ASSERT_CONTAINS(kvo_last_error(), "percent");
    kvo_plan_destroy(plan);
}

/* No URL shape shows its password (issue 50 item 6): a forgotten "@host"
 * ("redis://user:PASSWORD" made the password a port and printed it), a
 * forgotten "user:", misplaced separators, a missing port; neither in the
 * error, nor in the log, nor from `kvoffload bench remote` and `kvoffload
 * demo`.  A URL that does carry a password is warned about once per
 * process, the warning pointing to KVO_REDIS_PASSWORD. */
#define URL_PW "Zq9PwLeak"
KVO_TEST(no_url_shape_shows_the_password) {
    need_redis_build();
    kvo_set_log(capture_log, NULL, KVO_LOG_DEBUG);
    kvo_plan *plan = make_plan();
    static const char *bad[] = {
        "redis://user:" URL_PW,                   /* the '@host' forgotten */
        "redis://" URL_PW,                        /* a bare password */
        "redis://:" URL_PW,
        "redis://user:" URL_PW ",127.0.0.1:1",
        "redis://user:" URL_PW "%",
        "redis://user:" URL_PW "/x",
        "redis://us er:" URL_PW,
        "redis://" URL_PW ":" URL_PW,
        "redis://user:" URL_PW "@",
        "redis://user:" URL_PW "@:7000",
        "redis://user:" URL_PW "@127.0.0.1",
        "redis://user:" URL_PW "@127.0.0.1:" URL_PW,
        "redis://user:" URL_PW "@127.0.0.1:1," URL_PW,
        "redis://user:" URL_PW "@127.0.0.1:1,h:" URL_PW,
        "redis://user:" URL_PW "%zz@127.0.0.1:1",
        "rediss://user:" URL_PW "@127.0.0.1:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvo_remote_tier_params p = fake_params(plan, bad[i]);
        kvo_remote_tier *t = NULL;
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EINVAL);
        ASSERT_NULL(t);
        if (strstr(kvo_last_error(), "Zq9")) FAILF("url %zu: the password leaked: %s", i, kvo_last_error());
    }
    /* well formed with a password, nobody listening: EIO naming the node;
     * the warning once, whatever the number of tiers */
    for (int i = 0; i < 2; i++) {
        kvo_remote_tier_params p = fake_params(plan, "redis://user:" URL_PW "@127.0.0.1:1");
        kvo_remote_tier *t = NULL;
        ASSERT_ERR(kvo_remote_tier_create(&p, &t), KVO_EIO);
        ASSERT_CONTAINS(kvo_last_error(), "127.0.0.1:1");
        assert_no_secret(kvo_last_error(), "Zq9");
    }
    kvo_set_log(NULL, NULL, KVO_LOG_INFO);
    assert_no_secret(log_lines, "Zq9");
    ASSERT_CONTAINS(log_lines, "KVO_REDIS_PASSWORD");
    const char *w = strstr(log_lines, "carries a password");
    ASSERT_NOT_NULL(w);
    ASSERT_TRUE(strstr(w + 1, "carries a password") == NULL); /* once */
    free(log_lines);
    log_lines = NULL;
    /* the command-line tools print the library's messages */
    static const char *cmds[] = {"bench remote --remote 'redis://user:" URL_PW "' --total-mib 1 --sizes 256 --reps 1",
                                 "demo --remote 'redis://user:" URL_PW "' --requests 2 --quiet"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[600], *out = NULL;
        snprintf(cmd, sizeof cmd, "env -u KVO_REDIS_PASSWORD %s %s 2>&1", KVO_CLI_PATH, cmds[i]);
        int rc = kvo_test_run(cmd, &out);
        ASSERT_NE_INT(rc, 0);
        ASSERT_NOT_NULL(out);
        if (strstr(out, "Zq9")) FAILF("`kvoffload %s` shows the password: %s", cmds[i], out);
        ASSERT_CONTAINS(out, "port");
        free(out);
    }
    kvo_plan_destroy(plan);
}

/* `kvoffload bench remote` with a wrong password says so (not only "cannot
 * read CLUSTER SLOTS") and never prints it. */
KVO_TEST(bench_remote_says_password_refused) {
    need_redis_build();
    fake f = {.password = "Right@Pw"};
    fake_start(&f);
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "env -u KVO_REDIS_PASSWORD %s bench remote --remote 'redis://:Wr0ng@Guess@127.0.0.1:%d' --total-mib 1 "
             "--sizes 256 --reps 1 2>&1",
             KVO_CLI_PATH, f.port);
    int rc = kvo_test_run(cmd, &out);
    fake_stop(&f);
    ASSERT_NE_INT(rc, 0);
    ASSERT_NOT_NULL(out);
    assert_no_secret(out, "Guess");
    assert_no_secret(out, "Wr0ng");
    ASSERT_CONTAINS(out, "password");
    ASSERT_CONTAINS(out, "refused");
    ASSERT_GE_INT(atomic_load(&f.auth_bad), 1);
    ASSERT_EQ_INT(atomic_load(&f.auth_ok), 0);
    free(out);
}

/* ------------------------------------------------ item 9: WRONGTYPE -- */

/* The fake answers GET with WRONGTYPE: a corrupt value, counted, deleted. */
KVO_TEST(wrongtype_is_corrupt_counted_deleted) {
    need_redis_build();
    fake f = {.get_reply = "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"};
    fake_start(&f);
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = fake_tier(&f, plan, 0);
    int r = get_one(t, plan, 3);
    kvo_remote_tier_stats s = stats(t);
    kvo_remote_tier_destroy(t);
    fake_stop(&f);
    ASSERT_EQ_INT(r, KVO_ECORRUPT);
    ASSERT_EQ_U64(s.corrupt_deleted, 1);
    ASSERT_EQ_U64(s.read_errors, 0);
    ASSERT_EQ_U64(s.node_failures, 0); /* the node is fine */
    ASSERT_EQ_INT(atomic_load(&f.dels), 1);
    kvo_plan_destroy(plan);
}

/* The same on a real cluster: a list under a tier key. */
KVO_TEST(wrongtype_on_the_shared_cluster) {
    int port = shared_port();
    kvo_plan *plan = make_plan();
    kvo_remote_tier *t = open_tier(port, plan, "wrongtype", NULL);
    kvo_chunk_key k = ftf_key(42, 0);
    char name[160], args[400];
    ASSERT_OK(kvo_remote_tier_key_name(t, &k, name, sizeof name));
    snprintf(args, sizeof args, "-c rpush %s not-a-chunk", name);
    ASSERT_EQ_INT(rcli(port, NULL, args, NULL), 0);
    int res[1];
    ASSERT_EQ_U64(get_range(t, plan, 42, 1, res), 0);
    ASSERT_EQ_INT(res[0], KVO_ECORRUPT);
    kvo_remote_tier_stats s = stats(t);
    ASSERT_EQ_U64(s.corrupt_deleted, 1);
    ASSERT_EQ_U64(s.read_errors, 0);
    ASSERT_EQ_INT(exists_one(t, &k), KVO_ENOTFOUND); /* deleted */
    /* and the key is usable again */
    ASSERT_EQ_U64(put_range(t, plan, 42, 1), 1);
    ASSERT_EQ_U64(get_range(t, plan, 42, 1, res), 1);
    kvo_remote_tier_destroy(t);
    kvo_plan_destroy(plan);
}
