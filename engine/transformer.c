/*
 * The reference model: shapes, weights and the forward pass of one token.
 *
 * Architecture (pre-norm decoder, d = d_model, h = n_heads):
 *   x = emb[token]
 *   per layer:  x += mixer(rmsnorm(x));  x += W2 relu(W1 rmsnorm(x))
 *   logits = lm_head . rmsnorm(x)
 * Mixers: attention with RoPE over all earlier positions (full) or the last
 * `window` positions (sliding), K and V read from paged blocks; or a gated
 * linear recurrence  a = sigmoid(Wa x + ba), h = a*h + (1-a)*(Wu x),
 * y = Wo (h * silu(Wg x))  whose state h (d floats per layer) is written to
 * the group's block at every block boundary.
 *
 * Layers are interleaved round-robin over the groups (group 0's first layer,
 * group 1's first layer, ...), as hybrid models interleave kinds.
 *
 * Why this is exact under offloading: a token's output is a pure function of
 * its token id, its position, and the bytes of the K/V pages of the positions
 * it attends to (or of the state snapshot it resumes from).  Every reduction
 * runs in a fixed sequential order in one thread; nothing depends on which
 * other requests run, how the prompt is split into steps, or whether a page
 * was computed here or copied back from a tier.  Weights come from splitmix64
 * seeded by cfg.seed, so two engines with the same config are identical.
 */
#include <math.h>

#include "engine_internal.h"

uint64_t kvo__eng_splitmix(uint64_t *state) {
    *state += 0x9e3779b97f4a7c15ULL;
    return kvo__eng_mix64(*state);
}

/* ---------------------------------------------------------------- shapes -- */

static const char *const kvo__eng_shapes[] = {"single", "hybrid", "hybrid-state", "tiny-blocks", "coprime",
                                                "coprime-state"};

size_t kvo_eng_shape_count(void) { return sizeof kvo__eng_shapes / sizeof kvo__eng_shapes[0]; }
const char *kvo_eng_shape_name(size_t i) { return i < kvo_eng_shape_count() ? kvo__eng_shapes[i] : NULL; }

static void kvo__eng_group(kvo_eng_config *c, const char *name, kvo_group_kind kind, uint32_t tpb, uint32_t layers,
                           uint32_t window) {
    kvo_eng_group_cfg *g = &c->groups[c->n_groups++];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->kind = kind;
    g->tokens_per_block = tpb;
    g->layers = layers;
    g->window = window;
}

int kvo_eng_shape_config(const char *name, kvo_eng_config *out) {
    kvo_eng_config c;
    memset(&c, 0, sizeof c);
    c.vocab = 512;
    c.d_model = 64;
    c.n_heads = 4;
    c.d_ff = 128;
    c.tokens_per_hash = 16;
    c.max_seq = 4096;
    c.seed = 1234;
    c.budget_tokens = 4096;
    if (!name) name = "hybrid-state";
    if (!strcmp(name, "single")) {
        kvo__eng_group(&c, "full", KVO_GROUP_FULL, 16, 3, 0);
    } else if (!strcmp(name, "hybrid")) {
        kvo__eng_group(&c, "full", KVO_GROUP_FULL, 16, 1, 0);
        kvo__eng_group(&c, "swa", KVO_GROUP_SLIDING, 32, 2, 96);
    } else if (!strcmp(name, "hybrid-state")) {
        kvo__eng_group(&c, "full", KVO_GROUP_FULL, 16, 1, 0);
        kvo__eng_group(&c, "swa", KVO_GROUP_SLIDING, 32, 1, 96);
        kvo__eng_group(&c, "state", KVO_GROUP_STATE, 64, 2, 0);
    } else if (!strcmp(name, "tiny-blocks")) {
        kvo__eng_group(&c, "full", KVO_GROUP_FULL, 16, 1, 0);
        kvo__eng_group(&c, "idx", KVO_GROUP_FULL, 4, 1, 0);
        kvo__eng_group(&c, "swa", KVO_GROUP_SLIDING, 8, 1, 40);
    } else if (!strcmp(name, "coprime")) {
        /* block sizes whose lcm (240) is far above any one of them: hits
         * fall inside blocks of every group (docs/lookup.md) */
        c.tokens_per_hash = 4;
        kvo__eng_group(&c, "full12", KVO_GROUP_FULL, 12, 1, 0);
        kvo__eng_group(&c, "full16", KVO_GROUP_FULL, 16, 1, 0);
        kvo__eng_group(&c, "swa20", KVO_GROUP_SLIDING, 20, 1, 50);
    } else if (!strcmp(name, "coprime-state")) {
        c.tokens_per_hash = 4;
        kvo__eng_group(&c, "full12", KVO_GROUP_FULL, 12, 1, 0);
        kvo__eng_group(&c, "swa20", KVO_GROUP_SLIDING, 20, 1, 50);
        kvo__eng_group(&c, "state16", KVO_GROUP_STATE, 16, 1, 0);
    } else {
        char list[128] = "";
        for (size_t i = 0; i < kvo_eng_shape_count(); i++) {
            strcat(list, i ? ", " : "");
            strcat(list, kvo__eng_shapes[i]);
        }
        return kvo__eng_error(KVO_ENOTFOUND, "unknown engine shape '%s' (shapes: %s)", name, list);
    }
    snprintf(c.shape, sizeof c.shape, "%s", name);
    *out = c;
    return 0;
}

