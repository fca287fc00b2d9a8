/*
 * The engine's offload hooks implemented with the kvoffload connector.
 *
 * Mapping (engine hook -> connector call):
 *   lookup(local)     add_request (first time) + lookup(local): HIT gives the
 *                     boundary to load, NONE none, PENDING -> KVO_EAGAIN (the
 *                     scheduler asks again next step: stores are landing)
 *   load(local, hit)  load(hit, block tables); on an error the hit is
 *                     declined (load(local)) so the pins are released
 *   poll_load         poll(); a KVO_COMPLETION_LOAD for the request gives
 *                     tokens_valid (local on failure: the engine recomputes)
 *   computed(n)       update(min(n, prompt), tables): complete chunks stored
 *   release(g, j)     wait_blocks: no store may still read a block the
 *                     engine frees (sliding blocks leaving the window)
 *   finish            request_stats into the result, finish(); if stores are
 *                     still running, wait_request before the engine frees
 *   progress          poll() every scheduler step
 * Only prompt tokens are stored (update is capped at the prompt): in the
 * Mooncake workload a later turn never repeats generated tokens.
 *
 * Per live request the adapter keeps a small record (load completion, the
 * highest computed count reported); the engine runs a handful of requests at
 * once, so records live in a short array searched linearly.
 */
#include <poll.h>

#include "engine_internal.h"
#include "kvo_engine_offload.h"
#include "kvoffload/kvo_remote_tier.h"

typedef struct kvo__conn_req {
    uint64_t id;
    bool live, added, load_done;
    uint64_t valid;
    uint64_t reported;
    uint32_t trim, trim_to; /* trim_hits: the connector's hit and the shorter one
                               the engine got; 0 none */
} kvo__conn_req;

struct kvo_eng_conn {
    kvo_eng *e;
    kvo_plan *plan;
    kvo_connector *conn;
    kvo_file_tier *ft;
    kvo_remote_tier *rt;
    kvo_eng_offload ops;
    uint32_t G;
    kvo_eng_conn_params p;
    kvo__conn_req *reqs;
    size_t n_reqs, cap_reqs;
    uint64_t loads_seen;
    uint64_t hook_errors;
    uint64_t trimmed;
    kvo_block_table tables[KVO_ENG_MAX_GROUPS];
    kvo_completion comp[64];
};

kvo_eng_conn_params kvo_eng_conn_default_params(void) {
    kvo_eng_conn_params p;
    memset(&p, 0, sizeof p);
    p.chunk_tokens = 64;
    p.host_bytes = 64ull << 20;
    p.file_bytes = 256ull << 20;
    p.transfer_threads = 2;
    return p;
}

static kvo__conn_req *kvo__find(kvo_eng_conn *c, uint64_t id, bool create) {
    for (size_t i = 0; i < c->n_reqs; i++)
        if (c->reqs[i].live && c->reqs[i].id == id) return &c->reqs[i];
    if (!create) return NULL;
    for (size_t i = 0; i < c->n_reqs; i++)
        if (!c->reqs[i].live) {
            memset(&c->reqs[i], 0, sizeof c->reqs[i]);
            c->reqs[i].id = id;
            c->reqs[i].live = true;
            return &c->reqs[i];
        }
    if (c->n_reqs == c->cap_reqs) {
        size_t nc = c->cap_reqs ? 2 * c->cap_reqs : 16;
        kvo__conn_req *nr = realloc(c->reqs, nc * sizeof *nr);
        if (!nr) return NULL;
        c->reqs = nr;
        c->cap_reqs = nc;
    }
    kvo__conn_req *q = &c->reqs[c->n_reqs++];
    memset(q, 0, sizeof *q);
    q->id = id;
    q->live = true;
    return q;
}

static const kvo_block_table *kvo__tables(kvo_eng_conn *c, kvo_eng_req *r) {
    for (uint32_t g = 0; g < c->G; g++) {
        uint32_t n = 0;
        c->tables[g].blocks = kvo_eng_req_blocks(r, g, &n);
        c->tables[g].n = n;
    }
    return c->tables;
}

static void kvo__drain(kvo_eng_conn *c) {
    size_t n;
    while (kvo_connector_poll(c->conn, c->comp, sizeof c->comp / sizeof c->comp[0], &n) == 0 && n > 0) {
        for (size_t i = 0; i < n; i++) {
            const kvo_completion *k = &c->comp[i];
            if (k->type != KVO_COMPLETION_LOAD) continue;
            kvo__conn_req *q = kvo__find(c, k->request, false);
            if (!q) continue;
            q->load_done = true;
            q->valid = k->tokens_valid;
        }
        if (n < sizeof c->comp / sizeof c->comp[0]) break;
    }
}

