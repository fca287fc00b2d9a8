/* The lookup agreement rule (kvo_agree): hand-computed cases and a brute-force
 * cross-check over random group mixes. */
#include <stdlib.h>

#include "kvo_test.h"

typedef struct tgroup {
    const char *name;
    kvo_group_kind kind;
    uint32_t tpb;
    uint32_t window;
    uint32_t bpc; /* 0: not cacheable */
    bool draft;
} tgroup;

static kvo_plan *make_plan(uint32_t tph, const tgroup *gs, size_t n) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("t", tph, &m));
    kvo_group_override ov[KVO_MAX_GROUPS];
    size_t nov = 0;
    for (size_t i = 0; i < n; i++) {
        kvo_group_desc g = kvo_group_desc_default();
        snprintf(g.name, sizeof g.name, "%s", gs[i].name);
        g.kind = gs[i].kind;
        g.tokens_per_block = gs[i].tpb;
        g.layers = 1;
        g.page_bytes = 64;
        g.window = gs[i].kind == KVO_GROUP_SLIDING ? gs[i].window : 0;
        g.cacheable = gs[i].bpc != 0;
        g.draft = gs[i].draft;
        ASSERT_OK(kvo_model_add_group(m, &g));
        if (gs[i].bpc) ov[nov++] = (kvo_group_override){gs[i].name, gs[i].bpc};
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.overrides = ov;
    pp.n_overrides = nov;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    return p;
}

/* Chunk states from strings: R ready, P pending, M/. miss, L local. */
typedef struct tstates {
    uint8_t st[KVO_MAX_GROUPS][512];
    const uint8_t *ptr[KVO_MAX_GROUPS];
    size_t n[KVO_MAX_GROUPS];
} tstates;

static void set_states(tstates *s, size_t g, const char *str) {
    size_t n = strlen(str);
    for (size_t i = 0; i < n; i++)
        s->st[g][i] = str[i] == 'R' ? KVO_READY : str[i] == 'P' ? KVO_PENDING : str[i] == 'L' ? KVO_CHUNK_LOCAL : KVO_MISS;
    s->ptr[g] = s->st[g];
    s->n[g] = n;
}

static void fill_states(tstates *s, size_t g, size_t n, uint8_t v) {
    for (size_t i = 0; i < n; i++) s->st[g][i] = v;
    s->ptr[g] = s->st[g];
    s->n[g] = n;
}

static kvo_agree_result agree(const kvo_plan *p, tstates *s, uint64_t n_tokens, uint64_t local, uint64_t min_hit,
                              uint64_t scratch) {
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    in.plan = p;
    in.n_tokens = n_tokens;
    in.local_tokens = local;
    in.min_hit_tokens = min_hit;
    in.scratch_groups = scratch;
    in.chunk_states = s->ptr;
    in.n_chunks = s->n;
    kvo_agree_result r;
    ASSERT_OK(kvo_agree(&in, &r));
    return r;
}

KVO_TEST(single_full_group) {
    tgroup gs[] = {{"attn", KVO_GROUP_FULL, 16, 0, 4, false}}; /* T = 64 */
    kvo_plan *p = make_plan(16, gs, 1);
    ASSERT_EQ_U64(kvo_agree_step(p), 16);
    tstates s;
    memset(&s, 0, sizeof s);
    set_states(&s, 0, "RRRR"); /* 300 tokens: 4 complete chunks */
    kvo_agree_result r = agree(p, &s, 300, 0, 0, 0);
    /* b_max = 288 needs chunk 4 (incomplete) -> lowered to 256 */
    ASSERT_EQ_U64(r.tokens, 256);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_LOWERED);
    ASSERT_EQ_U64(r.tokens_if_pending, 256);
    /* 257 tokens: 256 exactly, the last token computed */
    ASSERT_EQ_U64(agree(p, &s, 257, 0, 0, 0).tokens, 256);
    /* 256 tokens: the last token is computed: 240 (a partial last chunk) */
    r = agree(p, &s, 256, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 240);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_OK);
    set_states(&s, 0, "RRMR");
    ASSERT_EQ_U64(agree(p, &s, 300, 0, 0, 0).tokens, 128);
    set_states(&s, 0, "MRRR");
    r = agree(p, &s, 300, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_INT(r.limiting_group, 0);
    /* the engine holds chunk 0 already: it is not needed */
    r = agree(p, &s, 300, 64, 0, 0);
    ASSERT_EQ_U64(r.tokens, 256);
    /* local 80: chunk 1 is needed from token 80 on */
    set_states(&s, 0, "MMRR");
    ASSERT_EQ_U64(agree(p, &s, 300, 80, 0, 0).tokens, 80);
    /* a hit shorter than a chunk counts as none */
    set_states(&s, 0, "RMRR");
    r = agree(p, &s, 300, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 64);
    r = agree(p, &s, 300, 0, 65, 0);
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_TOO_SHORT);
    /* a prompt of one step + 1 token or less cannot hit */
    set_states(&s, 0, "R");
    ASSERT_EQ_INT(agree(p, &s, 16, 0, 1, 0).reason, KVO_AGREE_NO_PROMPT);
    ASSERT_EQ_U64(agree(p, &s, 17, 0, 1, 0).tokens, 16);
    kvo_plan_destroy(p);
}

