/*
 * The cascade's life: create, destroy, accessors, the groups each lower
 * tier serves, invalidation, statistics.  (The design essay is in
 * cascade_internal.h; docs/cascade.md tells one request's way.)
 *
 * create validates the params against the plan, maps (or borrows) the
 * arena, creates the host stores over [0, host_bytes) (each tenant part's
 * store over its bytes, then the shared part's over the rest) and the
 * staging store over the staging_bytes after it, and builds one epoll set over the
 * tiers' eventfds and the ring's.  destroy waits for every read still
 * landing in the arena or the caller's memory and every lent write
 * (dispatch.c), retries the deferred writes once, then frees everything;
 * the borrowed tiers stay.
 */
#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cascade/cascade_internal.h"

kvo_cascade_params kvo_cascade_default_params(void) {
    kvo_cascade_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.prefault = true;
    p.policy = KVO_POLICY_LRU;
    p.file_mode = KVO_FILE_WRITE_THROUGH;
    p.remote_lookup_budget_us = 20000;
    p.remote_exists_ttl_ms = 1000;
    p.retry_polls = 200;
    return p;
}

static int kvo__epoll_add(int ep, int fd) {
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = fd;
    if (fd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0) return 0;
    return kvo__error(KVO_EIO, "kvo_cascade_create: epoll_ctl: %s", strerror(errno));
}

static int kvo__validate(const kvo_cascade_params *p) {
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_cascade_create: params.plan is required");
    uint64_t maxslot = kvo_plan_max_slot_bytes(p->plan);
    if (maxslot == 0) return kvo__error(KVO_EINVAL, "kvo_cascade_create: the plan offloads no group");
    bool lower = p->file_tier || p->remote_tier;
    if (!p->host_bytes && !lower)
        return kvo__error(KVO_EINVAL, "kvo_cascade_create: no tier: give host_bytes, a file tier or a remote tier");
    if (p->host_bytes && p->host_bytes < maxslot)
        return kvo__error(KVO_EINVAL,
                          "kvo_cascade_create: host_bytes %llu is below the largest slot (%llu bytes); use 0 (no "
                          "host tier) or at least %llu (better many times that)",
                          (unsigned long long)p->host_bytes, (unsigned long long)maxslot,
                          (unsigned long long)maxslot);
    if (p->staging_bytes && (!p->host_bytes || !lower))
        return kvo__error(KVO_EINVAL, "kvo_cascade_create: staging_bytes %llu needs a host tier and a lower tier",
                          (unsigned long long)p->staging_bytes);
    if (p->staging_bytes && p->staging_bytes < maxslot)
        return kvo__error(KVO_EINVAL,
                          "kvo_cascade_create: staging_bytes %llu is below the largest slot (%llu bytes); use 0 or "
                          "at least %llu",
                          (unsigned long long)p->staging_bytes, (unsigned long long)maxslot,
                          (unsigned long long)maxslot);
    if (p->host_bytes % KVO_SLOT_ALIGN && p->staging_bytes)
        return kvo__error(KVO_EINVAL, "kvo_cascade_create: host_bytes %llu must be a multiple of %u when a staging "
                                      "area follows it",
                          (unsigned long long)p->host_bytes, (unsigned)KVO_SLOT_ALIGN);
    if (p->file_mode != KVO_FILE_WRITE_THROUGH && p->file_mode != KVO_FILE_WRITE_BACK)
        return kvo__error(KVO_EINVAL, "kvo_cascade_create: file_mode %d is not WRITE_THROUGH (0) or WRITE_BACK (1)",
                          (int)p->file_mode);
    if (p->n_tenants) {
        if (!p->tenants || p->n_tenants > KVO_CASCADE_TENANTS_MAX)
            return kvo__error(KVO_EINVAL, "kvo_cascade_create: n_tenants %u needs a tenants array, at most %u of them",
                              (unsigned)p->n_tenants, (unsigned)KVO_CASCADE_TENANTS_MAX);
        uint64_t sum = 0;
        for (uint32_t i = 0; i < p->n_tenants; i++) {
            const kvo_cascade_tenant *t = &p->tenants[i];
            if (!kvo__tenant_label_ok(t->label))
                return kvo__error(KVO_EINVAL,
                                  "kvo_cascade_create: tenants[%u].label is not a tenant label (\"default\" or "
                                  "\"t-\" and 12 hex digits, as kvo_tenant_label gives for the salt)",
                                  (unsigned)i);
            for (uint32_t j = 0; j < i; j++) {
                if (!strcmp(p->tenants[j].label, t->label))
                    return kvo__error(KVO_EINVAL, "kvo_cascade_create: tenant %s is given twice (tenants[%u], [%u])",
                                      t->label, (unsigned)j, (unsigned)i);
                if (t->file_tier && t->file_tier == p->tenants[j].file_tier)
                    return kvo__error(KVO_EINVAL, "kvo_cascade_create: tenants %s and %s are given one file tier",
                                      p->tenants[j].label, t->label);
            }
            if (!t->host_bytes && !t->file_tier)
                return kvo__error(KVO_EINVAL, "kvo_cascade_create: tenant %s has neither host_bytes nor a file tier",
                                  t->label);
            if (t->host_bytes && (!p->host_bytes || t->host_bytes < maxslot || t->host_bytes % KVO_SLOT_ALIGN))
                return kvo__error(KVO_EINVAL,
                                  "kvo_cascade_create: tenant %s: host_bytes %llu needs a host tier, at least the "
                                  "largest slot (%llu bytes) and a multiple of %u",
                                  t->label, (unsigned long long)t->host_bytes, (unsigned long long)maxslot,
                                  (unsigned)KVO_SLOT_ALIGN);
            if (t->file_tier && (!p->file_tier || t->file_tier == p->file_tier))
                return kvo__error(KVO_EINVAL,
                                  "kvo_cascade_create: tenant %s: its file tier needs the cascade's own file tier "
                                  "beside it (params.file_tier, another one)",
                                  t->label);
            if (t->file_tier && p->host_bytes && !t->host_bytes)
                return kvo__error(KVO_EINVAL,
                                  "kvo_cascade_create: tenant %s: a file tier of its own needs a host part of its own "
                                  "too (host_bytes) when the cascade has a host tier: write-back and persist find a "
                                  "chunk's file tier by its host part",
                                  t->label);
            sum += t->host_bytes;
        }
        if (sum && (sum > p->host_bytes || p->host_bytes - sum < maxslot))
            return kvo__error(KVO_EINVAL,
                              "kvo_cascade_create: the tenants' parts take %llu of host_bytes %llu; the shared part "
                              "needs at least the largest slot (%llu bytes)",
                              (unsigned long long)sum, (unsigned long long)p->host_bytes,
                              (unsigned long long)maxslot);
    }
    if (p->arena && kvo_arena_size(p->arena) < p->host_bytes + p->staging_bytes)
        return kvo__error(KVO_EINVAL,
                          "kvo_cascade_create: the arena given has %llu bytes; host_bytes + staging_bytes need %llu",
                          (unsigned long long)kvo_arena_size(p->arena),
                          (unsigned long long)(p->host_bytes + p->staging_bytes));
    return 0;
}

