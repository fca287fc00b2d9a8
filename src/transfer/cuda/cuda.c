/*
 * CUDA device: the per-device context (kvo_cuda), its registry and pinned
 * host ranges.
 *
 * One context per device index per process, kept in a small registry (an
 * array indexed by device ordinal under one mutex).  It owns the copy
 * streams (two per direction, stores and loads, created non-blocking so they
 * never synchronise with the legacy default stream: the first carries the
 * copy-engine units and the kernel units of even workers, the second the
 * kernel units of odd workers, device_cuda.c), the compute stream the
 * engine passed, the copy-planning thresholds and the pinned host ranges.
 * kvo_cuda_record_event joins a direction's second stream into its first
 * (an event recorded on the second, waited for on the first) before it
 * records the caller's event, so that event still covers every copy of the
 * direction enqueued so far.  A
 * transfer engine opened with device "cuda" takes a reference on the
 * registered context of its device_index, or creates one with the defaults;
 * kvo_cuda_create's caller holds one reference too.  The context is freed
 * (ranges unregistered, streams destroyed) when the last reference goes:
 * unit_end never returns with copies in flight, so nothing is pending then.
 *
 * Pinned ranges: a sorted array of disjoint [base, base + bytes) with the
 * offset of their device-visible alias, under a reader-writer lock: workers
 * look up each slot (binary search, read lock held once per work unit);
 * pin/unpin take the write lock.  The ranges are few (one per arena), so the
 * insertion shift is cheap.  The registration behind them is process-wide
 * (cudaHostRegister is, for portable memory) and counted over the contexts
 * that pinned the range, so one arena serves several devices.
 *
 * Every function here that runs on a caller's thread and needs a device
 * current brackets its CUDA calls with kvo__cuda_enter / kvo__cuda_leave:
 * the caller's current device is never changed.  The job event pool (one
 * cudaEvent_t per store in flight with a compute stream) grows on demand
 * and lives as long as the context.
 */
#include "transfer/cuda/cuda_internal.h"

static pthread_mutex_t kvo__cuda_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static kvo_cuda *kvo__cuda_reg[KVO__CUDA_MAX_DEVICES];

int kvo__cuda_error(cudaError_t e, const char *what) {
    int code;
    switch (e) {
    case cudaErrorMemoryAllocation: code = KVO_ENOMEM; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNotSupported: code = KVO_ENOTSUP; break;
    case cudaErrorInvalidValue: code = KVO_EINVAL; break;
    case cudaErrorHostMemoryAlreadyRegistered: code = KVO_EEXIST; break;
    case cudaErrorHostMemoryNotRegistered: code = KVO_ENOTFOUND; break;
    default: code = KVO_EIO; break;
    }
    const char *hint = "";
    if (e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure)
        hint = " (sticky: the CUDA context of this process is unusable; later copies fail too, restart it)";
    return kvo__error(code, "%s: %s (%s)%s", what, cudaGetErrorName(e), cudaGetErrorString(e), hint);
}

kvo_cuda_params kvo_cuda_default_params(void) {
    kvo_cuda_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.device_index = 0;
    p.compute_stream = NULL;
    p.kernel_max_bytes = 16384;
    p.kernel_min_pieces = 4;
    p.batch = -1;
    p.require_pinned = true;
    p.completion_timeout_ms = 60000;
    return p;
}

int kvo_cuda_device_count(int *count) {
    if (!count) return kvo__error(KVO_EINVAL, "kvo_cuda_device_count: count must not be NULL");
    *count = 0;
    int rc = kvo__cuda_attached("kvo_cuda_device_count");
    if (rc) return rc;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        return kvo__error(KVO_ENOTSUP, "kvo_cuda_device_count: no usable CUDA device: cudaGetDeviceCount: %s (%s)",
                          cudaGetErrorName(e), cudaGetErrorString(e));
    }
    *count = n;
    if (n == 0) return kvo__error(KVO_ENOTSUP, "kvo_cuda_device_count: no CUDA device is visible");
    return 0;
}

/* ---- process-wide registrations -------------------------------------------
 * cudaHostRegister(portable) makes a range pinned for every device, and a
 * second registration of it fails: so each range is registered once for the
 * process and counted over the contexts that pinned it (one arena pinned for
 * several devices), and unregistered when the last one unpins.  A range the
 * caller registered itself (torch's pin_memory, cudaHostRegister) is used
 * as it is and never unregistered here. */