KVO_TEST(pending_is_ask_again) {
    tgroup gs[] = {{"attn", KVO_GROUP_FULL, 16, 0, 4, false}};
    kvo_plan *p = make_plan(16, gs, 1);
    tstates s;
    memset(&s, 0, sizeof s);
    set_states(&s, 0, "RRPR");
    kvo_agree_result r = agree(p, &s, 300, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 128);
    ASSERT_EQ_U64(r.tokens_if_pending, 256);
    set_states(&s, 0, "PRRR");
    r = agree(p, &s, 300, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_U64(r.tokens_if_pending, 256);
    /* a pending chunk past a miss does not matter */
    set_states(&s, 0, "RMPR");
    r = agree(p, &s, 300, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 64);
    ASSERT_EQ_U64(r.tokens_if_pending, 64);
    kvo_plan_destroy(p);
}

/* gemma-like, scaled down: sliding 16-token chunks, window 64; full 128-token
 * chunks; step 64. */
KVO_TEST(sliding_window_at_chunk_boundaries) {
    tgroup gs[] = {{"sliding", KVO_GROUP_SLIDING, 16, 64, 1, false}, {"full", KVO_GROUP_FULL, 64, 0, 2, false}};
    kvo_plan *p = make_plan(16, gs, 2);
    ASSERT_EQ_U64(kvo_agree_step(p), 64);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->window_chunks, 5);
    tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 62, KVO_READY); /* 1000 tokens: 62 sliding chunks */
    fill_states(&s, 1, 7, KVO_READY);  /* 7 full chunks (896 tokens) */
    kvo_agree_result r = agree(p, &s, 1000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 896); /* b_max 960 needs full chunk 7 */
    ASSERT_EQ_INT(r.limiting_group, 1);
    /* the sliding group needs only chunks 52..55 for b = 896 */
    fill_states(&s, 0, 62, KVO_MISS);
    for (int c = 52; c <= 55; c++) s.st[0][c] = KVO_READY;
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 896);
    /* chunk 51 just before the window does not matter; chunk 52 does */
    s.st[0][51] = KVO_MISS;
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 896);
    s.st[0][52] = KVO_MISS;
    r = agree(p, &s, 1000, 0, 0, 0);
    /* 52*16 = 832 -> the window [768,832) = chunks 48..51 misses -> ... -> 0 */
    ASSERT_EQ_U64(r.tokens, 0);
    /* stored windows only at 768: chunks 44..47 */
    fill_states(&s, 0, 62, KVO_MISS);
    for (int c = 44; c <= 47; c++) s.st[0][c] = KVO_READY;
    r = agree(p, &s, 1000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 768);
    ASSERT_EQ_INT(r.limiting_group, 0);
    ASSERT_GE_U64(r.rounds, 2);
    /* a window kept one chunk short (the peer's bug): 45..47 -> no hit at 768 */
    s.st[0][44] = KVO_MISS;
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 0);
    kvo_plan_destroy(p);

    /* window 65: one token more reaches into a fifth chunk */
    tgroup gs2[] = {{"sliding", KVO_GROUP_SLIDING, 16, 65, 1, false}, {"full", KVO_GROUP_FULL, 64, 0, 2, false}};
    p = make_plan(16, gs2, 2);
    fill_states(&s, 0, 62, KVO_MISS);
    for (int c = 52; c <= 55; c++) s.st[0][c] = KVO_READY;
    fill_states(&s, 1, 7, KVO_READY);
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 0);
    s.st[0][51] = KVO_READY;
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 896);
    kvo_plan_destroy(p);
    /* window 48: exactly three chunks before an aligned boundary */
    tgroup gs3[] = {{"sliding", KVO_GROUP_SLIDING, 16, 48, 1, false}, {"full", KVO_GROUP_FULL, 64, 0, 2, false}};
    p = make_plan(16, gs3, 2);
    fill_states(&s, 0, 62, KVO_MISS);
    for (int c = 53; c <= 55; c++) s.st[0][c] = KVO_READY;
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 896);
    /* the engine holds [0, 832): the window [848, 896) is still needed */
    ASSERT_EQ_U64(agree(p, &s, 1000, 832, 1, 0).tokens, 896);
    s.st[0][53] = KVO_MISS;
    ASSERT_EQ_U64(agree(p, &s, 1000, 832, 1, 0).tokens, 832);
    ASSERT_EQ_U64(kvo_agree_step(p), 64);
    ASSERT_EQ_U64(agree(p, &s, 1000, 0, 0, 0).tokens, 0);
    kvo_plan_destroy(p);
}

