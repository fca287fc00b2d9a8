/*
 * A simulated engine for the connector tests: per-group paged KV memory in
 * host buffers, block allocators, per-request block tables, and byte
 * patterns in place of model math.  The bytes of (group, layer, block i) of a
 * sequence are a pseudo-random function of the sequence's tokens up to the
 * end of block i, so a block loaded for the wrong prefix, the wrong block or
 * a torn copy shows up as a mismatch.
 */
#ifndef KVO_CONNECTOR_SIM_H
#define KVO_CONNECTOR_SIM_H

#include <stdlib.h>
#include <time.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "kvo_test.h"

#define SIM_POISON 0xEE
#define SIM_MAXG 16

typedef struct sim_group {
    const char *name;
    kvo_group_kind kind;
    uint32_t tpb;
    uint32_t window;
    uint32_t bpc;   /* 0: automatic (smallest span); ignored when not cacheable */
    bool cacheable;
    bool draft;
} sim_group;

typedef struct sim {
    kvo_plan *plan;
    size_t ng;
    uint64_t step;
    kvo_connector *c;
    uint8_t *mem[SIM_MAXG];
    uint64_t nblocks;
    uint64_t page[SIM_MAXG];
    uint32_t layers[SIM_MAXG];
    uint64_t *freel[SIM_MAXG];
    size_t nfree[SIM_MAXG];
    bool keep_plan; /* sim_destroy leaves the plan to the caller */
} sim;

typedef struct sim_req {
    uint64_t id;
    uint32_t *tok;
    size_t n_tok, cap_tok;
    uint64_t *tab[SIM_MAXG];
    size_t tn[SIM_MAXG];
    uint64_t computed;
} sim_req;

static inline kvo_plan *sim_plan(const char *name, uint32_t tph, const sim_group *gs, size_t n) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create(name, tph, &m));
    kvo_group_override ov[SIM_MAXG];
    size_t nov = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_group_desc g = kvo_group_desc_default();
        snprintf(g.name, sizeof g.name, "%s", gs[i].name);
        g.kind = gs[i].kind;
        g.tokens_per_block = gs[i].tpb;
        g.layers = 1 + (uint32_t)(i % 2);
        g.page_bytes = 24 + 8 * (i % 3) + (i % 2); /* small, not multiples of 64 */
        g.window = gs[i].kind == KVO_GROUP_SLIDING ? gs[i].window : 0;
        g.cacheable = gs[i].cacheable;
        g.draft = gs[i].draft;
        ASSERT_OK(kvo_model_add_group(m, &g));
        if (gs[i].bpc && gs[i].cacheable) ov[nov++] = (kvo_group_override){gs[i].name, gs[i].bpc};
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.target_chunk_bytes = 1; /* smallest valid spans: many chunks in short prompts */
    pp.overrides = ov;
    pp.n_overrides = nov;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    return p;
}

/* A scaled-down copy of a preset: the same groups, kinds, flags and hash
 * unit; block sizes capped at 128 tokens, windows at 160, tiny pages. */
static inline kvo_plan *sim_preset_plan(const char *preset) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset(preset, &m));
    sim_group gs[SIM_MAXG];
    size_t n = kvo_model_num_groups(m);
    ASSERT_LE_U64(n, SIM_MAXG);
    for (size_t i = 0; i < n; i++) {
        const kvo_group_desc *d = kvo_model_group(m, i);
        gs[i].name = d->name;
        gs[i].kind = d->kind;
        gs[i].tpb = d->tokens_per_block > 128 ? 128 : d->tokens_per_block;
        gs[i].window = d->window > 160 ? 160 : d->window;
        gs[i].bpc = 0;
        gs[i].cacheable = d->cacheable;
        gs[i].draft = d->draft;
    }
    uint32_t tph = kvo_model_tokens_per_hash(m);
    kvo_plan *p = sim_plan(preset, tph, gs, n);
    kvo_model_destroy(m);
    return p;
}

