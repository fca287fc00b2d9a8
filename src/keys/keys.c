/*
 * Chained prefix hashing and chunk keys.
 *
 * Format (the contract; docs/keys.md, golden vectors in tests/test_keys.c):
 *   namespace = XXH3-128("kvoffload-ns/1" || fp.lo LE64 || fp.hi LE64 || salt)
 *   unit i    = XXH3-128(parent.lo LE64 || parent.hi LE64 ||
 *                        tokens_per_hash token ids, each LE32 || extra)
 * with the default secret and seed 0: nothing depends on the process, the
 * machine or the build, so keys agree across restarts and hosts.
 *
 * Why chained: a unit's hash names the whole prefix up to it, so a chunk key
 * (the hash of the chunk's last unit + group id) identifies both the chunk's
 * tokens and everything before them; equal keys mean equal KV bytes.
 *
 * Speed: a 16-token unit is 80 bytes of input (16 + 64), inside XXH3's
 * 17..128-byte path.  XXH_INLINE_ALL lets the compiler inline that path.  The
 * unit is assembled in one stack buffer (parent || tokens || extra: ~80 bytes
 * copied, far below the hash cost) because XXH3's one-shot form is much
 * faster on short inputs than its streaming form.  Units that do not fit the
 * buffer (over ~250 tokens) and big-endian hosts use the streaming state.
 */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/internal.h"

#define KVO__NS_TAG "kvoffload-ns/1"
#define KVO__UNIT_BUF 1024 /* bytes: parent (16) + 248 tokens, or fewer with extra */

static inline void kvo__put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static inline bool kvo__little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static inline kvo_u128 kvo__from_xxh(XXH128_hash_t h) {
    kvo_u128 r;
    r.lo = h.low64;
    r.hi = h.high64;
    return r;
}

kvo_u128 kvo_keys_namespace(kvo_u128 fingerprint, const void *salt, size_t salt_len) {
    XXH3_state_t st;
    unsigned char head[sizeof KVO__NS_TAG - 1 + 16];
    memcpy(head, KVO__NS_TAG, sizeof KVO__NS_TAG - 1);
    kvo__put_le64(head + sizeof KVO__NS_TAG - 1, fingerprint.lo);
    kvo__put_le64(head + sizeof KVO__NS_TAG - 1 + 8, fingerprint.hi);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, head, sizeof head);
    if (salt && salt_len) XXH3_128bits_update(&st, salt, salt_len);
    return kvo__from_xxh(XXH3_128bits_digest(&st));
}

/* Streaming path for units that do not fit the stack buffer. */
static kvo_u128 kvo__hash_unit_stream(kvo_u128 parent, const uint32_t *tokens, size_t n, const void *extra,
                                      size_t extra_len) {
    XXH3_state_t st;
    unsigned char buf[256];
    kvo__put_le64(buf, parent.lo);
    kvo__put_le64(buf + 8, parent.hi);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, buf, 16);
    if (kvo__little_endian()) {
        if (n) XXH3_128bits_update(&st, tokens, n * 4);
    } else {
        size_t i = 0;
        while (i < n) {
            size_t m = 0;
            for (; i < n && m + 4 <= sizeof buf; i++, m += 4) {
                uint32_t t = tokens[i];
                buf[m] = (unsigned char)t;
                buf[m + 1] = (unsigned char)(t >> 8);
                buf[m + 2] = (unsigned char)(t >> 16);
                buf[m + 3] = (unsigned char)(t >> 24);
            }
            XXH3_128bits_update(&st, buf, m);
        }
    }
    if (extra && extra_len) XXH3_128bits_update(&st, extra, extra_len);
    return kvo__from_xxh(XXH3_128bits_digest(&st));
}

/* flatten: inline XXH3 into the hashing loops (it is otherwise an out-of-line
 * call with several call sites here, which loses the constant-length folding).
 * The chained value is kept as two scalars: as a kvo_u128 struct the compiler
 * bounces it through a 16-byte load of two 8-byte stores, a store-forwarding
 * stall on the chain's critical path (~6 ns per unit, measured). */
#if defined(__GNUC__) && !defined(__clang__)
#define KVO__FLATTEN __attribute__((flatten, noinline, optimize("no-tree-slp-vectorize", "no-tree-loop-distribute-patterns")))
#elif defined(__GNUC__)
#define KVO__FLATTEN __attribute__((flatten, noinline))
#else
#define KVO__FLATTEN
#endif

/* Copy token bytes with fixed-size pieces the compiler turns into vector
 * moves (a variable-size memcpy is a libc call that costs as much as hashing
 * a 16-token unit). */
static inline void kvo__copy_tokens(unsigned char *dst, const uint32_t *t, size_t n) {
    const unsigned char *src = (const unsigned char *)t;
    size_t bytes = n * 4, i = 0;
    for (; i + 64 <= bytes; i += 64) memcpy(dst + i, src + i, 64);
    for (; i + 16 <= bytes; i += 16) memcpy(dst + i, src + i, 16);
    for (; i < bytes; i += 4) memcpy(dst + i, src + i, 4);
}

