/*
 * The model description: a name, the hash unit and up to KVO_MAX_GROUPS
 * groups, held by value in one allocation (no pointers inside), so that
 * clone is a memcpy and a plan can own a private copy.
 *
 * Validation happens when a group is added, so a kvo_model never holds a
 * group that violates the per-group rules: sizes >= 1, a window exactly for
 * sliding groups, unique names.  Cross-group rules (chunking) belong to the
 * plan.
 */
#include <stdlib.h>

#include "geometry/geometry_internal.h"

const char *kvo_group_kind_name(kvo_group_kind k) {
    switch (k) {
    case KVO_GROUP_FULL: return "full";
    case KVO_GROUP_SLIDING: return "sliding";
    case KVO_GROUP_STATE: return "state";
    }
    return "?";
}

kvo_group_desc kvo_group_desc_default(void) {
    kvo_group_desc g;
    memset(&g, 0, sizeof g);
    g.kind = KVO_GROUP_FULL;
    g.cacheable = true;
    return g;
}

static int kvo__name_ok(const char *name) {
    size_t n = strnlen(name, KVO_NAME_MAX);
    return n > 0 && n < KVO_NAME_MAX;
}

int kvo_model_create(const char *name, uint32_t tokens_per_hash, kvo_model **out) {
    if (!name || !out) return kvo__error(KVO_EINVAL, "kvo_model_create: name and out must not be NULL");
    if (!kvo__name_ok(name))
        return kvo__error(KVO_EINVAL, "model name must be 1..%d bytes", KVO_NAME_MAX - 1);
    if (tokens_per_hash == 0)
        return kvo__error(KVO_EINVAL, "model '%s': tokens_per_hash must be >= 1 (typical: 16)", name);
    kvo_model *m = kvo__calloc(1, sizeof *m);
    if (!m) return kvo__error(KVO_ENOMEM, "kvo_model_create: out of memory");
    kvo__strlcpy(m->name, name, sizeof m->name);
    m->tokens_per_hash = tokens_per_hash;
    *out = m;
    return 0;
}

int kvo__group_validate(const kvo_model *m, const kvo_group_desc *g, size_t id) {
    if (!kvo__name_ok(g->name))
        return kvo__error(KVO_EINVAL, "group %zu: name must be 1..%d bytes", id, KVO_NAME_MAX - 1);
    const char *n = g->name;
    if (g->kind != KVO_GROUP_FULL && g->kind != KVO_GROUP_SLIDING && g->kind != KVO_GROUP_STATE)
        return kvo__error(KVO_EINVAL, "group '%s': kind %d is not full, sliding or state", n, (int)g->kind);
    if (g->tokens_per_block == 0)
        return kvo__error(KVO_EINVAL, "group '%s': tokens_per_block must be >= 1", n);
    if ((uint64_t)g->tokens_per_block > KVO_MAX_TOKENS_PER_CHUNK)
        return kvo__error(KVO_ERANGE, "group '%s': tokens_per_block %u exceeds 2^31", n, g->tokens_per_block);
    if (g->layers == 0)
        return kvo__error(KVO_EINVAL, "group '%s': layers must be >= 1", n);
    if (g->page_bytes == 0)
        return kvo__error(KVO_EINVAL, "group '%s': page_bytes must be >= 1", n);
    if (g->page_bytes > (UINT64_C(1) << 62))
        return kvo__error(KVO_ERANGE, "group '%s': page_bytes %llu exceeds 2^62", n,
                          (unsigned long long)g->page_bytes);
    if (g->kind == KVO_GROUP_SLIDING && g->window == 0)
        return kvo__error(KVO_EINVAL, "group '%s': a sliding group needs window >= 1 (tokens)", n);
    if (g->kind != KVO_GROUP_SLIDING && g->window != 0)
        return kvo__error(KVO_EINVAL, "group '%s': window %u is only valid for sliding groups (kind is %s)",
                          n, g->window, kvo_group_kind_name(g->kind));
    for (size_t i = 0; i < m->n_groups && i < id; i++)
        if (strcmp(m->groups[i].name, n) == 0)
            return kvo__error(KVO_EINVAL, "group %zu: name '%s' is already used by group %zu", id, n, i);
    return 0;
}

int kvo_model_add_group(kvo_model *m, const kvo_group_desc *g) {
    if (!m || !g) return kvo__error(KVO_EINVAL, "kvo_model_add_group: model and group must not be NULL");
    if (m->n_groups >= KVO_MAX_GROUPS)
        return kvo__error(KVO_ERANGE, "model '%s': at most %d groups", m->name, KVO_MAX_GROUPS);
    int rc = kvo__group_validate(m, g, m->n_groups);
    if (rc) return kvo__error_prefix(rc, "model '%s'", m->name);
    m->groups[m->n_groups++] = *g;
    return 0;
}

void kvo_model_destroy(kvo_model *m) { kvo__free(m); }

kvo_model *kvo_model_clone(const kvo_model *m) {
    if (!m) return NULL;
    kvo_model *c = kvo__malloc(sizeof *c);
    if (c) memcpy(c, m, sizeof *c);
    return c;
}

const char *kvo_model_name(const kvo_model *m) { return m ? m->name : NULL; }
uint32_t kvo_model_tokens_per_hash(const kvo_model *m) { return m ? m->tokens_per_hash : 0; }
size_t kvo_model_num_groups(const kvo_model *m) { return m ? m->n_groups : 0; }
const kvo_group_desc *kvo_model_group(const kvo_model *m, size_t i) {
    return (m && i < m->n_groups) ? &m->groups[i] : NULL;
}
int kvo_model_find_group(const kvo_model *m, const char *name) {
    if (!m || !name) return kvo__error(KVO_EINVAL, "kvo_model_find_group: NULL argument");
    for (size_t i = 0; i < m->n_groups; i++)
        if (strcmp(m->groups[i].name, name) == 0) return (int)i;
    return kvo__error(KVO_ENOTFOUND, "model '%s' has no group named '%s'", m->name, name);
}
