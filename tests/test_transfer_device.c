/*
 * The device interface from outside the core: a "test" device defined here
 * (memcpy copies, a reachability check, injectable failures) is selected by
 * name.  Covers device failures: the failing job reports the error, jobs
 * that read what it wrote fail with KVO_ECANCELED, independent jobs succeed.
 */
#include <stdlib.h>

#include "kvo_test.h"
#include "transfer/device.h"
#include "transfer/transfer_internal.h"
#include "xfer_test_util.h"

typedef struct tdev {
    int opened_index;
    long copies;      /* atomic */
    int fail_dir;     /* unit_end fails for copies in this direction (-1: none) */
    uintptr_t lo, hi; /* reachable engine memory */
} tdev;

static tdev TD;

typedef struct twctx {
    tdev *d;
    int failed;
} twctx;

static int td_open(const kvo__xfer_device_config *cfg, void **state) {
    TD.opened_index = cfg->index;
    *state = &TD;
    return 0;
}
static void td_close(void *state) { (void)state; }
static int td_check(void *state, const void *base, uint64_t bytes) {
    tdev *d = state;
    if ((uintptr_t)base < d->lo || (uintptr_t)base + bytes > d->hi)
        return kvo__error(KVO_ELAYOUT, "test device: %p + %llu is not device memory", base, (unsigned long long)bytes);
    return 0;
}
static int td_winit(void *state, uint32_t worker, void **wctx) {
    (void)worker;
    twctx *w = calloc(1, sizeof *w);
    if (!w) return KVO_ENOMEM;
    w->d = state;
    *wctx = w;
    return 0;
}
static void td_wfini(void *state, void *wctx) {
    (void)state;
    free(wctx);
}
static void td_copy(void *wctx, int dir, void *dst, const void *src, uint64_t bytes) {
    twctx *w = wctx;
    __atomic_fetch_add(&w->d->copies, 1, __ATOMIC_RELAXED);
    if (dir == __atomic_load_n(&w->d->fail_dir, __ATOMIC_RELAXED)) {
        w->failed = 1; /* a DMA error: nothing copied */
        return;
    }
    memcpy(dst, src, bytes);
}
static int td_unit_end(void *wctx) {
    twctx *w = wctx;
    int f = w->failed;
    w->failed = 0;
    return f ? KVO_EIO : 0;
}
static const char *td_kind(void *state) {
    (void)state;
    return "test-memcpy";
}
static bool td_nt(void *state) {
    (void)state;
    return false;
}

const kvo__xfer_device_ops kvo__xfer_device_test = {
    .name = "test",
    .open = td_open,
    .close = td_close,
    .check_engine_range = td_check,
    .worker_init = td_winit,
    .worker_fini = td_wfini,
    .copy = td_copy,
    .prefetch = NULL,
    .unit_end = td_unit_end,
    .copy_kind = td_kind,
    .nontemporal = td_nt,
};

/* One group "kv": 2 layers of 300-byte pages, chunks of 2 blocks. */
static kvo_plan *plan1(void) { return xt_one_group_plan(2, 300, 2); }

static unsigned char DEVMEM[64 * 1024];

