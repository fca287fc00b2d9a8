/*
 * Connector creation and teardown, the accessors and the event drain.
 *
 * create validates the params against the plan (hit step, slot size,
 * checkpoint interval, scratch groups), then builds the arena, the host
 * store, the transfer engine and the hash maps; any failure unwinds through
 * kvo_connector_destroy, which accepts a half-built connector.  destroy
 * closes the transfer engine first (queued jobs cancel, running ones
 * finish), persists READY chunks in write-back mode when asked, then waits
 * for every file-tier read still landing in the arena before unmapping it:
 * the tier outlives the connector.
 *
 * Locks: create and destroy run with no other caller (the public contract);
 * everything else here takes c->mu for the bookkeeping it reads.  The
 * shared design essay is in connector_internal.h.
 */
#include "connector/connector_internal.h"

kvo_connector_params kvo_connector_default_params(void) {
    kvo_connector_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.policy = KVO_POLICY_LRU;
    p.event_capacity = 4096;
    p.prefault = true;
    p.transfer_threads = 2;
    p.max_queued_jobs = 4096;
    p.nontemporal = -1;
    p.sliding_store = KVO_SLIDING_STORE_REACHABLE;
    p.max_requests = 4096;
    p.file_mode = KVO_FILE_WRITE_THROUGH;
    p.file_persist_on_destroy = true;
    p.remote_lookup_budget_us = 20000;
    p.remote_exists_ttl_ms = 1000;
    return p;
}