typedef struct kvo__cuda_gpin {
    uintptr_t base;
    uint64_t bytes;
    uint32_t users;
    bool external;
} kvo__cuda_gpin;
static pthread_mutex_t kvo__gpin_mu = PTHREAD_MUTEX_INITIALIZER;
static kvo__cuda_gpin *kvo__gpins;
static size_t kvo__n_gpins, kvo__cap_gpins;

/* Under kvo__gpin_mu, the device current: count one more user of [b, +bytes). */
static int kvo__gpin_acquire(uintptr_t b, uint64_t bytes) {
    for (size_t i = 0; i < kvo__n_gpins; i++) {
        kvo__cuda_gpin *g = &kvo__gpins[i];
        if (g->base == b && g->bytes == bytes) {
            g->users++;
            return 0;
        }
        if (b < g->base + g->bytes && g->base < b + bytes)
            return kvo__error(KVO_EEXIST, "overlaps [%p, +%llu), pinned (by this or another device's context) "
                                          "with other bounds: pin the same range, or disjoint ones",
                              (void *)g->base, (unsigned long long)g->bytes);
    }
    int rc = kvo__grow((void **)&kvo__gpins, &kvo__cap_gpins, kvo__n_gpins + 1, sizeof *kvo__gpins, 4,
                       "pinned ranges");
    if (rc) return rc;
    bool external = false;
    cudaError_t e = cudaHostRegister((void *)b, (size_t)bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        external = true;
    } else if (e != cudaSuccess) {
        return kvo__cuda_error(e, "cudaHostRegister");
    }
    kvo__gpins[kvo__n_gpins++] = (kvo__cuda_gpin){b, bytes, 1, external};
    return 0;
}

/* Under kvo__gpin_mu, the device current: one user fewer; unregister at the
 * last (unless leak: after a completion timeout, which would block). */
static cudaError_t kvo__gpin_release(uintptr_t b, bool leak) {
    for (size_t i = 0; i < kvo__n_gpins; i++) {
        kvo__cuda_gpin *g = &kvo__gpins[i];
        if (g->base != b) continue;
        if (--g->users) return cudaSuccess;
        bool unreg = !g->external && !leak;
        kvo__gpins[i] = kvo__gpins[--kvo__n_gpins];
        return unreg ? cudaHostUnregister((void *)b) : cudaSuccess;
    }
    return cudaSuccess;
}

/* On the caller's thread (destroy, or a failed create): its device is put
 * back.  After a completion timeout nothing that could wait for the device
 * is called: the ranges stay registered, the streams and events leak. */
static void kvo__cuda_free(kvo_cuda *cu) {
    int prev;
    (void)kvo__cuda_enter(cu->index, &prev);
    bool hung = __atomic_load_n(&cu->hung, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&kvo__gpin_mu);
    for (size_t i = 0; i < cu->n_pins; i++) (void)kvo__gpin_release(cu->pins[i].base, hung);
    pthread_mutex_unlock(&kvo__gpin_mu);
    if (!hung) {
        for (int d = 0; d < 2; d++) {
            if (cu->stream[d]) (void)cudaStreamDestroy(cu->stream[d]);
            if (cu->kstream[d]) (void)cudaStreamDestroy(cu->kstream[d]);
            if (cu->join[d]) (void)cudaEventDestroy(cu->join[d]);
        }
        for (kvo__cuda_jobev *e = cu->ev_all; e; e = e->all) (void)cudaEventDestroy(e->ev);
    }
    (void)cudaGetLastError();
    kvo__cuda_leave(cu->index, prev);
    for (kvo__cuda_jobev *e = cu->ev_all, *n; e; e = n) {
        n = e->all;
        kvo__free(e);
    }
    pthread_mutex_destroy(&cu->ev_lock);
    pthread_rwlock_destroy(&cu->pin_lock);
    kvo__free(cu->pins);
    kvo__free(cu);
}

int kvo__cuda_jobev_get(kvo_cuda *cu, kvo__cuda_jobev **out) {
    pthread_mutex_lock(&cu->ev_lock);
    kvo__cuda_jobev *e = cu->ev_free;
    if (e) cu->ev_free = e->next;
    pthread_mutex_unlock(&cu->ev_lock);
    if (e) {
        *out = e;
        return 0;
    }
    e = kvo__calloc(1, sizeof *e);
    if (!e) return kvo__error(KVO_ENOMEM, "out of memory for a job event");
    int prev;
    cudaError_t ce = kvo__cuda_enter(cu->index, &prev); /* the caller's thread */
    if (ce == cudaSuccess) ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    kvo__cuda_leave(cu->index, prev);
    if (ce != cudaSuccess) {
        kvo__free(e);
        return kvo__cuda_error(ce, "cudaEventCreate (job event)");
    }
    pthread_mutex_lock(&cu->ev_lock);
    e->all = cu->ev_all;
    cu->ev_all = e;
    pthread_mutex_unlock(&cu->ev_lock);
    *out = e;
    return 0;
}

