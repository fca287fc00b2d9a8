/*
 * CUDA device: loading the NVIDIA driver API at run time.
 *
 * The device links against no CUDA library.  It opens the driver's
 * libcuda.so.1 (the one every CUDA program ends up in, whatever runtime it
 * was built with) and looks every function up with cuGetProcAddress at the
 * ABI version its prototype in cuda_driver.h has, the way vLLM finds
 * cuMemcpyBatchAsync.  So one build of libkvoffload_cuda.so runs in a
 * process whose torch uses CUDA 12.x or 13.x, next to whatever libcudart that
 * process loaded (the driver API and the runtime share the device's primary
 * context: cuda.c retains it).  Needed: a driver of CUDA 11.3 or later
 * (cuGetProcAddress); cuMemcpyBatchAsync (12.8) is optional and its absence
 * is logged once by cuda.c.
 *
 * Once per process (pthread_once): the result, table or error, is kept; the
 * library is never closed.  Tests install a fake driver with kvo__cu_use
 * (tests/cuda_test_fake.h) and run this device's code without a GPU.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "core/internal.h"
#include "transfer/cuda/cuda_driver.h"

const kvo__cu_api *kvo__cu;
static const kvo__cu_api *kvo__cu_fake;
static kvo__cu_api kvo__cu_real;
static pthread_once_t kvo__cu_once = PTHREAD_ONCE_INIT;
static int kvo__cu_rc;
static char kvo__cu_why[256];

typedef CUresult (*kvo__getproc1)(const char *sym, void **pfn, int version, uint64_t flags);
typedef CUresult (*kvo__getproc2)(const char *sym, void **pfn, int version, uint64_t flags, int *status);

/* Where each function of the table is found, and at which ABI version. */
typedef struct kvo__cu_sym {
    const char *name;
    int version;
    size_t offset;
    int optional;
} kvo__cu_sym;
#define KVO__SYM(f, v) {#f, v, offsetof(kvo__cu_api, f), 0},
#define KVO__OPT(f, v) {#f, v, offsetof(kvo__cu_api, f), 1},
static const kvo__cu_sym kvo__cu_syms[] = {KVO__CU_FUNCTIONS(KVO__SYM) KVO__CU_OPTIONAL(KVO__OPT)};
#undef KVO__SYM
#undef KVO__OPT

static void kvo__cu_load(void) {
    kvo__cu_rc = KVO_ENOTSUP;
    /* RTLD_LOCAL: nothing of the driver becomes visible to other objects;
     * a process that loaded it already gets the same handle. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(kvo__cu_why, sizeof kvo__cu_why, "no NVIDIA driver: dlopen libcuda.so.1: %s", e ? e : "?");
        return;
    }
    kvo__getproc2 gp2 = (kvo__getproc2)dlsym(h, "cuGetProcAddress_v2");
    kvo__getproc1 gp1 = gp2 ? NULL : (kvo__getproc1)dlsym(h, "cuGetProcAddress");
    if (!gp2 && !gp1) {
        snprintf(kvo__cu_why, sizeof kvo__cu_why,
                 "the NVIDIA driver is older than CUDA 11.3 (libcuda.so.1 has no cuGetProcAddress)");
        return;
    }
    kvo__cu_api *a = &kvo__cu_real;
    for (size_t i = 0; i < sizeof kvo__cu_syms / sizeof kvo__cu_syms[0]; i++) {
        const kvo__cu_sym *s = &kvo__cu_syms[i];
        void *fn = NULL;
        int status = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult r = gp2 ? gp2(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT, &status)
                         : gp1(s->name, &fn, s->version, CU_GET_PROC_ADDRESS_DEFAULT);
        if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) fn = NULL;
        if (!fn && !s->optional) {
            snprintf(kvo__cu_why, sizeof kvo__cu_why,
                     "the NVIDIA driver has no %s (ABI %d.%d; cuGetProcAddress: error %d, status %d)", s->name,
                     s->version / 1000, s->version % 1000 / 10, r, status);
            return;
        }
        memcpy((char *)a + s->offset, &fn, sizeof fn);
    }
    CUresult r = a->cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *n = NULL, *t = NULL;
        a->cuGetErrorName(r, &n);
        a->cuGetErrorString(r, &t);
        snprintf(kvo__cu_why, sizeof kvo__cu_why, "cuInit: %s (%s)", n ? n : "?", t ? t : "?");
        return;
    }
    if (a->cuDriverGetVersion(&a->driver_version) != CUDA_SUCCESS) a->driver_version = 0;
    kvo__cu_rc = 0;
}

int kvo__cu_get(const kvo__cu_api **out) {
    const kvo__cu_api *api = __atomic_load_n(&kvo__cu_fake, __ATOMIC_ACQUIRE);
    if (!api) {
        pthread_once(&kvo__cu_once, kvo__cu_load);
        if (kvo__cu_rc) return kvo__error(kvo__cu_rc, "%s", kvo__cu_why);
        api = &kvo__cu_real;
    }
    /* Written once (workers read kvo__cu without a barrier after the
     * context that started them was created). */
    if (__atomic_load_n(&kvo__cu, __ATOMIC_ACQUIRE) != api) __atomic_store_n(&kvo__cu, api, __ATOMIC_RELEASE);
    *out = api;
    return 0;
}

void kvo__cu_use(const kvo__cu_api *api) {
    __atomic_store_n(&kvo__cu_fake, api, __ATOMIC_RELEASE);
    __atomic_store_n(&kvo__cu, api, __ATOMIC_RELEASE);
}

const char *kvo__cu_name(CUresult e) {
    const char *s = NULL;
    const kvo__cu_api *a = __atomic_load_n(&kvo__cu, __ATOMIC_ACQUIRE);
    if (a && a->cuGetErrorName(e, &s) == CUDA_SUCCESS && s) return s;
    return "CUDA_ERROR_?";
}

const char *kvo__cu_text(CUresult e) {
    const char *s = NULL;
    const kvo__cu_api *a = __atomic_load_n(&kvo__cu, __ATOMIC_ACQUIRE);
    if (a && a->cuGetErrorString(e, &s) == CUDA_SUCCESS && s) return s;
    return "unknown error";
}
