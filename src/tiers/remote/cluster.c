/*
 * A Redis Cluster client over hiredis (0.14 has no cluster support).
 *
 * Routing
 *   A key's slot is CRC16-XMODEM of the key (or of its hash tag: the bytes
 *   between the first '{' and the next '}', when not empty) mod 16384.  The
 *   slot map (slot -> node index, 16384 x u16) comes from CLUSTER SLOTS at
 *   create and is reloaded after a MOVED, a node failure, or while a node is
 *   in backoff (at most every 200 ms).  A MOVED reply also patches the one
 *   slot at once, so the retry goes to the right node even before the reload.
 *   An ASK reply (a slot being migrated) retries that command alone on the
 *   named node, prefixed by ASKING, without touching the map.
 *
 * Nodes
 *   An append-only table of at most 128 nodes (host:port), never freed
 *   before destroy, so indices stay valid without reference counts.  Each
 *   node keeps a small pool of idle connections (a stack under its own
 *   mutex); a worker takes one for a batch and gives it back.  A node that
 *   fails (connect error, I/O error, timeout) has its pool emptied and is
 *   marked down until now + backoff (doubling per consecutive failure, up to
 *   16x); commands routed to it meanwhile fail at once with KVO_EIO (the
 *   tier's callers treat that as a miss / a dropped store), which is what
 *   keeps an engine from stalling on a dead node.  The first success clears
 *   the backoff.
 *
 * Pipelines
 *   exec groups a batch by node, writes every node's commands with writev
 *   straight from the callers' buffers (a SET's value is never copied into a
 *   hiredis output buffer), then reads every node's replies in order
 *   (reply.c's kvo__rc_get_reply).  Replies are small for SET and EXISTS, so
 *   writing all before reading cannot deadlock; GET requests are tiny.
 *   Deadlines, not per-recv timeouts (a node that trickles its bytes must
 *   not hold anyone): each reply within io_timeout_ms of being awaited, each
 *   batch within (max_redirects + 1) x io_timeout_ms of being sent, AUTH and
 *   CLUSTER SLOTS within io_timeout_ms each, so a seed tried at create costs
 *   at most connect_timeout_ms + 2 x io_timeout_ms.  A node past a deadline
 *   is marked down like a failed one.
 *
 * Locking
 *   c->mu guards the slot map and node table (held for routing only, never
 *   across I/O); node->mu guards a pool and backoff; refresh_mu serialises
 *   reloads (trylock: a thread that finds one running skips its own).
 *
 * Credentials are kept in the config only; error messages name the node and
 * user, never the password.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "tiers/remote/remote_internal.h"

typedef struct rc_node {
    char host[KVO__RC_HOST_MAX];
    int port;
    pthread_mutex_t mu;
    redisContext **idle;
    uint32_t n_idle;
    uint64_t down_until_ns;
    uint32_t fails;
} rc_node;

struct kvo__rc {
    kvo__rc_cfg cfg;
    pthread_mutex_t mu;
    uint16_t *slots;          /* node index per slot, UINT16_MAX = unknown */
    rc_node *nodes;
    _Atomic uint32_t n_nodes; /* entries below are initialised */
    pthread_mutex_t refresh_mu;
    uint16_t *scratch;        /* refresh's slot map under construction */
    _Atomic uint64_t last_refresh_ns;
    atomic_bool want_refresh;
    kvo__rc_counters ctr;
};

/* ------------------------------------------------------------ slots -- */

static uint16_t crc16_table[256];
static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;

static void crc16_init(void) {
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++) c = (uint16_t)((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
        crc16_table[i] = c;
    }
}

static uint16_t crc16(const char *p, size_t n) {
    pthread_once(&crc16_once, crc16_init);
    uint16_t c = 0;
    for (size_t i = 0; i < n; i++) c = (uint16_t)((c << 8) ^ crc16_table[((c >> 8) ^ (unsigned char)p[i]) & 0xff]);
    return c;
}

