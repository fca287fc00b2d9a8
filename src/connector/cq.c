/*
 * The completion ring: completions queued for the engine until it polls.
 *
 * A ring of kvo_completion (cq, cq_head, cq_n, cq_cap) that grows by
 * doubling.  Completions owed to the engine (a LOAD for each request
 * LOADING, a RELEASED for each FINISHED; cq_owed counts them, kept exact by
 * kvo__conn_req_set_state) have room reserved before they become owed:
 * load and finish call kvo__conn_cq_reserve_owed before they accept, so
 * kvo__conn_emit never allocates and a completion is never lost to a
 * failed allocation.  Completions already queued when a request is
 * preempted or aborted are taken out again (kvo__conn_cq_drop_loads).
 *
 * A leaf of the connector's layering (connector_internal.h): it calls no
 * other file of the folder.  Locks: the caller holds c->mu.
 */
#include "connector/connector_internal.h"

/* Room in the completion ring for `need` entries. */
static int kvo__cq_reserve(kvo_connector *c, size_t need) {
    if (need > c->cq_cap) {
        size_t ncap = c->cq_cap ? c->cq_cap : 64;
        while (ncap < need) ncap *= 2;
        kvo_completion *nq = kvo__malloc(ncap * sizeof *nq);
        if (!nq) return kvo__error(KVO_ENOMEM, "connector: out of memory for completions");
        for (size_t i = 0; i < c->cq_n; i++) nq[i] = c->cq[(c->cq_head + i) % c->cq_cap];
        kvo__free(c->cq);
        c->cq = nq;
        c->cq_cap = ncap;
        c->cq_head = 0;
    }
    return 0;
}

/* Room for every completion owed plus one more (call before accepting a
 * load or a finish). */
int kvo__conn_cq_reserve_owed(kvo_connector *c) { return kvo__cq_reserve(c, c->cq_n + c->cq_owed + 1); }

/* Drop the LOAD completions of request id still queued in the ring, keeping
 * the order of the others (preempt / abort: the engine must never see a
 * load of an earlier life of the request).  RELEASED completions stay: one
 * queued under a live request's id belongs to a finished earlier request
 * with that id, whose blocks the engine still has to free.  Only cq_n
 * shrinks; cq_owed counts completions not yet queued, so it is unchanged
 * and the ring keeps room for every one of them.  O(queued). */
size_t kvo__conn_cq_drop_loads(kvo_connector *c, uint64_t id) {
    size_t k = 0;
    for (size_t i = 0; i < c->cq_n; i++) {
        const kvo_completion *cp = &c->cq[(c->cq_head + i) % c->cq_cap];
        if (cp->request == id && cp->type == KVO_COMPLETION_LOAD) continue;
        c->cq[(c->cq_head + k) % c->cq_cap] = *cp;
        k++;
    }
    size_t dropped = c->cq_n - k;
    c->cq_n = k;
    return dropped;
}

/* Queue a completion; room was reserved when it became owed. */
void kvo__conn_emit(kvo_connector *c, const kvo_completion *cp) {
    assert(c->cq_n < c->cq_cap);
    if (c->cq_n == c->cq_cap && kvo__cq_reserve(c, c->cq_n + 1)) return; /* not reached */
    c->cq[(c->cq_head + c->cq_n) % c->cq_cap] = *cp;
    c->cq_n++;
}

/* Move up to cap queued completions, oldest first, into out (may be NULL
 * when cap is 0); returns how many. */
size_t kvo__conn_cq_take(kvo_connector *c, kvo_completion *out, size_t cap) {
    size_t n = 0;
    while (out && n < cap && c->cq_n) {
        out[n++] = c->cq[c->cq_head];
        c->cq_head = (c->cq_head + 1) % c->cq_cap;
        c->cq_n--;
    }
    return n;
}
