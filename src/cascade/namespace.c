/*
 * Namespaces: one rule, used by every engine adapter, for which chunks may
 * ever meet.
 *
 * A namespace is XXH3-128 over a length-prefixed encoding of a tag
 * ("kvoffload-namespace/1"), the plan's fingerprint (model name and every
 * group's geometry) and each field of a kvo_namespace_desc: a one-byte
 * field number, a LE64 length (UINT64_MAX for an absent field) and the
 * bytes.  Every field is kept whole: no folding of characters, no
 * truncation, and no two different descriptions encode to the same bytes,
 * so two models, dtypes, layouts or tenants get different namespaces
 * unless the 128-bit hash itself collides.  kvo_namespace_keys derives
 * chunk keys from an engine's own identifiers under a namespace, so chunks
 * of different namespaces never share a key in any tier (the file tier's
 * names and the cluster's keys are the chunk keys).
 *
 * A tenant's label (kvo_tenant_label) is a short hash of its salt, for
 * counters and the configuration of tenant parts: namespaces take the whole
 * salt, labels only name rows and parts.  A key's tenant tag names the part
 * it lives in; kvo__casc_check_parts checks the tags a call is given,
 * kvo__casc_check_keys the groups too.
 *
 * Pure functions: no state, no allocation, any thread.
 */
#include <stdio.h>
#include <string.h>

/* short one-shot hashes inlined, as keys.c's (core/xxh.h says why) */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cascade/cascade_internal.h"

#define KVO__NS_ONESHOT 240 /* bytes of id hashed from a stack copy */

static void kvo__ns_field(XXH3_state_t *st, uint8_t id, const void *p, size_t len, bool present) {
    uint64_t l = present ? (uint64_t)len : UINT64_MAX;
    uint8_t hdr[9];
    hdr[0] = id;
    for (int i = 0; i < 8; i++) hdr[1 + i] = (uint8_t)(l >> (8 * i));
    XXH3_128bits_update(st, hdr, sizeof hdr);
    if (present && len) XXH3_128bits_update(st, p, len);
}

int kvo_namespace_id(const kvo_plan *plan, const kvo_namespace_desc *d, kvo_u128 *out) {
    if (!plan || !out) return kvo__error(KVO_EINVAL, "kvo_namespace_id: plan and out must not be NULL");
    kvo_namespace_desc local;
    KVO__STRUCT_IN(d, kvo_namespace_desc, local, (kvo_namespace_desc)KVO_NAMESPACE_DESC_INIT, layout_hash,
                   "kvo_namespace_id", "KVO_NAMESPACE_DESC_INIT");
    if (d && ((d->model_len && !d->model) || (d->tenant_len && !d->tenant) || (d->extra_len && !d->extra)))
        return kvo__error(KVO_EINVAL, "kvo_namespace_id: a length is given without its pointer (model %zu, "
                                      "tenant %zu, extra %zu bytes)",
                          d->model_len, d->tenant_len, d->extra_len);
    static const char tag[] = "kvoffload-namespace/1";
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, tag, sizeof tag - 1);
    kvo_u128 fp = kvo_plan_fingerprint(plan);
    uint8_t fpb[16];
    for (int i = 0; i < 8; i++) {
        fpb[i] = (uint8_t)(fp.lo >> (8 * i));
        fpb[8 + i] = (uint8_t)(fp.hi >> (8 * i));
    }
    kvo__ns_field(&st, 0, fpb, sizeof fpb, true);
    if (d) {
        kvo__ns_field(&st, 1, d->engine, d->engine ? strlen(d->engine) : 0, d->engine != NULL);
        kvo__ns_field(&st, 2, d->model, d->model_len, d->model != NULL);
        kvo__ns_field(&st, 3, d->dtype, d->dtype ? strlen(d->dtype) : 0, d->dtype != NULL);
        kvo__ns_field(&st, 4, d->kv_layout, d->kv_layout ? strlen(d->kv_layout) : 0, d->kv_layout != NULL);
        kvo__ns_field(&st, 5, d->tenant, d->tenant_len, d->tenant != NULL);
        kvo__ns_field(&st, 6, d->extra, d->extra_len, d->extra != NULL);
        uint8_t lh[8];
        for (int i = 0; i < 8; i++) lh[i] = (uint8_t)(d->layout_hash >> (8 * i));
        kvo__ns_field(&st, 7, lh, sizeof lh, d->layout_hash != 0);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    out->lo = h.low64;
    out->hi = h.high64;
    return 0;
}