uint32_t kvo__rc_slot(const char *key, size_t len) {
    size_t s, e;
    for (s = 0; s < len && key[s] != '{'; s++) {}
    if (s < len) {
        for (e = s + 1; e < len && key[e] != '}'; e++) {}
        if (e < len && e != s + 1) return crc16(key + s + 1, e - s - 1) & (KVO__RC_SLOTS - 1);
    }
    return crc16(key, len) & (KVO__RC_SLOTS - 1);
}

/* -------------------------------------------------------------- URL -- */

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode s[0..n) into out (cap bytes, NUL-terminated).  Messages
 * name the field, never its bytes. */
static int url_decode(const char *s, size_t n, char *out, size_t cap, const char *what) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '%') {
            int hi = i + 2 < n ? hex_digit(s[i + 1]) : -1, lo = i + 2 < n ? hex_digit(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return kvo__error(KVO_EINVAL, "remote tier: a bad percent-escape in the url's %s (write %%XX: %%40 "
                                  "for '@', %%3A for ':', %%25 for '%%'; %%00 is refused)", what);
            ch = (char)(hi * 16 + lo);
            i += 2;
        }
        if (o + 1 >= cap)
            return kvo__error(KVO_EINVAL, "remote tier: %s in the url longer than %zu bytes", what, cap - 1);
        out[o++] = ch;
    }
    out[o] = 0;
    return 0;
}

/* A host name, an IPv4 address or "localhost": letters, digits, '.', '-'
 * and '_' only.  Anything else may be part of a mistyped password, so it is
 * refused without being shown. */
static bool host_chars_ok(const char *h, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == '_'))
            return false;
    }
    return true;
}

/* redis://[user[:password]@]host:port,...  The credentials end at the LAST
 * '@' (a host never holds one, a password may) and split at their first ':'
 * (a user name has none); without ':' the whole is a password (AUTH pass).
 * Both are percent-decoded.  Every seed needs its port: without one,
 * "redis://user:PASSWORD" (the '@host' forgotten) would be the host "user"
 * with the port "PASSWORD", or "redis://PASSWORD" a host.  Messages never
 * show the credentials, a port's text or a host that is not made of host
 * name characters: a malformed URL is described by position only. */
static int url_parse(const char *url, kvo__rc_url *out) {
    if (!url || strncmp(url, "redis://", 8) != 0)
        return kvo__error(KVO_EINVAL, "remote tier: url must look like redis://[user:pass@]host:port[,host:port...]");
    const char *p = url + 8, *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        int rc = 0;
        if (colon) rc = url_decode(p, (size_t)(colon - p), out->user, sizeof out->user, "user");
        if (!rc)
            rc = colon ? url_decode(colon + 1, (size_t)(at - colon - 1), out->pass, sizeof out->pass, "password")
                       : url_decode(p, (size_t)(at - p), out->pass, sizeof out->pass, "password");
        if (rc) return rc;
        p = at + 1;
    }
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        size_t hl = colon ? (size_t)(colon - p) : len;
        if (out->n_seeds == KVO__RC_MAX_SEEDS)
            return kvo__error(KVO_EINVAL, "remote tier: more than %u seed nodes in the url", KVO__RC_MAX_SEEDS);
        int rc = 0;
        if (hl == 0 || hl >= KVO__RC_HOST_MAX)
            rc = kvo__error(KVO_EINVAL, "remote tier: seed %zu of the url has an empty or too long host "
                            "(want host:port, e.g. 127.0.0.1:7000)", out->n_seeds + 1);
        else if (!host_chars_ok(p, hl))
            rc = kvo__error(KVO_EINVAL, "remote tier: seed %zu of the url has a host with characters a host name "
                            "cannot have (want host:port; credentials go before an '@': "
                            "redis://user:password@host:port, '@' in a password as %%40)", out->n_seeds + 1);
        else if (!colon)
            rc = kvo__error(KVO_EINVAL, "remote tier: seed %zu of the url has no port (want host:port, e.g. "
                            "127.0.0.1:7000; credentials go before an '@')", out->n_seeds + 1);
        long port = 0;
        if (!rc) {
            char num[16] = {0}, *ep;
            size_t nl = len - hl - 1;
            if (nl > 0 && nl < sizeof num) {
                memcpy(num, colon + 1, nl);
                port = strtol(num, &ep, 10);
                if (*ep) port = 0;
            }
            memset(num, 0, sizeof num);
            if (port <= 0 || port > 65535)
                rc = kvo__error(KVO_EINVAL, "remote tier: seed %zu of the url has a bad port (want host:port with "
                                "a port of 1..65535; credentials go before an '@')", out->n_seeds + 1);
        }
        if (rc) return rc;
        memcpy(out->host[out->n_seeds], p, hl);
        out->port[out->n_seeds++] = (int)port;
        p += len;
        if (*p == ',') p++;
    }
    if (out->n_seeds == 0)
        return kvo__error(KVO_EINVAL, "remote tier: no host:port in the url (e.g. redis://127.0.0.1:7000)");
    return 0;
}

