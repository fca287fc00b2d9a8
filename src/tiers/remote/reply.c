/*
 * The hiredis reader functions of every connection of the remote tier: the
 * reply objects are hiredis's own (redisReply, freed by freeReplyObject)
 * except that a GET's value can go straight into the caller's buffers.
 *
 * A leaf of tiers/remote: cluster.c installs these functions on each
 * connection it opens (kvo__rc_reader_setup), pipeline.c points the
 * reader's privdata at the GET being read (a kvo__rc_cmd with a sink) and
 * back to NULL afterwards.  It calls no other file of the folder (of tiers/,
 * kvo__file_copy_sum: a value that reaches the reader whole is copied into
 * its sink and hashed in the same pass as a put's staging copy).
 *
 * Deadlines: hiredis's blocking redisGetReply bounds each recv by
 * SO_RCVTIMEO, not a reply, so a node that trickles its reply (each gap
 * under the timeout) could hold a worker -- or create -- for as long as it
 * liked (issue 25).  kvo__rc_get_reply reads a reply with non-blocking recv
 * while bytes are there and poll() up to an absolute deadline when none
 * are; kvo__rc_command sends a command the same way.  The 64 KiB read
 * buffer also means fewer system calls per large value than hiredis's
 * 16 KiB reads.
 *
 * A GET with a sink whose reply is a bulk string of exactly the sink's
 * length is received straight from the socket into the sink (sink_reply),
 * and its checksum taken on the way (sink_sum: every 64 KiB received, while
 * the bytes are in cache), or, for a tier with a fleet secret, the sealed
 * payload opened in place on the way (sink_seal, the same pieces: the
 * decryption reads the bytes while they are in cache instead of a second
 * pass over memory):
 * the reply's first line ("$<len>\r\n") is read through hiredis's buffer,
 * then whatever of the value that buffer already holds is copied out, and
 * the rest is received with one recvmsg per burst into the header and the
 * caller's buffer, then the closing CRLF.  Through the reader (before, and
 * still for every other reply) each value byte was copied three times
 * (socket -> 64 KiB buffer -> reader's buffer -> sink); here once, by the
 * kernel: `kvoffload bench remote` reads of 1-4 MiB values were 0.5-0.9 of
 * raw hiredis GETs (which copy as often) on the shared machine.  The path
 * is taken only when the reader has no reply in progress, and it leaves
 * the reader's buffer exactly after the reply (bytes of the next reply
 * stay there); any other first line (nil, an error such as MOVED, another
 * length) goes to the reader as usual.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>
#include "core/xxh.h"

#include "tiers/file_internal.h" /* kvo__file_copy_sum, KVO__SUM_PIECE */
#include "tiers/remote/remote_internal.h"
#include "tiers/seal.h"

/* hiredis's reply objects (the same redisReply, freed by freeReplyObject)
 * except that a top-level bulk string read for a GET with a sink is copied
 * straight into the caller's header buffer and destination: no heap copy of
 * a multi-MiB value per reply (malloc, page faults, then a second copy). */
static void *link_parent(const redisReadTask *task, redisReply *r) {
    if (task->parent) {
        redisReply *parent = task->parent->obj;
        parent->element[task->idx] = r;
    }
    return r;
}

static void *mk_string(const redisReadTask *task, char *str, size_t len) {
    redisReply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->type = task->type;
    kvo__rc_cmd *sink = task->parent ? NULL : task->privdata;
    if (sink && task->type == REDIS_REPLY_STRING && len == sink->sink_hdr_len + sink->sink_len) {
        memcpy(sink->sink_hdr, str, sink->sink_hdr_len);
        if (sink->sink_seal) /* opened on the way into the sink: the same single pass */
            sink->sink_seal_rc = kvo__seal_open(sink->sink_seal, sink->sink_hdr, sink->key, sink->klen,
                                                sink->sink_dst, str + sink->sink_hdr_len, sink->sink_len);
        else sink->sink_sum = kvo__file_copy_sum(sink->sink_dst, str + sink->sink_hdr_len, sink->sink_len);
        r->len = len; /* str stays NULL: the bytes are in the sink */
        return r;
    }
    r->str = malloc(len + 1);
    if (!r->str) {
        free(r);
        return NULL;
    }
    memcpy(r->str, str, len);
    r->str[len] = 0;
    r->len = len;
    return link_parent(task, r);
}

