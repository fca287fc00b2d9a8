/*
 * The request table: adding requests, appending tokens or unit hashes, and
 * the small request helpers every other file uses (scratch arrays, state
 * changes that keep cq_owed exact, removal); the job table's tracking of
 * the copies in flight (room reserved before a submit, so that registering
 * the job cannot fail) and the block-table check that load and update share.
 *
 * A request keeps its chained unit hashes: tokens are hashed tokens_per_hash
 * at a time (the partial unit waits in tail); engine-given unit hashes are
 * mixed into the request's namespace (fingerprint + connector salt +
 * request salt) instead.  add_request allocates the record before taking
 * c->mu; hashing, the table insert and the appends run under c->mu.
 * With sliding_store CHECKPOINTS, add_request records the best boundaries
 * of the prompt (and of prompt - 1), the checkpoints update.c keeps.
 */
#include "connector/connector_internal.h"

/* Scratch arrays for n chunk entries. */
int kvo__conn_scratch(kvo_connector *c, size_t n) {
    const kvo__arr a[] = {{(void **)&c->s_keys, sizeof *c->s_keys},   {(void **)&c->s_u8, sizeof *c->s_u8},
                          {(void **)&c->s_slots, sizeof *c->s_slots}, {(void **)&c->s_grp, sizeof *c->s_grp},
                          {(void **)&c->s_chunk, sizeof *c->s_chunk}, {(void **)&c->s_tier, sizeof *c->s_tier}};
    return kvo__grow_all(&c->s_cap, n, a, sizeof a / sizeof a[0], 64, "connector: chunk entries");
}

void kvo__conn_snap_key(const kvo__req *r, uint32_t g, size_t unit, kvo_chunk_key *out) {
    static const uint8_t tag = 0x53; /* 'S' */
    memset(out, 0, sizeof *out);
    out->hash = kvo_hash_unit(r->units[unit], NULL, 0, &tag, 1);
    out->group = g;
    out->tenant = r->part;
}

void kvo__conn_chunk_key(const kvo__req *r, const kvo_group_plan *gp, uint64_t ch, kvo_chunk_key *out) {
    kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, out, 1);
    out->tenant = r->part;
}

int kvo__conn_req_missing(uint64_t id) {
    return kvo__error(KVO_ENOTFOUND, "connector: no live request with id %llu", (unsigned long long)id);
}

void kvo__conn_job_free(kvo__job *j) { kvo__free(j); }

void kvo__conn_req_free(kvo__req *r) {
    if (!r) return;
    kvo__conn_job_free(r->deferred);
    kvo__free(r->extra);
    kvo__free(r->units);
    kvo__free(r->tail);
    kvo__free(r->hit);
    kvo__free(r->jobs);
    kvo__free(r->invalid);
    kvo__free(r->retry);
    kvo__free(r);
}

/* Change r's state, keeping cq_owed = requests LOADING or FINISHED. */
void kvo__conn_req_set_state(kvo_connector *c, kvo__req *r, int state) {
    c->cq_owed -= r->state != REQ_ACTIVE;
    c->cq_owed += state != REQ_ACTIVE;
    r->state = state;
}

void kvo__conn_req_remove(kvo_connector *c, kvo__req *r) {
    kvo__conn_req_set_state(c, r, REQ_ACTIVE); /* what it owed is emitted or dropped */
    kvo__map_entry *e = kvo__map_get(&c->reqs, r->id);
    if (e) kvo__map_del(&c->reqs, e);
    c->st.requests_live--;
    kvo__conn_req_free(r);
}

