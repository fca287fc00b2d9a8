/*
 * load: turn the hit pinned by lookup into one transfer job that copies the
 * chunks' needed blocks from host slots into the engine's blocks.
 *
 * The job record owns the keys (to unpin), the slots, its own copy of the
 * engine block ids and the ops, so that a load whose file reads are still
 * running can be kept (deferred) and submitted by poll.c when they finish.
 * Room for the LOAD completion and for listing every written block as
 * invalid is reserved before the load is accepted: a failure later never
 * needs memory.
 *
 * Locks: everything runs under c->mu; the transfer engine's submit only
 * queues.
 */
#include "connector/connector_internal.h"

/* A LOAD completion for a load that never reached the transfer engine
 * (file reads failed, submit failed): nothing was written. */
void kvo__conn_fail_load_now(kvo_connector *c, kvo__req *r, int status) {
    kvo_completion cp;
    memset(&cp, 0, sizeof cp);
    cp.request = r->id;
    cp.type = KVO_COMPLETION_LOAD;
    cp.status = status;
    cp.tokens_valid = r->hit_local;
    r->n_invalid = 0;
    r->st.load_failures++;
    c->st.load_failures++;
    kvo__conn_tenant(c, r->tenant)->load_failures++;
    kvo__conn_unpin_hit(c, r);
    kvo__conn_req_set_state(c, r, REQ_ACTIVE);
    kvo__conn_emit(c, &cp);
}

/* Submit a prepared load job (every item pinned).  The slots of items
 * promoted from a lower tier are known only once their reads landed
 * (poll.c pins them): taken from the hit here. */
int kvo__conn_submit_load(kvo_connector *c, kvo__req *r, kvo__job *j) {
    assert(r->n_hit == j->n_keys);
    for (size_t i = 0; i < j->n_keys; i++) {
        j->slots[i] = r->hit[i].slot;
        j->ops[i].slot = kvo__conn_slot_ptr(c, r->hit[i].slot);
        j->ops[i].slot_bytes = r->hit[i].slot.bytes;
    }
    int rc = kvo__conn_job_reserve(c, r, 0);
    if (!rc) rc = kvo_transfer_submit(c->xfer, KVO_XFER_LOAD, j->ops, j->n_keys, &j->id);
    if (rc) return rc;
    kvo__conn_job_register(c, r, j);
    r->load_job = j->id;
    kvo__conn_req_set_state(c, r, REQ_LOADING);
    r->hit_pinned = false; /* the job owns the pins now */
    r->n_hit = 0;
    return 0;
}

/* Group plan of hit item it, and the engine blocks [*first, *first + *nb)
 * the load of r's hit writes for it. */
static const kvo_group_plan *kvo__item_blocks(kvo_connector *c, const kvo__req *r, const kvo__hit_item *it,
                                              uint64_t *first, uint64_t *nb) {
    const kvo_group_plan *gp = kvo_plan_group(c->plan, it->key.group);
    uint64_t lo, hi;
    if (it->snap) { /* a snapshot: into the block holding token hit - 1 */
        *first = (r->hit_tokens - 1) / gp->tokens_per_block;
        *nb = 1;
        return gp;
    }
    kvo__conn_need_range(gp, it->chunk, r->hit_local, r->hit_tokens, &lo, &hi);
    /* the last block may be only partly needed: rounded up (the engine
     * recomputes from the hit over its tail) */
    *first = lo / gp->tokens_per_block;
    *nb = kvo__div_ceil_u64(hi, gp->tokens_per_block) - *first;
    return gp;
}

/* Every block the load of r's hit writes must be given (not KVO_NO_BLOCK);
 * *nblocks: how many it writes. */
static int kvo__check_hit_blocks(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, size_t *nblocks) {
    *nblocks = 0;
    for (size_t i = 0; i < r->n_hit; i++) {
        const kvo__hit_item *it = &r->hit[i];
        uint64_t first, nb;
        const kvo_group_plan *gp = kvo__item_blocks(c, r, it, &first, &nb);
        uint64_t tpb = gp->tokens_per_block;
        const uint64_t *blk = tables[it->key.group].blocks + first;
        for (uint64_t k = 0; k < nb; k++) {
            if (blk[k] == KVO_NO_BLOCK)
                return kvo__error(KVO_EINVAL,
                                  "request %llu: group '%s': block %llu (tokens %llu..%llu) is KVO_NO_BLOCK but "
                                  "must be loaded",
                                  (unsigned long long)r->id, gp->name, (unsigned long long)(first + k),
                                  (unsigned long long)((first + k) * tpb),
                                  (unsigned long long)((first + k + 1) * tpb));
            /* checked here, not only at submit: a load waiting for file
             * reads is submitted later, where a bad id could only fail it */
            if (blk[k] >= c->lay_blocks[it->key.group])
                return kvo__error(KVO_EINVAL,
                                  "request %llu: group '%s': block %llu (tokens %llu..%llu) is engine block id "
                                  "%llu, beyond the layout's num_blocks %llu (ids 0..%llu)",
                                  (unsigned long long)r->id, gp->name, (unsigned long long)(first + k),
                                  (unsigned long long)((first + k) * tpb),
                                  (unsigned long long)((first + k + 1) * tpb), (unsigned long long)blk[k],
                                  (unsigned long long)c->lay_blocks[it->key.group],
                                  (unsigned long long)c->lay_blocks[it->key.group] - 1);
        }
        *nblocks += nb;
    }
    return 0;
}

