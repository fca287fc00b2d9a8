/*
 * Connector creation and teardown, the accessors, the event drain and
 * flush_to_file.
 *
 * create validates the params against the plan (hit step, slot size,
 * checkpoint interval, scratch groups), then builds the arena, the cascade
 * over it (the host store and the caller's file and remote tiers), the
 * transfer engine and the hash maps; any failure unwinds through
 * kvo_connector_destroy, which accepts a half-built connector.  destroy
 * closes the transfer engine first (queued jobs cancel, running ones
 * finish), persists READY chunks in write-back mode when asked, then
 * destroys the cascade (which waits for every read still landing in the
 * arena and every write lent from it) before unmapping the arena: the
 * tiers outlive the connector.
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

    kvo_cascade_params cp = kvo_cascade_default_params();
    cp.plan = plan;
    cp.host_bytes = kvo_arena_size(c->arena);
    cp.arena = c->arena;
    cp.policy = p->policy;
    cp.admit_after = p->admit_after;
    cp.event_capacity = p->event_capacity;
    cp.verify_checksums = p->verify_checksums;
    cp.file_tier = p->file_tier;
    cp.file_mode = p->file_mode;
    cp.file_zero_copy = p->file_zero_copy;
    cp.remote_tier = p->remote_tier;
    cp.remote_lookup_budget_us = p->remote_lookup_budget_us;
    cp.remote_exists_ttl_ms = p->remote_exists_ttl_ms;
    cp.tenants = p->tenants;
    cp.n_tenants = p->n_tenants;
    if ((rc = kvo_cascade_create(&cp, &c->casc))) goto fail;
    c->store = kvo_cascade_store(c->casc);

    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    if (p->transfer_threads) tp.threads = p->transfer_threads;
    if (p->max_queued_jobs) tp.max_queued_jobs = p->max_queued_jobs;
    tp.nontemporal = p->nontemporal;
    if ((rc = kvo_transfer_create(&tp, &c->xfer))) goto fail;

    if ((rc = kvo__ring_init(&c->cq, sizeof(kvo_completion), 64, 0, false, "connector: completions")) ||
        (rc = kvo__map_init(&c->reqs, 64)) || (rc = kvo__map_init(&c->jobs, 64)) ||
        (rc = kvo__map_init(&c->blocks, 256)) || (rc = kvo__map_init(&c->reads, 64)))
        goto fail;
    *out = c;
    return 0;
fail:
    kvo_connector_destroy(c);
    return rc;
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
    kvo_cascade_destroy(c->casc); /* reads land and lent writes end before the arena goes */
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
    kvo_arena_destroy(c->arena);
    kvo__ring_free(&c->cq);
    kvo__free(c->s_keys);
    kvo__free(c->s_u8);
    kvo__free(c->s_slots);
    kvo__free(c->s_grp);
    kvo__free(c->s_chunk);
    kvo__free(c->s_ops);
    kvo__free(c->ones);
    kvo__free(c->s_tier);
    kvo__free(c->sn_keys);
    kvo__free(c->sn_st);
    kvo__free(c->sn_tier);
    kvo__free(c->sn_hs);
    kvo__free(c->sn);
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

int kvo_connector_flush_to_file(kvo_connector *c, int64_t timeout_ns, uint64_t *n_queued) {
    if (n_queued) *n_queued = 0;
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_flush_to_file: c must not be NULL");
    if (!c->file)
        return kvo__error(KVO_ESTATE, "kvo_connector_flush_to_file: no file tier attached (params.file_tier)");
    /* the cascade scans the host tier under its own lock, never under c->mu
     * while it waits for the tier's queue */
    int rc = kvo_cascade_persist(c->casc, timeout_ns, n_queued);
    if (rc) return kvo__error_prefix(rc, "kvo_connector_flush_to_file: ");
    return 0;
}

size_t kvo_connector_drain_events(kvo_connector *c, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (!c) return 0;
    return kvo_cascade_drain_events(c->casc, out, cap, dropped);
}

