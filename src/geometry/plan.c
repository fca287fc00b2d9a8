/*
 * The chunk plan: per-group chunk geometry derived from a model and the
 * offload configuration.
 *
 * Why per group.  One scalar chunk size ("block_size" tokens per chunk, as
 * engines' offload configs give it) turned into one blocks-per-chunk factor
 * silently assumes that every KV-cache group has the same tokens_per_block.
 * Here every group gets its own blocks_per_chunk and therefore its own
 * tokens_per_chunk, hashes_per_chunk and chunk bytes; nothing downstream ever
 * reads a global chunk size.
 *
 * How blocks_per_chunk is chosen for group g (tpb_g = tokens_per_block,
 * tph = tokens_per_hash, min_g = lcm(tpb_g, tph) / tpb_g, the fewest blocks
 * whose span is a whole number of hash units):
 *   1. a per-group override, if one names g;
 *   2. else block_size / tpb_g when block_size is given (the legacy knob: for a
 *      single-group model exactly what it always meant);
 *   3. else blocks_per_chunk when given (the same block count for all groups);
 *   4. else automatic: min_g * k with the smallest power of two k >= 1 such
 *      that layers * min_g * k * page_bytes >= target_chunk_bytes (default
 *      1 MiB), since transfers of a few hundred KiB and up run several times
 *      faster than small ones, while larger chunks only coarsen hit
 *      granularity.  Powers of two keep the spans of groups with power-of-two
 *      block sizes nested (each divides the larger ones), so chunk boundaries
 *      of one group are boundaries of the others and hits agree more often.
 *      A chunk thus carries between target and 2 x target bytes (or one
 *      minimal span when that is already larger).  k is capped so that the
 *      span stays within 2^31 tokens.
 * A chosen value is never silently adjusted: a span that is not a whole
 * number of hash units is rejected with the minimum that would work (a
 * 4-token group under a 64-token hash needs 16 blocks per chunk; it is
 * offloaded with that, never left out).
 *
 * Non-cacheable groups are not offloaded and take no part in validation.
 * Everything is computed with checked 64-bit arithmetic.
 */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>
#include "core/xxh.h"

#include "geometry/geometry_internal.h"

kvo_plan_params kvo_plan_default_params(void) {
    kvo_plan_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.target_chunk_bytes = UINT64_C(1) << 20;
    return p;
}

/* lcm of tokens_per_hash and every offloaded group's tokens_per_block. */
static uint64_t kvo__span_unit(const kvo_model *m) {
    uint64_t l = m->tokens_per_hash;
    for (size_t i = 0; i < m->n_groups; i++)
        if (m->groups[i].cacheable && l) l = kvo__lcm_u64(l, m->groups[i].tokens_per_block);
    return l;
}

static int kvo__min_bpc(const kvo_model *m, const kvo_group_desc *g, uint64_t *out) {
    uint64_t l = kvo__lcm_u64(g->tokens_per_block, m->tokens_per_hash);
    if (l == 0 || l > KVO_MAX_TOKENS_PER_CHUNK)
        return kvo__error(KVO_ERANGE, "group '%s': lcm(tokens_per_block %u, tokens_per_hash %u) exceeds 2^31 tokens",
                          g->name, g->tokens_per_block, m->tokens_per_hash);
    *out = l / g->tokens_per_block;
    return 0;
}