int kvo_cascade_create(const kvo_cascade_params *p, kvo_cascade **out) {
    kvo_cascade_params p_in_;
    KVO__PARAMS_IN(p, kvo_cascade_params, p_in_, kvo_cascade_default_params, retry_polls, "kvo_cascade_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_cascade_create: params and out must not be NULL");
    int rc = kvo__validate(p);
    if (rc) return rc;
    kvo_cascade *c = kvo__calloc(1, sizeof *c);
    if (!c) return kvo__error(KVO_ENOMEM, "kvo_cascade_create: out of memory");
    c->p = *p;
    c->plan = p->plan;
    c->ng = kvo_plan_num_groups(p->plan);
    c->file = p->file_tier;
    c->remote = p->remote_tier;
    c->epfd = -1;
    if (!c->p.retry_polls) c->p.retry_polls = 200;
    if (!c->p.remote_exists_ttl_ms) c->p.remote_exists_ttl_ms = 1000; /* an answer must outlive the lookup waiting for it */
    pthread_mutex_init(&c->mu, NULL);
    uint64_t offl = 0;
    for (size_t g = 0; g < c->ng; g++)
        if (kvo_plan_group(p->plan, g)->offloaded) offl |= UINT64_C(1) << g;
    c->groups[KVO_TIER_HOST] = offl;
    c->groups[KVO_TIER_FILE] = c->file ? offl : 0;
    c->groups[KVO_TIER_REMOTE] = c->remote ? offl : 0;
    if ((rc = kvo__hmap_init(&c->ops, sizeof(kvo__cop), 64, "cascade: reads in flight")) ||
        (rc = kvo__hmap_init(&c->pend, sizeof(kvo__pend), 64, "cascade: stores in flight")) ||
        (rc = kvo__hmap_init(&c->presence, sizeof(kvo__pres), c->remote ? 256 : 1, "cascade: presence answers")))
        goto fail;
    if (p->host_bytes) {
        if (p->arena) c->arena = p->arena;
        else {
            kvo_arena_params ap = kvo_arena_default_params();
            ap.bytes = p->host_bytes + p->staging_bytes;
            ap.huge_pages = p->huge_pages;
            ap.lock = p->lock_memory;
            ap.prefault = p->prefault;
            if ((rc = kvo_arena_create(&ap, &c->arena))) goto fail;
            c->own_arena = true;
        }
        c->base = kvo_arena_base(c->arena);
        kvo_store_params sp = kvo_store_default_params();
        sp.plan = p->plan;
        sp.policy = p->policy;
        sp.admit_after = p->admit_after;
        sp.event_capacity = p->event_capacity;
        sp.ignore_present = p->ignore_present;
        sp.lookups_per_key = p->lookups_per_key;
        sp.policy_admission = !c->file && !c->remote; /* the host tier is the last one */
        /* the tenants' parts first (each a multiple of the slot alignment),
         * the shared part after them */
        uint64_t at = 0;
        for (uint32_t i = 0; i < p->n_tenants; i++) {
            if (!p->tenants[i].host_bytes) continue;
            sp.base_offset = at;
            sp.capacity_bytes = p->tenants[i].host_bytes;
            if ((rc = kvo_store_create(&sp, &c->parts[i + 1]))) goto fail;
            at += p->tenants[i].host_bytes;
        }
        sp.base_offset = at;
        sp.capacity_bytes = p->host_bytes - at;
        if ((rc = kvo_store_create(&sp, &c->store))) goto fail;
        if (p->staging_bytes) {
            kvo_store_params tp = kvo_store_default_params();
            tp.plan = p->plan;
            tp.capacity_bytes = p->staging_bytes;
            if ((rc = kvo_store_create(&tp, &c->stage))) goto fail;
        }
        if (p->verify_checksums) {
            c->n_sums = (size_t)(p->host_bytes / KVO_SLOT_ALIGN) + 1;
            if (!(c->sums = kvo__calloc(c->n_sums, sizeof *c->sums))) {
                rc = kvo__error(KVO_ENOMEM, "kvo_cascade_create: out of memory for %zu checksums", c->n_sums);
                goto fail;
            }
        }
    }
    /* the parts (also without a host tier: files) */
    c->nparts = 1 + p->n_tenants;
    c->parts[0] = c->store;
    c->files[0] = c->file;
    if (c->file) c->ftiers[c->nft++] = c->file;
    for (uint32_t i = 0; i < p->n_tenants; i++) {
        (void)kvo__strlcpy(c->labels[i + 1], p->tenants[i].label, sizeof c->labels[i + 1]);
        if (!c->parts[i + 1]) c->parts[i + 1] = c->store;
        c->files[i + 1] = p->tenants[i].file_tier ? p->tenants[i].file_tier : c->file;
        if (p->tenants[i].file_tier) c->ftiers[c->nft++] = p->tenants[i].file_tier;
    }
    if ((rc = kvo__ring_init(&c->cq, sizeof(kvo_cascade_completion), 64, 0, true, "cascade: completions"))) goto fail;
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0) {
        rc = kvo__error(KVO_EIO, "kvo_cascade_create: eventfd/epoll: %s", strerror(errno));
        goto fail;
    }
    if ((rc = kvo__epoll_add(c->epfd, c->cq.efd)) ||
        (c->remote && (rc = kvo__epoll_add(c->epfd, kvo_remote_tier_event_fd(c->remote)))))
        goto fail;
    for (uint32_t i = 0; i < c->nft; i++)
        if ((rc = kvo__epoll_add(c->epfd, kvo_file_tier_event_fd(c->ftiers[i])))) goto fail;
    *out = c;
    return 0;
