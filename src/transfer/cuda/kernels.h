/* CUDA device: the gather/scatter kernel, callable from C (kernels.cu). */
#ifndef KVO_TRANSFER_CUDA_KERNELS_H
#define KVO_TRANSFER_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One piece as the kernel sees it: device-visible addresses (the slot side is
 * registered host memory mapped into the device's address space). */
typedef struct kvo__cuda_desc {
    uint64_t dst, src, bytes;
} kvo__cuda_desc;

/* Enqueue one launch copying descs[0..n-1] (descs is device-visible: mapped
 * pinned memory) on stream (a cudaStream_t) with `threads` threads per
 * block, one block per piece.  Returns the cudaError_t of the launch (0 =
 * enqueued). */
int kvo__cuda_launch_copy(const kvo__cuda_desc *descs, uint32_t n, uint32_t threads, void *stream);

#ifdef __cplusplus
}
#endif
#endif