/* --------------------------------------------------------------- create -- */

static int kvo__eng_check(const kvo_eng_config *c) {
    if (c->vocab < 2 || c->vocab > (1u << 20)) return kvo__eng_error(KVO_EINVAL, "engine: vocab %u not in 2..2^20", c->vocab);
    if (!c->n_heads || !c->d_model || c->d_model % c->n_heads || (c->d_model / c->n_heads) % 2)
        return kvo__eng_error(KVO_EINVAL, "engine: d_model %u must be a multiple of n_heads %u with an even head dim",
                              c->d_model, c->n_heads);
    if (c->d_model > 4096 || !c->d_ff || c->d_ff > 16384)
        return kvo__eng_error(KVO_EINVAL, "engine: d_model %u / d_ff %u out of range", c->d_model, c->d_ff);
    if (!c->tokens_per_hash) return kvo__eng_error(KVO_EINVAL, "engine: tokens_per_hash must be >= 1");
    if (c->max_seq < 2 || c->max_seq > (1u << 24))
        return kvo__eng_error(KVO_EINVAL, "engine: max_seq %u not in 2..2^24", c->max_seq);
    if (!c->n_groups || c->n_groups > KVO_ENG_MAX_GROUPS)
        return kvo__eng_error(KVO_EINVAL, "engine: %u groups, need 1..%d", c->n_groups, KVO_ENG_MAX_GROUPS);
    for (uint32_t g = 0; g < c->n_groups; g++) {
        const kvo_eng_group_cfg *gc = &c->groups[g];
        if (!gc->tokens_per_block || gc->tokens_per_block > 65536 || !gc->layers || gc->layers > 256)
            return kvo__eng_error(KVO_EINVAL, "engine group '%s': tokens_per_block %u (1..65536) / layers %u (1..256)",
                                  gc->name, gc->tokens_per_block, gc->layers);
        if (gc->kind == KVO_GROUP_SLIDING && !gc->window)
            return kvo__eng_error(KVO_EINVAL, "engine group '%s': a sliding group needs window >= 1", gc->name);
        if (c->budget_tokens / gc->tokens_per_block < 1)
            return kvo__eng_error(KVO_EINVAL, "engine group '%s': budget %llu tokens is less than one block of %u",
                                  gc->name, (unsigned long long)c->budget_tokens, gc->tokens_per_block);
    }
    return 0;
}

