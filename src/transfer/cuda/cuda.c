/*
 * CUDA device: the per-device context (kvo_cuda), its registry, pinned host
 * ranges, job tokens and the kernel's module.
 *
 * One context per device index per process, kept in a small registry (an
 * array indexed by device ordinal under one mutex).  It holds the device's
 * primary context (retained: the one the CUDA runtime and torch use, so
 * streams, events and tensors pass between them), one copy stream per
 * direction (non-blocking, so it never synchronises with the legacy default
 * stream) that every worker of every transfer engine on the device enqueues
 * its jobs on, an auxiliary stream for kvo_cuda_job_event, the kernel's
 * module, the compute stream the engine passed, the copy-planning thresholds
 * and the pinned host ranges.  A transfer engine opened with device "cuda"
 * takes a reference on the registered context of its device_index, or
 * creates one with the defaults; kvo_cuda_create's caller holds one
 * reference too.  The context is freed when the last reference goes.
 *
 * The kernel's module: the fatbin embedded at build time (code for several
 * GPU generations and PTX, from CUDA 13's nvcc), else the embedded PTX
 * written for PTX ISA 7.0 (any driver of CUDA 11.0 or later compiles it: a
 * CUDA 12 driver may refuse the fatbin's code), else none: small pages then
 * go to the copy engine, and that is logged once.  Batched copies
 * (cuMemcpyBatchAsync, CUDA 12.8 drivers) likewise: without them every
 * piece of the copy engine is one cuMemcpyAsync, logged once.
 *
 * Pinned ranges: a sorted array of disjoint [base, base + bytes) with the
 * offset of their device-visible alias, under a reader-writer lock: workers
 * look up each slot (binary search, read lock held once per job); pin/unpin
 * take the write lock.  The ranges are few (one per arena), so the insertion
 * shift is cheap.  The registration behind them is process-wide
 * (cuMemHostRegister with PORTABLE is) and counted over the contexts that
 * pinned the range, so one arena serves several devices.  Memory the caller
 * registered itself is accepted when a registration covers all of it
 * (kvo__cuda_host_registered walks the registrations over the range; a range
 * that only starts in one is not pinned).
 *
 * Job tokens (device_cuda.c's job_submit .. job_done): a pooled record per
 * job with its events (the compute stream's mark at submit, and the event
 * after the job's copies) and where its copies stand, so that
 * kvo_cuda_job_event can wait for a job's copies to be enqueued and give an
 * event after them.  Lock order: the transfer engine's lock, then job_lock
 * (job_done and the core's job_token run under the engine's lock).
 *
 * A completion timeout (device_cuda.c) leaves copies that may still run:
 * the worker buries the buffers they read (kvo__cuda_bury), and freeing the
 * context first asks whether every stream is idle; when one is not, nothing
 * that could wait for the GPU is called and what it may touch is leaked.
 *
 * Every function here that runs on a caller's thread pushes the context for
 * its driver calls and pops it after (kvo__cuda_enter / _leave): the
 * caller's current context is never changed.
 */
#include <errno.h>
#include <time.h>

#include "transfer/cuda/cuda_internal.h"

static pthread_mutex_t kvo__cuda_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static kvo_cuda *kvo__cuda_reg[KVO__CUDA_MAX_DEVICES];

int kvo__cuda_error(CUresult e, const char *what) {
    int code;
    switch (e) {
    case CUDA_ERROR_OUT_OF_MEMORY: code = KVO_ENOMEM; break;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_NOT_SUPPORTED: code = KVO_ENOTSUP; break;
    case CUDA_ERROR_INVALID_VALUE: code = KVO_EINVAL; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: code = KVO_EEXIST; break;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: code = KVO_ENOTFOUND; break;
    default: code = KVO_EIO; break;
    }
    const char *hint = "";
    if (e == CUDA_ERROR_ILLEGAL_ADDRESS || e == CUDA_ERROR_LAUNCH_FAILED)
        hint = " (sticky: the CUDA context of this process is unusable; later copies fail too, restart it)";
    return kvo__error(code, "%s: %s (%s)%s", what, kvo__cu_name(e), kvo__cu_text(e), hint);
}

