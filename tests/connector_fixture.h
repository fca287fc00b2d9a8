/*
 * Fixtures for the connector's end-to-end tests (test_connector_conversations.c,
 * _load.c, _lifecycle.c, _oom.c, _checkpoints.c): an engine loop over the
 * simulated engine of connector_sim.h -- allocating the blocks a load writes,
 * computing and updating in steps, finishing -- multi-turn conversations
 * whose every hit is compared with the agreement rule computed here by brute
 * force from what was stored, and the two-group plan (full + sliding,
 * 16-token blocks) most targeted tests use.
 */
#ifndef KVO_CONNECTOR_FIXTURE_H
#define KVO_CONNECTOR_FIXTURE_H

#include <stdlib.h>

#include "connector/connector_internal.h"
#include "connector_sim.h"

/* ------------------------------------------------------- expectations -- */

/* The rule, brute force: chunk c of group g is stored iff c < upto[g]. */
static inline bool exp_serves(const kvo_group_plan *gp, uint64_t upto, uint64_t b, uint64_t L) {
    uint64_t T = gp->tokens_per_chunk;
    if (b <= L) return true;
    if (gp->kind == KVO_GROUP_STATE)
        return b % gp->tokens_per_block == 0 && (b / gp->tokens_per_block - 1) / gp->blocks_per_chunk < upto;
    uint64_t from = gp->kind == KVO_GROUP_SLIDING && b > gp->window ? b - gp->window : 0;
    if (from < L) from = L;
    uint64_t to = b + gp->draft; /* a draft group also needs the chunk of token b */
    for (uint64_t c = from / T; c * T < to; c++)
        if (c >= upto) return false;
    return true;
}

static inline uint64_t expected_hit(const kvo_plan *p, const uint64_t *upto, uint64_t N, uint64_t L, uint64_t scratch) {
    uint64_t minhit = kvo__agree_min_hit_default(p);
    size_t ng = kvo_plan_num_groups(p);
    for (size_t g = 0; g < ng; g++)
        if (!kvo_plan_group(p, g)->offloaded && !((scratch >> g) & 1)) return L;
    if (N == 0) return L;
    for (uint64_t b = N - 1; b > L; b--) { /* the token rule: any count */
        bool ok = true;
        for (size_t g = 0; g < ng && ok; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            ok = gp->offloaded ? exp_serves(gp, upto[g], b, L) : b % gp->tokens_per_block == 0; /* scratch */
        }
        if (ok) return b - L >= minhit ? b : L;
    }
    return L;
}

static inline uint64_t noncacheable_mask(const kvo_plan *p) {
    uint64_t m = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(p); g++)
        if (!kvo_plan_group(p, g)->offloaded) m |= UINT64_C(1) << g;
    return m;
}

/* ------------------------------------------------------ the engine loop -- */

/* Allocate the blocks a load of [L, b) writes, per the documented rule. */
static inline void alloc_for_load(sim *s, sim_req *r, uint64_t L, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded) continue;
        uint64_t tpb = gp->tokens_per_block;
        sim_table_len(s, r, g, (size_t)((b + tpb - 1) / tpb));
        uint64_t from = L;
        if (gp->kind == KVO_GROUP_SLIDING) {
            uint64_t w = b > gp->window ? (b - gp->window) / tpb * tpb : 0;
            if (w > from) from = w;
        } else if (gp->kind == KVO_GROUP_STATE) {
            from = b - tpb;
        }
        for (uint64_t i = from / tpb; i < (b + tpb - 1) / tpb; i++)
            if (r->tab[g][i] == KVO_NO_BLOCK) r->tab[g][i] = sim_alloc(s, g);
    }
}

/* Every allocated block below b holds the right bytes. */
static inline void check_loaded(sim *s, sim_req *r, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        if (!gp->offloaded) continue;
        uint64_t tpb = gp->tokens_per_block;
        /* the last block may be only partly below b: whole-block KV of the
         * same tokens (when the sequence covers the whole block) */
        for (uint64_t i = 0; i < (b + tpb - 1) / tpb && (i + 1) * tpb <= r->n_tok && i < r->tn[g]; i++) {
            if (r->tab[g][i] == KVO_NO_BLOCK) continue;
            if (!sim_block_ok(s, r, g, i))
                FAILF("group '%s' block index %llu (tokens %llu..%llu) differs after load of %llu tokens", gp->name,
                      (unsigned long long)i, (unsigned long long)(i * tpb), (unsigned long long)((i + 1) * tpb),
                      (unsigned long long)b);
        }
    }
}

static inline void do_update(sim *s, sim_req *r) {
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    ASSERT_OK(kvo_connector_update(s->c, r->id, r->computed, t, s->ng));
}

/* Compute up to `upto` in steps, updating and sliding as an engine would. */
static inline void compute_to(sim *s, sim_req *r, uint64_t upto, uint64_t stepsz) {
    while (r->computed < upto) {
        uint64_t nx = r->computed + stepsz;
        if (nx > upto) nx = upto;
        sim_compute(s, r, nx);
        do_update(s, r);
        sim_slide(s, r);
    }
}

static inline void finish_req(sim *s, sim_req *r) {
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    bool busy = false;
    ASSERT_OK(kvo_connector_finish(s->c, r->id, r->computed, t, s->ng, &busy));
    if (busy) (void)sim_wait_completion(s, r->id, KVO_COMPLETION_RELEASED);
    ASSERT_ERR(kvo_connector_lookup(s->c, r->id, 0, &(kvo_lookup_result){0}), KVO_ENOTFOUND);
}