/* qwen3-next-like: full T=64 and a state group of 512-token blocks. */
KVO_TEST(state_group_needs_only_the_boundary_state) {
    tgroup gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, false}, {"state", KVO_GROUP_STATE, 512, 0, 1, false}};
    kvo_plan *p = make_plan(16, gs, 2);
    ASSERT_EQ_U64(kvo_agree_step(p), 512);
    tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 25, KVO_READY); /* 1600 tokens */
    set_states(&s, 1, "RRR");
    kvo_agree_result r = agree(p, &s, 1600, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 1536);
    set_states(&s, 1, "RRM");
    ASSERT_EQ_U64(agree(p, &s, 1600, 0, 0, 0).tokens, 1024);
    set_states(&s, 1, "MMR"); /* only the state at 1536 is needed */
    ASSERT_EQ_U64(agree(p, &s, 1600, 0, 0, 0).tokens, 1536);
    set_states(&s, 1, "RMM");
    ASSERT_EQ_U64(agree(p, &s, 1600, 0, 0, 0).tokens, 512);
    s.st[0][3] = KVO_MISS; /* full group misses [192, 256): nothing */
    ASSERT_EQ_U64(agree(p, &s, 1600, 0, 0, 0).tokens, 0);
    kvo_plan_destroy(p);

    /* a state group with 2 snapshots per chunk: block 128, chunk 256 */
    tgroup gs2[] = {{"full", KVO_GROUP_FULL, 16, 0, 4, false}, {"state", KVO_GROUP_STATE, 128, 0, 2, false}};
    p = make_plan(16, gs2, 2);
    fill_states(&s, 0, 25, KVO_READY);
    set_states(&s, 1, "RRRRRR"); /* 6 complete chunks = 1536 tokens */
    r = agree(p, &s, 1600, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 1536); /* snapshot after token 1536: block 11, chunk 5 */
    set_states(&s, 1, "RRRRRM");
    ASSERT_EQ_U64(agree(p, &s, 1600, 0, 0, 0).tokens, 1280); /* chunk 4's last block */
    kvo_plan_destroy(p);
}

/* glm-like, scaled down: a 4-token group under a 64-token hash, a state
 * group and a draft group. */
