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
    /* extra state snapshots at any position (state groups) */
    kvo_agree_snapshot snap[KVO_MAX_GROUPS][32];
    const kvo_agree_snapshot *sptr[KVO_MAX_GROUPS];
    size_t ns[KVO_MAX_GROUPS];
} tstates;

static void add_snapshot(tstates *s, size_t g, uint64_t tokens, uint8_t state) {
    s->snap[g][s->ns[g]++] = (kvo_agree_snapshot){tokens, state};
    s->sptr[g] = s->snap[g];
}

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

static kvo_agree_input agree_input(const kvo_plan *p, tstates *s, uint64_t n_tokens, uint64_t local,
                                   uint64_t min_hit, uint64_t scratch, uint64_t align) {
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    in.plan = p;
    in.n_tokens = n_tokens;
    in.local_tokens = local;
    in.min_hit_tokens = min_hit;
    in.scratch_groups = scratch;
    in.boundary_align = align;
    in.chunk_states = s->ptr;
    in.n_chunks = s->n;
    in.snapshots = s->sptr;
    in.n_snapshots = s->ns;
    return in;
}

static kvo_agree_result agree_a(const kvo_plan *p, tstates *s, uint64_t n_tokens, uint64_t local, uint64_t min_hit,
                                uint64_t scratch, uint64_t align) {
    kvo_agree_input in = agree_input(p, s, n_tokens, local, min_hit, scratch, align);
    kvo_agree_result r;
    ASSERT_OK(kvo_agree(&in, &r));
    return r;
}

/* agree: the step-aligned rule (boundary_align 0: hits at multiples of the
 * lcm of every tokens_per_block, for loaders that copy only whole blocks);
 * agree1: the token-granular rule (boundary_align 1: any token count). */
#define agree(p, s, n, l, m, x) agree_a(p, s, n, l, m, x, 0)
#define agree1(p, s, n, l, m, x) agree_a(p, s, n, l, m, x, 1)

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
    /* the token rule: everything but the last token (docs/lookup.md table) */
    r = agree1(p, &s, 256, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 255);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_OK);
    ASSERT_EQ_U64(agree1(p, &s, 300, 0, 0, 0).tokens, 256);
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
    /* the draft group also needs the chunk holding token b: 640 would need
     * draft chunk 10, [640, 704), beyond the prompt */
    ASSERT_EQ_U64(agree(p, &s, 700, 0, 0, 0).tokens, 512);
    ASSERT_EQ_INT(agree(p, &s, 700, 0, 0, 0).limiting_group, 3);
    fill_states(&s, 3, 11, KVO_READY); /* a 705-token prompt has it */
    ASSERT_EQ_U64(agree(p, &s, 705, 0, 0, 0).tokens, 640);
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
    ASSERT_EQ_U64(agree(p, &s, 705, 0, 0, 0).tokens, 640);
    s.st[2][4] = KVO_MISS; /* state at 640 missing -> 512 */
    ASSERT_EQ_U64(agree(p, &s, 705, 0, 0, 0).tokens, 512);
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
static bool st_ok(uint8_t v, bool pend) {
    return v == KVO_READY || v == KVO_CHUNK_LOCAL || (pend && v == KVO_PENDING);
}

static bool serves(const kvo_plan *p, const tstates *s, size_t g, uint64_t b, uint64_t L, bool pend) {
    const kvo_group_plan *gp = kvo_plan_group(p, g);
    uint64_t T = gp->tokens_per_chunk;
    if (b <= L) return true;
    if (gp->kind == KVO_GROUP_STATE) {
        /* a snapshot exactly at b: a block boundary or an extra snapshot */
        if (b % gp->tokens_per_block == 0) {
            uint64_t c = (b / gp->tokens_per_block - 1) / gp->blocks_per_chunk;
            if (c < s->n[g] && st_ok(s->st[g][c], pend)) return true;
        }
        for (size_t i = 0; i < s->ns[g]; i++)
            if (s->snap[g][i].tokens == b && st_ok(s->snap[g][i].state, pend)) return true;
        return false;
    }
    uint64_t from = 0;
    if (gp->kind == KVO_GROUP_SLIDING) from = b > gp->window ? b - gp->window : 0;
    if (from < L) from = L;
    /* every chunk with a token in [from, b): the last one may be partly
     * needed; a draft group's range also holds token b */
    for (uint64_t c = 0; c * T < b + gp->draft; c++) {
        if ((c + 1) * T <= from) continue;
        if (c >= s->n[g] || !st_ok(s->st[g][c], pend)) return false;
    }
    return true;
}

