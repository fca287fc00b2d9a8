/*
 * The CUDA transfer device (kvo__xfer_device_cuda, selected with
 * kvo_transfer_params.device = "cuda").
 *
 * Engine memory is device memory (the engine's KV tensors: layout
 * registration asks cudaPointerGetAttributes that each segment's first and
 * last byte are memory of this device); slots are pinned host memory (an
 * arena pinned with kvo_cuda_pin_arena, or any cudaHostAlloc'd /
 * registered buffer).
 *
 * Per work unit (device.h's contract, unchanged for the core): copy() only
 * records a piece in the worker's array (no CUDA call, nothing allocated once
 * the array has grown to the largest unit); unit_end() then
 *   1. resolves each slot to its pinned range (one read lock per unit),
 *   2. plans the pieces (cuda_plan.c: coalesce, kernel for many small pages,
 *      cudaMemcpyBatchAsync for several pieces, else cudaMemcpyAsync),
 *   3. enqueues them on one of the device's two streams for the direction
 *      (a store first waits on the GPU for the event job_submit recorded on
 *      the engine's compute stream at submit; a refused cudaMemcpyBatchAsync
 *      falls back to single copies, once and for good).  The kernel's pieces
 *      go through the worker's staging buffer in device memory when their
 *      slot sides tile one pinned range (they do for a unit of small pages:
 *      its slot side is contiguous): a load is one copy-engine copy of the
 *      whole slot span into the buffer, then the kernel scatters it to the
 *      pages, device memory to device memory; a store is the kernel
 *      gathering the pages into the buffer, then one copy-engine copy out.
 *      Otherwise the kernel reaches the slots over the bus (mapped memory).
 *      Why: the H200 measured (docs/gpu.md) loads of 16 KiB pages at
 *      0.72-0.75 of a contiguous copy with the kernel reading pinned host
 *      memory over PCIe (reads wait a round trip each; writes are posted, so
 *      stores were 0.85), and 0.77-0.83 staged (stores 0.91-0.92).  Staged,
 *      a unit is a copy and a kernel that must run in order, and on one
 *      stream the next unit's copy waits
 *      for this unit's kernel (staging on one stream measured 0.63): so
 *      units with a kernel go to the direction's first stream from even
 *      workers and to its second from odd ones, and the copy engine is fed
 *      by one worker while the other's kernel runs.  Units of copy-engine
 *      copies only stay on the first stream (two streams cost them about
 *      1 %),
 *   4. records the worker's event after them and polls it (cudaEventQuery,
 *      spinning briefly, then yielding, then sleeping 20 us) until the
 *      copies have completed or completion_timeout_ms passed
 *      (KVO_ETIMEDOUT; the context is then marked hung),
 * and returns 0 or the KVO_E* code of the first failure.  The core posts the
 * job's result (the same completion, result ring and eventfd as the host
 * device) only after every unit returned, so a posted load is in device
 * memory, cancellation (only of unstarted jobs) and dependency ordering keep
 * their semantics, and the per-worker descriptor buffer and arrays can be
 * reused by the next unit (the staging buffer too: one unit at a time per
 * worker, so no copy is ever in flight on it when it is refilled).  A failed
 * enqueue still waits for what was enqueued before it (those copies touch
 * the job's memory), then fails the unit: a failed job, never a crash.  The
 * workers share the direction's streams: while one waits for its event the
 * others enqueue behind it, so the copy engine stays busy with two or more
 * workers.  Memory per worker: the staging buffer (2 MiB of device memory,
 * cudaMalloc at worker_init, only when the kernel is on) and the kernel's
 * descriptors (mapped pinned memory); nothing is allocated per unit.
 *
 * Threads: worker_init and worker_fini run on the thread creating or
 * destroying the engine and put its current device back; unit_end runs on
 * the worker's own thread and sets the device there once.
 */
#include <sched.h>
#include <time.h>

