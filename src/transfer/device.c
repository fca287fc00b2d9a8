/*
 * Transfer devices: the registry and the host device.
 *
 * The host device serves engines whose KV tensors live in host memory (CPU
 * inference engines, and every test).  A copy is a kvo__copy() with the copy
 * routine the caller fixed (nontemporal 0: memcpy, 1: streaming stores when
 * the CPU has them) or, by default (-1), the one measured faster on this
 * machine (copy_auto.c; measured per unit until each direction is decided);
 * unit_end is the sfence that makes streaming stores visible before the core
 * publishes completion.  Each worker's context holds its current unit's kind
 * and, while measuring, the unit's clock.
 *
 * Other devices are listed below through weak references: the CUDA device
 * (src/transfer/cuda/device_cuda.c, in libkvoffload_cuda when KVO_CUDA is
 * on) and the "test" device of tests/test_transfer_device.c.  A program that
 * links the file defining the symbol makes the device selectable by name;
 * the core and the public header do not change.  A device in its own shared
 * library attaches at load instead (kvo_xfer_device_attach, below) and gets
 * the core functions it calls through a table: errors, the allocator, the
 * log, and kvo__transfer_job_token (a job's device token, read under the
 * engine lock).
 */
#include <pthread.h>
#include <stdio.h>

#include "transfer/copy_auto.h"
#include "transfer/device.h"
#include "transfer/transfer_internal.h" /* kvo__transfer_job_token reads the job table */

typedef struct kvo__host_dev {
    bool automatic;          /* nontemporal -1: the kind is measured (copy_auto.c) */
    kvo__copy_kind kind;     /* the fixed kind (nontemporal 0 or 1) */
} kvo__host_dev;

/* Per worker: the current unit's kind and, while the direction is being
 * measured, its start and bytes. */
typedef struct kvo__host_worker {
    const kvo__host_dev *d;
    kvo__copy_kind kind;
    bool open;          /* a unit has had its first copy */
    int dir;
    uint32_t measured;  /* units this worker measured: picks the candidate */
    uint64_t t0, bytes; /* t0 0: this unit is not measured */
} kvo__host_worker;

static int kvo__host_open(const kvo__xfer_device_config *cfg, void **state) {
    if (cfg->index != 0)
        return kvo__error(KVO_ENOTSUP, "transfer device 'host': device_index %d does not exist (use 0)",
                          cfg->index);
    kvo__host_dev *d = kvo__calloc(1, sizeof *d);
    if (!d) return kvo__error(KVO_ENOMEM, "transfer device 'host': out of memory");
    d->automatic = cfg->nontemporal < 0;
    if (cfg->nontemporal == 0) d->kind = KVO__COPY_MEMCPY;
    else d->kind = kvo__copy_best();   /* 1 (always) on a CPU without streaming stores: memcpy */
    *state = d;
    return 0;
}

static void kvo__host_close(void *state) { kvo__free(state); }

static int kvo__host_worker_init(void *state, uint32_t worker, void **wctx) {
    kvo__host_worker *w = kvo__calloc(1, sizeof *w);
    if (!w) return kvo__error(KVO_ENOMEM, "transfer device 'host': out of memory");
    w->d = state;
    w->measured = worker; /* workers start on different candidates */
    *wctx = w;
    return 0;
}

static void kvo__host_worker_fini(void *state, void *wctx) {
    (void)state;
    kvo__free(wctx);
}

/* A unit's first copy: fix its kind, and start its clock while its direction
 * is being measured. */
static void kvo__host_unit_begin(kvo__host_worker *w, int dir) {
    w->open = true;
    w->dir = dir == KVO_XFER_LOAD;
    w->t0 = 0;
    if (!w->d->automatic) {
        w->kind = w->d->kind;
    } else if (!kvo__copy_auto_decided(w->dir, &w->kind)) {
        w->kind = kvo__copy_auto_candidate(w->measured++);
        w->bytes = 0;
        w->t0 = kvo__copy_auto_now_ns();
    }
}

static void kvo__host_copy(void *wctx, int dir, void *dst, const void *src, uint64_t bytes) {
    kvo__host_worker *w = wctx;
    if (!w->open) kvo__host_unit_begin(w, dir);
    kvo__copy(w->kind, dst, src, (size_t)bytes);
    w->bytes += bytes;
}

static int kvo__host_unit_end(void *wctx) {
    kvo__host_worker *w = wctx;
    if (!w->open) return 0; /* no copy since the last unit_end: nothing to fence */
    if (w->kind != KVO__COPY_MEMCPY) kvo__copy_fence();
    if (w->t0) kvo__copy_auto_sample(w->dir, w->kind, w->bytes, kvo__copy_auto_now_ns() - w->t0);
    w->open = false;
    return 0;
}

static const char *kvo__host_copy_kind(void *state) {
    const kvo__host_dev *d = state;
    return d->automatic ? kvo__copy_auto_name() : kvo__copy_kind_name(d->kind);
}

static bool kvo__host_nontemporal(void *state) {
    const kvo__host_dev *d = state;
    return d->automatic ? kvo__copy_auto_streams() : d->kind != KVO__COPY_MEMCPY;
}

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

/* Devices defined by optional sources linked into the same program (absent:
 * the address is NULL): the CUDA device of libkvoffload_cuda.a, and "test",
 * defined only by test programs (tests/test_transfer_device.c), which shows
 * that a device plugs in from outside this file's core.  Hidden: the shared
 * library never binds them to another object's symbol. */
