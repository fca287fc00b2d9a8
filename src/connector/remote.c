/*
 * Remote-tier hand-off: presence queries for lookup, reads into host slots,
 * write-through puts, and consuming the tier's completions.
 *
 * The remote tier (src/tiers/remote/, a Redis Cluster) sits behind host and
 * file.  Every call into it only queues work and returns (its worker
 * threads talk to the network), so nothing here ever waits for Redis while
 * c->mu is held, and lookup never stalls the scheduler.
 *
 * Presence.  Lookup needs to know which of the chunks (and state snapshots,
 * lookup.c) that host and file miss the cluster holds, without waiting for
 * it.  One lookup asks in a round: begin (the request's budget), ask once
 * per key set, end (the budget's bookkeeping over all of them).  rpres maps a 64-bit
 * digest of each asked key to its answer: IN FLIGHT (an EXISTS query is
 * queued), PRESENT or ABSENT, with the time it was queued or answered.  A
 * lookup uses an answer younger than remote_exists_ttl_ms; a key without
 * one gets a query (batched: one kvo_remote_tier_exists call per lookup) and
 * counts as PENDING, so the agreement reports KVO_HIT_PENDING when the
 * answer could lengthen the hit.  Each request has a budget
 * (remote_lookup_budget_us from its first such PENDING answer): once spent,
 * running queries count as MISS and lookup answers what host and file
 * serve; the answers still land in rpres for later lookups.  A node that is
 * down answers EIO at once, recorded as ABSENT for the TTL, so a dead
 * cluster costs one failed query per key per TTL and never a wait.
 * A put this engine made turns the key's answer into PRESENT: a remembered
 * ABSENT at once, and a query still in flight when its answer lands
 * (IN FLIGHT, PUT).  That query's "absent" is stale: Redis read the key
 * before the put, and an engine may store a key while its query runs (a
 * lookup that answered without waiting, or vLLM computing a request once
 * one group's key missed); taken as it is, the next lookup after the host
 * tier dropped the chunk missed until the answer expired.
 * A digest collision or a stale PRESENT can only make a get fail (absent),
 * which fails that load (the engine recomputes): never wrong bytes, since
 * the tier verifies every value's header and checksum.  rpres is bounded
 * (KVO__RPRES_MAX entries): when full it is emptied (answers are only a
 * cache; completions of queries it forgot are ignored).
 *
 * Reads.  A hit on PRESENT chunks reserves host slots (PENDING in the host
 * store) and queues gets into them, tracked as kvo__read records exactly
 * like file reads (lookup.c): a load issued before they land waits
 * (deferred), a get that fails (absent, corrupt value, node down, timeout)
 * fails the load with tokens_valid = local_tokens, and its key is recorded
 * ABSENT.  kvo__conn_remote_poll does the tier's bookkeeping of a finished
 * get and hands it back to its caller (poll.c), which finishes the host
 * entry and the request's load: this file never calls up into the
 * dispatcher.  remote_reads_inflight counts queued gets so that destroy
 * can wait for every one to land before the arena is unmapped.
 *
 * Writes.  When a store job completes (poll.c), its chunks are put to the
 * tier, which copies them into its staging memory before returning
 * (write-through).  Puts the tier refuses (back-pressure, closing) are
 * counted in remote_writes_dropped; they never block the engine.  Groups
 * whose current slot format the tier does not hold (remote_groups, the
 * layout rule of relayout.c) are neither asked, read nor written.
 *
 * Layering (connector_internal.h): calls only map.c.  Locks: everything
 * runs under c->mu (the tier's calls never block).
 */
#include "connector/connector_internal.h"
#include "kvoffload/kvo_remote_tier.h"

enum { RP_INFLIGHT = 1, RP_PRESENT = 2, RP_ABSENT = 3, RP_INFLIGHT_PUT = 4 /* in flight, put since: lands PRESENT */ };
#define KVO__RPRES_MAX (1u << 16)
/* A query older than this is asked again (its completion was lost to a
 * cleared rpres, or never comes). */
#define KVO__RPRES_STALE_NS (10ull * 1000000000ull)

static uint64_t kvo__rdigest(const kvo_chunk_key *k) {
    return k->hash.lo ^ (k->hash.hi * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)k->group * 0xbf58476d1ce4e5b9ull);
}

int kvo__conn_remote_init(kvo_connector *c) { return c->remote ? kvo__map_init(&c->rpres, 256) : 0; }