static inline kvo_u128 kvo__hash_unit_fast(kvo_u128 parent, const uint32_t *tokens, size_t n, const void *extra,
                                           size_t extra_len) {
    unsigned char buf[KVO__UNIT_BUF];
    size_t len = 16 + n * 4 + extra_len;
    if (KVO__UNLIKELY(len > sizeof buf || n > KVO__UNIT_BUF || !kvo__little_endian()))
        return kvo__hash_unit_stream(parent, tokens, n, extra, extra_len);
    memcpy(buf, &parent.lo, 8);
    memcpy(buf + 8, &parent.hi, 8);
    kvo__copy_tokens(buf + 16, tokens, n);
    if (extra_len) memcpy(buf + 16 + n * 4, extra, extra_len);
    return kvo__from_xxh(XXH3_128bits(buf, len));
}

kvo_u128 kvo_hash_unit(kvo_u128 parent, const uint32_t *tokens, size_t n_tokens, const void *extra,
                       size_t extra_len) {
    if (!tokens) n_tokens = 0;
    if (!extra) extra_len = 0;
    return kvo__hash_unit_fast(parent, tokens, n_tokens, extra, extra_len);
}

/* Chains of units of a constant N tokens (16, 32, 64, 128, 256: the usual
 * hash units) and no extra bytes: the length is a compile-time constant, so
 * XXH3's length dispatch folds away, its short paths unroll and the copy is a
 * fixed-size move (2-3x faster than a variable length for 16-token units,
 * measured). */
#define KVO__CHAIN_CONST(N)                                                                         \
    KVO__FLATTEN static void kvo__chain_##N(kvo_u128 h, const uint32_t *t, size_t units, kvo_u128 *out) { \
        unsigned char buf[16 + (N) * 4];                                                            \
        uint64_t lo = h.lo, hi = h.hi;                                                              \
        for (size_t u = 0; u < units; u++) {                                                        \
            memcpy(buf, &lo, 8);                                                                    \
            memcpy(buf + 8, &hi, 8);                                                                \
            kvo__copy_tokens(buf + 16, t + u * (N), (N));                                           \
            XXH128_hash_t x = XXH3_128bits(buf, sizeof buf);                                        \
            lo = x.low64;                                                                           \
            hi = x.high64;                                                                          \
            out[u].lo = lo;                                                                         \
            out[u].hi = hi;                                                                         \
        }                                                                                           \
    }

KVO__FLATTEN static void kvo__chain_var(kvo_u128 h, const uint32_t *tokens, size_t units, uint32_t tph,
                                        const void *extra, size_t extra_len, kvo_u128 *out) {
    for (size_t u = 0; u < units; u++) {
        h = kvo__hash_unit_fast(h, tokens + u * tph, tph, extra, extra_len);
        out[u] = h;
    }
}

KVO__CHAIN_CONST(16)
KVO__CHAIN_CONST(32)
KVO__CHAIN_CONST(64)
KVO__CHAIN_CONST(128)
KVO__CHAIN_CONST(256)

int kvo_hash_tokens(kvo_u128 parent, const uint32_t *tokens, size_t n_tokens, uint32_t tokens_per_hash,
                    const void *extra, size_t extra_len, kvo_u128 *out, size_t cap, size_t *n_out) {
    if (!n_out || !out || (!tokens && n_tokens) || (!extra && extra_len))
        return kvo__error(KVO_EINVAL, "kvo_hash_tokens: NULL %s",
                          !n_out ? "n_out" : !out ? "out" : (!tokens && n_tokens) ? "tokens" : "extra");
    if (tokens_per_hash == 0) return kvo__error(KVO_EINVAL, "kvo_hash_tokens: tokens_per_hash is 0");
    size_t units = n_tokens / tokens_per_hash;
    if (units > cap)
        return kvo__error(KVO_ERANGE, "kvo_hash_tokens: %zu tokens make %zu units of %u tokens, out holds %zu",
                          n_tokens, units, tokens_per_hash, cap);
    if (extra_len == 0 && kvo__little_endian()) {
        switch (tokens_per_hash) {
        case 16: kvo__chain_16(parent, tokens, units, out); *n_out = units; return 0;
        case 32: kvo__chain_32(parent, tokens, units, out); *n_out = units; return 0;
        case 64: kvo__chain_64(parent, tokens, units, out); *n_out = units; return 0;
        case 128: kvo__chain_128(parent, tokens, units, out); *n_out = units; return 0;
        case 256: kvo__chain_256(parent, tokens, units, out); *n_out = units; return 0;
        default: break;
        }
    }
    kvo__chain_var(parent, tokens, units, tokens_per_hash, extra, extra_len, out);
    *n_out = units;
    return 0;
}

size_t kvo_chunk_keys(const kvo_group_plan *g, const kvo_u128 *units, size_t n_units, kvo_chunk_key *out,
                      size_t cap) {
    if (!g || !g->offloaded || g->hashes_per_chunk == 0 || (!units && n_units)) return 0;
    size_t hpc = (size_t)g->hashes_per_chunk;
    size_t chunks = n_units / hpc;
    size_t w = chunks < cap ? chunks : cap;
    if (!out) w = 0;
    for (size_t c = 0; c < w; c++) {
        out[c].hash = units[(c + 1) * hpc - 1];
        out[c].group = g->id;
        out[c].tenant = 0;
    }
    return chunks;
}