int kvo_connector_create(const kvo_connector_params *p, kvo_connector **out) {
    kvo_connector_params p_in_;
    KVO__PARAMS_IN(p, kvo_connector_params, p_in_, kvo_connector_default_params, max_requests, "kvo_connector_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_connector_create: params and out must not be NULL");
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_connector_create: params.plan is required");
    const kvo_plan *plan = p->plan;
    size_t ng = kvo_plan_num_groups(plan);
    uint64_t step = kvo_agree_step(plan);
    if (step == 0)
        return kvo__error(KVO_ERANGE, "kvo_connector_create: the lcm of the groups' tokens_per_block overflows");
    uint64_t maxslot = kvo_plan_max_slot_bytes(plan);
    if (maxslot == 0) return kvo__error(KVO_EINVAL, "kvo_connector_create: the plan offloads no group");
    if (p->host_bytes < maxslot)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: host_bytes %llu is below the largest slot (%llu bytes); "
                          "use at least %llu (better many times that)",
                          (unsigned long long)p->host_bytes, (unsigned long long)maxslot,
                          (unsigned long long)maxslot);
    if (p->checkpoint_interval % step)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: checkpoint_interval %llu is not a multiple of the hit step "
                          "%llu; use %llu",
                          (unsigned long long)p->checkpoint_interval, (unsigned long long)step,
                          (unsigned long long)((p->checkpoint_interval / step + 1) * step));
    for (size_t g = 0; g < 64; g++) {
        if (!((p->scratch_groups >> g) & 1)) continue;
        if (g >= ng)
            return kvo__error(KVO_EINVAL, "kvo_connector_create: scratch_groups names group %zu; the plan has %zu",
                              g, ng);
        if (kvo_plan_group(plan, g)->offloaded)
            return kvo__error(KVO_EINVAL,
                              "kvo_connector_create: scratch_groups names group '%s', which is cacheable "
                              "(only non-cacheable groups can be scratch)",
                              kvo_plan_group(plan, g)->name);
    }
    for (size_t g = 0; g < 64; g++) {
        if (!((p->snapshot_groups >> g) & 1)) continue;
        if (g >= ng)
            return kvo__error(KVO_EINVAL, "kvo_connector_create: snapshot_groups names group %zu; the plan has %zu",
                              g, ng);
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (gp->kind != KVO_GROUP_STATE || !gp->offloaded)
            return kvo__error(KVO_EINVAL,
                              "kvo_connector_create: snapshot_groups names group '%s', which is not an offloaded "
                              "state group (only those have snapshots off the block grid)",
                              gp->name);
    }
    if ((unsigned)p->sliding_store > KVO_SLIDING_STORE_REACHABLE)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: sliding_store %d is not ALL (0), CHECKPOINTS (1) or REACHABLE (2)",
                          (int)p->sliding_store);
    if (p->file_mode != KVO_FILE_WRITE_THROUGH && p->file_mode != KVO_FILE_WRITE_BACK)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: file_mode %d is not WRITE_THROUGH (0) or WRITE_BACK (1)",
                          (int)p->file_mode);

    kvo_connector *c = kvo__calloc(1, sizeof *c);
    if (!c) return kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory");
    c->p = *p;
    c->plan = plan;
    c->ng = ng;
    c->snap_groups = p->snapshot_groups;
    c->step = step;
    c->min_hit = p->min_hit_tokens ? p->min_hit_tokens : kvo__agree_min_hit_default(plan);
    c->fingerprint = kvo_plan_fingerprint(plan);
    c->file = p->file_tier;
    c->remote = p->remote_tier;
    if (c->p.max_requests == 0) c->p.max_requests = 4096;
    pthread_mutex_init(&c->mu, NULL);
    int rc;
    if (p->salt_len) {
        if (!p->salt) {
            rc = kvo__error(KVO_EINVAL, "kvo_connector_create: salt is NULL with salt_len %zu", p->salt_len);
            goto fail;
        }
        c->salt = kvo__malloc(p->salt_len);
        if (!c->salt) {
            rc = kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory");
            goto fail;
        }
        memcpy(c->salt, p->salt, p->salt_len);
    }
    c->p.salt = c->salt;
    c->p.shm_path = NULL; /* not kept */

    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = p->host_bytes;
    ap.huge_pages = p->huge_pages;
    ap.lock = p->lock_memory;
    ap.prefault = p->prefault;
    ap.shm_path = p->shm_path;
    if ((rc = kvo_arena_create(&ap, &c->arena))) goto fail;
    c->arena_base = kvo_arena_base(c->arena);

    kvo_store_params sp = kvo_store_default_params();
    sp.plan = plan;
    sp.capacity_bytes = kvo_arena_size(c->arena);
    sp.policy = p->policy;
    sp.admit_after = p->admit_after;
    sp.event_capacity = p->event_capacity;
    sp.policy_admission = !p->file_tier && !p->remote_tier; /* the host tier is the last one */
    if ((rc = kvo_store_create(&sp, &c->store))) goto fail;

    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    if (p->transfer_threads) tp.threads = p->transfer_threads;
    if (p->max_queued_jobs) tp.max_queued_jobs = p->max_queued_jobs;
    tp.nontemporal = p->nontemporal;
    if ((rc = kvo_transfer_create(&tp, &c->xfer))) goto fail;

    if ((rc = kvo__map_init(&c->reqs, 64)) || (rc = kvo__map_init(&c->jobs, 64)) ||
        (rc = kvo__map_init(&c->blocks, 256)) || (rc = kvo__map_init(&c->reads, 64)) ||
        (rc = kvo__conn_remote_init(c)))
        goto fail;
    if (p->verify_checksums) {
        c->n_sums = (size_t)(kvo_arena_size(c->arena) / KVO_SLOT_ALIGN) + 1;
        c->sums = kvo__calloc(c->n_sums, sizeof *c->sums);
        if (!c->sums) {
            rc = kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory for %zu checksums", c->n_sums);
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    kvo_connector_destroy(c);
    return rc;
}

/* Wait until every file-tier read into the arena and every write lent
 * from it has completed (the tier outlives the connector; its reads must
 * not land in unmapped memory, nor its writes read from it). */
static void kvo__drain_reads(kvo_connector *c) {
    while (c->file && ((c->reads.e && c->reads.n) || c->file_lent)) {
        kvo_file_completion fc[32];
        size_t n = 0;
        (void)kvo_file_tier_poll(c->file, fc, 32, &n);
        for (size_t i = 0; i < n; i++) {
            if (fc[i].op == KVO_FILE_OP_WRITE && fc[i].user_data == KVO__CONN_LENT_UD) kvo__conn_file_lent_done(c, &fc[i]);
            if (fc[i].op != KVO_FILE_OP_READ || !c->reads.e) continue;
            kvo__map_entry *e = kvo__map_get(&c->reads, fc[i].user_data);
            if (!e) continue;
            kvo__free(e->p);
            kvo__map_del(&c->reads, e);
        }
        if (n == 0 && kvo_file_tier_wait(c->file, KVO_MS(100)) == KVO_ENOTFOUND) break;
    }
}

void kvo_connector_destroy(kvo_connector *c) {
    if (!c) return;
    if (c->xfer) {
        kvo_transfer_close(c->xfer); /* queued jobs cancel, running ones finish */
        if (c->file && c->store && c->jobs.e && c->p.file_mode == KVO_FILE_WRITE_BACK &&
            c->p.file_persist_on_destroy) {
            kvo__conn_lock(c);
            kvo__conn_process_results(c); /* finished stores become READY */
            kvo__conn_unlock(c);
            (void)kvo_connector_flush_to_file(c, -1, NULL);
        }
        kvo_transfer_destroy(c->xfer);
    }
    kvo__conn_remote_free(c); /* remote reads land before the arena goes */
    kvo__drain_reads(c);
    if (c->reads.e)
        for (size_t i = 0; i < c->reads.cap; i++)
            if (c->reads.e[i].used) kvo__free(c->reads.e[i].p);
    kvo__map_free(&c->reads);
    if (c->jobs.e)
        for (size_t i = 0; i < c->jobs.cap; i++)
            if (c->jobs.e[i].used) kvo__conn_job_free(c->jobs.e[i].p);
    if (c->reqs.e)
        for (size_t i = 0; i < c->reqs.cap; i++)
            if (c->reqs.e[i].used) kvo__conn_req_free(c->reqs.e[i].p);
    kvo__map_free(&c->jobs);
    kvo__map_free(&c->reqs);
    kvo__map_free(&c->blocks);
    kvo_store_destroy(c->store);
    kvo_arena_destroy(c->arena);
    kvo__free(c->cq);
    kvo__free(c->s_keys);
    kvo__free(c->s_u8);
    kvo__free(c->s_slots);
    kvo__free(c->s_grp);
    kvo__free(c->s_chunk);
    kvo__free(c->s_ops);
    kvo__free(c->ones);
    kvo__free(c->s_tier);
    kvo__free(c->s_fst);
    kvo__free(c->s_fkeys);
    kvo__free(c->sn_keys);
    kvo__free(c->sn_st);
    kvo__free(c->sn_tier);
    kvo__free(c->sn);
    kvo__free(c->s_fidx);
    kvo__free(c->sums);
    kvo__free(c->ev_keys);
    kvo__free(c->ev_slots);
    kvo__free(c->salt);
    pthread_mutex_destroy(&c->mu);
    kvo__free(c);
}

uint64_t kvo_connector_step(const kvo_connector *c) { return c ? c->step : 0; }
kvo_store *kvo_connector_store(kvo_connector *c) { return c ? c->store : NULL; }
kvo_transfer *kvo_connector_transfer(kvo_connector *c) { return c ? c->xfer : NULL; }
kvo_arena *kvo_connector_arena(kvo_connector *c) { return c ? c->arena : NULL; }

#ifdef KVO_TESTING
void kvo__connector_inject_failures(kvo_connector *c, uint32_t loads, uint32_t stores) {
    kvo__conn_lock(c);
    c->inject_load_fail = loads;
    c->inject_store_fail = stores;
    kvo__conn_unlock(c);
}
#endif

size_t kvo_connector_drain_events(kvo_connector *c, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (!c) return 0;
    return kvo_store_drain_events(c->store, out, cap, dropped);
}

