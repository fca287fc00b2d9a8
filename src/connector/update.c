/*
 * update (and finish's last stores): store every chunk that became complete
 * since the last call, from the engine's blocks into host slots.
 *
 * Per group, chunks [next_chunk, min(computed, units known, store limit))
 * are candidates (a draft group's chunk only once computed is beyond its
 * end, or at finish: the draft KV of its last token needs the next token,
 * not final while the request decodes); with
 * sliding_store CHECKPOINTS a sliding group keeps only the chunks a
 * checkpoint needs, with REACHABLE those before a reachable boundary.  A
 * candidate is stored only if the table holds all its blocks.
 *
 * Retries.  next_chunk moves past every candidate, stored or not; a chunk
 * whose store was skipped (no room, queue full, turned away by admission)
 * goes to the request's retry list and is tried again first at the next
 * update or finish, as long as the table still holds its blocks (dropped
 * otherwise: it can no longer be stored from this request).  Each skip
 * costs one retry-list entry, so the list never exceeds the request's
 * chunks and one update scans at most them.  The batch is reserved in the
 * host tier through the cascade all-or-nothing, else one by one (chunks
 * that do not fit are counted, never an error), then
 * submitted as one transfer job; its blocks are counted in the block map so
 * that wait_blocks can find it.
 *
 * Snapshots off the block grid (kvo_connector_store_snapshot) go through
 * the same batch path as one entry under a snapshot key, never retried.
 *
 * Locks: under c->mu; the scratch arrays (s_*) are guarded by it.
 */
#include "connector/connector_internal.h"

/* Reserve host slots for n chunks through the cascade, all or nothing
 * (need[i] = 1: write slot slots[i]; 0: present or not admitted). */
static int kvo__reserve(kvo_connector *c, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots) {
    int rc = kvo_cascade_prepare_store(c->casc, keys, n, KVO_CASCADE_ALL_OR_NOTHING, need, slots);
    for (size_t i = 0; !rc && i < n; i++) need[i] = need[i] == KVO_CASCADE_HOST;
    return rc;
}

static int kvo__ops_cap(kvo_connector *c, size_t n) {
    return kvo__grow((void **)&c->s_ops, &c->s_ops_cap, n, sizeof *c->s_ops, 16, "connector");
}

static bool kvo__ckpt_wants(const kvo_connector *c, const kvo__req *r, const kvo_group_plan *gp, uint64_t ch) {
    uint64_t T = gp->tokens_per_chunk, cs = ch * T, lim = cs + T + gp->window; /* q in (cs, lim) */
    uint64_t I = c->p.checkpoint_interval;
    if (I) {
        uint64_t q = (lim - 1) / I * I;
        if (q > cs && q >= I) return true;
    }
    for (size_t i = 0; i < r->n_ckpt; i++)
        if (r->ckpt[i] > cs && r->ckpt[i] < lim) return true;
    return false;
}

/* REACHABLE policy: the step of reachable boundaries, R = lcm of the
 * tokens_per_block of offloaded state groups and of scratch groups (1 when
 * none; 0 on overflow: then every chunk is kept). */
static uint64_t kvo__reach_step(const kvo_connector *c) {
    uint64_t R = 1;
    for (size_t g = 0; g < c->ng && R; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        bool scratch = !gp->offloaded && g < 64 && ((c->p.scratch_groups >> g) & 1);
        if ((gp->offloaded && gp->kind == KVO_GROUP_STATE) || scratch) R = kvo__lcm_u64(R, gp->tokens_per_block);
    }
    return R;
}

/* REACHABLE policy: does a boundary b, a multiple of R, need the chunk
 * [cs, ce)?  b needs it when [b - window, b) meets it: b in (cs, ce +
 * window); a draft group's range [b - window, b + 1) also when b == cs. */
static bool kvo__reach_wants(const kvo_group_plan *gp, uint64_t ch, uint64_t R) {
    if (R <= 1) return true;
    uint64_t T = gp->tokens_per_chunk, cs = ch * T, q = (cs + T + gp->window - 1) / R * R;
    return q > cs || (gp->draft && q == cs);
}

/* Add chunk ch of group g to the store batch at index *n if its blocks are
 * all held by the table; false when they are not. */
static bool kvo__batch_add(kvo_connector *c, kvo__req *r, size_t g, uint64_t ch, const kvo_block_table *t,
                           size_t *n) {
    const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
    uint64_t first = ch * gp->blocks_per_chunk;
    if (first + gp->blocks_per_chunk > t->n) return false;
    for (uint64_t k = 0; k < gp->blocks_per_chunk; k++)
        if (t->blocks[first + k] == KVO_NO_BLOCK) return false;
    kvo__conn_chunk_key(r, gp, ch, &c->s_keys[*n]);
    c->s_grp[*n] = (uint32_t)g;
    c->s_chunk[*n] = ch;
    (*n)++;
    return true;
}

