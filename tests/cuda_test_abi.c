/*
 * The CUDA device declares the driver API itself (src/transfer/cuda/
 * cuda_driver.h: it includes no CUDA header, so it builds and loads without
 * the toolkit).  This file, compiled in builds with the toolkit and never
 * linked, checks those declarations against the toolkit's cuda.h and
 * cudaTypedefs.h: every constant has cuda.h's value, cuMemcpyBatchAsync's
 * attributes have its layout, and every function of the table has the
 * prototype cudaTypedefs.h gives it at the ABI version it is looked up at.
 * A mistake fails the build here, not a run on a GPU.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>

#include "transfer/cuda/cuda_driver.h"

#define KVO__SAME_VALUE(name, value) \
    _Static_assert((long long)(name) == (long long)(value), #name " differs from cuda.h's");
KVO__CU_CONSTANTS(KVO__SAME_VALUE)

#define KVO__SAME_TYPE(f, v)                                                                     \
    _Static_assert(__builtin_types_compatible_p(__typeof__(((kvo__cu_api *)0)->f), PFN_##f##_v##v), \
                   #f " in kvo__cu_api is not cudaTypedefs.h's PFN_" #f "_v" #v);
KVO__CU_FUNCTIONS(KVO__SAME_TYPE)
KVO__CU_OPTIONAL(KVO__SAME_TYPE)

_Static_assert(sizeof(CUmemcpyAttributes) == 24 && offsetof(CUmemcpyAttributes, srcLocHint) == 4 &&
                   offsetof(CUmemcpyAttributes, dstLocHint) == 12 && offsetof(CUmemcpyAttributes, flags) == 20,
               "CUmemcpyAttributes: cuda_driver.h's kvo__cu_memcpy_attr has another layout");

/* The object must not be empty (ISO C). */
int kvo__cuda_abi_checked;