int kvo__conn_check_tables(kvo_connector *c, uint64_t id, const kvo_block_table *tables, size_t n_tables,
                      uint64_t tokens, bool partial) {
    if (!tables || n_tables != c->ng)
        return kvo__error(KVO_EINVAL, "request %llu: %zu block tables given; the plan has %zu groups",
                          (unsigned long long)id, tables ? n_tables : 0, c->ng);
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        uint64_t need = partial ? kvo__div_ceil_u64(tokens, gp->tokens_per_block) : tokens / gp->tokens_per_block;
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

static int kvo__push_units(kvo__req *r, size_t n) {
    return kvo__grow((void **)&r->units, &r->cap_units, r->n_units + n, sizeof *r->units, 16, "connector");
}

static int kvo__append_tokens_locked(kvo_connector *c, kvo__req *r, const uint32_t *tokens, size_t n) {
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    size_t i = 0;
    int rc = kvo__push_units(r, n / tph + 2);
    if (rc) return rc;
    while (r->n_tail > 0 && i < n) {
        r->tail[r->n_tail++] = tokens[i++];
        if (r->n_tail == tph) {
            kvo_u128 parent = r->n_units ? r->units[r->n_units - 1] : r->ns;
            r->units[r->n_units++] = kvo_hash_unit(parent, r->tail, tph, r->extra, r->extra_len);
            r->n_tail = 0;
        }
    }
    size_t full = (n - i) / tph * tph;
    if (full) {
        size_t got = 0;
        kvo_u128 parent = r->n_units ? r->units[r->n_units - 1] : r->ns;
        rc = kvo_hash_tokens(parent, tokens + i, full, tph, r->extra, r->extra_len, r->units + r->n_units,
                             r->cap_units - r->n_units, &got);
        if (rc) return rc;
        r->n_units += got;
        i += full;
    }
    while (i < n) r->tail[r->n_tail++] = tokens[i++];
    r->n_tokens += n;
    return 0;
}

/* Engine-given unit hash -> namespaced unit: XXH3-128(ns || h as 4 LE32 ||
 * extra) through the public unit hash. */
static kvo_u128 kvo__mix_unit(const kvo__req *r, kvo_u128 h) {
    uint32_t w[4] = {(uint32_t)h.lo, (uint32_t)(h.lo >> 32), (uint32_t)h.hi, (uint32_t)(h.hi >> 32)};
    return kvo_hash_unit(r->ns, w, 4, r->extra, r->extra_len);
}

/* The best boundary for a sequence whose chunks complete within x tokens are
 * all present (used for the checkpoint policy).  Boundary <= x. */
uint64_t kvo__conn_best_boundary(kvo_connector *c, uint64_t x) {
    size_t maxc = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (gp->offloaded && x / gp->tokens_per_chunk > maxc) maxc = x / gp->tokens_per_chunk;
    }
    if (kvo__grow((void **)&c->ones, &c->ones_cap, maxc + 1, 1, 16, "connector")) return 0;
    memset(c->ones, KVO_READY, c->ones_cap);
    const uint8_t *ptr[KVO_MAX_GROUPS];
    size_t n[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        ptr[g] = c->ones;
        n[g] = gp->offloaded ? x / gp->tokens_per_chunk : 0;
    }
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    in.plan = c->plan;
    in.n_tokens = x + 1;
    in.min_hit_tokens = 1;
    in.scratch_groups = ~UINT64_C(0);
    in.chunk_states = ptr;
    in.n_chunks = n;
    kvo_agree_result res;
    if (kvo_agree(&in, &res)) return 0;
    return res.tokens;
}