#include "transfer/cuda/cuda_internal.h"
#include "transfer/cuda/kernels.h"
#include "transfer/device.h"

/* Work units of 2 MiB of pages (the core's default, 256 KiB, is sized for
 * CPU copies): a unit costs one event wait of roughly 5-20 us, small next to
 * the ~40 us a 2 MiB copy takes over PCIe Gen5, and a job of several MiB is
 * still shared by the workers.  Pages of 4 MiB and more are split into
 * 2 MiB parts. */
#define KVO__CUDA_UNIT_BYTES (UINT64_C(2) << 20)

typedef struct kvo__cuda_w {
    kvo_cuda *cu;
    int dir;                 /* of the pieces collected */
    int err;                 /* first failure of this unit (message set) */
    bool on_thread;          /* the device is current on this worker's thread */
    cudaEvent_t ev;          /* unit done */
    cudaEvent_t job_ev;      /* the unit's job: a store's submit-time compute mark, or NULL */
    kvo__cuda_piece *pc;
    size_t n, cap;
    void **bdst, **bsrc;     /* batch arguments, capacity bcap */
    size_t *bsz, bcap;
    kvo__cuda_desc *desc;    /* kernel descriptors: mapped pinned memory, plan.kernel_cap of them */
    kvo__cuda_desc *desc_dev;
    unsigned char *stage;    /* device staging buffer of KVO__CUDA_UNIT_BYTES (with the kernel) */
    uint32_t worker;         /* index: odd workers put kernel units on the second stream */
} kvo__cuda_w;

static int kvo__cuda_open(const kvo__xfer_device_config *cfg, void **state) {
    kvo_cuda *cu;
    int rc = kvo__cuda_acquire(cfg->index, &cu);
    if (rc) return kvo__error_prefix(rc, "transfer device 'cuda' (device_index %d)", cfg->index);
    *state = cu;
    return 0;
}

static void kvo__cuda_close(void *state) { kvo__cuda_release(state); }

