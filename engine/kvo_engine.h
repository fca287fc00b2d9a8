/*
 * The kvoffload reference engine: a small decoder-only transformer in plain C
 * (fp32, random weights from a seed) with paged KV memory, an engine-side
 * prefix cache and a scheduler, used to prove that offloading KV caches is
 * token- and logit-exact.  It uses only the public kvoffload API.
 *
 * Model.  Layers of three kinds, each kind its own KV-cache group with its own
 * tokens_per_block: full attention, sliding-window attention and a recurrent
 * state layer (a gated linear recurrence whose state is snapshotted at every
 * block boundary).  Shapes (kvo_eng_shape_config) name preset mixes.
 *
 * Memory.  Each group has a pool of engine blocks in host memory laid out as
 * one segment per layer (kvo_segment): layer l's page of block b is at
 * pool + (l * num_blocks + b) * page_bytes.  An attention page holds K then V
 * for tokens_per_block tokens (2 * tokens_per_block * d_model floats); a state
 * page holds the recurrent state after the block's last token (d_model floats).
 *
 * Determinism.  Every token is computed alone, in position order, by the same
 * code whatever the batch, with fixed summation order and no threads, so the
 * output depends only on the tokens and on the bytes in the KV pages: bytes
 * loaded from a tier give exactly the result of recomputing them.
 *
 * Thread rule: an engine is used by one thread at a time.  Ownership: results
 * and workloads are owned by the caller and freed with the matching _free.
 * Errors: int (0 or a negative KVO_E* code); kvo_eng_last_error() gives the
 * message (the engine's own, or the library's for failures it passes on).
 */
#ifndef KVO_ENGINE_H
#define KVO_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvoffload/kvo.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVO_ENG_MAX_GROUPS 8
#define KVO_ENG_NULL_BLOCK UINT64_MAX /* block-table entry with no block */

/** Detailed message for the most recent engine failure on this thread. */
const char *kvo_eng_last_error(void);

/* ------------------------------------------------------------ config -- */

typedef struct kvo_eng_group_cfg {
    char name[32];
    kvo_group_kind kind;
    uint32_t tokens_per_block; /* >= 1 */
    uint32_t layers;           /* >= 1 */
    uint32_t window;           /* sliding only, >= 1 */
} kvo_eng_group_cfg;

typedef struct kvo_eng_config {
    char shape[32];             /* preset name, informative */
    uint32_t vocab;             /* default 512 */
    uint32_t d_model;           /* default 64; multiple of n_heads */
    uint32_t n_heads;           /* default 4; head dim even (RoPE) */
    uint32_t d_ff;              /* default 128 */
    uint32_t tokens_per_hash;   /* the model's hash unit; default 16 */
    uint32_t max_seq;           /* longest sequence (prompt + generated) */
    uint64_t seed;              /* weights */
    uint64_t budget_tokens;     /* engine KV budget: group g gets
                                   budget_tokens / tokens_per_block_g blocks */
    uint32_t n_groups;
    kvo_eng_group_cfg groups[KVO_ENG_MAX_GROUPS];
} kvo_eng_config;

/** Preset shapes: "single" (one full group), "hybrid" (full + sliding with
 *  different block sizes), "hybrid-state" (full + sliding + state),
 *  "tiny-blocks" (a 4-token-block group under a 16-token hash unit). */
size_t kvo_eng_shape_count(void);
const char *kvo_eng_shape_name(size_t i);
/** Fill *out with a preset shape (defaults for everything else).
 *  KVO_ENOTFOUND (message lists the shapes). */
int kvo_eng_shape_config(const char *name, kvo_eng_config *out);

/* ------------------------------------------------------------ engine -- */

typedef struct kvo_eng kvo_eng;

/** Create an engine: weights from cfg->seed, KV pools from budget_tokens.
 *  Errors: KVO_EINVAL (bad shape: message names the field), KVO_ENOMEM. */
int kvo_eng_create(const kvo_eng_config *cfg, kvo_eng **out);
void kvo_eng_destroy(kvo_eng *e);
const kvo_eng_config *kvo_eng_get_config(const kvo_eng *e);
/** The engine's groups as a kvoffload model (page_bytes = one block of one
 *  layer).  Owned by the engine. */
const kvo_model *kvo_eng_model(const kvo_eng *e);
/** The engine's KV layout, one segment per (group, layer), for
 *  kvo_transfer_set_layout.  Owned by the engine. */
