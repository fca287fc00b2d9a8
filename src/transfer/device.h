/*
 * The transfer engine's device interface: how bytes move between engine
 * memory and host slots.
 *
 * The core (transfer.c) decides *what* to copy: it validates layouts and ops,
 * orders jobs, splits them into work units and merges adjacent pieces.  A
 * device decides *how* a piece is copied.  The engine side of a piece is
 * device memory (the engine's KV tensors); the slot side is always host
 * memory (for a CUDA device, pinned host memory).
 *
 * Contract, per worker thread:
 *     worker_init -> { copy* ; unit_end }* -> worker_fini
 * copy() may be asynchronous (the CUDA device only records the piece);
 * unit_end() returns only when every copy issued since the previous unit_end
 * is complete and visible to other threads (the host device issues an sfence
 * after streaming stores; the CUDA device enqueues the pieces as one batch
 * or kernel launch, records one event after them and polls it), and reports
 * the first failure.  copy() is never called with zero bytes.  A work unit
 * is a run of pages of one segment (about unit_bytes), unless the device
 * sets whole_jobs: then a unit is the whole job, every block of every op and
 * segment (all of an engine's layers), so that the device can issue it as
 * one batch and wait once.
 *
 * Adding a device: define a `const kvo__xfer_device_ops` in the device's own
 * file and add one weak reference to it in device.c (kvo__xfer_device_find
 * and kvo__xfer_device_names); the core and the public header stay
 * unchanged, and users select it with kvo_transfer_params.device = "<name>".
 * Two devices plug in this way: the CUDA device (kvo__xfer_device_cuda,
 * src/transfer/cuda/device_cuda.c, built into libkvoffload_cuda by the
 * KVO_CUDA option; docs/gpu.md) and the "test" device of
 * tests/test_transfer_device.c (memcpy copies, injected DMA errors).  The
 * CUDA device takes whole jobs, enqueues each (one kernel launch and/or one
 * batched copy) on its stream for the direction and polls one CUDA event per
 * job in unit_end; slots are pinned host memory (the store's arena);
 * check_engine_range asks the driver (cuPointerGetAttributes) that a segment
 * is device memory.
 */
#ifndef KVO_TRANSFER_DEVICE_H
#define KVO_TRANSFER_DEVICE_H

#include <stdarg.h>

#include "core/internal.h"

typedef struct kvo__xfer_device_config {
    int nontemporal;     /* kvo_transfer_params.nontemporal: -1 auto, 0 never, 1 always */
    int index;           /* kvo_transfer_params.device_index */
} kvo__xfer_device_config;

typedef struct kvo__xfer_device_ops {
    const char *name;
    /* Open a device: *state receives its state.  Errors: KVO_ENOTSUP (no such
     * device index), KVO_ENOMEM, KVO_EIO, with a message. */
    int (*open)(const kvo__xfer_device_config *cfg, void **state);
    void (*close)(void *state);
    /* Layout registration: can this device reach [base, base + bytes) as
     * engine memory?  0 or KVO_ELAYOUT with a message (the caller prefixes the
     * group and segment).  NULL = anything goes. */
    int (*check_engine_range)(void *state, const void *base, uint64_t bytes);
    /* Per worker thread context. */
    int (*worker_init)(void *state, uint32_t worker, void **wctx);
    void (*worker_fini)(void *state, void *wctx);
    /* Copy bytes (> 0) from src to dst.  STORE: src is engine memory, dst a
     * slot; LOAD: the reverse. */
    void (*copy)(void *wctx, int dir, void *dst, const void *src, uint64_t bytes);
    /* Optional hint (NULL = none): the next copy will read from src (bytes
     * long); called before the current piece is copied. */
    void (*prefetch)(void *wctx, const void *src, uint64_t bytes);
    /* Complete every copy since the last unit_end; 0 or a KVO_E* code. */
    int (*unit_end)(void *wctx);
    /* Static strings for stats: the copy routine in use, and whether it
     * streams. */
    const char *(*copy_kind)(void *state);
    bool (*nontemporal)(void *state);
    /* Bytes of pages per work unit (0: KVO__XUNIT_BYTES, sized for CPU
     * copies).  A device that waits for completion once per unit (CUDA)
     * asks for more, so the wait is small next to the copy; pages of at
     * least twice this are then split into parts of about this size. */
    uint64_t unit_bytes;
    /* Optional (NULL = none), for a device that orders copies against the
     * engine's own work (the CUDA device: a store waits for an event the
     * engine's compute stream reached at submit).  job_submit runs in
     * kvo_transfer_submit on the caller's thread, unlocked, once the job is
     * valid and before it is queued: *token receives the job's device data
     * (or NULL); an error fails the submit.  unit_job tells a worker the
     * token of the job whose unit it copies next, before the unit's first
     * copy().  job_done runs exactly once for each non-NULL token, when the
     * job's result is posted (or the submit fails after job_submit), on any
     * thread, possibly under the engine lock: it must not block. */
    int (*job_submit)(void *state, int dir, void **token);
    void (*unit_job)(void *wctx, void *token);
    void (*job_done)(void *state, void *token);
    /* true: a work unit is a whole job (see the contract above; unit_bytes
     * is then unused). */
    bool whole_jobs;
} kvo__xfer_device_ops;

