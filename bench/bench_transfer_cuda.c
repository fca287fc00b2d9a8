/*
 * `kvoffload bench transfer --device cuda [--json] [--total-mib N]
 * [--reps N] [--threads N] [--device-index N]`: store (device -> pinned slot)
 * and load (pinned slot -> device) bandwidth of the transfer engine on the
 * CUDA device for pages of 16 KiB to 2 MiB, each as a ratio to the limit
 * measured in the same run: one cudaMemcpyAsync of the same number of bytes
 * between the same two buffers (the device tensor and the slot region,
 * pinned with kvo_cuda_pin_host as an engine pins its arena), in the same
 * direction, on a stream of its own, timed from enqueue to completion on the
 * host like the jobs.  Beside it, per page size and direction,
 * ".memcpy_per_page": one cudaMemcpyAsync per page of the same bytes (what
 * issuing one copy per block costs), with the same limit.
 *
 * Setup per page size P: as the host benchmark (bench_transfer.h): one
 * tensor of total/P blocks in device memory, shuffled block ids (no two pages
 * of a chunk adjacent: a true gather/scatter), chunks of about 2 MiB, one job
 * moves every chunk.  Limit and jobs run interleaved, --reps rounds, best of
 * each.  Pages up to the kernel threshold (16 KiB) are also measured with the
 * kernel off (".copy_engine_only"), so the run shows which is faster.
 * Goals (docs/gpu.md, "The GPU check"): >= 0.9 of the limit for pages
 * >= 256 KiB, >= 0.8 at 16 KiB, per direction; the H200's figures are in
 * docs/gpu.md ("Figures").  Each job also pays the engine's fixed cost
 * per job (~0.1-0.3 ms there, estimated from 256 MiB vs 1 GiB runs), so
 * small --total-mib values understate the bandwidth: tools/gpu-check.sh
 * uses 1024.
 *
 * Without CUDA in the build, or without a device, it fails with a message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_transfer.h"
#include "cli.h"

#if KVO_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kvoffload/kvo_cuda.h"

/* Seconds of one cudaMemcpyAsync of n bytes, enqueue to completion. */
static double kvo__bcuda_memcpy_time(void *dst, const void *src, size_t n, cudaStream_t s, int *err) {
    double t0 = kvo_bench_now();
    cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: cudaMemcpyAsync of %zu bytes: %s\n", n,
                cudaGetErrorString(e));
        *err = 1;
    }
    return kvo_bench_now() - t0;
}

/* Seconds of one cudaMemcpyAsync per page for n bytes of page-byte pages
 * (page i to page i), enqueue to completion: what a connector issuing one
 * copy per block gets. */
static double kvo__bcuda_per_page_time(unsigned char *dst, const unsigned char *src, size_t n, size_t page,
                                       cudaStream_t s, int *err) {
    double t0 = kvo_bench_now();
    cudaError_t e = cudaSuccess;
    for (size_t off = 0; off < n && e == cudaSuccess; off += page)
        e = cudaMemcpyAsync(dst + off, src + off, page, cudaMemcpyDefault, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: per-page cudaMemcpyAsync of %zu bytes: %s\n", n,
                cudaGetErrorString(e));
        *err = 1;
    }
    return kvo_bench_now() - t0;
}

/* One page size with the context params cp (figure names end in suffix):
 * the limit and the jobs, interleaved. */