const kvo_segment *kvo_eng_segments(const kvo_eng *e, size_t *n);
/** Blocks in group g's pool. */
uint64_t kvo_eng_num_blocks(const kvo_eng *e, uint32_t g);
/** Parameter count (weights), for reports. */
uint64_t kvo_eng_param_count(const kvo_eng *e);
/** Bytes of KV (all groups, all layers) for n tokens of a full sequence. */
uint64_t kvo_eng_kv_bytes(const kvo_eng *e, uint64_t n_tokens);
/** Forget every cached block no request holds (forced engine eviction). */
void kvo_eng_evict_cached(kvo_eng *e);

/* ---------------------------------------------------------- requests -- */

typedef struct kvo_eng_request {
    uint64_t id;
    const uint32_t *prompt;  /* token ids < vocab; borrowed during run */
    uint32_t prompt_len;     /* >= 1 */
    uint32_t max_new;        /* tokens to generate, >= 1 */
} kvo_eng_request;

/** A running request as an offload hook sees it. */
typedef struct kvo_eng_req kvo_eng_req;
typedef struct kvo_eng_result kvo_eng_result;
uint64_t kvo_eng_req_id(const kvo_eng_req *r);
/** The request's token ids so far (prompt, then generated). */
const uint32_t *kvo_eng_req_tokens(const kvo_eng_req *r, uint32_t *n);
uint32_t kvo_eng_req_prompt_len(const kvo_eng_req *r);
/** Group g's block table: *n entries (blocks covering the tokens so far),
 *  KVO_ENG_NULL_BLOCK where the engine holds no block (sliding blocks out of
 *  the window, state snapshots not needed).  Valid until the engine runs
 *  again. */
const uint64_t *kvo_eng_req_blocks(const kvo_eng_req *r, uint32_t g, uint32_t *n);
/** Tokens whose KV is valid in the engine. */
uint32_t kvo_eng_req_computed(const kvo_eng_req *r);
/** The request's result record (hooks may fill the offload fields). */
kvo_eng_result *kvo_eng_req_result(kvo_eng_req *r);

/* Offload hooks: what a scheduler calls to reuse prefixes through an external
 * cache (the kvoffload connector).  All optional except lookup.  Called on the
 * engine's thread. */
typedef struct kvo_eng_offload {
    void *ctx;
    /* A request is about to start; `local` prompt tokens are already in
     * engine blocks (engine prefix cache).  Set *hit >= local to the prompt
     * tokens that can be loaded (hit == local: none), < prompt_len.  Return
     * KVO_EAGAIN to be asked again later; other errors count as a miss. */
    int (*lookup)(void *ctx, kvo_eng_req *r, uint32_t local, uint32_t *hit);
    /* The engine allocated blocks for tokens [local, hit) (sliding groups:
     * only blocks touching the last `window` tokens before hit; state groups:
     * only the block ending at hit).  Start loading them. */
    int (*load)(void *ctx, kvo_eng_req *r, uint32_t local, uint32_t hit);
    /* 1 when the load finished, with *valid = tokens [0, valid) now usable
     * (valid < hit after a failure: the engine recomputes); 0 not yet. */
    int (*poll_load)(void *ctx, kvo_eng_req *r, uint32_t *valid);
    /* The request's computed tokens grew to n (blocks filled): store. */
    int (*computed)(void *ctx, kvo_eng_req *r, uint32_t n);
    /* Group g's block table entry `index` is about to be released (sliding
     * window): finish any store reading it first. */
    int (*release)(void *ctx, kvo_eng_req *r, uint32_t g, uint32_t index);
    /* The request finished (or failed); stores reading its blocks must be
     * complete when this returns. */
    int (*finish)(void *ctx, kvo_eng_req *r);
    /* Called once per scheduler step (drive completions). */
    void (*progress)(void *ctx);
} kvo_eng_offload;

struct kvo_eng_result {
    uint64_t id;
    uint32_t prompt_len;
    uint32_t n_gen;
    uint32_t *tokens;          /* n_gen generated ids */
    float *final_logits;       /* vocab floats: logits of the last step */
    uint64_t logits_hash;      /* hash of every step's logits, bit-exact */
    uint32_t tokens_local;     /* prompt tokens reused from engine blocks */
    uint32_t tokens_loaded;    /* prompt tokens loaded through offload */
    uint32_t tokens_computed;  /* prompt tokens computed */
    uint32_t tokens_loaded_file; /* of tokens_loaded: some chunk came from the file tier
                                    (and none from the remote tier) */
    uint32_t load_failures;    /* loads that fell back to recompute */
    uint64_t bytes_loaded;     /* offload bytes copied in / out for this request */
    uint64_t bytes_stored;
    /* Times from arrival: every request of a kvo_eng_run call arrives when
     * the call starts, so these include the wait for a running slot. */
    double ttft_s;             /* arrival to first token */
    double e2e_s;              /* arrival to last token */
    double queue_s;            /* arrival to admission (of ttft_s) */
    uint32_t tokens_loaded_remote; /* of tokens_loaded: some chunk came from the remote tier */
};