kvo_cuda_params kvo_cuda_default_params(void) {
    kvo_cuda_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.device_index = 0;
    p.compute_stream = NULL;
    kvo__cuda_plan_cfg c = kvo__cuda_plan_default_cfg(true);
    p.kernel_max_bytes = c.kernel_max_bytes;
    p.kernel_min_pieces = c.kernel_min_pieces;
    p.batch = -1;
    p.require_pinned = true;
    p.completion_timeout_ms = 60000;
    p.kernel_stores = false;
    return p;
}

int kvo_cuda_device_count(int *count) {
    if (!count) return kvo__error(KVO_EINVAL, "kvo_cuda_device_count: count must not be NULL");
    *count = 0;
    int rc = kvo__cuda_attached("kvo_cuda_device_count");
    if (rc) return rc;
    const kvo__cu_api *cu;
    rc = kvo__cu_get(&cu);
    if (rc) return kvo__error_prefix(rc, "kvo_cuda_device_count: no usable CUDA device");
    int n = 0;
    CUresult e = cu->cuDeviceGetCount(&n);
    if (e != CUDA_SUCCESS) {
        (void)kvo__cuda_error(e, "cuDeviceGetCount");
        return kvo__error_prefix(KVO_ENOTSUP, "kvo_cuda_device_count: no usable CUDA device");
    }
    *count = n;
    if (n == 0) return kvo__error(KVO_ENOTSUP, "kvo_cuda_device_count: no CUDA device is visible");
    return 0;
}

/* ---- registered host memory ---------------------------------------------
 * Is all of [p, p + bytes) registered (or allocated) host memory that the
 * device can map?  Walks the registrations over the range by their start
 * and size (CU_POINTER_ATTRIBUTE_RANGE_*); where the driver does not report
 * a range, the first and last bytes must both be registered and mapped at
 * the same distance (one registration).  A range that only starts in a
 * registration is not. */
static bool kvo__cuda_host_type(uintptr_t p, CUdeviceptr *dptr) {
    unsigned int type = 0;
    if (kvo__cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)p) != CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_HOST)
        return false;
    return kvo__cu->cuPointerGetAttribute(dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)p) == CUDA_SUCCESS;
}

bool kvo__cuda_host_registered(uintptr_t p, uint64_t bytes, int64_t *hdelta) {
    CUdeviceptr d0 = 0, d1 = 0;
    if (!bytes || !kvo__cuda_host_type(p, &d0)) return false;
    uintptr_t end = p + bytes, q = p;
    while (q < end) {
        CUdeviceptr start = 0;
        size_t size = 0;
        if (kvo__cu->cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)q) !=
                CUDA_SUCCESS ||
            kvo__cu->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)q) != CUDA_SUCCESS ||
            start > q || start + size <= q) {
            /* No range reported: one registration from first to last byte. */
            if (!kvo__cuda_host_type(end - 1, &d1) || d1 - d0 != bytes - 1) return false;
            q = end;
            break;
        }
        q = (uintptr_t)(start + size);
        if (q < end && !kvo__cuda_host_type(q, &d1)) return false;
    }
    *hdelta = (int64_t)((intptr_t)d0 - (intptr_t)p);
    return true;
}

/* ---- process-wide registrations -------------------------------------------
 * cuMemHostRegister(PORTABLE) makes a range pinned for every device, and a
 * second registration of it fails: so each range is registered once for the
 * process and counted over the contexts that pinned it (one arena pinned for
 * several devices), and unregistered when the last one unpins.  A range the
 * caller registered itself (torch's pin_memory, cudaHostRegister) is used
 * as it is, when registrations cover all of it, and never unregistered
 * here. */
typedef struct kvo__cuda_gpin {
    uintptr_t base;
    uint64_t bytes;
    uint32_t users;
    bool external;
} kvo__cuda_gpin;
static pthread_mutex_t kvo__gpin_mu = PTHREAD_MUTEX_INITIALIZER;
static kvo__cuda_gpin *kvo__gpins;
static size_t kvo__n_gpins, kvo__cap_gpins;

/* Under kvo__gpin_mu, a context current: count one more user of [b, +bytes). */
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
    CUresult e = kvo__cu->cuMemHostRegister((void *)b, (size_t)bytes,
                                            CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (e == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        int64_t hd;
        if (!kvo__cuda_host_registered(b, bytes, &hd))
            return kvo__error(KVO_EEXIST, "[%p, +%llu) is partly registered with CUDA by someone else (the "
                                          "driver refuses to register it again, and registrations do not cover "
                                          "all of it): pin a range the caller's registration covers, or one "
                                          "outside it",
                              (void *)b, (unsigned long long)bytes);
        external = true;
    } else if (e != CUDA_SUCCESS) {
        return kvo__cuda_error(e, "cuMemHostRegister");
    }
    kvo__gpins[kvo__n_gpins++] = (kvo__cuda_gpin){b, bytes, 1, external};
    return 0;
}

