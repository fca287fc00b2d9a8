/*
 * The CUDA transfer device without a GPU: its own code (src/transfer/cuda/
 * cuda.c, device_cuda.c, cuda_driver.c, compiled into this program on every
 * build) runs against a fake driver (tests/cuda_test_fake.h) that executes
 * the copies and kernel launches in host memory, in stream order, and
 * counts what the device asked of it.  Covers:
 *   - a job is one plan across every layer: at the engine shapes of issue
 *     49 (64 x 32 KiB, 160 x 8 KiB, 61 x 18 KiB, 1 x 2 MiB) each job is one
 *     batched copy or one kernel launch and one host wait, byte-exact;
 *   - an old driver without cuMemcpyBatchAsync, a driver refusing it, and
 *     kernel images that do not load: the fallbacks, each said once;
 *   - the defects of issue 49, each with its negative control: buffers a
 *     timed-out job's kernel still reads are never reused; job_submit
 *     records the compute mark with the context current (the legacy stream
 *     is this device's); kvo_cuda_job_event completes after the job's
 *     copies, right after the submit; a slot that only starts in a
 *     registered range is not pinned;
 *   - the caller's current context kept, foreign memory and streams refused,
 *     nothing left behind at destroy, and nothing waited for when the GPU
 *     is stuck;
 *   - the CUDA benchmark's own code (bench/bench_transfer_cuda.c, compiled
 *     in): its figures and limits at two shapes, and its skip without a
 *     device.
 */
#include <stdlib.h>
#include <time.h>

#include "cuda_test_fake.h"
#include "kvo_test.h"
#include "kvoffload/kvo_cuda.h"
#include "transfer/cuda/cuda_internal.h"
#include "transfer/transfer_internal.h"
#include "xfer_test_util.h"

/* ---- fixture: one group of `layers` layer tensors on a fake device -------- */

typedef struct fx {
    kvo_plan *plan;
    kvo_cuda *cu;
    kvo_transfer *t;
    uint32_t layers, bpc;
    uint64_t page, nb;
    unsigned char **seg;   /* device memory of each layer: nb pages */
    unsigned char *want;   /* what each layer held when the fixture was made */
    kvo_arena *arena;
    unsigned char *slots;  /* chunks of the arena */
    uint64_t slot_bytes;
    size_t n_slots;
} fx;

static void fx_open(fx *f, uint32_t layers, uint64_t page, uint64_t nb, uint32_t bpc, size_t n_slots,
                    const kvo_cuda_params *cp, uint32_t threads) {
    memset(f, 0, sizeof *f);
    f->layers = layers;
    f->page = page;
    f->nb = nb;
    f->bpc = bpc;
    f->n_slots = n_slots;
    f->plan = xt_one_group_plan(layers, page, bpc);
    ASSERT_OK(kvo_cuda_create(cp, &f->cu));
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = f->plan;
    tp.device = "cuda";
    tp.device_index = cp->device_index;
    tp.threads = threads;
    ASSERT_OK(kvo_transfer_create(&tp, &f->t));
    f->seg = calloc(layers, sizeof *f->seg);
    f->want = malloc(layers * nb * page);
    kvo_segment *segs = calloc(layers, sizeof *segs);
    ASSERT_TRUE(f->seg && f->want && segs);
    xt_fill_random(f->want, layers * nb * page);
    for (uint32_t l = 0; l < layers; l++) {
        f->seg[l] = fk_dev_alloc(cp->device_index, nb * page);
        memcpy(f->seg[l], f->want + l * nb * page, nb * page);
        segs[l] = (kvo_segment){0, f->seg[l], nb, page, page};
    }
    ASSERT_OK(kvo_transfer_set_layout(f->t, segs, layers));
    free(segs);
    f->slot_bytes = kvo_plan_group(f->plan, 0)->slot_bytes;
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = n_slots * f->slot_bytes;
    ASSERT_OK(kvo_arena_create(&ap, &f->arena));
    ASSERT_OK(kvo_cuda_pin_arena(f->cu, f->arena));
    f->slots = kvo_arena_base(f->arena);
    memset(f->slots, 0, n_slots * f->slot_bytes);
}

static void fx_close(fx *f) {
    kvo_transfer_destroy(f->t);
    kvo_cuda_destroy(f->cu);
    kvo_arena_destroy(f->arena);
    for (uint32_t l = 0; l < f->layers; l++) fk_dev_free(f->seg[l]);
    free(f->seg);
    free(f->want);
    kvo_plan_destroy(f->plan);
}

/* Engine block ids: a shuffle of 0..nb-1 with no two neighbours adjacent
 * in the tensor (nothing merges: every page of every layer is a piece). */
static void fx_blocks(const fx *f, uint64_t *ids) {
    for (uint64_t i = 0; i < f->nb; i++) ids[i] = (i * 7 + 3) % f->nb;
    for (uint64_t i = 1; i < f->nb; i++) ASSERT_NE_U64(ids[i], ids[i - 1] + 1);
}

