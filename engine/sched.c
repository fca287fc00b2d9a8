/*
 * The scheduler: runs a list of requests to completion with continuous
 * batching, an engine-side prefix cache and optional offload hooks.
 *
 * Life of a request:
 *   WAITING  -> admitted when a running slot is free and every group's block
 *               budget can hold the peak of all running requests plus this
 *               one (peak: full and state groups hold ceil(T / tpb) blocks for
 *               T = prompt + generated - 1 tokens of KV; sliding groups at most
 *               ceil(window / tpb) + 1 live blocks).  Reserving peaks makes
 *               allocation infallible later: no preemption is needed.
 *   admission: local hit = the longest prefix B (a multiple of every group's
 *               tokens_per_block, B <= prompt - 1) that every group can serve
 *               from cached engine blocks: full groups every block before B,
 *               sliding groups the blocks holding the last `window` tokens
 *               before B, state groups the snapshot at B.  Then the offload
 *               hook's lookup may extend it to `hit`; the engine allocates the
 *               blocks the hit needs (same rule) and the hook loads them.
 *               `hit` may fall inside a block (docs/lookup.md): the load
 *               fills whole blocks, the last one only partly valid; only
 *               blocks ending at or before `hit` are registered, and
 *               prefill from `hit` overwrites that block's tail with
 *               identical values.  State groups need hit % tpb == 0.
 *   LOADING  -> poll until the load completes; a failed load releases the
 *               blocks it targeted and falls back to the local hit (the
 *               tokens are recomputed: never garbage).
 *   PREFILL  -> up to prefill_chunk prompt tokens per step; blocks are
 *               allocated as tokens reach them, sliding blocks released as
 *               they leave the window, each full block registered in the
 *               prefix cache and reported to the hook (store).
 *   DECODE   -> one token per step, greedy (argmax, lowest id on ties).
 *   DONE     -> finish hook, blocks released to the cache.
 *
 * Each step visits the running requests in admission order; a request's
 * tokens are always computed one at a time in position order, so outputs do
 * not depend on the batch or the step split (see transformer.c).
 */
#include <math.h>
#include <time.h>

#include "engine_internal.h"

#define NIL KVO_ENG_NULL_BLOCK

enum { ST_WAITING, ST_LOADING, ST_PREFILL, ST_DECODE, ST_DONE };

struct kvo_eng_req {
    kvo_eng *e;
    const kvo_eng_request *in;
    kvo_eng_result *res;
    int st;
    uint32_t *tokens;
    uint32_t n_tokens, cap, prompt;
    uint64_t *hlo, *hhi;            /* prefix hash after each token */
    kvo__eng_seq seq;
    uint32_t n_tab[KVO_ENG_MAX_GROUPS];
    uint32_t live_lo[KVO_ENG_MAX_GROUPS]; /* sliding: lowest index possibly held */
    uint64_t peak[KVO_ENG_MAX_GROUPS];
    uint32_t computed, span, local, hit, reported;
    uint32_t lookups;
    double t_arrive, t_admit;       /* the run's start (every request of a run
                                       arrives with the call), admission */
    float *logits;
};

static double kvo__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

kvo_eng_run_params kvo_eng_run_default_params(void) {
    kvo_eng_run_params p;
    memset(&p, 0, sizeof p);
    p.max_running = 4;
    p.prefill_chunk = 128;
    p.prefix_cache = true;
    return p;
}

uint64_t kvo_eng_req_id(const kvo_eng_req *r) { return r->in->id; }
const uint32_t *kvo_eng_req_tokens(const kvo_eng_req *r, uint32_t *n) {
    if (n) *n = r->n_tokens;
    return r->tokens;
}
uint32_t kvo_eng_req_prompt_len(const kvo_eng_req *r) { return r->prompt; }
uint32_t kvo_eng_req_computed(const kvo_eng_req *r) { return r->computed; }
kvo_eng_result *kvo_eng_req_result(kvo_eng_req *r) { return r->res; }
const uint64_t *kvo_eng_req_blocks(const kvo_eng_req *r, uint32_t g, uint32_t *n) {
    if (g >= r->e->cfg.n_groups) {
        if (n) *n = 0;
        return NULL;
    }
    uint32_t tpb = r->e->pools[g].tpb;
    if (n) *n = (r->span + tpb - 1) / tpb;
    return r->seq.tables[g];
}

