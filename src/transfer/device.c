/*
 * Transfer devices: the registry and the host device.
 *
 * The host device serves engines whose KV tensors live in host memory (CPU
 * inference engines, and every test).  A copy is a kvo__copy() with the copy
 * routine chosen once at open (streaming stores when the CPU has them and the
 * caller did not say no); unit_end is the sfence that makes streaming stores
 * visible before the core publishes completion.  The per-worker context is
 * the device state itself: the host device keeps no per-thread state.
 *
 * Other devices are listed below through weak references: the CUDA device
 * (src/transfer/cuda/device_cuda.c, in libkvoffload_cuda when KVO_CUDA is
 * on) and the "test" device of tests/test_transfer_device.c.  A program that
 * links the file defining the symbol makes the device selectable by name;
 * the core and the public header do not change.
 */
#include <stdio.h>

#include "transfer/copy.h"
#include "transfer/device.h"

typedef struct kvo__host_dev {
    kvo__copy_kind kind;
} kvo__host_dev;

static int kvo__host_open(const kvo__xfer_device_config *cfg, void **state) {
    if (cfg->index != 0)
        return kvo__error(KVO_ENOTSUP, "transfer device 'host': device_index %d does not exist (use 0)",
                          cfg->index);
    kvo__host_dev *d = kvo__calloc(1, sizeof *d);
    if (!d) return kvo__error(KVO_ENOMEM, "transfer device 'host': out of memory");
    kvo__copy_kind best = kvo__copy_best();
    if (cfg->nontemporal == 0) d->kind = KVO__COPY_MEMCPY;
    else d->kind = best;   /* 1 (always) on a CPU without streaming stores: memcpy */
    *state = d;
    return 0;
}

static void kvo__host_close(void *state) { kvo__free(state); }

static int kvo__host_worker_init(void *state, uint32_t worker, void **wctx) {
    (void)worker;
    *wctx = state;
    return 0;
}

static void kvo__host_worker_fini(void *state, void *wctx) { (void)state; (void)wctx; }

static void kvo__host_copy(void *wctx, int dir, void *dst, const void *src, uint64_t bytes) {
    (void)dir;
    kvo__copy(((kvo__host_dev *)wctx)->kind, dst, src, (size_t)bytes);
}

static int kvo__host_unit_end(void *wctx) {
    if (((kvo__host_dev *)wctx)->kind != KVO__COPY_MEMCPY) kvo__copy_fence();
    return 0;
}

static const char *kvo__host_copy_kind(void *state) { return kvo__copy_kind_name(((kvo__host_dev *)state)->kind); }
static bool kvo__host_nontemporal(void *state) { return ((kvo__host_dev *)state)->kind != KVO__COPY_MEMCPY; }

const kvo__xfer_device_ops kvo__xfer_device_host = {
    .name = "host",
    .open = kvo__host_open,
    .close = kvo__host_close,
    .check_engine_range = NULL,
    .worker_init = kvo__host_worker_init,
    .worker_fini = kvo__host_worker_fini,
    .copy = kvo__host_copy,
    /* no prefetch: the copy streams its source in order and the hardware
     * prefetcher follows it; a software prefetch on top cost CPU and gained
     * nothing measurable (docs/benchmarks.md) */
    .prefetch = NULL,
    .unit_end = kvo__host_unit_end,
    .copy_kind = kvo__host_copy_kind,
    .nontemporal = kvo__host_nontemporal,
};

/* Devices defined by optional sources (absent: the address is NULL).  "test"
 * is defined only by test programs (tests/test_transfer_device.c), which
 * shows that a device plugs in from outside this file's core. */
extern const kvo__xfer_device_ops kvo__xfer_device_cuda __attribute__((weak));
extern const kvo__xfer_device_ops kvo__xfer_device_test __attribute__((weak));

const kvo__xfer_device_ops *kvo__xfer_device_find(const char *name) {
    if (!name || !strcmp(name, "host")) return &kvo__xfer_device_host;
    if (!strcmp(name, "cuda") && &kvo__xfer_device_cuda) return &kvo__xfer_device_cuda;
    if (!strcmp(name, "test") && &kvo__xfer_device_test) return &kvo__xfer_device_test;
    return NULL;
}

const char *kvo__xfer_device_names(void) {
    if (&kvo__xfer_device_cuda) return &kvo__xfer_device_test ? "host, cuda, test" : "host, cuda";
    return &kvo__xfer_device_test ? "host, test" : "host";
}
