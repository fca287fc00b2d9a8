/* Internal declarations shared by the reference engine's files.
 *
 * Layering (a file calls only files below it; tools/check-layering.py checks):
 *   offload.c                 the engine <-> kvoffload connector glue
 *   sched.c   workload.c      the scheduler; the request generator
 *   transformer.c             the model: shapes, weights, forward pass
 *   kvcache.c                 the paged block pools
 *   errors.c                  kvo_eng_last_error's message (a leaf)
 */
#ifndef KVO_ENGINE_INTERNAL_H
#define KVO_ENGINE_INTERNAL_H

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvo_engine.h"

/* errors.c: set kvo_eng_last_error() and return code. */
int kvo__eng_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Pass a library failure on, prefixing its message. */
int kvo__eng_lib_error(int code, const char *what);

/* transformer.c: the weights' random stream. */
uint64_t kvo__eng_splitmix(uint64_t *state);
static inline uint64_t kvo__eng_mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* ---- block pool of one group (kvcache.c) ------------------------------ */

typedef struct kvo__eng_pool {
    uint32_t group;
    kvo_group_kind kind;
    uint32_t tpb;           /* tokens per block */
    uint32_t layers;
    uint32_t window;
    uint64_t page_bytes;    /* one block of one layer */
    uint64_t num_blocks;
    float *mem;             /* layers * num_blocks * page_bytes */
    uint32_t *ref;          /* holders per block */
    /* LRU of blocks no request holds: head = next to reuse. Unhashed blocks
     * go to the head, cached (hashed) ones to the tail. */
    uint64_t *prev, *next;
    uint64_t lru_head, lru_tail, n_free;
    /* prefix-hash index of cached blocks (chained buckets) */
    bool *hashed;
    uint64_t *hlo, *hhi;    /* the hash of the block's last token's prefix */
    uint64_t *chain;        /* next block in the bucket */
    uint64_t *bucket;
    uint64_t n_buckets;     /* power of two */
    uint64_t evictions;
} kvo__eng_pool;

int kvo__eng_pool_init(kvo__eng_pool *p, uint32_t group, const kvo_eng_group_cfg *g, uint64_t page_bytes,
                       uint64_t num_blocks);
void kvo__eng_pool_free(kvo__eng_pool *p);
/* A free block (LRU head; its cached hash is dropped), ref = 1.  KVO_ENOSPC. */
int kvo__eng_pool_alloc(kvo__eng_pool *p, uint64_t *block);
void kvo__eng_pool_release(kvo__eng_pool *p, uint64_t block);
/* Find a cached block by hash; KVO_ENG_NULL_BLOCK if none.  No ref taken. */
uint64_t kvo__eng_pool_find(const kvo__eng_pool *p, uint64_t lo, uint64_t hi);
/* Take a ref on a block found by find (removing it from the LRU if free). */
void kvo__eng_pool_take(kvo__eng_pool *p, uint64_t block);
/* Register a full block's hash (no-op if that hash is already cached). */
void kvo__eng_pool_set_hash(kvo__eng_pool *p, uint64_t block, uint64_t lo, uint64_t hi);
void kvo__eng_pool_drop_cached(kvo__eng_pool *p);
static inline float *kvo__eng_page(const kvo__eng_pool *p, uint32_t layer, uint64_t block) {
    return (float *)((char *)p->mem + ((uint64_t)layer * p->num_blocks + block) * p->page_bytes);
}

/* ---- the model (transformer.c) ----------------------------------------- */

typedef struct kvo__eng_layer {
    uint32_t group;         /* pool index */
    uint32_t in_group;      /* layer index within the group */
    kvo_group_kind kind;
    float *norm1, *norm2;   /* D */
    float *wq, *wk, *wv, *wo; /* D x D (attention) */
    float *wa, *ba, *wu, *wg; /* state: D x D, D, D x D, D x D (wo shared name) */
    float *w1, *w2;         /* F x D, D x F */
} kvo__eng_layer;

struct kvo_eng {
    kvo_eng_config cfg;
    uint32_t n_layers;
    uint32_t head_dim;
    kvo__eng_layer *layers;
    float *weights;         /* one allocation */
    uint64_t n_params;
    float *emb, *lm_head, *final_norm; /* V x D, V x D, D */
    float *rope_cos, *rope_sin;        /* max_seq x head_dim/2 */
    kvo__eng_pool pools[KVO_ENG_MAX_GROUPS];
    kvo_model *model;
    kvo_segment *segs;
    size_t n_segs;
    uint32_t state_layers_max;         /* state layers in the state group(s) */
    /* scratch for one token */
    float *x, *xn, *q, *k, *v, *o, *h, *tmp, *att;
    kvo_eng_stats stats;
    /* settings of the current run */
    bool run_prefix_cache;
    uint32_t release_align;
};

/* Per-request compute state the forward pass needs. */
typedef struct kvo__eng_seq {
    uint64_t *tables[KVO_ENG_MAX_GROUPS]; /* block tables */
    float *state;                         /* running recurrent state: state layers x D */
} kvo__eng_seq;

/* Forward token `tok` at position t; writes its KV / state snapshot; when
 * logits != NULL computes the vocab logits. */
void kvo__eng_forward(kvo_eng *e, kvo__eng_seq *s, uint32_t tok, uint32_t t, float *logits);
/* Index of a state layer among all state layers (running-state offset). */
uint32_t kvo__eng_state_slot(const kvo_eng *e, uint32_t layer);

/* ---- workload conversation selection (workload.c) ---------------------- */

/* roots[i]: line i's conversation (first block id).  Writes to sel (room for
 * n) the lines of the conversations with >= min_turns lines, whole
 * conversations in order of first appearance until max_requests lines are
 * taken, then sorted by line and cut at max_requests.  O(n log n); *ops (may
 * be NULL) counts comparisons and steps, for the test that bounds them.
 * KVO_ENOMEM. */
int kvo__eng_select_conversations(const uint64_t *roots, size_t n, uint32_t min_turns, size_t max_requests,
                                  size_t *sel, size_t *n_sel, uint64_t *ops);

#endif