fail:
    kvo_cascade_destroy(c);
    return rc;
}

void kvo_cascade_destroy(kvo_cascade *c) {
    if (!c) return;
    if (c->ops.e) kvo__casc_drain(c);
    if (c->n_defer) { /* one last try for the deferred writes; the rest is dropped (counted) */
        kvo__casc_lock(c);
        uint32_t keep = c->p.retry_polls;
        c->p.retry_polls = 0;
        kvo__casc_retry(c);
        kvo__casc_retry(c);
        c->p.retry_polls = keep;
        kvo__casc_unlock(c);
        kvo__casc_drain(c);
    }
    kvo__hmap_free(&c->ops);
    kvo__hmap_free(&c->pend);
    kvo__hmap_free(&c->presence);
    kvo__ring_free(&c->cq);
    kvo_store_destroy(c->stage);
    for (uint32_t i = 1; i <= KVO_CASCADE_TENANTS_MAX; i++)
        if (c->parts[i] != c->store) kvo_store_destroy(c->parts[i]);
    kvo_store_destroy(c->store);
    if (c->own_arena) kvo_arena_destroy(c->arena);
    if (c->epfd >= 0) close(c->epfd);
    kvo__free(c->defer);
    kvo__free(c->sums);
    kvo__free(c->ev_keys);
    kvo__free(c->ev_slots);
    kvo__free(c->s_keys);
    kvo__free(c->s_slots);
    kvo__free(c->s_u8);
    kvo__free(c->s_u8b);
    kvo__free(c->s_idx);
    kvo__free(c->s_ud);
    kvo__free(c->s_ptr);
    kvo__free(c->s_res);
    pthread_mutex_destroy(&c->mu);
    kvo__free(c);
}

