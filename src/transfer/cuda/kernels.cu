/*
 * CUDA device: one gather/scatter kernel for small pages.
 *
 * Block b copies piece b (descs[b]); its threads stride over the piece in
 * 16-byte words when both addresses and the length are 16-byte aligned (KV
 * pages always are), else in 8-byte words when 8-aligned, else bytewise.  One
 * side is the engine's device memory, the other either the worker's staging
 * buffer in device memory (which one copy-engine copy fills from, or empties
 * into, the unit's contiguous slot span: device_cuda.c) or a pinned host
 * slot reached over the bus (mapped registered memory); either way a launch
 * of n blocks moves n pages with one enqueue instead of n copy-engine
 * setups.  Pieces of one launch are
 * disjoint: no ordering between blocks is needed.
 */
#include <cuda_runtime.h>

#include "transfer/cuda/kernels.h"

template <typename W>
__device__ static void kvo__copy_words(uint64_t dst, uint64_t src, uint64_t bytes) {
    W *d = reinterpret_cast<W *>(dst);
    const W *s = reinterpret_cast<const W *>(src);
    uint64_t n = bytes / sizeof(W);
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

__global__ static void kvo__copy_kernel(const kvo__cuda_desc *descs, uint32_t n) {
    if (blockIdx.x >= n) return;
    kvo__cuda_desc x = descs[blockIdx.x];
    uint64_t align = x.dst | x.src | x.bytes;
    if ((align & 15) == 0) kvo__copy_words<uint4>(x.dst, x.src, x.bytes);
    else if ((align & 7) == 0) kvo__copy_words<unsigned long long>(x.dst, x.src, x.bytes);
    else kvo__copy_words<unsigned char>(x.dst, x.src, x.bytes);
}

extern "C" int kvo__cuda_launch_copy(const kvo__cuda_desc *descs, uint32_t n, uint32_t threads, void *stream) {
    if (n == 0) return 0;
    kvo__copy_kernel<<<n, threads, 0, static_cast<cudaStream_t>(stream)>>>(descs, n);
    return static_cast<int>(cudaGetLastError());
}
