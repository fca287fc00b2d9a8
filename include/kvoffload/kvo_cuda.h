/*
 * kvoffload CUDA transfer device (optional: built with -DKVO_CUDA=ON, library
 * kvoffload_cuda; not included by kvo.h).  No CUDA type appears here: streams
 * and events are passed as void * (a cudaStream_t / cudaEvent_t).
 *
 * Use:
 *     kvo_cuda_params cp = kvo_cuda_default_params();   // device_index 0
 *     kvo_cuda *cu;  kvo_cuda_create(&cp, &cu);
 *     kvo_cuda_pin_arena(cu, arena);                     // slots: pinned host memory
 *     kvo_transfer_params tp = kvo_transfer_default_params();
 *     tp.plan = plan;  tp.device = "cuda";  tp.device_index = cp.device_index;
 *     kvo_transfer_create(&tp, &t);                      // attaches to cu
 *     kvo_transfer_set_layout(t, segs, n);               // segs: device pointers
 *     ... submit / poll as with the host device ...
 *     kvo_transfer_destroy(t);  kvo_cuda_destroy(cu);  kvo_arena_destroy(arena);
 *
 * One kvo_cuda per device index per process: it owns two copy streams per
 * direction (stores, loads) shared by every transfer engine and worker
 * thread using that device (kvo_cuda_record_event covers both).  A
 * transfer engine created with device "cuda" and no kvo_cuda for its index
 * creates one with the default params (no compute stream, nothing pinned)
 * and frees it when destroyed.
 *
 * Libraries.  libkvoffload_cuda.so (CMake: find_package(kvoffload
 * COMPONENTS cuda), target kvoffload::cuda; pkg-config: kvoffload-cuda,
 * i.e. -lkvoffload_cuda -lkvoffload) exports exactly the kvo_cuda_*
 * functions below and needs libkvoffload.so and libcudart.so at run time;
 * loading it makes the transfer device "cuda" known to libkvoffload.so.
 *
 * Threads and the current device.  Every call here, and kvo_transfer_create
 * / _destroy with device "cuda", may run on any thread and leaves that
 * thread's current CUDA device as it found it (cudaGetDevice before,
 * cudaSetDevice back after; on a thread that never chose a device CUDA
 * reports device 0, which is then what it is left at).  The worker threads
 * of a transfer engine set their device once, on their own thread.  A
 * layout whose tensors live on another device, or a compute stream of
 * another device, is refused with a message naming both devices.
 *
 * Ordering (docs/gpu.md has the timeline).  The contract:
 *   - A store is ordered after the engine's work that produced its blocks by
 *     an event that kvo_transfer_submit records on the compute stream (set
 *     with kvo_cuda_params.compute_stream or kvo_cuda_set_compute_stream;
 *     cudaStreamLegacy for the legacy default stream): its copies wait on
 *     the GPU for what the engine enqueued on that stream before the submit,
 *     and for nothing enqueued after it.  So: enqueue the forward pass that
 *     writes the blocks, then submit the store.  Without a compute stream
 *     the engine must have synchronised that work itself before submitting.
 *   - A load is complete when kvo_transfer_poll/wait reports it: every one
 *     of its copies has finished (the workers wait for them before posting
 *     the result), so work enqueued on any stream afterwards sees the bytes.
 *     For GPU-side ordering without relying on that host step,
 *     kvo_cuda_job_event records an event after the job's last copy was
 *     enqueued; the compute stream can cudaStreamWaitEvent on it.  Nothing
 *     is ever inserted into the engine's streams behind its back.
 *   - A work unit whose copies do not complete within completion_timeout_ms
 *     fails its job with KVO_ETIMEDOUT; from then on the context never waits
 *     for the device again (destroy leaks its streams and pinned ranges
 *     instead of hanging).
 */
#ifndef KVOFFLOAD_KVO_CUDA_H
#define KVOFFLOAD_KVO_CUDA_H

#include "kvo_store.h"
#include "kvo_transfer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvo_cuda_params {
    size_t struct_size;         /* sizeof(kvo_cuda_params): kvo_cuda_default_params sets it */
    int device_index;           /* CUDA device ordinal; default 0 */
    void *compute_stream;       /* cudaStream_t the engine computes on, or NULL (default) */
    uint64_t kernel_max_bytes;  /* pieces up to this size may be copied by the gather/scatter
                                   kernel; 0 = never; default 16384 */
    uint32_t kernel_min_pieces; /* ... when a work unit has at least this many; default 4 */
    int batch;                  /* cudaMemcpyBatchAsync for several pieces: -1 auto (default),
                                   0 never (one cudaMemcpyAsync each), 1 required */
    bool require_pinned;        /* (slots in memory from cudaHostAlloc are accepted too, at the cost
                                   of a pointer query per piece: pin through kvo_cuda_pin_* for speed)
                                   a slot outside pinned host memory fails its job with
                                   KVO_EINVAL (default true); false: such copies are
                                   staged by the driver (slow, synchronous) */
    /* -- fields after require_pinned: read only when struct_size covers them -- */
    uint32_t completion_timeout_ms; /* a work unit whose copies have not completed within this
                                       fails its job with KVO_ETIMEDOUT (a hung GPU must not hang
                                       the engine or its destroy); 0 = no deadline; default 60000 */
} kvo_cuda_params;

KVO_API kvo_cuda_params kvo_cuda_default_params(void);

typedef struct kvo_cuda kvo_cuda;

/** Number of CUDA devices visible to this process in *count.  Errors:
 *  KVO_ENOTSUP (no driver or no device: *count = 0, the message gives CUDA's
 *  reason), KVO_EINVAL (NULL). */
