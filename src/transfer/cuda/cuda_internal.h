/* CUDA device: the per-device context shared by cuda.c (public API, pinned
 * ranges) and device_cuda.c (the transfer device).  Includes CUDA headers:
 * only files under src/transfer/cuda/ include it.
 *
 * Layering (a file calls only the files below it; tools/check-layering.py):
 *   device_cuda.c   the transfer device (kvo__xfer_device_cuda)
 *   cuda.c          kvo_cuda_*: contexts per device, pinned ranges, events
 *   kernels.cu      the gather/scatter kernel
 *   cuda_plan.c     how one unit's copies are issued (no CUDA header)
 */
#ifndef KVO_TRANSFER_CUDA_INTERNAL_H
#define KVO_TRANSFER_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>

#include "core/internal.h"
#include "kvoffload/kvo_cuda.h"
#include "transfer/cuda/cuda_plan.h"

#define KVO__CUDA_MAX_DEVICES 64

/* A pinned host range: base..base+bytes; hdelta = device-visible address -
 * host address (0 under unified addressing). */
typedef struct kvo__cuda_pin {
    uintptr_t base;
    uint64_t bytes;
    int64_t hdelta;
} kvo__cuda_pin;

struct kvo_cuda {
    int index;
    int refs;                    /* under the registry lock (cuda.c) */
    bool user;                   /* a kvo_cuda_create caller holds a reference */
    bool batch_ok;               /* cudaMemcpyBatchAsync usable */
    bool require_pinned;
    cudaStream_t stream[2];      /* per kvo_xfer_dir */
    void *compute;               /* cudaStream_t or NULL; atomic */
    kvo__cuda_plan_cfg plan;
    pthread_rwlock_t pin_lock;   /* pins: read by workers, written by pin/unpin */
    kvo__cuda_pin *pins;         /* sorted by base, disjoint */
    size_t n_pins, cap_pins;
    kvo_cuda_stats st;           /* counters: atomic adds */
};

/* A CUDA error as a KVO_E* code with a message "what: cudaErrorX (text)". */
int kvo__cuda_error(cudaError_t e, const char *what);
/* The context of device index for a transfer engine: the registered one
 * (reference taken) or a new one with default params.  Errors as
 * kvo_cuda_create. */
int kvo__cuda_acquire(int index, kvo_cuda **out);
void kvo__cuda_release(kvo_cuda *cu);
/* Under pin_lock (read): is [p, p + bytes) inside one pinned range?  Sets
 * *hdelta. */
bool kvo__cuda_pinned(const kvo_cuda *cu, uintptr_t p, uint64_t bytes, int64_t *hdelta);

static inline void kvo__cuda_count(uint64_t *ctr, uint64_t v) { __atomic_fetch_add(ctr, v, __ATOMIC_RELAXED); }

#endif