/* Full + sliding (window 48), 16-token blocks, 2 and 1 blocks per chunk,
 * 16 tokens per hash (gpt-oss-like, scaled down): the plan of most targeted
 * connector tests.  name: the model's, which the keys' namespace mixes in. */
static inline kvo_plan *sim_two_group_plan(const char *name) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 2, true, false},
                      {"swa", KVO_GROUP_SLIDING, 16, 48, 1, true, false}};
    return sim_plan(name, 16, gs, 2);
}

static inline void sim_init(sim *s, kvo_plan *plan, kvo_connector_params *cp, uint64_t nblocks) {
    memset(s, 0, sizeof *s);
    s->plan = plan;
    s->ng = kvo_plan_num_groups(plan);
    ASSERT_LE_U64(s->ng, SIM_MAXG);
    s->nblocks = nblocks;
    kvo_connector_params p = cp ? *cp : kvo_connector_default_params();
    p.plan = plan;
    if (!p.host_bytes) p.host_bytes = 8u << 20;
    ASSERT_OK(kvo_connector_create(&p, &s->c));
    s->step = kvo_connector_step(s->c);
    kvo_segment segs[64];
    size_t ns = 0;
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        s->page[g] = gp->page_bytes;
        s->layers[g] = gp->layers;
        s->mem[g] = malloc(nblocks * gp->layers * gp->page_bytes);
        ASSERT_NOT_NULL(s->mem[g]);
        memset(s->mem[g], SIM_POISON, nblocks * gp->layers * gp->page_bytes);
        s->freel[g] = malloc(nblocks * sizeof(uint64_t));
        for (uint64_t b = 0; b < nblocks; b++) s->freel[g][b] = nblocks - 1 - b;
        s->nfree[g] = nblocks;
        /* layer-major: one segment per layer */
        for (uint32_t l = 0; l < gp->layers; l++) {
            segs[ns].group = (uint32_t)g;
            segs[ns].base = s->mem[g] + (uint64_t)l * nblocks * gp->page_bytes;
            segs[ns].num_blocks = nblocks;
            segs[ns].block_stride = gp->page_bytes;
            segs[ns].page_bytes = gp->page_bytes;
            ns++;
        }
    }
    ASSERT_OK(kvo_connector_set_layout(s->c, segs, ns));
}

static inline void sim_destroy(sim *s) {
    kvo_connector_destroy(s->c);
    for (size_t g = 0; g < s->ng; g++) {
        free(s->mem[g]);
        free(s->freel[g]);
    }
    if (!s->keep_plan) kvo_plan_destroy(s->plan);
}

static inline uint8_t *sim_page(sim *s, size_t g, uint32_t l, uint64_t block) {
    return s->mem[g] + ((uint64_t)l * s->nblocks + block) * s->page[g];
}

/* The expected bytes of (g, l, block index i) of a token sequence. */
static inline void sim_pattern(const uint32_t *tok, uint64_t tpb, size_t g, uint32_t l, uint64_t i, uint8_t *out,
                        uint64_t len) {
    uint64_t seed = XXH3_64bits_withSeed(tok, (i + 1) * tpb * sizeof(uint32_t), (uint64_t)g * 131 + l);
    for (uint64_t k = 0; k < len; k++) {
        if (k % 8 == 0) {
            seed += UINT64_C(0x9E3779B97F4A7C15);
        }
        uint64_t z = seed;
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        out[k] = (uint8_t)((z ^ (z >> 31)) >> ((k % 8) * 8));
    }
}

static inline void sim_req_init(sim_req *r, uint64_t id) {
    memset(r, 0, sizeof *r);
    r->id = id;
}

static inline void sim_req_tokens(sim_req *r, const uint32_t *t, size_t n) {
    if (r->n_tok + n > r->cap_tok) {
        r->cap_tok = (r->n_tok + n) * 2;
        r->tok = realloc(r->tok, r->cap_tok * sizeof *r->tok);
    }
    memcpy(r->tok + r->n_tok, t, n * sizeof *t);
    r->n_tok += n;
}

