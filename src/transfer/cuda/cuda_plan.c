/*
 * CUDA device: how the copies of one job are issued.
 *
 * The CUDA device takes whole jobs (device.h, whole_jobs): the transfer core
 * hands it every piece of a job, across all of the engine's segments (one
 * per layer tensor in vLLM), already merged where the engine side is
 * adjacent.  The device collects them and, once per job, plans them here,
 * then enqueues them on its stream for the direction:
 *
 *   1. Coalesce: a piece that continues the previous one on both sides joins
 *      it (one copy instead of two; the core already does this within a
 *      segment, this also catches pieces handed over separately).
 *   2. Small pieces (<= kernel_max_bytes) go to one gather/scatter kernel
 *      launch when the job has at least kernel_min_pieces of them: a
 *      copy-engine copy costs microseconds of setup, so thousands of 8-32
 *      KiB pages are faster as one kernel that reads or writes the pinned
 *      slots over the bus (kernels.cu).  At most kernel_cap pieces per
 *      launch; any excess goes to the copy engine.
 *   3. The remaining pieces use the copy engine: one cuMemcpyBatchAsync when
 *      the driver has it (CUDA 12.8+) and two or more are left, else one
 *      cuMemcpyAsync each.
 *
 * So a job is at most one kernel launch and one batched copy, whatever the
 * number of layers, and the device waits once for it (one event).
 *
 * Invariants (tests/test_transfer_cuda_plan.c): every byte of the input is
 * in exactly one piece of the output; kernel pieces are all <=
 * kernel_max_bytes; n_kernel + n_copy = the coalesced count.  No allocation:
 * the partition is in place (order within a job is free because its pieces
 * are disjoint).  This file needs no CUDA header, so the decisions are
 * tested on every build.  The default thresholds (28 KiB, 16 pieces) are
 * vLLM's, tuned on an H100 for its zero-copy load kernel; nothing has
 * measured them for this kernel yet (docs/gpu.md).
 */
#include "transfer/cuda/cuda_plan.h"

/* Thread blocks per launch: few, so that a load takes few SMs from the
 * engine's forward pass (vLLM's load kernel uses 12); each keeps 16 KiB of
 * reads in flight (kernels.cu), 256 KiB in all, above PCIe Gen5's bandwidth
 * times its latency (~55 GB/s x 2-4 us). */
#define KVO__CUDA_KERNEL_BLOCKS 16

kvo__cuda_plan_cfg kvo__cuda_plan_default_cfg(bool batch_ok) {
    kvo__cuda_plan_cfg c;
    c.kernel_max_bytes = 28 << 10;
    c.kernel_min_pieces = 16;
    c.kernel_cap = 1u << 24;
    c.batch = batch_ok;
    return c;
}

size_t kvo__cuda_coalesce(kvo__cuda_piece *p, size_t n) {
    if (n == 0) return 0;
    size_t o = 0;
    for (size_t i = 1; i < n; i++) {
        kvo__cuda_piece *last = &p[o];
        if (p[i].dst == last->dst + last->bytes && p[i].src == last->src + last->bytes &&
            p[i].hdelta == last->hdelta) {
            last->bytes += p[i].bytes;
            continue;
        }
        p[++o] = p[i];
    }
    return o + 1;
}

void kvo__cuda_plan_make(const kvo__cuda_plan_cfg *cfg, kvo__cuda_piece *p, size_t n, kvo__cuda_plan *out) {
    size_t small = 0;
    if (cfg->kernel_max_bytes && cfg->kernel_cap) {
        /* Small pieces to the front. */
        for (size_t i = 0; i < n; i++) {
            if (p[i].bytes > cfg->kernel_max_bytes) continue;
            if (i != small) {
                kvo__cuda_piece t = p[i];
                p[i] = p[small];
                p[small] = t;
            }
            small++;
        }
    }
    size_t nk = small < cfg->kernel_min_pieces ? 0 : small;
    if (nk > cfg->kernel_cap) nk = cfg->kernel_cap;
    out->n_kernel = nk;
    out->n_copy = n - nk;
    out->batched = cfg->batch && out->n_copy >= 2;
}

uint32_t kvo__cuda_kernel_grid(size_t n) {
    return n < KVO__CUDA_KERNEL_BLOCKS ? (uint32_t)n : KVO__CUDA_KERNEL_BLOCKS;
}
