/*
 * Pipelined execution of a batch of GET/SET/EXISTS/DEL on a Redis Cluster
 * (the routing tables and connections are cluster.c's, the reply objects
 * reply.c's).
 *
 * One call runs rounds until every command is answered or out of hops:
 *   1. route: each open command gets the node owning its slot (ASK'd ones
 *      keep the node the ASK named);
 *   2. send: per node, take a pooled connection and writev every command's
 *      RESP encoding straight from the callers' buffers (zero copies of a
 *      value on our side); a node in backoff, or whose connect or write
 *      fails, fails its commands at once with KVO_EIO;
 *   3. receive: per node, read the replies in order; a MOVED patches the
 *      slot map and leaves the command open for the next round, an ASK
 *      sends it with ASKING to the named node next round, TRYAGAIN waits
 *      10 ms; WRONGTYPE (a GET of a key of another type) completes it
 *      KVO_ECORRUPT; any other error reply, or an I/O error or a
 *      deadline, fails it.
 * Deadlines: each reply within io_timeout_ms of being awaited, the whole
 * call (every hop of every command of 64) within (max_redirects + 1) x
 * io_timeout_ms; a node past one is marked down (reply.c reads replies).
 * Commands are handled 64 at a time (the per-call workspace lives on the
 * stack: nothing is allocated per command except hiredis's reply objects).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "tiers/remote/remote_internal.h"

#define PIPE_MAX 64u
#define PRE_MAX 320u

struct kvo__rc_ws {
    char pre[PIPE_MAX][PRE_MAX];   /* RESP header of each command (+ASKING) */
    char post[PIPE_MAX][64];       /* after a SET's value: CRLF [EX n] */
    struct iovec iov[PIPE_MAX * 8];
    int order[PIPE_MAX];           /* command indices grouped by node */
    redisContext *ctx[PIPE_MAX];   /* per group */
};
typedef struct kvo__rc_ws pipe_ws;

kvo__rc_ws *kvo__rc_ws_create(void) { return kvo__malloc(sizeof(kvo__rc_ws)); }
void kvo__rc_ws_destroy(kvo__rc_ws *w) { kvo__free(w); }

/* Encode a command's RESP prefix into pre (and a SET's suffix into post). */
static void encode(const kvo__rc_cmd *cmd, char *pre, char *post, size_t *pre_len, size_t *post_len) {
    static const char *names[] = {"", "GET", "SET", "EXISTS", "DEL"};
    const char *name = names[cmd->kind];
    size_t off = 0;
    if (cmd->asking) off += (size_t)snprintf(pre, PRE_MAX, "*1\r\n$6\r\nASKING\r\n");
    int argc = cmd->kind == KVO__RC_SET ? (cmd->ttl_s ? 5 : 3) : 2;
    off += (size_t)snprintf(pre + off, PRE_MAX - off, "*%d\r\n$%zu\r\n%s\r\n$%zu\r\n", argc, strlen(name), name,
                            cmd->klen);
    memcpy(pre + off, cmd->key, cmd->klen);
    off += cmd->klen;
    pre[off++] = '\r';
    pre[off++] = '\n';
    *post_len = 0;
    if (cmd->kind == KVO__RC_SET) {
        uint64_t vlen = 0;
        for (int i = 0; i < cmd->nval; i++) vlen += cmd->val[i].iov_len;
        off += (size_t)snprintf(pre + off, PRE_MAX - off, "$%llu\r\n", (unsigned long long)vlen);
        if (cmd->ttl_s) {
            char num[16];
            int nl = snprintf(num, sizeof num, "%u", cmd->ttl_s);
            *post_len = (size_t)snprintf(post, 64, "\r\n$2\r\nEX\r\n$%d\r\n%s\r\n", nl, num);
        } else {
            *post_len = (size_t)snprintf(post, 64, "\r\n");
        }
    }
    *pre_len = off;
}

/* writev all of iov (advancing it) on a blocking socket with a send
 * timeout (each writev is bounded by it), giving up once deadline_ns has
 * passed: a node that reads slowly cannot hold us either.  0 or -1. */
