/*
 * A fake NVIDIA driver for the CUDA device's tests without a GPU
 * (tests/test_transfer_cuda_fake.c): a kvo__cu_api table (cuda_driver.h)
 * that the device's own code, unchanged, runs against after kvo__cu_use.
 *
 * What it models, in host memory:
 *   - devices (fk.n_devices), each with a primary context and its legacy
 *     default stream; a per-thread stack of current contexts (push, pop,
 *     set), so a test sees which context a call ran in;
 *   - streams as FIFO queues of operations (copy, kernel, event record,
 *     wait for an event), executed at once in order unless the stream is
 *     held (fk_hold) or waits for an event recorded on a held stream; an
 *     event recorded on a stream of another context than the event's fails
 *     as CUDA does (CUDA_ERROR_INVALID_HANDLE);
 *   - memory: device allocations (malloc'd, tagged with their device), host
 *     allocations and registrations (refused when they overlap another, as
 *     CUDA does), pointer attributes including the range of a registration
 *     (fk.no_range_attrs turns those off, as some drivers may);
 *   - the kernel: a launch is executed as the kernel would, reading its
 *     descriptors when it runs, not when it was launched; it notes when they
 *     changed in between (fk.desc_changed: a late kernel reading another
 *     job's descriptors);
 *   - what the device cannot see: fk.fatbin_fails / ptx_fails refuse the
 *     module images, fk.refuse_batch makes cuMemcpyBatchAsync answer
 *     CUDA_ERROR_NOT_SUPPORTED, and a test removes the batch call from the
 *     table to be an old driver.
 * Counters (fk.c): batch calls, launches, single copies, host waits (an
 * event whose latest record the host asked about, or a stream or context
 * synchronisation: one per point the host waited at, whatever the polling),
 * records of the job events.  Every object the library creates is counted
 * live, so a test can check that destroy released it (fk_live).
 *
 * One lock guards everything; operations run on the thread that enqueues
 * or releases them.  Header-only: included by one test file.
 */
#ifndef KVO_CUDA_TEST_FAKE_H
#define KVO_CUDA_TEST_FAKE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transfer/cuda/cuda_driver.h"
#include "transfer/cuda/kernels.h"

/* The kernel images the library embeds (here: stand-ins the fake knows). */
const unsigned char kvo__cuda_fatbin[] = "fake fatbin";
const size_t kvo__cuda_fatbin_size = sizeof kvo__cuda_fatbin;
const char kvo__cuda_ptx[] = ".version 7.0 // fake";

#define FK_MAX_DEV 4
#define FK_DESC_MAX 4096

struct CUctx_st {
    int dev;
    int refs;
    struct CUstream_st *legacy;
};

enum { FK_COPY, FK_KERNEL, FK_RECORD, FK_WAIT };
typedef struct fk_op {
    int kind;
    uintptr_t dst, src;
    size_t bytes;
    CUdeviceptr descs;        /* kernel */
    unsigned int n;
    kvo__cuda_desc *snap;     /* the descriptors at launch */
    struct CUevent_st *ev;    /* record / wait */
    uint64_t gen;
    struct fk_op *next;
} fk_op;

struct CUstream_st {
    struct CUctx_st *ctx;
    bool held;
    bool legacy;
    fk_op *head, *tail;
    struct CUstream_st *next_all;
};

struct CUevent_st {
    struct CUctx_st *ctx;
    uint64_t rec_gen, done_gen; /* recorded n times, n-th record executed */
    uint64_t asked_gen;         /* the last record the host asked about */
    struct CUevent_st *next_all;
};

struct CUmod_st {
    int unused;
};
struct CUfunc_st {
    int unused;
};

typedef enum { FK_DEV_MEM = 1, FK_HOST_ALLOC, FK_HOST_REG } fk_kind;
typedef struct fk_region {
    uintptr_t base;
    size_t bytes;
    fk_kind kind;
    int dev;
    struct fk_region *next;
} fk_region;

typedef struct fk_counts {
    long batches, batch_pieces, launches, kernel_pieces, memcpys, waits, stream_syncs;
    long records;
} fk_counts;