/* Under kvo__gpin_mu, a context current: one user fewer; unregister at the
 * last (unless leak: the GPU may still use it, and unregistering could wait
 * for it). */
static CUresult kvo__gpin_release(uintptr_t b, bool leak) {
    for (size_t i = 0; i < kvo__n_gpins; i++) {
        kvo__cuda_gpin *g = &kvo__gpins[i];
        if (g->base != b) continue;
        if (--g->users) return CUDA_SUCCESS;
        bool unreg = !g->external && !leak;
        kvo__gpins[i] = kvo__gpins[--kvo__n_gpins];
        return unreg ? kvo__cu->cuMemHostUnregister((void *)b) : CUDA_SUCCESS;
    }
    return CUDA_SUCCESS;
}

/* After a completion timeout: is any stream of cu still running (context
 * current)?  Then calls that may wait for the device must not be made. */
static bool kvo__cuda_busy(const kvo_cuda *cu) {
    if (!__atomic_load_n(&cu->timed_out, __ATOMIC_ACQUIRE)) return false;
    CUstream s[3] = {cu->stream[0], cu->stream[1], cu->aux};
    for (int i = 0; i < 3; i++)
        if (s[i] && kvo__cu->cuStreamQuery(s[i]) != CUDA_SUCCESS) return true;
    return false;
}

/* On the caller's thread (destroy, or a failed create).  When the GPU may
 * still run copies (a timeout, and a stream still busy), nothing that could
 * wait for it is called: the ranges stay registered, the streams, events,
 * module and buried buffers leak, the primary context stays retained. */
static void kvo__cuda_free(kvo_cuda *cu) {
    bool busy = false;
    if (cu->ctx && kvo__cuda_enter(cu) == CUDA_SUCCESS) {
        busy = kvo__cuda_busy(cu);
        pthread_mutex_lock(&kvo__gpin_mu);
        for (size_t i = 0; i < cu->n_pins; i++) (void)kvo__gpin_release(cu->pins[i].base, busy);
        pthread_mutex_unlock(&kvo__gpin_mu);
        if (!busy) {
            for (int d = 0; d < 2; d++)
                if (cu->stream[d]) (void)kvo__cu->cuStreamDestroy(cu->stream[d]);
            if (cu->aux) (void)kvo__cu->cuStreamDestroy(cu->aux);
            for (kvo__cuda_job *j = cu->job_all; j; j = j->all) {
                if (j->mark) (void)kvo__cu->cuEventDestroy(j->mark);
                if (j->done) (void)kvo__cu->cuEventDestroy(j->done);
            }
            if (cu->module) (void)kvo__cu->cuModuleUnload(cu->module);
            for (kvo__cuda_grave *g = cu->grave; g; g = g->next) (void)kvo__cu->cuMemFreeHost(g->host);
        }
        kvo__cuda_leave(cu);
        if (!busy) (void)kvo__cu->cuDevicePrimaryCtxRelease(cu->dev);
    }
    for (kvo__cuda_job *j = cu->job_all, *n; j; j = n) {
        n = j->all;
        kvo__free(j);
    }
    for (kvo__cuda_grave *g = cu->grave, *n; g; g = n) {
        n = g->next;
        kvo__free(g);
    }
    pthread_cond_destroy(&cu->job_cv);
    pthread_mutex_destroy(&cu->job_lock);
    pthread_rwlock_destroy(&cu->pin_lock);
    kvo__free(cu->pins);
    kvo__free(cu);
}

/* ---- job tokens ----------------------------------------------------------- */

