/* CUDA device: the per-device context shared by cuda.c (public API, pinned
 * ranges, job tokens) and device_cuda.c (the transfer device).  No CUDA
 * header: the driver API is cuda_driver.h's table, loaded at run time.
 *
 * Layering (a file calls only the files below it; tools/check-layering.py):
 *   device_cuda.c   the transfer device (kvo__xfer_device_cuda; in the
 *                   shared library, its constructor attaches it)
 *   cuda.c          kvo_cuda_*: contexts per device, pinned ranges, job
 *                   tokens, the kernel module
 *   cuda_driver.c   the driver API, loaded with dlopen + cuGetProcAddress
 *   cuda_plan.c     how one job's copies are issued (no CUDA at all)
 *   cuda_shared.c   only in libkvoffload_cuda.so: the core functions the
 *                   files above call, through libkvoffload.so's table
 * kernels.cu (the kernel) is compiled by nvcc into images embedded as C
 * arrays (kernels.h); nothing calls into it but the driver.
 */
#ifndef KVO_TRANSFER_CUDA_INTERNAL_H
#define KVO_TRANSFER_CUDA_INTERNAL_H

#include <pthread.h>

#include "core/internal.h"
#include "kvoffload/kvo_cuda.h"
#include "transfer/cuda/cuda_driver.h"
#include "transfer/cuda/cuda_plan.h"
#include "transfer/cuda/kernels.h"
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

/* A job's device token, from job_submit to job_done (and while
 * kvo_cuda_job_event holds a reference): the job's events and where its
 * copies stand.  Pooled per context; refs, state and status are guarded by
 * the context's job_lock. */
enum { KVO__CJ_SUBMITTED = 0, KVO__CJ_ENQUEUED, KVO__CJ_FAILED };
typedef struct kvo__cuda_job {
    struct kvo_cuda *cu;
    CUevent mark;          /* the compute stream's mark at submit (has_mark) */
    CUevent done;          /* recorded after the job's copies, on its stream */
    bool has_mark;
    int dir;
    int state;             /* KVO__CJ_*: the worker moves it on once the copies are enqueued */
    int status;            /* KVO__CJ_FAILED: the job's error */
    uint32_t refs;         /* the job (until job_done) + kvo_cuda_job_event callers */
    struct kvo__cuda_job *next; /* free list */
    struct kvo__cuda_job *all;  /* every token of the context */
} kvo__cuda_job;

/* Mapped host memory (cuMemHostAlloc'd) a worker stopped using while a
 * kernel that reads it had not been seen to complete (a completion
 * timeout), or outgrew: freed with the context when its streams are idle,
 * never while one is busy (the GPU may still read it; freeing pinned memory
 * may also wait for the device). */
typedef struct kvo__cuda_grave {
    void *host;
    struct kvo__cuda_grave *next;
} kvo__cuda_grave;

struct kvo_cuda {
    int index;
    CUdevice dev;
    CUcontext ctx;               /* the device's primary context (retained) */
    int refs;                    /* under the registry lock (cuda.c) */
    bool user;                   /* a kvo_cuda_create caller holds a reference */
    bool batch_ok;               /* cuMemcpyBatchAsync usable; atomic: cleared once when refused */
    bool require_pinned;
    bool kernel_stores;          /* stores may use the kernel too (loads always may) */
    bool timed_out;              /* a completion wait timed out (atomic): free checks the streams first */
    uint32_t timeout_ms;         /* completion wait deadline */
    CUstream stream[2];          /* per kvo_xfer_dir: every job's copies */
    CUstream aux;                /* kvo_cuda_job_event: a job's done event, then the caller's */
    CUmodule module;             /* the kernel's module, or NULL (copy engine only) */
    CUfunction kernel;
    void *compute;               /* CUstream or NULL; atomic */
    kvo__cuda_plan_cfg plan;
    pthread_rwlock_t pin_lock;   /* pins: read by workers, written by pin/unpin */
    kvo__cuda_pin *pins;         /* sorted by base, disjoint */
    size_t n_pins, cap_pins;
    pthread_mutex_t job_lock;    /* job tokens (refs, state, free list) and the graveyard */
    pthread_cond_t job_cv;       /* a token left KVO__CJ_SUBMITTED */
    kvo__cuda_job *job_free, *job_all;
    kvo__cuda_grave *grave;
    kvo_cuda_stats st;           /* counters: atomic adds */
};

/* Every driver call on a caller's thread runs between these: cu's context is
 * pushed on the thread's stack and popped after, so the caller's current
 * context (and the runtime's current device) is exactly as it was.  Workers
 * make the context current once, on their own thread. */
static inline CUresult kvo__cuda_enter(const kvo_cuda *cu) { return kvo__cu->cuCtxPushCurrent(cu->ctx); }
static inline void kvo__cuda_leave(const kvo_cuda *cu) {
    (void)cu;
    CUcontext c;
    (void)kvo__cu->cuCtxPopCurrent(&c);
}

/* A driver error as a KVO_E* code with a message "what: CUDA_ERROR_X (text)". */
int kvo__cuda_error(CUresult e, const char *what);
/* The context of device index for a transfer engine: the registered one
 * (reference taken) or a new one with default params.  Errors as
 * kvo_cuda_create. */
int kvo__cuda_acquire(int index, kvo_cuda **out);
void kvo__cuda_release(kvo_cuda *cu);
/* Is [p, p + bytes) pinned host memory usable by cu's copies: a range pinned
 * through kvo_cuda_pin_* (pin_lock held for reading by the caller), or else
 * memory registered or allocated with the driver covering all of it (a
 * slow path: a few driver queries)?  Sets *hdelta. */
bool kvo__cuda_pinned(const kvo_cuda *cu, uintptr_t p, uint64_t bytes, int64_t *hdelta);
bool kvo__cuda_host_registered(uintptr_t p, uint64_t bytes, int64_t *hdelta);
/* Job tokens (device_cuda.c's job_submit / job_done, kvo_cuda_job_event). */
int kvo__cuda_job_get(kvo_cuda *cu, int dir, kvo__cuda_job **out);
void kvo__cuda_job_put(kvo__cuda_job *j);
/* The worker says where the job's copies stand (state KVO__CJ_ENQUEUED, or
 * _FAILED with status): wakes kvo_cuda_job_event. */
void kvo__cuda_job_set(kvo__cuda_job *j, int state, int status);
/* Mapped host memory the GPU may still read (cuda.c frees it with the
 * context when the streams are idle, or never).  NULL is a no-op. */
void kvo__cuda_bury(kvo_cuda *cu, void *host);
/* Log once per process that batched copies are off (why). */
void kvo__cuda_note_no_batch(int driver_version, const char *why);

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
