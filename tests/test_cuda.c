/*
 * The CUDA transfer device (ctest label "cuda").  Every test that needs a
 * device exits 77 (ctest: skipped) when the build has no CUDA or no device
 * is visible; no_device_fails_cleanly checks the error path in exactly those
 * cases.  tools/gpu-check.sh runs these on a GPU machine.
 */
#include <stdlib.h>

#include "cuda_test_util.h"

KVO_TEST(no_device_fails_cleanly) {
    kvo_model *m;
    ASSERT_OK(kvo_model_preset("llama-3.1-8b", &m));
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, NULL, &p));
    kvo_model_destroy(m);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "cuda";
    kvo_transfer *t = NULL;
#if KVO_HAVE_CUDA
    int n = -1;
    if (kvo_cuda_device_count(&n) == 0) {
        kvo_plan_destroy(p);
        SKIP("a CUDA device is present (%d): the no-device path is not reachable", n);
    }
    ASSERT_EQ_INT(n, 0);
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda *cu = NULL;
    ASSERT_ERR(kvo_cuda_create(&cp, &cu), KVO_ENOTSUP);
    ASSERT_NULL(cu);
    ASSERT_CONTAINS(kvo_last_error(), "CUDA device");
    /* The engine's implicit context fails the same way. */
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "transfer device 'cuda'");
#else
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "not built in");
#endif
    ASSERT_NULL(t);
    kvo_plan_destroy(p);
}

#if KVO_HAVE_CUDA

/* Byte-exact device -> slot -> device for every offloaded group of plan:
 * 2 chunks of shuffled engine blocks per group, each layer a segment. */