int kvo__cuda_job_get(kvo_cuda *cu, int dir, kvo__cuda_job **out) {
    pthread_mutex_lock(&cu->job_lock);
    kvo__cuda_job *j = cu->job_free;
    if (j) cu->job_free = j->next;
    pthread_mutex_unlock(&cu->job_lock);
    if (!j) {
        j = kvo__calloc(1, sizeof *j);
        if (!j) return kvo__error(KVO_ENOMEM, "out of memory for a job token");
        j->cu = cu;
        CUresult e = kvo__cuda_enter(cu); /* the caller's thread */
        if (e == CUDA_SUCCESS) {
            e = kvo__cu->cuEventCreate(&j->mark, CU_EVENT_DISABLE_TIMING);
            if (e == CUDA_SUCCESS) e = kvo__cu->cuEventCreate(&j->done, CU_EVENT_DISABLE_TIMING);
            if (e != CUDA_SUCCESS) {
                if (j->mark) (void)kvo__cu->cuEventDestroy(j->mark);
            }
            kvo__cuda_leave(cu);
        }
        if (e != CUDA_SUCCESS) {
            kvo__free(j);
            return kvo__cuda_error(e, "cuEventCreate (job events)");
        }
        pthread_mutex_lock(&cu->job_lock);
        j->all = cu->job_all;
        cu->job_all = j;
        pthread_mutex_unlock(&cu->job_lock);
    }
    j->dir = dir;
    j->has_mark = false;
    j->state = KVO__CJ_SUBMITTED;
    j->status = 0;
    j->refs = 1;
    *out = j;
    return 0;
}

void kvo__cuda_job_put(kvo__cuda_job *j) {
    if (!j) return;
    kvo_cuda *cu = j->cu;
    pthread_mutex_lock(&cu->job_lock);
    if (--j->refs == 0) {
        j->next = cu->job_free;
        cu->job_free = j;
    }
    pthread_mutex_unlock(&cu->job_lock);
}

void kvo__cuda_job_set(kvo__cuda_job *j, int state, int status) {
    kvo_cuda *cu = j->cu;
    pthread_mutex_lock(&cu->job_lock);
    if (j->state == KVO__CJ_SUBMITTED) {
        j->state = state;
        j->status = status;
        pthread_cond_broadcast(&cu->job_cv);
    }
    pthread_mutex_unlock(&cu->job_lock);
}

void kvo__cuda_bury(kvo_cuda *cu, void *host) {
    if (!host) return;
    kvo__cuda_grave *g = kvo__calloc(1, sizeof *g);
    if (!g) return; /* out of memory: leak the buffer itself, never reuse it */
    g->host = host;
    pthread_mutex_lock(&cu->job_lock);
    g->next = cu->grave;
    cu->grave = g;
    pthread_mutex_unlock(&cu->job_lock);
}

/* ---- things said once per process ---------------------------------------- */

void kvo__cuda_note_no_batch(int driver_version, const char *why) {
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) return;
    kvo__log(KVO_LOG_WARN,
             "kvoffload cuda: batched copies are off (NVIDIA driver of CUDA %d.%d: %s): each piece the copy "
             "engine moves is one cuMemcpyAsync, slower for small pages (the kernel still takes many small "
             "pages of a load)",
             driver_version / 1000, driver_version % 1000 / 10, why);
}

static void kvo__cuda_note_no_kernel(CUresult fatbin, CUresult ptx) {
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) return;
    kvo__log(KVO_LOG_WARN,
             "kvoffload cuda: the gather/scatter kernel does not load (embedded fatbin: %s, embedded PTX: %s): "
             "small pages go through the copy engine",
             kvo__cu_name(fatbin), kvo__cu_name(ptx));
}

/* ---- contexts ------------------------------------------------------------- */

/* The device of stream s (a compute stream a caller passed; not the legacy
 * or per-thread handles, which are the calling thread's): KVO_EINVAL naming
 * both devices when it is not cu's. */
