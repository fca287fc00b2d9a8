/*
 * `kvoffload bench transfer --device cuda [--json] [--layout LxP[,LxP...]]
 * [--total-mib N] [--reps N] [--threads N] [--device-index N]`: store
 * (device -> pinned slots) and load (pinned slots -> device) bandwidth of the
 * transfer engine on the CUDA device at an engine's shapes, each against two
 * limits measured in the same run over the same bytes:
 *   - one contiguous cuMemcpyAsync of the same number of bytes between the
 *     same two buffers (all layer tensors are slices of one allocation, the
 *     slots one pinned region), in the same direction, on a stream of its
 *     own: what the link gives;
 *   - vLLM's way: one cuMemcpyBatchAsync per job over every piece (each
 *     layer's page of each block), with vLLM 0.33's source order (ANY for
 *     loads, STREAM for stores); one cuMemcpyAsync per piece where the
 *     driver has no batches, as vLLM falls back to.
 * Every figure is timed on the host from enqueue to completion, the best of
 * --reps rounds; limits and jobs alternate which runs first.
 *
 * Shapes (--layout, default all four): LAYERS x PAGE, e.g. 64x32KiB (a
 * Llama-8B-like model: 64 K/V layer tensors of 32 KiB pages), 160x8KiB (70B
 * at tensor parallel 4), 61x18KiB (an MLA model), 1x2MiB (one cross-layer
 * tensor).  Setup per shape: LAYERS segments of nb = total / (LAYERS x PAGE)
 * blocks, the engine blocks of a job shuffled so that no two are adjacent
 * (nothing merges), chunks of 16 blocks, one job moving every block.
 * Figures: transfer.cuda.<store|load>.<shape> (ratio to the contiguous
 * copy), .vs_vllm (the same figure, ratio to vLLM's way), .vllm_way (vLLM's
 * way itself against the contiguous copy); loads whose pages go to the
 * kernel are also run without it (.copy_engine_only) and stores with it
 * (.kernel_stores), so the run shows which path is faster.  Goals
 * (docs/gpu.md; tools/gpu-check.sh enforces them): >= 0.85 of the
 * contiguous copy and >= 1.0 of vLLM's way, each shape and direction.
 *
 * Without the CUDA device in the build, or without a usable GPU, it prints
 * one line saying it was skipped and why (with --json: a record with
 * "skipped") and exits 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_transfer.h"
#include "cli.h"

/* Prints the skip line; exit status 0. */
static int kvo__bcuda_skip(const kvo_bench_out *o, const char *why) {
    if (!o->json) {
        printf("kvoffload bench transfer --device cuda: skipped: %s\n", why);
        return KVO_EXIT_OK;
    }
    printf("{\"name\":\"transfer.cuda\",\"skipped\":\"");
    for (const char *c = why; *c; c++) {
        if (*c == '"' || *c == '\\') putchar('\\');
        putchar((unsigned char)*c >= 32 ? *c : ' ');
    }
    printf("\"}\n");
    return KVO_EXIT_OK;
}

/* "64x32KiB" -> layers, page bytes. */
static int kvo__bcuda_shape(const char *s, uint32_t *layers, uint64_t *page) {
    char *end;
    unsigned long l = strtoul(s, &end, 10);
    if (end == s || (*end != 'x' && *end != 'X') || l < 1 || l > 4096) return -1;
    const char *q = end + 1;
    unsigned long long v = strtoull(q, &end, 10);
    if (end == q || v < 1) return -1;
    if (!strcmp(end, "KiB") || !strcmp(end, "K") || !strcmp(end, "k")) v <<= 10;
    else if (!strcmp(end, "MiB") || !strcmp(end, "M")) v <<= 20;
    else if (*end && strcmp(end, "B")) return -1;
    *layers = (uint32_t)l;
    *page = v;
    return 0;
}

#if KVO_HAVE_CUDA
#include "kvoffload/kvo_cuda.h"
#include "transfer/cuda/cuda_driver.h"