static void roundtrip_plan(kvo_plan *plan, const char *name) {
    kvo_cuda_params cp = kvo_cuda_default_params();
    cu_env e;
    env_open(&e, plan, &cp);
    size_t ng = kvo_plan_num_groups(plan), nseg = 0;
    uint64_t dev_bytes = 0, slot_total = 0;
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded) continue;
        nseg += gp->layers;
        dev_bytes += (uint64_t)gp->layers * (2 * gp->blocks_per_chunk + 1) * gp->page_bytes;
        slot_total += 2 * gp->slot_bytes;
    }
    kvo_segment *segs = calloc(nseg, sizeof *segs);
    unsigned char *host = malloc(dev_bytes), *back = malloc(dev_bytes), *dev;
    ASSERT_TRUE(segs && host && back);
    CU_OK(cudaMalloc((void **)&dev, dev_bytes));
    xt_fill_random(host, dev_bytes);
    CU_OK(cudaMemcpy(dev, host, dev_bytes, cudaMemcpyHostToDevice));
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = slot_total;
    kvo_arena *arena;
    ASSERT_OK(kvo_arena_create(&ap, &arena));
    ASSERT_OK(kvo_cuda_pin_arena(e.cu, arena));
    unsigned char *slots = kvo_arena_base(arena);
    memset(slots, 0, slot_total);

    /* Layout: group g's layer l tensor holds nb pages back to back. */
    uint64_t off = 0;
    size_t k = 0;
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded) continue;
        uint64_t nb = 2 * gp->blocks_per_chunk + 1;
        for (uint32_t l = 0; l < gp->layers; l++, k++) {
            segs[k] = (kvo_segment){(uint32_t)g, dev + off, nb, gp->page_bytes, gp->page_bytes};
            off += nb * gp->page_bytes;
        }
    }
    ASSERT_OK(kvo_transfer_set_layout(e.t, segs, nseg));

    /* Ops: per group 2 chunks of a random permutation of blocks 0..nb-1. */
    kvo_xfer_op *ops = calloc(2 * ng, sizeof *ops);
    uint64_t **blocks = calloc(ng, sizeof *blocks);
    size_t nops = 0;
    uint64_t soff = 0;
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded) continue;
        uint64_t nb = 2 * gp->blocks_per_chunk + 1;
        blocks[g] = malloc(nb * sizeof(uint64_t));
        for (uint64_t i = 0; i < nb; i++) blocks[g][i] = i;
        for (uint64_t i = nb - 1; i > 0; i--) {
            uint64_t j = kvo_test_rand() % (i + 1), x = blocks[g][i];
            blocks[g][i] = blocks[g][j];
            blocks[g][j] = x;
        }
        for (int c = 0; c < 2; c++) {
            ops[nops++] = (kvo_xfer_op){(uint32_t)g, 0, (uint32_t)gp->blocks_per_chunk,
                                        blocks[g] + c * gp->blocks_per_chunk, slots + soff, gp->slot_bytes};
            soff += gp->slot_bytes;
        }
    }
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, ops, nops), 0);

    /* Slot bytes: segment-major, checked against the host copy. */
    k = 0;
    off = 0;
    for (size_t o = 0; o < nops; o += 2) {
        const kvo_group_plan *gp = kvo_plan_group(plan, ops[o].group);
        uint64_t nb = 2 * gp->blocks_per_chunk + 1;
        for (int c = 0; c < 2; c++)
            for (uint32_t l = 0; l < gp->layers; l++)
                for (uint32_t b = 0; b < gp->blocks_per_chunk; b++) {
                    const unsigned char *want = host + off + (l * nb + ops[o + c].engine_blocks[b]) * gp->page_bytes;
                    const unsigned char *got = ops[o + c].slot + (gp->blocks_per_chunk * l + b) * gp->page_bytes;
                    if (memcmp(want, got, gp->page_bytes))
                        FAILF("%s group %u chunk %d layer %u block %u: slot bytes differ", name, ops[o].group, c, l, b);
                }
        off += (uint64_t)gp->layers * nb * gp->page_bytes;
    }
    /* Back: clear the device, load, compare everything that was stored. */
    CU_OK(cudaMemset(dev, 0, dev_bytes));
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_LOAD, ops, nops), 0);
    CU_OK(cudaMemcpy(back, dev, dev_bytes, cudaMemcpyDeviceToHost));
    off = 0;
    for (size_t o = 0; o < nops; o += 2) {
        const kvo_group_plan *gp = kvo_plan_group(plan, ops[o].group);
        uint64_t nb = 2 * gp->blocks_per_chunk + 1;
        for (uint32_t l = 0; l < gp->layers; l++)
            for (uint64_t b = 0; b < nb; b++) {
                uint64_t at = off + (l * nb + b) * gp->page_bytes;
                bool stored = false;
                for (uint32_t i = 0; i < 2 * gp->blocks_per_chunk; i++) stored |= blocks[ops[o].group][i] == b;
                if (stored ? memcmp(back + at, host + at, gp->page_bytes) : back[at] != 0)
                    FAILF("%s group %u layer %u engine block %llu: %s after the round trip", name, ops[o].group, l,
                          (unsigned long long)b, stored ? "bytes differ" : "written although not loaded");
            }
        off += (uint64_t)gp->layers * nb * gp->page_bytes;
    }
    ASSERT_OK(kvo_cuda_unpin_arena(e.cu, arena));
    kvo_arena_destroy(arena);
    CU_OK(cudaFree(dev));
    for (size_t g = 0; g < ng; g++) free(blocks[g]);
    free(blocks);
    free(ops);
    free(segs);
    free(host);
    free(back);
    env_close(&e);
}

static void t_roundtrip(void) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++) {
        /* The built-in presets equal the files in shared/models
         * (test_model.c), which a GPU machine may not have. */
        kvo_model *m;
        ASSERT_OK(kvo_model_preset(kvo_model_preset_name(i), &m));
        kvo_plan *p;
        ASSERT_OK(kvo_plan_create(m, NULL, &p));
        kvo_model_destroy(m);
        roundtrip_plan(p, kvo_model_preset_name(i));
        printf("round trip ok: %s\n", kvo_model_preset_name(i));
    }
}