/* Remember batch entry i (a chunk whose store was skipped) for a retry at
 * the next update or finish.  Out of memory: not retried (still counted). */
static void kvo__retry_push(kvo__req *r, uint32_t g, uint64_t ch) {
    if (kvo__grow((void **)&r->retry, &r->cap_retry, r->n_retry + 1, sizeof *r->retry, 16, "connector") == 0)
        r->retry[r->n_retry++] = ch << 6 | g;
}

/* Batch entry i, for which prepare_store succeeded with need = 0: present,
 * or turned away by admission (admit_after > 1); the latter is retried. */
static void kvo__retry_if_refused(kvo_connector *c, kvo__req *r, size_t i) {
    kvo_store_entry e;
    if (c->p.admit_after > 1 && !c->s_u8[i] &&
        kvo_store_peek(kvo__conn_hs(c, &c->s_keys[i]), &c->s_keys[i], &e) == KVO_ENOTFOUND)
        kvo__retry_push(r, c->s_grp[i], c->s_chunk[i]);
}

/* Reserve, copy and track a batch of n candidate chunks in the scratch
 * arrays.  Best effort: chunks that cannot be stored are counted. */
static void kvo__store_batch(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, size_t n) {
    if (n == 0) return;
    int rc = kvo__reserve(c, c->s_keys, n, c->s_u8, c->s_slots);
    if (rc == KVO_ENOSPC && n > 1) {
        /* all-or-nothing failed: try one by one, skipping those that do not fit */
        for (size_t i = 0; i < n; i++) {
            int r1 = kvo__reserve(c, &c->s_keys[i], 1, &c->s_u8[i], &c->s_slots[i]);
            if (r1) {
                c->s_u8[i] = 0;
                c->st.stores_skipped_nospace++;
                r->st.stores_skipped++;
                kvo__retry_push(r, c->s_grp[i], c->s_chunk[i]);
            } else {
                kvo__retry_if_refused(c, r, i);
            }
        }
        rc = 0;
    } else if (rc) {
        c->st.stores_skipped_nospace += n;
        r->st.stores_skipped += n;
        for (size_t i = 0; i < n; i++) kvo__retry_push(r, c->s_grp[i], c->s_chunk[i]);
        return;
    } else {
        for (size_t i = 0; i < n; i++) kvo__retry_if_refused(c, r, i);
    }
    size_t m = 0, nblocks = 0;
    if (kvo__ops_cap(c, n)) {
        /* cannot build ops: undo the reservations */
        for (size_t i = 0; i < n; i++)
            if (c->s_u8[i]) {
                (void)kvo_cascade_complete_store(c->casc, &c->s_keys[i], 1, false);
                kvo__retry_push(r, c->s_grp[i], c->s_chunk[i]);
            }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!c->s_u8[i]) continue;
        const kvo_group_plan *gp = kvo_plan_group(c->plan, c->s_grp[i]);
        kvo_xfer_op *op = &c->s_ops[m];
        op->group = c->s_grp[i];
        op->first_block = 0;
        op->n_blocks = (uint32_t)gp->blocks_per_chunk;
        op->engine_blocks = tables[c->s_grp[i]].blocks + c->s_chunk[i] * gp->blocks_per_chunk;
        op->slot = kvo__conn_slot_ptr(c, c->s_slots[i]);
        op->slot_bytes = c->s_slots[i].bytes;
        c->s_keys[m] = c->s_keys[i];
        c->s_slots[m] = c->s_slots[i];
        c->s_grp[m] = c->s_grp[i];
        c->s_chunk[m] = c->s_chunk[i];
        nblocks += gp->blocks_per_chunk;
        m++;
    }
    if (m == 0) return;
    kvo__job *j = kvo__calloc(1, sizeof *j + m * (sizeof(kvo_chunk_key) + sizeof(kvo_slot)) +
                                     nblocks * sizeof(kvo_block_ref));
    if (j) {
        j->keys = (kvo_chunk_key *)(j + 1);
        j->slots = (kvo_slot *)(j->keys + m);
        j->blocks = (kvo_block_ref *)(j->slots + m);
        j->n_keys = m;
        size_t bi = 0;
        for (size_t i = 0; i < m; i++) {
            j->keys[i] = c->s_keys[i];
            j->slots[i] = c->s_slots[i];
            for (uint32_t k = 0; k < c->s_ops[i].n_blocks; k++)
                j->blocks[bi++] = (kvo_block_ref){c->s_ops[i].group, c->s_ops[i].engine_blocks[k]};
        }
        j->n_blocks = bi;
        j->req = r->id;
        j->gen = r->gen;
        j->tenant = r->tenant;
        j->epoch = c->epoch;
        j->dir = KVO_XFER_STORE;
        rc = kvo__conn_job_reserve(c, r, bi);
        if (!rc) rc = kvo_transfer_submit(c->xfer, KVO_XFER_STORE, c->s_ops, m, &j->id);
    } else {
        rc = KVO_ENOMEM;
    }
    if (rc) {
        (void)kvo_cascade_complete_store(c->casc, c->s_keys, m, false);
        c->st.stores_skipped_queue += m;
        r->st.stores_skipped += m;
        for (size_t i = 0; i < m; i++) kvo__retry_push(r, c->s_grp[i], c->s_chunk[i]);
        kvo__conn_job_free(j);
        return;
    }
    kvo__conn_job_register(c, r, j);
    for (size_t i = 0; i < j->n_blocks; i++) {
        kvo__map_entry *e = NULL;
        int prc = kvo__map_put(&c->blocks, kvo__conn_block_key(j->blocks[i].group, j->blocks[i].block), &e);
        assert(prc >= 0); /* room reserved */
        (void)prc;
        e->a++;
        e->b = j->id;
    }
}