typedef struct kvo__bcuda {
    const kvo__cu_api *cu;
    CUstream s;
    unsigned char *dev, *slots; /* dev: every layer tensor, back to back; slots: pinned */
    uint64_t total;
    CUdeviceptr *bd, *bs;       /* vLLM's way: one piece per (chunk, layer, block) */
    size_t *bz, n;
} kvo__bcuda;

static int kvo__bcuda_fail(CUresult e, const char *what) {
    fprintf(stderr, "kvoffload bench transfer --device cuda: %s: %s (%s)\n", what, kvo__cu_name(e), kvo__cu_text(e));
    return -1;
}

/* Seconds of one contiguous copy of n bytes in direction dir. */
static double kvo__bcuda_contig(kvo__bcuda *b, int dir, uint64_t n, int *err) {
    double t0 = kvo_bench_now();
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)b->dev, h = (CUdeviceptr)(uintptr_t)b->slots;
    CUresult e = b->cu->cuMemcpyAsync(dir == KVO_XFER_STORE ? h : d, dir == KVO_XFER_STORE ? d : h, n, b->s);
    if (e == CUDA_SUCCESS) e = b->cu->cuStreamSynchronize(b->s);
    if (e != CUDA_SUCCESS) *err = kvo__bcuda_fail(e, "contiguous cuMemcpyAsync");
    return kvo_bench_now() - t0;
}

/* Seconds of vLLM's way over the pieces b->b{d,s,z} (stored for a store:
 * for a load the two sides swap). */
static double kvo__bcuda_vllm(kvo__bcuda *b, int dir, int *err) {
    kvo__cu_memcpy_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = dir == KVO_XFER_LOAD ? CU_MEMCPY_SRC_ACCESS_ORDER_ANY : CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    CUdeviceptr *dst = dir == KVO_XFER_STORE ? b->bd : b->bs, *src = dir == KVO_XFER_STORE ? b->bs : b->bd;
    size_t idx = 0, fail = 0;
    double t0 = kvo_bench_now();
    CUresult e = CUDA_SUCCESS;
    if (b->cu->cuMemcpyBatchAsync)
        e = b->cu->cuMemcpyBatchAsync(dst, src, b->bz, b->n, &attr, &idx, 1, &fail, b->s);
    else
        for (size_t i = 0; i < b->n && e == CUDA_SUCCESS; i++) e = b->cu->cuMemcpyAsync(dst[i], src[i], b->bz[i], b->s);
    if (e == CUDA_SUCCESS) e = b->cu->cuStreamSynchronize(b->s);
    if (e != CUDA_SUCCESS) *err = kvo__bcuda_fail(e, "vLLM's way (cuMemcpyBatchAsync)");
    return kvo_bench_now() - t0;
}

/* One shape with the context params cp: the best seconds of the job (and
 * the limits when want_limits) per direction; bytes moved in *bytes. */
