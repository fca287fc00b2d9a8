/*
 * kvoffload geometry layer: a model's KV cache described as groups, and the
 * chunk plan that says how each group is cut into offloaded chunks.
 *
 * Terms
 *  - group: a set of layers that share one block table in the engine (full
 *    attention, sliding-window attention, recurrent state, draft model...).
 *    Group ids are indices in the model's group order.
 *  - block: the engine's unit of KV memory for one group, covering
 *    tokens_per_block tokens; one page of page_bytes per layer.
 *  - hash unit: tokens_per_hash tokens; request tokens are hashed in units.
 *  - chunk: blocks_per_chunk consecutive blocks of one group, the unit that is
 *    keyed, stored and loaded.  Each group has its own chunk geometry.
 *
 * Invariants of every accepted plan (checked by kvo_plan_create, asserted by
 * kvo_plan_check):
 *  - for every offloaded group: tokens_per_chunk = blocks_per_chunk *
 *    tokens_per_block, a multiple of tokens_per_hash, at most 2^31;
 *    hashes_per_chunk = tokens_per_chunk / tokens_per_hash;
 *    chunk_bytes = layers * blocks_per_chunk * page_bytes < 2^63;
 *    slot_bytes = chunk_bytes rounded up to 4096;
 *  - sliding groups: window_chunks = ceil(window / tokens_per_chunk) + 1, the
 *    chunks that cover the last `window` tokens before a boundary that may fall
 *    anywhere inside a chunk; state groups: window_chunks = 1; full: 0;
 *  - a group that is not cacheable is not offloaded and has zero chunk fields.
 */
#ifndef KVOFFLOAD_KVO_GEOMETRY_H
#define KVOFFLOAD_KVO_GEOMETRY_H

#include "kvo_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVO_NAME_MAX 64          /* group and model names, including the NUL */
#define KVO_MAX_GROUPS 64
#define KVO_MAX_TOKENS_PER_CHUNK (UINT64_C(1) << 31)
#define KVO_SLOT_ALIGN 4096u

typedef enum kvo_group_kind {
    KVO_GROUP_FULL = 0,     /* every token's KV is kept */
    KVO_GROUP_SLIDING = 1,  /* only the last `window` tokens matter */
    KVO_GROUP_STATE = 2     /* a fixed-size state snapshot per block boundary */
} kvo_group_kind;

/** "full", "sliding", "state"; "?" for an unknown value. */
KVO_API const char *kvo_group_kind_name(kvo_group_kind k);

/** One KV-cache group as the engine has it. */
typedef struct kvo_group_desc {
    char name[KVO_NAME_MAX];
    kvo_group_kind kind;
    uint32_t tokens_per_block;  /* >= 1 */
    uint32_t layers;            /* >= 1 */
    uint64_t page_bytes;        /* bytes of one block of one layer, >= 1 */
    uint32_t window;            /* sliding only: window in tokens, >= 1 */
    bool cacheable;             /* false: never reused from a prefix, not offloaded */
    bool draft;                 /* speculative-decoding draft-model group */
} kvo_group_desc;

/** A group with defaults: kind full, cacheable, not draft, zero sizes. */
KVO_API kvo_group_desc kvo_group_desc_default(void);

/* ---------------------------------------------------------------- model -- */

/** A model's KV-cache description: a name, tokens_per_hash and 1..64 groups.
 *  Opaque.  Immutable after it is handed to kvo_plan_create (the plan keeps its
 *  own copy).  Not thread-safe for concurrent modification; concurrent reads
 *  are fine. */
typedef struct kvo_model kvo_model;

/** Create an empty model.  name: 1..63 bytes, copied.  tokens_per_hash >= 1.
 *  *out receives a new model owned by the caller (kvo_model_destroy).
 *  Errors: KVO_EINVAL (NULL, empty or long name, zero tokens_per_hash),
 *  KVO_ENOMEM. */
KVO_API int kvo_model_create(const char *name, uint32_t tokens_per_hash, kvo_model **out);

