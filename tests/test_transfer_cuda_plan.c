/*
 * The CUDA device's copy planning (src/transfer/cuda/cuda_plan.c): pure C, runs on
 * every build, with or without CUDA.  Checks coalescing, the kernel /
 * batch / single-copy decisions and that no byte is lost or duplicated.
 */
#include <stdlib.h>

#include "kvo_test.h"
#include "xfer_test_util.h"
#include "transfer/cuda/cuda_plan.h"

/* Sum of bytes and an order-independent signature of the byte pairs
 * (dst + k, src + k) copied: sum over every byte of A*d + B*s + C*d*s, in
 * closed form per piece, so that merging or reordering pieces keeps it and
 * losing, duplicating or shifting a byte changes it. */
static void footprint(const kvo__cuda_piece *p, size_t n, uint64_t *bytes, uint64_t *sig) {
    const uint64_t A = 0x9E3779B97F4A7C15ull, B = 0xC2B2AE3D27D4EB4Full, C = 0x165667B19E3779F9ull;
    *bytes = 0;
    *sig = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned __int128 b = p[i].bytes, d = p[i].dst, s = p[i].src;
        uint64_t k1 = (uint64_t)(b * (b - 1) / 2), k2 = (uint64_t)(b * (b - 1) * (2 * b - 1) / 6);
        uint64_t sd = (uint64_t)(b * d) + k1, ss = (uint64_t)(b * s) + k1;
        uint64_t sds = (uint64_t)(b * d * s) + (uint64_t)(d + s) * k1 + k2;
        *bytes += p[i].bytes;
        *sig += A * sd + B * ss + C * sds;
    }
}

KVO_TEST(coalesce_merges_runs_adjacent_on_both_sides) {
    kvo__cuda_piece p[] = {
        {1000, 5000, 100, 0}, {1100, 5100, 50, 0},  /* both sides continue: merge */
        {1150, 9000, 10, 0},                        /* dst continues, src jumps: no */
        {1160, 9010, 10, 0},                        /* continues the previous: merge */
        {2000, 9020, 10, 0},                        /* dst jumps: no */
        {2010, 9030, 10, 7},                        /* other host alias: no */
    };
    uint64_t b0, s0, b1, s1;
    footprint(p, 6, &b0, &s0);
    size_t n = kvo__cuda_coalesce(p, 6);
    ASSERT_EQ_U64(n, 4);
    ASSERT_EQ_U64(p[0].bytes, 150);
    ASSERT_EQ_U64(p[1].dst, 1150);
    ASSERT_EQ_U64(p[1].bytes, 20);
    ASSERT_EQ_U64(p[2].dst, 2000);
    ASSERT_EQ_INT(p[3].hdelta, 7);
    footprint(p, n, &b1, &s1);
    ASSERT_EQ_U64(b1, b0);
    ASSERT_EQ_U64(s1, s0);
    ASSERT_EQ_U64(kvo__cuda_coalesce(p, 0), 0);
}

KVO_TEST(many_small_pages_go_to_the_kernel_large_ones_to_one_batch) {
    kvo__cuda_plan_cfg cfg = kvo__cuda_plan_default_cfg(true);
    ASSERT_EQ_U64(cfg.kernel_max_bytes, 28 << 10);
    ASSERT_EQ_U64(cfg.kernel_min_pieces, 16);
    cfg.kernel_min_pieces = 4;
    kvo__cuda_piece p[12];
    /* Scattered (nothing adjacent): 8 pages of 16 KiB, 4 of 64 KiB. */
    for (size_t i = 0; i < 12; i++) {
        uint64_t b = i % 3 == 2 ? 65536 : 16384;
        p[i] = (kvo__cuda_piece){(uintptr_t)(1u << 24) * (i + 1), (uintptr_t)(1u << 20) * (i * 7 + 3), b, 0};
    }
    size_t n = kvo__cuda_coalesce(p, 12);
    ASSERT_EQ_U64(n, 12);
    kvo__cuda_plan pl;
    kvo__cuda_plan_make(&cfg, p, n, &pl);
    ASSERT_EQ_U64(pl.n_kernel, 8);
    ASSERT_EQ_U64(pl.n_copy, 4);
    ASSERT_TRUE(pl.batched);
    for (size_t i = 0; i < pl.n_kernel; i++) ASSERT_LE_U64(p[i].bytes, cfg.kernel_max_bytes);
    for (size_t i = pl.n_kernel; i < n; i++) ASSERT_GT_U64(p[i].bytes, cfg.kernel_max_bytes);
    /* Without batched copies the rest are single copies. */
    cfg.batch = false;
    kvo__cuda_plan_make(&cfg, p, n, &pl);
    ASSERT_EQ_U64(pl.n_kernel, 8);
    ASSERT_FALSE(pl.batched);
}

