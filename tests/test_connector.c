/*
 * The connector end to end with a simulated engine (tests/connector_sim.h):
 * multi-turn conversations for every preset geometry (scaled down) and random
 * group mixes, with the engine's blocks evicted between turns; every lookup's
 * hit is compared with the agreement computed here from what was stored, and
 * every loaded byte with the bytes the engine wrote for those tokens.  Plus
 * PENDING, injected and corrupt loads, block reuse during stores, preemption
 * mid-load, a local prefix with a partial first chunk, the checkpoint store
 * policy, unit-hash mode and bad input.
 */
#include <pthread.h>
#include <time.h>

#include "connector/connector_internal.h"
#include "connector_sim.h"
#include "fail_alloc.h"
#include "transfer/transfer_internal.h"

/* ------------------------------------------------------- expectations -- */

/* The rule, brute force: chunk c of group g is stored iff c < upto[g]. */
static bool exp_serves(const kvo_group_plan *gp, uint64_t upto, uint64_t b, uint64_t L) {
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

static uint64_t expected_hit(const kvo_plan *p, const uint64_t *upto, uint64_t N, uint64_t L, uint64_t scratch) {
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

static uint64_t noncacheable_mask(const kvo_plan *p) {
    uint64_t m = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(p); g++)
        if (!kvo_plan_group(p, g)->offloaded) m |= UINT64_C(1) << g;
    return m;
}

/* ------------------------------------------------------ the engine loop -- */

/* Allocate the blocks a load of [L, b) writes, per the documented rule. */
static void alloc_for_load(sim *s, sim_req *r, uint64_t L, uint64_t b) {
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
static void check_loaded(sim *s, sim_req *r, uint64_t b) {
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

static void do_update(sim *s, sim_req *r) {
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    ASSERT_OK(kvo_connector_update(s->c, r->id, r->computed, t, s->ng));
}

/* Compute up to `upto` in steps, updating and sliding as an engine would. */
static void compute_to(sim *s, sim_req *r, uint64_t upto, uint64_t stepsz) {
    while (r->computed < upto) {
        uint64_t nx = r->computed + stepsz;
        if (nx > upto) nx = upto;
        sim_compute(s, r, nx);
        do_update(s, r);
        sim_slide(s, r);
    }
}

static void finish_req(sim *s, sim_req *r) {
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
static uint64_t run_conversation(sim *s, uint64_t id0, const conv_opts *o) {
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

/* ------------------------------------------------------------- presets -- */

KVO_TEST(presets_conversations_hit_and_load_exact_bytes) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        const char *name = kvo_model_preset_name(i);
        kvo_plan *p = sim_preset_plan(name);
        uint64_t scratch = noncacheable_mask(p);
        kvo_connector_params cp = kvo_connector_default_params();
        cp.scratch_groups = scratch;
        sim s;
        sim_init(&s, p, &cp, 1024);
        conv_opts o = {3, 300 + 7 * (size_t)i, 150, 40, scratch, true};
        uint64_t hit = run_conversation(&s, 1000, &o);
        if (hit == 0) FAILF("preset %s: no hit in a 3-turn conversation", name);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.load_failures, 0);
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.host.pending, 0);
        ASSERT_EQ_U64(st.requests_live, 0);
        ASSERT_GT_U64(st.chunks_stored, 0);
        ASSERT_EQ_U64(st.tokens_loaded, hit);
        sim_destroy(&s);
    }
}

KVO_TEST(noncacheable_group_blocks_hits_by_default) {
    kvo_plan *p = sim_preset_plan("deepseek-v4-flash-like");
    ASSERT_NE_U64(noncacheable_mask(p), 0);
    sim s;
    sim_init(&s, p, NULL, 1024);
    conv_opts o = {3, 400, 200, 20, 0, true};
    ASSERT_EQ_U64(run_conversation(&s, 1, &o), 0);
    /* the stores still happened: a connector declaring the group scratch on
     * the same arena would hit; here just check the reason */
    uint32_t tok[600];
    for (int i = 0; i < 600; i++) tok[i] = (uint32_t)i;
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 99, .tokens = tok, .n_tokens = 600};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 99, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    ASSERT_EQ_INT(lr.reason, KVO_AGREE_NONCACHEABLE);
    ASSERT_OK(kvo_connector_abort(s.c, 99));
    sim_destroy(&s);
    /* a cacheable group cannot be declared scratch */
    p = sim_preset_plan("gemma-4-31b-like");
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = p;
    cp.host_bytes = 1 << 20;
    cp.scratch_groups = 1;
    kvo_connector *c = NULL;
    ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "sliding");
    kvo_plan_destroy(p);
}

/* Random group mixes: 1-5 groups of random kinds, block sizes, windows and
 * flags (some non-cacheable, declared scratch; some draft). */
