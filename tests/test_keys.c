/* Keys: golden vectors that pin the byte format, an independent
 * re-computation of the documented format with raw XXH3-128, chaining and
 * chunk-key rules. */
#include <stdlib.h>

#include <xxhash.h>

#include "kvo_test.h"

static const kvo_u128 FP = {UINT64_C(0x0123456789abcdef), UINT64_C(0xfedcba9876543210)};

static void tokens40(uint32_t *t) {
    for (uint32_t i = 0; i < 40; i++) t[i] = i * 100003u + 7u;
}

#define ASSERT_U128(v, LO, HI) do { kvo_u128 v_ = (v); ASSERT_EQ_U64(v_.lo, UINT64_C(LO)); \
    ASSERT_EQ_U64(v_.hi, UINT64_C(HI)); } while (0)

/* Golden vectors: computed once with this implementation and pinned.  If one
 * of these changes, every stored key in every deployment changes: bump the
 * "kvoffload-ns/1" tag instead. */
KVO_TEST(golden_namespace) {
    ASSERT_U128(kvo_keys_namespace(FP, NULL, 0), 0x48d97ae46a216f61, 0x5a74c1c7f138880e);
    ASSERT_U128(kvo_keys_namespace(FP, "tenant-a", 8), 0xf3e2716b12bdb63d, 0x3ec82588449a94d8);
}

KVO_TEST(golden_units) {
    uint32_t t[40];
    tokens40(t);
    kvo_u128 u[4];
    size_t n = 99;
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(FP, NULL, 0), t, 40, 16, NULL, 0, u, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_U128(u[0], 0x54c87a255f56ae47, 0x532e4b10494973c0);
    ASSERT_U128(u[1], 0x76dde57ade7ee0c3, 0xed95bf387c87716b);
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(FP, "tenant-a", 8), t, 40, 16, "lora-7", 6, u, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_U128(u[0], 0xedcb966f97397f60, 0x602aa5b0e38d3091);
    ASSERT_U128(u[1], 0x3bea0218da4b0222, 0x471c7d504d49975a);
}

/* The documented byte format, built byte by byte, hashed with raw XXH3-128. */
static void le64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void le32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }

static kvo_u128 ref_ns(kvo_u128 fp, const char *salt, size_t salt_len) {
    unsigned char b[256];
    size_t n = 0;
    memcpy(b, "kvoffload-ns/1", 14);
    n = 14;
    le64(b + n, fp.lo); n += 8;
    le64(b + n, fp.hi); n += 8;
    memcpy(b + n, salt, salt_len); n += salt_len;
    XXH128_hash_t h = XXH3_128bits(b, n);
    kvo_u128 r = {h.low64, h.high64};
    return r;
}

static kvo_u128 ref_unit(kvo_u128 parent, const uint32_t *t, size_t nt, const void *extra, size_t extra_len) {
    size_t len = 16 + nt * 4 + extra_len;
    unsigned char *b = malloc(len);
    le64(b, parent.lo);
    le64(b + 8, parent.hi);
    for (size_t i = 0; i < nt; i++) le32(b + 16 + 4 * i, t[i]);
    if (extra_len) memcpy(b + 16 + 4 * nt, extra, extra_len);
    XXH128_hash_t h = XXH3_128bits(b, len);
    free(b);
    kvo_u128 r = {h.low64, h.high64};
    return r;
}

KVO_TEST(format_matches_documentation) {
    kvo_u128 ns = kvo_keys_namespace(FP, "tenant-a", 8);
    kvo_u128 r = ref_ns(FP, "tenant-a", 8);
    ASSERT_EQ_U64(ns.lo, r.lo);
    ASSERT_EQ_U64(ns.hi, r.hi);
    /* several unit sizes, including ones past the one-shot buffer (stream path) */
    static const uint32_t tphs[] = {1, 16, 32, 64, 256, 300, 1000};
    uint32_t *t = malloc(3000 * sizeof *t);
    for (uint32_t i = 0; i < 3000; i++) t[i] = (uint32_t)(kvo_test_rand() & 0xFFFFFFFFu);
    for (size_t k = 0; k < sizeof tphs / sizeof tphs[0]; k++) {
        for (int with_extra = 0; with_extra < 2; with_extra++) {
            uint32_t tph = tphs[k];
            size_t nt = tph * 3 + tph / 2; /* trailing partial unit is ignored */
            kvo_u128 u[3];
            size_t n = 0;
            const char *ex = with_extra ? "adapter:42|mm:ffee" : NULL;
            size_t exl = with_extra ? strlen(ex) : 0;
            ASSERT_OK(kvo_hash_tokens(ns, t, nt, tph, ex, exl, u, 3, &n));
            ASSERT_EQ_U64(n, 3);
            kvo_u128 parent = ns;
            for (size_t i = 0; i < 3; i++) {
                kvo_u128 e = ref_unit(parent, t + i * tph, tph, ex, exl);
                if (e.lo != u[i].lo || e.hi != u[i].hi) FAILF("tph %u extra %d unit %zu differs", tph, with_extra, i);
                kvo_u128 one = kvo_hash_unit(parent, t + i * tph, tph, ex, exl);
                ASSERT_EQ_U64(one.lo, e.lo);
                ASSERT_EQ_U64(one.hi, e.hi);
                parent = e;
            }
        }
    }
    free(t);
}