static uint64_t kvo__eng_page_bytes(const kvo_eng_config *c, const kvo_eng_group_cfg *g) {
    if (g->kind == KVO_GROUP_STATE) return (uint64_t)c->d_model * sizeof(float);
    return 2ull * g->tokens_per_block * c->d_model * sizeof(float);
}

static void kvo__eng_fill(float *w, size_t n, float scale, float bias, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) {
        /* uniform in [-1, 1) from 24 random bits */
        float u = (float)(kvo__eng_splitmix(rng) >> 40) / 8388608.0f - 1.0f;
        w[i] = bias + scale * u;
    }
}

int kvo_eng_create(const kvo_eng_config *cfg, kvo_eng **out) {
    if (!cfg || !out) return kvo__eng_error(KVO_EINVAL, "kvo_eng_create: NULL argument");
    int rc = kvo__eng_check(cfg);
    if (rc) return rc;
    kvo_eng *e = calloc(1, sizeof *e);
    if (!e) return kvo__eng_error(KVO_ENOMEM, "engine: out of memory");
    e->cfg = *cfg;
    const uint32_t D = cfg->d_model, F = cfg->d_ff, V = cfg->vocab;
    e->head_dim = D / cfg->n_heads;
    for (uint32_t g = 0; g < cfg->n_groups; g++) e->n_layers += cfg->groups[g].layers;
    e->layers = calloc(e->n_layers, sizeof *e->layers);
    /* weight count */
    uint64_t n = 2ull * V * D + D;
    for (uint32_t g = 0; g < cfg->n_groups; g++) {
        uint64_t per = 2ull * D + 2ull * F * D + 4ull * D * D;
        if (cfg->groups[g].kind == KVO_GROUP_STATE) per += D;
        n += per * cfg->groups[g].layers;
    }
    e->n_params = n;
    e->weights = malloc(n * sizeof(float));
    uint32_t half = e->head_dim / 2;
    e->rope_cos = malloc((size_t)cfg->max_seq * half * sizeof(float));
    e->rope_sin = malloc((size_t)cfg->max_seq * half * sizeof(float));
    e->x = calloc(8ull * D + F + cfg->max_seq, sizeof(float));
    if (!e->layers || !e->weights || !e->rope_cos || !e->rope_sin || !e->x) {
        kvo_eng_destroy(e);
        return kvo__eng_error(KVO_ENOMEM, "engine: out of memory for %llu weights", (unsigned long long)n);
    }
    e->xn = e->x + D;
    e->q = e->xn + D;
    e->k = e->q + D;
    e->v = e->k + D;
    e->o = e->v + D;
    e->h = e->o + D;
    e->tmp = e->h + D;
    e->att = e->tmp + D + F;

    uint64_t rng = cfg->seed ^ 0x6b766f2d656e67ULL;
    float *w = e->weights;
    const float sd = 1.0f / sqrtf((float)D), sf = 1.0f / sqrtf((float)F);
#define TAKE(ptr, cnt, scale, bias) do { ptr = w; kvo__eng_fill(w, (cnt), (scale), (bias), &rng); w += (cnt); } while (0)
    TAKE(e->emb, (size_t)V * D, 1.0f, 0.0f);
    TAKE(e->lm_head, (size_t)V * D, sd * 1.7f, 0.0f);
    TAKE(e->final_norm, D, 0.1f, 1.0f);
    /* round-robin interleave of the groups' layers */
    uint32_t left[KVO_ENG_MAX_GROUPS], done[KVO_ENG_MAX_GROUPS] = {0}, li = 0, state_slot = 0;
    for (uint32_t g = 0; g < cfg->n_groups; g++) left[g] = cfg->groups[g].layers;
    while (li < e->n_layers) {
        for (uint32_t g = 0; g < cfg->n_groups; g++) {
            if (!left[g]) continue;
            kvo__eng_layer *L = &e->layers[li++];
            L->group = g;
            L->in_group = done[g]++;
            left[g]--;
            L->kind = cfg->groups[g].kind;
            TAKE(L->norm1, D, 0.1f, 1.0f);
            TAKE(L->norm2, D, 0.1f, 1.0f);
            if (L->kind == KVO_GROUP_STATE) {
                TAKE(L->wa, (size_t)D * D, sd * 1.7f, 0.0f);
                TAKE(L->ba, D, 1.0f, 1.0f);
                TAKE(L->wu, (size_t)D * D, sd * 1.7f, 0.0f);
                TAKE(L->wg, (size_t)D * D, sd * 1.7f, 0.0f);
                state_slot++;
            } else {
                TAKE(L->wq, (size_t)D * D, sd * 1.7f, 0.0f);
                TAKE(L->wk, (size_t)D * D, sd * 1.7f, 0.0f);
                TAKE(L->wv, (size_t)D * D, sd * 1.7f, 0.0f);
            }
            TAKE(L->wo, (size_t)D * D, sd * 0.8f, 0.0f);
            TAKE(L->w1, (size_t)F * D, sd * 1.7f, 0.0f);
            TAKE(L->w2, (size_t)D * F, sf * 0.8f, 0.0f);
        }
    }
#undef TAKE
    e->state_layers_max = state_slot;
    for (uint32_t p = 0; p < cfg->max_seq; p++)
        for (uint32_t i = 0; i < half; i++) {
            double freq = pow(10000.0, -(double)(2 * i) / (double)e->head_dim);
            e->rope_cos[(size_t)p * half + i] = (float)cos(p * freq);
            e->rope_sin[(size_t)p * half + i] = (float)sin(p * freq);
        }

    /* pools, model description, segments */
    char mname[64];
    snprintf(mname, sizeof mname, "kvo-engine-%s", cfg->shape[0] ? cfg->shape : "custom");
    rc = kvo_model_create(mname, cfg->tokens_per_hash, &e->model);
    if (rc) {
        kvo_eng_destroy(e);
        return kvo__eng_lib_error(rc, "engine model");
    }
    size_t nseg = 0;
    for (uint32_t g = 0; g < cfg->n_groups; g++) nseg += cfg->groups[g].layers;
    e->segs = calloc(nseg, sizeof *e->segs);
    if (!e->segs) {
        kvo_eng_destroy(e);
        return kvo__eng_error(KVO_ENOMEM, "engine: out of memory");
    }
    for (uint32_t g = 0; g < cfg->n_groups; g++) {
        const kvo_eng_group_cfg *gc = &cfg->groups[g];
        uint64_t pb = kvo__eng_page_bytes(cfg, gc);
        uint64_t nb = cfg->budget_tokens / gc->tokens_per_block;
        rc = kvo__eng_pool_init(&e->pools[g], g, gc, pb, nb);
        if (rc) {
            kvo_eng_destroy(e);
            return rc;
        }
        kvo_group_desc d = kvo_group_desc_default();
        snprintf(d.name, sizeof d.name, "%s", gc->name);
        d.kind = gc->kind;
        d.tokens_per_block = gc->tokens_per_block;
        d.layers = gc->layers;
        d.page_bytes = pb;
        d.window = gc->kind == KVO_GROUP_SLIDING ? gc->window : 0;
        rc = kvo_model_add_group(e->model, &d);
        if (rc) {
            kvo_eng_destroy(e);
            return kvo__eng_lib_error(rc, "engine model group");
        }
        for (uint32_t l = 0; l < gc->layers; l++) {
            kvo_segment *s = &e->segs[e->n_segs++];
            s->group = g;
            s->base = kvo__eng_page(&e->pools[g], l, 0);
            s->num_blocks = nb;
            s->block_stride = pb;
            s->page_bytes = pb;
        }
    }
    *out = e;
    return 0;
}