/** Append a group (copied); its id is the previous group count.  The group is
 *  validated: names unique and 1..63 bytes, sizes >= 1, window >= 1 for sliding
 *  and 0 otherwise.  Errors: KVO_EINVAL naming the group and field, KVO_ERANGE
 *  when more than KVO_MAX_GROUPS groups. */
KVO_API int kvo_model_add_group(kvo_model *m, const kvo_group_desc *g);

/** Parse a model in the kvoffload-model/1 JSON format (see docs/model-format.md)
 *  from len bytes of text.  Errors: KVO_EPARSE (malformed JSON: message gives
 *  line and column), KVO_EINVAL (missing field, wrong type, bad value: message
 *  names the field and the group), KVO_ERANGE (numbers out of range),
 *  KVO_ENOMEM.  source names the input in messages (a path; may be NULL). */
KVO_API int kvo_model_from_json(const char *text, size_t len, const char *source, kvo_model **out);

/** Load a kvoffload-model/1 JSON file.  Errors as kvo_model_from_json, plus
 *  KVO_EIO when the file cannot be read. */
KVO_API int kvo_model_load_file(const char *path, kvo_model **out);

/** Built-in presets, with the same names as the files in shared/models.
 *  kvo_model_preset_name(i) for i < kvo_model_preset_count() lists them. */
KVO_API size_t kvo_model_preset_count(void);
KVO_API const char *kvo_model_preset_name(size_t i);
/** Create a preset model.  Errors: KVO_ENOTFOUND (message lists the presets). */
KVO_API int kvo_model_preset(const char *name, kvo_model **out);

/** Load by preset name, or else as a file path.  Errors as both. */
KVO_API int kvo_model_open(const char *preset_or_path, kvo_model **out);

/** Import a Hugging Face config.json (text): num_hidden_layers,
 *  num_key_value_heads, head_dim (or hidden_size / num_attention_heads),
 *  sliding_window, layer_types, torch_dtype.  Produces one full group and, when
 *  sliding layers exist, one sliding group; page_bytes = 2 * kv_heads *
 *  head_dim * dtype_bytes * tokens_per_block.  Errors: KVO_EPARSE, KVO_EINVAL
 *  naming the missing field, KVO_ERANGE when page_bytes would exceed 2^62
 *  (the message names the fields and their values), KVO_ENOTSUP for layouts
 *  it cannot express. */
KVO_API int kvo_model_from_hf_config(const char *text, size_t len, const char *name,
                             uint32_t tokens_per_block, uint32_t tokens_per_hash,
                             kvo_model **out);

/** Serialise a model as kvoffload-model/1 JSON.  *out is a NUL-terminated
 *  string allocated with the library allocator: free with kvo_free(). */
KVO_API int kvo_model_to_json(const kvo_model *m, char **out);

KVO_API void kvo_model_destroy(kvo_model *m);
KVO_API kvo_model *kvo_model_clone(const kvo_model *m); /* NULL on ENOMEM */
KVO_API const char *kvo_model_name(const kvo_model *m);
KVO_API uint32_t kvo_model_tokens_per_hash(const kvo_model *m);
KVO_API size_t kvo_model_num_groups(const kvo_model *m);
/** Group i (< num_groups), or NULL.  Valid while the model lives. */
KVO_API const kvo_group_desc *kvo_model_group(const kvo_model *m, size_t i);
/** Id of the group named name, or KVO_ENOTFOUND. */
KVO_API int kvo_model_find_group(const kvo_model *m, const char *name);

/** Free memory the library returned to the caller (strings from *_to_json). */
KVO_API void kvo_free(void *p);

/* ----------------------------------------------------------------- plan -- */

/** A per-group blocks_per_chunk override. */
typedef struct kvo_group_override {
    const char *group;          /* group name */
    uint32_t blocks_per_chunk;  /* >= 1 */
} kvo_group_override;

/** How to chunk.  Give at most one of block_size and blocks_per_chunk; overrides
 *  may be combined with either or with the automatic plan. */