static int kvo__bcuda_shape_run(kvo__bcuda *b, const kvo_cuda_params *cp, uint32_t L, uint64_t P, uint64_t reps,
                                uint32_t threads, bool want_limits, double best[3][2], uint64_t *bytes) {
    enum { BPC = 16 };
    uint64_t nb = b->total / ((uint64_t)L * P);
    nb -= nb % BPC;
    if (nb < BPC) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: %ux%llu: --total-mib is too small for one chunk\n",
                L, (unsigned long long)P);
        return -1;
    }
    /* One group of one "layer" of L x P bytes: its L segments of P-byte
     * pages fill a slot exactly as L layers would (segment-major). */
    kvo_plan *plan = kvo_bench_plan_one("bench-transfer-cuda", (uint64_t)L * P, BPC);
    kvo_cuda *cu = NULL;
    kvo_transfer *t = NULL;
    int rc = plan ? kvo_cuda_create(cp, &cu) : KVO_EINVAL;
    if (!rc) rc = kvo_cuda_pin_host(cu, b->slots, b->total);
    if (!rc) {
        kvo_transfer_params tp = kvo_transfer_default_params();
        tp.plan = plan;
        tp.threads = threads;
        tp.device = "cuda";
        tp.device_index = cp->device_index;
        rc = kvo_transfer_create(&tp, &t);
    }
    kvo_segment *segs = calloc(L, sizeof *segs);
    uint64_t *ids = malloc(sizeof *ids * nb);
    uint64_t sb = plan ? kvo_plan_group(plan, 0)->slot_bytes : 0;
    size_t n_ops = (size_t)(nb / BPC);
    while (n_ops && n_ops * sb > b->total) n_ops--; /* slots rounded up past the region */
    kvo_xfer_op *ops = calloc(n_ops ? n_ops : 1, sizeof *ops);
    if (!rc && (!segs || !ids || !ops)) rc = KVO_ENOMEM;
    if (!rc) {
        for (uint32_t l = 0; l < L; l++) segs[l] = (kvo_segment){0, b->dev + (uint64_t)l * nb * P, nb, P, P};
        rc = kvo_transfer_set_layout(t, segs, L);
    }
    if (!rc) {
        /* ids: the even blocks, then the odd ones: no two neighbours
         * adjacent in a tensor (nothing merges). */
        for (uint64_t i = 0; i < nb; i++) ids[i] = i < (nb + 1) / 2 ? 2 * i : 2 * (i - (nb + 1) / 2) + 1;
        for (size_t c = 0; c < n_ops; c++)
            ops[c] = (kvo_xfer_op){0, 0, BPC, ids + c * BPC, b->slots + c * sb, sb};
        /* vLLM's way: the same pieces, one per (chunk, layer, block). */
        b->n = 0;
        for (size_t c = 0; c < n_ops; c++)
            for (uint32_t l = 0; l < L; l++)
                for (uint32_t k = 0; k < BPC; k++) {
                    b->bd[b->n] = (CUdeviceptr)(uintptr_t)(b->dev + (uint64_t)l * nb * P + ids[c * BPC + k] * P);
                    b->bs[b->n] = (CUdeviceptr)(uintptr_t)(b->slots + c * sb + ((uint64_t)BPC * l + k) * P);
                    b->bz[b->n++] = (size_t)P;
                }
        *bytes = (uint64_t)n_ops * BPC * L * P;
    }
    for (int k = 0; k < 3; k++) best[k][0] = best[k][1] = 1e30;
    int err = 0;
    for (uint64_t r = 0; r < reps && !rc && !err; r++)
        for (int dir = 0; dir < 2 && !rc && !err; dir++)
            for (int half = 0; half < 2 && !rc && !err; half++) {
                if ((half == 0) == (r % 2 == 0)) {
                    if (!want_limits) continue;
                    double d = kvo__bcuda_contig(b, dir, *bytes, &err);
                    if (d < best[1][dir]) best[1][dir] = d;
                    d = kvo__bcuda_vllm(b, dir, &err);
                    if (d < best[2][dir]) best[2][dir] = d;
                } else {
                    uint64_t got = 0;
                    double d;
                    rc = kvo__bjob_time(t, &(kvo__bsetup){plan, ops, ids, n_ops}, (kvo_xfer_dir)dir, 1, &d, &got);
                    if (!rc && got != *bytes) rc = KVO_ESTATE;
                    if (d < best[0][dir]) best[0][dir] = d;
                }
            }
    if (rc)
        fprintf(stderr, "kvoffload bench transfer --device cuda: %ux%llu: %s\n", L, (unsigned long long)P,
                kvo_last_error());
    kvo_transfer_destroy(t);
    kvo_cuda_destroy(cu); /* unpins the slots */
    free(segs);
    free(ids);
    free(ops);
    kvo_plan_destroy(plan);
    return rc || err ? -1 : 0;
}