KVO_TEST(small_blocks_under_large_hash_and_draft) {
    tgroup gs[] = {{"mla", KVO_GROUP_FULL, 128, 0, 1, false},
                   {"tail", KVO_GROUP_FULL, 4, 0, 16, false},
                   {"state", KVO_GROUP_STATE, 128, 0, 1, false},
                   {"draft", KVO_GROUP_FULL, 32, 0, 2, true}};
    kvo_plan *p = make_plan(64, gs, 4);
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->tokens_per_chunk, 64);
    ASSERT_EQ_U64(kvo_agree_step(p), 128);
    tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 5, KVO_READY);  /* 700 tokens */
    fill_states(&s, 1, 10, KVO_READY);
    fill_states(&s, 2, 5, KVO_READY);
    fill_states(&s, 3, 10, KVO_READY);
    ASSERT_EQ_U64(agree(p, &s, 700, 0, 0, 0).tokens, 640);
    s.st[1][7] = KVO_MISS; /* tail misses [448, 512) */
    kvo_agree_result r = agree(p, &s, 700, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 384);
    ASSERT_EQ_INT(r.limiting_group, 1);
    s.st[1][7] = KVO_READY;
    s.st[3][3] = KVO_MISS; /* draft misses [192, 256) */
    r = agree(p, &s, 700, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 128);
    ASSERT_EQ_INT(r.limiting_group, 3);
    s.st[3][3] = KVO_READY;
    s.st[2][2] = KVO_MISS; /* state at 384 missing: 640 still fine */
    ASSERT_EQ_U64(agree(p, &s, 700, 0, 0, 0).tokens, 640);
    s.st[2][4] = KVO_MISS; /* state at 640 missing -> 512 */
    ASSERT_EQ_U64(agree(p, &s, 700, 0, 0, 0).tokens, 512);
    kvo_plan_destroy(p);
}

/* deepseek-like, scaled: a non-cacheable 8-token circular group. */
KVO_TEST(noncacheable_group) {
    tgroup gs[] = {{"mla", KVO_GROUP_FULL, 32, 0, 2, false},
                   {"swa", KVO_GROUP_SLIDING, 32, 128, 1, false},
                   {"circular", KVO_GROUP_SLIDING, 8, 8, 0, false}};
    kvo_plan *p = make_plan(32, gs, 3);
    ASSERT_FALSE(kvo_plan_group(p, 2)->offloaded);
    ASSERT_EQ_U64(kvo_agree_step(p), 32);
    tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 7, KVO_READY); /* 500 tokens: 7 chunks of 64 */
    fill_states(&s, 1, 15, KVO_READY);
    kvo_agree_result r = agree(p, &s, 500, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 0); /* conservative default: no hit */
    ASSERT_EQ_INT(r.reason, KVO_AGREE_NONCACHEABLE);
    ASSERT_EQ_INT(r.limiting_group, 2);
    r = agree(p, &s, 500, 0, 0, UINT64_C(1) << 2); /* declared scratch */
    ASSERT_EQ_U64(r.tokens, 448);
    /* the sliding group's window is 4 chunks: [320, 448) = chunks 10..13 */
    fill_states(&s, 1, 15, KVO_MISS);
    for (int c = 10; c <= 13; c++) s.st[1][c] = KVO_READY;
    ASSERT_EQ_U64(agree(p, &s, 500, 0, 0, UINT64_C(1) << 2).tokens, 448);
    kvo_plan_destroy(p);
}

KVO_TEST(bad_input) {
    tgroup gs[] = {{"attn", KVO_GROUP_FULL, 16, 0, 4, false}};
    kvo_plan *p = make_plan(16, gs, 1);
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    kvo_agree_result r;
    ASSERT_ERR(kvo_agree(NULL, &r), KVO_EINVAL);
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    in.plan = p;
    in.n_tokens = 100;
    in.local_tokens = 8;
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "multiple");
    in.local_tokens = 0;
    size_t n[1] = {3};
    in.n_chunks = n;
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "attn");
    in.n_chunks = NULL; /* no states at all: everything misses */
    ASSERT_OK(kvo_agree(&in, &r));
    ASSERT_EQ_U64(r.tokens, 0);
    kvo_plan_destroy(p);
}

/* Brute force: the rule as written, every candidate from the top. */
static bool serves(const kvo_plan *p, const tstates *s, size_t g, uint64_t b, uint64_t L, bool pend) {
    const kvo_group_plan *gp = kvo_plan_group(p, g);
    uint64_t T = gp->tokens_per_chunk;
    if (b <= L) return true;
    uint64_t from = 0, to = b;
    if (gp->kind == KVO_GROUP_SLIDING) from = b > gp->window ? b - gp->window : 0;
    if (gp->kind == KVO_GROUP_STATE) {
        uint64_t c = (b / gp->tokens_per_block - 1) / gp->blocks_per_chunk;
        if (c >= s->n[g]) return false;
        uint8_t v = s->st[g][c];
        return v == KVO_READY || (pend && v == KVO_PENDING);
    }
    if (from < L) from = L;
    for (uint64_t c = 0; c * T < to; c++) {
        if ((c + 1) * T <= from) continue;
        if (c >= s->n[g]) return false;
        uint8_t v = s->st[g][c];
        if (!(v == KVO_READY || (pend && v == KVO_PENDING))) return false;
    }
    return true;
}