static struct {
    pthread_mutex_t mu;
    int n_devices;
    struct CUctx_st ctx[FK_MAX_DEV];
    struct CUstream_st *streams;
    struct CUevent_st *events;
    fk_region *regions;
    struct CUmod_st module;
    struct CUfunc_st func;
    long live_streams, live_events, live_modules, live_host_allocs;
    bool fatbin_fails, ptx_fails, refuse_batch, no_range_attrs;
    long desc_changed;
    fk_counts c;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

static __thread struct CUctx_st *fk_ctx_stack[16];
static __thread int fk_ctx_depth;

static struct CUctx_st *fk_current(void) { return fk_ctx_depth ? fk_ctx_stack[fk_ctx_depth - 1] : NULL; }

static fk_region *fk_find(uintptr_t p) {
    for (fk_region *r = fk.regions; r; r = r->next)
        if (p >= r->base && p - r->base < r->bytes) return r;
    return NULL;
}

static struct CUstream_st *fk_stream_new(struct CUctx_st *ctx, bool legacy) {
    struct CUstream_st *s = calloc(1, sizeof *s);
    s->ctx = ctx;
    s->legacy = legacy;
    s->next_all = fk.streams;
    fk.streams = s;
    return s;
}

/* The stream a handle means (legacy handles: the current context's). */
static struct CUstream_st *fk_resolve(CUstream s) {
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        struct CUctx_st *c = fk_current();
        return c ? c->legacy : NULL;
    }
    return s;
}

static void fk_push_op(struct CUstream_st *s, fk_op o) {
    fk_op *x = malloc(sizeof *x);
    *x = o;
    x->next = NULL;
    if (s->tail) s->tail->next = x;
    else s->head = x;
    s->tail = x;
}

static void fk_exec(fk_op *o) {
    switch (o->kind) {
    case FK_COPY: memcpy((void *)o->dst, (const void *)o->src, o->bytes); break;
    case FK_KERNEL: {
        const kvo__cuda_desc *d = (const kvo__cuda_desc *)(uintptr_t)o->descs;
        if (memcmp(d, o->snap, o->n * sizeof *d)) fk.desc_changed++;
        for (unsigned int i = 0; i < o->n; i++) memcpy((void *)d[i].dst, (const void *)d[i].src, d[i].bytes);
        break;
    }
    case FK_RECORD: o->ev->done_gen = o->gen; break;
    default: break;
    }
    free(o->snap);
}

/* Run everything that can run, in stream order (lock held). */
static void fk_run(void) {
    for (bool progress = true; progress;) {
        progress = false;
        for (struct CUstream_st *s = fk.streams; s; s = s->next_all) {
            while (s->head && !s->held) {
                fk_op *o = s->head;
                if (o->kind == FK_WAIT && o->ev->done_gen < o->gen) break;
                s->head = o->next;
                if (!s->head) s->tail = NULL;
                fk_exec(o);
                free(o);
                progress = true;
            }
        }
    }
}

static bool fk_idle(struct CUstream_st *s) { return s->head == NULL; }

/* ---- the driver API -------------------------------------------------------- */