static int kvo__cuda_check_compute(const char *fn, const kvo_cuda *cu, void *stream) {
    if (!stream || (CUstream)stream == CU_STREAM_LEGACY || (CUstream)stream == CU_STREAM_PER_THREAD) return 0;
    CUcontext ctx = NULL;
    if (kvo__cu->cuStreamGetCtx((CUstream)stream, &ctx) != CUDA_SUCCESS || !ctx || ctx == cu->ctx) return 0;
    CUdevice dev = -1;
    if (kvo__cu->cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {
        if (kvo__cu->cuCtxGetDevice(&dev) != CUDA_SUCCESS) dev = -1;
        CUcontext c;
        (void)kvo__cu->cuCtxPopCurrent(&c);
    }
    if (dev == cu->dev) return 0; /* another context of the same device: its streams are usable */
    return kvo__error(KVO_EINVAL,
                      "%s: the compute stream %p belongs to CUDA device %d, this context copies on device %d "
                      "(create the kvo_cuda with device_index = %d, or pass a stream of device %d)",
                      fn, stream, (int)dev, cu->index, (int)dev, cu->index);
}

/* The kernel's module, context current: fatbin, else PTX, else none. */
static void kvo__cuda_load_kernel(kvo_cuda *cu) {
    CUresult ef = kvo__cu->cuModuleLoadData(&cu->module, kvo__cuda_fatbin), ep = CUDA_SUCCESS;
    if (ef != CUDA_SUCCESS) {
        cu->module = NULL;
        ep = kvo__cu->cuModuleLoadData(&cu->module, kvo__cuda_ptx);
        if (ep != CUDA_SUCCESS) cu->module = NULL;
    }
    if (cu->module && kvo__cu->cuModuleGetFunction(&cu->kernel, cu->module, KVO__CUDA_KERNEL_NAME) != CUDA_SUCCESS) {
        (void)kvo__cu->cuModuleUnload(cu->module);
        cu->module = NULL;
        ep = CUDA_ERROR_NOT_FOUND;
    }
    if (!cu->module) {
        cu->kernel = NULL;
        kvo__cuda_note_no_kernel(ef, ep);
    }
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
    bool batch_ok = kvo__cu->cuMemcpyBatchAsync != NULL;
    if (p->batch == 1 && !batch_ok)
        return kvo__error(KVO_ENOTSUP, "%s: batch = 1 but this driver (CUDA %d.%d) has no cuMemcpyBatchAsync "
                                       "(needs 12.8+; use batch = -1)",
                          fn, kvo__cu->driver_version / 1000, kvo__cu->driver_version % 1000 / 10);
    kvo_cuda *cu = kvo__calloc(1, sizeof *cu);
    if (!cu) return kvo__error(KVO_ENOMEM, "%s: out of memory", fn);
    cu->index = p->device_index;
    cu->batch_ok = batch_ok && p->batch != 0;
    cu->require_pinned = p->require_pinned;
    cu->kernel_stores = p->kernel_stores;
    cu->timeout_ms = p->completion_timeout_ms;
    cu->plan = kvo__cuda_plan_default_cfg(cu->batch_ok);
    cu->plan.kernel_max_bytes = p->kernel_max_bytes;
    cu->plan.kernel_min_pieces = p->kernel_min_pieces;
    cu->st.batch_available = batch_ok;
    pthread_rwlock_init(&cu->pin_lock, NULL);
    pthread_mutex_init(&cu->job_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cu->job_cv, &ca);
    pthread_condattr_destroy(&ca);
    const char *what = "cuDeviceGet";
    CUresult e = kvo__cu->cuDeviceGet(&cu->dev, cu->index);
    if (e == CUDA_SUCCESS) {
        what = "cuDevicePrimaryCtxRetain";
        e = kvo__cu->cuDevicePrimaryCtxRetain(&cu->ctx, cu->dev);
        if (e != CUDA_SUCCESS) cu->ctx = NULL;
    }
    if (e == CUDA_SUCCESS && (e = kvo__cuda_enter(cu)) == CUDA_SUCCESS) {
        what = "cuStreamCreate (the copy streams)";
        for (int d = 0; d < 2 && e == CUDA_SUCCESS; d++) e = kvo__cu->cuStreamCreate(&cu->stream[d], CU_STREAM_NON_BLOCKING);
        if (e == CUDA_SUCCESS) e = kvo__cu->cuStreamCreate(&cu->aux, CU_STREAM_NON_BLOCKING);
        if (e == CUDA_SUCCESS && p->kernel_max_bytes) kvo__cuda_load_kernel(cu);
        kvo__cuda_leave(cu);
    }
    if (e == CUDA_SUCCESS) {
        cu->st.kernel_available = cu->kernel != NULL;
        rc = kvo__cuda_check_compute(fn, cu, p->compute_stream);
    } else {
        rc = kvo__error_prefix(kvo__cuda_error(e, what), "%s: device %d", fn, cu->index);
    }
    if (rc) {
        kvo__cuda_free(cu);
        return rc;
    }
    cu->compute = p->compute_stream;
    if (!batch_ok) kvo__cuda_note_no_batch(kvo__cu->driver_version, "no cuMemcpyBatchAsync, which needs 12.8");
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
    int rc = kvo__cuda_check_compute("kvo_cuda_set_compute_stream", cu, stream);
    if (rc) return rc;
    __atomic_store_n(&cu->compute, stream, __ATOMIC_RELEASE);
    return 0;
}

/* ---- events ---------------------------------------------------------------- */

static void kvo__cuda_job_grab(void *token, void *arg) {
    kvo__cuda_job *j = token;
    pthread_mutex_lock(&j->cu->job_lock);
    j->refs++;
    pthread_mutex_unlock(&j->cu->job_lock);
    *(kvo__cuda_job **)arg = j;
}

/* Until the job's copies are enqueued (or failed to be), at most
 * timeout_ms (0: no bound): KVO__CJ_* state, or -1 on timeout. */
static int kvo__cuda_job_wait_enqueued(kvo__cuda_job *j, uint32_t timeout_ms, int *status) {
    kvo_cuda *cu = j->cu;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&cu->job_lock);
    while (j->state == KVO__CJ_SUBMITTED) {
        if (!timeout_ms) pthread_cond_wait(&cu->job_cv, &cu->job_lock);
        else if (pthread_cond_timedwait(&cu->job_cv, &cu->job_lock, &dl) == ETIMEDOUT &&
                 j->state == KVO__CJ_SUBMITTED)
            break;
    }
    int st = j->state == KVO__CJ_SUBMITTED ? -1 : j->state;
    *status = j->status;
    pthread_mutex_unlock(&cu->job_lock);
    return st;
}

