/* CUDA device: planning of one work unit's copies (pure C, no CUDA headers;
 * see cuda_plan.c). */
#ifndef KVO_TRANSFER_CUDA_CUDA_PLAN_H
#define KVO_TRANSFER_CUDA_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One copy of a work unit.  dst and src are the addresses cudaMemcpyAsync
 * takes; hdelta is what to add to the host side (the slot) to get the address
 * a kernel uses for it (0 with unified addressing of registered memory). */
typedef struct kvo__cuda_piece {
    uintptr_t dst, src;
    uint64_t bytes;
    int64_t hdelta;
} kvo__cuda_piece;

typedef struct kvo__cuda_plan_cfg {
    uint64_t kernel_max_bytes;  /* pieces up to this size may go to the kernel; 0: no kernel */
    uint32_t kernel_min_pieces; /* ... when at least this many of the unit's pieces are that small */
    uint32_t kernel_cap;        /* most pieces one kernel launch takes (descriptor buffer) */
    bool batch;                 /* cudaMemcpyBatchAsync is available and allowed */
    uint32_t batch_min_pieces;  /* batch when at least this many pieces are left for copies */
} kvo__cuda_plan_cfg;

typedef struct kvo__cuda_plan {
    size_t n_kernel;  /* pieces [0, n_kernel): one gather/scatter kernel launch */
    size_t n_copy;    /* pieces [n_kernel, n_kernel + n_copy): copy-engine copies */
    bool batched;     /* the copies as one cudaMemcpyBatchAsync (else one cudaMemcpyAsync each) */
} kvo__cuda_plan;

/* The defaults (kernel for pieces <= 16 KiB when at least 4 are, batches of
 * 2 or more pieces).  batch_ok: the runtime and driver have batched copies. */
kvo__cuda_plan_cfg kvo__cuda_plan_default_cfg(bool batch_ok);

/* Merge each piece into the previous one when both sides continue it (and
 * the host side has the same hdelta); returns the new count.  O(n). */
size_t kvo__cuda_coalesce(kvo__cuda_piece *p, size_t n);

/* Decide how the n pieces are issued; reorders p (the pieces of a unit are
 * disjoint, so their order does not matter).  O(n). */
void kvo__cuda_plan_make(const kvo__cuda_plan_cfg *cfg, kvo__cuda_piece *p, size_t n, kvo__cuda_plan *out);

/* Kernel launch geometry for pieces of `bytes`: threads per block (a
 * multiple of 32, 32..256) so that small pieces do not leave most threads
 * idle with 16-byte accesses. */
uint32_t kvo__cuda_kernel_threads(uint64_t max_piece_bytes);

#endif