static CUresult fk_cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDriverGetVersion(int *v) {
    *v = 13000;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceGetCount(int *n) {
    *n = fk.n_devices;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal < 0 || ordinal >= fk.n_devices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceGetAttribute(int *v, kvo__cu_dev_attr a, CUdevice d) {
    (void)d;
    *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 1;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "fake GPU %d", d);
    return CUDA_SUCCESS;
}
static CUresult fk_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    pthread_mutex_lock(&fk.mu);
    fk.ctx[d].refs++;
    pthread_mutex_unlock(&fk.mu);
    *c = &fk.ctx[d];
    return CUDA_SUCCESS;
}
static CUresult fk_cuDevicePrimaryCtxRelease(CUdevice d) {
    pthread_mutex_lock(&fk.mu);
    fk.ctx[d].refs--;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxPushCurrent(CUcontext c) {
    if (!c || fk_ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    fk_ctx_stack[fk_ctx_depth++] = c;
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxPopCurrent(CUcontext *c) {
    if (!fk_ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
    *c = fk_ctx_stack[--fk_ctx_depth];
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxSetCurrent(CUcontext c) {
    if (!c) {
        if (fk_ctx_depth) fk_ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (fk_ctx_depth) fk_ctx_stack[fk_ctx_depth - 1] = c;
    else fk_ctx_stack[fk_ctx_depth++] = c;
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxGetCurrent(CUcontext *c) {
    *c = fk_current();
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxGetDevice(CUdevice *d) {
    struct CUctx_st *c = fk_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}
static CUresult fk_cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    struct CUctx_st *c = fk_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk.mu);
    *s = fk_stream_new(c, false);
    fk.live_streams++;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuStreamDestroy(CUstream s) {
    pthread_mutex_lock(&fk.mu);
    for (struct CUstream_st **p = &fk.streams; *p; p = &(*p)->next_all)
        if (*p == s) {
            *p = s->next_all;
            while (s->head) { /* pending work is dropped (a real driver would finish it first) */
                fk_op *o = s->head;
                s->head = o->next;
                free(o->snap);
                free(o);
            }
            free(s);
            fk.live_streams--;
            break;
        }
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuStreamWaitEvent(CUstream hs, CUevent ev, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_CONTEXT;
    else {
        fk_push_op(s, (fk_op){.kind = FK_WAIT, .ev = ev, .gen = ev->rec_gen});
        fk_run();
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuStreamQuery(CUstream hs) {
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    CUresult r = !s ? CUDA_ERROR_INVALID_CONTEXT : fk_idle(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuStreamSynchronize(CUstream hs) {
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    fk.c.waits++;
    fk.c.stream_syncs++;
    CUresult r = !s ? CUDA_ERROR_INVALID_CONTEXT : fk_idle(s) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    pthread_mutex_unlock(&fk.mu);
    return r; /* a held stream would block for ever: reported as an error instead */
}
static CUresult fk_cuStreamGetCtx(CUstream hs, CUcontext *c) {
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    pthread_mutex_unlock(&fk.mu);
    if (!s) return CUDA_ERROR_INVALID_CONTEXT;
    *c = s->ctx;
    return CUDA_SUCCESS;
}
static CUresult fk_cuEventCreate(CUevent *ev, unsigned int flags) {
    (void)flags;
    struct CUctx_st *c = fk_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUevent_st *e = calloc(1, sizeof *e);
    e->ctx = c;
    pthread_mutex_lock(&fk.mu);
    e->next_all = fk.events;
    fk.events = e;
    fk.live_events++;
    pthread_mutex_unlock(&fk.mu);
    *ev = e;
    return CUDA_SUCCESS;
}
static CUresult fk_cuEventDestroy(CUevent ev) {
    pthread_mutex_lock(&fk.mu);
    for (struct CUevent_st **p = &fk.events; *p; p = &(*p)->next_all)
        if (*p == ev) {
            *p = ev->next_all;
            fk.live_events--;
            free(ev);
            break;
        }
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuEventRecord(CUevent ev, CUstream hs) {
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_CONTEXT;
    else if (s->ctx != ev->ctx) r = CUDA_ERROR_INVALID_HANDLE; /* an event of another context */
    else {
        ev->rec_gen++;
        fk_push_op(s, (fk_op){.kind = FK_RECORD, .ev = ev, .gen = ev->rec_gen});
        fk.c.records++;
        fk_run();
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuEventQuery(CUevent ev) {
    pthread_mutex_lock(&fk.mu);
    if (ev->asked_gen != ev->rec_gen) { /* a new point the host waits at */
        ev->asked_gen = ev->rec_gen;
        fk.c.waits++;
    }
    CUresult r = ev->done_gen >= ev->rec_gen ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuEventSynchronize(CUevent ev) {
    pthread_mutex_lock(&fk.mu);
    fk.c.waits++;
    CUresult r = ev->done_gen >= ev->rec_gen ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    (void)a;
    (void)b;
    *ms = 0.01f;
    return CUDA_SUCCESS;
}
static void fk_region_add(uintptr_t base, size_t bytes, fk_kind kind, int dev) {
    fk_region *r = calloc(1, sizeof *r);
    *r = (fk_region){base, bytes, kind, dev, fk.regions};
    fk.regions = r;
}
static bool fk_region_del(uintptr_t base, fk_kind kind) {
    for (fk_region **p = &fk.regions; *p; p = &(*p)->next)
        if ((*p)->base == base && (*p)->kind == kind) {
            fk_region *r = *p;
            *p = r->next;
            free(r);
            return true;
        }
    return false;
}
static CUresult fk_cuMemAlloc(CUdeviceptr *p, size_t bytes) {
    struct CUctx_st *c = fk_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    void *m = NULL;
    if (posix_memalign(&m, 256, bytes ? bytes : 1)) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk.mu);
    fk_region_add((uintptr_t)m, bytes, FK_DEV_MEM, c->dev);
    pthread_mutex_unlock(&fk.mu);
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemFree(CUdeviceptr p) {
    pthread_mutex_lock(&fk.mu);
    bool ok = fk_region_del((uintptr_t)p, FK_DEV_MEM);
    pthread_mutex_unlock(&fk.mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    void *m = NULL;
    if (posix_memalign(&m, 4096, bytes ? bytes : 1)) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fk.mu);
    fk_region_add((uintptr_t)m, bytes, FK_HOST_ALLOC, -1);
    fk.live_host_allocs++;
    pthread_mutex_unlock(&fk.mu);
    *p = m;
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemFreeHost(void *p) {
    pthread_mutex_lock(&fk.mu);
    bool ok = fk_region_del((uintptr_t)p, FK_HOST_ALLOC);
    if (ok) fk.live_host_allocs--;
    pthread_mutex_unlock(&fk.mu);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&fk.mu);
    fk_region *r = fk_find((uintptr_t)p);
    bool host = r && r->kind != FK_DEV_MEM;
    pthread_mutex_unlock(&fk.mu);
    if (!host) return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemHostRegister(void *p, size_t bytes, unsigned int flags) {
    (void)flags;
    uintptr_t b = (uintptr_t)p;
    CUresult res = CUDA_SUCCESS;
    pthread_mutex_lock(&fk.mu);
    for (fk_region *r = fk.regions; r; r = r->next)
        if (r->kind != FK_DEV_MEM && b < r->base + r->bytes && r->base < b + bytes)
            res = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (res == CUDA_SUCCESS) fk_region_add(b, bytes, FK_HOST_REG, -1);
    pthread_mutex_unlock(&fk.mu);
    return res;
}
static CUresult fk_cuMemHostUnregister(void *p) {
    pthread_mutex_lock(&fk.mu);
    bool ok = fk_region_del((uintptr_t)p, FK_HOST_REG);
    pthread_mutex_unlock(&fk.mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
static CUresult fk_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hs) {
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    CUresult r = CUDA_SUCCESS;
    if (!s) r = CUDA_ERROR_INVALID_CONTEXT;
    else {
        fk_push_op(s, (fk_op){.kind = FK_COPY, .dst = (uintptr_t)dst, .src = (uintptr_t)src, .bytes = bytes});
        fk.c.memcpys++;
        fk_run();
    }
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}
static CUresult fk_attr(void *data, kvo__cu_ptr_attr a, uintptr_t p) {
    fk_region *r = fk_find(p);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = r->kind == FK_DEV_MEM ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = (CUdeviceptr)p; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = r->dev; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        if (fk.no_range_attrs) return CUDA_ERROR_INVALID_VALUE;
        *(CUdeviceptr *)data = (CUdeviceptr)r->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        if (fk.no_range_attrs) return CUDA_ERROR_INVALID_VALUE;
        *(size_t *)data = r->bytes;
        return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}
static CUresult fk_cuPointerGetAttribute(void *data, kvo__cu_ptr_attr a, CUdeviceptr p) {
    pthread_mutex_lock(&fk.mu);
    CUresult r = fk_attr(data, a, (uintptr_t)p);
    pthread_mutex_unlock(&fk.mu);
    return r;
}
static CUresult fk_cuPointerGetAttributes(unsigned int n, kvo__cu_ptr_attr *attrs, void **data, CUdeviceptr p) {
    /* Unknown pointers: zeroed attributes and success, as the driver does. */
    pthread_mutex_lock(&fk.mu);
    for (unsigned int i = 0; i < n; i++)
        if (fk_attr(data[i], attrs[i], (uintptr_t)p) != CUDA_SUCCESS) memset(data[i], 0, sizeof(unsigned int));
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuModuleLoadData(CUmodule *m, const void *image) {
    if (image == (const void *)kvo__cuda_fatbin && fk.fatbin_fails) return CUDA_ERROR_NO_BINARY_FOR_GPU;
    if (image == (const void *)kvo__cuda_ptx && fk.ptx_fails) return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    if (image != (const void *)kvo__cuda_fatbin && image != (const void *)kvo__cuda_ptx)
        return CUDA_ERROR_INVALID_IMAGE;
    pthread_mutex_lock(&fk.mu);
    fk.live_modules++;
    pthread_mutex_unlock(&fk.mu);
    *m = &fk.module;
    return CUDA_SUCCESS;
}
static CUresult fk_cuModuleUnload(CUmodule m) {
    (void)m;
    pthread_mutex_lock(&fk.mu);
    fk.live_modules--;
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}
static CUresult fk_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    if (strcmp(name, KVO__CUDA_KERNEL_NAME)) return CUDA_ERROR_NOT_FOUND;
    *f = &fk.func;
    return CUDA_SUCCESS;
}
static CUresult fk_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                  unsigned int by, unsigned int bz, unsigned int shmem, CUstream hs, void **params,
                                  void **extra) {
    if (f != &fk.func || !gx || gy != 1 || gz != 1 || bx != KVO__CUDA_KERNEL_THREADS || by != 1 || bz != 1 || shmem ||
        extra || !params)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr descs = *(CUdeviceptr *)params[0];
    unsigned int n = *(unsigned int *)params[1];
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    fk_region *r = fk_find((uintptr_t)descs);
    CUresult res = CUDA_SUCCESS;
    if (!s) res = CUDA_ERROR_INVALID_CONTEXT;
    else if (!r || r->kind == FK_DEV_MEM || (uintptr_t)descs + n * sizeof(kvo__cuda_desc) > r->base + r->bytes)
        res = CUDA_ERROR_ILLEGAL_ADDRESS; /* descriptors must be mapped host memory */
    else {
        fk_op o = {.kind = FK_KERNEL, .descs = descs, .n = n};
        o.snap = malloc(n * sizeof(kvo__cuda_desc));
        memcpy(o.snap, (const void *)(uintptr_t)descs, n * sizeof(kvo__cuda_desc));
        fk_push_op(s, o);
        fk.c.launches++;
        fk.c.kernel_pieces += n;
        fk_run();
    }
    pthread_mutex_unlock(&fk.mu);
    return res;
}
static const char *fk_err_name(CUresult e) {
#define FK_NAME(n, v) if (e == (CUresult)(v) && !strncmp(#n, "CUDA_", 5)) return #n;
    KVO__CU_CONSTANTS(FK_NAME)
#undef FK_NAME
    return "CUDA_ERROR_?";
}
static CUresult fk_cuGetErrorName(CUresult e, const char **s) {
    *s = fk_err_name(e);
    return CUDA_SUCCESS;
}
static CUresult fk_cuGetErrorString(CUresult e, const char **s) {
    *s = e == CUDA_SUCCESS ? "no error" : "fake driver error";
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                      kvo__cu_memcpy_attr *attrs, size_t *idxs, size_t n_attrs, size_t *fail,
                                      CUstream hs) {
    (void)fail;
    if (fk.refuse_batch) return CUDA_ERROR_NOT_SUPPORTED;
    if (!count || !n_attrs || n_attrs > count || idxs[0] != 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n_attrs; i++)
        if (attrs[i].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
            attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
            return CUDA_ERROR_INVALID_VALUE;
    if (!hs || hs == CU_STREAM_LEGACY) return CUDA_ERROR_INVALID_VALUE; /* "must not be legacy NULL stream" */
    pthread_mutex_lock(&fk.mu);
    struct CUstream_st *s = fk_resolve(hs);
    for (size_t i = 0; i < count; i++)
        fk_push_op(s, (fk_op){.kind = FK_COPY, .dst = (uintptr_t)dsts[i], .src = (uintptr_t)srcs[i], .bytes = sizes[i]});
    fk.c.batches++;
    fk.c.batch_pieces += (long)count;
    fk_run();
    pthread_mutex_unlock(&fk.mu);
    return CUDA_SUCCESS;
}

static kvo__cu_api FK_API = {
#define FK_FN(f, v) .f = fk_##f,
    KVO__CU_FUNCTIONS(FK_FN) KVO__CU_OPTIONAL(FK_FN)
#undef FK_FN
    .driver_version = 13000,
};

/* ---- for the tests ---------------------------------------------------------- */

/* A fresh fake with n devices, installed as the driver (batch call present). */
static void fk_reset(int n_devices) {
    pthread_mutex_lock(&fk.mu);
    while (fk.streams) {
        struct CUstream_st *s = fk.streams;
        fk.streams = s->next_all;
        while (s->head) {
            fk_op *o = s->head;
            s->head = o->next;
            free(o->snap);
            free(o);
        }
        free(s);
    }
    while (fk.events) {
        struct CUevent_st *e = fk.events;
        fk.events = e->next_all;
        free(e);
    }
    while (fk.regions) { /* what the library leaked on purpose (a busy context) */
        fk_region *r = fk.regions;
        fk.regions = r->next;
        if (r->kind != FK_HOST_REG) free((void *)r->base);
        free(r);
    }
    fk.n_devices = n_devices;
    for (int d = 0; d < FK_MAX_DEV; d++) fk.ctx[d] = (struct CUctx_st){d, 0, NULL};
    for (int d = 0; d < n_devices; d++) fk.ctx[d].legacy = fk_stream_new(&fk.ctx[d], true);
    fk.live_streams = fk.live_events = fk.live_modules = fk.live_host_allocs = 0;
    fk.fatbin_fails = fk.ptx_fails = fk.refuse_batch = fk.no_range_attrs = false;
    fk.desc_changed = 0;
    memset(&fk.c, 0, sizeof fk.c);
    pthread_mutex_unlock(&fk.mu);
    FK_API.cuMemcpyBatchAsync = fk_cuMemcpyBatchAsync;
    fk_ctx_depth = 0;
    kvo__cu_use(&FK_API);
}

static fk_counts fk_counts_now(void) {
    pthread_mutex_lock(&fk.mu);
    fk_counts c = fk.c;
    pthread_mutex_unlock(&fk.mu);
    return c;
}

/* What was counted since c0. */
static fk_counts fk_since(fk_counts c0) {
    fk_counts c = fk_counts_now();
    c.batches -= c0.batches, c.batch_pieces -= c0.batch_pieces, c.launches -= c0.launches;
    c.kernel_pieces -= c0.kernel_pieces, c.memcpys -= c0.memcpys, c.waits -= c0.waits;
    c.stream_syncs -= c0.stream_syncs, c.records -= c0.records;
    return c;
}

/* Hold a stream (its work waits), or release it (and run what can run). */
static void fk_hold(CUstream s, bool held) {
    pthread_mutex_lock(&fk.mu);
    s->held = held;
    fk_run();
    pthread_mutex_unlock(&fk.mu);
}

static bool fk_stream_idle(CUstream s) {
    pthread_mutex_lock(&fk.mu);
    bool idle = fk_idle(s);
    pthread_mutex_unlock(&fk.mu);
    return idle;
}

/* Device memory of device dev (allocated in its context). */
static void *fk_dev_alloc(int dev, size_t bytes) {
    CUdeviceptr p = 0;
    fk_cuCtxPushCurrent(&fk.ctx[dev]);
    fk_cuMemAlloc(&p, bytes);
    CUcontext c;
    fk_cuCtxPopCurrent(&c);
    return (void *)(uintptr_t)p;
}

static void fk_dev_free(void *p) { fk_cuMemFree((CUdeviceptr)(uintptr_t)p); }

/* A stream / event of device dev's context, for a test. */
static CUstream fk_stream(int dev) {
    CUstream s = NULL;
    fk_cuCtxPushCurrent(&fk.ctx[dev]);
    fk_cuStreamCreate(&s, 0);
    CUcontext c;
    fk_cuCtxPopCurrent(&c);
    return s;
}

static CUevent fk_event(int dev) {
    CUevent e = NULL;
    fk_cuCtxPushCurrent(&fk.ctx[dev]);
    fk_cuEventCreate(&e, 0);
    CUcontext c;
    fk_cuCtxPopCurrent(&c);
    return e;
}

/* Objects the library created and has not released: streams, events,
 * modules, host allocations, primary-context references. */
static long fk_live(void) {
    pthread_mutex_lock(&fk.mu);
    long n = fk.live_streams + fk.live_events + fk.live_modules + fk.live_host_allocs;
    for (int d = 0; d < FK_MAX_DEV; d++) n += fk.ctx[d].refs;
    pthread_mutex_unlock(&fk.mu);
    return n;
}

#endif