int kvo_cuda_job_event(kvo_cuda *cu, kvo_transfer *t, kvo_xfer_dir dir, uint64_t job_id, void *event) {
    if (!cu || !t || !event || (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD))
        return kvo__error(KVO_EINVAL, "kvo_cuda_job_event: cu, t and event must not be NULL, dir must be "
                                      "KVO_XFER_STORE or KVO_XFER_LOAD (got %d)", (int)dir);
    kvo__cuda_job *j = NULL;
    int rc = kvo__transfer_job_token(t, job_id, kvo__cuda_job_grab, &j);
    if (rc < 0) return kvo__error_prefix(rc, "kvo_cuda_job_event");
    if (rc == 0 && !j)
        return kvo__error(KVO_EINVAL, "kvo_cuda_job_event: job %llu is not a job of a CUDA transfer engine",
                          (unsigned long long)job_id);
    int status = 0;
    if (j) {
        const char *bad = j->cu != cu ? "was submitted to an engine on another device" : NULL;
        if (!bad && j->dir != (int)dir) bad = dir == KVO_XFER_LOAD ? "is a store, not a load" : "is a load, not a store";
        if (bad) {
            kvo__cuda_job_put(j);
            return kvo__error(KVO_EINVAL, "kvo_cuda_job_event: job %llu %s (this context: device %d)",
                              (unsigned long long)job_id, bad, cu->index);
        }
        int st = kvo__cuda_job_wait_enqueued(j, cu->timeout_ms, &status);
        if (st != KVO__CJ_ENQUEUED) {
            kvo__cuda_job_put(j);
            if (st < 0)
                return kvo__error(KVO_EAGAIN, "kvo_cuda_job_event: no worker took job %llu within %u ms "
                                              "(completion_timeout_ms): its copies are not enqueued yet",
                                  (unsigned long long)job_id, cu->timeout_ms);
            return kvo__error(status ? status : KVO_ECANCELED,
                              "kvo_cuda_job_event: job %llu failed before its copies were enqueued (%s)",
                              (unsigned long long)job_id, kvo_error_name(status ? status : KVO_ECANCELED));
        }
    }
    /* The job's copies are enqueued (or all done): ev after its done event,
     * on the auxiliary stream, which nothing else waits behind. */
    const char *what = "cuCtxPushCurrent";
    CUresult e = kvo__cuda_enter(cu);
    if (e == CUDA_SUCCESS) {
        if (j && (e = kvo__cu->cuStreamWaitEvent(cu->aux, j->done, 0)) != CUDA_SUCCESS)
            what = "cuStreamWaitEvent (the job's event)";
        if (e == CUDA_SUCCESS && (e = kvo__cu->cuEventRecord((CUevent)event, cu->aux)) != CUDA_SUCCESS)
            what = "cuEventRecord";
        kvo__cuda_leave(cu);
    }
    kvo__cuda_job_put(j);
    if (e == CUDA_SUCCESS) return 0;
    return kvo__error_prefix(kvo__cuda_error(e, what), "kvo_cuda_job_event");
}