KVO_TEST(chaining_and_prefix_property) {
    uint32_t t[40];
    tokens40(t);
    kvo_u128 ns = kvo_keys_namespace(FP, NULL, 0);
    kvo_u128 a[2], b[2], c[1];
    size_t n;
    ASSERT_OK(kvo_hash_tokens(ns, t, 32, 16, NULL, 0, a, 2, &n));
    /* hashing in two calls, chained by the caller, gives the same units */
    ASSERT_OK(kvo_hash_tokens(ns, t, 16, 16, NULL, 0, c, 1, &n));
    ASSERT_OK(kvo_hash_tokens(c[0], t + 16, 16, 16, NULL, 0, b, 1, &n));
    ASSERT_EQ_U64(c[0].lo, a[0].lo);
    ASSERT_EQ_U64(b[0].lo, a[1].lo);
    /* changing one token of unit 0 changes unit 1 too (the chain) */
    t[3] ^= 1;
    ASSERT_OK(kvo_hash_tokens(ns, t, 32, 16, NULL, 0, b, 2, &n));
    ASSERT_NE_U64(b[0].lo, a[0].lo);
    ASSERT_NE_U64(b[1].lo, a[1].lo);
    t[3] ^= 1;
    /* a different salt (tenant) or fingerprint never shares keys */
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(FP, "x", 1), t, 32, 16, NULL, 0, b, 2, &n));
    ASSERT_NE_U64(b[1].lo, a[1].lo);
    kvo_u128 fp2 = FP;
    fp2.hi ^= 1;
    ASSERT_OK(kvo_hash_tokens(kvo_keys_namespace(fp2, NULL, 0), t, 32, 16, NULL, 0, b, 2, &n));
    ASSERT_NE_U64(b[1].lo, a[1].lo);
    /* extra bytes change every unit */
    ASSERT_OK(kvo_hash_tokens(ns, t, 32, 16, "e", 1, b, 2, &n));
    ASSERT_NE_U64(b[0].lo, a[0].lo);
}

KVO_TEST(bad_input) {
    uint32_t t[40];
    tokens40(t);
    kvo_u128 u[4], ns = {1, 2};
    size_t n = 77;
    ASSERT_ERR(kvo_hash_tokens(ns, t, 40, 0, NULL, 0, u, 4, &n), KVO_EINVAL);
    ASSERT_ERR(kvo_hash_tokens(ns, NULL, 40, 16, NULL, 0, u, 4, &n), KVO_EINVAL);
    ASSERT_ERR(kvo_hash_tokens(ns, t, 40, 16, NULL, 3, u, 4, &n), KVO_EINVAL);
    ASSERT_ERR(kvo_hash_tokens(ns, t, 40, 16, NULL, 0, NULL, 4, &n), KVO_EINVAL);
    ASSERT_ERR(kvo_hash_tokens(ns, t, 40, 16, NULL, 0, u, 4, NULL), KVO_EINVAL);
    u[0].lo = 123;
    ASSERT_ERR(kvo_hash_tokens(ns, t, 40, 16, NULL, 0, u, 1, &n), KVO_ERANGE);
    ASSERT_EQ_U64(u[0].lo, 123); /* nothing written */
    ASSERT_EQ_U64(n, 77);
    ASSERT_CONTAINS(kvo_last_error(), "units");
    /* fewer tokens than a unit: zero units, success */
    ASSERT_OK(kvo_hash_tokens(ns, t, 15, 16, NULL, 0, u, 0, &n));
    ASSERT_EQ_U64(n, 0);
}

KVO_TEST(chunk_keys_per_group) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_model_preset("glm-5.3-flash-like", &m));
    ASSERT_OK(kvo_plan_create(m, NULL, &p));
    kvo_u128 ns = kvo_keys_namespace(kvo_plan_fingerprint(p), NULL, 0);
    uint32_t tph = kvo_plan_tokens_per_hash(p);
    size_t ntok = 3584 * 2 + 100;
    uint32_t *t = malloc(ntok * sizeof *t);
    for (size_t i = 0; i < ntok; i++) t[i] = (uint32_t)i;
    size_t nu = 0, cap = ntok / tph;
    kvo_u128 *u = malloc(cap * sizeof *u);
    ASSERT_OK(kvo_hash_tokens(ns, t, ntok, tph, NULL, 0, u, cap, &nu));
    ASSERT_EQ_U64(nu, ntok / tph);
    kvo_chunk_key keys[256];
    for (size_t g = 0; g < kvo_plan_num_groups(p); g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        size_t nk = kvo_chunk_keys(gp, u, nu, keys, 256);
        ASSERT_EQ_U64(nk, nu / gp->hashes_per_chunk); /* incomplete trailing chunk: no key */
        ASSERT_EQ_U64(nk * gp->tokens_per_chunk <= ntok, 1);
        for (size_t c = 0; c < nk; c++) {
            ASSERT_EQ_U64(keys[c].group, g);
            ASSERT_EQ_U64(keys[c].tenant, 0);
            ASSERT_EQ_U64(keys[c].hash.lo, u[(c + 1) * gp->hashes_per_chunk - 1].lo);
        }
        /* cap smaller than the chunk count: writes cap, returns the count */
        if (nk > 1) {
            keys[1].group = 999;
            ASSERT_EQ_U64(kvo_chunk_keys(gp, u, nu, keys, 1), nk);
            ASSERT_EQ_U64(keys[1].group, 999);
        }
    }
    /* a non-offloaded group has no keys */
    kvo_group_plan off = *kvo_plan_group(p, 0);
    off.offloaded = false;
    ASSERT_EQ_U64(kvo_chunk_keys(&off, u, nu, keys, 256), 0);
    free(u);
    free(t);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
}
