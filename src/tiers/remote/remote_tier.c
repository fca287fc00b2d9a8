/*
 * The remote tier: chunks in a Redis Cluster, written through asynchronously,
 * read and probed asynchronously, every value verified.
 *
 * Layout
 *   key   "<prefix>:<fingerprint hex>[-<layout hash hex>]:<hash hex>-g<group>"
 *         (no hash tag: chunks spread over every master by CRC16 of the
 *         whole key);
 *   value the file tier's 4096-byte chunk header (kvo__file_hdr_encode:
 *         magic, version, fingerprint, key, geometry, chunk_bytes, XXH3-64
 *         of the payload, header checksum) followed by chunk_bytes of
 *         payload (no padding).  The header code is file_format.c's, called
 *         through file_internal.h: one format, one implementation.
 *         With a fleet secret (params.secret, env KVO_REMOTE_SECRET) the
 *         value is sealed (tiers/seal.h: format version 2, XAES-256-GCM,
 *         authenticated with the header and the key name): the worker that
 *         sends a put seals its staged payload in place just before (not
 *         the caller: AES-256-GCM runs at about 4.4 GB/s a core on the
 *         development machine with Debian's OpenSSL 3.0, against 10-20 GB/s
 *         for a copy with its checksum, and the caller is the engine's
 *         step), and the reader decrypts a GET as it arrives, in 64 KiB
 *         pieces while they are in cache, where it would otherwise
 *         checksum it.  A value
 *         that fails authentication is a miss counted in auth_failed and is
 *         NOT deleted: during a rotation it may be another engine's good
 *         value (the next put of the key replaces it).
 *
 * Operations and threads
 *   put/get/exists run on the caller's thread only to validate, reserve and
 *   (put) copy the payload into staging memory: a kvo_arena pre-faulted at
 *   create whose slots are handed out by a kvo_store (the file tier's
 *   scheme); then the op (from a pool allocated at create: nothing is
 *   allocated per chunk) is queued.  io_threads workers each take up to
 *   batch_max ops (gets and exists first: a load is on someone's critical
 *   path, a store is not), bounded by batch_max_bytes, and run them as one
 *   pipelined batch through the cluster client (pipeline.c): values are
 *   written with writev straight from staging; a GET reply is parsed
 *   straight into a per-worker header buffer and the caller's destination
 *   (pipeline.c's reply functions) and verified there.  A value that fails verification is
 *   deleted (a second, small pipeline in the same batch) and reported as
 *   KVO_ECORRUPT; so is a key holding another Redis type (WRONGTYPE).
 *
 * Back-pressure and faults
 *   pending_writes <= max_pending_writes and staging memory bound the puts:
 *   past them a put is dropped (KVO_EAGAIN, counted) -- the engine is never
 *   blocked.  Gets and exists are bounded by max_pending_reads.  A failed
 *   node fails its ops at once (KVO_EIO: a miss, or a store dropped and
 *   counted) until its backoff expires; see cluster.c.
 *
 * Reading your own writes
 *   A put is visible to this tier's gets and exists from the moment its
 *   call returns, though it reaches Redis later (reads go first): t->puts
 *   maps each key whose put is queued or running to its op.  A get or
 *   exists of such a key is not sent; it waits on the put (op->waiters)
 *   and is answered when the put finishes: a get with a copy of the put's
 *   staging bytes (the exact value, whatever the put's outcome), an exists
 *   with the put's outcome.  Without this a lookup right after a store
 *   could overtake it and miss (an engine that stores, then asks).
 *   Counted in reads_after_put.
 *
 * Removes (kvo_remote_tier_remove) are reads in all but their command: a
 *   read op, the reads queue, a completion each; one whose key has a put
 *   pending waits on the put like a get, then is queued again and sent, so
 *   the put never lands after the DEL.
 *
 * Completions
 *   The core's ring (core/ring.h), fixed at max_pending_reads +
 *   max_pending_writes entries; room is promised when a reporting op is
 *   queued, so a worker never finds it full.  Its eventfd is readable while
 *   completions wait.  The tier calls no user code.
 *
 * Locking: t->mu guards queues, op pool, ring and counters; it is never held
 * across network I/O, hashing or copies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tiers/file_internal.h"

#include "tiers/remote/remote_tier_internal.h"

kvo_remote_tier_params kvo_remote_tier_default_params(void) {
    kvo_remote_tier_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.key_prefix = "kvo";
    p.io_threads = 4;
    p.batch_max = 16;
    p.batch_max_bytes = UINT64_C(32) << 20;
    p.max_pending_writes = 64;
    p.max_pending_reads = 1024;
    p.max_staging_bytes = UINT64_C(64) << 20;
    p.connect_timeout_ms = 500;
    p.io_timeout_ms = 2000;
    p.down_backoff_ms = 500;
    p.max_redirects = 5;
    return p;
}

uint32_t kvo_remote_key_slot(const char *key, size_t len) { return key ? kvo__rc_slot(key, len) : 0; }

static void key_name(const kvo_remote_tier *t, const kvo_chunk_key *k, char *out, size_t *len) {
    char hex[33];
    kvo_u128_hex(k->hash, hex);
    memcpy(out, t->ns, t->ns_len);
    int n = snprintf(out + t->ns_len, NAME_MAX_LEN - t->ns_len, "%s-g%u", hex, k->group);
    *len = t->ns_len + (size_t)n;
}

int kvo_remote_tier_key_name(const kvo_remote_tier *t, const kvo_chunk_key *key, char *out, size_t cap) {
    if (!t || !key || !out) return kvo__error(KVO_EINVAL, "kvo_remote_tier_key_name: NULL argument");
    char buf[NAME_MAX_LEN];
    size_t len;
    key_name(t, key, buf, &len);
    if (len + 1 > cap) return kvo__error(KVO_ERANGE, "remote key name needs %zu bytes, buffer has %zu", len + 1, cap);
    memcpy(out, buf, len + 1);
    return 0;
}

uint64_t kvo_remote_tier_layout_hash(const kvo_remote_tier *t) { return t ? t->p.layout_hash : 0; }

static const kvo_group_plan *key_group(const kvo_remote_tier *t, const kvo_chunk_key *k) {
    const kvo_group_plan *g = kvo_plan_group(t->plan, k->group);
    return g && g->offloaded ? g : NULL;
}

/* ---------------------------------------------------------- queueing -- */

