/*
 * The file tier's op plumbing: op objects, the two queues and the
 * completion ring, shared by the entry points (file_tier.c) and both
 * backends (file_workers.c's threads, uring/file_uring.c's ring).
 *
 * What it owns
 *  - Ops: allocated on demand (each with its own 4096-aligned header buffer)
 *    and kept on a free list, so the steady state allocates nothing.
 *  - Queues: reads and writes, FIFO each; reads are taken first
 *    (kvo__fop_next).  A queued read wakes the ring through t->ring_kick
 *    when the ring serves reads (set by file_workers.c when it starts it),
 *    else a worker thread (work_cv).
 *  - Completions: the core's completion ring (core/ring.h) of
 *    kvo_file_completion; room for a reported op is promised when it is
 *    queued, so a finishing op never needs memory, and a queued op always
 *    reports.  The ring's eventfd is the tier's (kvo_file_tier_event_fd).
 *  - kvo__fop_finish: the one place an op is handed back (index state,
 *    staging slot, stats, latency average, completion, free list); the
 *    backend that ran the op calls it once the op's phases (file_ops.c)
 *    are done.
 *
 * A leaf: it calls no other file of the tier (only the stores), so both
 * backends and the facade can call it.
 *
 * Lock rules: mu guards the queues, the free list, the ring and the
 * counters; it is never held across a store call (kvo__fop_finish calls the
 * stores before it takes mu).  Flush and wait sleep on done_cv, broadcast
 * by every finish.
 */
#include "tiers/file_internal.h"

/* Ops: allocated on demand, reused from a free list; hdr is 4096-aligned. */
kvo__fop *kvo__fop_get(kvo_file_tier *t) {
    pthread_mutex_lock(&t->mu);
    kvo__fop *op = t->free_ops;
    if (op) t->free_ops = op->next;
    pthread_mutex_unlock(&t->mu);
    if (!op) {
        unsigned char *mem = kvo__malloc(sizeof(kvo__fop) + 2 * KVO_FILE_HEADER_BYTES);
        if (!mem) return NULL;
        op = (kvo__fop *)mem;
        uintptr_t h = (uintptr_t)(mem + sizeof(kvo__fop));
        h = (h + KVO_FILE_HEADER_BYTES - 1) & ~(uintptr_t)(KVO_FILE_HEADER_BYTES - 1);
        op->hdr = (unsigned char *)h;
    }
    unsigned char *hdr = op->hdr;
    memset(op, 0, offsetof(kvo__fop, tmp));
    op->tmp[0] = op->path[0] = 0;
    op->hdr = hdr;
    op->fd = -1;
    return op;
}

/* Called with mu held. */
static void op_put_locked(kvo_file_tier *t, kvo__fop *op) {
    op->next = t->free_ops;
    t->free_ops = op;
}

static void push_completion_locked(kvo_file_tier *t, const kvo__fop *op, uint64_t bytes) {
    kvo_file_completion *c = kvo__ring_push(&t->cq); /* room promised at kvo__fop_enqueue */
    c->user_data = op->user_data;
    c->key = op->key;
    c->op = op->kind == KVO__FOP_WRITE ? KVO_FILE_OP_WRITE : KVO_FILE_OP_READ;
    c->result = op->result;
    c->bytes = op->result == 0 ? bytes : 0;
    c->latency_ns = kvo__now_ns() - op->t_queued;
}

/* Hand a finished op back: index, stats, staging, completion (the store
 * calls come first, not under mu). */