/* Small scattered pages (kernel for the load), large scattered pages (batch
 * or single copies), both directions; the counters show which path ran. */
static void paths_case(uint64_t page, int batch, kvo_cuda_stats *st) {
    kvo_plan *plan = xt_one_group_plan(1, page, 16);
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.batch = batch;
    cu_env e;
    env_open(&e, plan, &cp);
    uint64_t nb = 64, bytes = nb * page;
    unsigned char *host = malloc(bytes), *back = malloc(bytes), *dev, *slot;
    CU_OK(cudaMalloc((void **)&dev, bytes));
    CU_OK(cudaHostAlloc((void **)&slot, 16 * page, cudaHostAllocDefault)); /* not via kvo_cuda_pin_* */
    xt_fill_random(host, bytes);
    CU_OK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    kvo_segment seg = {0, dev, nb, page, page};
    ASSERT_OK(kvo_transfer_set_layout(e.t, &seg, 1));
    uint64_t blk[16];
    for (int i = 0; i < 16; i++) blk[i] = (uint64_t)(i * 4 + 1); /* never adjacent */
    kvo_xfer_op op = {0, 0, 16, blk, slot, 16 * page};
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, &op, 1), 0);
    for (int i = 0; i < 16; i++) ASSERT_MEM_EQ(slot + i * page, host + blk[i] * page, page);
    for (int i = 0; i < 16; i++) blk[i] = (uint64_t)(i * 4 + 2);
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_LOAD, &op, 1), 0);
    CU_OK(cudaMemcpy(back, dev, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 16; i++) ASSERT_MEM_EQ(back + blk[i] * page, slot + i * page, page);
    ASSERT_MEM_EQ(back, host, page); /* block 0 untouched */
    ASSERT_OK(kvo_cuda_get_stats(e.cu, st));
    CU_OK(cudaFree(dev));
    CU_OK(cudaFreeHost(slot));
    free(host);
    free(back);
    env_close(&e);
}

static void t_paths(void) {
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    paths_case(4096, -1, &st);
    /* 16 small pages: the load through the kernel, the store through the
     * copy engine; one job, one event each. */
    ASSERT_TRUE(st.kernel_available);
    ASSERT_EQ_U64(st.kernel_launches, 1);
    ASSERT_EQ_U64(st.kernel_pieces, 16);
    ASSERT_EQ_U64(st.units, 2);
    ASSERT_EQ_U64(st.errors, 0);
    paths_case(65536, -1, &st);
    ASSERT_EQ_U64(st.kernel_launches, 0);
    if (st.batch_available) ASSERT_GE_U64(st.batch_calls, 1);
    else ASSERT_GE_U64(st.memcpy_calls, 32);
    paths_case(65536, 0, &st);
    ASSERT_EQ_U64(st.batch_calls, 0);
    ASSERT_EQ_U64(st.memcpy_calls, 32);
}

/* The engine shapes of issue 49 (vLLM: one tensor per layer): two chunks of
 * 8 scattered blocks stored and loaded back byte-exact, each job one batch
 * or one kernel launch over every layer (the fake driver's test counts the
 * same without a GPU: test_transfer_cuda_fake.c). */
