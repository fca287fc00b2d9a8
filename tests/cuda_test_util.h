/*
 * Helpers of the CUDA device tests (tests/test_cuda*.c): skip without a
 * device, a context + transfer engine pair, one job run to completion, CUDA
 * calls that fail the test.  Every test that touches a device calls
 * need_device() first: exit 77 (ctest: skipped) in a build without CUDA or
 * on a machine without a usable device, so the tests never fail there.
 */
#ifndef KVO_CUDA_TEST_UTIL_H
#define KVO_CUDA_TEST_UTIL_H

#include <stdlib.h>

#include "kvo_test.h"
#include "xfer_test_util.h"

#if KVO_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_test_kernels.h"
#include "kvoffload/kvo_cuda.h"

#define CU_OK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) \
    FAILF("%s: %s (%s)", #x, cudaGetErrorName(e_), cudaGetErrorString(e_)); } while (0)

/* The number of devices, or a skip. */
static inline int need_device(void) {
    int n = 0;
    if (kvo_cuda_device_count(&n) != 0) SKIP("no CUDA device: %s", kvo_last_error());
    return n;
}

typedef struct cu_env {
    kvo_plan *plan;
    kvo_cuda *cu;
    kvo_transfer *t;
} cu_env;

/* A context with params cp and a transfer engine (threads workers, 2 when
 * 0) on its device, for plan (owned by the env from now on). */
static inline void env_open_threads(cu_env *e, kvo_plan *plan, const kvo_cuda_params *cp, uint32_t threads) {
    e->plan = plan;
    ASSERT_OK(kvo_cuda_create(cp, &e->cu));
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    tp.device = "cuda";
    tp.device_index = cp->device_index;
    if (threads) tp.threads = threads;
    ASSERT_OK(kvo_transfer_create(&tp, &e->t));
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(e->t, &st));
    ASSERT_EQ_STR(st.device, "cuda");
}
static inline void env_open(cu_env *e, kvo_plan *plan, const kvo_cuda_params *cp) {
    env_open_threads(e, plan, cp, 0);
}

static inline void env_close(cu_env *e) {
    kvo_transfer_destroy(e->t);
    kvo_cuda_destroy(e->cu);
    kvo_plan_destroy(e->plan);
}

/* Submit one job and wait for its result: its status. */
static inline int run_job(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n) {
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, dir, ops, n, &id));
    return xt_wait_one(t, id).status;
}
#else
static inline int need_device(void) { SKIP("built without CUDA (KVO_CUDA=OFF or no toolkit)"); }
#endif

#endif