static uint32_t gcd_u32(uint32_t a, uint32_t b) {
    while (b) {
        uint32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Multi-turn conversations over random group mixes with block sizes from
 * tpbs, every hit compared with the brute-force rule and loaded byte-exact. */
static void random_mixes(const uint32_t *tpbs, size_t ntpb, int iters) {
    for (int iter = 0; iter < iters; iter++) {
        size_t ng = 1 + kvo_test_rand() % 5;
        uint32_t tph = (uint32_t[]){4, 8, 16}[kvo_test_rand() % 3];
        sim_group gs[SIM_MAXG];
        char names[SIM_MAXG][8];
        bool any_cacheable = false;
        for (size_t g = 0; g < ng; g++) {
            snprintf(names[g], sizeof names[g], "g%zu", g);
            gs[g].name = names[g];
            gs[g].kind = (kvo_group_kind)(kvo_test_rand() % 3);
            gs[g].tpb = tpbs[kvo_test_rand() % ntpb];
            gs[g].window = gs[g].kind == KVO_GROUP_SLIDING ? 8 + (uint32_t)(kvo_test_rand() % 120) : 0;
            uint32_t minb = tph / gcd_u32(gs[g].tpb, tph); /* chunk tokens a multiple of tph */
            gs[g].bpc = minb * (1 + (uint32_t)(kvo_test_rand() % 2));
            gs[g].cacheable = kvo_test_rand() % 8 != 0;
            gs[g].draft = kvo_test_rand() % 6 == 0;
            any_cacheable |= gs[g].cacheable;
        }
        if (!any_cacheable) gs[0].cacheable = true;
        kvo_plan *p = sim_plan("mix", tph, gs, ng);
        uint64_t scratch = noncacheable_mask(p);
        kvo_connector_params cp = kvo_connector_default_params();
        cp.scratch_groups = scratch;
        sim s;
        sim_init(&s, p, &cp, 2048);
        conv_opts o = {3, 200 + kvo_test_rand() % 200, 60 + kvo_test_rand() % 100, 10 + kvo_test_rand() % 30, scratch,
                       true};
        (void)run_conversation(&s, 100 * (uint64_t)iter, &o);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.load_failures, 0);
        sim_destroy(&s);
    }
}

KVO_TEST(random_group_mixes) {
    static const uint32_t tpbs[] = {1, 2, 4, 8, 16, 32};
    random_mixes(tpbs, 6, 12);
}

/* Co-prime block sizes (issue 11): hits at any token count, last blocks
 * only partly valid, still byte-exact and equal to the brute-force rule. */
KVO_TEST(random_coprime_group_mixes) {
    static const uint32_t tpbs[] = {3, 5, 12, 16, 24, 32, 48, 64};
    random_mixes(tpbs, 8, 12);
}

/* ------------------------------------------------- targeted behaviours -- */

/* gpt-oss-like, scaled: full + sliding, 16-token blocks. */
static kvo_plan *two_group_plan(void) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 2, true, false},
                      {"swa", KVO_GROUP_SLIDING, 16, 48, 1, true, false}};
    return sim_plan("two", 16, gs, 2);
}

static void fill_tokens(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 7 + salt) % 30011;
}

/* Store n tokens through request id (prefill only) and keep its blocks. */
static void prefill(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n, bool poll_stores) {
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
static void store_prefix(sim *s, const uint32_t *tok, size_t n) {
    sim_req a;
    prefill(s, &a, 1, tok, n, true);
    ASSERT_OK(kvo_connector_abort(s->c, 1));
    sim_req_free(s, &a);
}

KVO_TEST(pending_means_ask_again_later) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 1);
    sim_req a, b;
    prefill(&s, &a, 1, tok, 400, false); /* stores submitted, results not polled */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_PENDING);
    ASSERT_EQ_U64(lr.tokens, 0);
    ASSERT_EQ_U64(lr.tokens_if_pending, 384);
    /* PENDING pins nothing; load is refused */
    ASSERT_ERR(kvo_connector_load(s.c, 2, 384, NULL, 0), KVO_ESTATE);
    sim_drain(&s);
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    alloc_for_load(&s, &b, 0, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &b, 384);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.pending_lookups, 1);
    ASSERT_EQ_U64(rs.tokens_loaded, 384);
    ASSERT_EQ_U64(rs.tokens_computed, 16);
    ASSERT_GT_U64(rs.bytes_loaded, 0);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &a);
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

static void lookup_and_load(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n, uint64_t *b_out) {
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

KVO_TEST(injected_load_failure_gives_invalid_blocks) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 2);
    sim_req b;
    store_prefix(&s, tok, 400);
    kvo__connector_inject_failures(s.c, 1, 0);
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, KVO_EIO);
    ASSERT_EQ_U64(cp.tokens_valid, 0);
    /* the invalid blocks are exactly the blocks the load wrote */
    size_t expect = 0;
    for (size_t g = 0; g < 2; g++)
        for (size_t i = 0; i < b.tn[g]; i++) expect += b.tab[g][i] != KVO_NO_BLOCK;
    ASSERT_EQ_U64(cp.n_invalid_blocks, expect);
    uint64_t ids[64];
    size_t n = 0, tot = 0;
    for (uint32_t g = 0; g < 2; g++) {
        ASSERT_OK(kvo_connector_invalid_blocks(s.c, 2, g, ids, 64, &n));
        for (size_t i = 0; i < n && i < 64; i++) {
            bool found = false;
            for (size_t k = 0; k < b.tn[g]; k++) found |= b.tab[g][k] == ids[i];
            ASSERT_TRUE(found);
        }
        tot += n;
    }
    ASSERT_EQ_U64(tot, expect);
    /* the engine recomputes; the request goes on normally */
    b.computed = 0;
    compute_to(&s, &b, 400, 100);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.load_failures, 1);
    ASSERT_EQ_U64(rs.tokens_loaded, 0);
    finish_req(&s, &b);
    sim_req_free(&s, &b);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.load_failures, 1);
    /* a failed store removes its chunks: nothing half-written is ever READY */
    kvo__connector_inject_failures(s.c, 0, 1);
    uint32_t tok2[200];
    fill_tokens(tok2, 200, 99);
    sim_req c2;
    prefill(&s, &c2, 3, tok2, 200, true);
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(st.stores_failed, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &c2);
    sim_destroy(&s);
}