void kvo_eng_destroy(kvo_eng *e) {
    if (!e) return;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) kvo__eng_pool_free(&e->pools[g]);
    kvo_model_destroy(e->model);
    free(e->segs);
    free(e->layers);
    free(e->weights);
    free(e->rope_cos);
    free(e->rope_sin);
    free(e->x);
    free(e);
}

const kvo_eng_config *kvo_eng_get_config(const kvo_eng *e) { return &e->cfg; }
const kvo_model *kvo_eng_model(const kvo_eng *e) { return e->model; }
const kvo_segment *kvo_eng_segments(const kvo_eng *e, size_t *n) {
    *n = e->n_segs;
    return e->segs;
}
uint64_t kvo_eng_num_blocks(const kvo_eng *e, uint32_t g) { return g < e->cfg.n_groups ? e->pools[g].num_blocks : 0; }
uint64_t kvo_eng_param_count(const kvo_eng *e) { return e->n_params; }

uint64_t kvo_eng_kv_bytes(const kvo_eng *e, uint64_t n_tokens) {
    uint64_t b = 0;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) {
        const kvo__eng_pool *p = &e->pools[g];
        b += (n_tokens / p->tpb) * p->layers * p->page_bytes;
    }
    return b;
}

void kvo_eng_evict_cached(kvo_eng *e) {
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) kvo__eng_pool_drop_cached(&e->pools[g]);
    e->stats.forced_evictions++;
}

