/*
 * Test-only kernels for tests/test_cuda*.c (never in a library): a kernel
 * that holds its stream for a given time before it writes a pattern, so that
 * an ordering check has something slow to be ordered after, and a missing
 * order shows as the old bytes.  The wait reads the GPU's nanosecond timer
 * (%globaltimer), so it does not depend on the clock rate.
 */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_test_kernels.h"

__global__ static void kvo_test_spin_fill_kernel(unsigned char *dst, int value, size_t bytes,
                                                 unsigned long long ns) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < ns);
    }
    __syncthreads();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += stride)
        dst[i] = (unsigned char)value;
}

extern "C" int kvo_test_spin_fill(void *dst, int value, size_t bytes, uint64_t spin_ns, void *stream) {
    kvo_test_spin_fill_kernel<<<64, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<unsigned char *>(dst), value, bytes, (unsigned long long)spin_ns);
    return static_cast<int>(cudaGetLastError());
}