static int write_all(int fd, struct iovec *iov, int cnt, uint64_t deadline_ns) {
    for (bool first = true; cnt > 0; first = false) {
        if (!first && kvo__now_ns() >= deadline_ns) return -1;
        ssize_t w = writev(fd, iov, cnt > 1024 ? 1024 : cnt);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (cnt > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

static void fail(kvo__rc_cmd *cmd) {
    cmd->done = true;
    cmd->result = KVO_EIO;
}

/* Send the commands order[a..b) (all for node ni) on ctx.  0 or -1. */
static int send_group(pipe_ws *w, kvo__rc_cmd *cmds, int a, int b, redisContext *ctx, uint64_t deadline_ns) {
    int cnt = 0;
    for (int k = a; k < b; k++) {
        kvo__rc_cmd *cmd = &cmds[w->order[k]];
        size_t pl, ql;
        encode(cmd, w->pre[k], w->post[k], &pl, &ql);
        w->iov[cnt++] = (struct iovec){w->pre[k], pl};
        if (cmd->kind == KVO__RC_SET) {
            for (int v = 0; v < cmd->nval; v++) w->iov[cnt++] = cmd->val[v];
            w->iov[cnt++] = (struct iovec){w->post[k], ql};
        }
    }
    return write_all(ctx->fd, w->iov, cnt, deadline_ns);
}

/* Handle one reply to cmd (taking ownership of r).  Returns true when the
 * reply was an error that asks to wait (TRYAGAIN). */
static bool on_reply(kvo__rc *c, kvo__rc_cmd *cmd, redisReply *r, int ni) {
    bool wait = false;
    if (r->type == REDIS_REPLY_ERROR) {
        bool moved = !strncmp(r->str, "MOVED ", 6), ask = !strncmp(r->str, "ASK ", 4);
        if ((moved || ask) && cmd->hops < (int)kvo__rc_max_redirects(c)) {
            const char *sp = strchr(r->str + (moved ? 6 : 4), ' ');
            int to = sp ? kvo__rc_redirect(c, sp + 1, ni, moved, cmd->slot) : -1;
            cmd->hops++;
            if (to < 0) fail(cmd);
            else if (ask) {
                cmd->asking = true;
                cmd->node = to;
            } else cmd->asking = false;
        } else if (!strncmp(r->str, "TRYAGAIN", 8) && cmd->hops < (int)kvo__rc_max_redirects(c)) {
            cmd->hops++;
            wait = true;
        } else if (cmd->kind == KVO__RC_GET && !strncmp(r->str, "WRONGTYPE", 9)) {
            /* a list, hash... under a tier key: not a value of ours, and the
             * node is fine: corrupt (the tier deletes it), not a failure */
            cmd->done = true;
            cmd->asking = false;
            cmd->result = KVO_ECORRUPT;
        } else fail(cmd);
        freeReplyObject(r);
        return wait;
    }
    cmd->done = true;
    cmd->asking = false;
    switch (cmd->kind) {
    case KVO__RC_GET:
        if (r->type == REDIS_REPLY_STRING) {
            cmd->result = 0;
            cmd->reply = r;
            cmd->str = r->str;
            cmd->len = r->len;
            return false;
        }
        cmd->result = r->type == REDIS_REPLY_NIL ? KVO_ENOTFOUND : KVO_EIO;
        break;
    case KVO__RC_EXISTS:
    case KVO__RC_DEL: /* keys that existed / were deleted */
        cmd->result = r->type != REDIS_REPLY_INTEGER ? KVO_EIO : r->integer > 0 ? 0 : KVO_ENOTFOUND;
        break;
    default:
        cmd->result = r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_INTEGER ? 0 : KVO_EIO;
        break;
    }
    freeReplyObject(r);
    return false;
}

/* Read the replies of order[a..b) from ctx, each within io_ns of being
 * awaited and all by op_deadline.  0, or -1 on an I/O error or a deadline
 * (the unanswered commands failed). */
static int recv_group(kvo__rc *c, pipe_ws *w, kvo__rc_cmd *cmds, int a, int b, redisContext *ctx, int ni,
                      bool *wait, uint64_t op_deadline) {
    uint64_t io_ns = kvo__rc_io_timeout_ns(c);
    for (int k = a; k < b; k++) {
        kvo__rc_cmd *cmd = &cmds[w->order[k]];
        redisReply *r = NULL;
        uint64_t now = kvo__now_ns(), by = now + io_ns < op_deadline ? now + io_ns : op_deadline;
        if (cmd->asking) {
            if (kvo__rc_get_reply(ctx, (void **)&r, by) != REDIS_OK || !r) {
                for (int j = k; j < b; j++) fail(&cmds[w->order[j]]);
                return -1;
            }
            freeReplyObject(r);
            r = NULL;
        }
        ctx->reader->privdata = cmd->kind == KVO__RC_GET && cmd->sink_dst ? cmd : NULL;
        int grc = kvo__rc_get_reply(ctx, (void **)&r, by);
        ctx->reader->privdata = NULL;
        if (grc != REDIS_OK || !r) {
            for (int j = k; j < b; j++) fail(&cmds[w->order[j]]);
            return -1;
        }
        *wait |= on_reply(c, cmd, r, ni);
    }
    return 0;
}

/* One round over the open commands, bounded by op_deadline.  Returns how
 * many remain open. */
static size_t round_once(kvo__rc *c, pipe_ws *w, kvo__rc_cmd *cmds, size_t n, uint64_t op_deadline) {
    kvo__rc_route(c, cmds, n);
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].done) continue;
        if (cmds[i].node < 0) fail(&cmds[i]);
        else w->order[m++] = (int)i;
    }
    /* group by node: insertion sort (m <= 64) */
    for (int i = 1; i < m; i++) {
        int v = w->order[i], j = i;
        while (j > 0 && cmds[w->order[j - 1]].node > cmds[v].node) {
            w->order[j] = w->order[j - 1];
            j--;
        }
        w->order[j] = v;
    }
    int ng = 0, starts[PIPE_MAX + 1];
    for (int k = 0; k < m; k++)
        if (k == 0 || cmds[w->order[k]].node != cmds[w->order[k - 1]].node) starts[ng++] = k;
    starts[ng] = m;
    for (int g = 0; g < ng; g++) {
        int ni = cmds[w->order[starts[g]]].node;
        w->ctx[g] = kvo__rc_node_down(c, ni) ? NULL : kvo__rc_conn_take(c, ni);
        if (w->ctx[g] && send_group(w, cmds, starts[g], starts[g + 1], w->ctx[g], op_deadline) != 0) {
            redisFree(w->ctx[g]);
            w->ctx[g] = NULL;
            kvo__rc_node_fail(c, ni);
        }
        if (!w->ctx[g])
            for (int k = starts[g]; k < starts[g + 1]; k++) fail(&cmds[w->order[k]]);
    }
    bool wait = false;
    for (int g = 0; g < ng; g++) {
        if (!w->ctx[g]) continue;
        int ni = cmds[w->order[starts[g]]].node;
        if (recv_group(c, w, cmds, starts[g], starts[g + 1], w->ctx[g], ni, &wait, op_deadline) != 0) {
            redisFree(w->ctx[g]);
            kvo__rc_node_fail(c, ni);
        } else {
            kvo__rc_conn_give(c, ni, w->ctx[g]);
        }
        w->ctx[g] = NULL;
    }
    if (ng) kvo__rc_count_batch(c);
    if (wait) nanosleep(&(struct timespec){0, 10000000}, NULL);
    size_t open = 0;
    for (size_t i = 0; i < n; i++) open += !cmds[i].done;
    return open;
}