/* Test knob trim_hits: the shortest hit h' < h (above local) whose blocks are
 * exactly those the connector loads for h (h' lies in the last block of h in
 * every group, so the scan covers less than one block), so that
 * the engine takes a load whose last block is only partly valid and
 * recomputes from h' over its tail.  Full groups: [local, h') is inside
 * [local, h).  Sliding groups: the first block the engine needs at h'
 * (that of h' - window) must be the first the connector loads for h (that
 * of h - window), or the engine would hold an unloaded block.  State groups:
 * only the snapshot at h is loaded, so no trim. */
static uint32_t kvo__trim_hit(const kvo_eng_conn *c, uint32_t local, uint32_t h) {
    const kvo_eng_config *cfg = &c->e->cfg;
    for (uint32_t g = 0; g < cfg->n_groups; g++)
        if (cfg->groups[g].kind == KVO_GROUP_STATE) return h;
    uint32_t from = local + 1;
    for (uint32_t g = 0; g < cfg->n_groups; g++) {
        uint32_t tpb = cfg->groups[g].tokens_per_block, last = (h - 1) / tpb * tpb + 1; /* h' > last block's start */
        if (last > from) from = last;
    }
    for (uint32_t t = from; t < h; t++) {
        bool ok = true;
        for (uint32_t g = 0; g < cfg->n_groups && ok; g++) {
            const kvo_eng_group_cfg *gc = &cfg->groups[g];
            uint32_t tpb = gc->tokens_per_block, w = gc->window, lb = local / tpb;
            /* the engine's table (ceil(h'/tpb) entries) reaches every block
             * the connector writes for h */
            ok = (t + tpb - 1) / tpb == (h + tpb - 1) / tpb;
            if (ok && gc->kind == KVO_GROUP_SLIDING) {
                uint32_t a = t > w ? (t - w) / tpb : 0, b = h > w ? (h - w) / tpb : 0;
                ok = (a > lb ? a : lb) == (b > lb ? b : lb);
            }
        }
        if (ok) return t;
    }
    return h;
}

static int kvo__h_lookup(void *ctx, kvo_eng_req *r, uint32_t local, uint32_t *hit) {
    kvo_eng_conn *c = ctx;
    uint64_t id = kvo_eng_req_id(r);
    kvo__conn_req *q = kvo__find(c, id, true);
    if (!q) return kvo__eng_error(KVO_ENOMEM, "offload: out of memory");
    if (!q->added) {
        uint32_t n = 0;
        const uint32_t *toks = kvo_eng_req_tokens(r, &n);
        kvo_request_desc d = KVO_REQUEST_DESC_INIT;
        d.id = id;
        d.tokens = toks;
        d.n_tokens = kvo_eng_req_prompt_len(r);
        int rc = kvo_connector_add_request(c->conn, &d);
        if (rc) {
            q->live = false;
            c->hook_errors++;
            return kvo__eng_lib_error(rc, "offload: add_request");
        }
        q->added = true;
    }
    kvo_lookup_result lr;
    int rc = kvo_connector_lookup(c->conn, id, local, &lr);
    if (rc) {
        c->hook_errors++;
        return kvo__eng_lib_error(rc, "offload: lookup");
    }
    if (lr.status == KVO_HIT_PENDING) return KVO_EAGAIN;
    *hit = lr.status == KVO_HIT ? (uint32_t)lr.tokens : local;
    if (c->p.trim_hits && *hit > local + 1) {
        uint32_t t = kvo__trim_hit(c, local, *hit);
        if (t < *hit) c->trimmed++;
        q->trim = *hit; /* a load of t still asks the connector for its hit */
        q->trim_to = t;
        *hit = t;
    } else
        q->trim = q->trim_to = 0;
    return 0;
}