typedef struct conv_opts {
    int turns;
    size_t first_prompt, user_tokens, gen_tokens;
    uint64_t scratch;
    bool expect_exact;   /* compare every hit with the brute-force agreement */
} conv_opts;

/* Runs a conversation; returns the total tokens hit over its turns. */
static inline uint64_t run_conversation(sim *s, uint64_t id0, const conv_opts *o) {
    uint32_t *seq = NULL;
    size_t n_seq = 0;
    uint64_t upto[SIM_MAXG] = {0};
    uint64_t total = 0;
    uint32_t tph = kvo_plan_tokens_per_hash(s->plan);
    for (int turn = 0; turn < o->turns; turn++) {
        size_t add = turn == 0 ? o->first_prompt : o->user_tokens;
        seq = realloc(seq, (n_seq + add + o->gen_tokens + 1) * sizeof *seq);
        for (size_t i = 0; i < add; i++) seq[n_seq++] = (uint32_t)(kvo_test_rand() % 50000);
        sim_req r;
        sim_req_init(&r, id0 + (uint64_t)turn);
        sim_req_tokens(&r, seq, n_seq);
        kvo_request_desc d = KVO_REQUEST_DESC_INIT;
        d.id = r.id;
        d.tokens = seq;
        d.n_tokens = n_seq;
        ASSERT_OK(kvo_connector_add_request(s->c, &d));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(s->c, r.id, 0, &lr));
        ASSERT_NE_INT(lr.status, KVO_HIT_PENDING); /* previous turn fully released */
        if (o->expect_exact) {
            uint64_t e = expected_hit(s->plan, upto, n_seq, 0, o->scratch);
            if (lr.tokens != e)
                FAILF("turn %d: %zu tokens: hit %llu, expected %llu (limiting group %d, reason %d)", turn, n_seq,
                      (unsigned long long)lr.tokens, (unsigned long long)e, lr.limiting_group, (int)lr.reason);
        }
        uint64_t b = lr.tokens;
        ASSERT_LT_U64(b, n_seq);
        if (lr.status == KVO_HIT) {
            ASSERT_GT_U64(b, 0);
            alloc_for_load(s, &r, 0, b);
            kvo_block_table t[SIM_MAXG];
            sim_tables(s, &r, t);
            ASSERT_OK(kvo_connector_load(s->c, r.id, b, t, s->ng));
            kvo_completion cp = sim_wait_completion(s, r.id, KVO_COMPLETION_LOAD);
            ASSERT_EQ_INT(cp.status, 0);
            ASSERT_EQ_U64(cp.tokens_valid, b);
            check_loaded(s, &r, b);
            r.computed = b;
            total += b;
        } else {
            ASSERT_EQ_U64(b, 0);
        }
        compute_to(s, &r, n_seq, 37);
        /* decode: each step appends the sampled token and computes the
         * previous one */
        for (size_t k = 0; k < o->gen_tokens; k++) {
            uint32_t tk = (uint32_t)(kvo_test_rand() % 50000);
            seq[n_seq++] = tk;
            sim_req_tokens(&r, &tk, 1);
            ASSERT_OK(kvo_connector_append_tokens(s->c, r.id, &tk, 1));
            if (k + 1 < o->gen_tokens) compute_to(s, &r, n_seq, 64);
        }
        kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
        ASSERT_OK(kvo_connector_request_stats(s->c, r.id, &rs));
        ASSERT_EQ_U64(rs.tokens_loaded, b);
        ASSERT_EQ_U64(rs.tokens, n_seq);
        finish_req(s, &r);
        for (size_t g = 0; g < s->ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
            if (!gp->offloaded) continue;
            uint64_t a = r.computed / gp->tokens_per_chunk, u = (n_seq / tph) / gp->hashes_per_chunk;
            upto[g] = a < u ? a : u;
        }
        sim_req_free(s, &r); /* the engine evicts everything between turns */
    }
    free(seq);
    return total;
}

/* --------------------------------------- the two-group plan and steps -- */

/* The two-group plan (connector_sim.h) under the model name "two". */
static inline kvo_plan *two_group_plan(void) { return sim_two_group_plan("two"); }

static inline void fill_tokens(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 7 + salt) % 30011;
}

/* Store n tokens through request id (prefill only) and keep its blocks. */
static inline void prefill(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n, bool poll_stores) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n};
    ASSERT_OK(kvo_connector_add_request(s->c, &d));
    sim_compute(s, r, n);
    do_update(s, r);
    if (poll_stores) sim_drain(s);
}

/* Store tok[0, n) through request 1, then drop that request: the host tier
 * holds its chunks and nothing else refers to them. */
static inline void store_prefix(sim *s, const uint32_t *tok, size_t n) {
    sim_req a;
    prefill(s, &a, 1, tok, n, true);
    ASSERT_OK(kvo_connector_abort(s->c, 1));
    sim_req_free(s, &a);
}

/* A sim of two_group_plan() (params cp, may be NULL; nblocks engine blocks
 * per group) whose host tier holds tok[0, 400) (400 tokens from salt),
 * stored by a request that is gone again. */
static inline void sim_two_stored(sim *s, kvo_connector_params *cp, uint64_t nblocks, uint32_t *tok,
                                  uint32_t salt) {
    sim_init(s, two_group_plan(), cp, nblocks);
    fill_tokens(tok, 400, salt);
    store_prefix(s, tok, 400);
}

static inline void lookup_and_load(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n, uint64_t *b_out) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n};
    ASSERT_OK(kvo_connector_add_request(s->c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s->c, id, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    alloc_for_load(s, r, 0, lr.tokens);
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    ASSERT_OK(kvo_connector_load(s->c, id, lr.tokens, t, s->ng));
    *b_out = lr.tokens;
}

#endif