KVO_API int kvo_cuda_device_count(int *count);

/** Create the context of one device: its copy streams (non-blocking), the
 *  check for batched copies.  *out is owned by the caller
 *  (kvo_cuda_destroy).  Errors: KVO_EINVAL (NULL, bad params, struct_size
 *  not set by kvo_cuda_default_params), KVO_ENOTSUP
 *  (no such device, or batch = 1 without batched copies), KVO_EEXIST (a
 *  context for that index exists already), KVO_ENOMEM, KVO_EIO (a CUDA call
 *  failed; the message names it). */
KVO_API int kvo_cuda_create(const kvo_cuda_params *p, kvo_cuda **out);

/** Drop the caller's reference: the context (streams, pinned ranges, which
 *  are unregistered) is freed when no transfer engine uses it any more, so
 *  destroy the engines first to unpin at once.  NULL is a no-op.  Must not
 *  race with other calls on cu. */
KVO_API void kvo_cuda_destroy(kvo_cuda *cu);

/** Set (or clear, NULL) the compute stream for the ordering described above;
 *  takes effect for stores submitted afterwards.  Any thread.  Errors:
 *  KVO_EINVAL (NULL cu, or a stream of another device: the message names
 *  both; checked with CUDA 12.8+ runtimes). */
KVO_API int kvo_cuda_set_compute_stream(kvo_cuda *cu, void *stream);

/** Record event (a cudaEvent_t created by the caller on this device) on the
 *  stream of direction dir: it completes when every copy enqueued in that
 *  direction so far has.  Copies of a job are enqueued by the workers, not
 *  by kvo_transfer_submit: right after a submit this event may precede all
 *  of them.  Use kvo_cuda_job_event for one job.  Any thread.  Errors:
 *  KVO_EINVAL, KVO_EIO. */
KVO_API int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event);

/** Record event (a cudaEvent_t of this device) after every copy of job
 *  job_id (of direction dir, submitted to t, a transfer engine on this
 *  device): the engine's compute stream may cudaStreamWaitEvent on it.  The
 *  job must have finished (kvo_transfer_poll/wait reported it, or would):
 *  before that its last copy may not be enqueued yet.  Any thread.  Errors:
 *  KVO_EINVAL (NULL, bad dir), KVO_EAGAIN (the job has not finished),
 *  KVO_ENOTFOUND (no such job), KVO_EIO. */
KVO_API int kvo_cuda_job_event(kvo_cuda *cu, kvo_transfer *t, kvo_xfer_dir dir, uint64_t job_id, void *event);

/** Page-lock [ptr, ptr + bytes) with cudaHostRegister (portable, mapped) so
 *  copies use DMA and the kernel can reach it; kvo_cuda_pin_arena pins an
 *  arena's whole region.  The registration is process-wide and counted: the
 *  same range pinned by the contexts of several devices is registered once
 *  and unregistered when the last of them unpins it (or is freed); memory
 *  the caller registered itself is used as it is and never unregistered
 *  here.  Stays pinned until the matching unpin or until the context is
 *  freed; the memory must outlive that (unpin, or destroy the context,
 *  before kvo_arena_destroy).  Errors: KVO_EINVAL (NULL, 0 bytes),
 *  KVO_EEXIST (overlaps a range pinned here, or one pinned by any context
 *  with other bounds), KVO_ENOMEM, KVO_EIO (CUDA refused, message says
 *  why). */
KVO_API int kvo_cuda_pin_host(kvo_cuda *cu, void *ptr, uint64_t bytes);
KVO_API int kvo_cuda_pin_arena(kvo_cuda *cu, kvo_arena *arena);
/** Undo a pin (ptr: the address given to kvo_cuda_pin_host / the arena).
 *  No copy may be in flight on that memory.  Errors: KVO_EINVAL,
 *  KVO_ENOTFOUND (not pinned here), KVO_EIO. */
KVO_API int kvo_cuda_unpin_host(kvo_cuda *cu, void *ptr);
KVO_API int kvo_cuda_unpin_arena(kvo_cuda *cu, kvo_arena *arena);

typedef struct kvo_cuda_stats {
    size_t struct_size;        /* sizeof(kvo_cuda_stats): KVO_CUDA_STATS_INIT sets it */
    uint64_t units;            /* work units completed (one event each) */
    uint64_t memcpy_calls;     /* cudaMemcpyAsync calls */
    uint64_t batch_calls;      /* cudaMemcpyBatchAsync calls */
    uint64_t batch_pieces;     /* pieces copied by them */
    uint64_t kernel_launches;  /* gather/scatter launches */
    uint64_t kernel_pieces;    /* pieces copied by them */
    uint64_t errors;           /* units that failed */
    bool batch_available;      /* the runtime and driver have cudaMemcpyBatchAsync */
    /* -- fields after batch_available: filled only when struct_size covers them -- */
    uint64_t batch_refused;    /* 1 once cudaMemcpyBatchAsync was refused at run time (the
                                  device then uses one cudaMemcpyAsync per piece for good) */
    uint64_t timeouts;         /* units that failed with KVO_ETIMEDOUT */
} kvo_cuda_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_cuda_stats st = KVO_CUDA_STATS_INIT; */
#define KVO_CUDA_STATS_INIT {sizeof(kvo_cuda_stats)}

/** Counters since creation (relaxed snapshot), up to out's struct_size.
 *  Errors: KVO_EINVAL (NULL, struct_size not set by KVO_CUDA_STATS_INIT). */
KVO_API int kvo_cuda_get_stats(kvo_cuda *cu, kvo_cuda_stats *out);

#ifdef __cplusplus
}
#endif
#endif