KVO_TEST(corrupt_slot_is_detected_never_loaded) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.verify_checksums = true;
    sim s;
    sim_init(&s, two_group_plan(), &cp, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 3);
    sim_req b;
    store_prefix(&s, tok, 400);
    /* flip one byte in one stored chunk of the full group */
    kvo_store *st = kvo_connector_store(s.c);
    kvo_store_entry ents[256];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(st, &cur, ents, 256, &n));
    ASSERT_GT_U64(n, 0);
    size_t victim = n;
    for (size_t i = 0; i < n; i++)
        if (ents[i].key.group == 0) victim = i;
    ASSERT_LT_U64(victim, n);
    uint8_t *slot = kvo_arena_slot(kvo_connector_arena(s.c), ents[victim].slot);
    slot[5] ^= 0x40;
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    kvo_completion c1 = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(c1.status, KVO_ECORRUPT);
    ASSERT_EQ_U64(c1.tokens_valid, 0);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &cs));
    ASSERT_EQ_U64(cs.checksum_failures, 1);
    ASSERT_EQ_U64(cs.host.pinned, 0);
    /* the corrupt chunk (only it) is gone: the next lookup stops right below
     * it (the keys are recomputed here from the documented format) */
    kvo_u128 units[25];
    size_t nu = 0;
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(kvo_plan_fingerprint(s.plan), NULL, 0), tok, 400, 16, NULL, 0,
                              units, 25, &nu));
    kvo_chunk_key keys[12];
    ASSERT_EQ_U64(kvo_chunk_keys(kvo_plan_group(s.plan, 0), units, nu, keys, 12), 12);
    size_t vc = 12;
    for (size_t i = 0; i < 12; i++)
        if (kvo_chunk_key_eq(&keys[i], &ents[victim].key)) vc = i;
    ASSERT_LT_U64(vc, 12);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, vc * 32);
    ASSERT_LT_U64(lr.tokens, hit);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

KVO_TEST(block_reuse_during_store_is_never_torn) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    for (int round = 0; round < 20; round++) {
        uint32_t tok[300];
        fill_tokens(tok, 300, 10 + (uint32_t)round);
        sim_req a, b;
        prefill(&s, &a, 1, tok, 300, false); /* stores in flight */
        /* the engine reuses every block at once: wait, then overwrite */
        kvo_block_ref refs[128];
        size_t nr = 0;
        for (size_t g = 0; g < 2; g++)
            for (size_t i = 0; i < a.tn[g]; i++) refs[nr++] = (kvo_block_ref){(uint32_t)g, a.tab[g][i]};
        ASSERT_OK(kvo_connector_wait_blocks(s.c, refs, nr));
        for (size_t g = 0; g < 2; g++)
            for (size_t i = 0; i < a.tn[g]; i++)
                for (uint32_t l = 0; l < s.layers[g]; l++) memset(sim_page(&s, g, l, a.tab[g][i]), 0x11, s.page[g]);
        ASSERT_OK(kvo_connector_abort(s.c, 1));
        sim_req_free(&s, &a);
        sim_drain(&s);
        uint64_t hit;
        lookup_and_load(&s, &b, 2, tok, 300, &hit);
        kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
        ASSERT_EQ_INT(cp.status, 0);
        check_loaded(&s, &b, hit);
        ASSERT_OK(kvo_connector_abort(s.c, 2));
        sim_req_free(&s, &b);
    }
    sim_destroy(&s);
}

KVO_TEST(preemption_mid_load) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 4);
    sim_req b;
    store_prefix(&s, tok, 400);
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    ASSERT_OK(kvo_connector_preempt(s.c, 2)); /* blocks may be freed now */
    sim_release(&s, &b);
    kvo_completion cps[16];
    size_t n = 0;
    sim_drain(&s);
    ASSERT_OK(kvo_connector_poll(s.c, cps, 16, &n));
    for (size_t i = 0; i < n; i++) ASSERT_NE_U64(cps[i].request, 2); /* no completion for it */
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    /* resumed later: the same hit, loaded completely */
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, hit);
    alloc_for_load(&s, &b, 0, hit);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, hit, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &b, hit);
    b.computed = hit;
    compute_to(&s, &b, 400, 50);
    finish_req(&s, &b);
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