/* align 0: the step; min_hit 0: the largest offloaded chunk. */
static uint64_t brute(const kvo_plan *p, const tstates *s, uint64_t N, uint64_t L, bool pend, uint64_t scratch,
                      uint64_t align, uint64_t min_hit) {
    uint64_t A = align ? align : kvo_agree_step(p);
    size_t ng = kvo_plan_num_groups(p);
    for (size_t g = 0; g < ng; g++)
        if (!kvo_plan_group(p, g)->offloaded && !((scratch >> g) & 1)) return L;
    if (N == 0) return L;
    uint64_t minhit = min_hit;
    for (size_t g = 0; g < ng && !min_hit; g++)
        if (kvo_plan_group(p, g)->offloaded && kvo_plan_group(p, g)->tokens_per_chunk > minhit)
            minhit = kvo_plan_group(p, g)->tokens_per_chunk;
    for (uint64_t b = (N - 1) / A * A; b > L; b -= A) {
        bool ok = true;
        for (size_t g = 0; g < ng && ok; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            ok = gp->offloaded ? serves(p, s, g, b, L, pend) : b % gp->tokens_per_block == 0; /* scratch */
        }
        if (ok) return b - L >= minhit ? b : L;
    }
    return L;
}

/* Random chunk states for group g: independent misses, a stored prefix, or
 * alternating runs; PENDING sprinkled in; LOCAL for chunks below L. */
static void random_states(tstates *s, size_t g, size_t nc, uint64_t T, uint64_t L) {
    int pattern = (int)(kvo_test_rand() % 3);
    int miss_rate = 1 + (int)(kvo_test_rand() % 10);
    size_t prefix = nc ? (size_t)(kvo_test_rand() % (nc + 1)) : 0;
    uint8_t run = KVO_READY;
    size_t run_left = 1 + kvo_test_rand() % 8;
    for (size_t c = 0; c < nc; c++) {
        uint8_t v = KVO_READY;
        uint64_t r = kvo_test_rand() % 100;
        if (pattern == 0) v = (int)r < miss_rate ? KVO_MISS : (int)r < 2 * miss_rate ? KVO_PENDING : KVO_READY;
        else if (pattern == 1) v = c < prefix ? ((int)r < miss_rate ? KVO_PENDING : KVO_READY) : KVO_MISS;
        else {
            if (run_left-- == 0) {
                run = run == KVO_READY ? (r % 4 ? KVO_MISS : KVO_PENDING) : KVO_READY;
                run_left = 1 + kvo_test_rand() % 8;
            }
            v = run;
        }
        if ((c + 1) * T <= L && kvo_test_rand() % 2) v = KVO_CHUNK_LOCAL;
        s->st[g][c] = v;
    }
    s->ptr[g] = s->st[g];
    s->n[g] = nc;
}

typedef struct mixspec {
    const uint32_t *tpbs;
    size_t n_tpbs;
    const uint32_t *tphs;
    size_t n_tphs;
    bool token_granular; /* align 1 (mostly) and extra snapshots; else align 0 */
    uint64_t max_tokens;
} mixspec;

