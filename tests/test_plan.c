/* Tests of the chunk plan: the cases of the foundation issue, every preset,
 * fingerprint stability, and a property test over random group mixes. */
#include <stdlib.h>

#include "kvo_test.h"

static kvo_model *mk_model(const char *name, uint32_t tph) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create(name, tph, &m));
    return m;
}

static void add_group(kvo_model *m, const char *name, kvo_group_kind kind, uint32_t tpb, uint32_t layers,
                      uint64_t page, uint32_t window) {
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "%s", name);
    g.kind = kind;
    g.tokens_per_block = tpb;
    g.layers = layers;
    g.page_bytes = page;
    g.window = window;
    ASSERT_OK(kvo_model_add_group(m, &g));
}

KVO_TEST(legacy_single_group_block_size) {
    kvo_model *m = mk_model("llama-like", 16);
    add_group(m, "attn", KVO_GROUP_FULL, 16, 32, 65536, 0);
    kvo_plan_params prm = kvo_plan_default_params();
    prm.block_size = 256;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    const kvo_group_plan *g = kvo_plan_group(p, 0);
    ASSERT_EQ_U64(g->blocks_per_chunk, 16);
    ASSERT_EQ_U64(g->tokens_per_chunk, 256);
    ASSERT_EQ_U64(g->hashes_per_chunk, 16);
    ASSERT_EQ_U64(g->chunk_bytes, 16ull * 32 * 65536);
    ASSERT_EQ_U64(g->slot_bytes, g->chunk_bytes);
    ASSERT_TRUE(g->offloaded);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
}

KVO_TEST(mixed_block_sizes_blocks_per_chunk) {
    kvo_model *m = mk_model("mixed", 4);
    add_group(m, "a", KVO_GROUP_FULL, 12, 2, 1000, 0);
    add_group(m, "b", KVO_GROUP_SLIDING, 16, 3, 1000, 40);
    kvo_plan_params prm = kvo_plan_default_params();
    prm.blocks_per_chunk = 2;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->tokens_per_chunk, 24);
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->tokens_per_chunk, 32);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->hashes_per_chunk, 6);
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->hashes_per_chunk, 8);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->chunk_bytes, 2 * 2 * 1000);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->slot_bytes, 4096);
    /* window 40 tokens over 32-token chunks: ceil(40/32) + 1 = 3 chunks */
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->window_chunks, 3);
    kvo_plan_destroy(p);
    /* legacy block_size on mixed groups: per-group factor */
    prm = kvo_plan_default_params();
    prm.block_size = 48;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->blocks_per_chunk, 4);
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->blocks_per_chunk, 3);
    kvo_plan_destroy(p);
    /* 32 is not a multiple of 12: rejected naming group a and a value that works (48) */
    prm.block_size = 32;
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "group 'a'");
    ASSERT_CONTAINS(kvo_last_error(), "multiple of 48");
    kvo_model_destroy(m);
}

KVO_TEST(both_knobs_rejected) {
    kvo_model *m = mk_model("x", 16);
    add_group(m, "attn", KVO_GROUP_FULL, 16, 1, 64, 0);
    kvo_plan_params prm = kvo_plan_default_params();
    prm.block_size = 256;
    prm.blocks_per_chunk = 16;
    kvo_plan *p = NULL;
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not both");
    ASSERT_NULL(p);
    kvo_model_destroy(m);
}

KVO_TEST(small_blocks_under_large_hash_are_offloaded) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("glm-5.3-flash-like", &m));
    int tail = kvo_model_find_group(m, "tail");
    ASSERT_GE_INT(tail, 0);
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, NULL, &p)); /* automatic */
    const kvo_group_plan *g = kvo_plan_group(p, (size_t)tail);
    ASSERT_TRUE(g->offloaded);
    ASSERT_EQ_U64(g->blocks_per_chunk % 16, 0);
    ASSERT_EQ_U64(g->tokens_per_chunk % 64, 0);
    kvo_plan_destroy(p);
    /* blocks_per_chunk 16 is the minimum for 4-token blocks under a 64-token hash */
    kvo_group_override o = {"tail", 16};
    kvo_plan_params prm = kvo_plan_default_params();
    prm.overrides = &o;
    prm.n_overrides = 1;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    ASSERT_EQ_U64(kvo_plan_group(p, (size_t)tail)->tokens_per_chunk, 64);
    ASSERT_TRUE(kvo_plan_group(p, (size_t)tail)->offloaded);
    kvo_plan_destroy(p);
    /* an explicit value too small is rejected naming the minimum */
    o.blocks_per_chunk = 2;
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "group 'tail'");
    ASSERT_CONTAINS(kvo_last_error(), "minimum 16");
    kvo_model_destroy(m);
}