static int kvo__bcuda_page(const kvo_bench_out *o, const kvo_cuda_params *cp, const char *suffix, uint64_t page,
                           uint64_t total, uint64_t reps, uint32_t threads, unsigned char *dev, unsigned char *slots,
                           cudaStream_t s) {
    int index = cp->device_index;
    kvo_bench_progress(o, "cuda:%d, %llu KiB pages%s", index, (unsigned long long)(page >> 10), suffix);
    kvo__bsetup b;
    memset(&b, 0, sizeof b);
    kvo_cuda *cu = NULL;
    int rc = kvo_cuda_create(cp, &cu);
    /* The slots are pinned the way an engine pins its arena (the context
     * unpins them when it is freed, below). */
    if (!rc) rc = kvo_cuda_pin_host(cu, slots, total);
    if (!rc) rc = kvo__bsetup_make(&b, page, total, slots);
    kvo_transfer *t = NULL;
    if (!rc) {
        kvo_transfer_params tp = kvo_transfer_default_params();
        tp.plan = b.plan;
        tp.threads = threads;
        tp.device = "cuda";
        tp.device_index = index;
        rc = kvo_transfer_create(&tp, &t);
    }
    kvo_segment seg = {0, dev, total / page, page, page};
    if (!rc) rc = kvo_transfer_set_layout(t, &seg, 1);
    double best[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30}; /* limit store/load, job store/load, per page */
    uint64_t bytes[2] = {0, 0};
    int err = 0;
    for (uint64_t r = 0; r < reps && !rc && !err; r++) {
        for (int dir = 0; dir < 2 && !rc && !err; dir++) {
            uint64_t n = (uint64_t)b.n_ops * kvo_plan_group(b.plan, 0)->chunk_bytes;
            double d = dir == KVO_XFER_STORE ? kvo__bcuda_memcpy_time(slots, dev, n, s, &err)
                                             : kvo__bcuda_memcpy_time(dev, slots, n, s, &err);
            if (d < best[dir]) best[dir] = d;
            rc = kvo__bjob_time(t, &b, (kvo_xfer_dir)dir, 1, &d, &bytes[dir]);
            if (d < best[2 + dir]) best[2 + dir] = d;
            if (!*suffix) { /* the per-page baseline once per page size */
                d = dir == KVO_XFER_STORE ? kvo__bcuda_per_page_time(slots, dev, n, page, s, &err)
                                          : kvo__bcuda_per_page_time(dev, slots, n, page, s, &err);
                if (d < best[4 + dir]) best[4 + dir] = d;
            }
        }
    }
    if (!rc && !err) {
        char name[128];
        for (int dir = 0; dir < 2; dir++) {
            double limit = (double)bytes[dir] / best[dir] / 1e9;
            snprintf(name, sizeof name, "transfer.cuda.%s.page_%lluKiB.threads_%u%s", dir ? "load" : "store",
                     (unsigned long long)(page >> 10), threads, suffix);
            kvo_bench_report(o, name, (double)bytes[dir] / best[2 + dir] / 1e9, "GB/s",
                             dir ? "cudaMemcpyAsync_h2d_same_bytes" : "cudaMemcpyAsync_d2h_same_bytes", limit);
            if (!*suffix) {
                uint64_t n = (uint64_t)b.n_ops * kvo_plan_group(b.plan, 0)->chunk_bytes;
                snprintf(name, sizeof name, "transfer.cuda.%s.page_%lluKiB.memcpy_per_page", dir ? "load" : "store",
                         (unsigned long long)(page >> 10));
                kvo_bench_report(o, name, (double)n / best[4 + dir] / 1e9, "GB/s",
                                 dir ? "cudaMemcpyAsync_h2d_same_bytes" : "cudaMemcpyAsync_d2h_same_bytes", limit);
            }
        }
    } else if (rc) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: page %llu: %s\n", (unsigned long long)page,
                kvo_last_error());
    }
    kvo_transfer_destroy(t);
    if (b.plan) kvo__bsetup_free(&b);
    kvo_cuda_destroy(cu);
    return rc || err ? KVO_EXIT_FAIL : KVO_EXIT_OK;
}

int kvo_bench_transfer_cuda(int argc, char **argv, const kvo_bench_out *o) {
    uint64_t total_mib = 256, reps = 5, threads = 2, index = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) continue;
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            i++;
        } else if (!strcmp(argv[i], "--total-mib") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--total-mib", argv[++i], 4, 1 << 16, &total_mib)) return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--reps", argv[++i], 1, 1000, &reps)) return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--threads", argv[++i], 1, KVO_TRANSFER_MAX_THREADS, &threads))
                return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--device-index") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--device-index", argv[++i], 0, 63, &index)) return KVO_EXIT_USAGE;
        } else {
            fprintf(stderr, "kvoffload bench transfer --device cuda: unknown argument '%s' (options: --json "
                            "--total-mib N (256) --reps N (5) --threads N (2) --device-index N (0))\n", argv[i]);
            return KVO_EXIT_USAGE;
        }
    }
    int count = 0;
    if (kvo_cuda_device_count(&count)) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: %s\n", kvo_last_error());
        return KVO_EXIT_FAIL;
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.device_index = (int)index;
    uint64_t total = total_mib << 20;
    unsigned char *dev = NULL, *slots = NULL;
    cudaStream_t s = NULL;
    cudaError_t e = cudaMalloc((void **)&dev, total);
    if (e == cudaSuccess && posix_memalign((void **)&slots, 2 << 20, total)) e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMemset(dev, 0x5a, total);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int ret = KVO_EXIT_OK;
    if (e != cudaSuccess) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: allocating 2 x %llu MiB: %s\n",
                (unsigned long long)total_mib, cudaGetErrorString(e));
        ret = KVO_EXIT_FAIL;
    } else {
        memset(slots, 0, total); /* pre-fault */
    }
    static const uint64_t pages[] = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20};
    for (size_t pi = 0; pi < sizeof pages / sizeof pages[0] && ret == KVO_EXIT_OK; pi++) {
        ret = kvo__bcuda_page(o, &cp, "", pages[pi], total, reps, (uint32_t)threads, dev, slots, s);
        if (ret == KVO_EXIT_OK && pages[pi] <= cp.kernel_max_bytes) {
            /* The same pages without the gather/scatter kernel: whether the
             * kernel is faster is measured, not assumed. */
            kvo_cuda_params ce = cp;
            ce.kernel_max_bytes = 0;
            ret = kvo__bcuda_page(o, &ce, ".copy_engine_only", pages[pi], total, reps, (uint32_t)threads, dev,
                                  slots, s);
        }
    }
    if (s) cudaStreamDestroy(s);
    free(slots);
    if (dev) cudaFree(dev);
    return ret;
}

#else

int kvo_bench_transfer_cuda(int argc, char **argv, const kvo_bench_out *o) {
    (void)argc;
    (void)argv;
    (void)o;
    fprintf(stderr, "kvoffload bench transfer: --device cuda needs a build with the CUDA device "
                    "(configure with -DKVO_CUDA=ON or AUTO on a machine with the CUDA toolkit)\n");
    return KVO_EXIT_FAIL;
}

#endif