static void check_random_mixes(const mixspec *ms, int iters) {
    int checked = 0, unaligned = 0;
    for (int iter = 0; iter < iters; iter++) {
        size_t ng = 1 + kvo_test_rand() % 5;
        uint32_t tph = ms->tphs[kvo_test_rand() % ms->n_tphs];
        tgroup gs[8];
        char names[8][8];
        for (size_t g = 0; g < ng; g++) {
            snprintf(names[g], sizeof names[g], "g%zu", g);
            gs[g].name = names[g];
            gs[g].kind = (kvo_group_kind)(kvo_test_rand() % 3);
            gs[g].tpb = ms->tpbs[kvo_test_rand() % ms->n_tpbs];
            gs[g].window = gs[g].kind == KVO_GROUP_SLIDING ? 1 + (uint32_t)(kvo_test_rand() % 200) : 0;
            uint64_t l = gs[g].tpb, t = tph, a = l, b = t;
            while (b) {
                uint64_t r = a % b;
                a = b;
                b = r;
            }
            uint32_t minb = (uint32_t)(l / a * t / l); /* lcm(tpb, tph) / tpb */
            gs[g].bpc = minb * (1 + (uint32_t)(kvo_test_rand() % 3));
            if (kvo_test_rand() % 12 == 0) gs[g].bpc = 0;
            gs[g].draft = kvo_test_rand() % 8 == 0;
        }
        kvo_plan *p = make_plan(tph, gs, ng);
        uint64_t S = kvo_agree_step(p);
        uint64_t A = 0;
        if (ms->token_granular) A = kvo_test_rand() % 8 ? 1 : 1 + kvo_test_rand() % 24;
        uint64_t AA = A ? A : S;
        uint64_t N = kvo_test_rand() % ms->max_tokens;
        uint64_t L = (N && kvo_test_rand() % 3 == 0) ? (kvo_test_rand() % N) / AA * AA : 0;
        static tstates s;
        memset(&s, 0, sizeof s);
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded) continue;
            size_t nc = N / gp->tokens_per_chunk;
            if (nc > 512) nc = 512;
            random_states(&s, g, nc, gp->tokens_per_chunk, L);
            if (ms->token_granular && gp->kind == KVO_GROUP_STATE && N > 1 && kvo_test_rand() % 2) {
                /* extra snapshots at random positions, ascending */
                uint64_t at = 0;
                for (int k = 0; k < 8; k++) {
                    at += 1 + kvo_test_rand() % (N / 4 + 1);
                    if (at >= N) break;
                    uint64_t r = kvo_test_rand() % 4;
                    add_snapshot(&s, g, at, r == 0 ? KVO_MISS : r == 1 ? KVO_PENDING : KVO_READY);
                }
            }
        }
        uint64_t scratch = kvo_test_rand() % 2 ? ~UINT64_C(0) : 0;
        uint64_t min_hit = kvo_test_rand() % 4 == 0 ? 1 + kvo_test_rand() % 64 : 0;
        kvo_agree_input in = agree_input(p, &s, N, L, min_hit, scratch, A);
        kvo_agree_result r;
        ASSERT_OK(kvo_agree(&in, &r));
        uint64_t e_now = brute(p, &s, N, L, false, scratch, A, min_hit);
        uint64_t e_pend = brute(p, &s, N, L, true, scratch, A, min_hit);
        if (e_pend < e_now) e_pend = e_now;
        if (r.tokens != e_now || r.tokens_if_pending != e_pend)
            FAILF("iter %d: N %llu L %llu align %llu step %llu: got %llu/%llu expected %llu/%llu", iter,
                  (unsigned long long)N, (unsigned long long)L, (unsigned long long)A, (unsigned long long)S,
                  (unsigned long long)r.tokens, (unsigned long long)r.tokens_if_pending,
                  (unsigned long long)e_now, (unsigned long long)e_pend);
        /* bounded work: every lowering passes a failing chunk or snapshot */
        ASSERT_LE_U64(r.rounds, N + 2);
        if (r.tokens > L) {
            ASSERT_EQ_U64(r.tokens % AA, 0);
            ASSERT_LT_U64(r.tokens, N);
            checked++;
            if (r.tokens % S) unaligned++;
        }
        kvo_plan_destroy(p);
    }
    ASSERT_GT_INT(checked, iters / 30); /* the generator produced real hits */
    if (ms->token_granular) ASSERT_GT_INT(unaligned, iters / 60); /* ... and hits the old rule could not give */
}

KVO_TEST(random_mixes_match_brute_force) {
    static const uint32_t tpbs[] = {1, 2, 4, 8, 16, 32, 64};
    static const uint32_t tphs[] = {1, 4, 16};
    mixspec ms = {tpbs, 7, tphs, 3, false, 1200};
    check_random_mixes(&ms, 3000);
}

/* The token-granular rule over co-prime block sizes, with sliding windows,
 * state groups with extra snapshots, scratch groups, PENDING and LOCAL. */
KVO_TEST(random_coprime_mixes_match_brute_force) {
    static const uint32_t tpbs[] = {3, 5, 12, 16, 24, 32, 48, 64};
    static const uint32_t tphs[] = {1, 2, 4, 16};
    mixspec ms = {tpbs, 8, tphs, 4, true, 1500};
    check_random_mixes(&ms, 4000);
}

/* ------------------------------------------- issue 11: vLLM's examples -- */

/* Two full groups with 12- and 16-token blocks (a 4-token hash unit). */
static kvo_plan *plan_12_16(void) {
    tgroup gs[] = {{"a12", KVO_GROUP_FULL, 12, 0, 1, false}, {"b16", KVO_GROUP_FULL, 16, 0, 1, false}};
    return make_plan(4, gs, 2);
}

