/*
 * poll: the dispatcher.  Everything that finishes in a lower layer comes
 * back to the connector here and is turned into completions for the engine.
 *
 * kvo_connector_poll drives the cascade (kvo_cascade_poll: the tiers'
 * completions, deferred writes) and takes its promotions' completions, each
 * finishing its kvo__read and, with the last read of a hit, submitting the
 * request's deferred load (load.c); then the transfer engine's results:
 * store jobs complete their host entries through the cascade (which takes
 * the checksums and hands the chunks to the lower tiers), load jobs unpin
 * and report (checksums verified by the cascade), checked against the
 * request's generation so that preempted or aborted requests get no
 * notification; then it hands the ring's completions (cq.c) to the engine.
 * kvo__conn_process_results (the transfer results alone) is also what
 * set_layout and destroy call to finish the copies in flight.
 *
 * Locks: everything under c->mu; the cascade's and the engine's poll calls
 * never block.
 */
#include "connector/connector_internal.h"

static void kvo__req_drop_job(kvo__req *r, uint64_t job) {
    for (size_t i = 0; i < r->n_jobs; i++)
        if (r->jobs[i] == job) {
            r->jobs[i] = r->jobs[--r->n_jobs];
            return;
        }
}

static void kvo__finish_store_job(kvo_connector *c, kvo__job *j, const kvo_xfer_result *res, kvo__req *r) {
    bool ok = res->status == 0 && j->epoch == c->epoch; /* a reset drops older stores */
    if (ok && c->inject_store_fail) {
        c->inject_store_fail--;
        ok = false;
    }
    /* the cascade takes the checksums while the slots are still PENDING
     * and hands the chunks to the lower tiers */
    if (kvo_cascade_complete_store(c->casc, j->keys, j->n_keys, ok) != 0) ok = false;
    if (ok) {
        c->st.chunks_stored += j->n_keys;
        kvo__conn_tenant(c, j->tenant)->stored_chunks += j->n_keys;
        c->st.bytes_stored += res->bytes;
        if (r) {
            r->st.chunks_stored += j->n_keys;
            r->st.bytes_stored += res->bytes;
        }
    } else {
        c->st.stores_failed += j->n_keys;
    }
    for (size_t i = 0; i < j->n_blocks; i++) {
        kvo__map_entry *e = kvo__map_get(&c->blocks, kvo__conn_block_key(j->blocks[i].group, j->blocks[i].block));
        if (e && --e->a == 0) kvo__map_del(&c->blocks, e);
    }
}

static void kvo__finish_load_job(kvo_connector *c, kvo__job *j, const kvo_xfer_result *res, kvo__req *r) {
    int status = res->status;
    if (status == 0 && c->inject_load_fail) {
        c->inject_load_fail--;
        status = KVO_EIO;
    }
    /* verify_checksums: a corrupt chunk fails the load and is retired by
     * the cascade (hidden from lookups now, gone when its last pin ends) */
    if (status == 0 && kvo_cascade_verify(c->casc, j->keys, j->slots, j->n_keys, NULL)) status = KVO_ECORRUPT;
    (void)kvo_cascade_complete_load(c->casc, j->keys, j->n_keys);
    if (j->epoch != c->epoch) /* pinned through a reset: drop now (retired while other loads pin it) */
        (void)kvo_store_retire(kvo__conn_hs(c, j->keys), j->keys, j->n_keys); /* one request: one part */
    if (!r || r->gen != j->gen || r->load_job != j->id) return; /* preempted or aborted */
    kvo__conn_hist_add(&c->load_ns, kvo__now_ns() - j->t0_ns);
    r->load_job = 0;
    kvo__conn_req_set_state(c, r, REQ_ACTIVE);
    kvo_completion cp;
    memset(&cp, 0, sizeof cp);
    cp.request = r->id;
    cp.type = KVO_COMPLETION_LOAD;
    cp.status = status;
    r->n_invalid = 0;
    if (status == 0) {
        uint64_t t = j->tokens - j->local;
        cp.tokens_valid = j->tokens;
        if (j->tokens > r->computed) r->computed = j->tokens;
        r->st.tokens_loaded += t;
        r->st.tokens_loaded_host += j->host_tokens;
        r->st.tokens_loaded_file += j->file_tokens;
        r->st.tokens_loaded_remote += j->remote_tokens;
        r->st.bytes_loaded += res->bytes;
        r->st.chunks_loaded += j->n_keys;
        c->st.tokens_loaded += t;
        kvo__conn_tenant(c, r->tenant)->loaded_tokens += t;
        c->st.tokens_loaded_host += j->host_tokens;
        c->st.tokens_loaded_file += j->file_tokens;
        c->st.tokens_loaded_remote += j->remote_tokens;
        c->st.bytes_loaded += res->bytes;
        c->st.chunks_loaded += j->n_keys;
    } else {
        cp.tokens_valid = j->local;
        r->st.load_failures++;
        c->st.load_failures++;
        kvo__conn_tenant(c, r->tenant)->load_failures++;
        assert(j->n_blocks <= r->cap_invalid);
        if (j->n_blocks) memcpy(r->invalid, j->blocks, j->n_blocks * sizeof *r->invalid);
        r->n_invalid = j->n_blocks;
        cp.n_invalid_blocks = j->n_blocks;
    }
    kvo__conn_emit(c, &cp);
}