/* The usual fixture: 24 blocks per layer, chunks of 8, n_slots slots;
 * ids[24] gets the blocks' order (fx_blocks). */
static void fx_start(fx *f, uint32_t layers, uint64_t page, size_t n_slots, const kvo_cuda_params *cp,
                     uint32_t threads, uint64_t ids[24]) {
    fx_open(f, layers, page, 24, 8, n_slots, cp, threads);
    fx_blocks(f, ids);
}

/* One op per chunk c in [c0, c0 + n): engine blocks ids[c*bpc ..], slot c. */
static void fx_ops(const fx *f, kvo_xfer_op *ops, size_t c0, size_t n, const uint64_t *ids) {
    for (size_t c = 0; c < n; c++)
        ops[c] = (kvo_xfer_op){0, 0, f->bpc, ids + (c0 + c) * f->bpc, f->slots + (c0 + c) * f->slot_bytes,
                               f->slot_bytes};
}

static int fx_run(fx *f, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n) {
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(f->t, dir, ops, n, &id));
    return xt_wait_one(f->t, id).status;
}

/* Slot c holds what ids[c*bpc..] held in every layer (segment-major). */
static void fx_check_slot(const fx *f, size_t c, const uint64_t *ids) {
    for (uint32_t l = 0; l < f->layers; l++)
        for (uint32_t b = 0; b < f->bpc; b++) {
            const unsigned char *got = f->slots + c * f->slot_bytes + ((uint64_t)f->bpc * l + b) * f->page;
            const unsigned char *want = f->want + (l * f->nb + ids[c * f->bpc + b]) * f->page;
            if (memcmp(got, want, f->page)) FAILF("slot %zu layer %u block %u: bytes differ", c, l, b);
        }
}

/* Engine block ids[c*bpc + b] of every layer holds slot c's block b. */
static void fx_check_loaded(const fx *f, size_t c, const uint64_t *ids) {
    for (uint32_t l = 0; l < f->layers; l++)
        for (uint32_t b = 0; b < f->bpc; b++) {
            const unsigned char *got = f->seg[l] + ids[c * f->bpc + b] * f->page;
            const unsigned char *want = f->slots + c * f->slot_bytes + ((uint64_t)f->bpc * l + b) * f->page;
            if (memcmp(got, want, f->page)) FAILF("load: chunk %zu layer %u block %u: bytes differ", c, l, b);
        }
}

/* Store chunks 0 and 1 (blocks ids[0..2*bpc)) and check the slots: what the
 * fake driver counted meanwhile. */
static fk_counts fx_store2(fx *f, const uint64_t *ids) {
    kvo_xfer_op ops[2];
    fx_ops(f, ops, 0, 2, ids);
    fk_counts c0 = fk_counts_now();
    ASSERT_EQ_INT(fx_run(f, KVO_XFER_STORE, ops, 2), 0);
    fk_counts d = fk_since(c0);
    fx_check_slot(f, 0, ids);
    fx_check_slot(f, 1, ids);
    return d;
}

static long LOG_HITS;
static const char *LOG_WANT;
static void count_log(kvo_log_level level, const char *msg, void *ctx) {
    (void)level;
    (void)ctx;
    if (strstr(msg, LOG_WANT)) __atomic_fetch_add(&LOG_HITS, 1, __ATOMIC_RELAXED);
}
static void log_watch(const char *want) {
    LOG_WANT = want;
    LOG_HITS = 0;
    ASSERT_OK(kvo_set_log(count_log, NULL, KVO_LOG_INFO));
}

/* ---- one plan per job ------------------------------------------------------ */

typedef struct shape {
    uint32_t layers;
    uint64_t page;
    int load_kernel; /* loads of these pages go to the kernel (<= 28 KiB) */
} shape;

/* Store two chunks, then load them into other blocks, at an engine shape:
 * per job exactly one batch or one launch, one host wait, one event. */