typedef struct kvo_plan_params {
    size_t struct_size;   /* sizeof(kvo_plan_params): kvo_plan_default_params() sets it */
    /* Legacy: tokens per offloaded chunk.  Group g gets block_size /
     * tokens_per_block_g blocks per chunk.  0 = not given. */
    uint64_t block_size;
    /* One block count for every group.  0 = not given. */
    uint64_t blocks_per_chunk;
    const kvo_group_override *overrides;
    size_t n_overrides;
    /* Automatic plan target: each group's chunk grows (in steps of its
     * smallest valid span) until it carries at least this many bytes.
     * Default 1 MiB. */
    uint64_t target_chunk_bytes;
    /* Optional byte-relevant extras that go into the fingerprint. */
    const char *dtype;          /* e.g. "bf16"; NULL = not given */
    uint32_t tp_rank;           /* tensor-parallel rank and size; size 0 = not given */
    uint32_t tp_size;
} kvo_plan_params;

KVO_API kvo_plan_params kvo_plan_default_params(void);

/** The derived chunk geometry of one group. */
typedef struct kvo_group_plan {
    uint32_t id;
    char name[KVO_NAME_MAX];
    kvo_group_kind kind;
    uint32_t tokens_per_block;
    uint32_t layers;
    uint64_t page_bytes;
    uint32_t window;
    bool cacheable;
    bool draft;
    bool offloaded;             /* false: the fields below are 0 */
    uint64_t blocks_per_chunk;
    uint64_t tokens_per_chunk;
    uint64_t hashes_per_chunk;
    uint64_t chunk_bytes;       /* layers * blocks_per_chunk * page_bytes */
    uint64_t slot_bytes;        /* chunk_bytes rounded up to KVO_SLOT_ALIGN */
    uint64_t window_chunks;     /* sliding: ceil(window/tokens_per_chunk)+1; state: 1; full: 0 */
} kvo_group_plan;

/** A validated chunk plan.  Opaque, immutable, thread-safe to read; owns a copy
 *  of the model. */
typedef struct kvo_plan kvo_plan;

/** Build and validate a plan.  params NULL = defaults (automatic plan).
 *  Errors (message names the group, the numbers and a value that would work):
 *  KVO_EINVAL (both block_size and blocks_per_chunk given; an override naming an
 *  unknown group or zero; a block_size not divisible by a group's
 *  tokens_per_block or by tokens_per_hash; a chunk smaller than the hash unit),
 *  KVO_ERANGE (spans over 2^31 tokens or bytes over 2^63), KVO_ENOMEM. */
KVO_API int kvo_plan_create(const kvo_model *m, const kvo_plan_params *params, kvo_plan **out);
KVO_API void kvo_plan_destroy(kvo_plan *p);

KVO_API const kvo_model *kvo_plan_model(const kvo_plan *p);
KVO_API size_t kvo_plan_num_groups(const kvo_plan *p);
/** Group i's plan (i < num_groups) or NULL.  Valid while the plan lives. */
KVO_API const kvo_group_plan *kvo_plan_group(const kvo_plan *p, size_t i);
KVO_API uint32_t kvo_plan_tokens_per_hash(const kvo_plan *p);
/** Stable XXH3-128 hash of everything that changes stored bytes: model name,
 *  tokens_per_hash, every group's name, kind, tokens_per_block, layers,
 *  page_bytes, window, cacheable, draft and derived chunking, dtype and tp
 *  rank/size when given.  Not: notes, JSON formatting, or how the chunking was
 *  asked for (block_size vs blocks_per_chunk giving the same plan). */
KVO_API kvo_u128 kvo_plan_fingerprint(const kvo_plan *p);
/** The largest slot_bytes over offloaded groups. */
KVO_API uint64_t kvo_plan_max_slot_bytes(const kvo_plan *p);
/** Re-check every invariant above.  0 or KVO_EINVAL with a message. */
KVO_API int kvo_plan_check(const kvo_plan *p);
/** The plan as JSON (model, tokens_per_hash, fingerprint, groups[]).  *out
 *  allocated by the library: kvo_free(). */
KVO_API int kvo_plan_to_json(const kvo_plan *p, char **out);

#ifdef __cplusplus
}
#endif
#endif