/* t->puts's entries: a pending put by key (the digest below; a hit is
 * confirmed against the op's whole key). */
typedef struct put_ent {
    uint64_t k0, k1;
    uint32_t used, pad_;
    rop *op;
} put_ent;

static void put_digest(const kvo_chunk_key *k, uint64_t *k0, uint64_t *k1) {
    *k0 = k->hash.lo;
    *k1 = k->hash.hi ^ ((uint64_t)k->group * UINT64_C(0x9E3779B97F4A7C15));
}

/* The pending put of key k, or NULL (under t->mu). */
static rop *put_of(kvo_remote_tier *t, const kvo_chunk_key *k) {
    uint64_t k0, k1;
    put_digest(k, &k0, &k1);
    put_ent *e = kvo__hmap_find(&t->puts, k0, k1);
    if (!e) return NULL;
    const kvo_chunk_key *o = &e->op->key;
    return o->hash.lo == k->hash.lo && o->hash.hi == k->hash.hi && o->group == k->group ? e->op : NULL;
}

static void rq_push(rq *q, rop *op) {
    op->next = NULL;
    if (q->tail) q->tail->next = op;
    else q->head = op;
    q->tail = op;
    q->n++;
}

static rop *rq_pop(rq *q) {
    rop *op = q->head;
    if (op) {
        q->head = op->next;
        if (!q->head) q->tail = NULL;
        q->n--;
    }
    return op;
}

static void stage_release(kvo_remote_tier *t, const kvo_chunk_key *k) {
    kvo_store_complete_store(t->stage_index, k, 1, false);
}

/* Return op to its pool and its count of pending ops (under t->mu). */
static void op_free(kvo_remote_tier *t, rop *op) {
    if (op->kind == KVO_REMOTE_OP_PUT) {
        t->pending_writes--;
        op->next = t->free_w;
        t->free_w = op;
    } else {
        t->pending_reads--;
        op->next = t->free_r;
        t->free_r = op;
    }
}

/* A put's end for the reads of its key: out of t->puts (under t->mu), so
 * that no read waits on it any more; then (no lock) its waiters answered
 * from its staging bytes, before they are released. */
static void put_untrack(kvo_remote_tier *t, rop *op) {
    uint64_t k0, k1;
    put_digest(&op->key, &k0, &k1);
    put_ent *e = kvo__hmap_find(&t->puts, k0, k1);
    if (e && e->op == op) kvo__hmap_erase(&t->puts, e);
}

/* Answer the gets and exists waiting on a put (a sealed put's staging
 * holds its sealed payload: opened into the get's destination with so).
 * Removes are not answered: finish() sends them now. */
static void answer_waiters(const rop *put, bool closing, kvo__seal_op *so) {
    for (rop *w = put->waiters; w; w = w->next) {
        w->bytes = 0;
        if (closing) w->result = KVO_ECANCELED;
        else if (w->kind == KVO_REMOTE_OP_GET) {
            uint64_t n = put->g->chunk_bytes;
            w->result = put->sealed ? (kvo__seal_open(so, put->hdr, put->name, put->nlen, w->dst, put->stage, n)
                                           ? KVO_EIO : 0)
                                    : (memcpy(w->dst, put->stage, n), 0);
            w->bytes = w->result == 0 ? n : 0;
        } else if (w->kind == KVO_REMOTE_OP_EXISTS) w->result = put->result == 0 ? 0 : KVO_ENOTFOUND;
    }
}

/* Post op's completion (if it reports; at destroy only a put's) and return
 * it to its pool (under t->mu). */
static void post(kvo_remote_tier *t, rop *op, uint64_t now) {
    if (op->report && !(t->closing && op->kind != KVO_REMOTE_OP_PUT)) {
        kvo_remote_completion *c = kvo__ring_push(&t->cq); /* promised when queued */
        c->user_data = op->user_data;
        c->key = op->key;
        c->op = op->kind;
        c->result = op->result;
        c->bytes = op->result == 0 ? op->bytes : 0;
        c->latency_ns = now - op->t_queued;
    } else if (op->report) kvo__ring_unreserve(&t->cq, 1);
    op_free(t, op);
}