void kvo__conn_process_results(kvo_connector *c) {
    kvo_xfer_result res[64];
    for (;;) {
        size_t n = 0;
        if (kvo_transfer_poll(c->xfer, res, 64, &n) || n == 0) break;
        for (size_t i = 0; i < n; i++) {
            kvo__map_entry *e = kvo__map_get(&c->jobs, res[i].job_id);
            if (!e) continue;
            kvo__job *j = e->p;
            kvo__map_del(&c->jobs, e);
            kvo__req *r = kvo__conn_req_get(c, j->req);
            if (r) kvo__req_drop_job(r, j->id);
            if (j->dir == KVO_XFER_STORE)
                kvo__finish_store_job(c, j, &res[i], r);
            else
                kvo__finish_load_job(c, j, &res[i], r);
            if (r && r->state == REQ_FINISHED && r->n_jobs == 0) {
                kvo_completion cp;
                memset(&cp, 0, sizeof cp);
                cp.request = r->id;
                cp.type = KVO_COMPLETION_RELEASED;
                kvo__conn_emit(c, &cp);
                kvo__conn_req_remove(c, r);
            }
            kvo__conn_job_free(j);
        }
    }
}

/* A promotion of a hit's chunk finished (user data ud, result, bytes): the
 * cascade already completed the host entry (READY on success); the chunk is
 * pinned for the request's load, and the request's deferred load is
 * submitted once its last read is in. */
static void kvo__finish_read(kvo_connector *c, uint64_t ud, int result, uint64_t bytes) {
    kvo__map_entry *e = kvo__map_get(&c->reads, ud);
    if (!e) return;
    kvo__read *rd = e->p;
    kvo__map_del(&c->reads, e);
    /* a read started before its group's slot format changed (relayout.c) or
     * before a reset (controls.c) is never used: the cascade invalidated it */
    bool ok = result == 0 && rd->lay_epoch == c->lay_epoch[rd->key.group] && rd->epoch == c->epoch;
    if (rd->tier == KVO_TIER_REMOTE) {
        if (ok) {
            c->st.remote_reads++;
            c->st.remote_read_bytes += bytes;
        } else
            c->st.remote_read_failures++;
    } else if (ok)
        c->st.file_reads++;
    else
        c->st.file_read_failures++;
    kvo__req *r = kvo__conn_req_get(c, rd->req);
    if (r && r->gen == rd->gen && r->hit_pinned && rd->item < r->n_hit &&
        kvo_chunk_key_eq(&r->hit[rd->item].key, &rd->key)) {
        kvo__hit_item *it = &r->hit[rd->item];
        if (ok) { /* nothing ran between the cascade's completion and this pin (both under mu) */
            if (kvo_cascade_prepare_load(c->casc, &rd->key, 1, &it->slot) == 0) it->pinned = 1;
            else ok = false;
        }
        if (!ok && !r->file_status) r->file_status = result ? result : KVO_ESTATE;
        if (r->file_pending) r->file_pending--;
        if (r->file_pending == 0 && r->deferred) {
            kvo__job *j = r->deferred;
            r->deferred = NULL;
            if (r->file_status) {
                kvo__conn_job_free(j);
                kvo__conn_fail_load_now(c, r, r->file_status);
            } else if (kvo__conn_submit_load(c, r, j)) {
                kvo__conn_job_free(j);
                kvo__conn_fail_load_now(c, r, KVO_EAGAIN);
            }
        }
    }
    kvo__free(rd);
}

int kvo_connector_poll(kvo_connector *c, kvo_completion *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!c || !n_out || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_connector_poll: NULL argument");
    kvo__conn_lock(c);
    for (;;) { /* the cascade's completions: the hits' promotions */
        kvo_cascade_completion cc[32];
        size_t n = 0;
        if (kvo_cascade_poll(c->casc, cc, 32, &n) || n == 0) break;
        for (size_t i = 0; i < n; i++)
            if (cc[i].op == KVO_CASCADE_OP_PROMOTE) kvo__finish_read(c, cc[i].user_data, cc[i].result, cc[i].bytes);
    }
    kvo__conn_process_results(c);
    size_t n = kvo__conn_cq_take(c, out, cap);
    kvo__conn_unlock(c);
    *n_out = n;
    return 0;
}

int kvo_connector_event_fd(const kvo_connector *c) { return c ? kvo_transfer_event_fd(c->xfer) : -1; }

int kvo_connector_invalid_blocks(kvo_connector *c, uint64_t id, uint32_t group, uint64_t *out, size_t cap,
                                 size_t *n) {
    if (!c || !n || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_connector_invalid_blocks: NULL argument");
    if (group >= c->ng)
        return kvo__error(KVO_EINVAL, "kvo_connector_invalid_blocks: group %u out of range (%zu groups)", group,
                          c->ng);
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else {
        size_t k = 0;
        for (size_t i = 0; i < r->n_invalid; i++)
            if (r->invalid[i].group == group) {
                if (k < cap) out[k] = r->invalid[i].block;
                k++;
            }
        *n = k;
    }
    kvo__conn_unlock(c);
    return rc;
}