KVO_TEST(local_prefix_loads_only_the_rest) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 5);
    sim_req b;
    store_prefix(&s, tok, 400);
    /* the engine holds tokens [0, 48) (its own prefix cache), in blocks marked
     * 0x77; L = 48 is mid-chunk for the full group (32-token chunks) */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    uint64_t L = 48;
    for (size_t g = 0; g < 2; g++) {
        sim_table_len(&s, &b, g, L / 16);
        for (size_t i = 0; i < L / 16; i++) {
            b.tab[g][i] = sim_alloc(&s, g);
            for (uint32_t l = 0; l < s.layers[g]; l++) memset(sim_page(&s, g, l, b.tab[g][i]), 0x77, s.page[g]);
        }
    }
    kvo_lookup_result lr;
    ASSERT_ERR(kvo_connector_lookup(s.c, 2, 40, &lr), KVO_EINVAL); /* not a multiple of the step */
    ASSERT_OK(kvo_connector_lookup(s.c, 2, L, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.local_tokens, L);
    alloc_for_load(&s, &b, L, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    for (size_t g = 0; g < 2; g++) {
        for (size_t i = 0; i < L / 16; i++) /* the engine's own blocks untouched */
            for (uint32_t l = 0; l < s.layers[g]; l++) {
                uint8_t *pg = sim_page(&s, g, l, b.tab[g][i]);
                for (uint64_t k = 0; k < s.page[g]; k++) ASSERT_EQ_INT(pg[k], 0x77);
            }
        for (size_t i = L / 16; i < 384 / 16; i++)
            if (b.tab[g][i] != KVO_NO_BLOCK) ASSERT_TRUE(sim_block_ok(&s, &b, g, i));
    }
    /* the sliding group loaded only its window [336, 384) */
    for (size_t i = L / 16; i < 384 / 16; i++) ASSERT_EQ_INT(b.tab[1][i] != KVO_NO_BLOCK, i >= 336 / 16);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.local_tokens, L);
    ASSERT_EQ_U64(rs.tokens_loaded, 384 - L);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    sim_destroy(&s);
}

KVO_TEST(checkpoint_policy_stores_fewer_sliding_chunks_and_still_hits) {
    uint64_t stored[3];
    for (int pol = 0; pol < 3; pol++) {
        sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, true, false},
                          {"swa", KVO_GROUP_SLIDING, 16, 32, 1, true, false}};
        kvo_connector_params cp = kvo_connector_default_params();
        cp.sliding_store = pol ? KVO_SLIDING_STORE_CHECKPOINTS : KVO_SLIDING_STORE_ALL;
        cp.checkpoint_interval = pol == 2 ? 128 : 0; /* plus a window every 128 tokens */
        sim s;
        sim_init(&s, sim_plan("ck", 16, gs, 2), &cp, 1024);
        conv_opts o = {3, 800, 200, 30, 0, pol == 0};
        uint64_t hit = run_conversation(&s, 10, &o);
        ASSERT_GT_U64(hit, 0);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        stored[pol] = st.host.groups[1].chunks;
        sim_destroy(&s);
    }
    ASSERT_LT_U64(stored[1] * 2, stored[0]);
    ASSERT_LT_U64(stored[1], stored[2]);
    ASSERT_LT_U64(stored[2], stored[0]);
}

KVO_TEST(unit_hash_mode_and_salts) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    /* engine-provided unit hashes (16 tokens each) */
    kvo_u128 units[25];
    for (int i = 0; i < 25; i++) units[i] = (kvo_u128){(uint64_t)i * 977 + 1, (uint64_t)i};
    uint32_t tok[400];
    fill_tokens(tok, 400, 6); /* the sim's byte patterns still come from tokens */
    sim_req a;
    sim_req_init(&a, 1);
    sim_req_tokens(&a, tok, 400);
    kvo_request_desc d = {.struct_size = sizeof(kvo_request_desc), .id = 1, .unit_hashes = units, .n_units = 25, .prompt_tokens = 400};
    ASSERT_OK(kvo_connector_add_request(s.c, &d));
    sim_compute(&s, &a, 400);
    do_update(&s, &a);
    sim_drain(&s);
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, 1), KVO_ESTATE);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    sim_req_free(&s, &a);
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .unit_hashes = units, .n_units = 25,
                                                                   .prompt_tokens = 401}));
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 384);
    /* another tenant salt: no hit */
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 3, .unit_hashes = units, .n_units = 25,
                                                                   .prompt_tokens = 401, .cache_salt = "t2",
                                                                   .cache_salt_len = 2}));
    ASSERT_OK(kvo_connector_lookup(s.c, 3, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 0);
    /* token mode with the same tokens does not collide with hash mode */
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 4, .tokens = tok, .n_tokens = 400}));
    ASSERT_OK(kvo_connector_lookup(s.c, 4, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 0);
    ASSERT_ERR(kvo_connector_append_unit_hashes(s.c, 2, units, 1, 500), KVO_EINVAL);
    ASSERT_OK(kvo_connector_append_unit_hashes(s.c, 2, units, 1, 417));
    for (uint64_t id = 2; id <= 4; id++) ASSERT_OK(kvo_connector_abort(s.c, id));
    sim_destroy(&s);
}