int kvo_cuda_record_event(kvo_cuda *cu, kvo_xfer_dir dir, void *event) {
    if (!cu || !event || (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD))
        return kvo__error(KVO_EINVAL, "kvo_cuda_record_event: cu and event must not be NULL, dir must be "
                                      "KVO_XFER_STORE or KVO_XFER_LOAD (got %d)", (int)dir);
    CUresult e = kvo__cuda_enter(cu);
    const char *what = "cuCtxPushCurrent";
    if (e == CUDA_SUCCESS) {
        if ((e = kvo__cu->cuEventRecord((CUevent)event, cu->stream[dir])) != CUDA_SUCCESS) what = "cuEventRecord";
        kvo__cuda_leave(cu);
    }
    if (e == CUDA_SUCCESS) return 0;
    return kvo__error_prefix(kvo__cuda_error(e, what), "kvo_cuda_record_event");
}

/* ---- pinned ranges --------------------------------------------------------- */

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
    if (i >= 0) {
        const kvo__cuda_pin *r = &cu->pins[i];
        if (p - r->base <= r->bytes && bytes <= r->bytes - (p - r->base)) {
            *hdelta = r->hdelta;
            return true;
        }
    }
    /* Not pinned through kvo_cuda: memory registered or allocated with the
     * driver (cudaHostAlloc, torch's pin_memory) when it covers all of it. */
    return kvo__cuda_host_registered(p, bytes, hdelta);
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
    CUdeviceptr dptr = 0;
    bool entered = false;
    if (!rc) {
        CUresult e = kvo__cuda_enter(cu);
        if (e != CUDA_SUCCESS) rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cuCtxPushCurrent");
        entered = e == CUDA_SUCCESS;
    }
    if (!rc) {
        pthread_mutex_lock(&kvo__gpin_mu);
        rc = kvo__gpin_acquire(b, bytes);
        CUresult e;
        if (!rc && (e = kvo__cu->cuMemHostGetDevicePointer(&dptr, ptr, 0)) != CUDA_SUCCESS) {
            rc = kvo__cuda_error(e, "kvo_cuda_pin_host: cuMemHostGetDevicePointer (registered without "
                                    "CU_MEMHOSTREGISTER_DEVICEMAP?)");
            (void)kvo__gpin_release(b, false);
        }
        pthread_mutex_unlock(&kvo__gpin_mu);
    }
    if (entered) kvo__cuda_leave(cu);
    if (!rc) {
        size_t at = (size_t)(i + 1);
        memmove(&cu->pins[at + 1], &cu->pins[at], (cu->n_pins - at) * sizeof *cu->pins);
        cu->pins[at] = (kvo__cuda_pin){b, bytes, (int64_t)((intptr_t)dptr - (intptr_t)b)};
        cu->n_pins++;
    }
    pthread_rwlock_unlock(&cu->pin_lock);
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
        CUresult e = kvo__cuda_enter(cu);
        if (e == CUDA_SUCCESS) {
            bool busy = kvo__cuda_busy(cu);
            pthread_mutex_lock(&kvo__gpin_mu);
            e = kvo__gpin_release((uintptr_t)ptr, busy);
            pthread_mutex_unlock(&kvo__gpin_mu);
            kvo__cuda_leave(cu);
        }
        /* Forget the range even if the driver refuses: it is unusable either way. */
        memmove(&cu->pins[i], &cu->pins[i + 1], (cu->n_pins - (size_t)i - 1) * sizeof *cu->pins);
        cu->n_pins--;
        if (e != CUDA_SUCCESS) rc = kvo__cuda_error(e, "kvo_cuda_unpin_host: cuMemHostUnregister");
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
    out->kernel_available = cu->st.kernel_available;
    return 0;
}

int kvo_cuda_get_stats(kvo_cuda *cu, kvo_cuda_stats *out) {
    kvo_cuda_stats full = KVO_CUDA_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_cuda_get_stats", kvo_cuda_stats, batch_available, "KVO_CUDA_STATS_INIT", out, full,
                   kvo__cuda_stats_fill(cu, &full));
}