/* ------------------------------------------------------------- helpers -- */

static void kvo__hash_token(kvo_eng_req *r, uint32_t t) {
    uint64_t plo = t ? r->hlo[t - 1] : 0x6b766f656e67696eULL, phi = t ? r->hhi[t - 1] : 0x7072656669786821ULL;
    uint64_t tok = r->tokens[t];
    r->hlo[t] = kvo__eng_mix64(plo * 0x100000001b3ULL + tok + 1);
    r->hhi[t] = kvo__eng_mix64(phi ^ (tok * 0xc2b2ae3d27d4eb4fULL + 0x165667b19e3779f9ULL));
}

static uint64_t kvo__gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* First block index group g needs to compute token `pos` onward. */
static uint32_t kvo__need_lo(const kvo__eng_pool *p, uint32_t pos) {
    if (p->kind == KVO_GROUP_FULL) return 0;
    if (p->kind == KVO_GROUP_STATE) return pos ? (pos - 1) / p->tpb : 0;
    uint32_t first = pos + 1 > p->window ? pos + 1 - p->window : 0; /* first position token pos attends to */
    return first / p->tpb;
}

/* Can group g serve a local hit of B tokens from cached blocks?  full_have:
 * contiguous cached blocks from 0 (full groups). */
static bool kvo__group_can(const kvo_eng_req *r, const kvo__eng_pool *p, uint32_t B, uint64_t full_have) {
    if (p->kind == KVO_GROUP_FULL) return B / p->tpb <= full_have;
    if (p->kind == KVO_GROUP_STATE)
        return B % p->tpb == 0 && kvo__eng_pool_find(p, r->hlo[B - 1], r->hhi[B - 1]) != NIL;
    for (uint32_t j = kvo__need_lo(p, B); j < B / p->tpb; j++) {
        uint32_t last = (j + 1) * p->tpb - 1;
        if (kvo__eng_pool_find(p, r->hlo[last], r->hhi[last]) == NIL) return false;
    }
    return true;
}

static uint32_t kvo__local_hit(const kvo_eng_req *r) {
    const kvo_eng *e = r->e;
    uint64_t lcm = 1;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
        uint64_t t = e->pools[g].tpb;
        lcm = lcm / kvo__gcd(lcm, t) * t;
        if (lcm >= r->prompt) return 0;
    }
    uint64_t full_have[KVO_ENG_MAX_GROUPS] = {0};
    uint32_t maxB = (uint32_t)(((r->prompt - 1) / lcm) * lcm);
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
        const kvo__eng_pool *p = &e->pools[g];
        if (p->kind != KVO_GROUP_FULL) continue;
        uint64_t n = 0;
        while (n < maxB / p->tpb) {
            uint32_t last = (uint32_t)((n + 1) * p->tpb - 1);
            if (kvo__eng_pool_find(p, r->hlo[last], r->hhi[last]) == NIL) break;
            n++;
        }
        full_have[g] = n;
        if (n * p->tpb < maxB) maxB = (uint32_t)(((n * p->tpb) / lcm) * lcm);
    }
    for (uint32_t B = maxB; B > 0; B -= (uint32_t)lcm) {
        bool ok = true;
        for (uint32_t g = 0; g < e->cfg.n_groups && ok; g++) ok = kvo__group_can(r, &e->pools[g], B, full_have[g]);
        if (ok) return B;
    }
    return 0;
}

/* Take the cached blocks of a local hit of B tokens into the tables. */
static void kvo__take_local(kvo_eng_req *r, uint32_t B) {
    kvo_eng *e = r->e;
    for (uint32_t g = 0; g < e->cfg.n_groups && B; g++) {
        kvo__eng_pool *p = &e->pools[g];
        for (uint32_t j = kvo__need_lo(p, B); j < B / p->tpb; j++) {
            uint32_t last = (j + 1) * p->tpb - 1;
            uint64_t b = kvo__eng_pool_find(p, r->hlo[last], r->hhi[last]);
            assert(b != NIL);
            kvo__eng_pool_take(p, b);
            r->seq.tables[g][j] = b;
        }
        r->live_lo[g] = kvo__need_lo(p, B);
    }
    r->span = B;
}