int kvo__rc_url_parse(const char *url, kvo__rc_url *out) {
    memset(out, 0, sizeof *out);
    int rc = url_parse(url, out);
    if (rc) memset(out, 0, sizeof *out); /* no copy of a password left behind */
    return rc;
}

/* ------------------------------------------------------ connections -- */

static struct timeval ms_tv(uint32_t ms) {
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    return tv;
}

/* Connect and authenticate.  NULL with a message (KVO_EIO) on failure. */
static redisContext *rc_connect(kvo__rc *c, const char *host, int port) {
    redisContext *ctx = redisConnectWithTimeout(host, port, ms_tv(c->cfg.connect_timeout_ms));
    if (!ctx) {
        kvo__error(KVO_EIO, "remote tier: cannot connect to %s:%d: out of memory", host, port);
        return NULL;
    }
    if (ctx->err) {
        kvo__error(KVO_EIO, "remote tier: cannot connect to %s:%d: %s", host, port, ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, ms_tv(c->cfg.io_timeout_ms));
    kvo__rc_reader_setup(ctx, c->cfg.max_value_bytes);
    redisEnableKeepAlive(ctx);
    if (c->cfg.url.pass[0]) {
        const char *argv[3] = {"AUTH", c->cfg.url.user, c->cfg.url.pass};
        int argc = c->cfg.url.user[0] ? 3 : 2;
        if (argc == 2) argv[1] = c->cfg.url.pass;
        redisReply *r = NULL;
        if (kvo__rc_command(ctx, (void **)&r, kvo__now_ns() + (uint64_t)c->cfg.io_timeout_ms * 1000000u, argc,
                            argv) != REDIS_OK || !r) {
            kvo__error(KVO_EIO, "remote tier: no answer to AUTH from %s:%d: %s", host, port, ctx->errstr);
            if (r) freeReplyObject(r);
            redisFree(ctx);
            return NULL;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            kvo__error(KVO_EIO, "remote tier: authentication refused by %s:%d for user '%s': %s (check the "
                       "password in the url or KVO_REDIS_PASSWORD)", host, port,
                       c->cfg.url.user[0] ? c->cfg.url.user : "default", r->str);
            freeReplyObject(r);
            redisFree(ctx);
            return NULL;
        }
        freeReplyObject(r);
    }
    return ctx;
}

static uint64_t backoff_ns(const kvo__rc *c, uint32_t fails) {
    uint32_t shift = fails > 5 ? 4 : (fails ? fails - 1 : 0);
    return ((uint64_t)c->cfg.down_backoff_ms << shift) * 1000000u;
}

/* Mark a node failed: empty its pool, back off. */
static void node_fail(kvo__rc *c, int ni) {
    rc_node *n = &c->nodes[ni];
    redisContext *drop[64];
    uint32_t nd = 0;
    pthread_mutex_lock(&n->mu);
    n->fails++;
    n->down_until_ns = kvo__now_ns() + backoff_ns(c, n->fails);
    while (n->n_idle && nd < 64) drop[nd++] = n->idle[--n->n_idle];
    pthread_mutex_unlock(&n->mu);
    for (uint32_t i = 0; i < nd; i++) redisFree(drop[i]);
    atomic_fetch_add(&c->ctr.node_failures, 1);
    atomic_store(&c->want_refresh, true);
}

static bool node_down(kvo__rc *c, int ni) {
    rc_node *n = &c->nodes[ni];
    pthread_mutex_lock(&n->mu);
    bool down = n->down_until_ns && kvo__now_ns() < n->down_until_ns;
    pthread_mutex_unlock(&n->mu);
    return down;
}

/* A connection to node ni: from its pool, or a new one.  NULL when down or
 * the connect failed (the node is then marked down). */
static redisContext *conn_take(kvo__rc *c, int ni) {
    rc_node *n = &c->nodes[ni];
    pthread_mutex_lock(&n->mu);
    if (n->n_idle) {
        redisContext *ctx = n->idle[--n->n_idle];
        pthread_mutex_unlock(&n->mu);
        return ctx;
    }
    pthread_mutex_unlock(&n->mu);
    if (node_down(c, ni)) return NULL;
    redisContext *ctx = rc_connect(c, n->host, n->port);
    if (!ctx) node_fail(c, ni);
    return ctx;
}

static void conn_give(kvo__rc *c, int ni, redisContext *ctx) {
    rc_node *n = &c->nodes[ni];
    pthread_mutex_lock(&n->mu);
    if (n->n_idle < c->cfg.conns_per_node) {
        n->idle[n->n_idle++] = ctx;
        n->fails = 0;
        n->down_until_ns = 0;
        ctx = NULL;
    }
    pthread_mutex_unlock(&n->mu);
    if (ctx) redisFree(ctx);
}

/* Index of host:port, added when new; -1 when the table is full.  Under
 * c->mu. */
static int node_index(kvo__rc *c, const char *host, size_t hl, int port) {
    uint32_t nn = atomic_load(&c->n_nodes);
    for (uint32_t i = 0; i < nn; i++)
        if (c->nodes[i].port == port && strlen(c->nodes[i].host) == hl && !memcmp(c->nodes[i].host, host, hl))
            return (int)i;
    if (nn == KVO__RC_MAX_NODES || hl >= KVO__RC_HOST_MAX) return -1;
    rc_node *n = &c->nodes[nn];
    memcpy(n->host, host, hl);
    n->host[hl] = 0;
    n->port = port;
    atomic_store(&c->n_nodes, nn + 1);
    return (int)nn;
}

/* ---------------------------------------------------------- refresh -- */

/* Parse a CLUSTER SLOTS reply into c->scratch.  0 or KVO_EIO. */
static int parse_slots(kvo__rc *c, redisReply *r, const char *from_host) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return kvo__error(KVO_EIO, "remote tier: CLUSTER SLOTS returned no slot ranges (cluster not set up?)");
    for (uint32_t s = 0; s < KVO__RC_SLOTS; s++) c->scratch[s] = UINT16_MAX;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 2 || e->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        redisReply *m = e->element[2];
        const char *h = m->element[0]->type == REDIS_REPLY_STRING && m->element[0]->len ? m->element[0]->str
                                                                                           : from_host;
        int ni = node_index(c, h, strlen(h), (int)m->element[1]->integer);
        if (ni < 0 || lo < 0 || hi >= KVO__RC_SLOTS || lo > hi) continue;
        for (long long s = lo; s <= hi; s++) c->scratch[s] = (uint16_t)ni;
    }
    memcpy(c->slots, c->scratch, KVO__RC_SLOTS * sizeof *c->slots);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* Ask one node for the slot map.  0 or KVO_EIO (message set). */