int kvo_namespace_keys(kvo_u128 ns, const void *ids, size_t id_len, size_t stride, size_t n, uint32_t group,
                       kvo_chunk_key *out) {
    if (n && (!ids || !out)) return kvo__error(KVO_EINVAL, "kvo_namespace_keys: NULL ids or out with n %zu", n);
    if (n > 1 && stride < id_len)
        return kvo__error(KVO_EINVAL, "kvo_namespace_keys: stride %zu is below id_len %zu", stride, id_len);
    /* the namespace's 16 bytes, then the id: one-shot XXH3 over a copy up
     * to KVO__NS_ONESHOT bytes of id (engines' hashes and key strings; the
     * streaming state costs three times the instructions at these sizes,
     * and vLLM derives one key per lookup), streamed beyond */
    uint8_t buf[16 + KVO__NS_ONESHOT];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(buf, &ns.lo, 8);
    memcpy(buf + 8, &ns.hi, 8);
#else
    for (int i = 0; i < 8; i++) {
        buf[i] = (uint8_t)(ns.lo >> (8 * i));
        buf[8 + i] = (uint8_t)(ns.hi >> (8 * i));
    }
#endif
    const uint8_t *p = ids;
    for (size_t i = 0; i < n; i++, p += stride) {
        XXH128_hash_t h;
        if (id_len <= KVO__NS_ONESHOT) {
            if (id_len) memcpy(buf + 16, p, id_len);
            h = XXH3_128bits(buf, 16 + id_len);
        } else {
            XXH3_state_t st;
            XXH3_128bits_reset(&st);
            XXH3_128bits_update(&st, buf, 16);
            XXH3_128bits_update(&st, p, id_len);
            h = XXH3_128bits_digest(&st);
        }
        out[i].hash.lo = h.low64;
        out[i].hash.hi = h.high64;
        out[i].group = group;
        out[i].tenant = 0;
    }
    return 0;
}

const char *kvo_tier_name(kvo_tier_id t) {
    switch (t) {
    case KVO_TIER_NONE: return "none";
    case KVO_TIER_HOST: return "host";
    case KVO_TIER_FILE: return "file";
    case KVO_TIER_REMOTE: return "remote";
    }
    return "?";
}

int kvo_tenant_label(const void *salt, size_t len, char *out, size_t cap) {
    if (!out || (len && !salt))
        return kvo__error(KVO_EINVAL, "kvo_tenant_label: out must not be NULL, nor salt with len %zu", len);
    char buf[KVO_TENANT_LABEL_MAX];
    if (!len)
        memcpy(buf, "default", sizeof "default");
    else
        snprintf(buf, sizeof buf, "t-%012llx", (unsigned long long)(XXH3_64bits(salt, len) >> 16));
    size_t n = strlen(buf) + 1;
    if (cap < n) return kvo__error(KVO_ERANGE, "kvo_tenant_label: %zu bytes of room, the label needs %zu", cap, n);
    memcpy(out, buf, n);
    return 0;
}

bool kvo__tenant_label_ok(const char *label) {
    if (!label) return false;
    if (!strcmp(label, "default")) return true;
    if (strncmp(label, "t-", 2) || strlen(label) != 14) return false;
    for (size_t i = 2; i < 14; i++)
        if (!((label[i] >= '0' && label[i] <= '9') || (label[i] >= 'a' && label[i] <= 'f'))) return false;
    return true;
}

int kvo__casc_check_parts(const kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool one, const char *fn) {
    for (size_t i = 0; i < n; i++) {
        if (keys[i].tenant >= c->nparts)
            return kvo__error(KVO_EINVAL,
                              "%s: key %zu is tagged tenant part %u; the cascade has %u (tag keys with "
                              "kvo_cascade_tenant_part)",
                              fn, i, (unsigned)keys[i].tenant, (unsigned)c->nparts);
        if (one && keys[i].tenant != keys[0].tenant)
            return kvo__error(KVO_EINVAL,
                              "%s: key %zu is of tenant part %u, key 0 of part %u: one call, one tenant part", fn, i,
                              (unsigned)keys[i].tenant, (unsigned)keys[0].tenant);
    }
    return 0;
}

int kvo__casc_check_keys(const kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool one, const char *fn) {
    for (size_t i = 0; i < n; i++)
        if (keys[i].group >= c->ng || !kvo_plan_group(c->plan, keys[i].group)->offloaded)
            return kvo__error(KVO_EINVAL, "%s: key %zu names group %u, which is not offloaded", fn, i, keys[i].group);
    return kvo__casc_check_parts(c, keys, n, one, fn);
}