KVO_TEST(overrides_errors) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("deepseek-v4-flash-like", &m));
    kvo_plan *p = NULL;
    kvo_plan_params prm = kvo_plan_default_params();
    kvo_group_override o[2] = {{"nosuch", 4}, {"mla0", 4}};
    prm.overrides = o;
    prm.n_overrides = 1;
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "unknown group 'nosuch'");
    ASSERT_CONTAINS(kvo_last_error(), "mla0");
    o[0].group = "circular"; /* not cacheable */
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not cacheable");
    o[0].group = "mla0";
    o[0].blocks_per_chunk = 0;
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    o[0].blocks_per_chunk = 4;
    prm.n_overrides = 2; /* mla0 twice */
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "twice");
    /* override combined with block_size */
    prm.n_overrides = 1;
    prm.block_size = 256;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->blocks_per_chunk, 4);
    ASSERT_EQ_U64(kvo_plan_group(p, 1)->blocks_per_chunk, 8);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
}

KVO_TEST(non_cacheable_group_not_offloaded) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("deepseek-v4-flash-like", &m));
    kvo_plan *p = NULL;
    kvo_plan_params prm = kvo_plan_default_params();
    prm.block_size = 256;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    int c = kvo_model_find_group(m, "circular");
    const kvo_group_plan *g = kvo_plan_group(p, (size_t)c);
    ASSERT_FALSE(g->offloaded);
    ASSERT_EQ_U64(g->blocks_per_chunk, 0);
    ASSERT_EQ_U64(g->chunk_bytes, 0);
    /* every other group: 256-token chunks */
    for (size_t i = 0; i < kvo_plan_num_groups(p); i++)
        if ((int)i != c) ASSERT_EQ_U64(kvo_plan_group(p, i)->tokens_per_chunk, 256);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
}

KVO_TEST(draft_group_plans_like_any_other) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_preset("glm-5.3-flash-like", &m));
    int d = kvo_model_find_group(m, "draft");
    ASSERT_TRUE(kvo_model_group(m, (size_t)d)->draft);
    kvo_plan_params prm = kvo_plan_default_params();
    prm.blocks_per_chunk = 16;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &prm, &p));
    const kvo_group_plan *g = kvo_plan_group(p, (size_t)d);
    ASSERT_TRUE(g->offloaded);
    ASSERT_TRUE(g->draft);
    ASSERT_EQ_U64(g->tokens_per_chunk, 16 * 64);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
}

/* Independent re-derivation of the invariants of an accepted plan. */
static void check_invariants(const kvo_model *m, const kvo_plan *p) {
    uint32_t tph = kvo_model_tokens_per_hash(m);
    ASSERT_OK(kvo_plan_check(p));
    for (size_t i = 0; i < kvo_plan_num_groups(p); i++) {
        const kvo_group_desc *d = kvo_model_group(m, i);
        const kvo_group_plan *g = kvo_plan_group(p, i);
        ASSERT_EQ_STR(g->name, d->name);
        ASSERT_EQ_INT(g->offloaded, d->cacheable);
        if (!g->offloaded) continue;
        ASSERT_GE_U64(g->blocks_per_chunk, 1);
        ASSERT_EQ_U64(g->tokens_per_chunk, g->blocks_per_chunk * d->tokens_per_block);
        ASSERT_EQ_U64(g->tokens_per_chunk % d->tokens_per_block, 0);
        ASSERT_EQ_U64(g->tokens_per_chunk % tph, 0);
        ASSERT_LE_U64(g->tokens_per_chunk, 1ull << 31);
        ASSERT_EQ_U64(g->hashes_per_chunk * tph, g->tokens_per_chunk);
        unsigned __int128 bytes = (unsigned __int128)d->layers * g->blocks_per_chunk * d->page_bytes;
        ASSERT_TRUE(bytes < ((unsigned __int128)1 << 63));
        ASSERT_EQ_U64(g->chunk_bytes, (uint64_t)bytes);
        ASSERT_EQ_U64(g->slot_bytes % 4096, 0);
        ASSERT_TRUE(g->slot_bytes >= g->chunk_bytes && g->slot_bytes - g->chunk_bytes < 4096);
        if (d->kind == KVO_GROUP_SLIDING) {
            /* the chunks that cover `window` tokens ending anywhere in a chunk */
            uint64_t need = (d->window + g->tokens_per_chunk - 1) / g->tokens_per_chunk + 1;
            ASSERT_EQ_U64(g->window_chunks, need);
        } else if (d->kind == KVO_GROUP_STATE) {
            ASSERT_EQ_U64(g->window_chunks, 1);
        }
    }
}