static void job_shape(const shape *s) {
    fk_reset(1);
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    uint64_t ids[24];
    uint64_t back[24];
    fx_start(&f, s->layers, s->page, 2, &cp, 2, ids);
    /* The store: every page of every layer in one cuMemcpyBatchAsync. */
    fk_counts d = fx_store2(&f, ids);
    ASSERT_EQ_INT(d.batches, 1);
    ASSERT_EQ_INT(d.batch_pieces, 2 * (long)s->layers * f.bpc);
    ASSERT_EQ_INT(d.launches, 0);
    ASSERT_EQ_INT(d.memcpys, 0);
    ASSERT_EQ_INT(d.waits, 1);
    ASSERT_EQ_INT(d.stream_syncs, 0);
    ASSERT_EQ_INT(d.records, 1);
    /* The load, into other blocks (a rotation of ids). */
    for (int i = 0; i < 16; i++) back[i] = ids[(i + 16 + 3) % 24];
    kvo_xfer_op ops[2];
    fx_ops(&f, ops, 0, 2, back);
    fk_counts c1 = fk_counts_now();
    ASSERT_EQ_INT(fx_run(&f, KVO_XFER_LOAD, ops, 2), 0);
    d = fk_since(c1);
    fx_check_loaded(&f, 0, back);
    fx_check_loaded(&f, 1, back);
    ASSERT_EQ_INT(d.launches, s->load_kernel);
    ASSERT_EQ_INT(d.kernel_pieces, s->load_kernel ? 2 * (long)s->layers * f.bpc : 0);
    ASSERT_EQ_INT(d.batches, !s->load_kernel);
    ASSERT_EQ_INT(d.memcpys, 0);
    ASSERT_EQ_INT(d.waits, 1);
    ASSERT_EQ_INT(d.records, 1);
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(f.cu, &st));
    ASSERT_EQ_U64(st.units, 2); /* one per job: a unit is the whole job */
    ASSERT_EQ_U64(st.errors, 0);
    ASSERT_TRUE(st.kernel_available);
    ASSERT_TRUE(st.batch_available);
    printf("%u x %llu KiB: per job %s, one host wait, byte-exact\n", s->layers, (unsigned long long)(s->page >> 10),
           s->load_kernel ? "one batch (store) / one launch (load)" : "one batch");
    fx_close(&f);
    ASSERT_EQ_INT(fk_live(), 0);
}

KVO_TEST(one_batch_or_launch_and_one_wait_per_job_at_engine_shapes) {
    const shape shapes[] = {{64, 32 << 10, 0}, {160, 8 << 10, 1}, {61, 18 << 10, 1}, {1, 2 << 20, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) job_shape(&shapes[i]);
}

/* Jobs of several groups (vLLM's hybrid models submit one per group; a
 * job of two is still one batch). */
KVO_TEST(a_job_of_two_groups_is_one_batch) {
    fk_reset(1);
    const xt_gspec gs[2] = {{"a", KVO_GROUP_FULL, 3, 40000, true}, {"b", KVO_GROUP_FULL, 2, 65536, true}};
    kvo_plan *plan = xt_group_plan(gs, 2, 4);
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda *cu;
    ASSERT_OK(kvo_cuda_create(&cp, &cu));
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    tp.device = "cuda";
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_segment segs[5];
    unsigned char *mem[5];
    for (int i = 0; i < 5; i++) {
        uint64_t page = gs[i < 3 ? 0 : 1].page;
        mem[i] = fk_dev_alloc(0, 8 * page);
        xt_fill_random(mem[i], 8 * page);
        segs[i] = (kvo_segment){i < 3 ? 0u : 1u, mem[i], 8, page, page};
    }
    ASSERT_OK(kvo_transfer_set_layout(t, segs, 5));
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = kvo_plan_group(plan, 0)->slot_bytes + kvo_plan_group(plan, 1)->slot_bytes;
    kvo_arena *arena;
    ASSERT_OK(kvo_arena_create(&ap, &arena));
    ASSERT_OK(kvo_cuda_pin_arena(cu, arena));
    unsigned char *slot = kvo_arena_base(arena);
    uint64_t ba[4] = {1, 3, 5, 7}, bb[4] = {6, 4, 2, 0};
    kvo_xfer_op ops[2] = {{0, 0, 4, ba, slot, kvo_plan_group(plan, 0)->slot_bytes},
                          {1, 0, 4, bb, slot + kvo_plan_group(plan, 0)->slot_bytes,
                           kvo_plan_group(plan, 1)->slot_bytes}};
    fk_counts c0 = fk_counts_now();
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops, 2, &id));
    ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
    fk_counts c1 = fk_counts_now();
    ASSERT_EQ_INT(c1.batches - c0.batches, 1);
    ASSERT_EQ_INT(c1.batch_pieces - c0.batch_pieces, 3 * 4 + 2 * 4);
    ASSERT_EQ_INT(c1.waits - c0.waits, 1);
    for (int l = 0; l < 3; l++)
        for (int b = 0; b < 4; b++)
            ASSERT_MEM_EQ(slot + (4 * l + b) * 40000, mem[l] + ba[b] * 40000, 40000);
    kvo_transfer_destroy(t);
    kvo_cuda_destroy(cu);
    kvo_arena_destroy(arena);
    for (int i = 0; i < 5; i++) fk_dev_free(mem[i]);
    kvo_plan_destroy(plan);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* ---- drivers that lack something ------------------------------------------ */