static uint64_t brute(const kvo_plan *p, const tstates *s, uint64_t N, uint64_t L, bool pend, uint64_t scratch) {
    uint64_t S = kvo_agree_step(p);
    size_t ng = kvo_plan_num_groups(p);
    for (size_t g = 0; g < ng; g++)
        if (!kvo_plan_group(p, g)->offloaded && !((scratch >> g) & 1)) return L;
    if (N == 0) return L;
    uint64_t minhit = 0;
    for (size_t g = 0; g < ng; g++)
        if (kvo_plan_group(p, g)->offloaded && kvo_plan_group(p, g)->tokens_per_chunk > minhit)
            minhit = kvo_plan_group(p, g)->tokens_per_chunk;
    for (uint64_t b = (N - 1) / S * S; b > L; b -= S) {
        bool ok = true;
        for (size_t g = 0; g < ng && ok; g++)
            if (kvo_plan_group(p, g)->offloaded) ok = serves(p, s, g, b, L, pend);
        if (ok) return b - L >= minhit ? b : L;
    }
    return L;
}

KVO_TEST(random_mixes_match_brute_force) {
    static const uint32_t tpbs[] = {1, 2, 4, 8, 16, 32, 64};
    int checked = 0;
    for (int iter = 0; iter < 3000; iter++) {
        size_t ng = 1 + kvo_test_rand() % 5;
        uint32_t tph = (uint32_t[]){1, 4, 16}[kvo_test_rand() % 3];
        tgroup gs[8];
        char names[8][8];
        for (size_t g = 0; g < ng; g++) {
            snprintf(names[g], sizeof names[g], "g%zu", g);
            gs[g].name = names[g];
            gs[g].kind = (kvo_group_kind)(kvo_test_rand() % 3);
            gs[g].tpb = tpbs[kvo_test_rand() % 7];
            gs[g].window = gs[g].kind == KVO_GROUP_SLIDING ? 1 + (uint32_t)(kvo_test_rand() % 200) : 0;
            uint32_t minb = gs[g].tpb >= tph ? 1 : tph / gs[g].tpb;
            gs[g].bpc = minb * (1 + (uint32_t)(kvo_test_rand() % 3));
            if (kvo_test_rand() % 12 == 0) gs[g].bpc = 0;
            gs[g].draft = kvo_test_rand() % 8 == 0;
        }
        kvo_plan *p = make_plan(tph, gs, ng);
        uint64_t S = kvo_agree_step(p);
        uint64_t N = kvo_test_rand() % 1200;
        uint64_t L = (N && kvo_test_rand() % 3 == 0) ? (kvo_test_rand() % N) / S * S : 0;
        static tstates s;
        memset(&s, 0, sizeof s);
        int miss_rate = 1 + (int)(kvo_test_rand() % 10);
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded) continue;
            size_t nc = N / gp->tokens_per_chunk;
            if (nc > 512) nc = 512;
            for (size_t c = 0; c < nc; c++) {
                uint64_t r = kvo_test_rand() % 100;
                s.st[g][c] = (int)r < miss_rate ? KVO_MISS : (int)r < 2 * miss_rate ? KVO_PENDING : KVO_READY;
            }
            s.ptr[g] = s.st[g];
            s.n[g] = nc;
        }
        uint64_t scratch = kvo_test_rand() % 2 ? ~UINT64_C(0) : 0;
        kvo_agree_input in;
        memset(&in, 0, sizeof in);
        in.plan = p;
        in.n_tokens = N;
        in.local_tokens = L;
        in.scratch_groups = scratch;
        in.chunk_states = s.ptr;
        in.n_chunks = s.n;
        kvo_agree_result r;
        ASSERT_OK(kvo_agree(&in, &r));
        uint64_t e_now = brute(p, &s, N, L, false, scratch);
        uint64_t e_pend = brute(p, &s, N, L, true, scratch);
        if (e_pend < e_now) e_pend = e_now;
        if (r.tokens != e_now || r.tokens_if_pending != e_pend)
            FAILF("iter %d: N %llu L %llu step %llu: got %llu/%llu expected %llu/%llu", iter,
                  (unsigned long long)N, (unsigned long long)L, (unsigned long long)S,
                  (unsigned long long)r.tokens, (unsigned long long)r.tokens_if_pending,
                  (unsigned long long)e_now, (unsigned long long)e_pend);
        if (r.tokens > L) {
            ASSERT_EQ_U64(r.tokens % S, 0);
            ASSERT_LT_U64(r.tokens, N);
            checked++;
        }
        kvo_plan_destroy(p);
    }
    ASSERT_GT_INT(checked, 100); /* the generator produced real hits */
}