static void *mk_array(const redisReadTask *task, int elements) {
    redisReply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->type = REDIS_REPLY_ARRAY;
    if (elements > 0 && !(r->element = calloc((size_t)elements, sizeof(redisReply *)))) {
        free(r);
        return NULL;
    }
    r->elements = (size_t)(elements > 0 ? elements : 0);
    return link_parent(task, r);
}

static void *mk_integer(const redisReadTask *task, long long v) {
    redisReply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->type = REDIS_REPLY_INTEGER;
    r->integer = v;
    return link_parent(task, r);
}

static void *mk_nil(const redisReadTask *task) {
    redisReply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->type = REDIS_REPLY_NIL;
    return link_parent(task, r);
}

static redisReplyObjectFunctions reply_fns = {mk_string, mk_array, mk_integer, mk_nil, freeReplyObject};

void kvo__rc_reader_setup(redisContext *ctx, uint64_t max_value_bytes) {
    ctx->reader->fn = &reply_fns;
    ctx->reader->privdata = NULL;
    /* keep the grown input buffer between replies (hiredis frees an idle
     * buffer above maxbuf, 16 KiB by default) */
    ctx->reader->maxbuf = (size_t)(2 * max_value_bytes + (1u << 20));
}

/* ------------------------------------------------------ deadlines -- */

/* Wait until fd is ready for ev or deadline_ns (kvo__now_ns's clock)
 * passes.  0 ready (or an error the next I/O reports), -1 out of time or
 * poll failed. */
