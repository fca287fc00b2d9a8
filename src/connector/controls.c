/*
 * Controls an engine sets on the connector: per-request limits on what is
 * loaded and stored, a cap on the boundary any lookup returns, and reset.
 *
 * Limits.  A request's max_load_tokens and the connector's max_hit_tokens
 * only lower the largest candidate boundary handed to the agreement
 * (kvo__conn_bmax): the agreement then finds the best boundary below it,
 * so a capped hit is still one every group serves (never a plain
 * truncation, which could cut a state group between snapshots).  The store
 * limits (max_offload_tokens, offload_prompt_only) become one token count,
 * store_limit: update.c stores no chunk ending beyond it.
 *
 * Reset and epochs.  kvo_connector_reset must drop every cached chunk while
 * requests are in flight, without waiting for copies.  The connector keeps
 * an epoch, bumped by reset; every store job, file read and request records
 * the epoch it started in, and a request's key namespace mixes in its epoch
 * (epoch 0: the plain namespace, so files from before any reset still hit
 * after a restart).  Keys of different epochs never match, which is what
 * makes the reset exact: entries that could not be removed at once (pinned
 * by a load in flight, PENDING) and the file tier's chunks can never be hit
 * by a newer request.  After the bump:
 *  - READY host chunks are removed at once (kvo_cascade_invalidate), to
 *    free room (pinned ones retired);
 *  - a store job or promotion of an older epoch completes its entries as
 *    failed (removed);
 *  - a load job of an older epoch completes normally for the engine and
 *    then removes the chunks it had pinned;
 *  - a hit pinned but not loaded is unpinned (then cleared) and marked
 *    stale: its load completes at once with KVO_ECANCELED;
 *  - a request of an older epoch stores nothing more and hits nothing (its
 *    engine KV predates the reset; its keys are of the old namespace).
 * Everything happens under c->mu in O(requests + entries); no wait.
 */
#include "connector/connector_internal.h"

uint64_t kvo__conn_bmax(const kvo_connector *c, const kvo__req *r, uint64_t L) {
    if (r->epoch != c->epoch) return 0; /* added before a reset: no hits */
    uint64_t b = r->n_tokens ? r->n_tokens - 1 : 0;
    if (c->p.max_hit_tokens && c->p.max_hit_tokens < b) b = c->p.max_hit_tokens;
    if (r->max_load && L + r->max_load < b) b = L + r->max_load;
    return b;
}

void kvo__conn_req_controls(kvo_connector *c, kvo__req *r, const kvo_request_desc *d) {
    r->max_load = d->max_load_tokens;
    r->store_limit = UINT64_MAX;
    if (d->max_offload_tokens) r->store_limit = d->max_offload_tokens;
    if (d->offload_prompt_only && r->prompt_tokens < r->store_limit) r->store_limit = r->prompt_tokens;
    r->epoch = c->epoch;
    if (c->epoch) { /* a namespace per epoch; epoch 0 keeps the plain one */
        uint8_t e[4] = {(uint8_t)c->epoch, (uint8_t)(c->epoch >> 8), (uint8_t)(c->epoch >> 16),
                        (uint8_t)(c->epoch >> 24)};
        r->ns = kvo_keys_namespace(r->ns, e, sizeof e);
    }
}

int kvo_connector_reset(kvo_connector *c, uint64_t *n_removed) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_reset: c must not be NULL");
    kvo__conn_lock(c);
    c->epoch++;
    /* unpin the hits of lookups not yet loaded; their loads fail */
    for (size_t i = 0; i < c->reqs.cap; i++) {
        if (!c->reqs.e[i].used) continue;
        kvo__req *r = c->reqs.e[i].p;
        if (!r->hit_pinned) continue;
        for (size_t k = 0; k < r->n_hit; k++)
            if (r->hit[k].pinned) {
                (void)kvo_cascade_complete_load(c->casc, &r->hit[k].key, 1);
                r->hit[k].pinned = 0;
            }
        r->hit_stale = true;
    }
    /* READY host chunks go now (pinned ones are retired), promotions in
     * flight land as failures */
    int rc = kvo_cascade_invalidate(c->casc, UINT64_MAX, n_removed);
    kvo__conn_unlock(c);
    return rc;
}
