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
 * One kvo_cuda per device index per process: it owns one copy stream per
 * direction (stores, loads) shared by every transfer engine and worker
 * thread using that device.  A transfer engine created with device "cuda"
 * and no kvo_cuda for its index creates one with the default params (no
 * compute stream, nothing pinned) and frees it when destroyed.  A job is
 * copied as one unit across all of its segments (every layer): at most one
 * kernel launch and one batched copy (cuMemcpyBatchAsync), one event.
 *
 * Libraries.  libkvoffload_cuda.so (CMake: find_package(kvoffload
 * COMPONENTS cuda), target kvoffload::cuda; pkg-config: kvoffload-cuda,
 * i.e. -lkvoffload_cuda -lkvoffload) exports exactly the kvo_cuda_*
 * functions below and needs libkvoffload.so at run time, and no CUDA
 * library: the NVIDIA driver's libcuda.so.1 is opened on first use
 * (dlopen, cuGetProcAddress), so any driver of CUDA 11.3 or later serves,
 * next to whatever CUDA runtime (12.x, 13.x) the process has loaded.
 * Loading it makes the transfer device "cuda" known to libkvoffload.so.
 *
 * Threads and the current device.  Every call here, and kvo_transfer_create
 * / _destroy with device "cuda", may run on any thread and leaves that
 * thread's current CUDA context (and so the runtime's current device)
 * exactly as it found it: the device's primary context, the one the CUDA
 * runtime and torch use, is pushed for the call and popped after.  The
 * worker threads of a transfer engine make it current once, on their own
 * thread.  A layout whose tensors live on another device, or a compute
 * stream of another device, is refused with a message naming both
 * devices.
 *
 * Ordering (docs/gpu.md has the timeline).  The contract:
 *   - A job is ordered after the engine's work enqueued before its submit
 *     on the compute stream (set with kvo_cuda_params.compute_stream or
 *     kvo_cuda_set_compute_stream; cudaStreamLegacy, (void *)1, for the
 *     legacy default stream of the context's device): kvo_transfer_submit
 *     records an event on that stream, and the job's copies wait for it on
 *     the GPU; work enqueued after the submit is not waited for.  A store
 *     so reads the bytes the forward pass wrote; a load writes its blocks
 *     after whatever the engine still had queued on them (vLLM zeroes
 *     blocks it hands to a load).  So: enqueue the work that writes (or
 *     last touches) the blocks, then submit.  Without a compute stream the
 *     engine must have synchronised that work itself before submitting.
 *   - A job is complete when kvo_transfer_poll/wait reports it: every one of
 *     its copies has finished (a worker waits for the job's event before
 *     the result is posted), so work enqueued on any stream afterwards sees
 *     the bytes.  For GPU-side ordering without that host step (layer-wise
 *     loads), kvo_cuda_job_event gives an event that completes after every
 *     copy of one job: the compute stream can cuStreamWaitEvent /
 *     cudaStreamWaitEvent on it right after the submit.  Nothing is ever
 *     inserted into the engine's streams behind its back.
 *   - A job whose copies do not complete within completion_timeout_ms fails
 *     with KVO_ETIMEDOUT; the worker then never reuses the buffers those
 *     copies may still read (they are freed with the context only once the
 *     GPU has finished with them), and destroy leaks what the GPU has not
 *     released rather than waiting for it.
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
    uint64_t kernel_max_bytes;  /* pieces of a load up to this size may be copied by the
                                   gather/scatter kernel (which reads the pinned slots over the
                                   bus); 0 = never; default 28672 */
    uint32_t kernel_min_pieces; /* ... when a job has at least this many; default 16 */
    int batch;                  /* cuMemcpyBatchAsync for several pieces: -1 auto (default: where
                                   the driver has it, CUDA 12.8+), 0 never (one cuMemcpyAsync
                                   each), 1 required */
    bool require_pinned;        /* (slots in memory from cudaHostAlloc are accepted too, at the cost
                                   of a pointer query per piece: pin through kvo_cuda_pin_* for speed)
                                   a slot outside pinned host memory fails its job with
                                   KVO_EINVAL (default true); false: such copies are
                                   staged by the driver (slow, synchronous) */
    /* -- fields after require_pinned: read only when struct_size covers them -- */
    uint32_t completion_timeout_ms; /* a job whose copies have not completed within this fails
                                       with KVO_ETIMEDOUT (a hung GPU must not hang the engine or
                                       its destroy); 0 = no deadline; default 60000 */
    /* -- fields after completion_timeout_ms: read only when struct_size covers them -- */
    bool kernel_stores;         /* stores use the kernel too, under the same thresholds (it writes
                                   the slots over the bus, taking SMs from the engine); default
                                   false: stores go to the copy engine, as vLLM's do */
} kvo_cuda_params;