static void kvo__release_entry(kvo_eng_req *r, uint32_t g, uint32_t j, const kvo_eng_offload *off) {
    uint64_t b = r->seq.tables[g][j];
    if (b == NIL) return;
    if (off && off->computed && r->computed > r->reported) {
        (void)off->computed(off->ctx, r, r->computed);
        r->reported = r->computed;
    }
    if (off && off->release) (void)off->release(off->ctx, r, g, j);
    kvo__eng_pool_release(&r->e->pools[g], b);
    r->seq.tables[g][j] = NIL;
}

static int kvo__ensure_block(kvo_eng_req *r, uint32_t g, uint32_t j) {
    if (r->seq.tables[g][j] != NIL) return 0;
    return kvo__eng_pool_alloc(&r->e->pools[g], &r->seq.tables[g][j]);
}

/* Running state from the snapshots at `pos` (zeros at 0). */
static void kvo__restore_state(kvo_eng_req *r, uint32_t pos) {
    kvo_eng *e = r->e;
    const uint32_t D = e->cfg.d_model;
    uint32_t slot = 0;
    for (uint32_t li = 0; li < e->n_layers; li++) {
        const kvo__eng_layer *L = &e->layers[li];
        if (L->kind != KVO_GROUP_STATE) continue;
        float *st = r->seq.state + (size_t)slot++ * D;
        const kvo__eng_pool *p = &e->pools[L->group];
        if (!pos) {
            memset(st, 0, D * sizeof(float));
            continue;
        }
        assert(pos % p->tpb == 0);
        uint64_t b = r->seq.tables[L->group][pos / p->tpb - 1];
        assert(b != NIL);
        memcpy(st, kvo__eng_page(p, L->in_group, b), D * sizeof(float));
    }
}

/* Register the full blocks among tokens [from, to) in the prefix cache. */
static void kvo__register(kvo_eng_req *r, uint32_t from, uint32_t to) {
    kvo_eng *e = r->e;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
        kvo__eng_pool *p = &e->pools[g];
        for (uint32_t j = from / p->tpb; (j + 1) * p->tpb <= to; j++) {
            uint64_t b = r->seq.tables[g][j];
            uint32_t last = (j + 1) * p->tpb - 1;
            if (b != NIL && last >= from) kvo__eng_pool_set_hash(p, b, r->hlo[last], r->hhi[last]);
        }
    }
}

static uint32_t kvo__argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static uint64_t kvo__hash_logits(uint64_t h, const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], 4);
        h = kvo__eng_mix64(h ^ (bits + ((uint64_t)i << 32)));
    }
    return h;
}

/* ---------------------------------------------------------------- steps -- */

/* Release group g's sliding blocks that token t no longer needs, once their
 * aligned span (release_align) is computed. */
static void kvo__slide(kvo_eng_req *r, uint32_t g, uint32_t t, const kvo_eng_offload *off) {
    const kvo__eng_pool *p = &r->e->pools[g];
    uint32_t align = r->e->release_align, lo = kvo__need_lo(p, t);
    while (r->live_lo[g] < lo) {
        uint64_t first = (uint64_t)r->live_lo[g] * p->tpb;
        uint64_t span_end = align ? (first / align + 1) * align : first + p->tpb;
        if (span_end > r->computed) break;
        kvo__release_entry(r, g, r->live_lo[g], off);
        r->live_lo[g]++;
    }
}