void kvo__fop_finish(kvo_file_tier *t, kvo__fop *op) {
    const kvo_group_plan *g = op->g;
    bool ok = op->result == 0;
    if (op->kind == KVO__FOP_WRITE) {
        kvo_store_complete_store(t->index, &op->key, 1, ok);
        if (!op->borrowed) kvo__file_stage_release(t, &op->key);
    } else {
        /* a bad or missing file leaves the index now, even while other
         * readers pin it (retired: hidden, dropped at the last unpin) */
        if (op->result == KVO_ECORRUPT || op->result == KVO_ENOTFOUND) kvo_store_retire(t->index, &op->key, 1);
        kvo_store_complete_load(t->index, &op->key, 1);
    }
    pthread_mutex_lock(&t->mu);
    if (op->kind == KVO__FOP_WRITE) {
        uint64_t lat = kvo__now_ns() - op->t_queued;
        t->lat_ewma_ns = t->lat_ewma_ns ? t->lat_ewma_ns - t->lat_ewma_ns / 8 + lat / 8 : lat;
        if (ok) {
            t->st.writes++;
            t->st.write_bytes += g->chunk_bytes;
        } else if (op->result == KVO_ENOSPC) {
            t->st.dropped_nospace++;
        } else {
            t->st.dropped_io++;
        }
        t->pending_writes--;
    } else {
        if (ok) {
            t->st.reads++;
            t->st.read_bytes += g->chunk_bytes;
        } else if (op->auth_failed) {
            t->st.auth_failed++;
        } else if (op->result == KVO_ECORRUPT) {
            t->st.corrupt_removed++;
        } else if (op->result == KVO_ENOTFOUND) {
            t->st.read_misses++;
        } else if (op->result != KVO_ECANCELED) {
            t->st.read_errors++;
        }
    }
    if (op->report) push_completion_locked(t, op, g->chunk_bytes);
    op_put_locked(t, op);
    pthread_cond_broadcast(&t->done_cv);
    pthread_mutex_unlock(&t->mu);
}

kvo__fop *kvo__fop_next(kvo_file_tier *t, bool wait, unsigned kinds) {
    pthread_mutex_lock(&t->mu);
    for (;;) {
        kvo__fop *op = NULL;
        if ((kinds & KVO__FOP_READ) && t->rq_head) {
            op = t->rq_head;
            t->rq_head = op->next;
            if (!t->rq_head) t->rq_tail = NULL;
        } else if ((kinds & KVO__FOP_WRITE) && t->wq_head) {
            op = t->wq_head;
            t->wq_head = op->next;
            if (!t->wq_head) t->wq_tail = NULL;
        }
        if (op || !wait || t->closing) {
            pthread_mutex_unlock(&t->mu);
            return op;
        }
        pthread_cond_wait(&t->work_cv, &t->mu);
    }
}

/* Fill in an op's request and queue it for the workers (or the ring).
 * KVO_ENOMEM (no message) when no completion can be reserved for a reported
 * op: the op goes back to the free list, nothing is queued. */
int kvo__fop_enqueue(kvo_file_tier *t, kvo__fop *op, uint32_t kind, const kvo_chunk_key *k, const kvo_group_plan *g,
                     uint64_t user_data, bool report) {
    op->kind = kind;
    op->key = *k;
    op->key.tenant = 0;
    op->g = g;
    op->user_data = user_data;
    op->report = report;
    op->next = NULL;
    op->t_queued = kvo__now_ns();
    pthread_mutex_lock(&t->mu);
    /* room for its completion, promised now: a finishing op never needs
     * memory, and a queued op always reports (the ring grows by doubling) */
    if (report && kvo__ring_reserve(&t->cq, 1) != 0) {
        op_put_locked(t, op);
        pthread_mutex_unlock(&t->mu);
        return KVO_ENOMEM;
    }
    t->st.writes_borrowed += op->borrowed;
    kvo__fop **head = op->kind == KVO__FOP_READ ? &t->rq_head : &t->wq_head;
    kvo__fop **tail = op->kind == KVO__FOP_READ ? &t->rq_tail : &t->wq_tail;
    if (*tail) (*tail)->next = op;
    else *head = op;
    *tail = op;
    bool ring = t->uring && op->kind == KVO__FOP_READ;
    if (!ring) pthread_cond_signal(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    if (ring) t->ring_kick(t->uring_state);
    return 0;
}

bool kvo__file_tier_closing(kvo_file_tier *t) {
    pthread_mutex_lock(&t->mu);
    bool c = t->closing && !t->rq_head;
    pthread_mutex_unlock(&t->mu);
    return c;
}