static inline uint64_t sim_alloc(sim *s, size_t g) {
    if (s->nfree[g] == 0) FAILF("sim: group %zu out of engine blocks", g);
    return s->freel[g][--s->nfree[g]];
}

static inline void sim_free_block(sim *s, size_t g, uint64_t b) {
    for (uint32_t l = 0; l < s->layers[g]; l++) memset(sim_page(s, g, l, b), SIM_POISON, s->page[g]);
    s->freel[g][s->nfree[g]++] = b;
}

/* Make the table of every group at least n_blocks long (new entries empty). */
static inline void sim_table_len(sim *s, sim_req *r, size_t g, size_t n) {
    (void)s;
    if (r->tn[g] >= n) return;
    r->tab[g] = realloc(r->tab[g], n * sizeof(uint64_t));
    for (size_t i = r->tn[g]; i < n; i++) r->tab[g][i] = KVO_NO_BLOCK;
    r->tn[g] = n;
}

static inline void sim_tables(sim *s, sim_req *r, kvo_block_table *t) {
    for (size_t g = 0; g < s->ng; g++) {
        t[g].blocks = r->tab[g];
        t[g].n = r->tn[g];
    }
}

/* "Compute" tokens [r->computed, upto): write every block completed in that
 * range (allocating it when missing).  Non-offloaded groups are not modelled. */
static inline void sim_compute(sim *s, sim_req *r, uint64_t upto) {
    uint8_t buf[4096];
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded) continue;
        uint64_t tpb = gp->tokens_per_block;
        sim_table_len(s, r, g, (size_t)((upto + tpb - 1) / tpb));
        for (uint64_t i = r->computed / tpb; i * tpb < upto; i++) {
            if (r->tab[g][i] == KVO_NO_BLOCK) r->tab[g][i] = sim_alloc(s, g);
            if ((i + 1) * tpb > upto) continue; /* partial block: not written here */
            ASSERT_LE_U64(s->page[g], sizeof buf);
            for (uint32_t l = 0; l < s->layers[g]; l++) {
                sim_pattern(r->tok, tpb, g, l, i, buf, s->page[g]);
                memcpy(sim_page(s, g, l, r->tab[g][i]), buf, s->page[g]);
            }
        }
    }
    if (upto > r->computed) r->computed = upto;
}

/* Check block i of group g holds the expected bytes for r's tokens. */
static inline bool sim_block_ok(sim *s, sim_req *r, size_t g, uint64_t i) {
    uint8_t buf[4096];
    const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
    if (i >= r->tn[g] || r->tab[g][i] == KVO_NO_BLOCK) return false;
    for (uint32_t l = 0; l < s->layers[g]; l++) {
        sim_pattern(r->tok, gp->tokens_per_block, g, l, i, buf, s->page[g]);
        if (memcmp(sim_page(s, g, l, r->tab[g][i]), buf, s->page[g]) != 0) return false;
    }
    return true;
}

/* Free every block of r (after the connector released them). */
static inline void sim_release(sim *s, sim_req *r) {
    for (size_t g = 0; g < s->ng; g++) {
        for (size_t i = 0; i < r->tn[g]; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK) sim_free_block(s, g, r->tab[g][i]);
        free(r->tab[g]);
        r->tab[g] = NULL;
        r->tn[g] = 0;
    }
    r->computed = 0;
}

static inline void sim_req_free(sim *s, sim_req *r) {
    sim_release(s, r);
    free(r->tok);
    r->tok = NULL;
}

/* Engine-side freeing during decode: sliding blocks whose whole chunk is out
 * of the window and complete; state snapshots older than the last two whose
 * chunk is complete.  Waits for stores reading them first (wait_blocks). */