/* Forward tokens [computed, end) of r. */
static int kvo__compute(kvo_eng_req *r, uint32_t end, const kvo_eng_offload *off) {
    kvo_eng *e = r->e;
    uint32_t from = r->computed;
    for (uint32_t t = from; t < end; t++) {
        for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
            kvo__eng_pool *p = &e->pools[g];
            if (p->kind == KVO_GROUP_SLIDING) kvo__slide(r, g, t, off);
            int rc = kvo__ensure_block(r, g, t / p->tpb);
            if (rc) return rc;
        }
        if (r->span < t + 1) r->span = t + 1;
        bool want = t + 1 == r->n_tokens; /* the last known token gives the next */
        kvo__eng_forward(e, &r->seq, r->tokens[t], t, want ? r->logits : NULL);
        r->computed = t + 1;
        for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
            kvo__eng_pool *p = &e->pools[g];
            if ((t + 1) % p->tpb == 0) kvo__eng_pool_set_hash(p, r->seq.tables[g][t / p->tpb], r->hlo[t], r->hhi[t]);
        }
    }
    if (off && off->computed && r->computed > r->reported) {
        (void)off->computed(off->ctx, r, r->computed);
        r->reported = r->computed;
    }
    return 0;
}

static void kvo__emit(kvo_eng_req *r) {
    kvo_eng_result *res = r->res;
    uint32_t V = r->e->cfg.vocab;
    res->logits_hash = kvo__hash_logits(res->logits_hash, r->logits, V);
    uint32_t tok = kvo__argmax(r->logits, V);
    res->tokens[res->n_gen++] = tok;
    if (res->n_gen == 1) res->ttft_s = kvo__now() - r->t_arrive;
    if (r->n_tokens < r->cap) {
        r->tokens[r->n_tokens] = tok;
        kvo__hash_token(r, r->n_tokens);
        r->n_tokens++;
    }
    if (res->n_gen == r->in->max_new) {
        memcpy(res->final_logits, r->logits, V * sizeof(float));
        res->e2e_s = kvo__now() - r->t_arrive;
        r->st = ST_DONE;
    }
}

static void kvo__finish_load(kvo_eng_req *r, uint32_t valid) {
    kvo_eng *e = r->e;
    bool ok = valid >= r->hit;
    for (uint32_t g = 0; g < e->cfg.n_groups && ok; g++)
        if (e->pools[g].kind == KVO_GROUP_STATE && r->hit % e->pools[g].tpb) ok = false;
    if (ok) {
        r->computed = r->hit;
        r->reported = r->hit;
        kvo__register(r, r->local, r->hit);
        r->res->tokens_loaded = r->hit - r->local;
    } else {
        /* drop every block; recompute from whatever the engine cache still
         * holds (the local hit may have shrunk meanwhile) */
        r->res->load_failures++;
        for (uint32_t g = 0; g < e->cfg.n_groups; g++)
            for (uint32_t j = 0; j < r->n_tab[g]; j++) kvo__release_entry(r, g, j, NULL);
        r->span = 0;
        r->local = e->run_prefix_cache ? kvo__local_hit(r) : 0;
        kvo__take_local(r, r->local);
        r->res->tokens_local = r->local;
        r->computed = r->local;
        r->reported = r->local;
        r->hit = r->local;
    }
    kvo__restore_state(r, r->computed);
    r->st = ST_PREFILL;
}

/* Allocate the blocks a hit of [local, hit) fills: full groups every block,
 * sliding groups those holding tokens [hit - window, hit) (one token more
 * than token `hit` attends to: the connector's rule), state groups the
 * snapshot block ending at hit. */
static int kvo__alloc_hit(kvo_eng_req *r) {
    kvo_eng *e = r->e;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
        kvo__eng_pool *p = &e->pools[g];
        uint32_t lo = 0, n = (r->hit + p->tpb - 1) / p->tpb;
        if (p->kind == KVO_GROUP_STATE) {
            n = r->hit / p->tpb;
            lo = n ? n - 1 : 0;
        } else if (p->kind == KVO_GROUP_SLIDING) {
            lo = r->hit > p->window ? (r->hit - p->window) / p->tpb : 0;
            /* local blocks below the loaded range are no longer needed */
            for (; r->live_lo[g] < lo; r->live_lo[g]++) kvo__release_entry(r, g, r->live_lo[g], NULL);
        }
        if (p->kind != KVO_GROUP_STATE && lo < r->local / p->tpb) lo = r->local / p->tpb;
        for (uint32_t j = lo; j < n; j++) {
            int rc = kvo__ensure_block(r, g, j);
            if (rc) return rc;
        }
    }
    r->span = r->hit;
    return 0;
}