kvo_store *kvo_cascade_store(kvo_cascade *c) { return c ? c->store : NULL; }
kvo_store *kvo_cascade_part_store(kvo_cascade *c, uint32_t part) {
    return c && part < c->nparts ? c->parts[part] : NULL;
}

int kvo_cascade_host_stats(kvo_cascade *c, kvo_store_stats *out) {
    if (!c || !c->store || !out) return kvo__error(KVO_EINVAL, "kvo_cascade_host_stats: NULL, or no host tier");
    int rc = kvo_store_get_stats(c->store, out);
    for (uint32_t t = 1; t < c->nparts && !rc; t++) {
        if (!kvo__casc_own_store(c, t)) continue;
        kvo_store_stats ps = KVO_STORE_STATS_INIT;
        if ((rc = kvo_store_get_stats(c->parts[t], &ps))) break;
#define KVO__SUM(f) out->f += ps.f
        KVO__SUM(capacity_bytes); KVO__SUM(bytes_used); KVO__SUM(bytes_reserved); KVO__SUM(entries);
        KVO__SUM(pinned); KVO__SUM(pending); KVO__SUM(hits); KVO__SUM(misses); KVO__SUM(pending_hits);
        KVO__SUM(stores); KVO__SUM(store_skipped_present); KVO__SUM(store_not_admitted);
        KVO__SUM(rejected_stores); KVO__SUM(evictions); KVO__SUM(removals); KVO__SUM(events_dropped);
        KVO__SUM(segments); KVO__SUM(segments_free);
        for (size_t g = 0; g < ps.n_groups && g < KVO_MAX_GROUPS; g++) {
            KVO__SUM(groups[g].chunks); KVO__SUM(groups[g].bytes_used); KVO__SUM(groups[g].capacity_chunks);
            KVO__SUM(groups[g].hits); KVO__SUM(groups[g].misses); KVO__SUM(groups[g].stores);
            KVO__SUM(groups[g].evictions);
        }
#undef KVO__SUM
    }
    return rc;
}

size_t kvo_cascade_drain_events(kvo_cascade *c, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (dropped) *dropped = 0;
    if (!c || !out) return 0;
    size_t n = 0;
    for (uint32_t t = 0; t < c->nparts; t++) {
        if (!kvo__casc_own_store(c, t)) continue;
        uint64_t d = 0;
        size_t m = kvo_store_drain_events(c->parts[t], out + n, cap - n, &d);
        for (size_t i = n; i < n + m; i++) out[i].key.tenant = t;
        n += m;
        if (dropped) *dropped += d;
    }
    return n;
}

int kvo_cascade_tenant_part(const kvo_cascade *c, const void *salt, size_t len, uint32_t *part) {
    if (!c || !part) return kvo__error(KVO_EINVAL, "kvo_cascade_tenant_part: c and part must not be NULL");
    *part = 0;
    if (!salt && len) return kvo__error(KVO_EINVAL, "kvo_cascade_tenant_part: salt NULL with len %zu", len);
    if (c->nparts <= 1) return 0;
    char label[KVO_TENANT_LABEL_MAX];
    int rc = kvo_tenant_label(salt, len, label, sizeof label);
    if (rc) return rc;
    for (uint32_t t = 1; t < c->nparts; t++)
        if (!strcmp(c->labels[t], label)) *part = t;
    return 0;
}

kvo_arena *kvo_cascade_arena(kvo_cascade *c) { return c ? c->arena : NULL; }
kvo_file_tier *kvo_cascade_file_tier(kvo_cascade *c) { return c ? c->file : NULL; }
kvo_remote_tier *kvo_cascade_remote_tier(kvo_cascade *c) { return c ? c->remote : NULL; }