KVO_TEST(few_small_pages_use_the_copy_engine) {
    kvo__cuda_plan_cfg cfg = kvo__cuda_plan_default_cfg(true);
    kvo__cuda_piece p[3] = {{0x10000, 0x900000, 4096, 0}, {0x30000, 0x910000, 4096, 0}, {0x50000, 0x920000, 4096, 0}};
    kvo__cuda_plan pl;
    kvo__cuda_plan_make(&cfg, p, 3, &pl);   /* 3 < kernel_min_pieces (16) */
    ASSERT_EQ_U64(pl.n_kernel, 0);
    ASSERT_EQ_U64(pl.n_copy, 3);
    ASSERT_TRUE(pl.batched);
    /* One piece: a single cudaMemcpyAsync, never a batch of one. */
    kvo__cuda_plan_make(&cfg, p, 1, &pl);
    ASSERT_EQ_U64(pl.n_copy, 1);
    ASSERT_FALSE(pl.batched);
    /* Kernel disabled (kernel_max_bytes 0): everything to the copy engine. */
    cfg.kernel_max_bytes = 0;
    cfg.kernel_min_pieces = 0;
    kvo__cuda_plan_make(&cfg, p, 3, &pl);
    ASSERT_EQ_U64(pl.n_kernel, 0);
    ASSERT_EQ_U64(pl.n_copy, 3);
}

KVO_TEST(kernel_takes_at_most_its_capacity) {
    kvo__cuda_plan_cfg cfg = kvo__cuda_plan_default_cfg(false);
    cfg.kernel_cap = 5;
    cfg.kernel_min_pieces = 4;
    kvo__cuda_piece p[9];
    for (size_t i = 0; i < 9; i++) p[i] = (kvo__cuda_piece){0x100000 * (i + 1), 0x40000000 + 0x10000 * i * 3, 512, 0};
    kvo__cuda_plan pl;
    kvo__cuda_plan_make(&cfg, p, 9, &pl);
    ASSERT_EQ_U64(pl.n_kernel, 5);
    ASSERT_EQ_U64(pl.n_copy, 4);
    ASSERT_FALSE(pl.batched);
}

/* Random units: after coalescing and planning, the same bytes are copied
 * exactly once, kernel pieces are small, the counts add up. */
KVO_TEST(random_units_keep_every_byte_once) {
    kvo__cuda_plan_cfg cfg = kvo__cuda_plan_default_cfg(true);
    enum { N = 64 };
    kvo__cuda_piece p[N];
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + kvo_test_rand() % N;
        uintptr_t dst = 1 << 20, src = 1 << 30;
        for (size_t i = 0; i < n; i++) {
            uint64_t b = 1 + kvo_test_rand() % 40000;
            p[i] = (kvo__cuda_piece){dst, src, b, (int64_t)(kvo_test_rand() % 2)};
            /* Half the time the next piece continues this one on both sides. */
            uint64_t gap = kvo_test_rand() % 2 ? 0 : 4096 * (1 + kvo_test_rand() % 4);
            dst += b + gap;
            src += b + (kvo_test_rand() % 4 == 0 ? 64 : gap);
        }
        uint64_t b0, s0, b1, s1;
        footprint(p, n, &b0, &s0);
        size_t m = kvo__cuda_coalesce(p, n);
        ASSERT_LE_U64(m, n);
        for (size_t i = 1; i < m; i++)
            ASSERT_FALSE(p[i].dst == p[i - 1].dst + p[i - 1].bytes && p[i].src == p[i - 1].src + p[i - 1].bytes &&
                         p[i].hdelta == p[i - 1].hdelta);
        kvo__cuda_plan pl;
        cfg.kernel_min_pieces = (uint32_t)(kvo_test_rand() % 6);
        kvo__cuda_plan_make(&cfg, p, m, &pl);
        ASSERT_EQ_U64(pl.n_kernel + pl.n_copy, m);
        for (size_t i = 0; i < pl.n_kernel; i++) ASSERT_LE_U64(p[i].bytes, cfg.kernel_max_bytes);
        if (pl.n_kernel) ASSERT_GE_U64(pl.n_kernel, cfg.kernel_min_pieces);
        ASSERT_EQ_INT(pl.batched, pl.n_copy >= 2);
        footprint(p, m, &b1, &s1);
        ASSERT_EQ_U64(b1, b0);
        ASSERT_EQ_U64(s1, s0);
    }
}