static uint64_t kvo__peak(const kvo__eng_pool *p, uint64_t T, uint32_t align) {
    uint64_t all = (T + p->tpb - 1) / p->tpb;
    if (p->kind != KVO_GROUP_SLIDING) return all;
    uint64_t w = (p->window + p->tpb - 1) / p->tpb + 1 + (align + p->tpb - 1) / p->tpb;
    return w < all ? w : all;
}

static void kvo__req_free(kvo_eng_req *r) {
    free(r->tokens);
    free(r->hlo);
    free(r->hhi);
    free(r->seq.state);
    free(r->logits);
    for (uint32_t g = 0; g < KVO_ENG_MAX_GROUPS; g++) free(r->seq.tables[g]);
}

static int kvo__req_init(kvo_eng *e, kvo_eng_req *r, const kvo_eng_request *in, kvo_eng_result *res) {
    memset(r, 0, sizeof *r);
    r->e = e;
    r->in = in;
    r->res = res;
    r->prompt = in->prompt_len;
    r->cap = in->prompt_len + in->max_new;
    r->tokens = malloc(r->cap * sizeof *r->tokens);
    r->hlo = malloc(r->cap * sizeof *r->hlo);
    r->hhi = malloc(r->cap * sizeof *r->hhi);
    r->seq.state = calloc((size_t)(e->state_layers_max ? e->state_layers_max : 1) * e->cfg.d_model, sizeof(float));
    r->logits = malloc(e->cfg.vocab * sizeof(float));
    res->tokens = calloc(in->max_new, sizeof *res->tokens);
    res->final_logits = calloc(e->cfg.vocab, sizeof(float));
    bool ok = r->tokens && r->hlo && r->hhi && r->seq.state && r->logits && res->tokens && res->final_logits;
    for (uint32_t g = 0; g < e->cfg.n_groups && ok; g++) {
        const kvo__eng_pool *p = &e->pools[g];
        r->n_tab[g] = (r->cap + p->tpb - 1) / p->tpb;
        r->seq.tables[g] = malloc(r->n_tab[g] * sizeof(uint64_t));
        if (!r->seq.tables[g]) ok = false;
        else
            for (uint32_t j = 0; j < r->n_tab[g]; j++) r->seq.tables[g][j] = NIL;
        r->peak[g] = kvo__peak(p, (uint64_t)r->cap - 1, e->release_align);
    }
    if (!ok) return kvo__eng_error(KVO_ENOMEM, "engine: out of memory for request %llu", (unsigned long long)in->id);
    memcpy(r->tokens, in->prompt, in->prompt_len * sizeof(uint32_t));
    r->n_tokens = in->prompt_len;
    for (uint32_t t = 0; t < r->n_tokens; t++) kvo__hash_token(r, t);
    res->id = in->id;
    res->prompt_len = in->prompt_len;
    return 0;
}

static void kvo__req_end(kvo_eng_req *r, const kvo_eng_offload *off) {
    kvo_eng *e = r->e;
    if (off && off->finish) (void)off->finish(off->ctx, r);
    for (uint32_t g = 0; g < e->cfg.n_groups; g++)
        for (uint32_t j = 0; j < r->n_tab[g]; j++)
            if (r->seq.tables[g][j] != NIL) {
                kvo__eng_pool_release(&e->pools[g], r->seq.tables[g][j]);
                r->seq.tables[g][j] = NIL;
            }
}

/* ------------------------------------------------------------------ run -- */