static int kvo__cuda_check_one(const kvo_cuda *cu, const void *p, const void *base, uint64_t bytes) {
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvo__error(KVO_ELAYOUT, "[%p, +%llu) is not CUDA device memory (cudaPointerGetAttributes(%p): %s)",
                          base, (unsigned long long)bytes, p, cudaGetErrorName(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return kvo__error(KVO_ELAYOUT,
                          "[%p, +%llu) is not CUDA device memory (%p is %s memory; register the engine's "
                          "device tensors)",
                          base, (unsigned long long)bytes, p,
                          a.type == cudaMemoryTypeHost ? "pinned host" : "unregistered host");
    if (a.type == cudaMemoryTypeDevice && a.device != cu->index)
        return kvo__error(KVO_ELAYOUT, "[%p, +%llu) is memory of CUDA device %d; this engine copies on device %d "
                                       "(set kvo_transfer_params.device_index = %d)",
                          base, (unsigned long long)bytes, a.device, cu->index, a.device);
    return 0;
}

static int kvo__cuda_check_engine_range(void *state, const void *base, uint64_t bytes) {
    kvo_cuda *cu = state;
    int rc = kvo__cuda_check_one(cu, base, base, bytes);
    if (!rc && bytes > 1) rc = kvo__cuda_check_one(cu, (const unsigned char *)base + bytes - 1, base, bytes);
    return rc;
}

/* On the thread destroying the engine: the caller's device is restored.
 * After a completion timeout the descriptor buffer is leaked, not freed:
 * cudaFreeHost synchronises the device, which would hang. */
static void kvo__cuda_worker_fini(void *state, void *wctx) {
    (void)state;
    kvo__cuda_w *w = wctx;
    if (!w) return;
    int prev;
    (void)kvo__cuda_enter(w->cu->index, &prev);
    if (w->ev) (void)cudaEventDestroy(w->ev);
    if (w->desc && !__atomic_load_n(&w->cu->hung, __ATOMIC_ACQUIRE)) (void)cudaFreeHost(w->desc);
    if (w->stage && !__atomic_load_n(&w->cu->hung, __ATOMIC_ACQUIRE)) (void)cudaFree(w->stage);
    (void)cudaGetLastError();
    kvo__cuda_leave(w->cu->index, prev);
    kvo__free(w->pc);
    kvo__free(w->bdst);
    kvo__free(w->bsrc);
    kvo__free(w->bsz);
    kvo__free(w);
}

static int kvo__cuda_worker_init(void *state, uint32_t worker, void **wctx) {
    kvo_cuda *cu = state;
    kvo__cuda_w *w = kvo__calloc(1, sizeof *w);
    if (!w) return kvo__error(KVO_ENOMEM, "transfer device 'cuda': out of memory for worker %u", worker);
    w->cu = cu;
    w->worker = worker;
    int rc = kvo__grow((void **)&w->pc, &w->cap, 256, sizeof *w->pc, 256, "cuda pieces");
    /* Runs on the thread creating the transfer engine: its device is put back. */
    int prev;
    cudaError_t e = kvo__cuda_enter(cu->index, &prev);
    const char *what = "cudaSetDevice";
    if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&w->ev, cudaEventDisableTiming)) != cudaSuccess)
        what = "cudaEventCreate";
    if (e == cudaSuccess && cu->plan.kernel_cap &&
        (e = cudaHostAlloc((void **)&w->desc, cu->plan.kernel_cap * sizeof *w->desc,
                           cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess)
        what = "cudaHostAlloc (kernel descriptors)";
    if (e == cudaSuccess && w->desc && (e = cudaHostGetDevicePointer((void **)&w->desc_dev, w->desc, 0)) != cudaSuccess)
        what = "cudaHostGetDevicePointer (kernel descriptors)";
    if (e == cudaSuccess && cu->plan.kernel_cap && cu->plan.kernel_max_bytes &&
        (e = cudaMalloc((void **)&w->stage, KVO__CUDA_UNIT_BYTES)) != cudaSuccess)
        what = "cudaMalloc (staging buffer)";
    if (!rc && e != cudaSuccess) rc = kvo__cuda_error(e, what);
    kvo__cuda_leave(cu->index, prev);
    if (rc) {
        kvo__cuda_worker_fini(state, w);
        return kvo__error_prefix(rc, "transfer device 'cuda': worker %u on device %d", worker, cu->index);
    }
    *wctx = w;
    return 0;
}

static void kvo__cuda_copy(void *wctx, int dir, void *dst, const void *src, uint64_t bytes) {
    kvo__cuda_w *w = wctx;
    if (w->err) return;
    if (w->n == w->cap && kvo__grow((void **)&w->pc, &w->cap, w->n + 1, sizeof *w->pc, 256, "cuda pieces")) {
        w->err = KVO_ENOMEM;
        return;
    }
    w->dir = dir;
    w->pc[w->n++] = (kvo__cuda_piece){(uintptr_t)dst, (uintptr_t)src, bytes, 0};
}

/* Step 1: each piece's slot side must be pinned host memory.  *kernel_ok
 * turns false when one is not (only possible without require_pinned). */
static int kvo__cuda_resolve(kvo__cuda_w *w, bool *kernel_ok) {
    kvo_cuda *cu = w->cu;
    int rc = 0;
    pthread_rwlock_rdlock(&cu->pin_lock);
    for (size_t i = 0; i < w->n && !rc; i++) {
        kvo__cuda_piece *p = &w->pc[i];
        uintptr_t host = w->dir == KVO_XFER_STORE ? p->dst : p->src;
        if (kvo__cuda_pinned(cu, host, p->bytes, &p->hdelta)) continue;
        /* Not pinned through kvo_cuda: memory from cudaHostAlloc is fine. */
        struct cudaPointerAttributes a;
        if (cudaPointerGetAttributes(&a, (const void *)host) == cudaSuccess && a.type == cudaMemoryTypeHost &&
            a.devicePointer) {
            p->hdelta = (int64_t)((intptr_t)a.devicePointer - (intptr_t)host);
            continue;
        }
        (void)cudaGetLastError();
        if (!cu->require_pinned) {
            *kernel_ok = false;
            continue;
        }
        rc = kvo__error(KVO_EINVAL,
                        "transfer device 'cuda': slot %p (%llu bytes) is not pinned host memory (pin the arena "
                        "with kvo_cuda_pin_arena, or set kvo_cuda_params.require_pinned = false)",
                        (void *)host, (unsigned long long)p->bytes);
    }
    pthread_rwlock_unlock(&cu->pin_lock);
    return rc;
}

#if CUDART_VERSION >= 12080
/* cudaMemcpyBatchAsync errors that mean "not here" rather than a fault. */
static bool kvo__cuda_batch_refusal(cudaError_t e) {
    switch (e) {
    case cudaErrorNotSupported:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorInvalidValue:
    case cudaErrorNotPermitted:
    case cudaErrorInvalidDeviceFunction: return true;
    default: return false;
    }
}
#endif

/* Step 3 for the copy-engine pieces p[0..n-1]: the first failure, or
 * cudaSuccess. */
static cudaError_t kvo__cuda_enqueue_copies(kvo__cuda_w *w, const kvo__cuda_piece *p, size_t n, bool batched,
                                            cudaStream_t s, const char **what) {
    kvo_cuda *cu = w->cu;
#if CUDART_VERSION >= 12080
    if (batched) {
        if (n > w->bcap) {
            const kvo__arr arrs[3] = {{(void **)&w->bdst, sizeof *w->bdst},
                                      {(void **)&w->bsrc, sizeof *w->bsrc},
                                      {(void **)&w->bsz, sizeof *w->bsz}};
            if (kvo__grow_all(&w->bcap, n, arrs, 3, 64, "cuda batch")) {
                *what = "growing the batch arrays";
                return cudaErrorMemoryAllocation;
            }
        }
        for (size_t i = 0; i < n; i++) {
            w->bdst[i] = (void *)p[i].dst;
            w->bsrc[i] = (void *)p[i].src;
            w->bsz[i] = (size_t)p[i].bytes;
        }
        struct cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t attr_idx = 0;
        *what = "cudaMemcpyBatchAsync";
#if CUDART_VERSION >= 13000
        cudaError_t e = cudaMemcpyBatchAsync((void *const *)w->bdst, (const void *const *)w->bsrc, w->bsz, n, &attr,
                                             &attr_idx, 1, s);
#else
        size_t fail_idx = 0;
        cudaError_t e = cudaMemcpyBatchAsync(w->bdst, (void **)w->bsrc, w->bsz, n, &attr, &attr_idx, 1, &fail_idx, s);
#endif
        if (e == cudaSuccess) {
            kvo__cuda_count(&cu->st.batch_calls, 1);
            kvo__cuda_count(&cu->st.batch_pieces, n);
            return e;
        }
        if (!kvo__cuda_batch_refusal(e)) return e;
        /* Refused (an older driver, or not supported for these pointers):
         * nothing was enqueued.  Never again on this device; this unit goes
         * on with one cudaMemcpyAsync per piece. */
        (void)cudaGetLastError();
        if (__atomic_exchange_n(&cu->batch_ok, false, __ATOMIC_ACQ_REL)) kvo__cuda_count(&cu->st.batch_refused, 1);
    }
#else
    (void)batched;
#endif
    *what = "cudaMemcpyAsync";
    for (size_t i = 0; i < n; i++) {
        cudaError_t e = cudaMemcpyAsync((void *)p[i].dst, (const void *)p[i].src, (size_t)p[i].bytes,
                                        cudaMemcpyDefault, s);
        if (e != cudaSuccess) return e;
        kvo__cuda_count(&cu->st.memcpy_calls, 1);
    }
    return cudaSuccess;
}

/* The slot-side span of p[0..n-1] when the pieces tile it exactly, lie in
 * one pinned range and fit the staging buffer: *lo, returns its bytes (0:
 * not stageable).  Span == sum of the pieces means they tile it because a
 * store's slot sides never overlap (transfer_submit.c refuses store ops
 * writing the same chunk blocks of a slot, layout.c overlapping pages), so
 * a staged store copies out no byte it did not gather (a load copies the
 * whole span in, so any pieces inside it are read right). */
static uint64_t kvo__cuda_stage_span(kvo__cuda_w *w, const kvo__cuda_piece *p, size_t n, uintptr_t *lo) {
    bool store = w->dir == KVO_XFER_STORE;
    uintptr_t a = UINTPTR_MAX, b = 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t h = store ? p[i].dst : p[i].src;
        if (h < a) a = h;
        if (h + p[i].bytes > b) b = h + p[i].bytes;
        sum += p[i].bytes;
    }
    if (!n || b - a != sum || sum > KVO__CUDA_UNIT_BYTES) return 0;
    int64_t hd;
    pthread_rwlock_rdlock(&w->cu->pin_lock);
    bool ok = kvo__cuda_pinned(w->cu, a, sum, &hd);
    pthread_rwlock_unlock(&w->cu->pin_lock);
    if (!ok) return 0;
    *lo = a;
    return sum;
}

