/*
 * CUDA device: the gather/scatter kernel, for jobs of many small pages.
 *
 * One launch copies every small piece of a job (device_cuda.c), pages of
 * every layer: each piece is (dst, src, bytes) between engine memory and a
 * pinned host slot, which the kernel reads or writes over the bus through
 * its mapped address (zero-copy), so a job of thousands of 8-32 KiB pages is
 * one enqueue instead of thousands of copy-engine setups.  vLLM's loads do
 * the same for pages under 28 KiB (a Triton kernel on 12 SMs, tuned on an
 * H100, within 5 % of the link's peak by their figures); the grid here is
 * small for the same reason, so that a load steals few SMs from the forward
 * pass (device_cuda.c picks it).
 *
 * Layout of the work: block b takes the contiguous range of pieces
 * [b*n/grid, (b+1)*n/grid).  Its threads read the range's descriptors
 * KVO__CUDA_KERNEL_THREADS at a time into shared memory (one round trip to
 * host memory per batch, not one per piece), then copy the batch's pieces
 * one after the other, all threads on each: 16-byte words when both
 * addresses and the length are 16-byte aligned (KV pages always are), else
 * 8, 4 or 1.  Each thread loads four words before it stores them, so a
 * block keeps 16 KiB of reads in flight: reads of host memory wait a PCIe
 * round trip each.  Pieces of one launch are disjoint: no ordering between
 * blocks is needed.
 *
 * Built by nvcc --fatbin (several -gencode, plus PTX) and as PTX for old
 * drivers, both embedded in the library as C arrays (CMakeLists.txt); no
 * host code here, nothing that needs the CUDA runtime.
 */
#include "transfer/cuda/kernels.h"

#define KVO__UNROLL 4

template <typename W>
__device__ static void kvo__copy_words(uint64_t dst, uint64_t src, uint64_t bytes) {
    W *d = reinterpret_cast<W *>(dst);
    const W *s = reinterpret_cast<const W *>(src);
    uint64_t n = bytes / sizeof(W), step = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + (KVO__UNROLL - 1) * step < n; i += KVO__UNROLL * step) {
        W r[KVO__UNROLL];
#pragma unroll
        for (int k = 0; k < KVO__UNROLL; k++) r[k] = s[i + k * step];
#pragma unroll
        for (int k = 0; k < KVO__UNROLL; k++) d[i + k * step] = r[k];
    }
    for (; i < n; i += step) d[i] = s[i];
}

__device__ static void kvo__copy_piece(const kvo__cuda_desc &x) {
    uint64_t align = x.dst | x.src | x.bytes;
    if ((align & 15) == 0) kvo__copy_words<uint4>(x.dst, x.src, x.bytes);
    else if ((align & 7) == 0) kvo__copy_words<unsigned long long>(x.dst, x.src, x.bytes);
    else if ((align & 3) == 0) kvo__copy_words<unsigned int>(x.dst, x.src, x.bytes);
    else kvo__copy_words<unsigned char>(x.dst, x.src, x.bytes);
}

extern "C" __global__ void __launch_bounds__(KVO__CUDA_KERNEL_THREADS)
    kvo_copy_pieces(const kvo__cuda_desc *descs, unsigned int n) {
    __shared__ kvo__cuda_desc batch[KVO__CUDA_KERNEL_THREADS];
    unsigned long long lo = (unsigned long long)n * blockIdx.x / gridDim.x;
    unsigned long long hi = (unsigned long long)n * (blockIdx.x + 1) / gridDim.x;
    for (unsigned long long base = lo; base < hi; base += blockDim.x) {
        unsigned int cnt = (unsigned int)(hi - base < blockDim.x ? hi - base : blockDim.x);
        __syncthreads(); /* the previous batch is copied */
        if (threadIdx.x < cnt) batch[threadIdx.x] = descs[base + threadIdx.x];
        __syncthreads();
        for (unsigned int k = 0; k < cnt; k++) kvo__copy_piece(batch[k]);
    }
}