KVO_TEST(device_selected_by_name) {
    kvo_plan *p = plan1();
    memset(&TD, 0, sizeof TD);
    TD.fail_dir = -1;
    TD.lo = (uintptr_t)DEVMEM;
    TD.hi = (uintptr_t)DEVMEM + sizeof DEVMEM;
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "test";
    tp.device_index = 3;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_EQ_INT(TD.opened_index, 3);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_STR(st.device, "test");
    ASSERT_EQ_STR(st.copy_kind, "test-memcpy");
    /* The device's reachability check runs at registration. */
    static unsigned char host[4096];
    kvo_segment bad = {0, host, 4, 600, 600};
    ASSERT_ERR(kvo_transfer_set_layout(t, &bad, 1), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "not device memory");
    ASSERT_CONTAINS(kvo_last_error(), "segment 0");
    kvo_segment good = {0, DEVMEM, 16, 600, 600};
    ASSERT_OK(kvo_transfer_set_layout(t, &good, 1));
    static unsigned char slot[4096];
    for (size_t i = 0; i < 16 * 600; i++) DEVMEM[i] = (unsigned char)(i * 13);
    uint64_t blk[2] = {5, 9}, id;
    kvo_xfer_op op = {0, 0, 2, blk, slot, sizeof slot};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_OK(kvo_transfer_wait(t, &id, 1, -1));
    ASSERT_MEM_EQ(slot, DEVMEM + 5 * 600, 600);
    ASSERT_MEM_EQ(slot + 600, DEVMEM + 9 * 600, 600);
    ASSERT_EQ_U64(__atomic_load_n(&TD.copies, __ATOMIC_RELAXED), 2);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

KVO_TEST(device_failure_fails_job_and_its_readers_only) {
    kvo_plan *p = plan1();
    memset(&TD, 0, sizeof TD);
    TD.fail_dir = -1;
    TD.lo = (uintptr_t)DEVMEM;
    TD.hi = (uintptr_t)DEVMEM + sizeof DEVMEM;
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "test";
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_segment good = {0, DEVMEM, 16, 600, 600};
    ASSERT_OK(kvo_transfer_set_layout(t, &good, 1));
    static unsigned char s1[4096], s2[4096];
    uint64_t a[2] = {1, 2}, b[2] = {3, 4}, c[2] = {6, 7}, ids[3];
    kvo__transfer_pause(t, true);
    __atomic_store_n(&TD.fail_dir, KVO_XFER_STORE, __ATOMIC_RELAXED);
    kvo_xfer_op st = {0, 0, 2, a, s1, sizeof s1};     /* fails (device error) */
    kvo_xfer_op ld = {0, 0, 2, b, s1, sizeof s1};     /* reads s1: must not run */
    kvo_xfer_op ld2 = {0, 0, 2, c, s2, sizeof s2};    /* independent load */
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, &ld2, 1, &ids[2]));
    memset(s2, 0x77, sizeof s2);
    unsigned char before[600];
    memcpy(before, DEVMEM + 3 * 600, 600);
    kvo__transfer_pause(t, false);
    ASSERT_OK(kvo_transfer_wait(t, ids, 3, -1));
    kvo_xfer_result r[3];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(t, r, 3, &n));
    ASSERT_EQ_U64(n, 3);
    for (size_t i = 0; i < n; i++) {
        if (r[i].job_id == ids[0]) ASSERT_EQ_INT(r[i].status, KVO_EIO);
        if (r[i].job_id == ids[1]) ASSERT_EQ_INT(r[i].status, KVO_ECANCELED);
        if (r[i].job_id == ids[2]) ASSERT_EQ_INT(r[i].status, 0);
    }
    ASSERT_MEM_EQ(DEVMEM + 3 * 600, before, 600); /* the dependent load wrote nothing */
    for (int k = 0; k < 600; k++) ASSERT_EQ_INT(DEVMEM[6 * 600 + k], 0x77);
    kvo_transfer_stats stt = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &stt));
    ASSERT_EQ_U64(stt.jobs_failed, 1);
    ASSERT_EQ_U64(stt.jobs_canceled, 1);
    ASSERT_EQ_U64(stt.jobs_ok, 1);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

/* ---- a device attached at run time (as libkvoffload_cuda.so does) ------- */

/* Job hooks: each token is a counter cell; unit_job must see the token of
 * the job whose unit it copies, job_done must release each exactly once. */
static long HOOK_SUBMITS, HOOK_DONE, HOOK_UNITS, HOOK_WRONG;
static int HOOK_FAIL_SUBMIT;
static long HOOK_CELLS[64];
static int th_submit(void *state, int dir, void **token) {
    (void)state;
    if (__atomic_load_n(&HOOK_FAIL_SUBMIT, __ATOMIC_RELAXED))
        return kvo__error(KVO_EIO, "test device: job_submit refused");
    long k = __atomic_fetch_add(&HOOK_SUBMITS, 1, __ATOMIC_RELAXED);
    HOOK_CELLS[k % 64] = dir + 1;
    *token = &HOOK_CELLS[k % 64];
    return 0;
}
static void th_unit_job(void *wctx, void *token) {
    (void)wctx;
    __atomic_fetch_add(&HOOK_UNITS, 1, __ATOMIC_RELAXED);
    if (!token || *(long *)token <= 0) __atomic_fetch_add(&HOOK_WRONG, 1, __ATOMIC_RELAXED);
}
static void th_job_done(void *state, void *token) {
    (void)state;
    if (*(long *)token <= 0) __atomic_fetch_add(&HOOK_WRONG, 1, __ATOMIC_RELAXED); /* released twice */
    *(long *)token = 0;
    __atomic_fetch_add(&HOOK_DONE, 1, __ATOMIC_RELAXED);
}