static void t_engine_shapes(void) {
    static const struct { uint32_t layers; uint64_t page; } shapes[] = {
        {64, 32 << 10}, {160, 8 << 10}, {61, 18 << 10}, {1, 2 << 20}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        uint32_t L = shapes[si].layers, bpc = 8;
        uint64_t P = shapes[si].page, nb = 24;
        kvo_cuda_params cp = kvo_cuda_default_params();
        cu_env e;
        env_open(&e, xt_one_group_plan(L, P, bpc), &cp);
        unsigned char **dev = calloc(L, sizeof *dev), *host = malloc(L * nb * P), *back = malloc(nb * P);
        kvo_segment *segs = calloc(L, sizeof *segs);
        ASSERT_TRUE(dev && host && back && segs);
        xt_fill_random(host, L * nb * P);
        for (uint32_t l = 0; l < L; l++) {
            CU_OK(cudaMalloc((void **)&dev[l], nb * P));
            CU_OK(cudaMemcpy(dev[l], host + l * nb * P, nb * P, cudaMemcpyHostToDevice));
            segs[l] = (kvo_segment){0, dev[l], nb, P, P};
        }
        ASSERT_OK(kvo_transfer_set_layout(e.t, segs, L));
        uint64_t sb = kvo_plan_group(e.plan, 0)->slot_bytes, ids[24], to[24];
        for (uint64_t i = 0; i < nb; i++) ids[i] = (i * 7 + 3) % nb;
        for (uint64_t i = 0; i < 16; i++) to[i] = ids[(i + 19) % nb];
        kvo_arena_params ap = kvo_arena_default_params();
        ap.bytes = 2 * sb;
        kvo_arena *arena;
        ASSERT_OK(kvo_arena_create(&ap, &arena));
        ASSERT_OK(kvo_cuda_pin_arena(e.cu, arena));
        unsigned char *slots = kvo_arena_base(arena);
        kvo_xfer_op ops[2] = {{0, 0, bpc, ids, slots, sb}, {0, 0, bpc, ids + bpc, slots + sb, sb}};
        kvo_cuda_stats s0 = KVO_CUDA_STATS_INIT, s1 = KVO_CUDA_STATS_INIT, s2 = KVO_CUDA_STATS_INIT;
        ASSERT_OK(kvo_cuda_get_stats(e.cu, &s0));
        ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, ops, 2), 0);
        ASSERT_OK(kvo_cuda_get_stats(e.cu, &s1));
        for (int c = 0; c < 2; c++)
            for (uint32_t l = 0; l < L; l++)
                for (uint32_t b = 0; b < bpc; b++)
                    if (memcmp(slots + c * sb + ((uint64_t)bpc * l + b) * P, host + (l * nb + ids[c * bpc + b]) * P, P))
                        FAILF("%u x %llu: store chunk %d layer %u block %u differs", L, (unsigned long long)P, c, l, b);
        ops[0].engine_blocks = to;
        ops[1].engine_blocks = to + bpc;
        ASSERT_EQ_INT(run_job(e.t, KVO_XFER_LOAD, ops, 2), 0);
        ASSERT_OK(kvo_cuda_get_stats(e.cu, &s2));
        for (uint32_t l = 0; l < L; l++) {
            CU_OK(cudaMemcpy(back, dev[l], nb * P, cudaMemcpyDeviceToHost));
            for (int c = 0; c < 2; c++)
                for (uint32_t b = 0; b < bpc; b++)
                    if (memcmp(back + to[c * bpc + b] * P, slots + c * sb + ((uint64_t)bpc * l + b) * P, P))
                        FAILF("%u x %llu: load chunk %d layer %u block %u differs", L, (unsigned long long)P, c, l, b);
        }
        uint64_t jobs_ops[2] = {s1.batch_calls + s1.kernel_launches - s0.batch_calls - s0.kernel_launches,
                                s2.batch_calls + s2.kernel_launches - s1.batch_calls - s1.kernel_launches};
        if (s0.batch_available && s0.kernel_available) {
            ASSERT_EQ_U64(jobs_ops[0], 1);
            ASSERT_GE_U64(jobs_ops[1], 1);
            ASSERT_LE_U64(jobs_ops[1], 2);
        }
        ASSERT_EQ_U64(s2.units - s0.units, 2);
        printf("%u x %llu KiB: byte-exact; store %llu batch(es), load %llu batch(es) + %llu launch(es)\n", L,
               (unsigned long long)(P >> 10), (unsigned long long)(s1.batch_calls - s0.batch_calls),
               (unsigned long long)(s2.batch_calls - s1.batch_calls),
               (unsigned long long)(s2.kernel_launches - s1.kernel_launches));
        ASSERT_OK(kvo_cuda_unpin_arena(e.cu, arena));
        kvo_arena_destroy(arena);
        for (uint32_t l = 0; l < L; l++) CU_OK(cudaFree(dev[l]));
        free(dev);
        free(segs);
        free(host);
        free(back);
        env_close(&e);
    }
}

