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

int kvo__conn_check_tables(kvo_connector *c, uint64_t id, const kvo_block_table *tables, size_t n_tables,
                      uint64_t tokens) {
    if (!tables || n_tables != c->ng)
        return kvo__error(KVO_EINVAL, "request %llu: %zu block tables given; the plan has %zu groups",
                          (unsigned long long)id, tables ? n_tables : 0, c->ng);
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        uint64_t need = tokens / gp->tokens_per_block;
        if (tables[g].n < need || (tables[g].n && !tables[g].blocks))
            return kvo__error(KVO_EINVAL,
                              "request %llu: group '%s': block table has %zu entries; %llu tokens need %llu "
                              "blocks of %u tokens",
                              (unsigned long long)id, gp->name, tables[g].n, (unsigned long long)tokens,
                              (unsigned long long)need, gp->tokens_per_block);
    }
    return 0;
}

/* Make room, before a submit, for tracking one more job of r reading or
 * writing n_blocks engine blocks, so that registering it cannot fail. */
int kvo__conn_job_reserve(kvo_connector *c, kvo__req *r, size_t n_blocks) {
    int rc = kvo__map_reserve(&c->jobs, 1);
    if (!rc) rc = kvo__map_reserve(&c->blocks, n_blocks);
    if (!rc) rc = kvo__grow((void **)&r->jobs, &r->cap_jobs, r->n_jobs + 1, sizeof *r->jobs, 16, "connector");
    return rc;
}

/* Track a submitted job (room reserved by kvo__conn_job_reserve: cannot fail). */
void kvo__conn_job_register(kvo_connector *c, kvo__req *r, kvo__job *j) {
    kvo__map_entry *e = NULL;
    int rc = kvo__map_put(&c->jobs, j->id, &e);
    assert(rc == 0);
    (void)rc;
    e->p = j;
    assert(r->n_jobs < r->cap_jobs);
    r->jobs[r->n_jobs++] = j->id;
}

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
    kvo__conn_unpin_hit(c, r);
    kvo__conn_req_set_state(c, r, REQ_ACTIVE);
    kvo__conn_emit(c, &cp);
}

/* Submit a prepared load job (every item pinned). */
int kvo__conn_submit_load(kvo_connector *c, kvo__req *r, kvo__job *j) {
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
        rc = kvo__conn_check_tables(c, id, tables, n_tables, tokens);
    if (!rc) rc = kvo__conn_cq_reserve_owed(c); /* room for its completion */
    if (rc) {
        kvo__conn_unlock(c);
        return rc;
    }
    uint64_t L = r->hit_local, b = r->hit_tokens;
    size_t nh = r->n_hit, nblocks = 0;
    for (size_t i = 0; i < nh; i++) {
        kvo__hit_item *it = &r->hit[i];
        const kvo_group_plan *gp = kvo_plan_group(c->plan, it->key.group);
        uint64_t lo, hi;
        kvo__conn_need_range(gp, it->chunk, L, b, &lo, &hi);
        uint64_t tpb = gp->tokens_per_block, first = lo / tpb, nb = (hi - lo) / tpb;
        const uint64_t *blk = tables[it->key.group].blocks + first;
        for (uint64_t k = 0; k < nb; k++)
            if (blk[k] == KVO_NO_BLOCK) {
                rc = kvo__error(KVO_EINVAL,
                                "request %llu: group '%s': block %llu (tokens %llu..%llu) is KVO_NO_BLOCK but "
                                "must be loaded",
                                (unsigned long long)id, gp->name, (unsigned long long)(first + k),
                                (unsigned long long)((first + k) * tpb),
                                (unsigned long long)((first + k + 1) * tpb));
                goto out;
            }
        nblocks += nb;
    }
    /* room to list the blocks as invalid should the load fail */
    if ((rc = kvo__grow((void **)&r->invalid, &r->cap_invalid, nblocks, sizeof *r->invalid, 16, "connector"))) goto out;
    kvo__job *j = kvo__calloc(1, sizeof *j + nh * (sizeof(kvo_chunk_key) + sizeof(kvo_slot) + sizeof(kvo_xfer_op)) +
                                     nblocks * (sizeof(kvo_block_ref) + sizeof(uint64_t)));
    if (!j) {
        rc = kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)id);
        goto out;
    }
    j->ops = (kvo_xfer_op *)(j + 1);
    j->keys = (kvo_chunk_key *)(j->ops + nh);
    j->slots = (kvo_slot *)(j->keys + nh);
    j->eblk = (uint64_t *)(j->slots + nh);
    j->blocks = (kvo_block_ref *)(j->eblk + nblocks);
    j->n_keys = nh;
    size_t bi = 0;
    for (size_t i = 0; i < nh; i++) {
        kvo__hit_item *it = &r->hit[i];
        const kvo_group_plan *gp = kvo_plan_group(c->plan, it->key.group);
        uint64_t lo, hi;
        kvo__conn_need_range(gp, it->chunk, L, b, &lo, &hi);
        uint64_t tpb = gp->tokens_per_block, first = lo / tpb, nb = (hi - lo) / tpb;
        kvo_xfer_op *op = &j->ops[i];
        op->group = it->key.group;
        op->first_block = (uint32_t)(first - it->chunk * gp->blocks_per_chunk);
        op->n_blocks = (uint32_t)nb;
        op->engine_blocks = &j->eblk[bi];
        op->slot = kvo__conn_slot_ptr(c, it->slot); /* file items: slot reserved at lookup */
        op->slot_bytes = it->slot.bytes;
        for (uint64_t k = 0; k < nb; k++) {
            j->eblk[bi] = tables[it->key.group].blocks[first + k];
            j->blocks[bi] = (kvo_block_ref){it->key.group, j->eblk[bi]};
            bi++;
        }
        j->keys[i] = it->key;
        j->slots[i] = it->slot;
    }
    j->n_blocks = bi;
    j->req = id;
    j->gen = r->gen;
    j->dir = KVO_XFER_LOAD;
    j->tokens = b;
    j->local = L;
    j->host_tokens = r->hit_host_tokens;
    j->file_tokens = r->hit_file_tokens;
    r->st.local_tokens = L;
    c->st.loads++;
    if (r->file_pending) { /* wait for the file reads; poll submits */
        r->deferred = j;
        kvo__conn_req_set_state(c, r, REQ_LOADING);
    } else if (r->file_status) {
        kvo__conn_job_free(j);
        kvo__conn_fail_load_now(c, r, r->file_status);
    } else if ((rc = kvo__conn_submit_load(c, r, j))) {
        kvo__conn_job_free(j);
        c->st.loads--;
    }
out:
    kvo__conn_unlock(c);
    return rc;
}