KVO_TEST(kernel_grid_is_small_and_never_empty) {
    ASSERT_EQ_U64(kvo__cuda_kernel_grid(1), 1);
    ASSERT_EQ_U64(kvo__cuda_kernel_grid(5), 5);
    ASSERT_EQ_U64(kvo__cuda_kernel_grid(2560), 16); /* 160 layers x 16 blocks: 16 blocks of threads */
    ASSERT_EQ_U64(kvo__cuda_kernel_grid(1u << 24), 16);
}

/* ---- work-unit size asked by a device (device.h unit_bytes, layout.c) ----
 * A "test" device (this executable's own) that asks for 1 MiB units and
 * counts units and copies; and the same device attached at run time as
 * "whole" taking whole jobs (device.h whole_jobs), as the CUDA device does. */
#include "transfer/device.h"

static long UNITS, COPIES;
static uint64_t UNIT_BYTES_SEEN;

static int ud_open(const kvo__xfer_device_config *cfg, void **state) {
    (void)cfg;
    *state = &UNITS;
    return 0;
}
static void ud_close(void *state) { (void)state; }
static int ud_winit(void *state, uint32_t worker, void **wctx) {
    (void)worker;
    *wctx = state;
    return 0;
}
static void ud_wfini(void *state, void *wctx) { (void)state; (void)wctx; }
static void ud_copy(void *wctx, int dir, void *dst, const void *src, uint64_t bytes) {
    (void)wctx;
    (void)dir;
    __atomic_fetch_add(&COPIES, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&UNIT_BYTES_SEEN, bytes, __ATOMIC_RELAXED);
    memcpy(dst, src, bytes);
}
static int ud_unit_end(void *wctx) {
    (void)wctx;
    __atomic_fetch_add(&UNITS, 1, __ATOMIC_RELAXED);
    return 0;
}
static const char *ud_kind(void *state) { (void)state; return "unit-test"; }
static bool ud_nt(void *state) { (void)state; return false; }

const kvo__xfer_device_ops kvo__xfer_device_test = {
    .name = "test", .open = ud_open, .close = ud_close, .check_engine_range = NULL,
    .worker_init = ud_winit, .worker_fini = ud_wfini, .copy = ud_copy, .prefetch = NULL,
    .unit_end = ud_unit_end, .copy_kind = ud_kind, .nontemporal = ud_nt,
    .unit_bytes = 1u << 20,
};
static const kvo__xfer_device_ops WHOLE = {
    .name = "whole", .open = ud_open, .close = ud_close, .check_engine_range = NULL,
    .worker_init = ud_winit, .worker_fini = ud_wfini, .copy = ud_copy, .prefetch = NULL,
    .unit_end = ud_unit_end, .copy_kind = ud_kind, .nontemporal = ud_nt,
    .whole_jobs = true,
};

/* One job of one op over nblk scattered pages of `page` bytes (bpc blocks
 * per chunk) on device `dev`: how many units ran. */