/* Step 3 for the kernel pieces p[0..n-1] (n <= kernel_cap). */
static cudaError_t kvo__cuda_enqueue_kernel(kvo__cuda_w *w, const kvo__cuda_piece *p, size_t n, cudaStream_t s) {
    uint64_t maxb = 0;
    bool store = w->dir == KVO_XFER_STORE;
    uintptr_t lo = 0;
    uint64_t span = 0;
    if (w->stage) span = kvo__cuda_stage_span(w, p, n, &lo);
    for (size_t i = 0; i < n; i++) {
        uint64_t dst = p[i].dst, src = p[i].src;
        if (span) {
            if (store) dst = (uint64_t)(uintptr_t)w->stage + (dst - lo);
            else src = (uint64_t)(uintptr_t)w->stage + (src - lo);
        } else if (store) dst += (uint64_t)p[i].hdelta;
        else src += (uint64_t)p[i].hdelta;
        w->desc[i] = (kvo__cuda_desc){dst, src, p[i].bytes};
        if (p[i].bytes > maxb) maxb = p[i].bytes;
    }
    cudaError_t e = cudaSuccess;
    if (span && !store) {
        e = cudaMemcpyAsync(w->stage, (const void *)lo, (size_t)span, cudaMemcpyHostToDevice, s);
        if (e == cudaSuccess) kvo__cuda_count(&w->cu->st.memcpy_calls, 1);
    }
    if (e == cudaSuccess)
        e = (cudaError_t)kvo__cuda_launch_copy(w->desc_dev, (uint32_t)n, kvo__cuda_kernel_threads(maxb), s);
    if (e == cudaSuccess) {
        kvo__cuda_count(&w->cu->st.kernel_launches, 1);
        kvo__cuda_count(&w->cu->st.kernel_pieces, n);
    }
    if (e == cudaSuccess && span && store) {
        e = cudaMemcpyAsync((void *)lo, w->stage, (size_t)span, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess) kvo__cuda_count(&w->cu->st.memcpy_calls, 1);
    }
    return e;
}