KVO_TEST(vllm_12_16_prompt_48_all_stored) {
    kvo_plan *p = plan_12_16();
    ASSERT_EQ_U64(kvo_agree_step(p), 48);
    static tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 4, KVO_READY); /* [0, 48) in 12-token chunks */
    fill_states(&s, 1, 3, KVO_READY); /* [0, 48) in 16-token chunks */
    /* before: the step is 48, and 48 > N - 1 */
    ASSERT_EQ_U64(agree(p, &s, 48, 0, 0, 0).tokens, 0);
    /* after: load the blocks covering 48 tokens, recompute only the last */
    kvo_agree_result r = agree1(p, &s, 48, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 47);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_OK);
    /* the 16-token group's last chunk missing: it serves 32, the other 36 */
    s.st[1][2] = KVO_MISS;
    r = agree1(p, &s, 48, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 32);
    ASSERT_EQ_INT(r.limiting_group, 1);
    kvo_plan_destroy(p);
}

KVO_TEST(vllm_12_16_prompt_85_local_48) {
    kvo_plan *p = plan_12_16();
    static tstates s;
    memset(&s, 0, sizeof s);
    /* every complete chunk of the 85-token prompt stored; 48 in the engine */
    fill_states(&s, 0, 7, KVO_READY); /* [0, 84) */
    fill_states(&s, 1, 5, KVO_READY); /* [0, 80) */
    for (int c = 0; c < 4; c++) s.st[0][c] = KVO_CHUNK_LOCAL;
    for (int c = 0; c < 3; c++) s.st[1][c] = KVO_CHUNK_LOCAL;
    ASSERT_EQ_U64(agree(p, &s, 85, 48, 0, 0).tokens, 48); /* before */
    kvo_agree_result r = agree1(p, &s, 85, 48, 0, 0);
    ASSERT_EQ_U64(r.tokens, 80); /* after: the 16-token chunk [80, 96) is not complete */
    ASSERT_EQ_INT(r.limiting_group, 1);
    kvo_plan_destroy(p);
}

/* Full groups with 512- and 1024-token chunks plus a sliding group whose
 * store kept only the windows before 3904 and 3968. */
KVO_TEST(vllm_three_groups_at_3904_3968) {
    tgroup gs[] = {{"full512", KVO_GROUP_FULL, 512, 0, 1, false},
                   {"full1024", KVO_GROUP_FULL, 1024, 0, 1, false},
                   {"swa", KVO_GROUP_SLIDING, 64, 128, 1, false}};
    kvo_plan *p = make_plan(64, gs, 3);
    ASSERT_EQ_U64(kvo_agree_step(p), 1024);
    static tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 9, KVO_READY);  /* [0, 4608) */
    fill_states(&s, 1, 4, KVO_READY);  /* [0, 4096) */
    fill_states(&s, 2, 78, KVO_MISS);  /* 5000 tokens: 78 sliding chunks */
    for (int c = 59; c <= 61; c++) s.st[2][c] = KVO_READY; /* [3776, 3968) */
    ASSERT_EQ_U64(agree(p, &s, 5000, 0, 0, 0).tokens, 0); /* before: 4096, 3072, ... need other windows */
    kvo_agree_result r = agree1(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 3968); /* the 1024-token chunk [3072, 4096) partly needed */
    ASSERT_EQ_INT(r.limiting_group, 2);
    s.st[2][61] = KVO_MISS; /* only the window before 3904 */
    ASSERT_EQ_U64(agree(p, &s, 5000, 0, 0, 0).tokens, 0);
    ASSERT_EQ_U64(agree1(p, &s, 5000, 0, 0, 0).tokens, 3904);
    /* the 512-token chunk [3584, 4096) being written: ask again later */
    s.st[2][61] = KVO_READY;
    s.st[0][7] = KVO_PENDING;
    r = agree1(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 0); /* now: 3584, whose window [3456, 3584) is missing */
    ASSERT_EQ_U64(r.tokens_if_pending, 3968);
    kvo_plan_destroy(p);
}

/* A Mamba hybrid: full attention in 4-token blocks, a state group with
 * 16-token blocks; the previous request stored a snapshot at its end (28). */
