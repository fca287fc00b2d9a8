/*
 * The CUDA device on the shapes where a copy path would break first: 2000
 * small pieces in one job (the kernel's descriptor buffer grows past its
 * first 1024), pages aligned to 4 bytes only (the kernel's 4-byte path),
 * engine offsets above 4 GiB (64-bit addresses through the kernel and the
 * copy engine), 64 jobs in flight at once, the second device, and memory the
 * caller registered itself (a range it only partly covers refused).  Each case stores scattered engine blocks into
 * a pinned slot, checks every byte against what was written to the device,
 * loads the slot back into other blocks and checks those.  Every test skips
 * (exit 77) without a device.
 */
#include <stdlib.h>

#include "cuda_test_util.h"

#if KVO_HAVE_CUDA

/* Store blocks blk[0..k-1] (of a one-segment tensor at base, pages of page
 * bytes every stride bytes) into slot (pinned, a whole chunk of k blocks),
 * check it, then load the slot into blocks back[0..k-1] and check them. */
static void scatter_roundtrip(cu_env *e, unsigned char *base, uint64_t nb, uint64_t page, uint64_t stride,
                              const uint64_t *blk, const uint64_t *back, uint32_t k, unsigned char *slot) {
    kvo_segment seg = {0, base, nb, stride, page};
    ASSERT_OK(kvo_transfer_set_layout(e->t, &seg, 1));
    unsigned char *want = malloc((size_t)k * page), *got = malloc(page);
    ASSERT_TRUE(want && got);
    xt_fill_random(want, (size_t)k * page);
    for (uint32_t i = 0; i < k; i++)
        CU_OK(cudaMemcpy(base + blk[i] * stride, want + (size_t)i * page, page, cudaMemcpyHostToDevice));
    kvo_xfer_op op = {0, 0, k, blk, slot, kvo_plan_group(e->plan, 0)->slot_bytes};
    ASSERT_EQ_INT(run_job(e->t, KVO_XFER_STORE, &op, 1), 0);
    for (uint32_t i = 0; i < k; i++)
        if (memcmp(slot + (size_t)i * page, want + (size_t)i * page, page))
            FAILF("store: chunk block %u (engine block %llu, offset %llu): slot bytes differ", i,
                  (unsigned long long)blk[i], (unsigned long long)(blk[i] * stride));
    for (uint32_t i = 0; i < k; i++) CU_OK(cudaMemset(base + back[i] * stride, 0, page));
    CU_OK(cudaDeviceSynchronize());
    op.engine_blocks = back;
    ASSERT_EQ_INT(run_job(e->t, KVO_XFER_LOAD, &op, 1), 0);
    for (uint32_t i = 0; i < k; i++) {
        CU_OK(cudaMemcpy(got, base + back[i] * stride, page, cudaMemcpyDeviceToHost));
        if (memcmp(got, want + (size_t)i * page, page))
            FAILF("load: chunk block %u (engine block %llu, offset %llu): device bytes differ", i,
                  (unsigned long long)back[i], (unsigned long long)(back[i] * stride));
    }
    free(want);
    free(got);
}

/* A one-group engine for k-block chunks of page bytes, a device tensor of
 * bytes, a pinned slot; run scatter_roundtrip with blocks blk/back. */
static void shape_case(const kvo_cuda_params *cp, uint64_t page, uint64_t stride, uint64_t off, uint64_t nb,
                       const uint64_t *blk, const uint64_t *back, uint32_t k, kvo_cuda_stats *st) {
    cu_env e;
    env_open(&e, xt_one_group_plan(1, page, k), cp);
    unsigned char *dev, *slot;
    CU_OK(cudaSetDevice(cp->device_index));
    CU_OK(cudaMalloc((void **)&dev, off + nb * stride));
    CU_OK(cudaHostAlloc((void **)&slot, kvo_plan_group(e.plan, 0)->slot_bytes, cudaHostAllocDefault));
    scatter_roundtrip(&e, dev + off, nb, page, stride, blk, back, k, slot);
    if (st) ASSERT_OK(kvo_cuda_get_stats(e.cu, st));
    CU_OK(cudaFree(dev));
    CU_OK(cudaFreeHost(slot));
    env_close(&e);
}

