/*
 * CUDA device: the per-device context (kvo_cuda), its registry and pinned
 * host ranges.
 *
 * One context per device index per process, kept in a small registry (an
 * array indexed by device ordinal under one mutex).  It owns the two streams
 * (stores, loads: one per direction per device, created non-blocking so they
 * never synchronise with the legacy default stream), the compute stream the
 * engine passed, the copy-planning thresholds and the pinned host ranges.  A
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
 * insertion shift is cheap.
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
    return p;
}

int kvo_cuda_device_count(int *count) {
    if (!count) return kvo__error(KVO_EINVAL, "kvo_cuda_device_count: count must not be NULL");
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

static void kvo__cuda_free(kvo_cuda *cu) {
    (void)cudaSetDevice(cu->index);
    for (size_t i = 0; i < cu->n_pins; i++) (void)cudaHostUnregister((void *)cu->pins[i].base);
    for (int d = 0; d < 2; d++)
        if (cu->stream[d]) (void)cudaStreamDestroy(cu->stream[d]);
    (void)cudaGetLastError();
    pthread_rwlock_destroy(&cu->pin_lock);
    kvo__free(cu->pins);
    kvo__free(cu);
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
    int count = 0;
    int rc = kvo_cuda_device_count(&count);
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
    cu->compute = p->compute_stream;
    cu->plan = kvo__cuda_plan_default_cfg(cu->batch_ok);
    cu->plan.kernel_max_bytes = p->kernel_max_bytes;
    cu->plan.kernel_min_pieces = p->kernel_min_pieces;
    cu->st.batch_available = batch_ok;
    pthread_rwlock_init(&cu->pin_lock, NULL);
    cudaError_t e = cudaSetDevice(cu->index);
    for (int d = 0; d < 2 && e == cudaSuccess; d++)
        e = cudaStreamCreateWithFlags(&cu->stream[d], cudaStreamNonBlocking);
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
    kvo_cuda_params p_in_;
    KVO__PARAMS_IN(p, kvo_cuda_params, p_in_, kvo_cuda_default_params, require_pinned, "kvo_cuda_create");
    kvo_cuda *cu;
    int rc = kvo__cuda_new(p, &cu);
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
    __atomic_store_n(&cu->compute, stream, __ATOMIC_RELEASE);
    return 0;
}

int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event) {
    if (!cu || !event || (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD))
        return kvo__error(KVO_EINVAL, "kvo_cuda_record_event: cu and event must not be NULL, dir must be "
                                      "KVO_XFER_STORE or KVO_XFER_LOAD (got %d)", (int)dir);
    cudaError_t e = cudaEventRecord((cudaEvent_t)event, cu->stream[dir]);
    return e == cudaSuccess ? 0 : kvo__cuda_error(e, "kvo_cuda_record_event: cudaEventRecord");
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
    cudaError_t e = cudaSuccess;
    void *dptr = NULL;
    if (!rc) {
        e = cudaSetDevice(cu->index);
        if (e == cudaSuccess)
            e = cudaHostRegister(ptr, (size_t)bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
        if (e != cudaSuccess) rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cudaHostRegister");
    }
    if (!rc && (e = cudaHostGetDevicePointer(&dptr, ptr, 0)) != cudaSuccess) {
        rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cudaHostGetDevicePointer");
        (void)cudaHostUnregister(ptr);
    }
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
        cudaError_t e = cudaSetDevice(cu->index);
        if (e == cudaSuccess) e = cudaHostUnregister(ptr);
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
#undef KVO__LD
    out->batch_available = cu->st.batch_available;
    return 0;
}

int kvo_cuda_get_stats(kvo_cuda *cu, kvo_cuda_stats *out) {
    kvo_cuda_stats full = KVO_CUDA_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_cuda_get_stats", kvo_cuda_stats, batch_available, "KVO_CUDA_STATS_INIT", out, full,
                   kvo__cuda_stats_fill(cu, &full));
}