static int kvo__h_load(void *ctx, kvo_eng_req *r, uint32_t local, uint32_t hit) {
    kvo_eng_conn *c = ctx;
    uint64_t id = kvo_eng_req_id(r);
    kvo__conn_req *q = kvo__find(c, id, false);
    if (!q) return kvo__eng_error(KVO_ESTATE, "offload: load of unknown request %llu", (unsigned long long)id);
    q->load_done = false;
    const kvo_block_table *t = kvo__tables(c, r);
    int rc;
    uint32_t want = q->trim && hit == q->trim_to ? q->trim : hit; /* trim_hits: the connector's own hit */
    for (int tries = 0;; tries++) {
        rc = kvo_connector_load(c->conn, id, want, t, c->G);
        if (rc != KVO_EAGAIN || tries > 1000) break;
        kvo__drain(c); /* queue full: let copies finish */
    }
    if (rc) {
        int keep = kvo__eng_lib_error(rc, "offload: load");
        c->hook_errors++;
        (void)kvo_connector_load(c->conn, id, local, t, c->G); /* decline: unpin */
        return keep;
    }
    return 0;
}

static int kvo__h_poll_load(void *ctx, kvo_eng_req *r, uint32_t *valid) {
    kvo_eng_conn *c = ctx;
    kvo__conn_req *q = kvo__find(c, kvo_eng_req_id(r), false);
    if (!q) return -1;
    if (!q->load_done) kvo__drain(c);
    if (!q->load_done) return 0;
    q->load_done = false;
    *valid = (uint32_t)q->valid;
    if (q->valid > q->reported) q->reported = q->valid;
    if (c->p.fail_every_load && ++c->loads_seen % c->p.fail_every_load == 0) *valid = 0; /* injected */
    return 1;
}

static int kvo__h_computed(void *ctx, kvo_eng_req *r, uint32_t n) {
    kvo_eng_conn *c = ctx;
    kvo__conn_req *q = kvo__find(c, kvo_eng_req_id(r), false);
    if (!q || !q->added) return 0;
    uint32_t m = kvo_eng_req_prompt_len(r);
    if (n < m) m = n;
    if (m <= q->reported) return 0;
    int rc = kvo_connector_update(c->conn, q->id, m, kvo__tables(c, r), c->G);
    if (rc) {
        c->hook_errors++;
        return kvo__eng_lib_error(rc, "offload: update");
    }
    q->reported = m;
    return 0;
}

static int kvo__h_release(void *ctx, kvo_eng_req *r, uint32_t g, uint32_t index) {
    kvo_eng_conn *c = ctx;
    uint32_t n = 0;
    const uint64_t *tab = kvo_eng_req_blocks(r, g, &n);
    if (!tab || index >= n || tab[index] == KVO_ENG_NULL_BLOCK) return 0;
    kvo_block_ref ref = {g, tab[index]};
    int rc = kvo_connector_wait_blocks(c->conn, &ref, 1);
    if (rc) c->hook_errors++;
    return rc;
}

static int kvo__h_finish(void *ctx, kvo_eng_req *r) {
    kvo_eng_conn *c = ctx;
    kvo__conn_req *q = kvo__find(c, kvo_eng_req_id(r), false);
    if (!q) return 0;
    int rc = 0;
    if (q->added) {
        kvo_request_stats st = KVO_REQUEST_STATS_INIT;
        kvo_eng_result *res = kvo_eng_req_result(r);
        if (!kvo_connector_request_stats(c->conn, q->id, &st)) {
            res->tokens_loaded_file = (uint32_t)st.tokens_loaded_file;
            res->tokens_loaded_remote = (uint32_t)st.tokens_loaded_remote;
            res->bytes_loaded = st.bytes_loaded;
            res->bytes_stored = st.bytes_stored;
        }
        uint32_t m = kvo_eng_req_prompt_len(r), comp = kvo_eng_req_computed(r);
        if (comp < m) m = comp;
        if (m < q->reported) m = (uint32_t)q->reported;
        bool busy = false;
        rc = kvo_connector_finish(c->conn, q->id, m, kvo__tables(c, r), c->G, &busy);
        if (rc) {
            c->hook_errors++;
            (void)kvo_connector_abort(c->conn, q->id);
        } else if (busy) {
            rc = kvo_connector_wait_request(c->conn, q->id);
            if (rc) c->hook_errors++;
        }
    }
    q->live = false;
    return rc;
}

static void kvo__h_progress(void *ctx) { kvo__drain(ctx); }

/* The chunk plan: block_size = chunk_tokens when every group's block size
 * and the hash unit divide it (the legacy knob); otherwise (co-prime block
 * sizes) each group gets ceil(chunk_tokens / tpb) blocks, rounded up to a
 * whole number of hash units, so spans stay close to chunk_tokens. */
