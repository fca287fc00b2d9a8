/* Internal layout of the geometry objects. */
#ifndef KVO_GEOMETRY_INTERNAL_H
#define KVO_GEOMETRY_INTERNAL_H

#include "core/internal.h"

struct kvo_model {
    char name[KVO_NAME_MAX];
    uint32_t tokens_per_hash;
    size_t n_groups;
    kvo_group_desc groups[KVO_MAX_GROUPS];
};

struct kvo_plan {
    kvo_model *model;
    size_t n_groups;
    kvo_group_plan groups[KVO_MAX_GROUPS];
    kvo_u128 fingerprint;
    uint64_t max_slot_bytes;
};

/* Validate one group description against the model (id = index it would get). */
int kvo__group_validate(const kvo_model *m, const kvo_group_desc *g, size_t id);

#endif