typedef struct kvo_eng_run_params {
    uint32_t max_running;       /* concurrent requests; default 4 */
    uint32_t prefill_chunk;     /* prompt tokens per request per step; default 128 */
    bool prefix_cache;          /* reuse engine blocks across requests; default true */
    const kvo_eng_offload *offload; /* NULL: no offloading */
    uint32_t evict_every;       /* forced eviction of cached engine blocks after
                                   every k finished requests; 0 never */
    uint32_t release_align;     /* sliding groups: a block that left the window
                                   is released only once every token of its
                                   aligned span of this many tokens is computed
                                   (set to the offload chunk size so whole
                                   chunks can be stored); 0 = block by block */
    void (*on_done)(void *ctx, size_t done, size_t total); /* progress */
    void *on_done_ctx;
} kvo_eng_run_params;

kvo_eng_run_params kvo_eng_run_default_params(void);

typedef struct kvo_eng_stats {
    uint64_t steps;
    uint64_t tokens_forward;    /* token forwards (prompt + decode) */
    uint64_t block_evictions;   /* cached blocks dropped for reuse */
    uint64_t forced_evictions;
} kvo_eng_stats;

/** Run n requests to completion; results[i] for reqs[i] (caller frees with
 *  kvo_eng_results_free).  Errors: KVO_EINVAL (bad request: token >= vocab,
 *  too long), KVO_ENOSPC (a request alone does not fit the block budget:
 *  message gives the blocks needed), errors from hooks other than lookup. */
int kvo_eng_run(kvo_eng *e, const kvo_eng_request *reqs, size_t n, const kvo_eng_run_params *p,
                kvo_eng_result *results);
void kvo_eng_results_free(kvo_eng_result *results, size_t n);
void kvo_eng_get_stats(const kvo_eng *e, kvo_eng_stats *out);

/** Compare two runs: 0 when every generated token, the logits hash and the
 *  final logits are bit-identical; else the index+1 of the first differing
 *  request (message in *why, may be NULL). */
size_t kvo_eng_results_compare(const kvo_eng_result *a, const kvo_eng_result *b, size_t n, uint32_t vocab,
                               char *why, size_t why_len);

/* ---------------------------------------------------------- workload -- */

typedef struct kvo_eng_workload_params {
    const char *trace_path;        /* Mooncake JSONL; NULL: synthetic conversations */
    size_t max_requests;           /* default 48 */
    uint32_t tokens_per_trace_block; /* a 512-token trace block becomes this many; default 16 */
    uint32_t max_trace_blocks;     /* prompt cap in trace blocks; default 48 */
    uint32_t max_new_tokens;       /* cap on output_length; default 4 */
    uint32_t min_turns;            /* keep conversations with >= this many requests; default 3 */
    uint32_t vocab;                /* default 512 */
    uint64_t seed;                 /* token ids; default 7 */
} kvo_eng_workload_params;

kvo_eng_workload_params kvo_eng_workload_default_params(void);

typedef struct kvo_eng_workload {
    kvo_eng_request *reqs;
    size_t n;
    uint32_t *tokens;        /* storage of every prompt */
    uint64_t prompt_tokens;  /* sum of prompt lengths */
    uint32_t max_prompt;
    uint32_t max_new;
    char source[256];        /* where it came from */
} kvo_eng_workload;

/** Build requests from a Mooncake trace: conversations (requests sharing
 *  their first block id) with >= min_turns turns, in order of first
 *  appearance, all their turns, in trace order, until max_requests.  Block id
 *  k becomes tokens_per_trace_block token ids from a PRNG keyed by (seed, k),
 *  so equal ids give equal tokens.  Errors: KVO_EIO, KVO_EPARSE (line
 *  number), KVO_ENOTFOUND (no request selected), KVO_ENOMEM. */
int kvo_eng_workload_load(const kvo_eng_workload_params *p, kvo_eng_workload **out);
void kvo_eng_workload_free(kvo_eng_workload *w);

#ifdef __cplusplus
}
#endif
#endif