void kvo_eng_get_stats(const kvo_eng *e, kvo_eng_stats *out) {
    *out = e->stats;
    out->block_evictions = 0;
    for (uint32_t g = 0; g < e->cfg.n_groups; g++) out->block_evictions += e->pools[g].evictions;
}

uint32_t kvo__eng_state_slot(const kvo_eng *e, uint32_t layer) {
    uint32_t s = 0;
    for (uint32_t i = 0; i < layer; i++) s += e->layers[i].kind == KVO_GROUP_STATE;
    return s;
}

/* --------------------------------------------------------------- kernels -- */

/* out[i] = sum_j w[i*n + j] * x[j], j ascending. */
static void kvo__matvec(float *restrict out, const float *restrict w, const float *restrict x, uint32_t m, uint32_t n) {
    for (uint32_t i = 0; i < m; i++) {
        const float *row = w + (size_t)i * n;
        float s = 0.0f;
        for (uint32_t j = 0; j < n; j++) s += row[j] * x[j];
        out[i] = s;
    }
}

static void kvo__rmsnorm(float *out, const float *x, const float *g, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + 1e-5f);
    for (uint32_t i = 0; i < n; i++) out[i] = x[i] * r * g[i];
}

static void kvo__rope(float *v, const kvo_eng *e, uint32_t pos) {
    const uint32_t hd = e->head_dim, half = hd / 2;
    const float *c = e->rope_cos + (size_t)pos * half, *s = e->rope_sin + (size_t)pos * half;
    for (uint32_t h = 0; h < e->cfg.n_heads; h++) {
        float *p = v + h * hd;
        for (uint32_t i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            p[i] = a * c[i] - b * s[i];
            p[i + half] = a * s[i] + b * c[i];
        }
    }
}

