/* CUDA device: planning of one job's copies (pure C, no CUDA header; see
 * cuda_plan.c). */
#ifndef KVO_TRANSFER_CUDA_CUDA_PLAN_H
#define KVO_TRANSFER_CUDA_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One copy of a job.  dst and src are the addresses cuMemcpyAsync takes
 * (unified addressing); hdelta is what to add to the host side (the slot) to
 * get the address the kernel uses for it (0 with unified addressing of
 * registered memory). */
typedef struct kvo__cuda_piece {
    uintptr_t dst, src;
    uint64_t bytes;
    int64_t hdelta;
} kvo__cuda_piece;

typedef struct kvo__cuda_plan_cfg {
    uint64_t kernel_max_bytes;  /* pieces up to this size may go to the kernel; 0: no kernel */
    uint32_t kernel_min_pieces; /* ... when at least this many of the job's pieces are that small */
    uint32_t kernel_cap;        /* most pieces one kernel launch takes */
    bool batch;                 /* cuMemcpyBatchAsync is available and allowed */
} kvo__cuda_plan_cfg;

typedef struct kvo__cuda_plan {
    size_t n_kernel;  /* pieces [0, n_kernel): one gather/scatter kernel launch */
    size_t n_copy;    /* pieces [n_kernel, n_kernel + n_copy): copy-engine copies */
    bool batched;     /* the copies as one cuMemcpyBatchAsync (else one cuMemcpyAsync each) */
} kvo__cuda_plan;

/* The defaults: the kernel for 16 or more pieces of at most 28 KiB, the
 * rest as one batch (two or more pieces) where the driver has it. */
kvo__cuda_plan_cfg kvo__cuda_plan_default_cfg(bool batch_ok);

/* Merge each piece into the previous one when both sides continue it (and
 * the host side has the same hdelta); returns the new count.  O(n). */
size_t kvo__cuda_coalesce(kvo__cuda_piece *p, size_t n);

/* Decide how the n pieces are issued; reorders p (the pieces of a job are
 * disjoint, so their order does not matter).  O(n). */
void kvo__cuda_plan_make(const kvo__cuda_plan_cfg *cfg, kvo__cuda_piece *p, size_t n, kvo__cuda_plan *out);

/* Thread blocks of one kernel launch over n pieces (each block copies a
 * contiguous range of them; kernels.cu). */
uint32_t kvo__cuda_kernel_grid(size_t n);

#endif
