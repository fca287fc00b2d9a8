/*
 * The completions queued for the engine until it polls: the library's one
 * completion ring (src/core/ring.c), without an eventfd (the engine's fd is
 * the transfer engine's).
 *
 * Completions owed to the engine (a LOAD for each request LOADING, a
 * RELEASED for each FINISHED; cq_owed counts them, kept exact by
 * kvo__conn_req_set_state) have room before they become owed: load and
 * finish call kvo__conn_cq_reserve_owed before they accept (the ring grows
 * to len + cq_owed + 1: the connector counts its promises itself), so
 * kvo__conn_emit never allocates and a completion is never lost to a
 * failed allocation.  Completions already queued when a request is
 * preempted or aborted are taken out again (kvo__conn_cq_drop_loads).
 *
 * A leaf of the connector's layering (connector_internal.h): it calls no
 * other file of the folder.  Locks: the caller holds c->mu.
 */
#include "connector/connector_internal.h"

int kvo__conn_cq_reserve_owed(kvo_connector *c) {
    if (kvo__ring_grow(&c->cq, c->cq.len + c->cq_owed + 1))
        return kvo__error(KVO_ENOMEM, "connector: out of memory for completions");
    return 0;
}

typedef struct kvo__drop_arg {
    uint64_t id;
} kvo__drop_arg;

static bool kvo__is_load_of(const void *entry, void *arg) {
    const kvo_completion *cp = entry;
    return cp->request == ((kvo__drop_arg *)arg)->id && cp->type == KVO_COMPLETION_LOAD;
}

/* Drop the LOAD completions of request id still queued, keeping the order
 * of the others (preempt / abort: the engine must never see a load of an
 * earlier life of the request).  RELEASED completions stay: one queued
 * under a live request's id belongs to a finished earlier request with that
 * id, whose blocks the engine still has to free.  cq_owed counts
 * completions not yet queued, so it is unchanged and the ring keeps room
 * for every one of them.  O(queued). */
size_t kvo__conn_cq_drop_loads(kvo_connector *c, uint64_t id) {
    kvo__drop_arg a = {id};
    return kvo__ring_filter(&c->cq, kvo__is_load_of, &a);
}

void kvo__conn_emit(kvo_connector *c, const kvo_completion *cp) {
    assert(c->cq.len + c->cq_owed <= c->cq.cap);
    *(kvo_completion *)kvo__ring_push_unowed(&c->cq) = *cp;
}

size_t kvo__conn_cq_take(kvo_connector *c, kvo_completion *out, size_t cap) {
    return out ? kvo__ring_take(&c->cq, out, cap) : 0;
}
