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
 * copy() may be asynchronous (a CUDA device enqueues on the worker's stream);
 * unit_end() returns only when every copy issued since the previous unit_end
 * is complete and visible to other threads (the host device issues an sfence
 * after streaming stores; the CUDA device records an event after the unit's
 * copies and polls it), and reports the first failure.  copy() is never
 * called with zero bytes.
 *
 * Adding a device: define a `const kvo__xfer_device_ops` in the device's own
 * file and add one weak reference to it in device.c (kvo__xfer_device_find
 * and kvo__xfer_device_names); the core and the public header stay
 * unchanged, and users select it with kvo_transfer_params.device = "<name>".
 * Two devices plug in this way: the CUDA device (kvo__xfer_device_cuda,
 * src/transfer/cuda/device_cuda.c, built into libkvoffload_cuda by the
 * KVO_CUDA option; docs/gpu.md) and the "test" device of
 * tests/test_transfer_device.c (memcpy copies, injected DMA errors).  The
 * CUDA device collects a unit's copies, enqueues them (kernel, batched or
 * single copies) on its stream for the direction and polls a CUDA event in
 * unit_end; slots are pinned host memory (the store's arena);
 * check_engine_range asks cudaPointerGetAttributes that a segment is device
 * memory.
 */
#ifndef KVO_TRANSFER_DEVICE_H
#define KVO_TRANSFER_DEVICE_H

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
} kvo__xfer_device_ops;

/* The device called name (NULL = "host"), or NULL when not built in. */
const kvo__xfer_device_ops *kvo__xfer_device_find(const char *name);
/* The names of the devices built in, comma-separated (for messages). */
const char *kvo__xfer_device_names(void);

extern const kvo__xfer_device_ops kvo__xfer_device_host;

#endif