static void count_waiter(kvo_remote_tier *t, const rop *w) {
    kvo_remote_tier_stats *s = &t->st;
    if (w->kind == KVO_REMOTE_OP_GET) {
        if (w->result == 0) {
            s->gets++;
            s->get_bytes += w->bytes;
        }
    } else if (w->result == 0) s->exists_hits++;
    else if (w->result == KVO_ENOTFOUND) s->exists_misses++;
}

/* Finish ops: counters, completions, pool, wake-ups.  Under no lock.  so:
 * the worker's cipher context (a tier with a secret), NULL at destroy. */
static void finish(kvo_remote_tier *t, rop **ops, size_t n, kvo__seal_op *so) {
    uint64_t now = kvo__now_ns();
    bool puts = false, closing = false, requeued = false;
    for (size_t i = 0; i < n && !puts; i++) puts = ops[i]->kind == KVO_REMOTE_OP_PUT;
    if (puts) {
        pthread_mutex_lock(&t->mu);
        for (size_t i = 0; i < n; i++)
            if (ops[i]->kind == KVO_REMOTE_OP_PUT) put_untrack(t, ops[i]);
        closing = t->closing;
        pthread_mutex_unlock(&t->mu);
        for (size_t i = 0; i < n; i++)
            if (ops[i]->kind == KVO_REMOTE_OP_PUT) {
                answer_waiters(ops[i], closing, so);
                stage_release(t, &ops[i]->key);
            }
    }
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++) {
        rop *op = ops[i], *w = op->kind == KVO_REMOTE_OP_PUT ? op->waiters : NULL;
        post(t, op, now);
        while (w) {
            rop *next = w->next;
            if (w->kind == KVO_REMOTE_OP_REMOVE && !t->closing) { /* its put landed: delete now */
                rq_push(&t->reads, w);
                requeued = true;
            } else {
                count_waiter(t, w);
                post(t, w, now);
            }
            w = next;
        }
    }
    if (requeued) pthread_cond_broadcast(&t->work_cv);
    pthread_cond_broadcast(&t->done_cv);
    pthread_mutex_unlock(&t->mu);
}

#ifdef KVO_TESTING
void kvo__remote_test_hold_puts(kvo_remote_tier *t, bool hold) {
    pthread_mutex_lock(&t->mu);
    t->test_hold_puts = hold;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
}
#endif

/* ------------------------------------------------------------ worker -- */

/* Verify a GET reply whose header is in hdr and payload in op->dst (the
 * reader's sink: sum its checksum as received, or seal_rc the outcome of
 * opening it as received with a secret), or, when the value had another
 * length, in v/len.  0 or KVO_ECORRUPT; op->auth_failed when the value
 * failed authentication (sealed under another key, not sealed while this
 * tier seals, or sealed while it does not): well formed, so not deleted. */
static int verify_value(kvo_remote_tier *t, rop *op, const unsigned char *hdr, const char *v, size_t len,
                        uint64_t sum, int seal_rc) {
    const kvo_group_plan *g = op->g;
    kvo__file_hdr h;
    if (v || len != KVO_REMOTE_HEADER_BYTES + g->chunk_bytes)
        return kvo__error(KVO_ECORRUPT, "value of %zu bytes, expected %llu (header + chunk)", len,
                          (unsigned long long)(KVO_REMOTE_HEADER_BYTES + g->chunk_bytes));
    int rc = kvo__file_hdr_decode(hdr, KVO_REMOTE_HEADER_BYTES, &h);
    if (!rc) rc = kvo__file_hdr_check(&h, t->plan, &op->key);
    if (!rc) rc = kvo__file_hdr_check_layout(&h, t->p.layout_hash);
    if (rc) return rc;
    if (h.sealed || t->seal) {
        op->auth_failed = true;
        if (!t->seal)
            return kvo__error(KVO_ECORRUPT, "a sealed value, and this tier has no secret (remote_secret, "
                              "KVO_REMOTE_SECRET)");
        if (!h.sealed)
            return kvo__error(KVO_ECORRUPT, "not sealed, and this tier seals its values (a fleet secret): written "
                              "without the secret, or forged");
        if (seal_rc) return seal_rc; /* the reader's message: key id or failed authentication */
        op->auth_failed = false;
        return 0;
    }
    if (sum != h.payload_xxh3)
        return kvo__error(KVO_ECORRUPT, "payload checksum mismatch");
    return 0;
}

/* Take a batch: reads first, then writes, up to batch_max ops and
 * batch_max_bytes of payload.  Blocks; 0 when closing with nothing left. */