KVO_TEST(bad_input_fails_one_request_only) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[200];
    fill_tokens(tok, 200, 7);
    kvo_lookup_result lr;
    kvo_block_table t[2] = {{NULL, 0}, {NULL, 0}};
    bool busy;
    ASSERT_ERR(kvo_connector_lookup(s.c, 5, 0, &lr), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_load(s.c, 5, 0, t, 2), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_update(s.c, 5, 0, t, 2), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_finish(s.c, 5, 0, NULL, 0, &busy), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_preempt(s.c, 5), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_abort(s.c, 5), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1}), KVO_EINVAL);
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 0}),
               KVO_EINVAL);
    ASSERT_ERR(kvo_connector_add_request(
                   s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .unit_hashes = (kvo_u128[1]){{1, 2}}, .n_units = 1,
                                            .prompt_tokens = 40}),
               KVO_EINVAL);
    /* a healthy request next to a misbehaving one */
    sim_req good, bad;
    prefill(&s, &good, 10, tok, 200, true);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 11, .tokens = tok, .n_tokens = 200}));
    ASSERT_ERR(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 11, .tokens = tok, .n_tokens = 200}),
               KVO_EEXIST);
    sim_req_init(&bad, 11);
    sim_req_tokens(&bad, tok, 200);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_ESTATE); /* no lookup */
    ASSERT_ERR(kvo_connector_update(s.c, 11, 300, t, 2), KVO_EINVAL); /* beyond the tokens */
    ASSERT_ERR(kvo_connector_update(s.c, 11, 100, t, 2), KVO_EINVAL); /* tables too short */
    ASSERT_CONTAINS(kvo_last_error(), "block table");
    ASSERT_ERR(kvo_connector_update(s.c, 11, 100, t, 1), KVO_EINVAL); /* group count */
    ASSERT_OK(kvo_connector_lookup(s.c, 11, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 192);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 160, t, 2), KVO_EINVAL); /* not the hit */
    sim_table_len(&s, &bad, 0, 11);
    sim_table_len(&s, &bad, 1, 11);
    sim_tables(&s, &bad, t);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_EINVAL); /* tables too short */
    ASSERT_CONTAINS(kvo_last_error(), "11 entries");
    alloc_for_load(&s, &bad, 0, 192);
    bad.tab[0][3] = KVO_NO_BLOCK; /* a hole where a block is to be loaded */
    sim_tables(&s, &bad, t);
    ASSERT_ERR(kvo_connector_load(s.c, 11, 192, t, 2), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_NO_BLOCK");
    bad.tab[0][3] = sim_alloc(&s, 0);
    sim_tables(&s, &bad, t);
    ASSERT_OK(kvo_connector_load(s.c, 11, 192, t, 2));
    ASSERT_ERR(kvo_connector_update(s.c, 11, 0, t, 2), KVO_ESTATE); /* load in flight */
    ASSERT_ERR(kvo_connector_lookup(s.c, 11, 0, &lr), KVO_ESTATE);
    ASSERT_ERR(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy), KVO_ESTATE);
    kvo_completion cp = sim_wait_completion(&s, 11, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &bad, 192);
    ASSERT_ERR(kvo_connector_wait_blocks(s.c, &(kvo_block_ref){9, 0}, 1), KVO_EINVAL);
    uint64_t ids[4];
    size_t n;
    ASSERT_ERR(kvo_connector_invalid_blocks(s.c, 11, 7, ids, 4, &n), KVO_EINVAL);
    /* the good request is unaffected */
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 10, &rs));
    ASSERT_EQ_U64(rs.chunks_stored, 6 + 12);
    finish_req(&s, &good);
    ASSERT_OK(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy));
    ASSERT_FALSE(busy);
    ASSERT_ERR(kvo_connector_finish(s.c, 11, 0, NULL, 0, &busy), KVO_ENOTFOUND);
    sim_req_free(&s, &good);
    sim_req_free(&s, &bad);
    /* router events: stored chunks */
    kvo_store_event ev[64];
    uint64_t dropped = 0;
    size_t ne = kvo_connector_drain_events(s.c, ev, 64, &dropped);
    ASSERT_GT_U64(ne, 0);
    ASSERT_EQ_INT(ev[0].type, KVO_EVENT_STORED);
    sim_destroy(&s);
}

/* A token count whose unit hashes could not be held in memory (their byte
 * count overflows size_t) fails before any token is read, and leaves the
 * request as it was. */
KVO_TEST(huge_token_count_fails_cleanly) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[40];
    fill_tokens(tok, 40, 3);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 40}));
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, SIZE_MAX), KVO_ENOMEM);
    ASSERT_ERR(kvo_connector_append_tokens(s.c, 1, tok, SIZE_MAX / 2), KVO_ENOMEM);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    ASSERT_EQ_U64(rs.tokens, 40);
    ASSERT_OK(kvo_connector_append_tokens(s.c, 1, tok, 8));
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    ASSERT_EQ_U64(rs.tokens, 48);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    sim_destroy(&s);
}

/* Allocation failures while a request stores and another loads: every call
 * fails cleanly (0 or KVO_ENOMEM), an accepted load always completes, loaded
 * bytes are exact, and nothing stays pinned or pending (leaks: ASan). */
static bool ok_or_nomem(int rc) {
    if (rc != 0 && rc != KVO_ENOMEM) FAILF("expected 0 or KVO_ENOMEM, got %d (%s)", rc, kvo_error_name(rc));
    return rc == 0;
}