void kvo__cuda_jobev_put(kvo_cuda *cu, kvo__cuda_jobev *e) {
    if (!e) return;
    pthread_mutex_lock(&cu->ev_lock);
    e->next = cu->ev_free;
    cu->ev_free = e;
    pthread_mutex_unlock(&cu->ev_lock);
}

int kvo__cuda_stream_device(void *s) {
#if CUDART_VERSION >= 12080
    int dev = -1;
    if (cudaStreamGetDevice((cudaStream_t)s, &dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
#else
    (void)s;
    return -1;
#endif
}

/* A compute stream on another device than cu's: KVO_EINVAL naming both. */
static int kvo__cuda_check_compute(const char *fn, int index, void *stream) {
    if (!stream) return 0;
    int dev = kvo__cuda_stream_device(stream);
    if (dev >= 0 && dev != index)
        return kvo__error(KVO_EINVAL,
                          "%s: the compute stream %p belongs to CUDA device %d, this context copies on device %d "
                          "(create the kvo_cuda with device_index = %d, or pass a stream of device %d)",
                          fn, stream, dev, index, dev, index);
    return 0;
}

static bool kvo__cuda_batch_available(void) {
#if CUDART_VERSION >= 12080
    int drv = 0;
    return cudaDriverGetVersion(&drv) == cudaSuccess && drv >= 12080;
#else
    return false;
#endif
}

/* A new context (refs 0, not registered). */
static int kvo__cuda_new(const kvo_cuda_params *p, kvo_cuda **out) {
    const char *fn = "kvo_cuda_create";
    if (p->device_index < 0 || p->device_index >= KVO__CUDA_MAX_DEVICES)
        return kvo__error(KVO_EINVAL, "%s: device_index %d is out of range (0..%d)", fn, p->device_index,
                          KVO__CUDA_MAX_DEVICES - 1);
    if (p->batch < -1 || p->batch > 1)
        return kvo__error(KVO_EINVAL, "%s: batch = %d, must be -1 (auto), 0 or 1", fn, p->batch);
    int rc = kvo__cuda_check_compute(fn, p->device_index, p->compute_stream);
    if (rc) return rc;
    int count = 0;
    rc = kvo_cuda_device_count(&count);
    if (rc) return kvo__error_prefix(rc, "%s: device %d", fn, p->device_index);
    if (p->device_index >= count)
        return kvo__error(KVO_ENOTSUP, "%s: device_index %d does not exist (%d CUDA device(s): use 0..%d)", fn,
                          p->device_index, count, count - 1);
    bool batch_ok = kvo__cuda_batch_available();
    if (p->batch == 1 && !batch_ok)
        return kvo__error(KVO_ENOTSUP, "%s: batch = 1 but this runtime/driver has no cudaMemcpyBatchAsync "
                                       "(needs CUDA 12.8+; use batch = -1)", fn);
    kvo_cuda *cu = kvo__calloc(1, sizeof *cu);
    if (!cu) return kvo__error(KVO_ENOMEM, "%s: out of memory", fn);
    cu->index = p->device_index;
    cu->batch_ok = batch_ok && p->batch != 0;
    cu->require_pinned = p->require_pinned;
    cu->timeout_ms = p->completion_timeout_ms;
    cu->compute = p->compute_stream;
    cu->plan = kvo__cuda_plan_default_cfg(cu->batch_ok);
    cu->plan.kernel_max_bytes = p->kernel_max_bytes;
    cu->plan.kernel_min_pieces = p->kernel_min_pieces;
    cu->st.batch_available = batch_ok;
    pthread_rwlock_init(&cu->pin_lock, NULL);
    pthread_mutex_init(&cu->ev_lock, NULL);
    int prev;
    cudaError_t e = kvo__cuda_enter(cu->index, &prev); /* the caller's device is put back */
    for (int d = 0; d < 2 && e == cudaSuccess; d++) {
        e = cudaStreamCreateWithFlags(&cu->stream[d], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&cu->kstream[d], cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&cu->join[d], cudaEventDisableTiming);
    }
    kvo__cuda_leave(cu->index, prev);
    if (e != cudaSuccess) {
        rc = kvo__cuda_error(e, "kvo_cuda_create: creating the copy streams");
        kvo__cuda_free(cu);
        return rc;
    }
    *out = cu;
    return 0;
}

int kvo_cuda_create(const kvo_cuda_params *p, kvo_cuda **out) {
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_cuda_create: params and out must not be NULL");
    *out = NULL;
    int rc = kvo__cuda_attached("kvo_cuda_create");
    if (rc) return rc;
    kvo_cuda_params p_in_;
    KVO__PARAMS_IN(p, kvo_cuda_params, p_in_, kvo_cuda_default_params, require_pinned, "kvo_cuda_create");
    kvo_cuda *cu;
    rc = kvo__cuda_new(p, &cu);
    if (rc) return rc;
    pthread_mutex_lock(&kvo__cuda_reg_mu);
    if (kvo__cuda_reg[cu->index]) {
        pthread_mutex_unlock(&kvo__cuda_reg_mu);
        int idx = cu->index;
        kvo__cuda_free(cu);
        return kvo__error(KVO_EEXIST,
                          "kvo_cuda_create: device %d already has a context (from kvo_cuda_create, or made by a "
                          "transfer engine with device \"cuda\" created first: create the kvo_cuda before it)",
                          idx);
    }
    cu->refs = 1;
    cu->user = true;
    kvo__cuda_reg[cu->index] = cu;
    pthread_mutex_unlock(&kvo__cuda_reg_mu);
    *out = cu;
    return 0;
}

int kvo__cuda_acquire(int index, kvo_cuda **out) {
    pthread_mutex_lock(&kvo__cuda_reg_mu);
    kvo_cuda *cu = index >= 0 && index < KVO__CUDA_MAX_DEVICES ? kvo__cuda_reg[index] : NULL;
    if (cu) {
        cu->refs++;
        pthread_mutex_unlock(&kvo__cuda_reg_mu);
        *out = cu;
        return 0;
    }
    /* Creating under the registry lock keeps two engines from racing to
     * make two contexts for one device; creation is rare. */
    kvo_cuda_params p = kvo_cuda_default_params();
    p.device_index = index;
    int rc = kvo__cuda_new(&p, &cu);
    if (!rc) {
        cu->refs = 1;
        kvo__cuda_reg[index] = cu;
        *out = cu;
    }
    pthread_mutex_unlock(&kvo__cuda_reg_mu);
    return rc;
}

void kvo__cuda_release(kvo_cuda *cu) {
    pthread_mutex_lock(&kvo__cuda_reg_mu);
    bool last = --cu->refs == 0;
    if (last) kvo__cuda_reg[cu->index] = NULL;
    pthread_mutex_unlock(&kvo__cuda_reg_mu);
    if (last) kvo__cuda_free(cu);
}

void kvo_cuda_destroy(kvo_cuda *cu) {
    if (!cu) return;
    pthread_mutex_lock(&kvo__cuda_reg_mu);
    bool had = cu->user;
    cu->user = false;
    pthread_mutex_unlock(&kvo__cuda_reg_mu);
    if (had) kvo__cuda_release(cu);
}

int kvo_cuda_set_compute_stream(kvo_cuda *cu, void *stream) {
    if (!cu) return kvo__error(KVO_EINVAL, "kvo_cuda_set_compute_stream: cu must not be NULL");
    int rc = kvo__cuda_check_compute("kvo_cuda_set_compute_stream", cu->index, stream);
    if (rc) return rc;
    __atomic_store_n(&cu->compute, stream, __ATOMIC_RELEASE);
    return 0;
}

int kvo_cuda_job_event(kvo_cuda *cu, kvo_transfer *t, kvo_xfer_dir dir, uint64_t job_id, void *event) {
    if (!cu || !t || !event || (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD))
        return kvo__error(KVO_EINVAL, "kvo_cuda_job_event: cu, t and event must not be NULL, dir must be "
                                      "KVO_XFER_STORE or KVO_XFER_LOAD (got %d)", (int)dir);
    int rc = kvo_transfer_wait(t, &job_id, 1, 0);
    if (rc == KVO_ETIMEDOUT)
        return kvo__error(KVO_EAGAIN, "kvo_cuda_job_event: job %llu has not finished: ask once kvo_transfer_poll "
                                      "or kvo_transfer_wait reported it (its copies are enqueued by then)",
                          (unsigned long long)job_id);
    if (rc) return kvo__error_prefix(rc, "kvo_cuda_job_event");
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, cu->stream[dir]);
    return e == cudaSuccess ? 0 : kvo__cuda_error(e, "kvo_cuda_job_event: cudaEventRecord");
}

int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event) {
    if (!cu || !event || (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD))
        return kvo__error(KVO_EINVAL, "kvo_cuda_record_event: cu and event must not be NULL, dir must be "
                                      "KVO_XFER_STORE or KVO_XFER_LOAD (got %d)", (int)dir);
    /* The direction's copies are on two streams: the second joins the first
     * (what it holds now) before the caller's event.  Two callers at once may
     * each wait on the other's later mark: that covers more, never less. */
    int prev;
    cudaError_t e = kvo__cuda_enter(cu->index, &prev);
    const char *what = "cudaSetDevice";
    if (e == cudaSuccess && (e = cudaEventRecord(cu->join[dir], cu->kstream[dir])) != cudaSuccess)
        what = "cudaEventRecord (joining the kernel stream)";
    if (e == cudaSuccess && (e = cudaStreamWaitEvent(cu->stream[dir], cu->join[dir], 0)) != cudaSuccess)
        what = "cudaStreamWaitEvent (joining the kernel stream)";
    if (e == cudaSuccess && (e = cudaEventRecord((cudaEvent_t)event, cu->stream[dir])) != cudaSuccess)
        what = "cudaEventRecord";
    kvo__cuda_leave(cu->index, prev);
    if (e == cudaSuccess) return 0;
    int rc = kvo__cuda_error(e, what);
    return kvo__error_prefix(rc, "kvo_cuda_record_event");
}