/* Record an answer for key k (a completion); kept only for a key asked. */
static void kvo__rpres_set(kvo_connector *c, const kvo_chunk_key *k, int state, bool insert) {
    kvo__map_entry *e = kvo__map_get(&c->rpres, kvo__rdigest(k));
    if (!e && (!insert || c->rpres.n >= KVO__RPRES_MAX || kvo__map_put(&c->rpres, kvo__rdigest(k), &e) < 0)) return;
    e->a = (uint64_t)state;
    e->b = kvo__now_ns();
}

/* Scratch for n remote keys: keys, their state index, results. */
static int kvo__rscratch(kvo_connector *c, size_t n) {
    const kvo__arr a[] = {{(void **)&c->r_keys, sizeof *c->r_keys},
                          {(void **)&c->r_idx, sizeof *c->r_idx},
                          {(void **)&c->r_res, sizeof *c->r_res}};
    return kvo__grow_all(&c->r_cap, n, a, sizeof a / sizeof a[0], 64, "connector: remote queries");
}

void kvo__conn_remote_begin(kvo_connector *c, kvo__req *r, kvo__rround *rr) {
    rr->now = kvo__now_ns();
    rr->ttl = (uint64_t)c->p.remote_exists_ttl_ms * 1000000u;
    uint64_t budget = (uint64_t)c->p.remote_lookup_budget_us * 1000u;
    rr->wait = r->remote_wait_ns ? rr->now - r->remote_wait_ns < budget : budget > 0;
    rr->inflight = false;
    if (c->rpres.n >= KVO__RPRES_MAX) { /* a cache: start over */
        kvo__map_free(&c->rpres);
        (void)kvo__map_init(&c->rpres, 256); /* on failure rpres stays empty: no answers, no queries */
    }
}

void kvo__conn_remote_ask(kvo_connector *c, kvo__rround *rr, const kvo_chunk_key *keys, size_t n, const size_t *off,
                          uint8_t *st, uint8_t *tier) {
    size_t nq = 0;
    if (!c->rpres.cap || kvo__rscratch(c, n)) return; /* no remote answer this time */
    size_t *idx = c->r_idx;
    int *res = c->r_res;
    for (size_t i = 0; i < n; i++) {
        size_t at = kvo__conn_state_at(c, off, i);
        if (st[at] != KVO_MISS || !((c->remote_groups >> keys[i].group) & 1)) continue;
        kvo__map_entry *e = kvo__map_get(&c->rpres, kvo__rdigest(&keys[i]));
        if (e && e->a != RP_INFLIGHT && rr->now - e->b < rr->ttl) {
            if (e->a == RP_PRESENT || e->a == RP_INFLIGHT_PUT) {
                st[at] = KVO_READY;
                tier[at] = TIER_REMOTE;
            }
            continue;
        }
        if (e && (e->a == RP_INFLIGHT || e->a == RP_INFLIGHT_PUT) && rr->now - e->b < KVO__RPRES_STALE_NS) {
            rr->inflight = true;
            if (rr->wait) st[at] = KVO_PENDING;
            continue;
        }
        if (!e && (c->rpres.n >= KVO__RPRES_MAX || kvo__map_put(&c->rpres, kvo__rdigest(&keys[i]), &e) < 0))
            continue;
        e->a = RP_INFLIGHT;
        e->b = rr->now;
        c->r_keys[nq] = keys[i];
        idx[nq++] = at;
    }
    size_t queued = 0;
    if (nq) {
        int rc = kvo_remote_tier_exists(c->remote, c->r_keys, nq, NULL, res, &queued);
        for (size_t i = 0; i < nq; i++) {
            if (rc == 0 && res[i] == 0) {
                rr->inflight = true;
                if (rr->wait) st[idx[i]] = KVO_PENDING;
                continue;
            }
            kvo__map_entry *e = kvo__map_get(&c->rpres, kvo__rdigest(&c->r_keys[i])); /* refused: unknown */
            if (e) kvo__map_del(&c->rpres, e);
            c->st.remote_exists_refused++;
        }
        c->st.remote_exists += queued;
    }
}

void kvo__conn_remote_end(kvo_connector *c, kvo__req *r, const kvo__rround *rr, bool *pending) {
    if (!rr->inflight) {
        r->remote_wait_ns = 0; /* every answer is in: the next wait gets a fresh budget */
        return;
    }
    if (!r->remote_wait_ns) r->remote_wait_ns = rr->now;
    if (rr->wait) *pending = true;
    else c->st.remote_budget_expired++;
}