KVO_TEST(allocation_failures_are_clean) {
    uint32_t tok[400];
    fill_tokens(tok, 400, 9);
    bool done = false;
    for (long k = 0; k < 400 && !done; k++) {
        sim s;
        fa_install(-1); /* before the connector exists, as kvo_set_allocator requires */
        sim_init(&s, two_group_plan(), NULL, 512);
        fa_arm(k);
        sim_req a, b;
        sim_req_init(&a, 1);
        sim_req_tokens(&a, tok, 400);
        sim_req_init(&b, 2);
        sim_req_tokens(&b, tok, 400);
        if (ok_or_nomem(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 400}))) {
            sim_compute(&s, &a, 400);
            kvo_block_table t[SIM_MAXG];
            sim_tables(&s, &a, t);
            (void)ok_or_nomem(kvo_connector_update(s.c, 1, 400, t, s.ng));
            sim_drain(&s);
            bool busy = false;
            if (!ok_or_nomem(kvo_connector_finish(s.c, 1, 400, t, s.ng, &busy))) ASSERT_OK(kvo_connector_abort(s.c, 1));
            else if (busy) (void)sim_wait_completion(&s, 1, KVO_COMPLETION_RELEASED);
        }
        sim_drain(&s);
        bool loaded = false;
        if (ok_or_nomem(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400}))) {
            kvo_lookup_result lr;
            if (ok_or_nomem(kvo_connector_lookup(s.c, 2, 0, &lr)) && lr.status == KVO_HIT) {
                alloc_for_load(&s, &b, 0, lr.tokens);
                kvo_block_table t[SIM_MAXG];
                sim_tables(&s, &b, t);
                if (ok_or_nomem(kvo_connector_load(s.c, 2, lr.tokens, t, s.ng))) {
                    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
                    if (cp.status == 0) {
                        check_loaded(&s, &b, lr.tokens);
                        loaded = true;
                    } else {
                        ASSERT_EQ_U64(cp.tokens_valid, 0);
                    }
                }
            }
            ASSERT_OK(kvo_connector_abort(s.c, 2));
        }
        sim_drain(&s);
        done = loaded && fa_allocations() <= k; /* nothing failed */
        fa_arm(-1);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.host.pinned, 0);
        ASSERT_EQ_U64(st.host.pending, 0);
        sim_req_free(&s, &a);
        sim_req_free(&s, &b);
        sim_destroy(&s);
        ASSERT_OK(kvo_set_allocator(NULL));
    }
    ASSERT_TRUE(done);
}

/* Abort that runs out of memory while copies are in flight fails with
 * KVO_ENOMEM and changes nothing: the request is still there, and a retry
 * waits for its copies. */
KVO_TEST(abort_out_of_memory_changes_nothing) {
    sim s;
    fa_install(-1);
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 10);
    sim_req a;
    kvo__transfer_pause(kvo_connector_transfer(s.c), true); /* the store stays in flight */
    prefill(&s, &a, 1, tok, 400, false);
    kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &ts));
    ASSERT_GT_U64(ts.jobs_queued, 0);
    fa_arm(0);
    int rc = kvo_connector_abort(s.c, 1);
    fa_arm(-1);
    ASSERT_ERR(rc, KVO_ENOMEM);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 1, &rs));
    kvo__transfer_pause(kvo_connector_transfer(s.c), false);
    ASSERT_OK(kvo_connector_abort(s.c, 1));
    ASSERT_ERR(kvo_connector_request_stats(s.c, 1, &rs), KVO_ENOTFOUND);
    ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &ts));
    ASSERT_EQ_U64(ts.jobs_queued, 0);
    sim_drain(&s);
    sim_req_free(&s, &a);
    sim_destroy(&s);
    ASSERT_OK(kvo_set_allocator(NULL));
}

/* A failed load lists its blocks as invalid even when memory is short when
 * it completes: the list's room is taken when the load is accepted. */
KVO_TEST(failed_load_lists_invalid_blocks_without_allocating) {
    sim s;
    fa_install(-1);
    sim_init(&s, two_group_plan(), NULL, 512);
    uint32_t tok[400];
    fill_tokens(tok, 400, 11);
    sim_req b;
    store_prefix(&s, tok, 400);
    kvo__connector_inject_failures(s.c, 1, 0);
    uint64_t hit;
    lookup_and_load(&s, &b, 2, tok, 400, &hit);
    fa_arm(0); /* the first allocation after the load was accepted fails */
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    fa_arm(-1);
    ASSERT_EQ_INT(cp.status, KVO_EIO);
    ASSERT_GT_U64(cp.n_invalid_blocks, 0);
    uint64_t ids[64];
    size_t n = 0, tot = 0;
    for (uint32_t g = 0; g < 2; g++) {
        ASSERT_OK(kvo_connector_invalid_blocks(s.c, 2, g, ids, 64, &n));
        tot += n;
    }
    ASSERT_EQ_U64(tot, cp.n_invalid_blocks);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_drain(&s);
    sim_req_free(&s, &b);
    sim_destroy(&s);
    ASSERT_OK(kvo_set_allocator(NULL));
}

KVO_TEST(create_errors) {
    kvo_connector *c = NULL;
    kvo_connector_params p = kvo_connector_default_params();
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    kvo_plan *plan = two_group_plan();
    p.plan = plan;
    p.host_bytes = 16;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "host_bytes");
    p.host_bytes = 1 << 20;
    p.checkpoint_interval = 24;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "checkpoint_interval");
    p.checkpoint_interval = 0;
    p.scratch_groups = UINT64_C(1) << 5;
    ASSERT_ERR(kvo_connector_create(&p, &c), KVO_EINVAL);
    p.scratch_groups = 0;
    ASSERT_OK(kvo_connector_create(&p, &c));
    ASSERT_EQ_U64(kvo_connector_step(c), 16);
    /* no layout: loads and updates are refused */
    uint32_t tok[64] = {0};
    ASSERT_OK(kvo_connector_add_request(c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = 64}));
    uint64_t blk[4] = {0, 1, 2, 3};
    kvo_block_table t[2] = {{blk, 4}, {blk, 4}};
    ASSERT_ERR(kvo_connector_update(c, 1, 64, t, 2), KVO_ESTATE);
    kvo_connector_destroy(c);
    kvo_connector_destroy(NULL);
    kvo_plan_destroy(plan);
}

