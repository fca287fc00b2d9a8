/*
 * The CUDA transfer device (kvo__xfer_device_cuda, selected with
 * kvo_transfer_params.device = "cuda").
 *
 * Engine memory is device memory (the engine's KV tensors: layout
 * registration asks the driver that each segment's first and last byte are
 * memory of this device); slots are pinned host memory (an arena pinned with
 * kvo_cuda_pin_arena, or any buffer the driver registered or allocated).
 *
 * The device takes whole jobs (device.h, whole_jobs): copy() only records a
 * piece in the worker's array (no driver call; the array grows to the
 * largest job and stays), so that unit_end() sees every piece of the job,
 * across all of the engine's segments (one per layer tensor in vLLM: 64 to
 * 160 of them), and
 *   1. resolves each slot to its pinned range (one read lock per job),
 *   2. plans the pieces (cuda_plan.c: coalesce; a load's many small pages to
 *      the kernel, the rest to the copy engine as one cuMemcpyBatchAsync, or
 *      one cuMemcpyAsync each where the driver has no batches),
 *   3. enqueues them on the context's stream for the direction, behind a
 *      GPU-side wait for the mark job_submit recorded on the engine's compute
 *      stream: at most one kernel launch (over every small page of every
 *      layer: kernels.cu) and one batched copy per job; a batched copy is
 *      given source order ANY for loads (their source, the slot, is written
 *      by nothing on the GPU) and STREAM for stores, as vLLM does;
 *   4. records the job's one event after them and marks the job's token
 *      enqueued (kvo_cuda_job_event waits for that), then polls the event
 *      (cuEventQuery: spinning briefly, then yielding, then sleeping 20 us)
 *      until the copies have completed or completion_timeout_ms passed
 *      (KVO_ETIMEDOUT),
 * and returns 0 or the KVO_E* code of the first failure.  One host wait per
 * job, none per layer or page: a job of 160 layers x 16 blocks is one
 * enqueue of 2560 pieces, where units of one segment each took 160 enqueues,
 * events and waits (5-20 us each by the earlier design's estimate, against a
 * few us of copying per unit).  The core posts the job's result (the same
 * completion, result ring and eventfd as the host device) only after
 * unit_end returned, so a posted load is in device memory, and cancellation
 * (only of unstarted jobs) and dependency ordering keep their semantics.
 * Workers share the direction's stream: while one waits for its job's event
 * the others enqueue theirs behind it, so the copy engine stays fed with two
 * or more workers.
 *
 * Buffers: the kernel's descriptors (mapped pinned memory, the kernel reads
 * them over the bus) and the batch's pointer arrays grow to the largest job
 * and are reused by the worker's next job, which starts only after this one
 * completed.  When a job times out its kernel may still run: the worker then
 * hands the descriptors to the context (kvo__cuda_bury: freed with it once
 * the streams are idle, else never) and starts its next job with a new
 * buffer, so a late kernel never reads descriptors of another job (the
 * batch arrays are read during cuMemcpyBatchAsync itself and stay).  A failed enqueue
 * still waits for what was enqueued before it (those copies touch the job's
 * memory), then fails the job: a failed job, never a crash.
 *
 * Threads: worker_init and worker_fini run on the thread creating or
 * destroying the engine (fini pushes the context for its driver calls);
 * unit_end runs on the worker's own thread, which makes the context current
 * once; job_submit runs on the submitting thread and pushes the context
 * around its event record, so a compute stream given as the legacy default
 * stream resolves to this device's, whatever that thread's current device.
 */
#include <sched.h>
#include <time.h>

#include "transfer/cuda/cuda_internal.h"
#include "transfer/device.h"

typedef struct kvo__cuda_w {
    kvo_cuda *cu;
    int dir;                 /* of the pieces collected */
    int err;                 /* first failure while collecting (message set) */
    bool on_thread;          /* the context is current on this worker's thread */
    kvo__cuda_job *job;      /* the job being collected (unit_job) */
    kvo__cuda_piece *pc;
    size_t n, cap;
    CUdeviceptr *bdst, *bsrc; /* batch arguments, capacity bcap */
    size_t *bsz, bcap;
    kvo__cuda_desc *desc;    /* kernel descriptors: mapped pinned memory, dcap of them */
    CUdeviceptr desc_dev;
    size_t dcap;
} kvo__cuda_w;

static int kvo__cuda_open(const kvo__xfer_device_config *cfg, void **state) {
    kvo_cuda *cu;
    int rc = kvo__cuda_acquire(cfg->index, &cu);
    if (rc) return kvo__error_prefix(rc, "transfer device 'cuda' (device_index %d)", cfg->index);
    *state = cu;
    return 0;
}