/* Fill in derived fields for a chosen blocks_per_chunk; validate. */
static int kvo__derive(const kvo_model *m, kvo_group_plan *gp, uint64_t bpc, const char *how) {
    uint64_t min_bpc = 0, tpc = 0, bytes = 0;
    int rc = kvo__min_bpc(m, &m->groups[gp->id], &min_bpc);
    if (rc) return rc;
    if (bpc == 0)
        return kvo__error(KVO_EINVAL, "group '%s': %s gives 0 blocks per chunk; use a multiple of %llu",
                          gp->name, how, (unsigned long long)min_bpc);
    if (kvo__mul_u64(bpc, gp->tokens_per_block, &tpc) || tpc > KVO_MAX_TOKENS_PER_CHUNK)
        return kvo__error(KVO_ERANGE, "group '%s': %s gives %llu blocks of %u tokens, over 2^31 tokens per chunk",
                          gp->name, how, (unsigned long long)bpc, gp->tokens_per_block);
    if (tpc % m->tokens_per_hash != 0)
        return kvo__error(KVO_EINVAL,
                          "group '%s': %s gives %llu blocks x %u tokens = %llu-token chunks, not a multiple of "
                          "the %u-token hash unit; blocks_per_chunk must be a multiple of %llu (minimum %llu)",
                          gp->name, how, (unsigned long long)bpc, gp->tokens_per_block, (unsigned long long)tpc,
                          m->tokens_per_hash, (unsigned long long)min_bpc, (unsigned long long)min_bpc);
    if (kvo__mul_u64(bpc, gp->page_bytes, &bytes) || kvo__mul_u64(bytes, gp->layers, &bytes) ||
        bytes > (UINT64_C(1) << 63) - KVO_SLOT_ALIGN)
        return kvo__error(KVO_ERANGE, "group '%s': %u layers x %llu blocks x %llu page bytes overflows 2^63",
                          gp->name, gp->layers, (unsigned long long)bpc, (unsigned long long)gp->page_bytes);
    gp->offloaded = true;
    gp->blocks_per_chunk = bpc;
    gp->tokens_per_chunk = tpc;
    gp->hashes_per_chunk = tpc / m->tokens_per_hash;
    gp->chunk_bytes = bytes;
    gp->slot_bytes = kvo__align_up_u64(bytes, KVO_SLOT_ALIGN);
    if (gp->kind == KVO_GROUP_SLIDING)
        gp->window_chunks = kvo__div_ceil_u64(gp->window, tpc) + 1;
    else if (gp->kind == KVO_GROUP_STATE)
        gp->window_chunks = 1;
    else
        gp->window_chunks = 0;
    return 0;
}

static uint64_t kvo__auto_bpc(const kvo_group_desc *g, uint64_t min_bpc, uint64_t target) {
    uint64_t step_bytes, k = 1, bytes;
    if (!kvo__mul_u64(min_bpc, g->page_bytes, &step_bytes) && !kvo__mul_u64(step_bytes, g->layers, &step_bytes))
        while (k < (UINT64_C(1) << 40) && !kvo__mul_u64(step_bytes, k, &bytes) && bytes < target) k *= 2;
    uint64_t kmax = KVO_MAX_TOKENS_PER_CHUNK / ((uint64_t)min_bpc * g->tokens_per_block);
    while (k > 1 && k > kmax) k /= 2;
    return min_bpc * k;
}

static void kvo__fingerprint(kvo_plan *p, const kvo_plan_params *prm) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
#define KVO__PUT(v) do { uint64_t x_ = (uint64_t)(v); unsigned char b_[8]; \
        for (int i_ = 0; i_ < 8; i_++) b_[i_] = (unsigned char)(x_ >> (8 * i_)); \
        XXH3_128bits_update(&st, b_, 8); } while (0)
#define KVO__PUTS(s) do { size_t n_ = strlen(s); KVO__PUT(n_); XXH3_128bits_update(&st, (s), n_); } while (0)
    KVO__PUTS("kvoffload-layout/1");
    KVO__PUTS(p->model->name);
    KVO__PUT(p->model->tokens_per_hash);
    KVO__PUT(p->n_groups);
    for (size_t i = 0; i < p->n_groups; i++) {
        const kvo_group_plan *g = &p->groups[i];
        KVO__PUTS(g->name);
        KVO__PUT(g->kind);
        KVO__PUT(g->tokens_per_block);
        KVO__PUT(g->layers);
        KVO__PUT(g->page_bytes);
        KVO__PUT(g->window);
        KVO__PUT(g->cacheable);
        KVO__PUT(g->draft);
        KVO__PUT(g->offloaded);
        KVO__PUT(g->blocks_per_chunk);
    }
    KVO__PUTS(prm->dtype ? prm->dtype : "");
    KVO__PUT(prm->tp_size);
    KVO__PUT(prm->tp_size ? prm->tp_rank : 0);