/* ------------------------------------------------ docs/lookup.md examples -- */

static kvo_plan *preset_plan(const char *name) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset(name, &m));
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, NULL, &p));
    kvo_model_destroy(m);
    return p;
}

KVO_TEST(docs_example_gemma) {
    kvo_plan *p = preset_plan("gemma-4-31b-like");
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->tokens_per_chunk, 16);  /* sliding */
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->tokens_per_chunk, 128); /* full */
    ASSERT_EQ_U64(kvo_agree_step(p), 64);
    static tstates s;
    memset(&s, 0, sizeof s);
    /* a previous turn computed 4700 tokens: 293 sliding chunks, 36 full */
    fill_states(&s, 0, 293, KVO_READY);
    fill_states(&s, 1, 36, KVO_READY);
    kvo_agree_result r = agree(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 4608);
    ASSERT_EQ_U64(r.rounds, 2);
    /* the host evicted sliding chunks 250..270 */
    for (int c = 250; c <= 270; c++) s.st[0][c] = KVO_MISS;
    r = agree(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 3968);
    ASSERT_EQ_INT(r.limiting_group, 0);
    /* back to all present, and full chunk 36 still being written */
    fill_states(&s, 0, 293, KVO_READY);
    fill_states(&s, 1, 37, KVO_READY);
    s.st[1][36] = KVO_PENDING;
    r = agree(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 4608);
    ASSERT_EQ_U64(r.tokens_if_pending, 4672);
    kvo_plan_destroy(p);
}

KVO_TEST(docs_example_deepseek) {
    kvo_plan *p = preset_plan("deepseek-v4-flash-like");
    ASSERT_EQ_U64(kvo_agree_step(p), 64);
    ASSERT_FALSE(kvo_plan_group(p, 8)->offloaded);
    static tstates s;
    memset(&s, 0, sizeof s);
    /* a previous turn computed 2600 tokens */
    for (size_t g = 0; g < 3; g++) fill_states(&s, g, 5, KVO_READY);  /* mla0-2: 512-token chunks */
    fill_states(&s, 3, 2, KVO_READY);                                   /* mla3: 1024 */
    for (size_t g = 4; g < 7; g++) fill_states(&s, g, 10, KVO_READY); /* swa0-2: 256 */
    fill_states(&s, 7, 2, KVO_READY);                                   /* indexer: 1024 */
    uint64_t scratch = UINT64_C(1) << 8;
    kvo_agree_result r = agree(p, &s, 3000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_NONCACHEABLE);
    r = agree(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 2048);
    ASSERT_EQ_U64(r.rounds, 2);
    s.st[4][7] = KVO_MISS; /* swa0 lost [1792, 2048) */
    r = agree(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 1792);
    ASSERT_EQ_INT(r.limiting_group, 4);
    s.st[4][7] = KVO_PENDING;
    r = agree(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 1792);
    ASSERT_EQ_U64(r.tokens_if_pending, 2048);
    s.st[4][7] = KVO_READY;
    s.st[0][4] = KVO_PENDING; /* mla0 [2048, 2560) in flight: does not matter */
    r = agree(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 2048);
    ASSERT_EQ_U64(r.tokens_if_pending, 2048);
    /* a 1000-token prompt: 960 < one 1024-token chunk: no hit */
    r = agree(p, &s, 1000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_TOO_SHORT);
    kvo_plan_destroy(p);
}
