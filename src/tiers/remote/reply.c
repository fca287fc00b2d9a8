/*
 * The hiredis reader functions of every connection of the remote tier: the
 * reply objects are hiredis's own (redisReply, freed by freeReplyObject)
 * except that a GET's value can go straight into the caller's buffers.
 *
 * A leaf of tiers/remote: cluster.c installs these functions on each
 * connection it opens (kvo__rc_reader_setup), pipeline.c points the
 * reader's privdata at the GET being read (a kvo__rc_cmd with a sink) and
 * back to NULL afterwards.  It calls no other file of the folder.
 */
#include <stdlib.h>

#include <hiredis/hiredis.h>

#include "tiers/remote/remote_internal.h"

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
    const kvo__rc_cmd *sink = task->parent ? NULL : task->privdata;
    if (sink && task->type == REDIS_REPLY_STRING && len == sink->sink_hdr_len + sink->sink_len) {
        memcpy(sink->sink_hdr, str, sink->sink_hdr_len);
        memcpy(sink->sink_dst, str + sink->sink_hdr_len, sink->sink_len);
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