/* The first chunk of group gp that r may not store yet with `computed`
 * tokens computed: complete chunks with keys, within the request's store
 * limit; a draft group's chunk only once computed is beyond its end, or at
 * finish (final). */
static uint64_t kvo__store_end(const kvo__req *r, const kvo_group_plan *gp, uint64_t computed, bool final) {
    uint64_t T = gp->tokens_per_chunk, lim = computed;
    if (gp->draft && !final) lim = computed ? computed - 1 : 0;
    if (lim > r->store_limit) lim = r->store_limit;
    uint64_t a = lim / T, b = r->n_units / gp->hashes_per_chunk;
    return a < b ? a : b;
}

/* Store every newly complete chunk (up to computed tokens), and retry the
 * chunks skipped before whose blocks the tables still hold. */
void kvo__conn_issue_stores(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, uint64_t computed,
                            bool final) {
    if (!kvo__conn_may_store(c, r)) return; /* added before a reset */
    size_t total = r->n_retry;
    uint64_t end[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        end[g] = gp->offloaded ? kvo__store_end(r, gp, computed, final) : 0;
        if (end[g] > r->next_chunk[g]) total += end[g] - r->next_chunk[g];
    }
    if (total == 0 || kvo__conn_scratch(c, total)) return;
    size_t n = 0;
    /* retries first (dropped when the table no longer holds the blocks) */
    for (size_t i = 0; i < r->n_retry; i++) {
        uint32_t g = (uint32_t)(r->retry[i] & 63);
        (void)kvo__batch_add(c, r, g, r->retry[i] >> 6, &tables[g], &n);
    }
    r->n_retry = 0;
    uint64_t R = c->p.sliding_store == KVO_SLIDING_STORE_REACHABLE ? kvo__reach_step(c) : 1;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        bool sliding = gp->kind == KVO_GROUP_SLIDING;
        bool ckpt = sliding && c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS;
        for (uint64_t ch = r->next_chunk[g]; ch < end[g]; ch++) {
            if (ckpt && !kvo__ckpt_wants(c, r, gp, ch)) continue;
            if (sliding && !kvo__reach_wants(gp, ch, R)) continue;
            kvo__batch_add(c, r, g, ch, &tables[g], &n);
        }
        if (end[g] > r->next_chunk[g]) r->next_chunk[g] = end[g];
    }
    kvo__store_batch(c, r, tables, n);
}

/* Store the end-of-request checkpoint of r with sliding_store CHECKPOINTS:
 * the window before the best boundary of the tokens computed so far. */
void kvo__conn_store_final_checkpoint(kvo_connector *c, kvo__req *r, const kvo_block_table *tables,
                                      uint64_t computed) {
    if (!kvo__conn_may_store(c, r)) return; /* added before a reset */
    uint64_t q = kvo__conn_best_boundary(c, computed);
    size_t total = 0;
    for (size_t g = 0; g < c->ng && q; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (gp->offloaded && gp->kind == KVO_GROUP_SLIDING)
            total += gp->window / gp->tokens_per_chunk + 2;
    }
    if (total && kvo__conn_scratch(c, total) == 0) {
        size_t n = 0;
        for (size_t g = 0; g < c->ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
            if (!gp->offloaded || gp->kind != KVO_GROUP_SLIDING) continue;
            uint64_t T = gp->tokens_per_chunk;
            uint64_t lo = (q > gp->window ? q - gp->window : 0) / T, hi = kvo__div_ceil_u64(q, T);
            uint64_t lim = r->n_units / gp->hashes_per_chunk;
            for (uint64_t ch = lo; ch < hi && ch < lim && (ch + 1) * T <= computed; ch++)
                kvo__batch_add(c, r, g, ch, &tables[g], &n);
        }
        kvo__store_batch(c, r, tables, n);
    }
}