/* Step 4: wait for the event (recorded after the unit's copies), at most
 * timeout_ms (0: no deadline): cudaErrorNotReady when it passed. */
static cudaError_t kvo__cuda_poll(cudaEvent_t ev, uint32_t timeout_ms) {
    uint64_t deadline = 0;
    for (uint32_t spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e != cudaErrorNotReady) return e;
        if (spin < 64) continue;
        if (spin < 1024) {
            sched_yield();
            continue;
        }
        struct timespec tn;
        clock_gettime(CLOCK_MONOTONIC, &tn);
        uint64_t now = (uint64_t)tn.tv_sec * 1000000000u + (uint64_t)tn.tv_nsec;
        if (!deadline) deadline = now + (uint64_t)timeout_ms * 1000000u;
        else if (timeout_ms && now >= deadline) return cudaErrorNotReady;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

static int kvo__cuda_unit_end(void *wctx) {
    kvo__cuda_w *w = wctx;
    kvo_cuda *cu = w->cu;
    int rc = w->err;
    w->err = 0;
    if (rc || w->n == 0) {
        w->n = 0;
        if (rc) kvo__cuda_count(&cu->st.errors, 1);
        return rc;
    }
    bool kernel_ok = w->desc != NULL;
    cudaError_t e = cudaSuccess;
    if (!w->on_thread) { /* once, on this worker's own thread */
        e = cudaSetDevice(cu->index);
        w->on_thread = e == cudaSuccess;
    }
    rc = e == cudaSuccess ? kvo__cuda_resolve(w, &kernel_ok)
                          : kvo__cuda_error(e, "transfer device 'cuda': cudaSetDevice");
    if (rc) {
        w->n = 0;
        kvo__cuda_count(&cu->st.errors, 1);
        return rc;
    }
    kvo__cuda_plan_cfg cfg = cu->plan;
    cfg.batch = cfg.batch && __atomic_load_n(&cu->batch_ok, __ATOMIC_ACQUIRE);
    if (!kernel_ok) cfg.kernel_max_bytes = 0;
    size_t n = kvo__cuda_coalesce(w->pc, w->n);
    kvo__cuda_plan plan;
    kvo__cuda_plan_make(&cfg, w->pc, n, &plan);
    w->n = 0;

    /* Units with a kernel alternate between the direction's two streams by
     * worker, so that one worker's staging copy runs while another's kernel
     * does; copy-engine-only units keep to the first (a second stream cost
     * them about 1 % on the H200, docs/gpu.md). */
    cudaStream_t s = plan.n_kernel && (w->worker & 1) ? cu->kstream[w->dir] : cu->stream[w->dir];
    const char *what = "";
    if (w->job_ev) {
        /* A store reads KV that the engine's work enqueued before the submit
         * writes: wait on the GPU for the mark job_submit recorded. */
        what = "ordering after the compute stream (cudaStreamWaitEvent)";
        e = cudaStreamWaitEvent(s, w->job_ev, 0);
        w->job_ev = NULL;
    }
    if (e == cudaSuccess && plan.n_kernel) {
        what = "gather/scatter kernel launch";
        e = kvo__cuda_enqueue_kernel(w, w->pc, plan.n_kernel, s);
    }
    if (e == cudaSuccess && plan.n_copy)
        e = kvo__cuda_enqueue_copies(w, w->pc + plan.n_kernel, plan.n_copy, plan.batched, s, &what);
    /* Whatever was enqueued must complete before the job's memory is
     * released, even after a failure. */
    cudaError_t ew = cudaEventRecord(w->ev, s);
    if (ew == cudaSuccess) ew = kvo__cuda_poll(w->ev, cu->timeout_ms);
    else (void)cudaStreamSynchronize(s);
    if (ew == cudaErrorNotReady) {
        /* The device did not finish within the deadline: fail the job rather
         * than hang (and make destroy leak instead of wait). */
        __atomic_store_n(&cu->hung, true, __ATOMIC_RELEASE);
        kvo__cuda_count(&cu->st.timeouts, 1);
        kvo__cuda_count(&cu->st.errors, 1);
        kvo__cuda_count(&cu->st.units, 1);
        return kvo__error(KVO_ETIMEDOUT,
                          "transfer device 'cuda' (device %d, %s of %zu piece(s)): the copies did not complete "
                          "within %u ms (kvo_cuda_params.completion_timeout_ms); the GPU or a stream it waits on "
                          "is stuck, and the job's memory may still be written: do not reuse it, restart the "
                          "process", cu->index, w->dir == KVO_XFER_STORE ? "store" : "load", n, cu->timeout_ms);
    }
    if (e == cudaSuccess && ew != cudaSuccess) {
        e = ew;
        what = "completing the copies (cudaEventQuery)";
    }
    kvo__cuda_count(&cu->st.units, 1);
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();
    kvo__cuda_count(&cu->st.errors, 1);
    rc = kvo__cuda_error(e, what);
    return kvo__error_prefix(rc, "transfer device 'cuda' (device %d, %s of %zu piece(s))", cu->index,
                             w->dir == KVO_XFER_STORE ? "store" : "load", n);
}

/* At submit, on the caller's thread: a store with a compute stream set gets
 * an event recorded on it now (it marks the engine's work that produced the
 * blocks; later compute is not waited for); a load gets none. */
static int kvo__cuda_job_submit(void *state, int dir, void **token) {
    kvo_cuda *cu = state;
    *token = NULL;
    cudaStream_t compute = __atomic_load_n(&cu->compute, __ATOMIC_ACQUIRE);
    if (dir != KVO_XFER_STORE || !compute) return 0;
    kvo__cuda_jobev *je;
    int rc = kvo__cuda_jobev_get(cu, &je);
    if (rc) return kvo__error_prefix(rc, "kvo_transfer_submit: transfer device 'cuda' (device %d)", cu->index);
    cudaError_t e = cudaEventRecord(je->ev, compute);
    if (e != cudaSuccess) {
        kvo__cuda_jobev_put(cu, je);
        rc = kvo__cuda_error(e, "cudaEventRecord on the compute stream");
        return kvo__error_prefix(rc, "kvo_transfer_submit: transfer device 'cuda' (device %d)", cu->index);
    }
    *token = je;
    return 0;
}

static void kvo__cuda_unit_job(void *wctx, void *token) {
    ((kvo__cuda_w *)wctx)->job_ev = token ? ((kvo__cuda_jobev *)token)->ev : NULL;
}

static void kvo__cuda_job_done(void *state, void *token) { kvo__cuda_jobev_put(state, token); }

static const char *kvo__cuda_copy_kind(void *state) {
    kvo_cuda *cu = state;
    bool batch = __atomic_load_n(&cu->batch_ok, __ATOMIC_ACQUIRE);
    if (cu->plan.kernel_max_bytes) return batch ? "cuda-kernel+batch" : "cuda-kernel+memcpy";
    return batch ? "cuda-batch" : "cuda-memcpy";
}

static bool kvo__cuda_nontemporal(void *state) {
    (void)state;
    return false;
}

const kvo__xfer_device_ops kvo__xfer_device_cuda = {
    .name = "cuda",
    .open = kvo__cuda_open,
    .close = kvo__cuda_close,
    .check_engine_range = kvo__cuda_check_engine_range,
    .worker_init = kvo__cuda_worker_init,
    .worker_fini = kvo__cuda_worker_fini,
    .copy = kvo__cuda_copy,
    .prefetch = NULL,
    .unit_end = kvo__cuda_unit_end,
    .copy_kind = kvo__cuda_copy_kind,
    .nontemporal = kvo__cuda_nontemporal,
    .unit_bytes = KVO__CUDA_UNIT_BYTES,
    .job_submit = kvo__cuda_job_submit,
    .unit_job = kvo__cuda_unit_job,
    .job_done = kvo__cuda_job_done,
};

#if KVO__CUDA_SHARED
/* libkvoffload_cuda.so: make the device known to libkvoffload.so at load. */
__attribute__((constructor)) static void kvo__cuda_load(void) { kvo__cuda_core_attach(&kvo__xfer_device_cuda); }
#endif