KVO_TEST(old_driver_without_batches_copies_piece_by_piece_and_says_so_once) {
    fk_reset(1);
    FK_API.cuMemcpyBatchAsync = NULL; /* a driver older than CUDA 12.8 */
    log_watch("batched copies are off");
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    uint64_t ids[24];
    fx_start(&f, 64, 32 << 10, 2, &cp, 2, ids);
    fk_counts d = fx_store2(&f, ids);
    ASSERT_EQ_INT(d.batches, 0);
    ASSERT_EQ_INT(d.memcpys, 2 * 64 * 8);
    ASSERT_EQ_INT(d.waits, 1); /* still one wait per job */
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(f.cu, &st));
    ASSERT_FALSE(st.batch_available);
    kvo_cuda_params strict = cp;
    strict.batch = 1;
    strict.device_index = 0;
    fx_close(&f);
    kvo_cuda *cu = NULL;
    ASSERT_ERR(kvo_cuda_create(&strict, &cu), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "cuMemcpyBatchAsync");
    /* A second context: not said again. */
    ASSERT_OK(kvo_cuda_create(&cp, &cu));
    kvo_cuda_destroy(cu);
    ASSERT_EQ_INT(__atomic_load_n(&LOG_HITS, __ATOMIC_RELAXED), 1);
    kvo_set_log(NULL, NULL, KVO_LOG_WARN);
    ASSERT_EQ_INT(fk_live(), 0);
}