int kvo__conn_check_update(kvo_connector *c, kvo__req *r, uint64_t id, uint64_t computed,
                      const kvo_block_table *tables, size_t n_tables) {
    if (!r) return kvo__conn_req_missing(id);
    if (r->state == REQ_LOADING)
        return kvo__error(KVO_ESTATE, "request %llu: update while its load is in flight (poll the completion first)",
                          (unsigned long long)id);
    if (r->state == REQ_FINISHED) return kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    if (!c->layout_set)
        return kvo__error(KVO_ESTATE, "request %llu: no engine layout registered (kvo_connector_set_layout)",
                          (unsigned long long)id);
    if (computed > r->n_tokens)
        return kvo__error(KVO_EINVAL, "request %llu: computed_tokens %llu beyond the %llu tokens appended",
                          (unsigned long long)id, (unsigned long long)computed, (unsigned long long)r->n_tokens);
    return kvo__conn_check_tables(c, id, tables, n_tables, computed, false);
}

int kvo_connector_update(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_update: c must not be NULL");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = kvo__conn_check_update(c, r, id, computed_tokens, tables, n_tables);
    if (!rc) {
        kvo__conn_unpin_hit(c, r); /* computing instead of loading: the hit is not needed */
        if (computed_tokens > r->computed) r->computed = computed_tokens;
        kvo__conn_issue_stores(c, r, tables, computed_tokens, false);
    }
    kvo__conn_unlock(c);
    return rc;
}

/* A snapshot off the block grid (kvo_connector_store_snapshot): one batch
 * entry keyed by kvo__conn_snap_key, stored through the batch path from a
 * table whose every block of the chunk is the engine's block (the slot's
 * first block is what a load reads).  Not retried: the engine's block
 * changes as the request goes on. */
int kvo_connector_store_snapshot(kvo_connector *c, uint64_t id, uint32_t group, uint64_t tokens,
                                 uint64_t engine_block) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_store_snapshot: c must not be NULL");
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    const kvo_group_plan *gp = group < c->ng ? kvo_plan_group(c->plan, group) : NULL;
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else if (r->state != REQ_ACTIVE)
        rc = kvo__error(KVO_ESTATE, "request %llu: snapshot while %s", (unsigned long long)id,
                        r->state == REQ_LOADING ? "a load is in flight" : "finished");
    else if (!c->layout_set)
        rc = kvo__error(KVO_ESTATE, "request %llu: no engine layout registered (kvo_connector_set_layout)",
                        (unsigned long long)id);
    else if (!gp || !gp->offloaded || gp->kind != KVO_GROUP_STATE)
        rc = kvo__error(KVO_EINVAL, "request %llu: group %u is not an offloaded state group", (unsigned long long)id,
                        group);
    else if (tokens == 0 || tokens % tph || tokens / tph > r->n_units)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: snapshot at %llu tokens; must be a positive multiple of tokens_per_hash %u "
                        "within the %llu tokens whose units are known",
                        (unsigned long long)id, (unsigned long long)tokens, tph,
                        (unsigned long long)(r->n_units * tph));
    else if (engine_block >= c->lay_blocks[group])
        rc = kvo__error(KVO_EINVAL, "request %llu: group '%s': engine block %llu beyond the layout's num_blocks %llu",
                        (unsigned long long)id, gp->name, (unsigned long long)engine_block,
                        (unsigned long long)c->lay_blocks[group]);
    if (rc || !kvo__conn_may_store(c, r)) {
        kvo__conn_unlock(c);
        return rc;
    }
    uint64_t *blk = kvo__malloc(gp->blocks_per_chunk * sizeof *blk);
    kvo_block_table t[KVO_MAX_GROUPS];
    memset(t, 0, sizeof t);
    if (!blk || (rc = kvo__conn_scratch(c, 1))) {
        kvo__free(blk);
        kvo__conn_unlock(c);
        return rc ? rc : kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)id);
    }
    for (uint64_t k = 0; k < gp->blocks_per_chunk; k++) blk[k] = engine_block;
    t[group].blocks = blk;
    t[group].n = gp->blocks_per_chunk;
    kvo__conn_snap_key(r, group, (size_t)(tokens / tph - 1), &c->s_keys[0]);
    c->s_grp[0] = group;
    c->s_chunk[0] = 0;
    size_t nretry = r->n_retry;
    c->snap_groups |= UINT64_C(1) << group;
    kvo__store_batch(c, r, t, 1);
    r->n_retry = nretry; /* never retried */
    kvo__free(blk);
    kvo__conn_unlock(c);
    return 0;
}