static void t_many_pieces(void) {
    enum { K = 2000, NB = 4 * K };
    uint64_t *blk = malloc(K * sizeof *blk), *back = malloc(K * sizeof *back);
    for (uint32_t i = 0; i < K; i++) {
        blk[i] = 2 * (uint64_t)i;          /* never adjacent: 2000 pieces */
        back[i] = 2 * (uint64_t)(K + i) + 1;
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    shape_case(&cp, 1024, 1024, 0, NB, blk, back, K, &st);
    /* One job each way: the store as one batch (or single copies on a
     * driver without batches), the load as one launch over all 2000. */
    ASSERT_EQ_U64(st.kernel_launches, 1);
    ASSERT_EQ_U64(st.kernel_pieces, K);
    if (st.batch_available) ASSERT_EQ_U64(st.batch_pieces, K);
    else ASSERT_EQ_U64(st.memcpy_calls, K);
    ASSERT_EQ_U64(st.units, 2);
    ASSERT_EQ_U64(st.errors, 0);
    free(blk);
    free(back);
}

static void t_four_byte_pages(void) {
    enum { K = 16 };
    uint64_t blk[K], back[K];
    for (uint32_t i = 0; i < K; i++) {
        blk[i] = 3 * (uint64_t)i;
        back[i] = 3 * (uint64_t)i + 1;
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    /* 4100-byte pages at an offset of 4: every address is 4-aligned only. */
    shape_case(&cp, 4100, 4100, 4, 3 * K + 2, blk, back, K, &st);
    ASSERT_EQ_U64(st.kernel_pieces, K); /* the load */
    cp.kernel_stores = true;             /* the store through the kernel too */
    shape_case(&cp, 4100, 4100, 4, 3 * K + 2, blk, back, K, &st);
    ASSERT_EQ_U64(st.kernel_pieces, 2 * K);
    cp.kernel_max_bytes = 0; /* the same through the copy engine */
    shape_case(&cp, 4100, 4100, 4, 3 * K + 2, blk, back, K, &st);
    ASSERT_EQ_U64(st.kernel_launches, 0);
}

static void t_above_4gib(void) {
    uint64_t page = 4096, stride = 4096, total = (UINT64_C(9) << 29); /* 4.5 GiB */
    unsigned char *probe;
    if (cudaMalloc((void **)&probe, total) != cudaSuccess) {
        (void)cudaGetLastError();
        SKIP("cannot allocate 4.5 GiB on device 0");
    }
    CU_OK(cudaFree(probe));
    enum { K = 64 };
    uint64_t nb = total / stride, blk[K], back[K];
    for (uint32_t i = 0; i < K; i++) { /* every offset above 4 GiB */
        blk[i] = nb - 1 - 3 * (uint64_t)i;
        back[i] = nb - 2 - 3 * (uint64_t)i;
        ASSERT_GE_U64(back[i] * stride, UINT64_C(1) << 32);
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    cp.kernel_stores = true;
    shape_case(&cp, page, stride, 0, nb, blk, back, K, &st);
    ASSERT_EQ_U64(st.kernel_pieces, 2 * K);
    cp.kernel_max_bytes = 0;
    uint64_t b2[4] = {total / 65536 - 1, total / 65536 - 9, total / 65536 - 17, total / 65536 - 25};
    uint64_t k2[4] = {total / 65536 - 2, total / 65536 - 10, total / 65536 - 18, total / 65536 - 26};
    shape_case(&cp, 65536, 65536, 0, total / 65536, b2, k2, 4, &st);
    ASSERT_EQ_U64(st.kernel_launches, 0);
}

static void t_64_jobs(void) {
    enum { J = 64, B = 4, PAGE = 65536 };
    kvo_cuda_params cp = kvo_cuda_default_params();
    cu_env e;
    env_open_threads(&e, xt_one_group_plan(1, PAGE, B), &cp, 4);
    uint64_t nb = 2 * J * B, sb = kvo_plan_group(e.plan, 0)->slot_bytes;
    unsigned char *dev, *slots, *host = malloc(nb * PAGE), *got = malloc(nb * PAGE);
    CU_OK(cudaMalloc((void **)&dev, nb * PAGE));
    CU_OK(cudaHostAlloc((void **)&slots, J * sb, cudaHostAllocDefault));
    xt_fill_random(host, nb * PAGE);
    CU_OK(cudaMemcpy(dev, host, nb * PAGE, cudaMemcpyHostToDevice));
    kvo_segment seg = {0, dev, nb, PAGE, PAGE};
    ASSERT_OK(kvo_transfer_set_layout(e.t, &seg, 1));
    static uint64_t src[J][B], dst[J][B];
    uint64_t ids[J];
    for (int j = 0; j < J; j++)
        for (int b = 0; b < B; b++) {
            src[j][b] = (uint64_t)(b * J + j);            /* scattered over the first half */
            dst[j][b] = (uint64_t)(J * B + (B - 1 - b) * J + j);
        }
    for (int j = 0; j < J; j++) { /* all 64 stores in flight, then all 64 loads */
        kvo_xfer_op op = {0, 0, B, src[j], slots + j * sb, sb};
        ASSERT_OK(kvo_transfer_submit(e.t, KVO_XFER_STORE, &op, 1, &ids[j]));
    }
    ASSERT_OK(kvo_transfer_wait(e.t, ids, J, -1));
    for (int j = 0; j < J; j++) {
        kvo_xfer_op op = {0, 0, B, dst[j], slots + j * sb, sb};
        ASSERT_OK(kvo_transfer_submit(e.t, KVO_XFER_LOAD, &op, 1, &ids[j]));
    }
    ASSERT_OK(kvo_transfer_wait(e.t, ids, J, -1));
    kvo_xfer_result r[2 * J];
    size_t n, total = 0;
    do {
        ASSERT_OK(kvo_transfer_poll(e.t, r, 2 * J, &n));
        for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(r[i].status, 0);
        total += n;
    } while (n);
    ASSERT_EQ_U64(total, 2 * J);
    CU_OK(cudaMemcpy(got, dev, nb * PAGE, cudaMemcpyDeviceToHost));
    for (int j = 0; j < J; j++)
        for (int b = 0; b < B; b++)
            if (memcmp(got + dst[j][b] * PAGE, host + src[j][b] * PAGE, PAGE))
                FAILF("job %d block %d: loaded bytes differ from the stored block", j, b);
    ASSERT_MEM_EQ(got, host, J * B * PAGE); /* sources untouched */
    CU_OK(cudaFree(dev));
    CU_OK(cudaFreeHost(slots));
    free(host);
    free(got);
    env_close(&e);
}

static void t_second_device(void) {
    int cur = -1;
    CU_OK(cudaSetDevice(0));
    kvo_cuda_params cp0 = kvo_cuda_default_params();
    cu_env e0;
    env_open(&e0, xt_one_group_plan(1, 4096, 8), &cp0);
    enum { K = 8 };
    uint64_t blk[K], back[K];
    for (uint32_t i = 0; i < K; i++) {
        blk[i] = 2 * (uint64_t)i;
        back[i] = 2 * (uint64_t)i + 1;
    }
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.device_index = 1;
    shape_case(&cp, 4096, 4096, 0, 2 * K, blk, back, K, NULL);
    cp.kernel_max_bytes = 0;
    shape_case(&cp, 65536, 65536, 0, 2 * K, blk, back, K, NULL);
    CU_OK(cudaGetDevice(&cur));
    ASSERT_EQ_INT(cur, 1); /* shape_case chose it; kvoffload left it */
    env_close(&e0);
    CU_OK(cudaSetDevice(0));
}

/* Memory the caller registered itself (as torch's pin_memory does): pinning
 * it through kvo_cuda works and unpinning leaves it registered; a range it
 * only partly covers is refused (negative control of the first). */
static void t_caller_registered(void) {
    size_t bytes = 1 << 20;
    unsigned char *buf = aligned_alloc(4096, 2 * bytes);
    CU_OK(cudaSetDevice(0));
    CU_OK(cudaHostRegister(buf, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda *cu;
    ASSERT_OK(kvo_cuda_create(&cp, &cu));
    ASSERT_OK(kvo_cuda_pin_host(cu, buf, bytes));
    ASSERT_ERR(kvo_cuda_pin_host(cu, buf + 4096, 4096), KVO_EEXIST);
    ASSERT_OK(kvo_cuda_unpin_host(cu, buf));
    struct cudaPointerAttributes a;
    CU_OK(cudaPointerGetAttributes(&a, buf));
    ASSERT_EQ_INT(a.type, cudaMemoryTypeHost); /* still the caller's registration */
    ASSERT_ERR(kvo_cuda_pin_host(cu, buf + bytes / 2, bytes), KVO_EEXIST);
    ASSERT_CONTAINS(kvo_last_error(), "partly registered");
    kvo_cuda_destroy(cu);
    CU_OK(cudaHostUnregister(buf));
    free(buf);
}

#endif

KVO_TEST(more_than_1024_small_pieces_in_one_job) {
    need_device();
#if KVO_HAVE_CUDA
    t_many_pieces();
#endif
}

KVO_TEST(pages_aligned_to_4_bytes_only) {
    need_device();
#if KVO_HAVE_CUDA
    t_four_byte_pages();
#endif
}

KVO_TEST(engine_offsets_above_4_gib) {
    need_device();
#if KVO_HAVE_CUDA
    t_above_4gib();
#endif
}

KVO_TEST(sixty_four_concurrent_jobs) {
    need_device();
#if KVO_HAVE_CUDA
    t_64_jobs();
#endif
}

KVO_TEST(second_device_round_trip) {
    int n = need_device();
    if (n < 2) SKIP("one CUDA device: this test needs two");
#if KVO_HAVE_CUDA
    t_second_device();
#endif
}

KVO_TEST(caller_registered_memory_left_registered) {
    need_device();
#if KVO_HAVE_CUDA
    t_caller_registered();
#endif
}