int kvo_connector_add_request(kvo_connector *c, const kvo_request_desc *d) {
    if (!c || !d) return kvo__error(KVO_EINVAL, "kvo_connector_add_request: c and d must not be NULL");
    kvo_request_desc d_in_; /* fields past the caller's struct_size: zero */
    KVO__STRUCT_IN(d, kvo_request_desc, d_in_, (kvo_request_desc)KVO_REQUEST_DESC_INIT, offload_prompt_only,
                   "kvo_connector_add_request", "KVO_REQUEST_DESC_INIT");
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    bool hash_mode = d->unit_hashes != NULL;
    if (hash_mode == (d->tokens != NULL))
        return kvo__error(KVO_EINVAL, "request %llu: give exactly one of tokens and unit_hashes",
                          (unsigned long long)d->id);
    uint64_t prompt = hash_mode ? d->prompt_tokens : d->n_tokens;
    if (prompt == 0) return kvo__error(KVO_EINVAL, "request %llu: empty prompt", (unsigned long long)d->id);
    if (hash_mode && (prompt / tph != d->n_units))
        return kvo__error(KVO_EINVAL,
                          "request %llu: %zu unit hashes do not match prompt_tokens %llu (tokens_per_hash %u: "
                          "expected %llu units)",
                          (unsigned long long)d->id, d->n_units, (unsigned long long)prompt, tph,
                          (unsigned long long)(prompt / tph));
    if ((d->cache_salt_len && !d->cache_salt) || (d->extra_len && !d->extra))
        return kvo__error(KVO_EINVAL, "request %llu: cache_salt / extra is NULL with a nonzero length",
                          (unsigned long long)d->id);
    kvo__req *r = kvo__calloc(1, sizeof *r);
    if (!r) return kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)d->id);
    r->id = d->id;
    r->hash_mode = hash_mode;
    r->tail = kvo__malloc((size_t)tph * sizeof *r->tail);
    int rc = 0;
    if (!r->tail) goto oom;
    /* namespace: fingerprint + connector salt + request salt */
    {
        size_t sl = c->p.salt_len + d->cache_salt_len;
        uint8_t *buf = kvo__malloc(sl ? sl : 1);
        if (!buf) goto oom;
        if (c->p.salt_len) memcpy(buf, c->salt, c->p.salt_len);
        if (d->cache_salt_len) memcpy(buf + c->p.salt_len, d->cache_salt, d->cache_salt_len);
        r->ns = kvo_keys_namespace(c->fingerprint, buf, sl);
        kvo__free(buf);
    }
    if (d->extra_len) {
        r->extra = kvo__malloc(d->extra_len);
        if (!r->extra) goto oom;
        memcpy(r->extra, d->extra, d->extra_len);
        r->extra_len = d->extra_len;
    }
    r->prompt_tokens = prompt;
    r->st.prompt_tokens = prompt;
    char tenant[KVO_TENANT_LABEL_MAX];
    (void)kvo_tenant_label(d->cache_salt, d->cache_salt_len, tenant, sizeof tenant); /* checked above */
    uint32_t part = 0;
    (void)kvo_cascade_tenant_part(c->casc, d->cache_salt, d->cache_salt_len, &part); /* checked above */
    r->part = (uint8_t)part;

    kvo__conn_lock(c);
    if (kvo__conn_req_get(c, d->id)) {
        kvo__conn_unlock(c);
        kvo__conn_req_free(r);
        return kvo__error(KVO_EEXIST, "request %llu: id already live", (unsigned long long)d->id);
    }
    if (c->st.requests_live >= c->p.max_requests) {
        kvo__conn_unlock(c);
        kvo__conn_req_free(r);
        return kvo__error(KVO_ENOSPC, "request %llu: %u requests live (max_requests); finish some first",
                          (unsigned long long)d->id, c->p.max_requests);
    }
    kvo__conn_req_controls(c, r, d); /* limits, epoch (namespace) */
    if (hash_mode) {
        rc = kvo__push_units(r, d->n_units);
        if (!rc) {
            for (size_t i = 0; i < d->n_units; i++) r->units[i] = kvo__mix_unit(r, d->unit_hashes[i]);
            r->n_units = d->n_units;
            r->n_tokens = prompt;
        }
    } else {
        rc = kvo__append_tokens_locked(c, r, d->tokens, d->n_tokens);
    }
    if (!rc && c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS) {
        uint64_t a = kvo__conn_best_boundary(c, prompt), b = prompt > 1 ? kvo__conn_best_boundary(c, prompt - 1) : 0;
        if (a) r->ckpt[r->n_ckpt++] = a;
        if (b && b != a) r->ckpt[r->n_ckpt++] = b;
    }
    kvo__map_entry *e = NULL;
    if (!rc) rc = kvo__map_put(&c->reqs, d->id, &e);
    if (rc < 0 || rc == 1) {
        kvo__conn_unlock(c);
        kvo__conn_req_free(r);
        return rc < 0 ? rc : KVO_EEXIST;
    }
    e->p = r;
    r->tenant = kvo__conn_tenant_row(c, tenant);
    kvo__conn_tenant(c, r->tenant)->requests++;
    c->st.requests_added++;
    c->st.requests_live++;
    kvo__conn_unlock(c);
    return 0;
oom:
    kvo__conn_req_free(r);
    return kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)d->id);
}

int kvo_connector_append_tokens(kvo_connector *c, uint64_t id, const uint32_t *tokens, size_t n) {
    if (!c || (!tokens && n)) return kvo__error(KVO_EINVAL, "kvo_connector_append_tokens: NULL argument");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc;
    if (!r) rc = kvo__conn_req_missing(id);
    else if (r->hash_mode)
        rc = kvo__error(KVO_ESTATE, "request %llu: created with unit hashes; use append_unit_hashes",
                        (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    else
        rc = kvo__append_tokens_locked(c, r, tokens, n);
    kvo__conn_unlock(c);
    return rc;
}

int kvo_connector_append_unit_hashes(kvo_connector *c, uint64_t id, const kvo_u128 *units, size_t n,
                                     uint64_t n_tokens_total) {
    if (!c || (!units && n)) return kvo__error(KVO_EINVAL, "kvo_connector_append_unit_hashes: NULL argument");
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else if (!r->hash_mode)
        rc = kvo__error(KVO_ESTATE, "request %llu: created with tokens; use append_tokens", (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    else if (n_tokens_total < r->n_tokens || n_tokens_total / tph != r->n_units + n)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: %llu tokens need %llu units; have %zu + %zu given",
                        (unsigned long long)id, (unsigned long long)n_tokens_total,
                        (unsigned long long)(n_tokens_total / tph), r->n_units, n);
    else if (!(rc = kvo__push_units(r, n))) {
        for (size_t i = 0; i < n; i++) r->units[r->n_units + i] = kvo__mix_unit(r, units[i]);
        r->n_units += n;
        r->n_tokens = n_tokens_total;
    }
    kvo__conn_unlock(c);
    return rc;
}