static void kvo__attention(kvo_eng *e, const kvo__eng_layer *L, kvo__eng_seq *s, uint32_t t) {
    const kvo__eng_pool *p = &e->pools[L->group];
    const uint32_t D = e->cfg.d_model, hd = e->head_dim, tpb = p->tpb;
    const uint64_t *tab = s->tables[L->group];
    /* write this token's K and V */
    uint64_t blk = tab[t / tpb];
    assert(blk != KVO_ENG_NULL_BLOCK);
    float *page = kvo__eng_page(p, L->in_group, blk);
    memcpy(page + (size_t)(t % tpb) * D, e->k, D * sizeof(float));
    memcpy(page + (size_t)(tpb + t % tpb) * D, e->v, D * sizeof(float));
    uint32_t lo = 0;
    if (p->kind == KVO_GROUP_SLIDING && t + 1 > p->window) lo = t + 1 - p->window;
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = 0; h < e->cfg.n_heads; h++) {
        const float *q = e->q + h * hd;
        float mx = -INFINITY;
        for (uint32_t j = lo; j <= t; j++) {
            uint64_t b = tab[j / tpb];
            assert(b != KVO_ENG_NULL_BLOCK);
            const float *kr = kvo__eng_page(p, L->in_group, b) + (size_t)(j % tpb) * D + h * hd;
            float d = 0.0f;
            for (uint32_t i = 0; i < hd; i++) d += q[i] * kr[i];
            d *= scale;
            e->att[j - lo] = d;
            if (d > mx) mx = d;
        }
        float sum = 0.0f;
        for (uint32_t j = lo; j <= t; j++) {
            float w = expf(e->att[j - lo] - mx);
            e->att[j - lo] = w;
            sum += w;
        }
        float *o = e->o + h * hd;
        for (uint32_t i = 0; i < hd; i++) o[i] = 0.0f;
        for (uint32_t j = lo; j <= t; j++) {
            const float *vr = kvo__eng_page(p, L->in_group, tab[j / tpb]) + (size_t)(tpb + j % tpb) * D + h * hd;
            float w = e->att[j - lo] / sum;
            for (uint32_t i = 0; i < hd; i++) o[i] += w * vr[i];
        }
    }
}

void kvo__eng_forward(kvo_eng *e, kvo__eng_seq *s, uint32_t tok, uint32_t t, float *logits) {
    const uint32_t D = e->cfg.d_model, F = e->cfg.d_ff;
    float *x = e->x, *xn = e->xn;
    memcpy(x, e->emb + (size_t)tok * D, D * sizeof(float));
    uint32_t slot = 0;
    for (uint32_t li = 0; li < e->n_layers; li++) {
        const kvo__eng_layer *L = &e->layers[li];
        kvo__rmsnorm(xn, x, L->norm1, D);
        if (L->kind == KVO_GROUP_STATE) {
            const kvo__eng_pool *p = &e->pools[L->group];
            float *st = s->state + (size_t)slot * D;
            kvo__matvec(e->q, L->wa, xn, D, D);
            kvo__matvec(e->k, L->wu, xn, D, D);
            kvo__matvec(e->v, L->wg, xn, D, D);
            for (uint32_t i = 0; i < D; i++) {
                float a = 1.0f / (1.0f + expf(-(e->q[i] + L->ba[i])));
                st[i] = a * st[i] + (1.0f - a) * e->k[i];
                float gte = e->v[i] / (1.0f + expf(-e->v[i]));
                e->o[i] = st[i] * gte;
            }
            if ((t + 1) % p->tpb == 0) {
                uint64_t blk = s->tables[L->group][t / p->tpb];
                assert(blk != KVO_ENG_NULL_BLOCK);
                memcpy(kvo__eng_page(p, L->in_group, blk), st, D * sizeof(float));
            }
            slot++;
        } else {
            kvo__matvec(e->q, L->wq, xn, D, D);
            kvo__matvec(e->k, L->wk, xn, D, D);
            kvo__matvec(e->v, L->wv, xn, D, D);
            kvo__rope(e->q, e, t);
            kvo__rope(e->k, e, t);
            kvo__attention(e, L, s, t);
        }
        kvo__matvec(e->h, L->wo, e->o, D, D);
        for (uint32_t i = 0; i < D; i++) x[i] += e->h[i];
        kvo__rmsnorm(xn, x, L->norm2, D);
        kvo__matvec(e->tmp, L->w1, xn, F, D);
        for (uint32_t i = 0; i < F; i++) e->tmp[i] = e->tmp[i] > 0.0f ? e->tmp[i] : 0.0f;
        kvo__matvec(e->h, L->w2, e->tmp, D, F);
        for (uint32_t i = 0; i < D; i++) x[i] += e->h[i];
    }
    e->stats.tokens_forward++;
    if (logits) {
        kvo__rmsnorm(xn, x, e->final_norm, D);
        kvo__matvec(logits, e->lm_head, xn, e->cfg.vocab, D);
    }
}