/* Index of the last range with base <= p, or -1. */
static ptrdiff_t kvo__cuda_pin_find(const kvo_cuda *cu, uintptr_t p) {
    size_t lo = 0, hi = cu->n_pins;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cu->pins[mid].base <= p) lo = mid + 1;
        else hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

bool kvo__cuda_pinned(const kvo_cuda *cu, uintptr_t p, uint64_t bytes, int64_t *hdelta) {
    ptrdiff_t i = kvo__cuda_pin_find(cu, p);
    if (i < 0) return false;
    const kvo__cuda_pin *r = &cu->pins[i];
    if (p - r->base > r->bytes || bytes > r->bytes - (p - r->base)) return false;
    *hdelta = r->hdelta;
    return true;
}

int kvo_cuda_pin_host(kvo_cuda *cu, void *ptr, uint64_t bytes) {
    if (!cu || !ptr || bytes == 0)
        return kvo__error(KVO_EINVAL, "kvo_cuda_pin_host: cu and ptr must not be NULL and bytes (%llu) >= 1",
                          (unsigned long long)bytes);
    uintptr_t b = (uintptr_t)ptr;
    if (bytes > UINTPTR_MAX - b)
        return kvo__error(KVO_EINVAL, "kvo_cuda_pin_host: %p + %llu bytes overflows", ptr, (unsigned long long)bytes);
    pthread_rwlock_wrlock(&cu->pin_lock);
    ptrdiff_t i = kvo__cuda_pin_find(cu, b);
    const kvo__cuda_pin *prev = i >= 0 ? &cu->pins[i] : NULL;
    const kvo__cuda_pin *next = (size_t)(i + 1) < cu->n_pins ? &cu->pins[i + 1] : NULL;
    int rc = 0;
    if ((prev && b < prev->base + prev->bytes) || (next && next->base < b + bytes))
        rc = kvo__error(KVO_EEXIST, "kvo_cuda_pin_host: [%p, +%llu) overlaps a range pinned already", ptr,
                        (unsigned long long)bytes);
    if (!rc) rc = kvo__grow((void **)&cu->pins, &cu->cap_pins, cu->n_pins + 1, sizeof *cu->pins, 4, "pinned ranges");
    int dprev = -1;
    void *dptr = NULL;
    cudaError_t e = cudaSuccess;
    if (!rc) {
        e = kvo__cuda_enter(cu->index, &dprev);
        if (e != cudaSuccess) rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cudaSetDevice");
    }
    if (!rc) {
        pthread_mutex_lock(&kvo__gpin_mu);
        rc = kvo__gpin_acquire(b, bytes);
        if (!rc && (e = cudaHostGetDevicePointer(&dptr, ptr, 0)) != cudaSuccess) {
            rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cudaHostGetDevicePointer (registered without "
                                    "cudaHostRegisterMapped?)");
            (void)kvo__gpin_release(b, false);
        }
        pthread_mutex_unlock(&kvo__gpin_mu);
    }
    kvo__cuda_leave(cu->index, dprev);
    if (!rc) {
        size_t at = (size_t)(i + 1);
        memmove(&cu->pins[at + 1], &cu->pins[at], (cu->n_pins - at) * sizeof *cu->pins);
        cu->pins[at] = (kvo__cuda_pin){b, bytes, (int64_t)((intptr_t)dptr - (intptr_t)b)};
        cu->n_pins++;
    }
    pthread_rwlock_unlock(&cu->pin_lock);
    if (rc) (void)cudaGetLastError();
    return rc ? kvo__error_prefix(rc, "pinning %llu bytes at %p on device %d", (unsigned long long)bytes, ptr,
                                  cu->index)
              : 0;
}