KVO_TEST(every_preset_plans) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        kvo_model *m = NULL;
        ASSERT_OK(kvo_model_preset(kvo_model_preset_name(i), &m));
        kvo_plan *p = NULL;
        /* automatic */
        ASSERT_OK(kvo_plan_create(m, NULL, &p));
        check_invariants(m, p);
        for (size_t g = 0; g < kvo_plan_num_groups(p); g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded) continue;
            /* automatic: at least the 1 MiB target unless a single minimal span is larger */
            uint64_t min_bpc = 1;
            while ((min_bpc * gp->tokens_per_block) % kvo_model_tokens_per_hash(m)) min_bpc++;
            ASSERT_EQ_U64(gp->blocks_per_chunk % min_bpc, 0);
            ASSERT_TRUE(gp->chunk_bytes >= (1u << 20) || gp->blocks_per_chunk == min_bpc);
            ASSERT_TRUE(gp->blocks_per_chunk == min_bpc || gp->chunk_bytes < (2u << 20));
        }
        kvo_plan_destroy(p);
        /* --blocks-per-chunk: 16 works for every preset (GLM's tail needs 16) */
        kvo_plan_params prm = kvo_plan_default_params();
        prm.blocks_per_chunk = 16;
        ASSERT_OK(kvo_plan_create(m, &prm, &p));
        check_invariants(m, p);
        kvo_plan_destroy(p);
        /* --block-size: the smallest multiple of every block size and the hash unit */
        uint64_t unit = kvo_model_tokens_per_hash(m);
        for (size_t g = 0; g < kvo_model_num_groups(m); g++) {
            const kvo_group_desc *d = kvo_model_group(m, g);
            if (!d->cacheable) continue;
            uint64_t a = unit, b = d->tokens_per_block;
            while (b) { uint64_t t = a % b; a = b; b = t; }
            unit = unit / a * d->tokens_per_block;
        }
        prm = kvo_plan_default_params();
        prm.block_size = unit * 2;
        ASSERT_OK(kvo_plan_create(m, &prm, &p));
        check_invariants(m, p);
        for (size_t g = 0; g < kvo_plan_num_groups(p); g++)
            if (kvo_plan_group(p, g)->offloaded) ASSERT_EQ_U64(kvo_plan_group(p, g)->tokens_per_chunk, unit * 2);
        kvo_plan_destroy(p);
        kvo_model_destroy(m);
    }
}

static kvo_u128 fp_of(const kvo_model *m, const kvo_plan_params *prm) {
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, prm, &p));
    kvo_u128 f = kvo_plan_fingerprint(p);
    kvo_plan_destroy(p);
    return f;
}

static int fp_eq(kvo_u128 a, kvo_u128 b) { return a.lo == b.lo && a.hi == b.hi; }