static int kvo__conn_plan(kvo_eng_conn *c) {
    const kvo_model *m = kvo_eng_model(c->e);
    uint64_t ct = c->p.chunk_tokens, tph = kvo_model_tokens_per_hash(m);
    size_t ng = kvo_model_num_groups(m);
    kvo_plan_params pp = kvo_plan_default_params();
    kvo_group_override ov[KVO_ENG_MAX_GROUPS];
    size_t nov = 0;
    bool divides = ct % tph == 0;
    for (size_t g = 0; g < ng && ct; g++) divides = divides && ct % kvo_model_group(m, g)->tokens_per_block == 0;
    if (!ct || divides) pp.block_size = ct;
    else {
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_desc *gd = kvo_model_group(m, g);
            uint64_t tpb = gd->tokens_per_block, a = tpb, b = tph;
            while (b) {
                uint64_t t = a % b;
                a = b;
                b = t;
            }
            uint64_t min_b = tph / a; /* lcm(tpb, tph) / tpb */
            uint64_t n = (ct + tpb - 1) / tpb;
            if (gd->cacheable) ov[nov++] = (kvo_group_override){gd->name, (uint32_t)((n + min_b - 1) / min_b * min_b)};
        }
        pp.overrides = ov;
        pp.n_overrides = nov;
    }
    return kvo_plan_create(m, &pp, &c->plan);
}

/* The remote tier of params.remote_url, namespaced by the engine's layout
 * like the file tier (engines with other segment lists never share
 * values). */
static int kvo__conn_remote(kvo_eng_conn *c) {
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    rp.url = c->p.remote_url;
    rp.plan = c->plan;
    if (c->p.remote_prefix) rp.key_prefix = c->p.remote_prefix;
    size_t nseg = 0;
    const kvo_segment *sg = kvo_eng_segments(c->e, &nseg);
    int rc = kvo_layout_hash(c->plan, sg, nseg, &rp.layout_hash);
    if (!rc) rc = kvo_remote_tier_create(&rp, &c->rt);
    return rc ? kvo__eng_lib_error(rc, "offload") : 0;
}

int kvo_eng_conn_create(kvo_eng *e, const kvo_eng_conn_params *prm, kvo_eng_conn **out) {
    if (!e || !out) return kvo__eng_error(KVO_EINVAL, "kvo_eng_conn_create: NULL argument");
    kvo_eng_conn *c = calloc(1, sizeof *c);
    if (!c) return kvo__eng_error(KVO_ENOMEM, "offload: out of memory");
    c->e = e;
    c->p = prm ? *prm : kvo_eng_conn_default_params();
    c->G = e->cfg.n_groups;
    int rc = kvo__conn_plan(c);
    if (rc) {
        rc = kvo__eng_lib_error(rc, "offload: chunk plan");
        goto fail;
    }
    if (c->p.file_dir) {
        kvo_file_tier_params fp = kvo_file_tier_default_params();
        fp.root = c->p.file_dir;
        fp.plan = c->plan;
        fp.quota_bytes = c->p.file_bytes;
        /* Engines whose segment lists differ store different slot bytes for
         * one plan: keep their files apart. */
        size_t nseg = 0;
        const kvo_segment *sg = kvo_eng_segments(e, &nseg);
        rc = kvo_layout_hash(c->plan, sg, nseg, &fp.layout_hash);
        if (!rc) rc = kvo_file_tier_create(&fp, &c->ft);
        if (rc) {
            rc = kvo__eng_lib_error(rc, "offload: file tier");
            goto fail;
        }
    }
    if (c->p.remote_url && (rc = kvo__conn_remote(c)) != 0) goto fail;
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = c->plan;
    /* The KV bytes depend on the weights, not only on the geometry: the
     * model's identity (its whole configuration, the weights' seed
     * included) names the namespace of every key, in every tier (a file
     * tier or cluster another run with other weights wrote never hits). */
    const kvo_eng_config *mc = &e->cfg;
    char model[1024];
    int len = snprintf(model, sizeof model, "shape=%s vocab=%u d_model=%u heads=%u d_ff=%u tph=%u seed=%llu",
                       mc->shape, mc->vocab, mc->d_model, mc->n_heads, mc->d_ff, mc->tokens_per_hash,
                       (unsigned long long)mc->seed);
    for (uint32_t g = 0; g < mc->n_groups && len > 0 && (size_t)len < sizeof model; g++)
        len += snprintf(model + len, sizeof model - (size_t)len, " [%s kind=%d tpb=%u layers=%u window=%u]",
                        mc->groups[g].name, (int)mc->groups[g].kind, mc->groups[g].tokens_per_block,
                        mc->groups[g].layers, mc->groups[g].window);
    kvo_u128 mns;
    kvo_namespace_desc nd = KVO_NAMESPACE_DESC_INIT;
    nd.engine = "kvoffload-reference-engine";
    nd.model = model;
    nd.model_len = len > 0 && (size_t)len < sizeof model ? (size_t)len : sizeof model - 1;
    nd.dtype = "float32";
    if ((rc = kvo_namespace_id(c->plan, &nd, &mns))) {
        rc = kvo__eng_lib_error(rc, "offload: namespace");
        goto fail;
    }
    cp.salt = &mns;
    cp.salt_len = sizeof mns;
    cp.remote_tier = c->rt;
    cp.host_bytes = c->p.host_bytes;
    cp.file_tier = c->ft;
    cp.file_mode = c->p.file_mode;
    cp.verify_checksums = c->p.verify_checksums;
    if (c->p.remote_lookup_budget_us) cp.remote_lookup_budget_us = c->p.remote_lookup_budget_us;
    if (c->p.transfer_threads) cp.transfer_threads = c->p.transfer_threads;
    rc = kvo_connector_create(&cp, &c->conn);
    if (rc) {
        rc = kvo__eng_lib_error(rc, "offload: connector");
        goto fail;
    }
    size_t ns = 0;
    const kvo_segment *segs = kvo_eng_segments(e, &ns);
    rc = kvo_connector_set_layout(c->conn, segs, ns);
    if (rc) {
        rc = kvo__eng_lib_error(rc, "offload: engine layout");
        goto fail;
    }
    c->ops.ctx = c;
    c->ops.lookup = kvo__h_lookup;
    c->ops.load = kvo__h_load;
    c->ops.poll_load = kvo__h_poll_load;
    c->ops.computed = kvo__h_computed;
    c->ops.release = kvo__h_release;
    c->ops.finish = kvo__h_finish;
    c->ops.progress = kvo__h_progress;
    *out = c;
    return 0;
fail:
    kvo_eng_conn_destroy(c);
    return rc;
}