/* The device called name (NULL = "host"), or NULL when not built in and not
 * attached.  Any thread. */
const kvo__xfer_device_ops *kvo__xfer_device_find(const char *name);
/* The names of the devices available, comma-separated (for messages). */
const char *kvo__xfer_device_names(void);

/* ---- devices in their own shared library (libkvoffload_cuda.so) ---------
 *
 * A device built as its own shared object can neither be seen through the
 * weak references of device.c (libkvoffload.so is linked before it, and its
 * symbols are hidden) nor call the core's hidden kvo__ functions.  So at
 * load (an ELF constructor, src/transfer/cuda/cuda_shared.c) it calls
 * kvo_xfer_device_attach: the core checks the ABI, adds the device to its
 * table (found by name like a built-in one) and fills *fns with the core
 * functions the device's files call (errors into the same kvo_last_error()
 * buffer, the user's allocator, the struct_size check).  This is the one
 * symbol libkvoffload.so exports outside the documented API (kvo_*, not
 * kvo__, so the export check of tools/test-consumers.sh holds); it is not
 * for applications.  Errors: KVO_ENOTSUP (ABI or struct sizes differ: the
 * device library was built for another libkvoffload), KVO_EEXIST (a device
 * of that name is attached already), KVO_ENOMEM (table full), KVO_EINVAL. */
#define KVO__XFER_DEVICE_ABI 2u
typedef struct kvo__core_fns {
    int (*verror)(int err, const char *fmt, va_list ap);
    int (*error_prefix)(int err, const char *fmt, ...);
    void *(*malloc)(size_t n);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t n);
    void (*free)(void *p);
    int (*check_struct_size)(const char *fn, const char *type, size_t given, size_t min, const char *init);
    void (*vlog)(kvo_log_level level, const char *fmt, va_list ap);
    int (*job_token)(kvo_transfer *t, uint64_t job_id, void (*grab)(void *token, void *arg), void *arg);
} kvo__core_fns;
/* The device token of job job_id of t, for a device call made on the
 * caller's thread (kvo_cuda_job_event): under the engine lock, when the job
 * is unfinished, grab(token, arg) runs (it must only take a reference, never
 * block) and 0 is returned; 1 when the job has finished (its result is
 * posted, or polled); KVO_ENOTFOUND (with a message) when t never returned
 * that id; KVO_EINVAL for NULL t.  A job without a token (the device gave
 * none) is unfinished with grab not called. */
int kvo__transfer_job_token(kvo_transfer *t, uint64_t job_id, void (*grab)(void *token, void *arg), void *arg);

KVO_API int kvo_xfer_device_attach(uint32_t abi, const kvo__xfer_device_ops *ops, size_t ops_size,
                                   kvo__core_fns *fns, size_t fns_size);

extern const kvo__xfer_device_ops kvo__xfer_device_host;

#endif