#undef KVO__PUT
#undef KVO__PUTS
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    p->fingerprint.lo = h.low64;
    p->fingerprint.hi = h.high64;
}

int kvo_plan_create(const kvo_model *m, const kvo_plan_params *params, kvo_plan **out) {
    kvo_plan_params params_in_;
    KVO__PARAMS_IN(params, kvo_plan_params, params_in_, kvo_plan_default_params, tp_size, "kvo_plan_create");
    kvo_plan_params dflt = kvo_plan_default_params();
    const kvo_plan_params *prm = params ? params : &dflt;
    if (!m || !out) return kvo__error(KVO_EINVAL, "kvo_plan_create: model and out must not be NULL");
    if (m->n_groups == 0) return kvo__error(KVO_EINVAL, "model '%s' has no groups", m->name);
    if (prm->block_size && prm->blocks_per_chunk)
        return kvo__error(KVO_EINVAL, "give either block_size (%llu tokens per chunk) or blocks_per_chunk (%llu), "
                          "not both", (unsigned long long)prm->block_size,
                          (unsigned long long)prm->blocks_per_chunk);
    if (prm->n_overrides && !prm->overrides)
        return kvo__error(KVO_EINVAL, "n_overrides is %zu but overrides is NULL", prm->n_overrides);
    if (prm->tp_size && prm->tp_rank >= prm->tp_size)
        return kvo__error(KVO_EINVAL, "tp_rank %u must be below tp_size %u", prm->tp_rank, prm->tp_size);
    uint64_t target = prm->target_chunk_bytes ? prm->target_chunk_bytes : (UINT64_C(1) << 20);

    /* Overrides: each names a known, cacheable group, once, with a value >= 1. */
    uint64_t ovr[KVO_MAX_GROUPS] = {0};
    for (size_t i = 0; i < prm->n_overrides; i++) {
        const kvo_group_override *o = &prm->overrides[i];
        if (!o->group) return kvo__error(KVO_EINVAL, "override %zu has no group name", i);
        int id = -1;
        char names[512] = "";
        for (size_t g = 0; g < m->n_groups; g++) {
            if (strcmp(m->groups[g].name, o->group) == 0) id = (int)g;
            if (g) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, m->groups[g].name, sizeof names - strlen(names) - 1);
        }
        if (id < 0)
            return kvo__error(KVO_EINVAL, "override names unknown group '%s'; model '%s' has groups: %s",
                              o->group, m->name, names);
        if (!m->groups[id].cacheable)
            return kvo__error(KVO_EINVAL, "override for group '%s': the group is not cacheable and is never "
                              "offloaded; remove the override", o->group);
        if (o->blocks_per_chunk == 0)
            return kvo__error(KVO_EINVAL, "override for group '%s': blocks_per_chunk must be >= 1", o->group);
        if (ovr[id])
            return kvo__error(KVO_EINVAL, "group '%s' is overridden twice", o->group);
        ovr[id] = o->blocks_per_chunk;
    }

    kvo_plan *p = kvo__calloc(1, sizeof *p);
    if (!p) return kvo__error(KVO_ENOMEM, "kvo_plan_create: out of memory");
    p->model = kvo_model_clone(m);
    if (!p->model) {
        kvo__free(p);
        return kvo__error(KVO_ENOMEM, "kvo_plan_create: out of memory");
    }
    p->n_groups = m->n_groups;
    int rc = 0;
    for (size_t i = 0; i < m->n_groups && !rc; i++) {
        const kvo_group_desc *g = &m->groups[i];
        kvo_group_plan *gp = &p->groups[i];
        gp->id = (uint32_t)i;
        memcpy(gp->name, g->name, sizeof gp->name);
        gp->kind = g->kind;
        gp->tokens_per_block = g->tokens_per_block;
        gp->layers = g->layers;
        gp->page_bytes = g->page_bytes;
        gp->window = g->window;
        gp->cacheable = g->cacheable;
        gp->draft = g->draft;
        if (!g->cacheable) continue;
        char how[96];
        uint64_t bpc = 0, min_bpc = 0;
        if ((rc = kvo__min_bpc(m, g, &min_bpc))) break;
        if (ovr[i]) {
            bpc = ovr[i];
            snprintf(how, sizeof how, "override blocks_per_chunk %llu", (unsigned long long)bpc);
        } else if (prm->block_size) {
            if (prm->block_size % g->tokens_per_block != 0 || prm->block_size % m->tokens_per_hash != 0) {
                uint64_t unit = kvo__span_unit(m);
                uint64_t sugg = unit ? kvo__div_ceil_u64(prm->block_size, unit) * unit : 0;
                rc = kvo__error(KVO_EINVAL,
                                "group '%s': block_size %llu is not a multiple of %s %u; block_size must be a "
                                "multiple of %llu for this model (e.g. %llu), or use blocks_per_chunk",
                                g->name, (unsigned long long)prm->block_size,
                                prm->block_size % g->tokens_per_block ? "its tokens_per_block"
                                                                      : "the hash unit tokens_per_hash",
                                prm->block_size % g->tokens_per_block ? g->tokens_per_block : m->tokens_per_hash,
                                (unsigned long long)unit, (unsigned long long)sugg);
                break;
            }
            bpc = prm->block_size / g->tokens_per_block;
            snprintf(how, sizeof how, "block_size %llu", (unsigned long long)prm->block_size);
        } else if (prm->blocks_per_chunk) {
            bpc = prm->blocks_per_chunk;
            snprintf(how, sizeof how, "blocks_per_chunk %llu", (unsigned long long)bpc);
        } else {
            bpc = kvo__auto_bpc(g, min_bpc, target);
            snprintf(how, sizeof how, "the automatic plan (%llu blocks)", (unsigned long long)bpc);
        }
        rc = kvo__derive(m, gp, bpc, how);
    }
    if (!rc) {
        for (size_t i = 0; i < p->n_groups; i++)
            if (p->groups[i].offloaded && p->groups[i].slot_bytes > p->max_slot_bytes)
                p->max_slot_bytes = p->groups[i].slot_bytes;
        kvo__fingerprint(p, prm);
        rc = kvo_plan_check(p);
    }
    if (rc) {
        kvo_plan_destroy(p);
        return kvo__error_prefix(rc, "model '%s'", m->name);
    }
    *out = p;
    return 0;
}

