/*
 * The CUDA device's ordering contract (kvo_cuda.h, docs/gpu.md), with checks
 * that fail when the order is wrong: the engine's "forward pass" is a kernel
 * (tests/cuda_test_kernels.cu) that holds the compute stream for 200 ms
 * before it writes the blocks, so a store that does not wait for it copies
 * the old bytes, and each check has a negative control (the same steps
 * without the ordering) that must see those old bytes.  Loads follow the
 * same mark, which makes kvo_cuda_job_event testable: right after a load's
 * submit its event must not complete before the copies.  Also: the
 * completion deadline (KVO_ETIMEDOUT), and with two devices, that the
 * caller's current device is left alone and another device's tensors and
 * streams are refused.
 * Every test skips (exit 77) without a device.
 */
#include <stdlib.h>

#include "cuda_test_util.h"

#if KVO_HAVE_CUDA

#define PAGE (UINT64_C(1) << 20)
#define SPIN_NS (UINT64_C(200) * 1000 * 1000)

typedef struct ord_env {
    cu_env e;
    cudaStream_t compute;
    unsigned char *dev, *slot; /* 8 pages of device memory; 2 pinned pages */
} ord_env;

/* One group of 1 MiB pages, chunks of 2 blocks; the compute stream is given
 * to the context only when with_compute. */
static void ord_open(ord_env *o, bool with_compute, uint32_t timeout_ms) {
    CU_OK(cudaSetDevice(0));
    CU_OK(cudaStreamCreateWithFlags(&o->compute, cudaStreamNonBlocking));
    kvo_cuda_params cp = kvo_cuda_default_params();
    if (with_compute) cp.compute_stream = o->compute;
    if (timeout_ms) cp.completion_timeout_ms = timeout_ms;
    env_open(&o->e, xt_one_group_plan(1, PAGE, 2), &cp);
    CU_OK(cudaMalloc((void **)&o->dev, 8 * PAGE));
    CU_OK(cudaHostAlloc((void **)&o->slot, 2 * PAGE, cudaHostAllocDefault));
    kvo_segment seg = {0, o->dev, 8, PAGE, PAGE};
    ASSERT_OK(kvo_transfer_set_layout(o->e.t, &seg, 1));
    CU_OK(cudaMemset(o->dev, 0x11, 8 * PAGE));
    CU_OK(cudaDeviceSynchronize());
    memset(o->slot, 0, 2 * PAGE);
}

static void ord_close(ord_env *o) {
    CU_OK(cudaStreamSynchronize(o->compute));
    env_close(&o->e);
    CU_OK(cudaStreamDestroy(o->compute));
    CU_OK(cudaFree(o->dev));
    CU_OK(cudaFreeHost(o->slot));
}

static size_t count_bytes(const unsigned char *p, size_t n, unsigned char v) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += p[i] == v;
    return c;
}

/* The forward pass writes blocks 3 and 4 (0x5a) after holding the compute
 * stream; the store of those blocks is submitted right after it was
 * enqueued; a second pass enqueued after the submit overwrites them (0x77)
 * 300 ms later.  Returns the store's status; the slot holds what it read. */
static int store_after_forward(ord_env *o) {
    CU_OK((cudaError_t)kvo_test_spin_fill(o->dev + 3 * PAGE, 0x5a, 2 * PAGE, SPIN_NS, o->compute));
    uint64_t blk[2] = {3, 4}, id;
    kvo_xfer_op op = {0, 0, 2, blk, o->slot, 2 * PAGE};
    ASSERT_OK(kvo_transfer_submit(o->e.t, KVO_XFER_STORE, &op, 1, &id));
    CU_OK((cudaError_t)kvo_test_spin_fill(o->dev + 3 * PAGE, 0x77, 2 * PAGE, 3 * SPIN_NS / 2, o->compute));
    return xt_wait_one(o->e.t, id).status;
}

static void t_store_order(void) {
    ord_env o;
    ord_open(&o, true, 0);
    ASSERT_EQ_INT(store_after_forward(&o), 0);
    /* Every byte from the pass before the submit; none from the one after. */
    ASSERT_EQ_U64(count_bytes(o.slot, 2 * PAGE, 0x5a), 2 * PAGE);
    ord_close(&o);

    /* Negative control: no compute stream, so nothing orders the store. */
    ord_open(&o, false, 0);
    ASSERT_EQ_INT(store_after_forward(&o), 0);
    size_t stale = count_bytes(o.slot, 2 * PAGE, 0x11);
    if (stale == 0)
        FAILF("negative control: without a compute stream the store still read only the forward pass's bytes; "
              "the ordering check above cannot tell ordering from timing");
    printf("store: ordered: all %llu bytes new; unordered control: %zu of them stale\n",
           (unsigned long long)(2 * PAGE), stale);
    ord_close(&o);
}

