/* CUDA device: the NVIDIA driver API, loaded at run time (cuda_driver.c).
 *
 * No CUDA header is included anywhere in the device: the few types,
 * constants and prototypes it uses are declared here, with the ABI version of
 * each function as cuGetProcAddress names it (the version given to
 * cuGetProcAddress selects the prototype, e.g. cuMemcpyBatchAsync of 12.8
 * takes a failIdx argument that 13.0's _v2 dropped).  A build with the
 * toolkit checks these declarations against cuda.h (tests/cuda_test_abi.c,
 * static assertions), so a typo here fails the build, not a GPU run.  Only
 * the files under src/transfer/cuda/, the CUDA tests and the CUDA benchmark
 * include this header.
 */
#ifndef KVO_TRANSFER_CUDA_DRIVER_H
#define KVO_TRANSFER_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* Every constant the device uses, with cuda.h's value: X(name, value). */
#define KVO__CU_CONSTANTS(X)                                                                             \
    X(CUDA_SUCCESS, 0) X(CUDA_ERROR_INVALID_VALUE, 1) X(CUDA_ERROR_OUT_OF_MEMORY, 2)                      \
    X(CUDA_ERROR_NOT_INITIALIZED, 3) X(CUDA_ERROR_DEINITIALIZED, 4) X(CUDA_ERROR_STUB_LIBRARY, 34)        \
    X(CUDA_ERROR_NO_DEVICE, 100) X(CUDA_ERROR_INVALID_DEVICE, 101) X(CUDA_ERROR_INVALID_IMAGE, 200)       \
    X(CUDA_ERROR_INVALID_CONTEXT, 201) X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209) X(CUDA_ERROR_INVALID_PTX, 218) \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222) X(CUDA_ERROR_INVALID_HANDLE, 400)                          \
    X(CUDA_ERROR_NOT_FOUND, 500) X(CUDA_ERROR_NOT_READY, 600) X(CUDA_ERROR_ILLEGAL_ADDRESS, 700)          \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712) X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713)       \
    X(CUDA_ERROR_LAUNCH_FAILED, 719) X(CUDA_ERROR_NOT_PERMITTED, 800) X(CUDA_ERROR_NOT_SUPPORTED, 801)    \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 803) X(CUDA_ERROR_UNKNOWN, 999)                                  \
    X(CU_STREAM_NON_BLOCKING, 0x1) X(CU_EVENT_DISABLE_TIMING, 0x2) X(CU_MEMHOSTALLOC_PORTABLE, 0x1)       \
    X(CU_MEMHOSTALLOC_DEVICEMAP, 0x2) X(CU_MEMHOSTREGISTER_PORTABLE, 0x1)                                 \
    X(CU_MEMHOSTREGISTER_DEVICEMAP, 0x2) X(CU_MEMORYTYPE_HOST, 1) X(CU_MEMORYTYPE_DEVICE, 2)              \
    X(CU_POINTER_ATTRIBUTE_CONTEXT, 1) X(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 2)                             \
    X(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, 3) X(CU_POINTER_ATTRIBUTE_IS_MANAGED, 8)                       \
    X(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 9) X(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 11)                \
    X(CU_POINTER_ATTRIBUTE_RANGE_SIZE, 12) X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 16)                \
    X(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 41) X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75)     \
    X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76) X(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0x1)         \
    X(CU_MEMCPY_SRC_ACCESS_ORDER_ANY, 0x3) X(CU_MEMCPY_FLAG_DEFAULT, 0x0)                                 \
    X(CU_GET_PROC_ADDRESS_DEFAULT, 0) X(CU_GET_PROC_ADDRESS_SUCCESS, 0)

#ifdef __cuda_cuda_h__
/* tests/cuda_test_abi.c includes cuda.h first: the types and constants are
 * then cuda.h's own, the table below must compile against them, and each
 * of its members must be the type cudaTypedefs.h gives that function at the
 * version kvo__cu_get asks for. */
typedef CUmemcpyAttributes kvo__cu_memcpy_attr;
typedef CUpointer_attribute kvo__cu_ptr_attr;
typedef CUdevice_attribute kvo__cu_dev_attr;
#else
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef int kvo__cu_ptr_attr;
typedef int kvo__cu_dev_attr;
#define KVO__CU_ENUM(name, value) name = value,
enum { KVO__CU_CONSTANTS(KVO__CU_ENUM) };
#undef KVO__CU_ENUM
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* cuMemcpyBatchAsync's per-copy attributes (CUmemcpyAttributes_v1). */
typedef struct kvo__cu_memloc {
    int type; /* CUmemLocationType; 0 = invalid (no hint) */
    int id;
} kvo__cu_memloc;
typedef struct kvo__cu_memcpy_attr {
    int srcAccessOrder; /* CUmemcpySrcAccessOrder */
    kvo__cu_memloc srcLocHint;
    kvo__cu_memloc dstLocHint;
    unsigned int flags;
} kvo__cu_memcpy_attr;
_Static_assert(sizeof(kvo__cu_memcpy_attr) == 24 && offsetof(kvo__cu_memcpy_attr, flags) == 20,
               "kvo__cu_memcpy_attr: CUmemcpyAttributes' layout (tests/cuda_test_abi.c checks cuda.h's)");
#endif

/* The functions the device calls, X(name, ABI version): each is looked up
 * with cuGetProcAddress at that version, whose prototype is the member of
 * kvo__cu_api of the same name (cuStreamDestroy at 4.0 is cuStreamDestroy_v2,
 * cuMemcpyBatchAsync at 12.8 takes a failIdx that 13.0's _v2 dropped). */