static void kvo__bcuda_report(const kvo_bench_out *o, const char *base, const char *suffix, uint64_t bytes,
                              double job, double contig, double vllm, bool vs_vllm, const char *vllm_name) {
    char name[160];
    double gbs = (double)bytes / job / 1e9, lc = (double)bytes / contig / 1e9, lv = (double)bytes / vllm / 1e9;
    snprintf(name, sizeof name, "%s%s", base, suffix);
    kvo_bench_report(o, name, gbs, "GB/s", "contiguous_cuMemcpyAsync_same_bytes", lc);
    if (vs_vllm) {
        snprintf(name, sizeof name, "%s%s.vs_vllm", base, suffix);
        kvo_bench_report(o, name, gbs, "GB/s", vllm_name, lv);
    }
}

int kvo_bench_transfer_cuda(int argc, char **argv, const kvo_bench_out *o) {
    uint64_t total_mib = 1024, reps = 5, threads = 2, index = 0;
    const char *layouts = "64x32KiB,160x8KiB,61x18KiB,1x2MiB";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) continue;
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            i++;
        } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
            layouts = argv[++i];
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
                            "--layout LxP[,LxP...] (64x32KiB,160x8KiB,61x18KiB,1x2MiB) --total-mib N (1024) "
                            "--reps N (5) --threads N (2) --device-index N (0))\n", argv[i]);
            return KVO_EXIT_USAGE;
        }
    }
    /* The shapes, checked before any device is touched. */
    uint32_t Ls[16];
    uint64_t Ps[16];
    size_t ns = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", layouts);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (ns == 16 || kvo__bcuda_shape(tok, &Ls[ns], &Ps[ns])) {
            fprintf(stderr, "kvoffload bench transfer --device cuda: --layout: '%s' is not LAYERSxPAGE (e.g. "
                            "64x32KiB; at most 16 shapes)\n", tok);
            return KVO_EXIT_USAGE;
        }
        ns++;
    }
    int count = 0;
    if (kvo_cuda_device_count(&count)) return kvo__bcuda_skip(o, kvo_last_error());
    if ((int)index >= count) return kvo__bcuda_skip(o, "--device-index is not a device here");
    kvo__bcuda b;
    memset(&b, 0, sizeof b);
    if (kvo__cu_get(&b.cu)) return kvo__bcuda_skip(o, kvo_last_error());
    b.total = total_mib << 20;
    CUdevice dev;
    CUcontext ctx = NULL, popped;
    CUdeviceptr d = 0;
    CUresult e = b.cu->cuDeviceGet(&dev, (int)index);
    if (e == CUDA_SUCCESS) e = b.cu->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (e == CUDA_SUCCESS) e = b.cu->cuCtxPushCurrent(ctx);
    if (e == CUDA_SUCCESS) e = b.cu->cuMemAlloc(&d, b.total);
    if (e == CUDA_SUCCESS) e = b.cu->cuMemsetD8(d, 0x5a, b.total);
    if (e == CUDA_SUCCESS) e = b.cu->cuStreamCreate(&b.s, CU_STREAM_NON_BLOCKING);
    b.dev = (unsigned char *)(uintptr_t)d;
    /* vLLM's way's pieces: at most total / smallest page. */
    uint64_t minp = Ps[0];
    for (size_t i = 1; i < ns; i++) minp = Ps[i] < minp ? Ps[i] : minp;
    size_t maxn = (size_t)(b.total / minp) + 1;
    b.bd = malloc(maxn * sizeof *b.bd);
    b.bs = malloc(maxn * sizeof *b.bs);
    b.bz = malloc(maxn * sizeof *b.bz);
    int ret = KVO_EXIT_OK;
    if (e != CUDA_SUCCESS) {
        kvo__bcuda_fail(e, "allocating the device tensor");
        ret = KVO_EXIT_FAIL;
    } else if (posix_memalign((void **)&b.slots, 2 << 20, b.total) || !b.bd || !b.bs || !b.bz) {
        fprintf(stderr, "kvoffload bench transfer --device cuda: out of host memory for %llu MiB\n",
                (unsigned long long)total_mib);
        ret = KVO_EXIT_FAIL;
    } else {
        memset(b.slots, 0, b.total); /* pre-fault */
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.device_index = (int)index;
    const char *vllm_name = b.cu->cuMemcpyBatchAsync ? "vllm_one_cuMemcpyBatchAsync_per_job"
                                                     : "vllm_one_cuMemcpyAsync_per_piece";
    for (size_t si = 0; si < ns && ret == KVO_EXIT_OK; si++) {
        uint32_t L = Ls[si];
        uint64_t P = Ps[si], bytes = 0;
        double best[3][2];
        char base[96];
        kvo_bench_progress(o, "cuda:%d, %u layers x %llu KiB pages", cp.device_index, L, (unsigned long long)(P >> 10));
        if (kvo__bcuda_shape_run(&b, &cp, L, P, reps, (uint32_t)threads, true, best, &bytes)) {
            ret = KVO_EXIT_FAIL;
            break;
        }
        for (int dir = 0; dir < 2; dir++) {
            snprintf(base, sizeof base, "transfer.cuda.%s.%ux%lluKiB", dir ? "load" : "store", L,
                     (unsigned long long)(P >> 10));
            kvo__bcuda_report(o, base, "", bytes, best[0][dir], best[1][dir], best[2][dir], true, vllm_name);
            char name[160];
            snprintf(name, sizeof name, "%s.vllm_way", base);
            kvo_bench_report(o, name, (double)bytes / best[2][dir] / 1e9, "GB/s",
                             "contiguous_cuMemcpyAsync_same_bytes", (double)bytes / best[1][dir] / 1e9);
        }
        /* The other path for pages the kernel takes: which is faster is
         * measured, not assumed (informational, no goal). */
        if (P <= cp.kernel_max_bytes) {
            kvo_cuda_params alt = cp;
            alt.kernel_max_bytes = 0;
            double ab[3][2];
            uint64_t ab_bytes = 0;
            if (kvo__bcuda_shape_run(&b, &alt, L, P, reps, (uint32_t)threads, false, ab, &ab_bytes)) {
                ret = KVO_EXIT_FAIL;
                break;
            }
            snprintf(base, sizeof base, "transfer.cuda.load.%ux%lluKiB", L, (unsigned long long)(P >> 10));
            kvo__bcuda_report(o, base, ".copy_engine_only", ab_bytes, ab[0][1], best[1][1], best[2][1], false, NULL);
            alt = cp;
            alt.kernel_stores = true;
            if (kvo__bcuda_shape_run(&b, &alt, L, P, reps, (uint32_t)threads, false, ab, &ab_bytes)) {
                ret = KVO_EXIT_FAIL;
                break;
            }
            snprintf(base, sizeof base, "transfer.cuda.store.%ux%lluKiB", L, (unsigned long long)(P >> 10));
            kvo__bcuda_report(o, base, ".kernel_stores", ab_bytes, ab[0][0], best[1][0], best[2][0], false, NULL);
        }
    }
    if (b.s) b.cu->cuStreamDestroy(b.s);
    if (d) b.cu->cuMemFree(d);
    if (ctx) {
        b.cu->cuCtxPopCurrent(&popped);
        b.cu->cuDevicePrimaryCtxRelease(dev);
    }
    free(b.slots);
    free(b.bd);
    free(b.bs);
    free(b.bz);
    return ret;
}

#else

int kvo_bench_transfer_cuda(int argc, char **argv, const kvo_bench_out *o) {
    for (int i = 1; i < argc; i++) {
        uint32_t l;
        uint64_t p;
        if (!strcmp(argv[i], "--layout") && i + 1 < argc && kvo__bcuda_shape(argv[i + 1], &l, &p) &&
            !strchr(argv[i + 1], ',')) {
            fprintf(stderr, "kvoffload bench transfer --device cuda: --layout: '%s' is not LAYERSxPAGE\n",
                    argv[i + 1]);
            return KVO_EXIT_USAGE;
        }
    }
    return kvo__bcuda_skip(o, "built without the CUDA device (configure with -DKVO_CUDA=ON or AUTO on a machine "
                              "with the CUDA toolkit)");
}

#endif