static size_t take_batch(kvo_remote_tier *t, rop **ops) {
    size_t n = 0;
    uint64_t bytes = 0;
    pthread_mutex_lock(&t->mu);
    while (!t->reads.n && (!t->writes.n || (t->test_hold_puts && !t->closing)) && !t->closing)
        pthread_cond_wait(&t->work_cv, &t->mu);
    bool puts = !t->test_hold_puts || t->closing;
    while (n < t->p.batch_max && (t->reads.n || (puts && t->writes.n))) {
        rq *q = t->reads.n ? &t->reads : &t->writes;
        uint32_t k = q->head->kind;
        uint64_t b = k == KVO_REMOTE_OP_GET || k == KVO_REMOTE_OP_PUT ? q->head->g->chunk_bytes : 0;
        if (n && bytes + b > t->p.batch_max_bytes) break;
        bytes += b;
        ops[n++] = rq_pop(q);
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

static void count_results(kvo_remote_tier *t, rop **ops, size_t n, uint64_t corrupt) {
    pthread_mutex_lock(&t->mu);
    kvo_remote_tier_stats *s = &t->st;
    s->corrupt_deleted += corrupt; /* the values deleted: corrupt ones, not those failing authentication */
    for (size_t i = 0; i < n; i++) {
        rop *op = ops[i];
        switch (op->kind) {
        case KVO_REMOTE_OP_PUT:
            if (op->result == 0) {
                s->puts++;
                s->put_bytes += op->bytes;
            } else s->dropped_io++;
            break;
        case KVO_REMOTE_OP_GET:
            if (op->result == 0) {
                s->gets++;
                s->get_bytes += op->bytes;
            } else if (op->result == KVO_ENOTFOUND) s->get_misses++;
            else if (op->auth_failed) s->auth_failed++;
            else if (op->result != KVO_ECORRUPT) s->read_errors++;
            break;
        case KVO_REMOTE_OP_REMOVE:
            if (op->result == 0) s->removes++;
            else if (op->result == KVO_ENOTFOUND) s->remove_misses++;
            else s->remove_errors++;
            break;
        default:
            if (op->result == 0) s->exists_hits++;
            else if (op->result == KVO_ENOTFOUND) s->exists_misses++;
            else s->read_errors++;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

/* Run one batch: build commands, exec, verify, delete corrupt values. */
static void run_batch(kvo_remote_tier *t, rworker *w, rop **ops, size_t n) {
    kvo__rc_cmd *cmds = w->cmds;
    unsigned char *hdrs = w->hdrs;
    static const int kinds[] = {0, KVO__RC_SET, KVO__RC_GET, KVO__RC_EXISTS, KVO__RC_DEL};
    for (size_t i = 0; i < n; i++) {
        rop *op = ops[i];
        kvo__rc_cmd *c = &cmds[i];
        memset(c, 0, sizeof *c);
        c->kind = kinds[op->kind];
        c->key = op->name;
        c->klen = op->nlen;
        c->slot = kvo__rc_slot(op->name, op->nlen);
        if (op->kind == KVO_REMOTE_OP_PUT) {
            const kvo_group_plan *g = op->g;
            kvo__file_hdr h;
            kvo__file_hdr_init(&h, t->plan, t->p.layout_hash, g, &op->key, t->seal ? 0 : op->sum);
            h.sealed = t->seal != NULL;
            kvo__file_hdr_encode(&h, op->hdr);
            /* sealed in place in staging, by this worker; a put that cannot
             * be sealed (libcrypto failed) is never sent: dropped, EIO */
            if (t->seal && !op->sealed)
                c->skip = !(op->sealed = kvo__seal_value(w->so, op->hdr, op->name, op->nlen, op->stage, op->stage,
                                                         g->chunk_bytes) == 0);
            op->iov[0] = (struct iovec){op->hdr, KVO_REMOTE_HEADER_BYTES};
            op->iov[1] = (struct iovec){op->stage, g->chunk_bytes};
            c->val = op->iov;
            c->nval = 2;
            c->ttl_s = t->p.ttl_s;
        } else if (op->kind == KVO_REMOTE_OP_GET) {
            c->sink_hdr = hdrs + i * KVO_REMOTE_HEADER_BYTES;
            c->sink_hdr_len = KVO_REMOTE_HEADER_BYTES;
            c->sink_dst = op->dst;
            c->sink_len = op->g->chunk_bytes;
            c->sink_seal = w->so;
            op->auth_failed = false;
        }
    }
    kvo__rc_exec(t->rc, w->ws, cmds, n);
    size_t n_del = 0;
    for (size_t i = 0; i < n; i++) {
        rop *op = ops[i];
        op->result = cmds[i].result;
        op->bytes = op->kind == KVO_REMOTE_OP_GET || op->kind == KVO_REMOTE_OP_PUT ? op->g->chunk_bytes : 0;
        if (op->kind == KVO_REMOTE_OP_GET && (op->result == 0 || op->result == KVO_ECORRUPT)) {
            /* ECORRUPT from exec: another type under the key (WRONGTYPE) */
            if (op->result == KVO_ECORRUPT ||
                verify_value(t, op, hdrs + i * KVO_REMOTE_HEADER_BYTES, cmds[i].str, cmds[i].len,
                             cmds[i].sink_sum, cmds[i].sink_seal_rc) != 0)
                op->result = KVO_ECORRUPT;
            if (op->result == KVO_ECORRUPT && !op->auth_failed) { /* corrupt: deleted in this batch */
                kvo__rc_cmd *d = &cmds[n + n_del++];
                memset(d, 0, sizeof *d);
                d->kind = KVO__RC_DEL;
                d->key = op->name;
                d->klen = op->nlen;
                d->slot = cmds[i].slot;
            }
        }
        kvo__rc_reply_free(cmds[i].reply);
        cmds[i].reply = NULL;
    }
    if (n_del) kvo__rc_exec(t->rc, w->ws, cmds + n, n_del);
    count_results(t, ops, n, n_del);
}

static void *worker_main(void *arg) {
    rworker *w = arg;
    for (;;) {
        size_t n = take_batch(w->t, w->ops);
        if (n == 0) break;
        run_batch(w->t, w, w->ops, n);
        finish(w->t, w->ops, n, w->so);
    }
    return NULL;
}

/* ------------------------------------------------------ create/destroy -- */

static void fill_defaults(kvo_remote_tier_params *p) {
    kvo_remote_tier_params d = kvo_remote_tier_default_params();
    if (!p->key_prefix || !p->key_prefix[0]) p->key_prefix = d.key_prefix;
    if (!p->io_threads) p->io_threads = d.io_threads;
    if (!p->conns_per_node) p->conns_per_node = p->io_threads;
    if (!p->batch_max) p->batch_max = d.batch_max;
    if (!p->batch_max_bytes) p->batch_max_bytes = d.batch_max_bytes;
    if (!p->max_pending_writes) p->max_pending_writes = d.max_pending_writes;
    if (!p->max_pending_reads) p->max_pending_reads = d.max_pending_reads;
    if (!p->max_staging_bytes) p->max_staging_bytes = d.max_staging_bytes;
    if (!p->connect_timeout_ms) p->connect_timeout_ms = d.connect_timeout_ms;
    if (!p->io_timeout_ms) p->io_timeout_ms = d.io_timeout_ms;
    if (!p->down_backoff_ms) p->down_backoff_ms = d.down_backoff_ms;
    if (!p->max_redirects) p->max_redirects = d.max_redirects;
}

static int check_prefix(const char *s) {
    size_t n = strlen(s);
    if (n > 64) return kvo__error(KVO_EINVAL, "remote tier: key_prefix of %zu bytes, at most 64", n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= ' ' || s[i] == '{' || s[i] == '}' || (unsigned char)s[i] >= 127)
            return kvo__error(KVO_EINVAL, "remote tier: key_prefix '%s' has a space, brace or control byte at %zu "
                              "(use e.g. \"kvo\" or \"tenant-a\")", s, i);
    return 0;
}

/* Credentials: params, else the URL's, else the environment. */
static int credentials(const kvo_remote_tier_params *p, kvo__rc_url *u) {
    const char *user = p->user, *pass = p->password;
    if (!user && !u->user[0]) user = getenv("KVO_REDIS_USER");
    if (!pass && !u->pass[0]) pass = getenv("KVO_REDIS_PASSWORD");
    if ((user && kvo__strlcpy(u->user, user, sizeof u->user)) || (pass && kvo__strlcpy(u->pass, pass, sizeof u->pass)))
        return kvo__error(KVO_EINVAL, "remote tier: user or password longer than %u bytes", KVO__RC_SECRET_MAX - 1);
    return 0;
}

static int alloc_pools(kvo_remote_tier *t) {
    const kvo_remote_tier_params *p = &t->p;
    size_t n_ops = (size_t)p->max_pending_writes + p->max_pending_reads;
    t->ops = kvo__calloc(n_ops, sizeof *t->ops);
    t->hdrs = kvo__malloc((size_t)p->max_pending_writes * KVO_REMOTE_HEADER_BYTES);
    t->workers = kvo__calloc(p->io_threads, sizeof *t->workers);
    if (!t->ops || !t->hdrs || !t->workers) return kvo__error(KVO_ENOMEM, "remote tier: op pools");
    int rc = kvo__ring_init(&t->cq, sizeof(kvo_remote_completion), n_ops, n_ops, true, "remote tier completions");
    if (!rc) rc = kvo__hmap_init(&t->puts, sizeof(put_ent), 0, "remote tier: pending puts");
    if (!rc) rc = kvo__hmap_reserve(&t->puts, p->max_pending_writes, 16, "remote tier: pending puts");
    if (rc) return rc;
    for (size_t i = 0; i < n_ops; i++) {
        rop *op = &t->ops[i];
        if (i < p->max_pending_writes) {
            op->hdr = t->hdrs + i * KVO_REMOTE_HEADER_BYTES;
            op->next = t->free_w;
            t->free_w = op;
        } else {
            op->next = t->free_r;
            t->free_r = op;
        }
    }
    for (uint32_t i = 0; i < p->io_threads; i++) {
        rworker *w = &t->workers[i];
        w->t = t;
        w->ops = kvo__malloc(p->batch_max * sizeof *w->ops);
        w->cmds = kvo__malloc(2 * (size_t)p->batch_max * sizeof *w->cmds);
        w->hdrs = kvo__malloc((size_t)p->batch_max * KVO_REMOTE_HEADER_BYTES);
        w->ws = kvo__rc_ws_create();
        if (!w->ops || !w->cmds || !w->hdrs || !w->ws) return kvo__error(KVO_ENOMEM, "remote tier: worker batches");
        if (t->seal && !(w->so = kvo__seal_op_take(t->seal))) return KVO_ENOMEM;
    }
    return 0;
}

static int alloc_staging(kvo_remote_tier *t, uint64_t max_slot) {
    if (t->p.max_staging_bytes < max_slot) t->p.max_staging_bytes = max_slot;
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = kvo__align_up_u64(t->p.max_staging_bytes, KVO_SLOT_ALIGN);
    int rc = kvo_arena_create(&ap, &t->stage_arena);
    if (rc) return kvo__error_prefix(rc, "remote tier staging memory (max_staging_bytes)");
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = t->plan;
    sp.capacity_bytes = ap.bytes;
    sp.policy = KVO_POLICY_LRU;
    rc = kvo_store_create(&sp, &t->stage_index);
    if (rc) return kvo__error_prefix(rc, "remote tier staging index");
    return 0;
}

/* The fleet secret: params, else the environment (both from the same
 * place); "" = none.  Sets t->seal. */
static int open_seal(kvo_remote_tier *t, const kvo_remote_tier_params *pp) {
    const char *sec = pp->secret, *prev = pp->secret_previous;
    if (!sec) {
        sec = getenv("KVO_REMOTE_SECRET");
        prev = getenv("KVO_REMOTE_SECRET_PREVIOUS");
    }
    if (!sec || !sec[0]) {
        if (prev && prev[0])
            return kvo__error(KVO_EINVAL, "remote tier: a previous secret (secret_previous, "
                              "KVO_REMOTE_SECRET_PREVIOUS) without a secret: set remote_secret / KVO_REMOTE_SECRET "
                              "too");
        return 0;
    }
    return kvo__seal_create(sec, prev, "remote tier: remote_secret (KVO_REMOTE_SECRET)", &t->seal);
}

/* Once per process: a password in a URL ends up wherever the URL is
 * configured and logged. */
static void warn_url_password(void) {
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&warned))
        kvo__log(KVO_LOG_WARN, "kvoffload remote tier: the url carries a password; configs and logs that show "
                 "the url show it too: set KVO_REDIS_PASSWORD (and KVO_REDIS_USER) instead");
}

static int start(kvo_remote_tier *t, const kvo_remote_tier_params *pp) {
    int rc = check_prefix(t->p.key_prefix);
    if (rc) return rc;
    if ((rc = open_seal(t, pp)) != 0) return rc;
    char fp[33];
    kvo_u128_hex(kvo_plan_fingerprint(t->plan), fp);
    int nl = t->p.layout_hash
        ? snprintf(t->ns, sizeof t->ns, "%s:%s-%016llx:", t->p.key_prefix, fp, (unsigned long long)t->p.layout_hash)
        : snprintf(t->ns, sizeof t->ns, "%s:%s:", t->p.key_prefix, fp);
    t->ns_len = (size_t)nl;
    t->p.key_prefix = NULL; /* not kept: t->ns has it */
    kvo__rc_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    if ((rc = kvo__rc_url_parse(pp->url, &cfg.url)) != 0) return rc;
    if (cfg.url.pass[0]) warn_url_password();
    if ((rc = credentials(pp, &cfg.url)) != 0) {
        memset(&cfg.url, 0, sizeof cfg.url);
        return rc;
    }
    cfg.connect_timeout_ms = t->p.connect_timeout_ms;
    cfg.io_timeout_ms = t->p.io_timeout_ms;
    cfg.down_backoff_ms = t->p.down_backoff_ms;
    cfg.conns_per_node = t->p.conns_per_node;
    cfg.max_redirects = t->p.max_redirects;
    cfg.max_value_bytes = KVO_REMOTE_HEADER_BYTES + kvo_plan_max_slot_bytes(t->plan);
    rc = kvo__rc_create(&cfg, &t->rc);
    memset(&cfg.url, 0, sizeof cfg.url); /* the client keeps its own copy */
    if (rc) return rc;
    if ((rc = alloc_staging(t, kvo_plan_max_slot_bytes(t->plan))) != 0 || (rc = alloc_pools(t)) != 0) return rc;
    for (uint32_t i = 0; i < t->p.io_threads; i++) {
        if (pthread_create(&t->workers[i].th, NULL, worker_main, &t->workers[i]) != 0)
            return kvo__error(KVO_ENOMEM, "remote tier: cannot start worker thread %u of %u", i + 1, t->p.io_threads);
        t->n_workers++;
    }
    return 0;
}

int kvo_remote_tier_create(const kvo_remote_tier_params *pp, kvo_remote_tier **out) {
    kvo_remote_tier_params pp_in_;
    KVO__PARAMS_IN(pp, kvo_remote_tier_params, pp_in_, kvo_remote_tier_default_params, write_completions,
                   "kvo_remote_tier_create");
    if (!pp || !out) return kvo__error(KVO_EINVAL, "kvo_remote_tier_create: NULL params or out");
    if (!pp->plan) return kvo__error(KVO_EINVAL, "remote tier: no plan given");
    if (!pp->url || !pp->url[0])
        return kvo__error(KVO_EINVAL, "remote tier: no url given (e.g. redis://127.0.0.1:7000)");
    if (kvo_plan_max_slot_bytes(pp->plan) == 0) return kvo__error(KVO_EINVAL, "remote tier: the plan offloads no group");
    kvo_remote_tier *t = kvo__calloc(1, sizeof *t);
    if (!t) return kvo__error(KVO_ENOMEM, "remote tier");
    t->p = *pp;
    t->p.url = t->p.user = t->p.password = NULL; /* never kept */
    t->p.secret = t->p.secret_previous = NULL;  /* t->seal holds what is derived from them */
    fill_defaults(&t->p);
    t->plan = pp->plan;
    t->cq.efd = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    int rc = start(t, pp);
    if (rc) {
        kvo_remote_tier_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kvo_remote_tier_destroy(kvo_remote_tier *t) {
    if (!t) return;
    rop *canceled[64];
    pthread_mutex_lock(&t->mu);
    t->closing = true;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (;;) { /* queued reads: canceled (completions discarded) */
        size_t n = 0;
        pthread_mutex_lock(&t->mu);
        while (n < 64 && t->reads.n) {
            canceled[n] = rq_pop(&t->reads);
            canceled[n++]->result = KVO_ECANCELED;
        }
        pthread_mutex_unlock(&t->mu);
        if (!n) break;
        finish(t, canceled, n, NULL);
    }
    for (uint32_t i = 0; i < t->n_workers; i++) pthread_join(t->workers[i].th, NULL);
    if (t->workers)
        for (uint32_t i = 0; i < t->p.io_threads; i++) {
            kvo__free(t->workers[i].ops);
            kvo__free(t->workers[i].cmds);
            kvo__free(t->workers[i].hdrs);
            kvo__rc_ws_destroy(t->workers[i].ws);
            kvo__seal_op_give(t->seal, t->workers[i].so);
        }
    kvo__rc_destroy(t->rc);
    kvo__seal_destroy(t->seal);
    kvo_store_destroy(t->stage_index);
    kvo_arena_destroy(t->stage_arena);
    kvo__ring_free(&t->cq);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    kvo__free(t->workers);
    kvo__free(t->ops);
    kvo__free(t->hdrs);
    kvo__hmap_free(&t->puts);
    kvo__free(t);
}

/* --------------------------------------------------------- operations -- */

/* A chain of puts is tracked by key (t->puts); a chain of reads leaves
 * the reads of keys with a pending put waiting on it.  Under t->mu. */
static void track_puts(kvo_remote_tier *t, const rq *local) {
    for (rop *op = local->head; op; op = op->next) {
        uint64_t k0, k1;
        bool existed;
        put_digest(&op->key, &k0, &k1);
        put_ent *e = kvo__hmap_insert(&t->puts, k0, k1, &existed); /* room reserved at create */
        if (!existed) e->op = op; /* (a digest twin: that key's reads go to Redis) */
    }
}

static void wait_on_puts(kvo_remote_tier *t, rq *local) {
    rq keep = {0};
    for (rop *op = local->head, *next; op; op = next) {
        next = op->next;
        rop *put = put_of(t, &op->key);
        if (put) {
            op->next = put->waiters;
            put->waiters = op;
            t->st.reads_after_put += op->kind != KVO_REMOTE_OP_REMOVE;
        } else rq_push(&keep, op);
    }
    *local = keep;
}

static void queue_flush(kvo_remote_tier *t, rq *local) {
    if (!local->n) return;
    pthread_mutex_lock(&t->mu);
    bool is_put = local->head->kind == KVO_REMOTE_OP_PUT;
    if (is_put) track_puts(t, local);
    else if (t->puts.n) wait_on_puts(t, local);
    if (!local->n) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    rq *q = is_put ? &t->writes : &t->reads;
    if (q->tail) q->tail->next = local->head;
    else q->head = local->head;
    q->tail = local->tail;
    q->n += local->n;
    if (local->n > t->p.batch_max) pthread_cond_broadcast(&t->work_cv);
    else pthread_cond_signal(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    memset(local, 0, sizeof *local);
}

/* Reserve a write op (back-pressure) under mu.  NULL: dropped. */
static rop *reserve_write(kvo_remote_tier *t, bool *closed) {
    rop *op = NULL;
    bool report = t->p.write_completions;
    pthread_mutex_lock(&t->mu);
    *closed = t->closing;
    if (!t->closing && t->free_w && (!report || kvo__ring_reserve(&t->cq, 1) == 0)) {
        op = t->free_w;
        t->free_w = op->next;
        t->pending_writes++;
        op->report = report;
    } else if (!t->closing) t->st.dropped_backpressure++;
    pthread_mutex_unlock(&t->mu);
    return op;
}

/* Give back a reserved op that was not queued; count why. */
static void unreserve(kvo_remote_tier *t, rop *op, uint64_t *counter) {
    pthread_mutex_lock(&t->mu);
    op_free(t, op);
    if (op->report) kvo__ring_unreserve(&t->cq, 1);
    if (counter) (*counter)++;
    pthread_cond_broadcast(&t->done_cv);
    pthread_mutex_unlock(&t->mu);
}

/* Ops of one call are chained locally and handed to the workers at once
 * (every 16 ops and at the end), so that a worker finds a whole batch
 * instead of waking per op. */
static void queue(kvo_remote_tier *t, rq *local, rop *op) {
    rq_push(local, op);
    if (local->n >= 16) queue_flush(t, local);
}

/* One put/get/exists call: its local chain, count and return code. */
typedef struct call {
    rq local;
    size_t queued;
    int ret;
} call;

static void call_queue(kvo_remote_tier *t, call *c, rop *op) {
    queue(t, &c->local, op);
    c->queued++;
}

static void call_result(call *c, int *results, size_t i, int r, const char *what) {
    if (results) results[i] = r;
    if (r == KVO_ECLOSED) c->ret = kvo__error(KVO_ECLOSED, "remote tier: %s after destroy began", what);
}

static int call_end(kvo_remote_tier *t, call *c, size_t *n_queued) {
    queue_flush(t, &c->local);
    if (n_queued) *n_queued = c->queued;
    return c->ret;
}

static void op_fill(kvo_remote_tier *t, rop *op, uint32_t kind, const kvo_chunk_key *k, const kvo_group_plan *g,
                    uint64_t ud) {
    op->kind = kind;
    op->key = *k;
    op->key.tenant = 0;
    op->g = g;
    op->user_data = ud;
    op->t_queued = kvo__now_ns();
    op->result = 0;
    op->bytes = 0;
    op->waiters = NULL;
    key_name(t, &op->key, op->name, &op->nlen);
}

int kvo_remote_tier_put(kvo_remote_tier *t, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                        const uint64_t *user_data, int *results, size_t *n_queued) {
    if (!t || (n && (!keys || !srcs))) return kvo__error(KVO_EINVAL, "kvo_remote_tier_put: NULL argument");
    call cl = {0};
    for (size_t i = 0; i < n; i++) {
        int r = 0;
        const kvo_group_plan *g = key_group(t, &keys[i]);
        bool closed = false;
        rop *op = NULL;
        if (!g || !srcs[i]) r = KVO_EINVAL;
        else if (!(op = reserve_write(t, &closed))) r = closed ? KVO_ECLOSED : KVO_EAGAIN;
        if (op) {
            uint8_t need = 0;
            kvo_slot slot;
            int srs = kvo_store_prepare_store(t->stage_index, &keys[i], 1, &need, &slot, NULL, NULL, 0, NULL);
            op->kind = KVO_REMOTE_OP_PUT;
            if (srs != 0 || !need) {
                unreserve(t, op, srs == 0 ? &t->st.put_skipped : &t->st.dropped_backpressure);
                r = srs == 0 ? KVO_EEXIST : KVO_EAGAIN;
            } else {
                op_fill(t, op, KVO_REMOTE_OP_PUT, &keys[i], g, user_data ? user_data[i] : 0);
                op->stage = kvo_arena_slot(t->stage_arena, slot);
                op->sealed = false;
                if (t->seal) memcpy(op->stage, srcs[i], g->chunk_bytes); /* a worker seals it (no checksum) */
                else op->sum = kvo__file_copy_sum(op->stage, srcs[i], g->chunk_bytes);
                call_queue(t, &cl, op);
            }
        }
        call_result(&cl, results, i, r, "put");
    }
    return call_end(t, &cl, n_queued);
}

/* Queue gets, exists or removes (kind; dsts only for gets). */
static int queue_reads(kvo_remote_tier *t, uint32_t kind, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                       const uint64_t *user_data, int *results, size_t *n_queued) {
    call cl = {0};
    for (size_t i = 0; i < n; i++) {
        int r = 0;
        const kvo_group_plan *g = key_group(t, &keys[i]);
        rop *op = NULL;
        if (!g || (kind == KVO_REMOTE_OP_GET && !dsts[i])) r = KVO_EINVAL;
        else {
            pthread_mutex_lock(&t->mu);
            if (t->closing) r = KVO_ECLOSED;
            else if (!t->free_r || kvo__ring_reserve(&t->cq, 1) != 0) {
                r = KVO_EAGAIN;
                t->st.refused_reads++;
            } else {
                op = t->free_r;
                t->free_r = op->next;
                t->pending_reads++;
                op->report = true;
            }
            pthread_mutex_unlock(&t->mu);
        }
        if (op) {
            op_fill(t, op, kind, &keys[i], g, user_data ? user_data[i] : 0);
            op->dst = kind == KVO_REMOTE_OP_GET ? dsts[i] : NULL;
            call_queue(t, &cl, op);
        }
        call_result(&cl, results, i, r, "read");
    }
    return call_end(t, &cl, n_queued);
}

int kvo_remote_tier_get(kvo_remote_tier *t, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                        const uint64_t *user_data, int *results, size_t *n_queued) {
    if (!t || (n && (!keys || !dsts))) return kvo__error(KVO_EINVAL, "kvo_remote_tier_get: NULL argument");
    return queue_reads(t, KVO_REMOTE_OP_GET, keys, dsts, n, user_data, results, n_queued);
}

int kvo_remote_tier_exists(kvo_remote_tier *t, const kvo_chunk_key *keys, size_t n, const uint64_t *user_data,
                           int *results, size_t *n_queued) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_remote_tier_exists: NULL argument");
    return queue_reads(t, KVO_REMOTE_OP_EXISTS, keys, NULL, n, user_data, results, n_queued);
}

int kvo_remote_tier_remove(kvo_remote_tier *t, const kvo_chunk_key *keys, size_t n, const uint64_t *user_data,
                           int *results, size_t *n_queued) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_remote_tier_remove: NULL argument");
    return queue_reads(t, KVO_REMOTE_OP_REMOVE, keys, NULL, n, user_data, results, n_queued);
}