/* kvo_cuda_job_event right after a load's submit (layer-wise loads): the
 * load is ordered after a 200 ms compute pass (its copies wait on the GPU
 * for the mark recorded at submit), so its copies have not run when the
 * call returns; a consumer stream that waits for the event must read the
 * loaded bytes, and the negative control -- the same read on a stream that
 * does not wait -- reads the old ones. */
static void t_load_event(void) {
    ord_env o;
    ord_open(&o, true, 0);
    memset(o.slot, 0xc3, 2 * PAGE);
    cudaStream_t consumer, control;
    CU_OK(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
    CU_OK(cudaStreamCreateWithFlags(&control, cudaStreamNonBlocking));
    CU_OK((cudaError_t)kvo_test_spin_fill(o.dev, 0x5a, PAGE, SPIN_NS, o.compute)); /* block 0 */
    uint64_t blk[2] = {6, 7}, id;
    kvo_xfer_op op = {0, 0, 2, blk, o.slot, 2 * PAGE};
    ASSERT_OK(kvo_transfer_submit(o.e.t, KVO_XFER_LOAD, &op, 1, &id));
    cudaEvent_t ev;
    CU_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    ASSERT_OK(kvo_cuda_job_event(o.e.cu, o.e.t, KVO_XFER_LOAD, id, ev));
    unsigned char stale = 0, probe[2] = {0, 0};
    CU_OK(cudaMemcpyAsync(&stale, o.dev + 6 * PAGE + 17, 1, cudaMemcpyDeviceToHost, control));
    CU_OK(cudaStreamWaitEvent(consumer, ev, 0));
    CU_OK(cudaMemcpyAsync(&probe[0], o.dev + 6 * PAGE + 17, 1, cudaMemcpyDeviceToHost, consumer));
    CU_OK(cudaMemcpyAsync(&probe[1], o.dev + 7 * PAGE + PAGE - 1, 1, cudaMemcpyDeviceToHost, consumer));
    CU_OK(cudaStreamSynchronize(control));
    CU_OK(cudaStreamSynchronize(consumer));
    if (stale != 0x11)
        FAILF("negative control: a read not ordered after the event saw 0x%02x, not the old 0x11: the load was "
              "not held behind the compute pass, so the check below cannot tell", stale);
    ASSERT_EQ_INT(probe[0], 0xc3);
    ASSERT_EQ_INT(probe[1], 0xc3);
    ASSERT_EQ_INT(xt_wait_one(o.e.t, id).status, 0);
    printf("load: a read after kvo_cuda_job_event saw the loaded bytes; the control read saw the old ones\n");
    ASSERT_ERR(kvo_cuda_job_event(o.e.cu, o.e.t, KVO_XFER_LOAD, 999, ev), KVO_ENOTFOUND);
    /* record_event: records and completes in both directions. */
    for (int d = 0; d < 2; d++) {
        ASSERT_OK(kvo_cuda_record_event(o.e.cu, (kvo_xfer_dir)d, ev));
        CU_OK(cudaEventSynchronize(ev));
    }
    ASSERT_ERR(kvo_cuda_record_event(o.e.cu, (kvo_xfer_dir)5, ev), KVO_EINVAL);
    CU_OK(cudaEventDestroy(ev));
    CU_OK(cudaStreamDestroy(consumer));
    CU_OK(cudaStreamDestroy(control));
    ord_close(&o);
}

static void t_deadline(void) {
    ord_env o;
    ord_open(&o, true, 50); /* the store waits for a 300 ms pass: past 50 ms */
    int st = store_after_forward(&o);
    ASSERT_EQ_INT(st, KVO_ETIMEDOUT);
    kvo_cuda_stats s = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(o.e.cu, &s));
    ASSERT_GE_U64(s.timeouts, 1);
    /* Destroy returns (it leaks what could wait for the device). */
    ord_close(&o);
}