KVO_API kvo_cuda_params kvo_cuda_default_params(void);

typedef struct kvo_cuda kvo_cuda;

/** Number of CUDA devices visible to this process in *count.  Errors:
 *  KVO_ENOTSUP (no driver or no device: *count = 0, the message gives CUDA's
 *  reason), KVO_EINVAL (NULL). */
KVO_API int kvo_cuda_device_count(int *count);

/** Create the context of one device: the device's primary context
 *  (retained), its copy streams (non-blocking), the kernel's module (the
 *  embedded fatbin, else the embedded PTX; when neither loads, small pages
 *  go to the copy engine and that is logged once), the check for batched
 *  copies (logged once when the driver has none).  *out is owned by the
 *  caller (kvo_cuda_destroy).  Errors: KVO_EINVAL (NULL, bad params,
 *  struct_size not set by kvo_cuda_default_params), KVO_ENOTSUP (no driver,
 *  no such device, or batch = 1 without batched copies), KVO_EEXIST (a
 *  context for that index exists already), KVO_ENOMEM, KVO_EIO (a driver
 *  call failed; the message names it). */
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

/** Record event (a cudaEvent_t / CUevent created by the caller on this
 *  device) on the stream of direction dir: it completes when every copy
 *  enqueued in that direction so far has.  Copies of a job are enqueued by
 *  the workers, not by kvo_transfer_submit: right after a submit this event
 *  may precede all of them.  Use kvo_cuda_job_event for one job.  Any
 *  thread.  Errors: KVO_EINVAL, KVO_EIO. */
KVO_API int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event);

/** Record event (a cudaEvent_t / CUevent of this device) so that it
 *  completes after every copy of job job_id (of direction dir, submitted to
 *  t, a transfer engine on this device): the engine's compute stream may
 *  wait on it on the GPU, e.g. the layer that reads a load's blocks right
 *  after the load's submit.  May be called as soon as kvo_transfer_submit
 *  returned: when a worker has not enqueued the job's copies yet, this
 *  waits on the host until it has (they are enqueued, not completed, when
 *  it returns; the wait is bounded by completion_timeout_ms).  The event is
 *  recorded on the context's own auxiliary stream after a wait for the
 *  job's event, which follows the job's last copy on the one stream that
 *  carries all of them.  For a job that has finished already the event
 *  completes at once (its result says whether its copies succeeded).  Any
 *  thread.  Errors: KVO_EINVAL (NULL, bad dir, a job of another direction or
 *  of an engine on another device), KVO_ENOTFOUND (no such job), KVO_EAGAIN
 *  (no worker took the job within completion_timeout_ms), the job's own
 *  error when its copies could not be enqueued, KVO_EIO. */
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
    uint64_t units;            /* jobs completed or failed on the device (one event each: a
                                  work unit of the CUDA device is a whole job) */
    uint64_t memcpy_calls;     /* cuMemcpyAsync calls */
    uint64_t batch_calls;      /* cuMemcpyBatchAsync calls */
    uint64_t batch_pieces;     /* pieces copied by them */
    uint64_t kernel_launches;  /* gather/scatter launches */
    uint64_t kernel_pieces;    /* pieces copied by them */
    uint64_t errors;           /* jobs that failed */
    bool batch_available;      /* the driver has cuMemcpyBatchAsync (CUDA 12.8+) */
    /* -- fields after batch_available: filled only when struct_size covers them -- */
    uint64_t batch_refused;    /* 1 once cuMemcpyBatchAsync was refused at run time (the
                                  device then uses one cuMemcpyAsync per piece for good) */
    uint64_t timeouts;         /* jobs that failed with KVO_ETIMEDOUT */
    bool kernel_available;     /* the kernel's module loaded (fatbin or PTX) */
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