void *kvo_cascade_slot_ptr(kvo_cascade *c, kvo_slot s) {
    if (!c || !c->base || s.offset > c->p.host_bytes + c->p.staging_bytes ||
        s.bytes > c->p.host_bytes + c->p.staging_bytes - s.offset)
        return NULL;
    return c->base + s.offset;
}

int kvo_cascade_promote(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint8_t *tiers,
                        const uint64_t *user_data, int *results) {
    if (!c || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_cascade_promote: c and keys must not be NULL");
    int rc = kvo__casc_check_keys(c, keys, n, false, "kvo_cascade_promote");
    if (rc) return rc;
    kvo__casc_lock(c);
    rc = kvo__casc_promote(c, keys, n, tiers, user_data, results);
    kvo__casc_unlock(c);
    return rc;
}

int kvo_cascade_set_tier_groups(kvo_cascade *c, kvo_tier_id tier, uint64_t groups) {
    if (!c || (tier != KVO_TIER_FILE && tier != KVO_TIER_REMOTE))
        return kvo__error(KVO_EINVAL, "kvo_cascade_set_tier_groups: tier must be KVO_TIER_FILE or KVO_TIER_REMOTE");
    kvo__casc_lock(c);
    bool have = tier == KVO_TIER_FILE ? c->file != NULL : c->remote != NULL;
    c->groups[tier] = have ? groups & c->groups[KVO_TIER_HOST] : 0;
    kvo__casc_unlock(c);
    return 0;
}

int kvo_cascade_invalidate(kvo_cascade *c, uint64_t groups, uint64_t *n_removed) {
    if (n_removed) *n_removed = 0;
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_invalidate: c must not be NULL");
    kvo__casc_lock(c);
    for (size_t g = 0; g < c->ng; g++)
        if ((groups >> g) & 1) c->gen[g]++;
    /* deferred writes of those groups are dropped (counted) */
    size_t w = 0;
    for (size_t i = 0; i < c->n_defer; i++) {
        kvo__defer *d = &c->defer[i];
        if (!((groups >> d->key.group) & 1)) {
            c->defer[w++] = *d;
            continue;
        }
        if (d->tiers & KVO__CASC_TIER_BIT(KVO_TIER_FILE)) c->st.file.writes_dropped++;
        if (d->tiers & KVO__CASC_TIER_BIT(KVO_TIER_REMOTE)) c->st.remote.writes_dropped++;
        if (d->staged) (void)kvo_store_complete_store(c->stage, &d->key, 1, false);
    }
    c->n_defer = w;
    uint64_t removed = 0;
    for (uint32_t t = 0; t < c->nparts && groups; t++) { /* READY host entries of those groups: removed (pinned
                                                           ones retired) */
        if (!kvo__casc_own_store(c, t)) continue;
        enum { B = 64 };
        kvo_store_entry ents[B];
        kvo_chunk_key keys[B];
        uint64_t cursor = 0;
        do {
            size_t n = 0, m = 0;
            if (kvo_store_scan(c->parts[t], &cursor, ents, B, &n)) break;
            for (size_t i = 0; i < n; i++)
                if (ents[i].state == KVO_READY && ((groups >> ents[i].key.group) & 1)) keys[m++] = ents[i].key;
            for (size_t i = 0; i < m; i++) {
                if (kvo_store_remove(c->parts[t], &keys[i], 1) == 0) removed++;
                else (void)kvo_store_retire(c->parts[t], &keys[i], 1);
            }
        } while (cursor);
    }
    kvo__casc_unlock(c);
    if (n_removed) *n_removed = removed;
    return 0;
}

int kvo_cascade_get_stats(kvo_cascade *c, kvo_cascade_stats *out) {
    kvo_cascade_stats full;
    memset(&full, 0, sizeof full);
    if (c) {
        kvo__casc_lock(c);
        full = c->st;
        full.promotions_now = c->promoting;
        full.reads_now = c->reading;
        full.deferred_now = c->n_defer;
        full.lent_now = c->lent;
        full.staged_now = 0;
        for (size_t i = 0; i < c->n_defer; i++) full.staged_now += c->defer[i].staged;
        kvo__casc_unlock(c);
    }
    full.struct_size = sizeof full;
    KVO__STATS_OUT("kvo_cascade_get_stats", kvo_cascade_stats, host, "KVO_CASCADE_STATS_INIT", out, full,
                   c ? 0 : kvo__error(KVO_EINVAL, "kvo_cascade_get_stats: c must not be NULL"));
}