static int refresh_from(kvo__rc *c, int ni) {
    redisContext *ctx = conn_take(c, ni);
    if (!ctx) return KVO_EIO;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    redisReply *r = NULL;
    if (kvo__rc_command(ctx, (void **)&r, kvo__now_ns() + (uint64_t)c->cfg.io_timeout_ms * 1000000u, 2, argv) !=
            REDIS_OK || !r) {
        if (r) freeReplyObject(r);
        int rc = kvo__error(KVO_EIO, "remote tier: %s:%d: %s", c->nodes[ni].host, c->nodes[ni].port, ctx->errstr);
        redisFree(ctx);
        node_fail(c, ni);
        return rc;
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = kvo__error(KVO_EIO, "remote tier: CLUSTER SLOTS on %s:%d: %s%s", c->nodes[ni].host, c->nodes[ni].port,
                        r->str, !strncmp(r->str, "NOAUTH", 6) ? " (set a password in the url or KVO_REDIS_PASSWORD)"
                        : strstr(r->str, "cluster support disabled") ? " (start redis-server with "
                        "--cluster-enabled yes)" : "");
    else rc = parse_slots(c, r, c->nodes[ni].host);
    freeReplyObject(r);
    conn_give(c, ni, ctx);
    return rc;
}

/* Reload the slot map from the first node that answers (nodes not in
 * backoff first, then the seeds).  force: ignore the 200 ms rate limit. */
static int refresh(kvo__rc *c, bool force) {
    uint64_t now = kvo__now_ns();
    if (!force && now - atomic_load(&c->last_refresh_ns) < 200000000u) return 0;
    if (pthread_mutex_trylock(&c->refresh_mu) != 0) return 0;
    atomic_store(&c->want_refresh, false);
    atomic_store(&c->last_refresh_ns, now);
    atomic_fetch_add(&c->ctr.refreshes, 1);
    int rc = KVO_EIO;
    uint32_t nn = atomic_load(&c->n_nodes);
    for (int pass = 0; pass < 2 && rc != 0; pass++)
        for (uint32_t i = 0; i < nn && rc != 0; i++)
            if ((pass == 0) != node_down(c, (int)i)) rc = refresh_from(c, (int)i);
    pthread_mutex_unlock(&c->refresh_mu);
    return rc;
}

/* ------------------------------------------------------------ create -- */

int kvo__rc_create(const kvo__rc_cfg *cfg, kvo__rc **out) {
    kvo__rc *c = kvo__calloc(1, sizeof *c);
    if (!c) return kvo__error(KVO_ENOMEM, "remote tier: cluster client");
    c->cfg = *cfg;
    if (c->cfg.conns_per_node == 0) c->cfg.conns_per_node = 4;
    if (c->cfg.conns_per_node > 64) c->cfg.conns_per_node = 64; /* node_fail drops up to 64 */
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->refresh_mu, NULL);
    c->slots = kvo__malloc(KVO__RC_SLOTS * sizeof *c->slots);
    c->scratch = kvo__malloc(KVO__RC_SLOTS * sizeof *c->scratch);
    c->nodes = kvo__calloc(KVO__RC_MAX_NODES, sizeof *c->nodes);
    if (!c->slots || !c->scratch || !c->nodes) {
        kvo__rc_destroy(c);
        return kvo__error(KVO_ENOMEM, "remote tier: cluster client tables");
    }
    for (uint32_t i = 0; i < KVO__RC_MAX_NODES; i++) {
        pthread_mutex_init(&c->nodes[i].mu, NULL);
        c->nodes[i].idle = kvo__calloc(c->cfg.conns_per_node, sizeof(redisContext *));
        if (!c->nodes[i].idle) {
            atomic_store(&c->n_nodes, KVO__RC_MAX_NODES);
            kvo__rc_destroy(c);
            return kvo__error(KVO_ENOMEM, "remote tier: connection pools");
        }
    }
    for (uint32_t s = 0; s < KVO__RC_SLOTS; s++) c->slots[s] = UINT16_MAX;
    int rc = KVO_EIO;
    for (size_t i = 0; i < cfg->url.n_seeds && rc != 0; i++) {
        pthread_mutex_lock(&c->mu);
        int ni = node_index(c, cfg->url.host[i], strlen(cfg->url.host[i]), cfg->url.port[i]);
        pthread_mutex_unlock(&c->mu);
        rc = refresh_from(c, ni);
        /* a refused password is final: do not try it on every seed */
        if (rc != 0 && strstr(kvo_last_error(), "authentication refused")) break;
    }
    if (rc != 0) {
        atomic_store(&c->n_nodes, KVO__RC_MAX_NODES);
        kvo__rc_destroy(c);
        return rc;
    }
    atomic_store(&c->last_refresh_ns, kvo__now_ns());
    *out = c;
    return 0;
}

