/*
 * CUDA device: how the copies of one work unit are issued.
 *
 * The transfer core hands the device a work unit as a run of copy() calls
 * (already merged where the engine side is adjacent; the slot side of a unit
 * is contiguous).  The CUDA device collects them as pieces and, at unit_end,
 * plans them here, then enqueues them on its stream for the direction:
 *
 *   1. Coalesce: a piece that continues the previous one on both sides joins
 *      it (one copy instead of two; the core already does this for the
 *      common case, this also catches pieces handed over separately).
 *   2. Small pieces (<= kernel_max_bytes, default 16 KiB) go to one
 *      gather/scatter kernel launch when the unit has at least
 *      kernel_min_pieces of them: a copy-engine copy costs a few
 *      microseconds of setup each, so dozens of 16 KiB pages are faster as
 *      one kernel (one block per piece, 16-byte accesses) that scatters or
 *      gathers them between the pages and a staging buffer moved by one
 *      copy-engine copy (or, when the slot side is not one pinned span,
 *      reads/writes the pinned slot over the bus directly; device_cuda.c).  At most
 *      kernel_cap pieces per launch (the size of the descriptor buffer); any
 *      excess goes to the copy engine.
 *   3. The remaining pieces use the copy engine: one cudaMemcpyBatchAsync
 *      when the runtime has it and at least batch_min_pieces are left, else
 *      one cudaMemcpyAsync each.
 *
 * Invariants (tests/test_transfer_cuda_plan.c): every byte of the input is
 * in exactly one piece of the output; kernel pieces are all <=
 * kernel_max_bytes; n_kernel + n_copy = the coalesced count.  No allocation:
 * the partition is in place (two-pointer swap; order within a unit is free
 * because its pieces are disjoint).  This file needs no CUDA header, so the
 * decisions are tested on every build.  The thresholds are defaults picked
 * from the usual figures (copy-engine setup of about 2-5 us, PCIe Gen4/5);
 * no GPU has measured them here yet (docs/gpu.md).
 */
#include "transfer/cuda/cuda_plan.h"

kvo__cuda_plan_cfg kvo__cuda_plan_default_cfg(bool batch_ok) {
    kvo__cuda_plan_cfg c;
    c.kernel_max_bytes = 16384;
    c.kernel_min_pieces = 4;
    c.kernel_cap = 1024;
    c.batch = batch_ok;
    c.batch_min_pieces = 2;
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
    out->batched = cfg->batch && out->n_copy >= cfg->batch_min_pieces && out->n_copy >= 2;
}

uint32_t kvo__cuda_kernel_threads(uint64_t max_piece_bytes) {
    uint64_t words = (max_piece_bytes + 15) / 16;
    uint32_t t = 32;
    while (t < 256 && t < words) t *= 2;
    return t;
}
