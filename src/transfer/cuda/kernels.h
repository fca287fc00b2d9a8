/* CUDA device: what the gather/scatter kernel (kernels.cu, compiled to an
 * embedded fatbin and PTX, loaded with cuModuleLoadData) and its launcher in
 * device_cuda.c share.  Included by nvcc (kernels.cu) and the C compiler. */
#ifndef KVO_TRANSFER_CUDA_KERNELS_H
#define KVO_TRANSFER_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* One piece as the kernel sees it: device-visible addresses (the slot side
 * is registered host memory mapped into the device's address space). */
typedef struct kvo__cuda_desc {
    uint64_t dst, src, bytes;
} kvo__cuda_desc;

/* The kernel's name in the module (extern "C", not mangled), its threads per
 * block (it keeps that many descriptors in shared memory) and its
 * parameters: (const kvo__cuda_desc *descs, unsigned int n). */
#define KVO__CUDA_KERNEL_NAME "kvo_copy_pieces"
#define KVO__CUDA_KERNEL_THREADS 256

#ifndef __CUDACC__
/* The module images, generated at build time from kernels.cu
 * (CMakeLists.txt, CUDA section): a fatbin with code for several GPU
 * generations and PTX, and the same kernel as PTX that drivers of CUDA 11.0
 * and later can compile (tried when the fatbin does not load). */
extern const unsigned char kvo__cuda_fatbin[];
extern const size_t kvo__cuda_fatbin_size;
extern const char kvo__cuda_ptx[];
#endif

#endif