/* The load job of r's hit (nblocks engine blocks): one allocation holding
 * the ops, keys, slots and its own copy of the engine block ids.  NULL when
 * out of memory. */
static kvo__job *kvo__build_load_job(kvo_connector *c, kvo__req *r, const kvo_block_table *tables,
                                     size_t nblocks) {
    size_t nh = r->n_hit;
    kvo__job *j = kvo__calloc(1, sizeof *j + nh * (sizeof(kvo_chunk_key) + sizeof(kvo_slot) + sizeof(kvo_xfer_op)) +
                                     nblocks * (sizeof(kvo_block_ref) + sizeof(uint64_t)));
    if (!j) return NULL;
    j->ops = (kvo_xfer_op *)(j + 1);
    j->keys = (kvo_chunk_key *)(j->ops + nh);
    j->slots = (kvo_slot *)(j->keys + nh);
    j->eblk = (uint64_t *)(j->slots + nh);
    j->blocks = (kvo_block_ref *)(j->eblk + nblocks);
    j->n_keys = nh;
    size_t bi = 0;
    for (size_t i = 0; i < nh; i++) {
        kvo__hit_item *it = &r->hit[i];
        uint64_t first, nb;
        const kvo_group_plan *gp = kvo__item_blocks(c, r, it, &first, &nb);
        kvo_xfer_op *op = &j->ops[i];
        op->group = it->key.group;
        /* a snapshot slot holds it in its first block (update.c) */
        op->first_block = it->snap ? 0 : (uint32_t)(first - it->chunk * gp->blocks_per_chunk);
        op->n_blocks = (uint32_t)nb;
        op->engine_blocks = &j->eblk[bi];
        /* the slot: set at submit (a promoted item's is known once its read lands) */
        for (uint64_t k = 0; k < nb; k++) {
            j->eblk[bi] = tables[it->key.group].blocks[first + k];
            j->blocks[bi] = (kvo_block_ref){it->key.group, j->eblk[bi]};
            bi++;
        }
        j->keys[i] = it->key;
    }
    j->n_blocks = bi;
    j->req = r->id;
    j->gen = r->gen;
    j->tenant = r->tenant;
    j->epoch = c->epoch;
    j->dir = KVO_XFER_LOAD;
    j->tokens = r->hit_tokens;
    j->local = r->hit_local;
    j->host_tokens = r->hit_host_tokens;
    j->file_tokens = r->hit_file_tokens;
    j->remote_tokens = r->hit_remote_tokens;
    j->t0_ns = kvo__now_ns();
    return j;
}

int kvo_connector_load(kvo_connector *c, uint64_t id, uint64_t tokens, const kvo_block_table *tables,
                       size_t n_tables) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_load: c must not be NULL");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else if (r->state != REQ_ACTIVE || !r->hit_pinned)
        rc = kvo__error(KVO_ESTATE, "request %llu: load without a hit from lookup%s", (unsigned long long)id,
                        r->state == REQ_LOADING ? " (a load is in flight)" : "");
    else if (tokens == r->hit_local) {
        kvo__conn_unpin_hit(c, r);
        kvo__conn_unlock(c);
        return 0;
    } else if (tokens != r->hit_tokens)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: load of %llu tokens; the lookup's hit is %llu (or %llu to decline)",
                        (unsigned long long)id, (unsigned long long)tokens, (unsigned long long)r->hit_tokens,
                        (unsigned long long)r->hit_local);
    else if (!c->layout_set)
        rc = kvo__error(KVO_ESTATE, "request %llu: no engine layout registered (kvo_connector_set_layout)",
                        (unsigned long long)id);
    else
        rc = kvo__conn_check_tables(c, id, tables, n_tables, tokens, true);
    if (!rc) rc = kvo__conn_cq_reserve_owed(c); /* room for its completion */
    size_t nblocks = 0;
    if (!rc) rc = kvo__check_hit_blocks(c, r, tables, &nblocks);
    /* room to list the blocks as invalid should the load fail */
    if (!rc) rc = kvo__grow((void **)&r->invalid, &r->cap_invalid, nblocks, sizeof *r->invalid, 16, "connector");
    kvo__job *j = rc ? NULL : kvo__build_load_job(c, r, tables, nblocks);
    if (!rc && !j) rc = kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)id);
    if (rc) {
        kvo__conn_unlock(c);
        return rc;
    }
    r->st.local_tokens = r->hit_local;
    c->st.loads++;
    if (r->hit_stale) { /* the hit predates a reset (controls.c) */
        kvo__conn_job_free(j);
        kvo__conn_fail_load_now(c, r, KVO_ECANCELED);
    } else if (r->file_pending) { /* wait for the file reads; poll submits */
        r->deferred = j;
        kvo__conn_req_set_state(c, r, REQ_LOADING);
    } else if (r->file_status) {
        kvo__conn_job_free(j);
        kvo__conn_fail_load_now(c, r, r->file_status);
    } else if ((rc = kvo__conn_submit_load(c, r, j))) {
        kvo__conn_job_free(j);
        c->st.loads--;
    }
    kvo__conn_unlock(c);
    return rc;
}