static void kvo__cuda_close(void *state) { kvo__cuda_release(state); }

static int kvo__cuda_check_one(const kvo_cuda *cu, CUdeviceptr p, const void *base, uint64_t bytes) {
    unsigned int type = 0, managed = 0;
    int ordinal = -1;
    kvo__cu_ptr_attr attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                    CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void *data[3] = {&type, &ordinal, &managed};
    CUresult e = kvo__cu->cuPointerGetAttributes(3, attrs, data, p);
    if (e != CUDA_SUCCESS)
        return kvo__error(KVO_ELAYOUT, "[%p, +%llu) is not CUDA device memory (cuPointerGetAttributes(%p): %s)",
                          base, (unsigned long long)bytes, (void *)(uintptr_t)p, kvo__cu_name(e));
    if (type != CU_MEMORYTYPE_DEVICE && !managed)
        return kvo__error(KVO_ELAYOUT,
                          "[%p, +%llu) is not CUDA device memory (%p is %s memory; register the engine's "
                          "device tensors)",
                          base, (unsigned long long)bytes, (void *)(uintptr_t)p,
                          type == CU_MEMORYTYPE_HOST ? "pinned host" : "unregistered host");
    if (type == CU_MEMORYTYPE_DEVICE && !managed && ordinal != cu->index)
        return kvo__error(KVO_ELAYOUT, "[%p, +%llu) is memory of CUDA device %d; this engine copies on device %d "
                                       "(set kvo_transfer_params.device_index = %d)",
                          base, (unsigned long long)bytes, ordinal, cu->index, ordinal);
    return 0;
}

static int kvo__cuda_check_engine_range(void *state, const void *base, uint64_t bytes) {
    kvo_cuda *cu = state;
    CUresult e = kvo__cuda_enter(cu);
    if (e != CUDA_SUCCESS) return kvo__cuda_error(e, "cuCtxPushCurrent");
    int rc = kvo__cuda_check_one(cu, (CUdeviceptr)(uintptr_t)base, base, bytes);
    if (!rc && bytes > 1) rc = kvo__cuda_check_one(cu, (CUdeviceptr)(uintptr_t)base + bytes - 1, base, bytes);
    kvo__cuda_leave(cu);
    return rc;
}

/* The kernel descriptors to the context's graveyard (a late kernel may
 * still read them), and a new buffer for the worker's next job.  (The batch
 * arrays are read by the driver during cuMemcpyBatchAsync: reusable.) */
static void kvo__cuda_w_abandon(kvo__cuda_w *w) {
    kvo__cuda_bury(w->cu, w->desc);
    w->desc = NULL;
    w->desc_dev = 0;
    w->dcap = 0;
}

/* On the thread destroying the engine.  After a completion timeout nothing
 * that may wait for the GPU is called: the descriptors are buried. */
