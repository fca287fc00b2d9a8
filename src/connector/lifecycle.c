/*
 * Waiting and the end of a request: wait_blocks, wait_request, preempt,
 * abort and finish.
 *
 * Waits copy the job ids to wait for under c->mu, release it, and wait in
 * the transfer engine (never holding mu across a wait).  preempt cancels
 * the load (or waits for it if it already runs), unpins, bumps the
 * generation so that older results no longer reach the engine, takes the
 * request's LOAD completions still queued out of the ring, waits for
 * the request's copies, then resets (preempt) or removes (abort) the
 * request under mu again.  finish stores what is left and marks the request
 * FINISHED; it is removed (RELEASED emitted by poll.c) when its last copy
 * completes.
 */
#include "connector/connector_internal.h"

/* Collect in-flight store job ids <= max_id (or the request's jobs). */
static int kvo__collect(kvo_connector *c, uint64_t max_id, uint64_t **ids, size_t *n) {
    size_t cnt = 0;
    for (size_t i = 0; i < c->jobs.cap; i++)
        if (c->jobs.e[i].used) cnt++;
    uint64_t *v = kvo__malloc((cnt + 1) * sizeof *v);
    if (!v) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < c->jobs.cap; i++) {
        if (!c->jobs.e[i].used) continue;
        kvo__job *j = c->jobs.e[i].p;
        if (j->dir == KVO_XFER_STORE && j->id <= max_id) v[k++] = j->id;
    }
    *ids = v;
    *n = k;
    return 0;
}

int kvo_connector_wait_blocks(kvo_connector *c, const kvo_block_ref *blocks, size_t n) {
    if (!c || (!blocks && n)) return kvo__error(KVO_EINVAL, "kvo_connector_wait_blocks: NULL argument");
    kvo__conn_lock(c);
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (blocks[i].group >= c->ng) {
            kvo__conn_unlock(c);
            return kvo__error(KVO_EINVAL, "kvo_connector_wait_blocks: group %u out of range (%zu groups)",
                              blocks[i].group, c->ng);
        }
        kvo__map_entry *e = kvo__map_get(&c->blocks, kvo__conn_block_key(blocks[i].group, blocks[i].block));
        if (e && e->b > m) m = e->b;
    }
    uint64_t *ids = NULL;
    size_t k = 0;
    int rc = m ? kvo__collect(c, m, &ids, &k) : 0;
    kvo__conn_unlock(c);
    if (!rc && k) rc = kvo_transfer_wait(c->xfer, ids, k, -1);
    kvo__free(ids);
    return rc;
}

/* Copy a request's in-flight job ids (caller frees). */
static int kvo__req_job_ids(kvo__req *r, uint64_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!r->n_jobs) return 0;
    *ids = kvo__malloc(r->n_jobs * sizeof **ids);
    if (!*ids) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    memcpy(*ids, r->jobs, r->n_jobs * sizeof **ids);
    *n = r->n_jobs;
    return 0;
}

int kvo_connector_wait_request(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_wait_request: c must not be NULL");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    uint64_t *ids = NULL;
    size_t n = 0;
    int rc = r ? kvo__req_job_ids(r, &ids, &n) : kvo__conn_req_missing(id);
    kvo__conn_unlock(c);
    if (!rc && n) rc = kvo_transfer_wait(c->xfer, ids, n, -1);
    kvo__free(ids);
    return rc;
}

/* Preempt: cancel or wait for copies, unpin, reset.  remove: then delete. */
static int kvo__preempt(kvo_connector *c, uint64_t id, bool remove) {
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    if (!r) {
        kvo__conn_unlock(c);
        return kvo__conn_req_missing(id);
    }
    /* The copies to wait for (the load's too, should cancel find it
     * running); taken first so that running out of memory changes nothing. */
    uint64_t *ids = NULL;
    size_t n = 0;
    int rc = kvo__req_job_ids(r, &ids, &n);
    if (rc) {
        kvo__conn_unlock(c);
        return rc;
    }
    if (r->deferred) { /* a load still waiting for file reads: never submitted */
        kvo__conn_job_free(r->deferred);
        r->deferred = NULL;
        c->st.loads--;
    }
    kvo__conn_unpin_hit(c, r);
    if (r->load_job) {
        (void)kvo_transfer_cancel(c->xfer, r->load_job); /* 0 or already running */
        r->load_job = 0;
    }
    r->gen++; /* results of older copies no longer reach the engine */
    (void)kvo__conn_cq_drop_loads(c, id); /* nor those already queued */
    if (r->state == REQ_LOADING) kvo__conn_req_set_state(c, r, REQ_ACTIVE);
    kvo__conn_unlock(c);
    if (n) rc = kvo_transfer_wait(c->xfer, ids, n, -1);
    kvo__free(ids);
    kvo__conn_lock(c);
    r = kvo__conn_req_get(c, id);
    if (r) {
        if (remove) {
            kvo__conn_req_remove(c, r);
        } else {
            r->computed = 0;
            r->n_retry = 0;
            for (size_t g = 0; g < c->ng; g++) r->next_chunk[g] = 0;
        }
    }
    kvo__conn_unlock(c);
    return rc;
}

int kvo_connector_preempt(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_preempt: c must not be NULL");
    return kvo__preempt(c, id, false);
}

int kvo_connector_abort(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_abort: c must not be NULL");
    return kvo__preempt(c, id, true);
}

int kvo_connector_finish(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables, bool *busy) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_finish: c must not be NULL");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else if (r->state == REQ_LOADING)
        rc = kvo__error(KVO_ESTATE, "request %llu: finish while its load is in flight (poll it, or abort)",
                        (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: already finished", (unsigned long long)id);
    else if (tables)
        rc = kvo__conn_check_update(c, r, id, computed_tokens, tables, n_tables);
    if (!rc) rc = kvo__conn_cq_reserve_owed(c); /* room for RELEASED */
    if (rc) {
        kvo__conn_unlock(c);
        return rc;
    }
    kvo__conn_unpin_hit(c, r);
    if (tables) {
        if (computed_tokens > r->computed) r->computed = computed_tokens;
        kvo__conn_issue_stores(c, r, tables, computed_tokens, true);
        if (c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS)
            kvo__conn_store_final_checkpoint(c, r, tables, computed_tokens);
    }
    kvo__conn_req_set_state(c, r, REQ_FINISHED);
    c->st.requests_finished++;
    bool b = r->n_jobs > 0;
    if (!b) kvo__conn_req_remove(c, r);
    if (busy) *busy = b;
    kvo__conn_unlock(c);
    return 0;
}