static void t_errors(void) {
    kvo_plan *plan = xt_one_group_plan(1, 4096, 4);
    kvo_cuda_params cp = kvo_cuda_default_params();
    cu_env e;
    env_open(&e, plan, &cp);
    unsigned char *dev;
    CU_OK(cudaMalloc((void **)&dev, 16 * 4096));
    /* Engine memory must be device memory. */
    unsigned char *hostbuf = malloc(16 * 4096);
    kvo_segment bad = {0, hostbuf, 16, 4096, 4096};
    ASSERT_ERR(kvo_transfer_set_layout(e.t, &bad, 1), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "not CUDA device memory");
    kvo_segment seg = {0, dev, 16, 4096, 4096};
    ASSERT_OK(kvo_transfer_set_layout(e.t, &seg, 1));
    /* A malloc'd slot: the job fails, the engine keeps working. */
    uint64_t blk[4] = {0, 5, 9, 3};
    kvo_xfer_op op = {0, 0, 4, blk, hostbuf, 4 * 4096};
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, &op, 1), KVO_EINVAL);
    ASSERT_OK(kvo_cuda_pin_host(e.cu, hostbuf, 16 * 4096));
    ASSERT_ERR(kvo_cuda_pin_host(e.cu, hostbuf + 4096, 4096), KVO_EEXIST);
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, &op, 1), 0);
    ASSERT_OK(kvo_cuda_unpin_host(e.cu, hostbuf));
    ASSERT_ERR(kvo_cuda_unpin_host(e.cu, hostbuf), KVO_ENOTFOUND);
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(e.cu, &st));
    ASSERT_EQ_U64(st.errors, 1);
    /* A second context for the same device is refused. */
    kvo_cuda *dup = NULL;
    ASSERT_ERR(kvo_cuda_create(&cp, &dup), KVO_EEXIST);
    CU_OK(cudaFree(dev));
    free(hostbuf);
    env_close(&e);
}

#endif

/* Device tests: skipped (exit 77) without CUDA or without a device. */
/* The struct_size convention (kvo_common.h) on the CUDA structs: checked
 * before any device is touched, so it runs on machines without a GPU. */
KVO_TEST(struct_size_checked_without_a_device) {
#if KVO_HAVE_CUDA
    kvo_cuda_params cp = kvo_cuda_default_params();
    ASSERT_EQ_U64(cp.struct_size, sizeof cp);
    cp.struct_size = 0;
    kvo_cuda *cu = NULL;
    ASSERT_ERR(kvo_cuda_create(&cp, &cu), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "kvo_cuda_default_params");
    ASSERT_NULL(cu);
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_EQ_U64(st.struct_size, sizeof st);
    ASSERT_ERR(kvo_cuda_get_stats(NULL, &st), KVO_EINVAL);
    st.struct_size = 0;
    ASSERT_ERR(kvo_cuda_get_stats(NULL, &st), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_CUDA_STATS_INIT");
#else
    SKIP("built without CUDA");
#endif
}

KVO_TEST(roundtrip_every_preset_byte_exact) {
    need_device();
#if KVO_HAVE_CUDA
    t_roundtrip();
#endif
}
KVO_TEST(small_pages_kernel_large_pages_copy_engine) {
    need_device();
#if KVO_HAVE_CUDA
    t_paths();
#endif
}
KVO_TEST(engine_shapes_one_batch_or_launch_per_job) {
    need_device();
#if KVO_HAVE_CUDA
    t_engine_shapes();
#endif
}
KVO_TEST(unpinned_slot_and_host_tensor_are_errors) {
    need_device();
#if KVO_HAVE_CUDA
    t_errors();
#endif
}
