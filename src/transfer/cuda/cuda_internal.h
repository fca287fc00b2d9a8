/* CUDA device: the per-device context shared by cuda.c (public API, pinned
 * ranges) and device_cuda.c (the transfer device).  Includes CUDA headers:
 * only files under src/transfer/cuda/ include it.
 *
 * Layering (a file calls only the files below it; tools/check-layering.py):
 *   device_cuda.c   the transfer device (kvo__xfer_device_cuda; in the
 *                   shared library, its constructor attaches it)
 *   cuda.c          kvo_cuda_*: contexts per device, pinned ranges, events
 *   kernels.cu      the gather/scatter kernel
 *   cuda_plan.c     how one unit's copies are issued (no CUDA header)
 *   cuda_shared.c   only in libkvoffload_cuda.so: the core functions the
 *                   files above call, through libkvoffload.so's table
 */
#ifndef KVO_TRANSFER_CUDA_INTERNAL_H
#define KVO_TRANSFER_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>

#include "core/internal.h"
#include "kvoffload/kvo_cuda.h"
#include "transfer/cuda/cuda_plan.h"
#include "transfer/device.h"

#define KVO__CUDA_MAX_DEVICES 64

/* A pinned host range of one context: base..base+bytes; hdelta =
 * device-visible address - host address (0 under unified addressing).  The
 * registration itself is process-wide and counted (cuda.c: one range pinned
 * for several devices is registered once). */
typedef struct kvo__cuda_pin {
    uintptr_t base;
    uint64_t bytes;
    int64_t hdelta;
} kvo__cuda_pin;

/* A store job's submit-time mark on the compute stream (the device's
 * job_submit token): an event from the context's pool. */
typedef struct kvo__cuda_jobev {
    cudaEvent_t ev;
    struct kvo__cuda_jobev *next; /* free list / all events */
    struct kvo__cuda_jobev *all;
} kvo__cuda_jobev;

struct kvo_cuda {
    int index;
    int refs;                    /* under the registry lock (cuda.c) */
    bool user;                   /* a kvo_cuda_create caller holds a reference */
    bool batch_ok;               /* cudaMemcpyBatchAsync usable; atomic: cleared once when refused */
    bool require_pinned;
    bool hung;                   /* a completion wait timed out: atomic; free leaks instead of blocking */
    uint32_t timeout_ms;         /* completion wait deadline */
    cudaStream_t stream[2];      /* per kvo_xfer_dir: copy-engine units, and kernel units of even workers */
    cudaStream_t kstream[2];     /* per kvo_xfer_dir: kernel units of odd workers (device_cuda.c) */
    cudaEvent_t join[2];         /* kvo_cuda_record_event: kstream[dir] joined into stream[dir] */
    void *compute;               /* cudaStream_t or NULL; atomic */
    kvo__cuda_plan_cfg plan;
    pthread_rwlock_t pin_lock;   /* pins: read by workers, written by pin/unpin */
    kvo__cuda_pin *pins;         /* sorted by base, disjoint */
    size_t n_pins, cap_pins;
    pthread_mutex_t ev_lock;     /* the job event pool */
    kvo__cuda_jobev *ev_free, *ev_all;
    kvo_cuda_stats st;           /* counters: atomic adds */
};

/* Every CUDA call on a caller's thread runs between these: make cu's
 * device current and put the caller's back afterwards (kvo_cuda.h's thread
 * rules).  Workers set their device once, on their own thread. */
static inline cudaError_t kvo__cuda_enter(int dev, int *prev) {
    cudaError_t e = cudaGetDevice(prev);
    if (e != cudaSuccess) {
        *prev = -1;
        return e;
    }
    return *prev == dev ? cudaSuccess : cudaSetDevice(dev);
}
static inline void kvo__cuda_leave(int dev, int prev) {
    if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
}

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
/* The job event pool (device_cuda.c's job_submit / job_done). */
int kvo__cuda_jobev_get(kvo_cuda *cu, kvo__cuda_jobev **out);
void kvo__cuda_jobev_put(kvo_cuda *cu, kvo__cuda_jobev *e);
/* The device of stream s (a compute stream a caller passed), or -1 when the
 * runtime cannot tell (before CUDA 12.8). */
int kvo__cuda_stream_device(void *s);

/* 0 when the device can use the core (always in a static build), else the
 * error of kvo_xfer_device_attach prefixed with fn (cuda_shared.c). */
#if KVO__CUDA_SHARED
int kvo__cuda_attached(const char *fn);
/* Attach ops to libkvoffload.so and take its core functions (at load). */
void kvo__cuda_core_attach(const kvo__xfer_device_ops *ops);
#else
static inline int kvo__cuda_attached(const char *fn) {
    (void)fn;
    return 0;
}
#endif

extern const kvo__xfer_device_ops kvo__xfer_device_cuda;

static inline void kvo__cuda_count(uint64_t *ctr, uint64_t v) { __atomic_fetch_add(ctr, v, __ATOMIC_RELAXED); }

#endif