#define KVO__CU_FUNCTIONS(X) \
    X(cuInit, 2000) \
    X(cuDriverGetVersion, 2020) \
    X(cuDeviceGetCount, 2000) \
    X(cuDeviceGet, 2000) \
    X(cuDeviceGetAttribute, 2000) \
    X(cuDeviceGetName, 2000) \
    X(cuDevicePrimaryCtxRetain, 7000) \
    X(cuDevicePrimaryCtxRelease, 11000) \
    X(cuCtxPushCurrent, 4000) \
    X(cuCtxPopCurrent, 4000) \
    X(cuCtxSetCurrent, 4000) \
    X(cuCtxGetCurrent, 4000) \
    X(cuCtxGetDevice, 2000) \
    X(cuStreamCreate, 2000) \
    X(cuStreamDestroy, 4000) \
    X(cuStreamWaitEvent, 3020) \
    X(cuStreamQuery, 2000) \
    X(cuStreamSynchronize, 2000) \
    X(cuStreamGetCtx, 9020) \
    X(cuEventCreate, 2000) \
    X(cuEventDestroy, 4000) \
    X(cuEventRecord, 2000) \
    X(cuEventQuery, 2000) \
    X(cuEventSynchronize, 2000) \
    X(cuEventElapsedTime, 2000) \
    X(cuMemAlloc, 3020) \
    X(cuMemFree, 3020) \
    X(cuMemHostAlloc, 2020) \
    X(cuMemFreeHost, 2000) \
    X(cuMemHostGetDevicePointer, 3020) \
    X(cuMemHostRegister, 6050) \
    X(cuMemHostUnregister, 4000) \
    X(cuMemcpyAsync, 4000) \
    X(cuMemcpy, 4000) \
    X(cuMemsetD8, 3020) \
    X(cuPointerGetAttribute, 4000) \
    X(cuPointerGetAttributes, 7000) \
    X(cuModuleLoadData, 2000) \
    X(cuModuleUnload, 2000) \
    X(cuModuleGetFunction, 2000) \
    X(cuLaunchKernel, 4000) \
    X(cuGetErrorName, 6000) \
    X(cuGetErrorString, 6000)
/* Looked up too, but optional (NULL when the driver lacks them). */
#define KVO__CU_OPTIONAL(X) X(cuMemcpyBatchAsync, 12080)

typedef struct kvo__cu_api {
    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetAttribute)(int *v, kvo__cu_dev_attr attr, CUdevice dev);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*cuCtxPushCurrent)(CUcontext ctx);
    CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxGetDevice)(CUdevice *dev);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
    CUresult (*cuStreamDestroy)(CUstream s);
    CUresult (*cuStreamWaitEvent)(CUstream s, CUevent ev, unsigned int flags);
    CUresult (*cuStreamQuery)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuStreamGetCtx)(CUstream s, CUcontext *ctx);
    CUresult (*cuEventCreate)(CUevent *ev, unsigned int flags);
    CUresult (*cuEventDestroy)(CUevent ev);
    CUresult (*cuEventRecord)(CUevent ev, CUstream s);
    CUresult (*cuEventQuery)(CUevent ev);
    CUresult (*cuEventSynchronize)(CUevent ev);
    CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
    CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*cuMemFree)(CUdeviceptr p);
    CUresult (*cuMemHostAlloc)(void **p, size_t bytes, unsigned int flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *d, void *p, unsigned int flags);
    CUresult (*cuMemHostRegister)(void *p, size_t bytes, unsigned int flags);
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemcpy)(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char v, size_t n);
    CUresult (*cuPointerGetAttribute)(void *data, kvo__cu_ptr_attr attr, CUdeviceptr p);
    CUresult (*cuPointerGetAttributes)(unsigned int n, kvo__cu_ptr_attr *attrs, void **data, CUdeviceptr p);
    CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*cuModuleUnload)(CUmodule m);
    CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                               void **extra);
    CUresult (*cuGetErrorName)(CUresult e, const char **s);
    CUresult (*cuGetErrorString)(CUresult e, const char **s);
    /* KVO__CU_OPTIONAL: CUDA 12.8+. */
    CUresult (*cuMemcpyBatchAsync)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   kvo__cu_memcpy_attr *attrs, size_t *attr_idxs, size_t n_attrs, size_t *fail_idx,
                                   CUstream s);
    int driver_version; /* cuDriverGetVersion's */
} kvo__cu_api;

/* The driver: libcuda.so.1 loaded (dlopen) and every function above looked
 * up with cuGetProcAddress (cuGetProcAddress_v2 where the driver has it),
 * then cuInit(0); once per process, any thread.  *out: the table (never
 * freed).  Errors: KVO_ENOTSUP with the reason (no libcuda.so.1, a driver
 * older than CUDA 11.3 without cuGetProcAddress, a function missing, cuInit
 * failing: no device, driver/library mismatch).  A table installed with
 * kvo__cu_use is returned instead. */
int kvo__cu_get(const kvo__cu_api **out);
/* The table in use (after a successful kvo__cu_get), or NULL. */
extern const kvo__cu_api *kvo__cu;
/* Tests: use api (a fake driver) from now on instead of libcuda; NULL goes
 * back to loading the real one.  Not for concurrent use with other calls. */
void kvo__cu_use(const kvo__cu_api *api);
/* "CUDA_ERROR_X (text)" for e, in a static or the driver's buffer. */
const char *kvo__cu_name(CUresult e);
const char *kvo__cu_text(CUresult e);

#endif