static inline void sim_slide(sim *s, sim_req *r) {
    kvo_block_ref refs[512];
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded || gp->kind == KVO_GROUP_FULL) continue;
        uint64_t tpb = gp->tokens_per_block, T = gp->tokens_per_chunk;
        uint64_t keep_from; /* tokens before this may be dropped, chunk-aligned */
        if (gp->kind == KVO_GROUP_SLIDING)
            keep_from = r->computed > gp->window ? (r->computed - gp->window) / T * T : 0;
        else
            keep_from = r->computed / tpb >= 2 ? (r->computed / tpb - 2) * tpb / T * T : 0;
        size_t nr = 0;
        for (uint64_t i = 0; (i + 1) * tpb <= keep_from && i < r->tn[g] && nr < 512; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK) refs[nr++] = (kvo_block_ref){(uint32_t)g, r->tab[g][i]};
        if (!nr) continue;
        ASSERT_OK(kvo_connector_wait_blocks(s->c, refs, nr));
        for (uint64_t i = 0; (i + 1) * tpb <= keep_from && i < r->tn[g]; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK) {
                sim_free_block(s, g, r->tab[g][i]);
                r->tab[g][i] = KVO_NO_BLOCK;
            }
    }
}

/* Poll until a completion of type for request id arrives (others are
 * collected into *other if given).  Fails after a long time. */
static inline kvo_completion sim_wait_completion(sim *s, uint64_t id, uint32_t type) {
    for (int spin = 0; spin < 2000000; spin++) {
        kvo_completion cp[16];
        size_t n = 0;
        ASSERT_OK(kvo_connector_poll(s->c, cp, 16, &n));
        for (size_t i = 0; i < n; i++)
            if (cp[i].request == id && cp[i].type == type) return cp[i];
        if (n == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    FAILF("no completion of type %u for request %llu", type, (unsigned long long)id);
}

/* Poll until nothing is in flight (all stores completed). */
static inline void sim_drain(sim *s) {
    for (int spin = 0; spin < 200000; spin++) {
        kvo_completion cp[16];
        (void)kvo_connector_poll(s->c, cp, 16, &(size_t){0});
        kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
        ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s->c), &ts));
        if (ts.jobs_queued == 0 && ts.results_pending == 0) {
            (void)kvo_connector_poll(s->c, cp, 16, &(size_t){0});
            return;
        }
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
    }
    FAILF("transfers never drained");
}

/* Register the sim's memory again with each layer's page of the groups in
 * mask split into two segments (K: the first half, V: the rest), or (mask
 * 0) as one segment per layer, as sim_init does.  The bytes per block stay
 * the same; the slot format of split groups changes. */
static inline void sim_layout(sim *s, uint64_t split_mask) {
    kvo_segment segs[64];
    size_t ns = 0;
    for (size_t g = 0; g < s->ng; g++) {
        uint64_t P = s->page[g], h = P / 2;
        for (uint32_t l = 0; l < s->layers[g]; l++) {
            uint8_t *base = s->mem[g] + (uint64_t)l * s->nblocks * P;
            if ((split_mask >> g) & 1) {
                segs[ns++] = (kvo_segment){(uint32_t)g, base, s->nblocks, P, h};
                segs[ns++] = (kvo_segment){(uint32_t)g, base + h, s->nblocks, P, P - h};
            } else {
                segs[ns++] = (kvo_segment){(uint32_t)g, base, s->nblocks, P, P};
            }
        }
    }
    ASSERT_OK(kvo_connector_set_layout(s->c, segs, ns));
}

/* Store the n tokens tok through request id: compute, finish, wait until
 * its stores completed (RELEASED). */
static inline void sim_store_prompt(sim *s, uint64_t id, const uint32_t *tok, size_t n) {
    sim_req r;
    sim_req_init(&r, id);
    sim_req_tokens(&r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n}));
    sim_compute(s, &r, n);
    kvo_block_table tb[SIM_MAXG];
    sim_tables(s, &r, tb);
    bool busy;
    ASSERT_OK(kvo_connector_finish(s->c, id, n, tb, s->ng, &busy));
    if (busy) (void)sim_wait_completion(s, id, KVO_COMPLETION_RELEASED);
    sim_req_free(s, &r);
}

#endif