extern const kvo__xfer_device_ops kvo__xfer_device_cuda __attribute__((weak, visibility("hidden")));
extern const kvo__xfer_device_ops kvo__xfer_device_test __attribute__((weak, visibility("hidden")));

/* Devices attached at run time by their own shared library
 * (kvo_xfer_device_attach).  Written under the mutex, read without it: a slot
 * is published with a release store after its ops pointer is final, and
 * never cleared (a device library stays loaded: it is not unloadable). */
#define KVO__MAX_ATTACHED 4
static pthread_mutex_t kvo__attach_mu = PTHREAD_MUTEX_INITIALIZER;
static const kvo__xfer_device_ops *kvo__attached[KVO__MAX_ATTACHED];
static char kvo__names[128];

static const kvo__xfer_device_ops *kvo__attached_find(const char *name) {
    for (int i = 0; i < KVO__MAX_ATTACHED; i++) {
        const kvo__xfer_device_ops *o = __atomic_load_n(&kvo__attached[i], __ATOMIC_ACQUIRE);
        if (o && !strcmp(o->name, name)) return o;
    }
    return NULL;
}

const kvo__xfer_device_ops *kvo__xfer_device_find(const char *name) {
    if (!name || !strcmp(name, "host")) return &kvo__xfer_device_host;
    if (!strcmp(name, "cuda") && &kvo__xfer_device_cuda) return &kvo__xfer_device_cuda;
    if (!strcmp(name, "test") && &kvo__xfer_device_test) return &kvo__xfer_device_test;
    return kvo__attached_find(name);
}

static void kvo__names_update(void) { /* under kvo__attach_mu */
    char buf[sizeof kvo__names];
    int n = snprintf(buf, sizeof buf, "host%s%s", &kvo__xfer_device_cuda ? ", cuda" : "",
                     &kvo__xfer_device_test ? ", test" : "");
    for (int i = 0; i < KVO__MAX_ATTACHED && kvo__attached[i]; i++)
        if (n > 0 && (size_t)n < sizeof buf)
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", %s", kvo__attached[i]->name);
    memcpy(kvo__names, buf, sizeof buf);
}

const char *kvo__xfer_device_names(void) {
    pthread_mutex_lock(&kvo__attach_mu);
    if (!kvo__names[0]) kvo__names_update();
    pthread_mutex_unlock(&kvo__attach_mu);
    return kvo__names;
}

/* For device libraries (the fns table below, or a direct call in a static
 * build): a job's device token, under the engine lock (device.h). */
int kvo__transfer_job_token(kvo_transfer *t, uint64_t job_id, void (*grab)(void *token, void *arg), void *arg) {
    if (!t) return kvo__error(KVO_EINVAL, "transfer engine is NULL");
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    kvo__xent *e = kvo__xtab_find(t, job_id, KVO__XTAG_JOB);
    if (e) {
        if (e->writer->dev_token && grab) grab(e->writer->dev_token, arg);
    } else if (job_id >= 1 && job_id < t->next_id) {
        rc = 1;
    } else {
        rc = kvo__error(KVO_ENOTFOUND, "no job %llu (ids so far: 1..%llu)", (unsigned long long)job_id,
                        (unsigned long long)t->next_id - 1);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kvo_xfer_device_attach(uint32_t abi, const kvo__xfer_device_ops *ops, size_t ops_size, kvo__core_fns *fns,
                           size_t fns_size) {
    if (!ops || !fns || !ops->name)
        return kvo__error(KVO_EINVAL, "kvo_xfer_device_attach: ops, ops->name and fns must not be NULL");
    if (abi != KVO__XFER_DEVICE_ABI || ops_size != sizeof *ops || fns_size != sizeof *fns)
        return kvo__error(KVO_ENOTSUP,
                          "kvo_xfer_device_attach: device library '%s' was built for another libkvoffload (ABI %u, "
                          "%zu/%zu-byte tables; this one: ABI %u, %zu/%zu): install matching versions",
                          ops->name, abi, ops_size, fns_size, KVO__XFER_DEVICE_ABI, sizeof *ops, sizeof *fns);
    int rc = 0;
    pthread_mutex_lock(&kvo__attach_mu);
    const kvo__xfer_device_ops *have = kvo__xfer_device_find(ops->name);
    if (have && have != ops) {
        rc = kvo__error(KVO_EEXIST, "kvo_xfer_device_attach: a transfer device '%s' exists already", ops->name);
    } else if (!have) { /* (have == ops: attached before; only the functions again) */
        int slot = 0;
        while (slot < KVO__MAX_ATTACHED && kvo__attached[slot]) slot++;
        if (slot == KVO__MAX_ATTACHED) {
            rc = kvo__error(KVO_ENOMEM, "kvo_xfer_device_attach: at most %d device libraries", KVO__MAX_ATTACHED);
        } else {
            __atomic_store_n(&kvo__attached[slot], ops, __ATOMIC_RELEASE);
            kvo__names_update();
        }
    }
    if (!rc)
        *fns = (kvo__core_fns){kvo__verror,           kvo__error_prefix, kvo__malloc, kvo__calloc,
                               kvo__realloc,          kvo__free,         kvo__check_struct_size, kvo__vlog,
                               kvo__transfer_job_token};
    pthread_mutex_unlock(&kvo__attach_mu);
    return rc;
}
