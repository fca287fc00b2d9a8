/*
 * Internal layout of the geometry objects, shared by the geometry files.
 *
 * Layering (a file calls kvo_/kvo__ functions only of the files below it;
 * tools/check-layering.py fails on a cycle):
 *   model_open.c   top: kvo_model_open, "a preset name or a path" ->
 *                  presets.c or model_json.c
 *   plan.c         the chunk plan and its fingerprint -> model.c
 *   presets.c      the built-in geometries (JSON text) -> model_json.c
 *   model_json.c   kvoffload-model/1 and HF config.json parsing, to_json
 *                  -> model.c
 *   model.c        leaf: the model object, group validation, accessors
 */
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