int kvo_eng_run(kvo_eng *e, const kvo_eng_request *reqs, size_t n, const kvo_eng_run_params *prm,
                kvo_eng_result *results) {
    if (!e || (!reqs && n) || (!results && n)) return kvo__eng_error(KVO_EINVAL, "kvo_eng_run: NULL argument");
    kvo_eng_run_params p = prm ? *prm : kvo_eng_run_default_params();
    if (!p.max_running) p.max_running = 1;
    if (!p.prefill_chunk) p.prefill_chunk = 128;
    const kvo_eng_offload *off = p.offload && p.offload->lookup ? p.offload : NULL;
    const uint32_t G = e->cfg.n_groups;
    e->run_prefix_cache = p.prefix_cache;
    e->release_align = p.release_align;
    memset(results, 0, n * sizeof *results);
    for (size_t i = 0; i < n; i++) {
        const kvo_eng_request *q = &reqs[i];
        if (!q->prompt || !q->prompt_len || !q->max_new)
            return kvo__eng_error(KVO_EINVAL, "request %zu (id %llu): needs a prompt and max_new >= 1", i,
                                  (unsigned long long)q->id);
        if ((uint64_t)q->prompt_len + q->max_new > e->cfg.max_seq)
            return kvo__eng_error(KVO_EINVAL, "request %zu (id %llu): %u + %u tokens exceed max_seq %u", i,
                                  (unsigned long long)q->id, q->prompt_len, q->max_new, e->cfg.max_seq);
        for (uint32_t t = 0; t < q->prompt_len; t++)
            if (q->prompt[t] >= e->cfg.vocab)
                return kvo__eng_error(KVO_EINVAL, "request %zu (id %llu): token %u at %u >= vocab %u", i,
                                      (unsigned long long)q->id, q->prompt[t], t, e->cfg.vocab);
        for (uint32_t g = 0; g < G; g++) {
            uint64_t need = kvo__peak(&e->pools[g], (uint64_t)q->prompt_len + q->max_new - 1, p.release_align);
            if (need > e->pools[g].num_blocks)
                return kvo__eng_error(KVO_ENOSPC,
                                      "request %zu (id %llu): group '%s' needs %llu blocks of %u tokens, the engine "
                                      "has %llu: raise the budget to >= %llu tokens",
                                      i, (unsigned long long)q->id, e->cfg.groups[g].name, (unsigned long long)need,
                                      e->pools[g].tpb, (unsigned long long)e->pools[g].num_blocks,
                                      (unsigned long long)(need * e->pools[g].tpb));
        }
    }
    kvo_eng_req *rs = calloc(n ? n : 1, sizeof *rs);
    size_t *running = calloc(p.max_running, sizeof *running);
    if (!rs || !running) {
        free(rs);
        free(running);
        return kvo__eng_error(KVO_ENOMEM, "engine: out of memory for %zu requests", n);
    }
    uint64_t reserved[KVO_ENG_MAX_GROUPS] = {0};
    size_t next = 0, n_run = 0, done = 0, finished_since_evict = 0;
    int rc = 0;
    bool inited_next = false;
    double t_arrive = kvo__now(); /* every request arrives with this call */
    while (done < n && !rc) {
        e->stats.steps++;
        if (off && off->progress) off->progress(off->ctx);
        /* admit */
        while (next < n && n_run < p.max_running) {
            kvo_eng_req *r = &rs[next];
            if (!inited_next) {
                rc = kvo__req_init(e, r, &reqs[next], &results[next]);
                if (rc) break;
                inited_next = true;
            }
            bool fits = true;
            for (uint32_t g = 0; g < G; g++)
                if (reserved[g] + r->peak[g] > e->pools[g].num_blocks) fits = false;
            if (!fits) break;
            uint32_t local = p.prefix_cache ? kvo__local_hit(r) : 0, hit = local;
            if (off) {
                int lrc = off->lookup(off->ctx, r, local, &hit);
                if (lrc == KVO_EAGAIN && (n_run > 0 || ++r->lookups < 100000)) break;
                if (lrc || hit < local || hit >= r->prompt) hit = local;
            }
            r->t_arrive = t_arrive;
            r->t_admit = kvo__now();
            r->res->queue_s = r->t_admit - t_arrive;
            kvo__take_local(r, local);
            r->local = local;
            r->hit = hit;
            r->reported = local;
            r->res->tokens_local = local;
            for (uint32_t g = 0; g < G; g++) reserved[g] += r->peak[g];
            running[n_run++] = next;
            next++;
            inited_next = false;
            if (hit > local) {
                rc = kvo__alloc_hit(r);
                if (rc) break;
                int lrc = off->load ? off->load(off->ctx, r, local, hit) : KVO_ENOTSUP;
                if (lrc) kvo__finish_load(r, local);
                else r->st = ST_LOADING;
            } else {
                r->computed = local;
                kvo__restore_state(r, local);
                r->st = ST_PREFILL;
            }
        }
        if (rc) break;
        /* one unit of work per running request */
        for (size_t i = 0; i < n_run && !rc; i++) {
            kvo_eng_req *r = &rs[running[i]];
            if (r->st == ST_LOADING) {
                uint32_t valid = 0;
                int prc = off->poll_load ? off->poll_load(off->ctx, r, &valid) : 1;
                if (prc < 0) kvo__finish_load(r, 0);
                else if (prc > 0) kvo__finish_load(r, valid);
            } else if (r->st == ST_PREFILL) {
                uint32_t end = r->computed + p.prefill_chunk;
                if (end > r->prompt) end = r->prompt;
                rc = kvo__compute(r, end, off);
                if (!rc && r->computed == r->prompt) {
                    r->res->tokens_computed = r->prompt - r->res->tokens_local - r->res->tokens_loaded;
                    kvo__emit(r);
                    if (r->st != ST_DONE) r->st = ST_DECODE;
                }
            } else if (r->st == ST_DECODE) {
                rc = kvo__compute(r, r->n_tokens, off);
                if (!rc) kvo__emit(r);
            }
        }
        /* retire */
        for (size_t i = 0; i < n_run;) {
            kvo_eng_req *r = &rs[running[i]];
            if (r->st != ST_DONE) {
                i++;
                continue;
            }
            kvo__req_end(r, off);
            for (uint32_t g = 0; g < G; g++) reserved[g] -= r->peak[g];
            kvo__req_free(r);
            for (size_t k = i; k + 1 < n_run; k++) running[k] = running[k + 1]; /* keep admission order */
            n_run--;
            done++;
            if (p.on_done) p.on_done(p.on_done_ctx, done, n);
            if (p.evict_every && ++finished_since_evict >= p.evict_every) {
                kvo_eng_evict_cached(e);
                finished_since_evict = 0;
            }
        }
    }
    if (rc) {
        for (size_t i = 0; i < n_run; i++) {
            kvo__req_end(&rs[running[i]], off);
            kvo__req_free(&rs[running[i]]);
        }
        if (inited_next) kvo__req_free(&rs[next]);
        kvo_eng_results_free(results, n);
    }
    free(rs);
    free(running);
    return rc;
}

