/*
 * Helpers for the connector rule tests (test_connector_hits.c,
 * test_connector_store_rules.c): one request at a time through the real
 * connector and the simulated engine of connector_sim.h, with every loaded
 * block checked against the bytes the engine would compute.
 */
#ifndef KVO_CONNECTOR_RULES_UTIL_H
#define KVO_CONNECTOR_RULES_UTIL_H

#include "connector/connector_internal.h"
#include "connector_sim.h"

/* n pseudo-random token ids from seed (equal seeds: equal tokens). */
static inline void cr_tokens(uint32_t *t, size_t n, uint64_t seed) {
    uint64_t x = seed * UINT64_C(0x9E3779B97F4A7C15) + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = (uint32_t)(x % 50000);
    }
}

/* Add request id over tok[0..n) (desc fields other than id/tokens from d0,
 * may be NULL). */
static inline void cr_add(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n,
                          const kvo_request_desc *d0) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    kvo_request_desc d = d0 ? *d0 : (kvo_request_desc)KVO_REQUEST_DESC_INIT;
    d.id = id;
    d.tokens = tok;
    d.n_tokens = n;
    ASSERT_OK(kvo_connector_add_request(s->c, &d));
}

/* The engine holds `local` tokens, looks up, and loads the hit (every block
 * below ceil(hit / tpb) allocated); the loaded blocks are checked. */
static inline kvo_lookup_result cr_lookup_load(sim *s, sim_req *r, uint64_t local) {
    if (local) sim_compute(s, r, local);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s->c, r->id, local, &lr));
    if (lr.status != KVO_HIT) return lr;
    uint64_t b = lr.tokens;
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded) continue;
        uint64_t nb = (b + gp->tokens_per_block - 1) / gp->tokens_per_block;
        sim_table_len(s, r, g, (size_t)nb);
        for (uint64_t i = 0; i < nb; i++)
            if (r->tab[g][i] == KVO_NO_BLOCK) r->tab[g][i] = sim_alloc(s, g);
    }
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    ASSERT_OK(kvo_connector_load(s->c, r->id, b, t, s->ng));
    kvo_completion cp = sim_wait_completion(s, r->id, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, b);
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded) continue;
        uint64_t tpb = gp->tokens_per_block, from = local;
        if (gp->kind == KVO_GROUP_SLIDING && b > gp->window && b - gp->window > from) from = b - gp->window;
        if (gp->kind == KVO_GROUP_STATE) from = b - tpb;
        for (uint64_t i = from / tpb; i < (b + tpb - 1) / tpb; i++)
            if (!sim_block_ok(s, r, g, i))
                FAILF("group '%s' block %llu wrong after a load of %llu tokens", gp->name, (unsigned long long)i,
                      (unsigned long long)b);
    }
    r->computed = b;
    return lr;
}

/* Compute to `upto` in steps of `step` tokens, updating after each. */
static inline void cr_compute(sim *s, sim_req *r, uint64_t upto, uint64_t step) {
    while (r->computed < upto) {
        uint64_t nx = r->computed + step < upto ? r->computed + step : upto;
        sim_compute(s, r, nx);
        kvo_block_table t[SIM_MAXG];
        sim_tables(s, r, t);
        ASSERT_OK(kvo_connector_update(s->c, r->id, r->computed, t, s->ng));
    }
}

/* Finish (storing what computed completed), wait for the stores, free. */
static inline void cr_finish(sim *s, sim_req *r) {
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    bool busy = false;
    ASSERT_OK(kvo_connector_finish(s->c, r->id, r->computed, t, s->ng, &busy));
    if (busy) (void)sim_wait_completion(s, r->id, KVO_COMPLETION_RELEASED);
    sim_drain(s);
    sim_req_free(s, r);
}

/* A whole request: add, look up (local 0), load, compute all but the last
 * token in steps, finish.  Returns the lookup. */
static inline kvo_lookup_result cr_run(sim *s, uint64_t id, const uint32_t *tok, size_t n, uint64_t step,
                                       const kvo_request_desc *d0) {
    sim_req r;
    cr_add(s, &r, id, tok, n, d0);
    kvo_lookup_result lr = cr_lookup_load(s, &r, 0);
    cr_compute(s, &r, n, step);
    cr_finish(s, &r);
    return lr;
}

/* Request 1 stores tok[0..n) (computed in steps of `step`), then request 2
 * over the same tokens looks up above `local` and loads: r is request 2. */
static inline kvo_lookup_result cr_stored_then_load(sim *s, const uint32_t *tok, size_t n, uint64_t step,
                                                    uint64_t local, sim_req *r) {
    (void)cr_run(s, 1, tok, n, step, NULL);
    cr_add(s, r, 2, tok, n, NULL);
    return cr_lookup_load(s, r, local);
}

/* Chunks of group g the host store holds READY for tok[0..n) (request id
 * must be live: its unit hashes give the keys). */
static inline size_t cr_ready_chunks(sim *s, uint64_t id, size_t g, uint8_t *states, size_t cap) {
    kvo__req *r = kvo__conn_req_get(s->c, id);
    ASSERT_NOT_NULL(r);
    const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
    size_t nc = r->n_units / gp->hashes_per_chunk, ready = 0;
    for (size_t ch = 0; ch < nc; ch++) {
        kvo_chunk_key k;
        kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, &k, 1);
        kvo_store_entry e;
        bool ok = kvo_store_peek(kvo_connector_store(s->c), &k, &e) == 0 && e.state == KVO_READY;
        if (ch < cap) states[ch] = ok;
        ready += ok;
    }
    return ready;
}

/* Remove chunk ch of group g of live request id from the host store. */
static inline void cr_remove_chunk(sim *s, uint64_t id, size_t g, uint64_t ch) {
    kvo__req *r = kvo__conn_req_get(s->c, id);
    ASSERT_NOT_NULL(r);
    const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
    kvo_chunk_key k;
    kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, &k, 1);
    ASSERT_OK(kvo_store_remove(kvo_connector_store(s->c), &k, 1));
}

#endif