/* --------------------------------------------------------------- threads -- */

typedef struct thr_ctx {
    sim *s;
    pthread_mutex_t *engine_mu; /* the sim's allocator and memory tables */
    int idx;
    uint64_t hits;
} thr_ctx;

/* Each thread runs conversations sharing a common system prompt; every
 * connector call is made without the engine lock except the sim's own
 * allocations. */
static void *thr_main(void *arg) {
    thr_ctx *x = arg;
    sim *s = x->s;
    uint32_t tok[320];
    fill_tokens(tok, 256, 42); /* shared system prompt */
    for (int i = 256; i < 320; i++) tok[i] = (uint32_t)(x->idx * 1000 + i);
    for (int round = 0; round < 4; round++) {
        uint64_t id = (uint64_t)x->idx * 100 + (uint64_t)round;
        sim_req r;
        sim_req_init(&r, id);
        sim_req_tokens(&r, tok, 320);
        if (kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = 320})) abort();
        kvo_lookup_result lr;
        do {
            if (kvo_connector_lookup(s->c, id, 0, &lr)) abort();
            if (lr.status == KVO_HIT_PENDING) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
        } while (lr.status == KVO_HIT_PENDING);
        pthread_mutex_lock(x->engine_mu);
        if (lr.status == KVO_HIT) alloc_for_load(s, &r, 0, lr.tokens);
        kvo_block_table t[SIM_MAXG];
        sim_tables(s, &r, t);
        pthread_mutex_unlock(x->engine_mu);
        uint64_t have = 0;
        if (lr.status == KVO_HIT) {
            if (kvo_connector_load(s->c, id, lr.tokens, t, s->ng)) abort();
            /* wait for our completion: the poller thread moves it to us via
             * request stats */
            for (;;) {
                kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
                if (kvo_connector_request_stats(s->c, id, &rs)) abort();
                if (rs.tokens_loaded || rs.load_failures) {
                    have = rs.tokens_loaded;
                    break;
                }
                struct timespec ts = {0, 100000};
                nanosleep(&ts, NULL);
            }
            pthread_mutex_lock(x->engine_mu);
            for (size_t g = 0; g < s->ng; g++)
                for (uint64_t i = 0; i < have / 16 && i < r.tn[g]; i++)
                    if (r.tab[g][i] != KVO_NO_BLOCK && !sim_block_ok(s, &r, g, i)) abort();
            pthread_mutex_unlock(x->engine_mu);
            x->hits += have;
        }
        /* loaded state reached ACTIVE once the completion was processed */
        r.computed = have;
        while (r.computed < 320) {
            pthread_mutex_lock(x->engine_mu);
            sim_compute(s, &r, r.computed + 64 > 320 ? 320 : r.computed + 64);
            sim_tables(s, &r, t);
            pthread_mutex_unlock(x->engine_mu);
            int rc;
            while ((rc = kvo_connector_update(s->c, id, r.computed, t, s->ng)) == KVO_ESTATE) {
                struct timespec ts = {0, 100000}; /* the load completion is being processed */
                nanosleep(&ts, NULL);
            }
            if (rc) abort();
        }
        bool busy;
        if (kvo_connector_finish(s->c, id, r.computed, t, s->ng, &busy)) abort();
        if (busy && kvo_connector_wait_request(s->c, id) && kvo_connector_wait_request(s->c, id) != KVO_ENOTFOUND)
            abort();
        pthread_mutex_lock(x->engine_mu);
        sim_req_free(s, &r);
        pthread_mutex_unlock(x->engine_mu);
    }
    return NULL;
}

static volatile int poller_stop;

static void *poller_main(void *arg) {
    sim *s = arg;
    while (!__atomic_load_n(&poller_stop, __ATOMIC_ACQUIRE)) {
        kvo_completion cp[32];
        size_t np = 0;
        (void)kvo_connector_poll(s->c, cp, 32, &np);
        if (np == 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

KVO_TEST(threads_scheduler_and_poller) {
    sim s;
    sim_init(&s, two_group_plan(), NULL, 4096);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    thr_ctx ctx[3];
    pthread_t th[3], pt;
    __atomic_store_n(&poller_stop, 0, __ATOMIC_RELEASE);
    ASSERT_EQ_INT(pthread_create(&pt, NULL, poller_main, &s), 0);
    for (int i = 0; i < 3; i++) {
        ctx[i] = (thr_ctx){&s, &mu, i, 0};
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, thr_main, &ctx[i]), 0);
    }
    uint64_t hits = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        hits += ctx[i].hits;
    }
    __atomic_store_n(&poller_stop, 1, __ATOMIC_RELEASE);
    pthread_join(pt, NULL);
    ASSERT_GT_U64(hits, 0);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.load_failures, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    sim_destroy(&s);
}

/* A host tier full of chunks pinned by a pending load: new stores that would
 * need to evict them are skipped and counted, and the pinned hit still loads
 * the right bytes. */