KVO_TEST(refused_batch_falls_back_to_single_copies_for_good) {
    fk_reset(1);
    fk.refuse_batch = true;
    log_watch("batched copies are off");
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    uint64_t ids[24];
    fx_start(&f, 4, 65536, 2, &cp, 1, ids);
    for (int round = 0; round < 2; round++) {
        fx_store2(&f, ids);
        memset(f.slots, 0, 2 * f.slot_bytes);
    }
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(f.cu, &st));
    ASSERT_EQ_U64(st.batch_refused, 1);
    ASSERT_EQ_U64(st.batch_calls, 0);
    ASSERT_EQ_U64(st.memcpy_calls, 2 * 2 * 4 * 8);
    /* Said once per process (run alone, here; after the test above in one
     * process, there). */
    ASSERT_LE_INT(__atomic_load_n(&LOG_HITS, __ATOMIC_RELAXED), 1);
    kvo_set_log(NULL, NULL, KVO_LOG_WARN);
    fx_close(&f);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* The fatbin first; a driver that cannot take it (a CUDA 12 driver and CUDA
 * 13's code) gets the PTX; when neither loads, small pages of a load go to
 * the copy engine, and that is said once. */
KVO_TEST(kernel_from_fatbin_else_ptx_else_copy_engine) {
    for (int mode = 0; mode < 3; mode++) {
        fk_reset(1);
        fk.fatbin_fails = mode >= 1;
        fk.ptx_fails = mode >= 2;
        log_watch("kernel does not load");
        fx f;
        kvo_cuda_params cp = kvo_cuda_default_params();
        uint64_t ids[24];
        fx_start(&f, 160, 8 << 10, 2, &cp, 2, ids);
        kvo_xfer_op ops[2];
        fx_ops(&f, ops, 0, 2, ids);
        memcpy(f.slots, f.want, 2 * f.slot_bytes); /* anything: a load of it */
        fk_counts c0 = fk_counts_now();
        ASSERT_EQ_INT(fx_run(&f, KVO_XFER_LOAD, ops, 2), 0);
        fk_counts c1 = fk_counts_now();
        fx_check_loaded(&f, 0, ids);
        fx_check_loaded(&f, 1, ids);
        kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
        ASSERT_OK(kvo_cuda_get_stats(f.cu, &st));
        ASSERT_EQ_INT(st.kernel_available, mode < 2);
        ASSERT_EQ_INT(c1.launches - c0.launches, mode < 2);
        ASSERT_EQ_INT(c1.batches - c0.batches, mode == 2);
        ASSERT_EQ_INT(__atomic_load_n(&LOG_HITS, __ATOMIC_RELAXED), mode == 2);
        kvo_set_log(NULL, NULL, KVO_LOG_WARN);
        fx_close(&f);
        ASSERT_EQ_INT(fk_live(), 0);
    }
}

KVO_TEST(stores_use_the_kernel_only_when_asked) {
    fk_reset(1);
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.kernel_stores = true;
    uint64_t ids[24];
    fx_start(&f, 160, 8 << 10, 2, &cp, 2, ids);
    fk_counts d = fx_store2(&f, ids);
    ASSERT_EQ_INT(d.launches, 1);
    ASSERT_EQ_INT(d.batches, 0);
    fx_close(&f);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* ---- the defects of issue 49 ----------------------------------------------- */

/* A job that times out leaves its kernel queued on the GPU; the worker's next
 * job must not rewrite the descriptors that kernel will read.  The engine's
 * compute stream is held, so both loads (ordered after it) stay queued past
 * their 50 ms deadline; once it is released the first job's kernel runs and
 * must find its own descriptors and copy its own pages.  (Before the fix the
 * worker reused its descriptor buffer: fk.desc_changed was 1 and the first
 * job's blocks held the second's pages.) */
/* A fresh fake whose device 0 has a compute stream, held (the GPU is busy
 * with it); the fixture's context orders jobs after it, with a completion
 * deadline of timeout_ms, and one worker. */
static CUstream fx_start_held(fx *f, uint32_t layers, uint64_t page, size_t n_slots, uint32_t timeout_ms,
                              uint64_t ids[24]) {
    fk_reset(1);
    CUstream compute = fk_stream(0);
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.compute_stream = compute;
    cp.completion_timeout_ms = timeout_ms;
    fx_start(f, layers, page, n_slots, &cp, 1, ids);
    fk_hold(compute, true);
    return compute;
}

KVO_TEST(timed_out_job_buffers_are_never_reused) {
    fx f;
    uint64_t ids[24];
    CUstream compute = fx_start_held(&f, 160, 8 << 10, 2, 50, ids);
    xt_fill_random(f.slots, 2 * f.slot_bytes);
    kvo_xfer_op a, b;
    fx_ops(&f, &a, 0, 1, ids);
    fx_ops(&f, &b, 1, 1, ids);
    ASSERT_EQ_INT(fx_run(&f, KVO_XFER_LOAD, &a, 1), KVO_ETIMEDOUT);
    ASSERT_EQ_INT(fx_run(&f, KVO_XFER_LOAD, &b, 1), KVO_ETIMEDOUT);
    ASSERT_FALSE(fk_stream_idle(f.cu->stream[KVO_XFER_LOAD]));
    fk_hold(compute, false); /* the GPU gets going again */
    ASSERT_TRUE(fk_stream_idle(f.cu->stream[KVO_XFER_LOAD]));
    ASSERT_EQ_INT(fk.desc_changed, 0);
    fx_check_loaded(&f, 0, ids);
    fx_check_loaded(&f, 1, ids);
    kvo_cuda_stats st = KVO_CUDA_STATS_INIT;
    ASSERT_OK(kvo_cuda_get_stats(f.cu, &st));
    ASSERT_EQ_U64(st.timeouts, 2);
    /* The streams are idle again: destroy frees everything. */
    fx_close(&f);
    fk_cuStreamDestroy(compute);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* Destroy while the GPU is stuck returns at once and calls nothing that
 * waits: the context's streams, events and buffers are left behind. */
KVO_TEST(stuck_context_is_left_behind_not_waited_for) {
    fx f;
    uint64_t ids[24];
    CUstream compute = fx_start_held(&f, 4, 65536, 1, 30, ids);
    kvo_xfer_op a;
    fx_ops(&f, &a, 0, 1, ids);
    ASSERT_EQ_INT(fx_run(&f, KVO_XFER_STORE, &a, 1), KVO_ETIMEDOUT);
    fk_counts c0 = fk_counts_now();
    kvo_transfer_destroy(f.t);
    kvo_cuda_destroy(f.cu);
    fk_counts c1 = fk_counts_now();
    ASSERT_EQ_INT(c1.stream_syncs - c0.stream_syncs, 0);
    ASSERT_GT_INT(fk_live(), 1); /* streams, events, the registration's context reference */
    fk_hold(compute, false);
    kvo_arena_destroy(f.arena);
    for (uint32_t l = 0; l < f.layers; l++) fk_dev_free(f.seg[l]);
    free(f.seg);
    free(f.want);
    kvo_plan_destroy(f.plan);
    fk_reset(1); /* frees what was left */
}

/* The compute stream given as the legacy default stream ((void *)1): the
 * store's mark must be recorded on *this* device's legacy stream, whatever
 * device the submitting thread has current.  The submitting thread has
 * device 1 current; device 0's legacy stream is held (its "forward pass"
 * still runs), so the store must wait.  (Before the fix the mark was
 * recorded with device 1's context current: CUDA refuses an event of
 * device 0 on device 1's stream, and the submit failed with KVO_EIO.) */
KVO_TEST(submit_marks_the_compute_stream_of_this_device) {
    fk_reset(2);
    for (int control = 0; control < 2; control++) {
        fx f;
        kvo_cuda_params cp = kvo_cuda_default_params();
        cp.compute_stream = control ? NULL : (void *)CU_STREAM_LEGACY;
        uint64_t ids[24];
        fx_start(&f, 8, 16384, 1, &cp, 1, ids);
        kvo_xfer_op a;
        fx_ops(&f, &a, 0, 1, ids);
        fk_hold(fk.ctx[0].legacy, true);
        fk_cuCtxSetCurrent(&fk.ctx[1]); /* the caller works on device 1 */
        uint64_t id;
        ASSERT_OK(kvo_transfer_submit(f.t, KVO_XFER_STORE, &a, 1, &id));
        CUcontext cur = NULL;
        fk_cuCtxGetCurrent(&cur);
        ASSERT_EQ_PTR(cur, &fk.ctx[1]); /* submit left it alone */
        CUevent ev = fk_event(0);
        ASSERT_OK(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_STORE, id, ev)); /* the copies are enqueued */
        if (!control) {
            ASSERT_EQ_INT(fk_cuEventQuery(ev), CUDA_ERROR_NOT_READY);
            ASSERT_FALSE(fk_stream_idle(f.cu->stream[KVO_XFER_STORE]));
            for (size_t i = 0; i < f.slot_bytes; i++)
                if (f.slots[i]) FAILF("the store copied byte %zu before the forward pass ended", i);
        } else {
            /* Negative control: without a compute stream nothing waits for
             * the held stream, and the bytes are there at once. */
            ASSERT_EQ_INT(xt_wait_one(f.t, id).status, 0);
            fx_check_slot(&f, 0, ids);
        }
        fk_hold(fk.ctx[0].legacy, false);
        if (!control) ASSERT_EQ_INT(xt_wait_one(f.t, id).status, 0);
        fx_check_slot(&f, 0, ids);
        fk_cuEventDestroy(ev);
        fk_cuCtxSetCurrent(NULL);
        fx_close(&f);
        ASSERT_EQ_INT(fk_live(), 0);
    }
}

/* kvo_cuda_job_event right after the submit (layer-wise loads): the event
 * completes after every copy of the job, and a consumer on another stream
 * that waits for it reads the loaded bytes.  The engine's compute stream
 * is held, so the load's copies (ordered after it) are queued and not run:
 * the event must not be complete.  (Before the fix the call refused with
 * KVO_EAGAIN until the job had finished.)  Negative control: an event of
 * kvo_cuda_record_event on the store stream, recorded at the same moment,
 * completes at once: the check can tell "after the copies" from "now". */
KVO_TEST(job_event_completes_after_the_jobs_copies) {
    fk_reset(1);
    CUstream compute = fk_stream(0), consumer = fk_stream(0);
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.compute_stream = compute;
    uint64_t ids[24];
    fx_start(&f, 160, 8 << 10, 1, &cp, 2, ids);
    xt_fill_random(f.slots, f.slot_bytes);
    kvo_xfer_op a;
    fx_ops(&f, &a, 0, 1, ids);
    fk_hold(compute, true);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(f.t, KVO_XFER_LOAD, &a, 1, &id));
    CUevent ev = fk_event(0), other = fk_event(0);
    ASSERT_OK(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_LOAD, id, ev));
    ASSERT_OK(kvo_cuda_record_event(f.cu, KVO_XFER_STORE, other));
    ASSERT_EQ_INT(fk_cuEventQuery(other), CUDA_SUCCESS); /* the control */
    ASSERT_EQ_INT(fk_cuEventQuery(ev), CUDA_ERROR_NOT_READY);
    /* The layer that reads the blocks: waits for ev, then reads one page
     * of the last layer (the last piece the job copies). */
    unsigned char probe[8192];
    memset(probe, 0, sizeof probe);
    uint64_t blk = ids[f.bpc - 1];
    fk_cuCtxPushCurrent(&fk.ctx[0]);
    ASSERT_EQ_INT(fk_cuStreamWaitEvent(consumer, ev, 0), CUDA_SUCCESS);
    ASSERT_EQ_INT(fk_cuMemcpyAsync((CUdeviceptr)(uintptr_t)probe,
                                   (CUdeviceptr)(uintptr_t)(f.seg[159] + blk * f.page), sizeof probe, consumer),
                  CUDA_SUCCESS);
    CUcontext c;
    fk_cuCtxPopCurrent(&c);
    ASSERT_FALSE(fk_stream_idle(consumer));
    fk_hold(compute, false);
    ASSERT_TRUE(fk_stream_idle(consumer));
    ASSERT_MEM_EQ(probe, f.slots + ((uint64_t)f.bpc * 159 + f.bpc - 1) * f.page, sizeof probe);
    ASSERT_EQ_INT(xt_wait_one(f.t, id).status, 0);
    /* A finished job: the event completes at once. */
    ASSERT_OK(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_LOAD, id, ev));
    ASSERT_EQ_INT(fk_cuEventQuery(ev), CUDA_SUCCESS);
    fk_cuEventDestroy(ev);
    fk_cuEventDestroy(other);
    fk_cuStreamDestroy(compute);
    fk_cuStreamDestroy(consumer);
    fx_close(&f);
    ASSERT_EQ_INT(fk_live(), 0);
}