static int wait_fd(int fd, short ev, uint64_t deadline_ns) {
    for (;;) {
        uint64_t now = kvo__now_ns();
        if (now >= deadline_ns) return -1;
        uint64_t ms = (deadline_ns - now + 999999u) / 1000000u;
        struct pollfd p = {fd, ev, 0};
        int r = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static int ctx_error(redisContext *ctx, int err, const char *what, const char *detail) {
    ctx->err = err;
    snprintf(ctx->errstr, sizeof ctx->errstr, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
    return REDIS_ERR;
}

static int ctx_timeout(redisContext *ctx, uint64_t t0, uint64_t deadline_ns) {
    ctx->err = REDIS_ERR_IO;
    snprintf(ctx->errstr, sizeof ctx->errstr, "no whole reply within %llu ms (timed out)",
             (unsigned long long)(deadline_ns > t0 ? (deadline_ns - t0 + 999999u) / 1000000u : 0));
    return REDIS_ERR;
}

/* The reader holds no partial reply: nothing parsed yet, or only an empty
 * task set up by a call that found no bytes (hiredis 0.14 and later). */
static bool reader_idle(const redisReader *r) {
    return r->ridx == -1 || (r->ridx == 0 && r->rstack[0].type == -1);
}

/* One non-blocking receive into iov: the bytes received (> 0); 0 when none
 * were there (after waiting for more, up to the deadline) or on EINTR; -1
 * with ctx's error set (EOF, I/O error, deadline). */
static ssize_t recv_burst(redisContext *ctx, struct iovec *iov, int cnt, uint64_t t0, uint64_t deadline_ns) {
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)cnt;
    ssize_t n = recvmsg(ctx->fd, &m, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
        ctx_error(ctx, REDIS_ERR_EOF, "server closed the connection", NULL);
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (wait_fd(ctx->fd, POLLIN, deadline_ns) == 0) return 0;
        ctx_timeout(ctx, t0, deadline_ns);
        return -1;
    }
    if (errno == EINTR) return 0;
    ctx_error(ctx, REDIS_ERR_IO, "recv", strerror(errno));
    return -1;
}

/* The running checksum of a sink's destination, or with a seal op its
 * opening in place: the bytes from dst up to where its iovec (advanced by
 * recv_exact) now starts are in; take what is new once there are 64 KiB of
 * it, or all of it (final).  The header precedes the payload in the value,
 * so it is whole by the first step that finds payload bytes: that step
 * begins the opening (the seal record, the key name); the final one checks
 * the tag.  A failed begin leaves the rest undecrypted (the value fails). */
typedef struct sink_hash {
    XXH3_state_t st;
    kvo__rc_cmd *cmd;
    char *dst;
    const struct iovec *piece;
    size_t done;
    int seal;                   /* 0 not begun, 1 opening, -1 failed */
} sink_hash;

/* sink_seal_rc stays KVO_ECORRUPT (set before the first step) until the
 * final step has checked the tag: bytes no one vouched for never pass. */
static void sink_seal_step(sink_hash *h, size_t in, bool final) {
    kvo__rc_cmd *c = h->cmd;
    int rc = 0;
    if (h->seal == 0) {
        rc = kvo__seal_open_begin(c->sink_seal, c->sink_hdr, c->key, c->klen);
        h->seal = rc ? -1 : 1;
    }
    if (h->seal == 1 && in > h->done &&
        (rc = kvo__seal_open_update(c->sink_seal, h->dst + h->done, h->dst + h->done, in - h->done)) != 0)
        h->seal = -1;
    if (h->seal == 1 && final) rc = kvo__seal_open_end(c->sink_seal, c->sink_hdr);
    if (rc || final) c->sink_seal_rc = h->seal == 1 || rc ? rc : KVO_ECORRUPT;
}

static void sink_hash_step(sink_hash *h, bool final) {
    size_t in = (size_t)((const char *)h->piece->iov_base - h->dst);
    bool take = in - h->done >= KVO__SUM_PIECE || (final && in > h->done);
    if (h->cmd->sink_seal) {
        if ((take || final) && h->seal >= 0) sink_seal_step(h, in, final);
    } else if (take) XXH3_64bits_update(&h->st, h->dst + h->done, in - h->done);
    if (take) h->done = in;
}

/* Receive into iov (advancing it) until cnt pieces are full, by deadline;
 * h (may be NULL) is stepped after each burst.  0, or REDIS_ERR with ctx's
 * error set. */
static int recv_exact(redisContext *ctx, struct iovec *iov, int cnt, uint64_t t0, uint64_t deadline_ns,
                      sink_hash *h) {
    while (cnt > 0) {
        if (iov->iov_len == 0) {
            iov++;
            cnt--;
            continue;
        }
        if (kvo__now_ns() >= deadline_ns) return ctx_timeout(ctx, t0, deadline_ns);
        ssize_t n = recv_burst(ctx, iov, cnt, t0, deadline_ns);
        if (n < 0) return REDIS_ERR;
        while (n > 0) {
            size_t k = (size_t)n < iov->iov_len ? (size_t)n : iov->iov_len;
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
            n -= (ssize_t)k;
            if (iov->iov_len == 0) {
                iov++;
                cnt--;
            }
        }
        if (h) sink_hash_step(h, false);
    }
    return 0;
}

/* The direct path of a sink GET (see the essay): REDIS_OK with *reply set
 * (a string reply whose bytes are in the sink) when the reply was a bulk
 * string of the sink's length; REDIS_OK with *reply NULL when it was not
 * (every byte taken from the socket is then in the reader's buffer, in
 * order, for the reader to parse); REDIS_ERR on an I/O error or the
 * deadline. */
static int sink_reply(redisContext *ctx, kvo__rc_cmd *sink, void **reply, uint64_t t0, uint64_t deadline_ns) {
    redisReader *r = ctx->reader;
    size_t want = sink->sink_hdr_len + sink->sink_len;
    char num[24];
    int nl = snprintf(num, sizeof num, "$%zu\r\n", want);
    /* the first line through the reader's buffer, taking at most the bytes
     * it lacks from the socket (so little of a shorter reply's successor:
     * whatever is taken is fed to the reader, in order) */
    while (r->len - r->pos < (size_t)nl) {
        const char *p = r->buf + r->pos;
        size_t have = r->len - r->pos;
        if (have && (memchr(p, '\n', have) || memcmp(p, num, have) != 0)) break; /* not ours: the reader's */
        char tmp[24];
        struct iovec v = {tmp, (size_t)nl - have};
        if (kvo__now_ns() >= deadline_ns) return ctx_timeout(ctx, t0, deadline_ns);
        ssize_t n = recv_burst(ctx, &v, 1, t0, deadline_ns);
        if (n < 0) return REDIS_ERR;
        if (n > 0 && redisReaderFeed(r, tmp, (size_t)n) != REDIS_OK)
            return ctx_error(ctx, REDIS_ERR_OOM, "out of memory", NULL);
    }
    if (r->len - r->pos < (size_t)nl || memcmp(r->buf + r->pos, num, (size_t)nl) != 0) return REDIS_OK;
    redisReply *out = calloc(1, sizeof *out);
    if (!out) return ctx_error(ctx, REDIS_ERR_OOM, "out of memory", NULL);
    r->pos += (size_t)nl;
    /* the value (then CRLF) into header, destination and a 2-byte tail:
     * first what the reader's buffer already holds, then the socket */
    char crlf[2];
    struct iovec iov[3] = {{sink->sink_hdr, sink->sink_hdr_len}, {sink->sink_dst, sink->sink_len}, {crlf, 2}};
    int first = 0;
    for (; first < 3 && r->pos < r->len; first++) {
        size_t k = r->len - r->pos < iov[first].iov_len ? r->len - r->pos : iov[first].iov_len;
        memcpy(iov[first].iov_base, r->buf + r->pos, k);
        r->pos += k;
        iov[first].iov_base = (char *)iov[first].iov_base + k;
        iov[first].iov_len -= k;
        if (iov[first].iov_len) break;
    }
    sink_hash h;
    XXH3_INITSTATE(&h.st);
    XXH3_64bits_reset(&h.st);
    h.cmd = sink;
    h.dst = sink->sink_dst;
    h.piece = &iov[1];
    h.done = 0;
    h.seal = 0;
    sink->sink_seal_rc = KVO_ECORRUPT; /* until the tag is checked */
    sink_hash_step(&h, false);
    if (first < 3 && recv_exact(ctx, iov + first, 3 - first, t0, deadline_ns, &h) != REDIS_OK) {
        free(out);
        return REDIS_ERR;
    }
    sink_hash_step(&h, true);
    sink->sink_sum = XXH3_64bits_digest(&h.st);
    if (crlf[0] != '\r' || crlf[1] != '\n') {
        free(out);
        return ctx_error(ctx, REDIS_ERR_PROTOCOL, "protocol error", "bulk string not ended by CRLF");
    }
    out->type = REDIS_REPLY_STRING;
    out->len = want; /* str stays NULL: the bytes are in the sink */
    *reply = out;
    return REDIS_OK;
}

int kvo__rc_get_reply(redisContext *ctx, void **reply, uint64_t deadline_ns) {
    char buf[65536];
    uint64_t t0 = kvo__now_ns();
    *reply = NULL;
    kvo__rc_cmd *sink = ctx->reader->privdata;
    if (sink && sink->sink_dst && sink->sink_hdr && !ctx->reader->err && reader_idle(ctx->reader)) {
        if (sink_reply(ctx, sink, reply, t0, deadline_ns) != REDIS_OK) return REDIS_ERR;
        if (*reply) return REDIS_OK;
    }
    for (;;) {
        if (redisReaderGetReply(ctx->reader, reply) != REDIS_OK)
            return ctx_error(ctx, REDIS_ERR_PROTOCOL, "protocol error", ctx->reader->errstr);
        if (*reply) return REDIS_OK;
        if (kvo__now_ns() >= deadline_ns) return ctx_timeout(ctx, t0, deadline_ns);
        struct iovec v = {buf, sizeof buf};
        ssize_t n = recv_burst(ctx, &v, 1, t0, deadline_ns);
        if (n < 0) return REDIS_ERR;
        if (n > 0 && redisReaderFeed(ctx->reader, buf, (size_t)n) != REDIS_OK)
            return ctx_error(ctx, REDIS_ERR_OOM, "out of memory", NULL);
    }
}

int kvo__rc_command(redisContext *ctx, void **reply, uint64_t deadline_ns, int argc, const char **argv) {
    uint64_t t0 = kvo__now_ns();
    *reply = NULL;
    if (redisAppendCommandArgv(ctx, argc, argv, NULL) != REDIS_OK) return REDIS_ERR;
    for (int done = 0; !done;) {
        if (wait_fd(ctx->fd, POLLOUT, deadline_ns) != 0) return ctx_timeout(ctx, t0, deadline_ns);
        if (redisBufferWrite(ctx, &done) != REDIS_OK) return REDIS_ERR;
    }
    return kvo__rc_get_reply(ctx, reply, deadline_ns);
}