void kvo_eng_conn_destroy(kvo_eng_conn *c) {
    if (!c) return;
    kvo_connector_destroy(c->conn);
    kvo_file_tier_destroy(c->ft);
    kvo_remote_tier_destroy(c->rt);
    kvo_plan_destroy(c->plan);
    free(c->reqs);
    free(c);
}

const kvo_eng_offload *kvo_eng_conn_offload(kvo_eng_conn *c) { return &c->ops; }
const kvo_plan *kvo_eng_conn_plan(const kvo_eng_conn *c) { return c->plan; }
kvo_connector *kvo_eng_conn_connector(kvo_eng_conn *c) { return c->conn; }
uint64_t kvo_eng_conn_hook_errors(const kvo_eng_conn *c) { return c->hook_errors; }
uint64_t kvo_eng_conn_trimmed_hits(const kvo_eng_conn *c) { return c->trimmed; }

uint64_t kvo_eng_conn_chunk_tokens(const kvo_eng_conn *c) {
    uint64_t m = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(c->plan); g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (gp->offloaded && gp->tokens_per_chunk > m) m = gp->tokens_per_chunk;
    }
    return m;
}

int kvo_eng_conn_flush(kvo_eng_conn *c) {
    /* Settle every store: a store is complete (and checksummed) only once
     * its transfer result was polled, so poll until the host tier holds no
     * PENDING entry (bounded: 60 s). */
    for (int waited_ms = 0;; waited_ms += 10) {
        kvo__drain(c);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        int rc = kvo_connector_get_stats(c->conn, &st);
        if (rc) return kvo__eng_lib_error(rc, "offload: flush");
        if (st.host.pending == 0) break;
        if (waited_ms >= 60000) return kvo__eng_error(KVO_ETIMEDOUT, "offload: stores still in flight after 60 s");
        struct pollfd pfd = {kvo_connector_event_fd(c->conn), POLLIN, 0};
        (void)poll(&pfd, 1, 10);
    }
    if (c->rt && kvo_remote_tier_flush(c->rt, KVO_MS(60000)))
        return kvo__eng_error(KVO_ETIMEDOUT, "offload: remote puts still queued after 60 s");
    if (!c->ft) return 0;
    int rc = c->p.file_mode == KVO_FILE_WRITE_BACK ? kvo_connector_flush_to_file(c->conn, KVO_MS(60000), NULL)
                                                   : kvo_file_tier_flush(c->ft, KVO_MS(60000));
    return rc ? kvo__eng_lib_error(rc, "offload: file tier flush") : 0;
}