KVO_TEST(job_event_errors) {
    fk_reset(1);
    fx f;
    kvo_cuda_params cp = kvo_cuda_default_params();
    cp.completion_timeout_ms = 40;
    uint64_t ids[24];
    fx_start(&f, 2, 65536, 1, &cp, 1, ids);
    kvo_xfer_op a;
    fx_ops(&f, &a, 0, 1, ids);
    CUevent ev = fk_event(0);
    /* Held in the engine (no worker takes it): bounded by the timeout. */
    kvo__transfer_pause(f.t, true);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(f.t, KVO_XFER_LOAD, &a, 1, &id));
    ASSERT_ERR(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_LOAD, id, ev), KVO_EAGAIN);
    ASSERT_CONTAINS(kvo_last_error(), "not enqueued yet");
    ASSERT_ERR(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_STORE, id, ev), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "is a load");
    /* Canceled before a worker took it: the job's error. */
    ASSERT_OK(kvo_transfer_cancel(f.t, id));
    ASSERT_EQ_INT(xt_wait_one(f.t, id).status, KVO_ECANCELED);
    kvo__transfer_pause(f.t, false);
    ASSERT_ERR(kvo_cuda_job_event(f.cu, f.t, KVO_XFER_LOAD, 999, ev), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_cuda_job_event(f.cu, f.t, (kvo_xfer_dir)7, id, ev), KVO_EINVAL);
    /* A slot that is not pinned: the job fails before its copies are
     * enqueued. */
    unsigned char *loose = malloc(f.slot_bytes);
    kvo_xfer_op bad = {0, 0, f.bpc, ids, loose, f.slot_bytes};
    ASSERT_EQ_INT(fx_run(&f, KVO_XFER_STORE, &bad, 1), KVO_EINVAL);
    free(loose);
    fk_cuEventDestroy(ev);
    fx_close(&f);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* Memory the caller registered itself counts as pinned only where a
 * registration covers all of a slot: a slot that starts inside the caller's
 * registered range and ends outside it is refused (before the fix it was
 * taken as pinned from its first byte).  Control: a slot inside it passes.
 * The same with a driver that reports no registration ranges. */
