/*
 * kvoffload keys layer: chained prefix hashing and chunk keys.
 *
 * Byte format (stable across processes, restarts and machines; pinned by
 * golden vectors in tests/test_keys.c; see docs/keys.md):
 *   namespace  = XXH3-128("kvoffload-ns/1" || fingerprint.lo LE64 || fingerprint.hi LE64
 *                          || salt bytes)
 *   unit i     = XXH3-128(parent.lo LE64 || parent.hi LE64 || token ids as LE32 x tokens_per_hash
 *                          || extra bytes)
 *   parent of unit 0 is the namespace; parent of unit i is unit i-1.
 * A chunk key is (hash of the chunk's last unit, group id).  Group g's chunk c
 * covers units [c*hpc_g, (c+1)*hpc_g) (hpc = hashes_per_chunk); an incomplete
 * trailing chunk has no key.
 *
 * All functions are pure and thread-safe.
 */
#ifndef KVOFFLOAD_KVO_KEYS_H
#define KVOFFLOAD_KVO_KEYS_H

#include "kvo_geometry.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A stored chunk's identity: the chained hash at the chunk's end + group id.
 *  tenant is not part of the identity (equality, hashes and every tier
 *  ignore it): it names the host-tier part a cascade with tenant quotas
 *  keeps the key in (kvo_cascade_tenant_part; 0, the shared part, elsewhere). */
typedef struct kvo_chunk_key {
    kvo_u128 hash;
    uint32_t group;
    uint32_t tenant;   /* cascade tenant part; 0 unless the cascade has tenant quotas */
} kvo_chunk_key;

static inline bool kvo_chunk_key_eq(const kvo_chunk_key *a, const kvo_chunk_key *b) {
    return a->hash.lo == b->hash.lo && a->hash.hi == b->hash.hi && a->group == b->group;
}

/** The namespace seed from a plan's fingerprint and an optional user salt
 *  (tenant, cache salt).  salt may be NULL when salt_len is 0. */
KVO_API kvo_u128 kvo_keys_namespace(kvo_u128 fingerprint, const void *salt, size_t salt_len);

/** Hash one unit: XXH3-128(parent.lo LE64 || parent.hi LE64 || n_tokens
 *  token ids as LE32 || extra bytes).  For engines that feed tokens one unit at
 *  a time.  tokens may be NULL when n_tokens is 0; extra may be NULL when
 *  extra_len is 0 (no error reporting: a pure function). */
KVO_API kvo_u128 kvo_hash_unit(kvo_u128 parent, const uint32_t *tokens, size_t n_tokens, const void *extra,
                       size_t extra_len);

/** Hash n_tokens / tokens_per_hash complete units of tokens, chained from
 *  parent (the namespace for a prompt's first unit, else the previous unit's
 *  hash).  Writes that many hashes to out (cap entries); trailing tokens that do
 *  not fill a unit are ignored.  extra (may be NULL) is appended to every unit
 *  (adapter id, multimodal content hash).  *n_out = units written.
 *  Errors: KVO_EINVAL (NULL pointers, tokens_per_hash 0), KVO_ERANGE (cap too
 *  small: nothing written). */
KVO_API int kvo_hash_tokens(kvo_u128 parent, const uint32_t *tokens, size_t n_tokens, uint32_t tokens_per_hash,
                    const void *extra, size_t extra_len, kvo_u128 *out, size_t cap, size_t *n_out);

/** Chunk keys of group g for a prefix of n_units unit hashes: key c =
 *  (units[(c+1)*hashes_per_chunk - 1], g).  Writes min(cap, n_units /
 *  hashes_per_chunk) keys; returns how many complete chunks exist (may exceed
 *  cap).  A group that is not offloaded has no keys (returns 0). */
KVO_API size_t kvo_chunk_keys(const kvo_group_plan *g, const kvo_u128 *units, size_t n_units, kvo_chunk_key *out,
                      size_t cap);

/** A 64-bit digest of a chunk key (hash.lo mixed with the group id), for
 *  engines that index keys in their own tables.  Stable like the keys. */
static inline uint64_t kvo_chunk_key_hash64(const kvo_chunk_key *k) {
    uint64_t h = k->hash.lo ^ ((uint64_t)k->group * UINT64_C(0x9E3779B97F4A7C15));
    h ^= h >> 29;
    return h;
}

#ifdef __cplusplus
}
#endif
#endif