int kvo_plan_check(const kvo_plan *p) {
    if (!p) return kvo__error(KVO_EINVAL, "kvo_plan_check: NULL plan");
    uint32_t tph = p->model->tokens_per_hash;
    for (size_t i = 0; i < p->n_groups; i++) {
        const kvo_group_plan *g = &p->groups[i];
        if (!g->offloaded) {
            if (g->blocks_per_chunk || g->tokens_per_chunk || g->chunk_bytes || g->slot_bytes)
                return kvo__error(KVO_EINVAL, "plan invariant: group '%s' is not offloaded but has chunk fields", g->name);
            continue;
        }
        uint64_t b;
        int bad = g->blocks_per_chunk == 0 ||
                  g->tokens_per_chunk != g->blocks_per_chunk * g->tokens_per_block ||
                  g->tokens_per_chunk % g->tokens_per_block || g->tokens_per_chunk % tph ||
                  g->tokens_per_chunk > KVO_MAX_TOKENS_PER_CHUNK ||
                  g->hashes_per_chunk * tph != g->tokens_per_chunk ||
                  kvo__mul_u64(g->blocks_per_chunk, g->page_bytes, &b) || kvo__mul_u64(b, g->layers, &b) ||
                  b != g->chunk_bytes || g->slot_bytes < g->chunk_bytes || g->slot_bytes % KVO_SLOT_ALIGN ||
                  g->slot_bytes - g->chunk_bytes >= KVO_SLOT_ALIGN ||
                  (g->kind == KVO_GROUP_SLIDING &&
                   g->window_chunks != kvo__div_ceil_u64(g->window, g->tokens_per_chunk) + 1) ||
                  (g->kind == KVO_GROUP_STATE && g->window_chunks != 1) ||
                  (g->kind == KVO_GROUP_FULL && g->window_chunks != 0);
        if (bad)
            return kvo__error(KVO_EINVAL, "plan invariant violated for group '%s' (bpc %llu, tpc %llu, bytes %llu)",
                              g->name, (unsigned long long)g->blocks_per_chunk,
                              (unsigned long long)g->tokens_per_chunk, (unsigned long long)g->chunk_bytes);
    }
    return 0;
}