KVO_TEST(vllm_mamba_hybrid_snapshot_at_28) {
    tgroup gs[] = {{"attn", KVO_GROUP_FULL, 4, 0, 1, false}, {"mamba", KVO_GROUP_STATE, 16, 0, 1, false}};
    kvo_plan *p = make_plan(4, gs, 2);
    ASSERT_EQ_U64(kvo_agree_step(p), 16);
    static tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 7, KVO_READY); /* [0, 28) */
    fill_states(&s, 1, 1, KVO_READY); /* the snapshot at 16 */
    ASSERT_EQ_U64(agree(p, &s, 40, 0, 1, 0).tokens, 16);  /* before */
    ASSERT_EQ_U64(agree1(p, &s, 40, 0, 1, 0).tokens, 16); /* block snapshots only */
    add_snapshot(&s, 1, 28, KVO_READY);
    kvo_agree_result r = agree1(p, &s, 40, 0, 1, 0);
    ASSERT_EQ_U64(r.tokens, 28);
    /* the step-aligned rule ignores a snapshot off its grid */
    ASSERT_EQ_U64(agree(p, &s, 40, 0, 1, 0).tokens, 16);
    /* a snapshot still being written: 16 now, 28 once it lands */
    s.snap[1][0].state = KVO_PENDING;
    r = agree1(p, &s, 40, 0, 1, 0);
    ASSERT_EQ_U64(r.tokens, 16);
    ASSERT_EQ_U64(r.tokens_if_pending, 28);
    /* a snapshot past the attention prefix cannot be used */
    s.snap[1][0] = (kvo_agree_snapshot){30, KVO_READY};
    ASSERT_EQ_U64(agree1(p, &s, 40, 0, 1, 0).tokens, 16);
    kvo_plan_destroy(p);
}

/* Scratch groups keep hits on their block grid under the token rule. */
KVO_TEST(token_rule_scratch_and_bad_input) {
    tgroup gs[] = {{"mla", KVO_GROUP_FULL, 32, 0, 2, false},
                   {"state", KVO_GROUP_STATE, 32, 0, 1, false},
                   {"circular", KVO_GROUP_SLIDING, 8, 8, 0, false}};
    kvo_plan *p = make_plan(32, gs, 3);
    static tstates s;
    memset(&s, 0, sizeof s);
    fill_states(&s, 0, 7, KVO_READY);
    fill_states(&s, 1, 14, KVO_READY);
    add_snapshot(&s, 1, 450, KVO_READY);
    add_snapshot(&s, 1, 452, KVO_READY);
    /* 452 is on the circular group's 8-token grid? no (452 % 8 = 4): 448 */
    ASSERT_EQ_U64(agree1(p, &s, 500, 0, 0, UINT64_C(1) << 2).tokens, 448);
    s.snap[1][1].tokens = 456; /* 456 % 8 == 0, but the mla chunks end at 448 */
    ASSERT_EQ_U64(agree1(p, &s, 500, 0, 0, UINT64_C(1) << 2).tokens, 448);
    fill_states(&s, 0, 8, KVO_READY);
    ASSERT_EQ_U64(agree1(p, &s, 500, 0, 0, UINT64_C(1) << 2).tokens, 456);
    /* bad input */
    kvo_agree_input in = agree_input(p, &s, 500, 501, 0, 4, 1);
    kvo_agree_result r;
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "local_tokens");
    in.local_tokens = 10;
    in.boundary_align = 4;
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "use 8");
    in.boundary_align = 1;
    s.snap[1][1].tokens = 450; /* not ascending */
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "ascending");
    s.snap[1][1].tokens = 456;
    add_snapshot(&s, 0, 100, KVO_READY); /* on a full group */
    ASSERT_ERR(kvo_agree(&in, &r), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "mla");
    kvo_plan_destroy(p);
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
    /* the token-granular rule (docs/lookup.md): same stores */
    r = agree1(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 4608);
    ASSERT_EQ_U64(r.tokens_if_pending, 4688); /* every sliding chunk stored ends at 4688 */
    s.st[1][36] = KVO_MISS;
    r = agree1(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 4608);
    ASSERT_EQ_U64(r.rounds, 2);
    for (int c = 250; c <= 270; c++) s.st[0][c] = KVO_MISS;
    r = agree1(p, &s, 5000, 0, 0, 0);
    ASSERT_EQ_U64(r.tokens, 4000); /* was 3968: the step no longer rounds down */
    ASSERT_EQ_INT(r.limiting_group, 0);
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
    /* the token-granular rule: the 8-token scratch group keeps hits on its grid */
    r = agree1(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 2048);
    ASSERT_EQ_U64(r.rounds, 2);
    s.st[4][7] = KVO_MISS;
    r = agree1(p, &s, 3000, 0, 0, scratch);
    ASSERT_EQ_U64(r.tokens, 1792);
    ASSERT_EQ_INT(r.limiting_group, 4);
    s.st[4][7] = KVO_READY;
    r = agree1(p, &s, 1000, 0, 0, scratch); /* agrees at 992 (999 on the 8-token grid): too short */
    ASSERT_EQ_U64(r.tokens, 0);
    ASSERT_EQ_INT(r.reason, KVO_AGREE_TOO_SHORT);
    ASSERT_EQ_U64(agree1(p, &s, 1000, 0, 1, scratch).tokens, 992);
    kvo_plan_destroy(p);
}