static void t_two_devices(void) {
    CU_OK(cudaSetDevice(1));
    kvo_cuda_params cp = kvo_cuda_default_params(); /* device 0 */
    cu_env e;
    env_open(&e, xt_one_group_plan(1, 65536, 4), &cp);
    int cur = -1;
    CU_OK(cudaGetDevice(&cur));
    ASSERT_EQ_INT(cur, 1); /* create, transfer create, worker init kept it */
    unsigned char *d0, *d1, *slot;
    CU_OK(cudaSetDevice(0));
    CU_OK(cudaMalloc((void **)&d0, 16 * 65536));
    CU_OK(cudaSetDevice(1));
    CU_OK(cudaMalloc((void **)&d1, 16 * 65536));
    /* Tensors of device 1 in device 0's engine: refused, naming both. */
    kvo_segment bad = {0, d1, 16, 65536, 65536};
    ASSERT_ERR(kvo_transfer_set_layout(e.t, &bad, 1), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "device 1");
    ASSERT_CONTAINS(kvo_last_error(), "device 0");
    kvo_segment seg = {0, d0, 16, 65536, 65536};
    ASSERT_OK(kvo_transfer_set_layout(e.t, &seg, 1));
#if CUDART_VERSION >= 12080
    cudaStream_t s1;
    CU_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); /* on device 1 */
    ASSERT_ERR(kvo_cuda_set_compute_stream(e.cu, s1), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "device 1");
    ASSERT_CONTAINS(kvo_last_error(), "device 0");
    CU_OK(cudaStreamDestroy(s1));
#endif
    /* One arena pinned for both devices: registered once, counted. */
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = 4 << 20;
    kvo_arena *arena;
    ASSERT_OK(kvo_arena_create(&ap, &arena));
    kvo_cuda_params cp1 = kvo_cuda_default_params();
    cp1.device_index = 1;
    kvo_cuda *cu1;
    ASSERT_OK(kvo_cuda_create(&cp1, &cu1));
    ASSERT_OK(kvo_cuda_pin_arena(e.cu, arena));
    ASSERT_OK(kvo_cuda_pin_arena(cu1, arena));
    slot = kvo_arena_base(arena);
    uint64_t blk[4] = {1, 5, 9, 13};
    kvo_xfer_op op = {0, 0, 4, blk, slot, 4 * 65536};
    CU_OK(cudaMemset(d0, 0x42, 16 * 65536));
    CU_OK(cudaDeviceSynchronize());
    ASSERT_OK(kvo_cuda_unpin_arena(cu1, arena)); /* device 0 still uses it */
    struct cudaPointerAttributes a;
    CU_OK(cudaPointerGetAttributes(&a, slot));
    ASSERT_EQ_INT(a.type, cudaMemoryTypeHost);
    ASSERT_EQ_INT(run_job(e.t, KVO_XFER_STORE, &op, 1), 0);
    ASSERT_EQ_U64(count_bytes(slot, 4 * 65536, 0x42), 4 * 65536);
    CU_OK(cudaGetDevice(&cur));
    ASSERT_EQ_INT(cur, 1);
    ASSERT_OK(kvo_cuda_unpin_arena(e.cu, arena)); /* the last user: unregistered */
    CU_OK(cudaPointerGetAttributes(&a, slot));
    ASSERT_EQ_INT(a.type, cudaMemoryTypeUnregistered);
    kvo_cuda_destroy(cu1);
    env_close(&e);
    CU_OK(cudaGetDevice(&cur));
    ASSERT_EQ_INT(cur, 1); /* destroy kept it too */
    kvo_arena_destroy(arena);
    CU_OK(cudaFree(d1));
    CU_OK(cudaSetDevice(0));
    CU_OK(cudaFree(d0));
}

#endif

KVO_TEST(compute_stream_and_event_ordering) {
    need_device();
#if KVO_HAVE_CUDA
    t_store_order();
#endif
}

KVO_TEST(load_job_event_after_its_copies) {
    need_device();
#if KVO_HAVE_CUDA
    t_load_event();
#endif
}

KVO_TEST(completion_deadline_is_etimedout) {
    need_device();
#if KVO_HAVE_CUDA
    t_deadline();
#endif
}

KVO_TEST(two_devices_caller_device_kept_and_foreign_refused) {
    int n = need_device();
    if (n < 2) SKIP("one CUDA device: this test needs two");
#if KVO_HAVE_CUDA
    t_two_devices();
#endif
}