void kvo_plan_destroy(kvo_plan *p) {
    if (!p) return;
    kvo_model_destroy(p->model);
    kvo__free(p);
}

const kvo_model *kvo_plan_model(const kvo_plan *p) { return p ? p->model : NULL; }
size_t kvo_plan_num_groups(const kvo_plan *p) { return p ? p->n_groups : 0; }
const kvo_group_plan *kvo_plan_group(const kvo_plan *p, size_t i) {
    return (p && i < p->n_groups) ? &p->groups[i] : NULL;
}
uint32_t kvo_plan_tokens_per_hash(const kvo_plan *p) { return p ? p->model->tokens_per_hash : 0; }
kvo_u128 kvo_plan_fingerprint(const kvo_plan *p) {
    kvo_u128 z = {0, 0};
    return p ? p->fingerprint : z;
}
uint64_t kvo_plan_max_slot_bytes(const kvo_plan *p) { return p ? p->max_slot_bytes : 0; }

int kvo_plan_to_json(const kvo_plan *p, char **out) {
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_plan_to_json: NULL argument");
    char hex[33];
    kvo_u128_hex(p->fingerprint, hex);
    json_t *root = json_object(), *groups = json_array();
    json_object_set_new(root, "model", json_string(p->model->name));
    json_object_set_new(root, "tokens_per_hash", json_integer(p->model->tokens_per_hash));
    json_object_set_new(root, "fingerprint", json_string(hex));
    for (size_t i = 0; i < p->n_groups; i++) {
        const kvo_group_plan *g = &p->groups[i];
        json_t *j = json_object();
        json_object_set_new(j, "name", json_string(g->name));
        json_object_set_new(j, "kind", json_string(kvo_group_kind_name(g->kind)));
        json_object_set_new(j, "tokens_per_block", json_integer(g->tokens_per_block));
        json_object_set_new(j, "layers", json_integer(g->layers));
        json_object_set_new(j, "page_bytes", json_integer((json_int_t)g->page_bytes));
        json_object_set_new(j, "blocks_per_chunk", json_integer((json_int_t)g->blocks_per_chunk));
        json_object_set_new(j, "tokens_per_chunk", json_integer((json_int_t)g->tokens_per_chunk));
        json_object_set_new(j, "hashes_per_chunk", json_integer((json_int_t)g->hashes_per_chunk));
        json_object_set_new(j, "chunk_bytes", json_integer((json_int_t)g->chunk_bytes));
        json_object_set_new(j, "slot_bytes", json_integer((json_int_t)g->slot_bytes));
        json_object_set_new(j, "offloaded", json_boolean(g->offloaded));
        json_object_set_new(j, "cacheable", json_boolean(g->cacheable));
        json_object_set_new(j, "draft", json_boolean(g->draft));
        json_object_set_new(j, "window", g->kind == KVO_GROUP_SLIDING ? json_integer(g->window) : json_null());
        json_object_set_new(j, "window_chunks", g->kind == KVO_GROUP_SLIDING && g->offloaded
                                                    ? json_integer((json_int_t)g->window_chunks) : json_null());
        json_array_append_new(groups, j);
    }
    json_object_set_new(root, "groups", groups);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    *out = s ? kvo__strdup(s) : NULL;
    free(s);
    return *out ? 0 : kvo__error(KVO_ENOMEM, "kvo_plan_to_json: out of memory");
}