static long units_for(const char *dev, uint64_t page, uint32_t bpc) {
    kvo_plan *p = xt_one_group_plan(1, page, bpc);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = dev;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    uint64_t nb = 2 * (uint64_t)bpc;
    unsigned char *eng = malloc(nb * page), *slot = malloc(bpc * page);
    ASSERT_TRUE(eng && slot);
    for (uint64_t i = 0; i < nb * page; i++) eng[i] = (unsigned char)(i * 7 + i / 4096);
    kvo_segment seg = {0, eng, nb, page, page};
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    uint64_t *blk = malloc(bpc * sizeof *blk);
    for (uint32_t i = 0; i < bpc; i++) blk[i] = 2 * i + 1; /* never adjacent */
    kvo_xfer_op op = {0, 0, bpc, blk, slot, bpc * page};
    __atomic_store_n(&UNITS, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&COPIES, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&UNIT_BYTES_SEEN, 0, __ATOMIC_RELAXED);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_OK(kvo_transfer_wait(t, &id, 1, -1));
    kvo_xfer_result r;
    size_t n;
    ASSERT_OK(kvo_transfer_poll(t, &r, 1, &n));
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, (uint64_t)bpc * page);
    for (uint32_t i = 0; i < bpc; i++) ASSERT_MEM_EQ(slot + i * page, eng + blk[i] * page, page);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
    free(blk);
    free(eng);
    free(slot);
    return __atomic_load_n(&UNITS, __ATOMIC_RELAXED);
}

KVO_TEST(device_unit_bytes_sizes_work_units) {
    /* 64 pages of 16 KiB = 1 MiB: 4 units of the core's default 256 KiB,
     * one for a device asking for 1 MiB units. */
    ASSERT_EQ_INT(units_for("test", 16384, 64), 1);
    ASSERT_EQ_U64(__atomic_load_n(&COPIES, __ATOMIC_RELAXED), 64);
    /* Pages of 3 MiB (>= 2 units): split into 3 parts of about 1 MiB each,
     * one unit per part; every byte copied once. */
    ASSERT_EQ_INT(units_for("test", 3u << 20, 2), 2 * 3);
    ASSERT_EQ_U64(__atomic_load_n(&UNIT_BYTES_SEEN, __ATOMIC_RELAXED), 2 * (3u << 20));
    /* Pages of 1.5 MiB (< 2 units): not split, one page per unit. */
    ASSERT_EQ_INT(units_for("test", 3u << 19, 2), 2);
}

/* A device taking whole jobs gets one unit per job, whatever its segments
 * and page sizes: every page of every layer, then one unit_end. */
KVO_TEST(whole_job_device_gets_one_unit_per_job_across_segments) {
    kvo__core_fns fns;
    ASSERT_OK(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &WHOLE, sizeof WHOLE, &fns, sizeof fns));
    enum { L = 40, NB = 16, BPC = 4 };
    const uint64_t page = 3000;
    kvo_plan *p = xt_one_group_plan(L, page, BPC);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "whole";
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    unsigned char *eng = malloc(L * NB * page);
    const uint64_t sb = kvo_plan_group(p, 0)->slot_bytes;
    unsigned char *slots = calloc(3, sb);
    ASSERT_TRUE(eng && slots);
    xt_fill_random(eng, L * NB * page);
    kvo_segment segs[L];
    for (int l = 0; l < L; l++) segs[l] = (kvo_segment){0, eng + l * NB * page, NB, page, page};
    ASSERT_OK(kvo_transfer_set_layout(t, segs, L));
    uint64_t blk[12] = {1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6};
    kvo_xfer_op ops[3];
    for (int c = 0; c < 3; c++) ops[c] = (kvo_xfer_op){0, 0, BPC, blk + BPC * c, slots + c * sb, sb};
    __atomic_store_n(&UNITS, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&COPIES, 0, __ATOMIC_RELAXED);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops, 3, &id));
    kvo_xfer_result r = xt_wait_one(t, id);
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, 3 * BPC * L * page);
    ASSERT_EQ_INT(__atomic_load_n(&UNITS, __ATOMIC_RELAXED), 1);
    ASSERT_EQ_INT(__atomic_load_n(&COPIES, __ATOMIC_RELAXED), 3 * BPC * L);
    for (int c = 0; c < 3; c++)
        for (int l = 0; l < L; l++)
            for (int b = 0; b < BPC; b++)
                ASSERT_MEM_EQ(slots + c * sb + (BPC * l + b) * page, eng + (l * NB + blk[BPC * c + b]) * page, page);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
    free(eng);
    free(slots);
}