int kvo_cuda_unpin_host(kvo_cuda *cu, void *ptr) {
    if (!cu || !ptr) return kvo__error(KVO_EINVAL, "kvo_cuda_unpin_host: cu and ptr must not be NULL");
    pthread_rwlock_wrlock(&cu->pin_lock);
    ptrdiff_t i = kvo__cuda_pin_find(cu, (uintptr_t)ptr);
    int rc = 0;
    if (i < 0 || cu->pins[i].base != (uintptr_t)ptr) {
        rc = kvo__error(KVO_ENOTFOUND, "kvo_cuda_unpin_host: %p is not the start of a range pinned on device %d",
                        ptr, cu->index);
    } else {
        int prev;
        cudaError_t e = kvo__cuda_enter(cu->index, &prev);
        pthread_mutex_lock(&kvo__gpin_mu);
        if (e == cudaSuccess) e = kvo__gpin_release((uintptr_t)ptr, __atomic_load_n(&cu->hung, __ATOMIC_ACQUIRE));
        pthread_mutex_unlock(&kvo__gpin_mu);
        kvo__cuda_leave(cu->index, prev);
        /* Forget the range even if CUDA refuses: it is unusable either way. */
        memmove(&cu->pins[i], &cu->pins[i + 1], (cu->n_pins - (size_t)i - 1) * sizeof *cu->pins);
        cu->n_pins--;
        if (e != cudaSuccess) rc = kvo__cuda_error(e, "kvo_cuda_unpin_host: cudaHostUnregister");
    }
    pthread_rwlock_unlock(&cu->pin_lock);
    return rc;
}

