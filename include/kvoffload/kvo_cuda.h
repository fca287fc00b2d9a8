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
 * One kvo_cuda per device index per process: it owns one stream per
 * direction (stores, loads) shared by every transfer engine and worker
 * thread using that device.  A transfer engine created with device "cuda"
 * and no kvo_cuda for its index creates one with the default params (no
 * compute stream, nothing pinned) and frees it when destroyed.
 *
 * Completion and ordering (docs/gpu.md).  A job's result is posted only after
 * the CUDA events of all its copies have completed, so once
 * kvo_transfer_poll/wait reports a load as done its bytes are in device
 * memory for any work enqueued afterwards, on any stream.  To order on the
 * GPU without waiting on the host:
 *   - pass the compute stream (kvo_cuda_set_compute_stream): every store
 *     unit first makes the store stream wait for the work enqueued on the
 *     compute stream so far (a store never reads KV a kernel is still
 *     writing), and every load unit makes the compute stream wait for its
 *     copies (work enqueued on the compute stream after that point sees
 *     them);
 *   - or record an event (kvo_cuda_record_event) on a direction's stream and
 *     make the compute stream wait on it (cudaStreamWaitEvent): it covers
 *     every copy enqueued in that direction so far.
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
} kvo_cuda_params;

KVO_API kvo_cuda_params kvo_cuda_default_params(void);

typedef struct kvo_cuda kvo_cuda;

/** Number of CUDA devices visible to this process in *count.  Errors:
 *  KVO_ENOTSUP (no driver or no device: *count = 0, the message gives CUDA's
 *  reason), KVO_EINVAL (NULL). */
KVO_API int kvo_cuda_device_count(int *count);

/** Create the context of one device: its two streams (non-blocking), the
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
 *  takes effect for work units started afterwards.  Any thread.  Errors:
 *  KVO_EINVAL (NULL cu). */
KVO_API int kvo_cuda_set_compute_stream(kvo_cuda *cu, void *stream);

/** Record event (a cudaEvent_t created by the caller on this device) on the
 *  stream of direction dir: it completes when every copy enqueued in that
 *  direction so far has.  Any thread.  Errors: KVO_EINVAL, KVO_EIO. */
KVO_API int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event);

/** Page-lock [ptr, ptr + bytes) with cudaHostRegister (portable, mapped) so
 *  copies use DMA and the kernel can reach it; kvo_cuda_pin_arena pins an
 *  arena's whole region.  Stays pinned until the matching unpin or until the
 *  context is freed; the memory must outlive that (unpin, or destroy the
 *  context, before kvo_arena_destroy).  Errors: KVO_EINVAL (NULL, 0 bytes),
 *  KVO_EEXIST (overlaps a range pinned here), KVO_ENOMEM, KVO_EIO (CUDA
 *  refused, message says why). */
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