void kvo__rc_exec(kvo__rc *c, kvo__rc_ws *w, kvo__rc_cmd *cmds, size_t n) {
    for (size_t i = 0; i < n; i++) {
        cmds[i].done = false;
        cmds[i].asking = false;
        cmds[i].hops = 0;
        cmds[i].node = -1;
        cmds[i].reply = NULL;
        cmds[i].str = NULL;
        cmds[i].len = 0;
        cmds[i].result = KVO_EIO;
        if (!w || cmds[i].skip) cmds[i].done = true;
        if (cmds[i].klen > PRE_MAX - 128) { /* no room in the RESP header */
            cmds[i].done = true;
            cmds[i].result = KVO_EINVAL;
        }
    }
    if (!w) return;
    for (size_t base = 0; base < n; base += PIPE_MAX) {
        size_t m = n - base < PIPE_MAX ? n - base : PIPE_MAX;
        /* the operations' deadline: every hop they may take, one reply
         * timeout each */
        uint64_t op_deadline = kvo__now_ns() + ((uint64_t)kvo__rc_max_redirects(c) + 1) * kvo__rc_io_timeout_ns(c);
        for (uint32_t r = 0; r <= kvo__rc_max_redirects(c) + 1 && kvo__now_ns() < op_deadline; r++)
            if (round_once(c, w, cmds + base, m, op_deadline) == 0) break;
        for (size_t i = 0; i < m; i++)
            if (!cmds[base + i].done) fail(&cmds[base + i]);
    }
    kvo__rc_maybe_refresh(c);
}