KVO_TEST(partly_registered_memory_is_not_pinned) {
    for (int noranges = 0; noranges < 2; noranges++) {
        fk_reset(1);
        fk.no_range_attrs = noranges;
        fx f;
        kvo_cuda_params cp = kvo_cuda_default_params();
        fx_open(&f, 1, 65536, 24, 4, 1, &cp, 1);
        uint64_t ids[24];
        fx_blocks(&f, ids);
        size_t chunk = 4 * 65536;
        unsigned char *buf = aligned_alloc(4096, 3 * chunk);
        ASSERT_EQ_INT(fk_cuMemHostRegister(buf, 2 * chunk, 0), CUDA_SUCCESS); /* the caller's */
        kvo_xfer_op in = {0, 0, 4, ids, buf + chunk / 2, chunk};
        kvo_xfer_op across = {0, 0, 4, ids, buf + chunk + chunk / 2, chunk};
        ASSERT_EQ_INT(fx_run(&f, KVO_XFER_STORE, &in, 1), 0);
        ASSERT_MEM_EQ(buf + chunk / 2, f.want + ids[0] * 65536, 65536);
        ASSERT_EQ_INT(fx_run(&f, KVO_XFER_STORE, &across, 1), KVO_EINVAL);
        /* Pinning: a range the caller's registration covers is used as it
         * is (and left registered); one it only partly covers is refused. */
        ASSERT_OK(kvo_cuda_pin_host(f.cu, buf, 2 * chunk));
        ASSERT_OK(kvo_cuda_unpin_host(f.cu, buf));
        ASSERT_ERR(kvo_cuda_pin_host(f.cu, buf + chunk, 2 * chunk), KVO_EEXIST);
        ASSERT_CONTAINS(kvo_last_error(), "partly registered");
        CUdeviceptr d;
        ASSERT_EQ_INT(fk_cuMemHostGetDevicePointer(&d, buf, 0), CUDA_SUCCESS); /* still the caller's */
        ASSERT_EQ_INT(fk_cuMemHostUnregister(buf), CUDA_SUCCESS);
        free(buf);
        fx_close(&f);
        ASSERT_EQ_INT(fk_live(), 0);
    }
}

/* ---- threads, devices, memory ---------------------------------------------- */

KVO_TEST(callers_current_context_is_kept) {
    fk_reset(2);
    for (int with = 0; with < 2; with++) {
        if (with) fk_cuCtxSetCurrent(&fk.ctx[1]);
        fx f;
        kvo_cuda_params cp = kvo_cuda_default_params();
        cp.compute_stream = (void *)CU_STREAM_LEGACY;
        uint64_t ids[24];
        fx_start(&f, 2, 65536, 1, &cp, 2, ids);
        kvo_xfer_op a;
        fx_ops(&f, &a, 0, 1, ids);
        ASSERT_EQ_INT(fx_run(&f, KVO_XFER_STORE, &a, 1), 0);
        CUevent ev = fk_event(0);
        ASSERT_OK(kvo_cuda_record_event(f.cu, KVO_XFER_LOAD, ev));
        fk_cuEventDestroy(ev);
        fx_close(&f);
        CUcontext cur = (CUcontext)1;
        fk_cuCtxGetCurrent(&cur);
        ASSERT_EQ_PTR(cur, with ? &fk.ctx[1] : NULL);
        ASSERT_EQ_INT(fk_live(), 0);
    }
    fk_cuCtxSetCurrent(NULL);
}