static void kvo__cuda_worker_fini(void *state, void *wctx) {
    (void)state;
    kvo__cuda_w *w = wctx;
    if (!w) return;
    kvo_cuda *cu = w->cu;
    if (w->desc && !__atomic_load_n(&cu->timed_out, __ATOMIC_ACQUIRE) && kvo__cuda_enter(cu) == CUDA_SUCCESS) {
        (void)kvo__cu->cuMemFreeHost(w->desc);
        w->desc = NULL;
        kvo__cuda_leave(cu);
    }
    kvo__cuda_bury(cu, w->desc);
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
    if (kvo__grow((void **)&w->pc, &w->cap, 256, sizeof *w->pc, 256, "cuda pieces")) {
        kvo__free(w);
        return kvo__error_prefix(KVO_ENOMEM, "transfer device 'cuda': worker %u", worker);
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
static int kvo__cuda_resolve(kvo__cuda_w *w, size_t n, bool *kernel_ok) {
    kvo_cuda *cu = w->cu;
    int rc = 0;
    pthread_rwlock_rdlock(&cu->pin_lock);
    for (size_t i = 0; i < n && !rc; i++) {
        kvo__cuda_piece *p = &w->pc[i];
        uintptr_t host = w->dir == KVO_XFER_STORE ? p->dst : p->src;
        if (kvo__cuda_pinned(cu, host, p->bytes, &p->hdelta)) continue;
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

/* cuMemcpyBatchAsync errors that mean "not here" rather than a fault. */
static bool kvo__cuda_batch_refusal(CUresult e) {
    return e == CUDA_ERROR_NOT_SUPPORTED || e == CUDA_ERROR_INVALID_VALUE || e == CUDA_ERROR_NOT_PERMITTED;
}

/* Step 3 for the copy-engine pieces p[0..n-1]: the first failure, or
 * CUDA_SUCCESS. */
static CUresult kvo__cuda_enqueue_copies(kvo__cuda_w *w, const kvo__cuda_piece *p, size_t n, bool batched,
                                         CUstream s, const char **what) {
    kvo_cuda *cu = w->cu;
    if (batched) {
        if (n > w->bcap) {
            const kvo__arr arrs[3] = {{(void **)&w->bdst, sizeof *w->bdst},
                                      {(void **)&w->bsrc, sizeof *w->bsrc},
                                      {(void **)&w->bsz, sizeof *w->bsz}};
            if (kvo__grow_all(&w->bcap, n, arrs, 3, 256, "cuda batch")) {
                *what = "growing the batch arrays";
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        for (size_t i = 0; i < n; i++) {
            w->bdst[i] = (CUdeviceptr)p[i].dst;
            w->bsrc[i] = (CUdeviceptr)p[i].src;
            w->bsz[i] = (size_t)p[i].bytes;
        }
        kvo__cu_memcpy_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = w->dir == KVO_XFER_LOAD ? CU_MEMCPY_SRC_ACCESS_ORDER_ANY : CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        attr.flags = CU_MEMCPY_FLAG_DEFAULT;
        size_t attr_idx = 0, fail_idx = 0;
        *what = "cuMemcpyBatchAsync";
        CUresult e = kvo__cu->cuMemcpyBatchAsync(w->bdst, w->bsrc, w->bsz, n, &attr, &attr_idx, 1, &fail_idx, s);
        if (e == CUDA_SUCCESS) {
            kvo__cuda_count(&cu->st.batch_calls, 1);
            kvo__cuda_count(&cu->st.batch_pieces, n);
            return e;
        }
        if (!kvo__cuda_batch_refusal(e)) return e;
        /* Refused (a driver that has the call but not for these pointers):
         * nothing was enqueued.  Never again on this device; this job goes
         * on with one cuMemcpyAsync per piece. */
        if (__atomic_exchange_n(&cu->batch_ok, false, __ATOMIC_ACQ_REL)) {
            kvo__cuda_count(&cu->st.batch_refused, 1);
            kvo__cuda_note_no_batch(kvo__cu->driver_version, kvo__cu_name(e));
        }
    }
    *what = "cuMemcpyAsync";
    for (size_t i = 0; i < n; i++) {
        CUresult e = kvo__cu->cuMemcpyAsync((CUdeviceptr)p[i].dst, (CUdeviceptr)p[i].src, (size_t)p[i].bytes, s);
        if (e != CUDA_SUCCESS) return e;
        kvo__cuda_count(&cu->st.memcpy_calls, 1);
    }
    return CUDA_SUCCESS;
}

/* Step 3 for the kernel pieces p[0..n-1]: one launch. */
static CUresult kvo__cuda_enqueue_kernel(kvo__cuda_w *w, const kvo__cuda_piece *p, size_t n, CUstream s,
                                         const char **what) {
    kvo_cuda *cu = w->cu;
    if (n > w->dcap) {
        /* Grow; the old buffer's last reader (this worker's previous job)
         * has completed, but freeing pinned memory may wait for the device:
         * it goes with the context instead. */
        size_t cap = w->dcap ? 2 * w->dcap : 1024;
        while (cap < n) cap *= 2;
        void *h = NULL;
        CUdeviceptr d = 0;
        *what = "cuMemHostAlloc (kernel descriptors)";
        CUresult e = kvo__cu->cuMemHostAlloc(&h, cap * sizeof *w->desc,
                                             CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
        if (e != CUDA_SUCCESS) return e;
        if ((e = kvo__cu->cuMemHostGetDevicePointer(&d, h, 0)) != CUDA_SUCCESS) {
            *what = "cuMemHostGetDevicePointer (kernel descriptors)";
            kvo__cuda_bury(cu, h);
            return e;
        }
        kvo__cuda_bury(cu, w->desc);
        w->desc = h;
        w->desc_dev = d;
        w->dcap = cap;
    }
    bool store = w->dir == KVO_XFER_STORE;
    for (size_t i = 0; i < n; i++) {
        uint64_t dst = p[i].dst, src = p[i].src;
        if (store) dst += (uint64_t)p[i].hdelta;
        else src += (uint64_t)p[i].hdelta;
        w->desc[i] = (kvo__cuda_desc){dst, src, p[i].bytes};
    }
    unsigned int count = (unsigned int)n;
    void *args[2] = {&w->desc_dev, &count};
    *what = "gather/scatter kernel launch (cuLaunchKernel)";
    CUresult e = kvo__cu->cuLaunchKernel(cu->kernel, kvo__cuda_kernel_grid(n), 1, 1, KVO__CUDA_KERNEL_THREADS, 1, 1,
                                         0, s, args, NULL);
    if (e == CUDA_SUCCESS) {
        kvo__cuda_count(&cu->st.kernel_launches, 1);
        kvo__cuda_count(&cu->st.kernel_pieces, n);
    }
    return e;
}

/* Step 4: wait for the event (recorded after the job's copies), at most
 * timeout_ms (0: no deadline): CUDA_ERROR_NOT_READY when it passed. */
static CUresult kvo__cuda_poll(CUevent ev, uint32_t timeout_ms) {
    uint64_t deadline = 0;
    for (uint32_t spin = 0;; spin++) {
        CUresult e = kvo__cu->cuEventQuery(ev);
        if (e != CUDA_ERROR_NOT_READY) return e;
        if (spin < 64) continue;
        if (spin < 1024) {
            sched_yield();
            continue;
        }
        struct timespec tn;
        clock_gettime(CLOCK_MONOTONIC, &tn);
        uint64_t now = (uint64_t)tn.tv_sec * 1000000000u + (uint64_t)tn.tv_nsec;
        if (!deadline) deadline = now + (uint64_t)timeout_ms * 1000000u;
        else if (timeout_ms && now >= deadline) return CUDA_ERROR_NOT_READY;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* The job fails before anything of it was enqueued. */
static int kvo__cuda_fail_early(kvo__cuda_w *w, kvo__cuda_job *job, int rc) {
    kvo__cuda_count(&w->cu->st.errors, 1);
    kvo__cuda_count(&w->cu->st.units, 1);
    if (job) kvo__cuda_job_set(job, KVO__CJ_FAILED, rc);
    return rc;
}

static int kvo__cuda_unit_end(void *wctx) {
    kvo__cuda_w *w = wctx;
    kvo_cuda *cu = w->cu;
    kvo__cuda_job *job = w->job;
    size_t n = w->n;
    int rc = w->err;
    w->job = NULL;
    w->n = 0;
    w->err = 0;
    if (!job && !rc) rc = kvo__error(KVO_ESTATE, "transfer device 'cuda': a job without its token");
    if (rc) return kvo__cuda_fail_early(w, job, rc);
    if (!w->on_thread) { /* once, on this worker's own thread */
        CUresult e = kvo__cu->cuCtxSetCurrent(cu->ctx);
        if (e != CUDA_SUCCESS) return kvo__cuda_fail_early(w, job, kvo__cuda_error(e, "transfer device 'cuda': cuCtxSetCurrent"));
        w->on_thread = true;
    }
    bool kernel_ok = cu->kernel != NULL && (w->dir == KVO_XFER_LOAD || cu->kernel_stores);
    if ((rc = kvo__cuda_resolve(w, n, &kernel_ok)) != 0) return kvo__cuda_fail_early(w, job, rc);
    kvo__cuda_plan_cfg cfg = cu->plan;
    cfg.batch = cfg.batch && __atomic_load_n(&cu->batch_ok, __ATOMIC_ACQUIRE);
    if (!kernel_ok) cfg.kernel_max_bytes = 0;
    n = kvo__cuda_coalesce(w->pc, n);
    kvo__cuda_plan plan;
    kvo__cuda_plan_make(&cfg, w->pc, n, &plan);

    CUstream s = cu->stream[w->dir];
    const char *what = "";
    CUresult e = CUDA_SUCCESS;
    if (job->has_mark) {
        /* The job follows the engine's work enqueued on the compute stream
         * before its submit (a store reads what it wrote; a load overwrites
         * blocks it may still touch). */
        what = "ordering after the compute stream (cuStreamWaitEvent)";
        e = kvo__cu->cuStreamWaitEvent(s, job->mark, 0);
    }
    if (e == CUDA_SUCCESS && plan.n_kernel) e = kvo__cuda_enqueue_kernel(w, w->pc, plan.n_kernel, s, &what);
    if (e == CUDA_SUCCESS && plan.n_copy)
        e = kvo__cuda_enqueue_copies(w, w->pc + plan.n_kernel, plan.n_copy, plan.batched, s, &what);
    /* The job's one event, after whatever was enqueued: it must complete
     * before the job's memory is released, even after a failure. */
    CUresult ew = kvo__cu->cuEventRecord(job->done, s);
    if (e == CUDA_SUCCESS && ew == CUDA_SUCCESS) kvo__cuda_job_set(job, KVO__CJ_ENQUEUED, 0);
    if (ew == CUDA_SUCCESS) ew = kvo__cuda_poll(job->done, cu->timeout_ms);
    else (void)kvo__cu->cuStreamSynchronize(s);
    kvo__cuda_count(&cu->st.units, 1);
    if (ew == CUDA_ERROR_NOT_READY) {
        /* The device did not finish within the deadline: fail the job rather
         * than hang, and never reuse what its copies may still read. */
        __atomic_store_n(&cu->timed_out, true, __ATOMIC_RELEASE);
        kvo__cuda_w_abandon(w);
        kvo__cuda_count(&cu->st.timeouts, 1);
        kvo__cuda_count(&cu->st.errors, 1);
        rc = kvo__error(KVO_ETIMEDOUT,
                        "transfer device 'cuda' (device %d, %s of %zu piece(s)): the copies did not complete "
                        "within %u ms (kvo_cuda_params.completion_timeout_ms); the GPU or a stream it waits on "
                        "is stuck, and the job's memory may still be written: do not reuse it, restart the "
                        "process",
                        cu->index, w->dir == KVO_XFER_STORE ? "store" : "load", n, cu->timeout_ms);
        kvo__cuda_job_set(job, KVO__CJ_FAILED, rc);
        return rc;
    }
    if (e == CUDA_SUCCESS && ew != CUDA_SUCCESS) {
        e = ew;
        what = "completing the copies (cuEventQuery)";
    }
    if (e == CUDA_SUCCESS) return 0;
    kvo__cuda_count(&cu->st.errors, 1);
    rc = kvo__cuda_error(e, what);
    rc = kvo__error_prefix(rc, "transfer device 'cuda' (device %d, %s of %zu piece(s))", cu->index,
                           w->dir == KVO_XFER_STORE ? "store" : "load", n);
    kvo__cuda_job_set(job, KVO__CJ_FAILED, rc);
    return rc;
}

/* At submit, on the caller's thread: the job's token, and with a compute
 * stream set, its mark recorded there now (it marks the engine's work the
 * job follows; later compute is not waited for).  The context is pushed
 * for the record: the legacy default stream then means this device's. */
static int kvo__cuda_job_submit(void *state, int dir, void **token) {
    kvo_cuda *cu = state;
    *token = NULL;
    kvo__cuda_job *j;
    int rc = kvo__cuda_job_get(cu, dir, &j);
    if (rc) return kvo__error_prefix(rc, "kvo_transfer_submit: transfer device 'cuda' (device %d)", cu->index);
    CUstream compute = __atomic_load_n(&cu->compute, __ATOMIC_ACQUIRE);
    if (compute) {
        CUresult e = kvo__cuda_enter(cu);
        if (e == CUDA_SUCCESS) {
            e = kvo__cu->cuEventRecord(j->mark, compute);
            kvo__cuda_leave(cu);
        }
        if (e != CUDA_SUCCESS) {
            kvo__cuda_job_put(j);
            rc = kvo__cuda_error(e, "cuEventRecord on the compute stream");
            return kvo__error_prefix(rc, "kvo_transfer_submit: transfer device 'cuda' (device %d)", cu->index);
        }
        j->has_mark = true;
    }
    *token = j;
    return 0;
}

static void kvo__cuda_unit_job(void *wctx, void *token) {
    kvo__cuda_w *w = wctx;
    w->job = token;
}

/* The job's result is posted (under the engine's lock): a job that never
 * reached a worker (canceled, failed before it started) wakes
 * kvo_cuda_job_event; the token goes back to the pool when unreferenced. */
static void kvo__cuda_job_done(void *state, void *token) {
    (void)state;
    kvo__cuda_job_set(token, KVO__CJ_FAILED, KVO_ECANCELED);
    kvo__cuda_job_put(token);
}

static const char *kvo__cuda_copy_kind(void *state) {
    kvo_cuda *cu = state;
    bool batch = __atomic_load_n(&cu->batch_ok, __ATOMIC_ACQUIRE);
    if (cu->kernel && cu->plan.kernel_max_bytes) return batch ? "cuda-kernel+batch" : "cuda-kernel+memcpy";
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
    .unit_bytes = 0,
    .job_submit = kvo__cuda_job_submit,
    .unit_job = kvo__cuda_unit_job,
    .job_done = kvo__cuda_job_done,
    .whole_jobs = true,
};

#if KVO__CUDA_SHARED
/* libkvoffload_cuda.so: make the device known to libkvoffload.so at load. */
__attribute__((constructor)) static void kvo__cuda_load(void) { kvo__cuda_core_attach(&kvo__xfer_device_cuda); }
#endif