KVO_TEST(fingerprint_tracks_byte_relevant_fields) {
    kvo_model *base = NULL;
    ASSERT_OK(kvo_model_preset("gemma-4-31b-like", &base));
    kvo_plan_params prm = kvo_plan_default_params();
    prm.blocks_per_chunk = 4;
    kvo_u128 f0 = fp_of(base, &prm);
    ASSERT_TRUE(fp_eq(f0, fp_of(base, &prm))); /* stable */
    /* each byte-relevant field changes it */
    for (int field = 0; field < 8; field++) {
        kvo_model *m = NULL;
        ASSERT_OK(kvo_model_create(field == 0 ? "gemma-4-31b-lik3" : "gemma-4-31b-like",
                                   field == 1 ? 32 : 16, &m));
        for (size_t g = 0; g < kvo_model_num_groups(base); g++) {
            kvo_group_desc d = *kvo_model_group(base, g);
            if (g == 1) {
                if (field == 2) d.tokens_per_block *= 2;
                if (field == 3) d.layers += 1;
                if (field == 4) d.page_bytes += 2;
                if (field == 5) d.draft = true;
                if (field == 6) d.cacheable = false;
                if (field == 7) snprintf(d.name, sizeof d.name, "full2");
            }
            ASSERT_OK(kvo_model_add_group(m, &d));
        }
        ASSERT_FALSE(fp_eq(f0, fp_of(m, &prm)));
        kvo_model_destroy(m);
    }
    /* window of the sliding group */
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("gemma-4-31b-like", 16, &m));
    kvo_group_desc d0 = *kvo_model_group(base, 0), d1 = *kvo_model_group(base, 1);
    d0.window = 512;
    ASSERT_OK(kvo_model_add_group(m, &d0));
    ASSERT_OK(kvo_model_add_group(m, &d1));
    ASSERT_FALSE(fp_eq(f0, fp_of(m, &prm)));
    kvo_model_destroy(m);
    /* chunking, dtype, tp rank */
    kvo_plan_params p2 = prm;
    p2.blocks_per_chunk = 8;
    ASSERT_FALSE(fp_eq(f0, fp_of(base, &p2)));
    p2 = prm;
    p2.dtype = "fp8";
    ASSERT_FALSE(fp_eq(f0, fp_of(base, &p2)));
    p2.tp_size = 2;
    p2.tp_rank = 0;
    kvo_u128 r0 = fp_of(base, &p2);
    p2.tp_rank = 1;
    ASSERT_FALSE(fp_eq(r0, fp_of(base, &p2)));
    /* not byte relevant: how the same chunking was asked for */
    p2 = kvo_plan_default_params();
    p2.block_size = 64; /* sliding 16-token blocks x4, full 64-token blocks x1 */
    kvo_group_override o[2] = {{"sliding", 4}, {"full", 1}};
    kvo_plan_params p3 = kvo_plan_default_params();
    p3.overrides = o;
    p3.n_overrides = 2;
    ASSERT_TRUE(fp_eq(fp_of(base, &p2), fp_of(base, &p3)));
    kvo_model_destroy(base);
}

KVO_TEST(fingerprint_ignores_json_formatting_and_notes) {
    const char *a = "{\"format\":\"kvoffload-model/1\",\"name\":\"t\",\"tokens_per_hash\":16,"
                    "\"groups\":[{\"name\":\"g\",\"kind\":\"full\",\"tokens_per_block\":16,\"layers\":2,"
                    "\"page_bytes\":4096}]}";
    const char *b = "{\n  \"note\": \"a comment\",\n  \"groups\": [ { \"page_bytes\": 4096, \"layers\": 2,\n"
                    "   \"tokens_per_block\": 16, \"kind\": \"full\", \"name\": \"g\", \"cacheable\": true } ],\n"
                    "  \"tokens_per_hash\": 16, \"name\": \"t\", \"format\": \"kvoffload-model/1\" }";
    kvo_model *ma = NULL, *mb = NULL;
    ASSERT_OK(kvo_model_from_json(a, strlen(a), "a", &ma));
    ASSERT_OK(kvo_model_from_json(b, strlen(b), "b", &mb));
    ASSERT_TRUE(fp_eq(fp_of(ma, NULL), fp_of(mb, NULL)));
    kvo_model_destroy(ma);
    kvo_model_destroy(mb);
}

/* ------------------------------------------------------- property test -- */

static uint64_t rnd(uint64_t lo, uint64_t hi) { return lo + kvo_test_rand() % (hi - lo + 1); }

