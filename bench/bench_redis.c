/* The raw Redis Cluster limit of the benchmarks (bench_redis.h). */
#if KVO_HAVE_REDIS
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "bench_redis.h"
#include "kvoffload/kvo_remote_tier.h"

/* Connect and authenticate; NULL with why (never the password) when why is
 * not NULL. */
static redisContext *kvo__br_connect(const kvo_bench_redis *m, const char *host, int port, char *why, size_t cap) {
    redisContext *ctx = redisConnect(host, port);
    if (!ctx || ctx->err) {
        if (why) snprintf(why, cap, "cannot connect to %s:%d: %s", host, port, ctx ? ctx->errstr : "out of memory");
        if (ctx) redisFree(ctx);
        return NULL;
    }
    if (m->url.pass[0]) {
        const char *argv[3] = {"AUTH", m->url.user, m->url.pass};
        int argc = m->url.user[0] ? 3 : 2;
        if (argc == 2) argv[1] = m->url.pass;
        redisReply *r = redisCommandArgv(ctx, argc, argv, NULL);
        bool ok = r && r->type != REDIS_REPLY_ERROR;
        if (!ok && why)
            snprintf(why, cap, "authentication refused by %s:%d for user '%s': %s (check the password in the url "
                     "or KVO_REDIS_PASSWORD)", host, port, m->url.user[0] ? m->url.user : "default",
                     r ? r->str : ctx->errstr);
        if (r) freeReplyObject(r);
        if (!ok) {
            redisFree(ctx);
            return NULL;
        }
    }
    return ctx;
}

int kvo_bench_redis_open(const char *url, kvo_bench_redis *m, char *why, size_t cap) {
    memset(m, 0, sizeof *m);
    if (kvo__rc_url_parse(url, &m->url)) {
        snprintf(why, cap, "%s", kvo_last_error());
        return KVO_EINVAL;
    }
    const char *u = getenv("KVO_REDIS_USER"), *pw = getenv("KVO_REDIS_PASSWORD");
    if (!m->url.user[0] && u) snprintf(m->url.user, sizeof m->url.user, "%s", u);
    if (!m->url.pass[0] && pw) snprintf(m->url.pass, sizeof m->url.pass, "%s", pw);
    redisContext *ctx = kvo__br_connect(m, m->url.host[0], m->url.port[0], why, cap);
    if (!ctx) return -1;
    redisReply *r = redisCommand(ctx, "CLUSTER SLOTS");
    int rc = -1;
    snprintf(why, cap, "cannot read CLUSTER SLOTS from %s:%d: %s", m->url.host[0], m->url.port[0],
             !r ? ctx->errstr : r->type == REDIS_REPLY_ERROR ? r->str : "not a slot map");
    if (r && r->type == REDIS_REPLY_ARRAY) {
        rc = 0;
        for (size_t i = 0; i < r->elements && rc == 0; i++) {
            redisReply *e = r->element[i], *node = e->element[2];
            int ni = -1;
            for (int k = 0; k < m->n; k++)
                if (m->port[k] == (int)node->element[1]->integer && !strcmp(m->host[k], node->element[0]->str)) ni = k;
            if (ni < 0) {
                if (m->n == 16) {
                    rc = -1;
                    break;
                }
                ni = m->n++;
                snprintf(m->host[ni], sizeof m->host[ni], "%s", node->element[0]->str);
                m->port[ni] = (int)node->element[1]->integer;
            }
            for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++) m->slot_node[s] = (uint8_t)ni;
        }
    }
    if (r) freeReplyObject(r);
    redisFree(ctx);
    return rc;
}

typedef struct kvo__br_arg {
    const kvo_bench_redis *m;
    uint32_t id, threads, batch;
    uint64_t n_keys, size;
    kvo_bench_redis_name_fn name;
    const void *ctx;
    const unsigned char *val; /* NULL: GET */
    uint64_t bytes;           /* out: value bytes moved */
    int failed;
} kvo__br_arg;

static void *kvo__br_thread(void *p) {
    kvo__br_arg *a = p;
    const kvo_bench_redis *m = a->m;
    redisContext *ctx[16] = {0};
    for (int k = 0; k < m->n; k++)
        if (!(ctx[k] = kvo__br_connect(m, m->host[k], m->port[k], NULL, 0))) a->failed = 1;
    int node_of[256];
    uint32_t batch = a->batch < 256 ? a->batch : 256;
    for (uint64_t i = a->id; i < a->n_keys && !a->failed;) {
        uint32_t nb = 0;
        for (; nb < batch && i < a->n_keys; nb++, i += a->threads) {
            char key[256];
            a->name(i, key, sizeof key, a->ctx);
            int ni = m->slot_node[kvo_remote_key_slot(key, strlen(key))];
            node_of[nb] = ni;
            const char *argv[3] = {a->val ? "SET" : "GET", key, (const char *)a->val};
            size_t lens[3] = {3, strlen(key), a->size};
            redisAppendCommandArgv(ctx[ni], a->val ? 3 : 2, argv, lens);
        }
        for (uint32_t b = 0; b < nb; b++) {
            redisReply *r = NULL;
            if (redisGetReply(ctx[node_of[b]], (void **)&r) != REDIS_OK || !r ||
                (!a->val && r->type != REDIS_REPLY_STRING)) {
                a->failed = 1;
                if (r) freeReplyObject(r);
                break;
            }
            if (r->type == REDIS_REPLY_STRING) a->bytes += r->len;
            else if (a->val && r->type == REDIS_REPLY_STATUS) a->bytes += a->size;
            freeReplyObject(r);
        }
    }
    for (int k = 0; k < m->n; k++)
        if (ctx[k]) redisFree(ctx[k]);
    return NULL;
}

double kvo_bench_redis_pass(const kvo_bench_redis *m, uint32_t threads, uint32_t batch, uint64_t n_keys,
                            kvo_bench_redis_name_fn name, const void *ctx, const unsigned char *val, uint64_t size,
                            uint64_t *bytes) {
    kvo__br_arg args[64];
    pthread_t th[64];
    if (threads > 64) threads = 64;
    double t0 = kvo_bench_now();
    for (uint32_t i = 0; i < threads; i++) {
        args[i] = (kvo__br_arg){m, i, threads, batch, n_keys, size, name, ctx, val, 0, 0};
        pthread_create(&th[i], NULL, kvo__br_thread, &args[i]);
    }
    int failed = 0;
    *bytes = 0;
    for (uint32_t i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        *bytes += args[i].bytes;
        failed |= args[i].failed;
    }
    double dt = kvo_bench_now() - t0;
    return failed ? -1.0 : dt;
}
#endif