void kvo__rc_destroy(kvo__rc *c) {
    if (!c) return;
    if (c->nodes) {
        for (uint32_t i = 0; i < KVO__RC_MAX_NODES; i++) {
            rc_node *n = &c->nodes[i];
            if (n->idle)
                for (uint32_t k = 0; k < n->n_idle; k++) redisFree(n->idle[k]);
            kvo__free(n->idle);
            pthread_mutex_destroy(&n->mu);
        }
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->refresh_mu);
    kvo__free(c->nodes);
    kvo__free(c->slots);
    kvo__free(c->scratch);
    kvo__free(c);
}

const kvo__rc_counters *kvo__rc_stats(const kvo__rc *c) { return &c->ctr; }

void kvo__rc_nodes(kvo__rc *c, uint64_t *known, uint64_t *down) {
    uint32_t nn = atomic_load(&c->n_nodes), d = 0;
    for (uint32_t i = 0; i < nn; i++) d += node_down(c, (int)i);
    *known = nn;
    *down = d;
}

void kvo__rc_reply_free(void *reply) {
    if (reply) freeReplyObject(reply);
}

/* ------------------------------------------- for pipeline.c (exec) -- */


redisContext *kvo__rc_conn_take(kvo__rc *c, int ni) { return conn_take(c, ni); }
void kvo__rc_conn_give(kvo__rc *c, int ni, redisContext *ctx) { conn_give(c, ni, ctx); }
void kvo__rc_node_fail(kvo__rc *c, int ni) { node_fail(c, ni); }
uint32_t kvo__rc_max_redirects(const kvo__rc *c) { return c->cfg.max_redirects; }
uint64_t kvo__rc_io_timeout_ns(const kvo__rc *c) { return (uint64_t)c->cfg.io_timeout_ms * 1000000u; }