KVO_TEST(property_random_group_mixes) {
    static const uint32_t tphs[] = {1, 4, 16, 32, 64, 48, 100, 7};
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 3000; iter++) {
        kvo_model *m = NULL;
        ASSERT_OK(kvo_model_create("prop", tphs[rnd(0, 7)], &m));
        size_t ng = rnd(1, 16);
        for (size_t g = 0; g < ng; g++) {
            kvo_group_desc d = kvo_group_desc_default();
            snprintf(d.name, sizeof d.name, "g%zu", g);
            d.kind = (kvo_group_kind)rnd(0, 2);
            uint32_t pow = (uint32_t)rnd(0, 12);
            d.tokens_per_block = rnd(0, 3) ? (1u << pow) : (uint32_t)rnd(1, 4096);
            d.layers = (uint32_t)rnd(1, 64);
            d.page_bytes = rnd(0, 9) ? rnd(1, 1u << 21) : rnd(1, 1ull << 40);
            d.window = d.kind == KVO_GROUP_SLIDING ? (uint32_t)rnd(1, 1u << 17) : 0;
            d.cacheable = rnd(0, 9) != 0;
            d.draft = rnd(0, 15) == 0;
            ASSERT_OK(kvo_model_add_group(m, &d));
        }
        kvo_plan_params prm = kvo_plan_default_params();
        kvo_group_override ovr[2];
        switch (rnd(0, 3)) {
        case 0: break; /* automatic */
        case 1: prm.block_size = rnd(0, 1) ? rnd(1, 1u << 14) : (1ull << rnd(0, 20)); break;
        case 2: prm.blocks_per_chunk = rnd(1, 64); break;
        case 3:
            ovr[0].group = "g0";
            ovr[0].blocks_per_chunk = (uint32_t)rnd(1, 1u << 20);
            prm.overrides = ovr;
            prm.n_overrides = kvo_model_group(m, 0)->cacheable ? 1 : 0;
            break;
        }
        prm.target_chunk_bytes = 1ull << rnd(10, 24);
        kvo_plan *p = NULL;
        int rc = kvo_plan_create(m, &prm, &p);
        if (rc == 0) {
            accepted++;
            check_invariants(m, p);
            for (size_t g = 0; g < ng; g++) {
                const kvo_group_plan *gp = kvo_plan_group(p, g);
                if (!gp->offloaded) continue;
                if (prm.n_overrides && g == 0) ASSERT_EQ_U64(gp->blocks_per_chunk, ovr[0].blocks_per_chunk);
                else if (prm.block_size) ASSERT_EQ_U64(gp->tokens_per_chunk, prm.block_size);
                else if (prm.blocks_per_chunk) ASSERT_EQ_U64(gp->blocks_per_chunk, prm.blocks_per_chunk);
            }
            kvo_plan_destroy(p);
        } else {
            rejected++;
            ASSERT_NULL(p);
            ASSERT_TRUE(rc == KVO_EINVAL || rc == KVO_ERANGE);
            ASSERT_CONTAINS(kvo_last_error(), "group '");
        }
        kvo_model_destroy(m);
    }
    /* the generator must exercise both outcomes */
    ASSERT_GT_INT(accepted, 300);
    ASSERT_GT_INT(rejected, 300);
}

KVO_TEST(overflow_is_rejected_not_wrapped) {
    kvo_model *m = mk_model("huge", 16);
    add_group(m, "big", KVO_GROUP_FULL, 1u << 30, 4000000000u, 1ull << 40, 0);
    kvo_plan *p = NULL;
    ASSERT_ERR(kvo_plan_create(m, NULL, &p), KVO_ERANGE);
    ASSERT_CONTAINS(kvo_last_error(), "group 'big'");
    kvo_model_destroy(m);
    m = mk_model("long", 3);
    add_group(m, "g", KVO_GROUP_FULL, 1u << 30, 1, 1, 0); /* lcm with 3 exceeds 2^31 */
    ASSERT_ERR(kvo_plan_create(m, NULL, &p), KVO_ERANGE);
    ASSERT_CONTAINS(kvo_last_error(), "group 'g'");
    kvo_model_destroy(m);
    m = mk_model("bpc", 16);
    add_group(m, "g", KVO_GROUP_FULL, 1u << 20, 1, 1, 0);
    kvo_plan_params prm = kvo_plan_default_params();
    prm.blocks_per_chunk = 1ull << 31; /* 2^51 tokens */
    ASSERT_ERR(kvo_plan_create(m, &prm, &p), KVO_ERANGE);
    kvo_model_destroy(m);
}

KVO_TEST(null_arguments) {
    kvo_plan *p = NULL;
    ASSERT_ERR(kvo_plan_create(NULL, NULL, &p), KVO_EINVAL);
    kvo_model *m = mk_model("x", 16);
    ASSERT_ERR(kvo_plan_create(m, NULL, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_plan_create(m, NULL, &p), KVO_EINVAL); /* no groups */
    ASSERT_EQ_U64(kvo_plan_num_groups(NULL), 0);
    ASSERT_NULL(kvo_plan_group(NULL, 0));
    kvo_plan_destroy(NULL);
    kvo_model_destroy(m);
}