int kvo_cuda_pin_arena(kvo_cuda *cu, kvo_arena *arena) {
    if (!arena) return kvo__error(KVO_EINVAL, "kvo_cuda_pin_arena: arena must not be NULL");
    return kvo_cuda_pin_host(cu, kvo_arena_base(arena), kvo_arena_size(arena));
}

int kvo_cuda_unpin_arena(kvo_cuda *cu, kvo_arena *arena) {
    if (!arena) return kvo__error(KVO_EINVAL, "kvo_cuda_unpin_arena: arena must not be NULL");
    return kvo_cuda_unpin_host(cu, kvo_arena_base(arena));
}

/* A whole snapshot of cu's counters into out. */
static int kvo__cuda_stats_fill(kvo_cuda *cu, kvo_cuda_stats *out) {
    if (!cu) return kvo__error(KVO_EINVAL, "kvo_cuda_get_stats: cu must not be NULL");
#define KVO__LD(f) out->f = __atomic_load_n(&cu->st.f, __ATOMIC_RELAXED)
    KVO__LD(units);
    KVO__LD(memcpy_calls);
    KVO__LD(batch_calls);
    KVO__LD(batch_pieces);
    KVO__LD(kernel_launches);
    KVO__LD(kernel_pieces);
    KVO__LD(errors);
    KVO__LD(batch_refused);
    KVO__LD(timeouts);
#undef KVO__LD
    out->batch_available = cu->st.batch_available;
    return 0;
}

int kvo_cuda_get_stats(kvo_cuda *cu, kvo_cuda_stats *out) {
    kvo_cuda_stats full = KVO_CUDA_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_cuda_get_stats", kvo_cuda_stats, batch_available, "KVO_CUDA_STATS_INIT", out, full,
                   kvo__cuda_stats_fill(cu, &full));
}