static kvo__xfer_device_ops ATTACHED;

KVO_TEST(attached_device_found_by_name_and_job_hooks) {
    ATTACHED = kvo__xfer_device_test;
    ATTACHED.name = "attached";
    ATTACHED.job_submit = th_submit;
    ATTACHED.unit_job = th_unit_job;
    ATTACHED.job_done = th_job_done;
    kvo__core_fns fns;
    memset(&fns, 0, sizeof fns);
    /* A device library built for another libkvoffload is refused. */
    ASSERT_ERR(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI + 1, &ATTACHED, sizeof ATTACHED, &fns, sizeof fns),
               KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "another libkvoffload");
    ASSERT_ERR(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &ATTACHED, sizeof ATTACHED - 8, &fns, sizeof fns),
               KVO_ENOTSUP);
    ASSERT_NULL(fns.verror);
    kvo_plan *p = plan1();
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "attached";
    kvo_transfer *t = NULL;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP); /* not attached yet */
    ASSERT_OK(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &ATTACHED, sizeof ATTACHED, &fns, sizeof fns));
    ASSERT_OK(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &ATTACHED, sizeof ATTACHED, &fns, sizeof fns));
    /* The core functions it hands over are the core's: errors land in kvo_last_error(). */
    ASSERT_NOT_NULL(fns.malloc);
    void *m = fns.malloc(16);
    ASSERT_NOT_NULL(m);
    fns.free(m);
    ASSERT_EQ_INT(fns.error_prefix(KVO_EIO, "%s", "through the table"), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "through the table");
    /* Another device of the same name is refused. */
    static kvo__xfer_device_ops other;
    other = ATTACHED;
    ASSERT_ERR(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &other, sizeof other, &fns, sizeof fns), KVO_EEXIST);
    other.name = "test";
    ASSERT_ERR(kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, &other, sizeof other, &fns, sizeof fns), KVO_EEXIST);

    memset(&TD, 0, sizeof TD);
    TD.fail_dir = -1;
    TD.lo = (uintptr_t)DEVMEM;
    TD.hi = (uintptr_t)DEVMEM + sizeof DEVMEM;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_STR(st.device, "attached");
    kvo_segment good = {0, DEVMEM, 16, 600, 600};
    ASSERT_OK(kvo_transfer_set_layout(t, &good, 1));
    static unsigned char s[8][4096];
    uint64_t blk[8][2], ids[8];
    for (int i = 0; i < 8; i++) {
        blk[i][0] = (uint64_t)(2 * i);
        blk[i][1] = (uint64_t)(2 * i + 1);
        kvo_xfer_op op = {0, 0, 2, blk[i], s[i], sizeof s[i]};
        ASSERT_OK(kvo_transfer_submit(t, i % 2 ? KVO_XFER_LOAD : KVO_XFER_STORE, &op, 1, &ids[i]));
    }
    /* A refused job_submit fails the submit and queues nothing. */
    __atomic_store_n(&HOOK_FAIL_SUBMIT, 1, __ATOMIC_RELAXED);
    uint64_t bad_id = 0;
    kvo_xfer_op op0 = {0, 0, 2, blk[0], s[0], sizeof s[0]};
    ASSERT_ERR(kvo_transfer_submit(t, KVO_XFER_STORE, &op0, 1, &bad_id), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "job_submit refused");
    __atomic_store_n(&HOOK_FAIL_SUBMIT, 0, __ATOMIC_RELAXED);
    /* A canceled job's token is released too. */
    kvo__transfer_pause(t, true);
    uint64_t cid;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op0, 1, &cid));
    ASSERT_OK(kvo_transfer_cancel(t, cid));
    kvo__transfer_pause(t, false);
    ASSERT_OK(kvo_transfer_wait(t, ids, 8, -1));
    ASSERT_EQ_U64(__atomic_load_n(&HOOK_SUBMITS, __ATOMIC_RELAXED), 9);
    ASSERT_EQ_U64(__atomic_load_n(&HOOK_DONE, __ATOMIC_RELAXED), 9);
    ASSERT_GE_U64(__atomic_load_n(&HOOK_UNITS, __ATOMIC_RELAXED), 8);
    ASSERT_EQ_U64(__atomic_load_n(&HOOK_WRONG, __ATOMIC_RELAXED), 0);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}