/* Down: also ask for a slot reload, so that a promoted replica is found
 * while the failed master is in backoff. */
bool kvo__rc_node_down(kvo__rc *c, int ni) {
    bool d = node_down(c, ni);
    if (d) atomic_store(&c->want_refresh, true);
    return d;
}

void kvo__rc_route(kvo__rc *c, kvo__rc_cmd *cmds, size_t n) {
    bool unknown = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].done || cmds[i].asking) continue;
        uint16_t ni = c->slots[cmds[i].slot & (KVO__RC_SLOTS - 1)];
        cmds[i].node = ni == UINT16_MAX ? -1 : ni;
        unknown |= ni == UINT16_MAX;
    }
    pthread_mutex_unlock(&c->mu);
    if (unknown) atomic_store(&c->want_refresh, true);
}

/* "host:port" of a MOVED/ASK reply: the node index (added when new), or -1.
 * MOVED also patches the slot and asks for a reload. */
int kvo__rc_redirect(kvo__rc *c, const char *target, int from_node, bool moved, uint32_t slot) {
    const char *colon = strrchr(target, ':');
    if (!colon) return -1;
    int port = atoi(colon + 1);
    if (port <= 0 || port > 65535) return -1;
    pthread_mutex_lock(&c->mu);
    int ni;
    if (colon == target) { /* empty host: the node that answered */
        const char *h = c->nodes[from_node].host;
        ni = node_index(c, h, strlen(h), port);
    } else {
        ni = node_index(c, target, (size_t)(colon - target), port);
    }
    if (ni >= 0 && moved) c->slots[slot & (KVO__RC_SLOTS - 1)] = (uint16_t)ni;
    pthread_mutex_unlock(&c->mu);
    if (moved) {
        atomic_fetch_add(&c->ctr.moved, 1);
        atomic_store(&c->want_refresh, true);
    } else {
        atomic_fetch_add(&c->ctr.asked, 1);
    }
    return ni;
}

void kvo__rc_maybe_refresh(kvo__rc *c) {
    if (atomic_load(&c->want_refresh)) refresh(c, false);
}

void kvo__rc_count_batch(kvo__rc *c) {
    atomic_fetch_add(&c->ctr.batches, 1);
}
