/* Test-only kernels (tests/cuda_test_kernels.cu), callable from C. */
#ifndef KVO_CUDA_TEST_KERNELS_H
#define KVO_CUDA_TEST_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue on stream (a cudaStream_t): hold it for spin_ns nanoseconds of GPU
 * time, then set bytes bytes at dst (device memory) to value.  Returns the
 * cudaError_t of the launch. */
int kvo_test_spin_fill(void *dst, int value, size_t bytes, uint64_t spin_ns, void *stream);

#ifdef __cplusplus
}
#endif
#endif