void kvo_eng_results_free(kvo_eng_result *results, size_t n) {
    if (!results) return;
    for (size_t i = 0; i < n; i++) {
        free(results[i].tokens);
        free(results[i].final_logits);
        results[i].tokens = NULL;
        results[i].final_logits = NULL;
    }
}

size_t kvo_eng_results_compare(const kvo_eng_result *a, const kvo_eng_result *b, size_t n, uint32_t vocab,
                               char *why, size_t why_len) {
    char tmp[256];
    if (!why) {
        why = tmp;
        why_len = sizeof tmp;
    }
    if (why_len) why[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].n_gen != b[i].n_gen) {
            snprintf(why, why_len, "request %zu (id %llu): %u vs %u tokens generated", i, (unsigned long long)a[i].id,
                     a[i].n_gen, b[i].n_gen);
            return i + 1;
        }
        for (uint32_t t = 0; t < a[i].n_gen; t++)
            if (a[i].tokens[t] != b[i].tokens[t]) {
                snprintf(why, why_len, "request %zu (id %llu): token %u differs: %u vs %u", i,
                         (unsigned long long)a[i].id, t, a[i].tokens[t], b[i].tokens[t]);
                return i + 1;
            }
        if (a[i].logits_hash != b[i].logits_hash || memcmp(a[i].final_logits, b[i].final_logits, vocab * sizeof(float))) {
            snprintf(why, why_len, "request %zu (id %llu): logits differ (hash %016llx vs %016llx)", i,
                     (unsigned long long)a[i].id, (unsigned long long)a[i].logits_hash,
                     (unsigned long long)b[i].logits_hash);
            return i + 1;
        }
    }
    return 0;
}