int kvo__conn_remote_get(kvo_connector *c, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                         const uint64_t *ud, int *res, size_t *nq) {
    int rc = kvo_remote_tier_get(c->remote, keys, dsts, n, ud, res, nq);
    if (rc == 0) c->remote_reads_inflight += *nq;
    return rc;
}

void kvo__conn_remote_put(kvo_connector *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *srcs[B];
    int res[B];
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B, m = 0, nq = 0;
        for (size_t k = 0; k < b; k++) {
            if (!((c->remote_groups >> keys[i + k].group) & 1)) continue; /* another format */
            wk[m] = keys[i + k];
            srcs[m++] = kvo__conn_slot_ptr(c, slots[i + k]);
        }
        if (!m) continue;
        int rc = kvo_remote_tier_put(c->remote, wk, srcs, m, NULL, res, &nq);
        for (size_t k = 0; k < m; k++) {
            int r = rc ? rc : res[k];
            if (r == 0) {
                c->st.remote_writes++;
                c->st.remote_write_bytes += kvo_plan_group(c->plan, wk[k].group)->chunk_bytes;
            } else if (r != KVO_EEXIST) {
                c->st.remote_writes_dropped++;
                continue;
            }
            kvo__map_entry *e = kvo__map_get(&c->rpres, kvo__rdigest(&wk[k])); /* its answer is PRESENT now */
            if (e) kvo__rpres_set(c, &wk[k], e->a == RP_INFLIGHT ? RP_INFLIGHT_PUT : RP_PRESENT, false);
        }
    }
}

size_t kvo__conn_remote_poll(kvo_connector *c, kvo__read_done *done, size_t *n_done) {
    kvo_remote_completion rc[KVO__REMOTE_POLL_BATCH];
    size_t n = 0;
    *n_done = 0;
    if (kvo_remote_tier_poll(c->remote, rc, KVO__REMOTE_POLL_BATCH, &n) != 0) return 0;
    for (size_t i = 0; i < n; i++) {
        const kvo_remote_completion *x = &rc[i];
        if (x->op == KVO_REMOTE_OP_EXISTS) {
            /* EIO (node down) counts as absent for the TTL: no query
             * storm against a dead node, no wait */
            kvo__map_entry *e = kvo__map_get(&c->rpres, kvo__rdigest(&x->key));
            if (e && e->a == RP_INFLIGHT) kvo__rpres_set(c, &x->key, x->result == 0 ? RP_PRESENT : RP_ABSENT, false);
            else if (e && e->a == RP_INFLIGHT_PUT) kvo__rpres_set(c, &x->key, RP_PRESENT, false);
        } else if (x->op == KVO_REMOTE_OP_GET) {
            if (c->remote_reads_inflight) c->remote_reads_inflight--;
            if (x->result) kvo__rpres_set(c, &x->key, RP_ABSENT, true);
            done[(*n_done)++] = (kvo__read_done){x->user_data, x->result, x->bytes};
        }
    }
    return n;
}

void kvo__conn_remote_free(kvo_connector *c) {
    if (c->remote && c->reads.e) {
        /* every queued get completes (bounded by the tier's I/O timeouts);
         * none may land in the arena after it is unmapped */
        while (c->remote_reads_inflight) {
            kvo_remote_completion rc[KVO__REMOTE_POLL_BATCH];
            size_t n = 0;
            (void)kvo_remote_tier_poll(c->remote, rc, KVO__REMOTE_POLL_BATCH, &n);
            for (size_t i = 0; i < n; i++) {
                if (rc[i].op != KVO_REMOTE_OP_GET) continue;
                c->remote_reads_inflight--;
                kvo__map_entry *e = kvo__map_get(&c->reads, rc[i].user_data);
                if (!e) continue;
                kvo__free(e->p);
                kvo__map_del(&c->reads, e);
            }
            if (n == 0 && kvo_remote_tier_wait(c->remote, -1) == KVO_ENOTFOUND) break;
        }
    }
    kvo__map_free(&c->rpres);
    kvo__free(c->r_keys);
    kvo__free(c->r_idx);
    kvo__free(c->r_res);
    c->r_keys = NULL;
    c->r_idx = NULL;
    c->r_res = NULL;
    c->r_cap = 0;
}