KVO_TEST(stores_skip_rather_than_evict_pinned) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.host_bytes = 48 * 4096; /* 48 slots of 4 KiB */
    sim s;
    sim_init(&s, two_group_plan(), &cp, 1024);
    uint32_t tok[400], other[400];
    fill_tokens(tok, 400, 20);
    fill_tokens(other, 400, 21);
    sim_req b, c2;
    store_prefix(&s, tok, 400); /* 12 + 25 = 37 chunks */
    /* pin the hit (15 chunks), then store another 37 chunks */
    sim_req_init(&b, 2);
    sim_req_tokens(&b, tok, 400);
    ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok, .n_tokens = 400}));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_U64(lr.tokens, 384);
    prefill(&s, &c2, 3, other, 400, true);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(st.stores_skipped_nospace, 0);
    ASSERT_GE_U64(st.host.pinned, 15);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(s.c, 3, &rs));
    ASSERT_EQ_U64(rs.stores_skipped, st.stores_skipped_nospace);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &c2);
    alloc_for_load(&s, &b, 0, 384);
    kvo_block_table t[SIM_MAXG];
    sim_tables(&s, &b, t);
    ASSERT_OK(kvo_connector_load(s.c, 2, 384, t, 2));
    kvo_completion cpl = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cpl.status, 0);
    check_loaded(&s, &b, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &b);
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_GT_U64(st.host.evictions, 0);
    sim_destroy(&s);
}

/* Periodic checkpoints serve a prompt that diverges mid-way from a stored one:
 * with windows kept every 128 tokens the hit lands on the last checkpoint
 * before the divergence; with only end-of-prompt checkpoints nothing hits. */
KVO_TEST(checkpoint_interval_serves_divergent_prompts) {
    for (int with_interval = 0; with_interval < 2; with_interval++) {
        sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, true, false},
                          {"swa", KVO_GROUP_SLIDING, 16, 32, 1, true, false}};
        kvo_connector_params cp = kvo_connector_default_params();
        cp.sliding_store = KVO_SLIDING_STORE_CHECKPOINTS;
        cp.checkpoint_interval = with_interval ? 128 : 0;
        sim s;
        sim_init(&s, sim_plan("ckdiv", 16, gs, 2), &cp, 1024);
        uint32_t tok[800], tok2[600];
        fill_tokens(tok, 800, 30);
        memcpy(tok2, tok, 500 * sizeof *tok);
        fill_tokens(tok2 + 500, 100, 31);
        sim_req a;
        prefill(&s, &a, 1, tok, 800, true);
        kvo_block_table t[SIM_MAXG];
        sim_tables(&s, &a, t);
        bool busy;
        ASSERT_OK(kvo_connector_finish(s.c, 1, 800, t, 2, &busy));
        if (busy) (void)sim_wait_completion(&s, 1, KVO_COMPLETION_RELEASED);
        sim_req_free(&s, &a);
        ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 2, .tokens = tok2, .n_tokens = 600}));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
        ASSERT_EQ_U64(lr.tokens, with_interval ? 384 : 0);
        ASSERT_OK(kvo_connector_abort(s.c, 2));
        sim_destroy(&s);
    }
}

/* The connector's hash map against a direct-indexed reference: random puts,
 * gets and deletes (backward-shift deletion keeps every key reachable). */
KVO_TEST(map_matches_reference) {
    enum { K = 3000 };
    static uint64_t ref[K];
    static bool have[K];
    memset(have, 0, sizeof have);
    kvo__map m;
    ASSERT_OK(kvo__map_init(&m, 4));
    size_t n = 0;
    for (int op = 0; op < 200000; op++) {
        uint64_t k = kvo_test_rand() % K;
        uint64_t key = k * 64 + (k % 7); /* clustered keys like block ids */
        int what = (int)(kvo_test_rand() % 3);
        if (what == 0) {
            kvo__map_entry *e = NULL;
            int rc = kvo__map_put(&m, key, &e);
            ASSERT_EQ_INT(rc, have[k] ? 1 : 0);
            if (!have[k]) n++;
            have[k] = true;
            e->a = ref[k] = kvo_test_rand();
        } else if (what == 1) {
            kvo__map_entry *e = kvo__map_get(&m, key);
            if (have[k]) {
                ASSERT_NOT_NULL(e);
                ASSERT_EQ_U64(e->a, ref[k]);
                kvo__map_del(&m, e);
                have[k] = false;
                n--;
            } else {
                ASSERT_NULL(e);
            }
        } else {
            kvo__map_entry *e = kvo__map_get(&m, key);
            ASSERT_EQ_INT(e != NULL, have[k]);
            if (e) ASSERT_EQ_U64(e->a, ref[k]);
        }
        ASSERT_EQ_U64(m.n, n);
    }
    for (uint64_t k = 0; k < K; k++) {
        kvo__map_entry *e = kvo__map_get(&m, k * 64 + (k % 7));
        ASSERT_EQ_INT(e != NULL, have[k]);
    }
    ASSERT_OK(kvo__map_reserve(&m, 1000));
    size_t cap = m.cap;
    for (uint64_t k = 0; k < 1000; k++) {
        kvo__map_entry *e;
        ASSERT_GE_INT(kvo__map_put(&m, UINT64_C(1) << 40 | k, &e), 0);
    }
    ASSERT_EQ_U64(m.cap, cap); /* reserved room: no growth */
    kvo__map_free(&m);
}