KVO_TEST(foreign_memory_and_streams_are_refused) {
    fk_reset(2);
    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda *cu;
    ASSERT_OK(kvo_cuda_create(&cp, &cu));
    kvo_plan *plan = xt_one_group_plan(1, 65536, 4);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    tp.device = "cuda";
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    unsigned char *d1 = fk_dev_alloc(1, 8 * 65536), *host = malloc(8 * 65536);
    kvo_segment bad = {0, d1, 8, 65536, 65536};
    ASSERT_ERR(kvo_transfer_set_layout(t, &bad, 1), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "device 1");
    ASSERT_CONTAINS(kvo_last_error(), "device 0");
    kvo_segment hostseg = {0, host, 8, 65536, 65536};
    ASSERT_ERR(kvo_transfer_set_layout(t, &hostseg, 1), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "not CUDA device memory");
    CUstream s1 = fk_stream(1);
    ASSERT_ERR(kvo_cuda_set_compute_stream(cu, s1), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "device 1");
    kvo_cuda *dup = NULL;
    ASSERT_ERR(kvo_cuda_create(&cp, &dup), KVO_EEXIST);
    kvo_cuda_params cp9 = cp;
    cp9.device_index = 3;
    ASSERT_ERR(kvo_cuda_create(&cp9, &dup), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "does not exist");
    fk_cuStreamDestroy(s1);
    kvo_transfer_destroy(t);
    kvo_cuda_destroy(cu);
    kvo_plan_destroy(plan);
    fk_dev_free(d1);
    free(host);
    ASSERT_EQ_INT(fk_live(), 0);
}

/* ---- the benchmark (bench/bench_transfer_cuda.c) on the fake driver ------------
 * Compiled into this program (CMakeLists.txt, CUDA section) with the few CLI
 * helpers it calls defined here, so its own code is checked without a GPU:
 * every shape gives its figures and limits, and it releases what it made. */
#include "bench_transfer.h"

typedef struct fig {
    char name[96];
    double value, limit;
} fig;
static fig FIGS[64];
static int NFIGS;

double kvo_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
double kvo_bench_median(double *v, size_t n) { return n ? v[n / 2] : 0; }
void kvo_bench_progress(const kvo_bench_out *o, const char *fmt, ...) {
    (void)o;
    (void)fmt;
}
kvo_plan *kvo_bench_plan_one(const char *name, uint64_t page_bytes, uint32_t blocks_per_chunk) {
    (void)name;
    return xt_one_group_plan(1, page_bytes, blocks_per_chunk);
}
void kvo_bench_report(const kvo_bench_out *o, const char *name, double value, const char *unit,
                      const char *limit_name, double limit) {
    (void)o;
    (void)unit;
    (void)limit_name;
    ASSERT_LT_INT(NFIGS, 64);
    snprintf(FIGS[NFIGS].name, sizeof FIGS[NFIGS].name, "%s", name);
    FIGS[NFIGS].value = value;
    FIGS[NFIGS++].limit = limit;
}
int kvo_cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    (void)opt;
    char *end;
    *out = strtoull(s, &end, 10);
    return *end || *out < min || *out > max ? KVO_EINVAL : 0;
}

static const fig *find_fig(const char *name) {
    for (int i = 0; i < NFIGS; i++)
        if (!strcmp(FIGS[i].name, name)) return &FIGS[i];
    FAILF("no figure %s", name);
}

KVO_TEST(bench_transfer_cuda_runs_on_the_fake_driver) {
    fk_reset(1);
    char *argv[] = {"transfer", "--device", "cuda", "--layout", "4x32KiB,16x8KiB", "--total-mib", "8", "--reps",
                    "2", NULL};
    kvo_bench_out o = {false};
    NFIGS = 0;
    ASSERT_EQ_INT(kvo_bench_transfer_cuda(9, argv, &o), 0);
    /* per shape and direction: the job (vs contiguous), .vs_vllm,
     * .vllm_way; for 8 KiB pages also the other paths */
    ASSERT_EQ_INT(NFIGS, 2 * 2 * 3 + 2);
    const char *names[] = {"transfer.cuda.store.4x32KiB", "transfer.cuda.load.4x32KiB.vs_vllm",
                           "transfer.cuda.load.16x8KiB", "transfer.cuda.store.16x8KiB.vllm_way",
                           "transfer.cuda.load.16x8KiB.copy_engine_only", "transfer.cuda.store.16x8KiB.kernel_stores"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const fig *f = find_fig(names[i]);
        ASSERT_TRUE(f->value > 0 && f->limit > 0);
    }
    ASSERT_EQ_INT(fk_live(), 0);
    /* No device: skipped, exit 0, no figure. */
    fk_reset(0);
    NFIGS = 0;
    ASSERT_EQ_INT(kvo_bench_transfer_cuda(9, argv, &o), 0);
    ASSERT_EQ_INT(NFIGS, 0);
    char *bad[] = {"transfer", "--device", "cuda", "--layout", "64y32KiB", NULL};
    ASSERT_EQ_INT(kvo_bench_transfer_cuda(5, bad, &o), 2); /* KVO_EXIT_USAGE */
}
