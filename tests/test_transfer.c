/*
 * Transfer engine: byte-exact round trips for every layout, ordering,
 * cancel, layout changes, completion, errors and concurrency.
 *
 * Every round trip fills engine memory with random bytes, poisons the slots,
 * stores, checks that each target byte of each slot equals the engine page
 * it came from (offsets computed here from the documented slot format, not
 * by the library) and every other byte is still poison, and that the engine
 * memory is unchanged; then it poisons the engine memory, loads, and checks
 * the reverse.
 */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>

#include "fail_alloc.h"
#include "kvo_test.h"
#include "transfer/transfer_internal.h"

#define POISON 0xA5
#define NBLK 16 /* engine blocks per group */

/* ----------------------------------------------------------- fixture -- */

typedef struct gspec {
    const char *name;
    kvo_group_kind kind;
    uint32_t layers;
    uint64_t page;   /* even: K and V halves */
    bool cacheable;
} gspec;

/* Three offloaded groups (pages not multiples of 64; one above the
 * streaming threshold) and one that is not offloaded. */
static const gspec GS[] = {
    {"full", KVO_GROUP_FULL, 3, 200, true},
    {"swa", KVO_GROUP_SLIDING, 2, 136, true},
    {"state", KVO_GROUP_STATE, 1, 9000, true},
    {"nocache", KVO_GROUP_FULL, 1, 64, false},
};
#define NG 4

static kvo_plan *make_plan(uint64_t bpc) {
    kvo_model *m;
    ASSERT_OK(kvo_model_create("xfer-test", 16, &m));
    for (int g = 0; g < NG; g++) {
        kvo_group_desc d = kvo_group_desc_default();
        snprintf(d.name, sizeof d.name, "%s", GS[g].name);
        d.kind = GS[g].kind;
        d.tokens_per_block = 16;
        d.layers = GS[g].layers;
        d.page_bytes = GS[g].page;
        d.window = GS[g].kind == KVO_GROUP_SLIDING ? 64 : 0;
        d.cacheable = GS[g].cacheable;
        ASSERT_OK(kvo_model_add_group(m, &d));
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = bpc;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    return p;
}

enum { L_SEPARATE, L_INTERLEAVED_KV, L_INTERLEAVED_PAGE, L_CROSS, L_PACKED, L_COUNT };
static const char *LNAMES[] = {"kv-separate", "kv-interleaved", "interleaved-page", "cross-layer", "packed"};

typedef struct layout {
    kvo_segment segs[64];
    size_t n;
    unsigned char *mem;
    size_t bytes;
} layout;

static void add_seg(layout *L, uint32_t g, size_t off, uint64_t stride, uint64_t page) {
    ASSERT_LT_U64(L->n, 64);
    L->segs[L->n++] = (kvo_segment){g, L->mem + off, NBLK, stride, page};
}

/* Build a layout of `kind` for every group in one buffer (unaligned
 * offsets, gaps between tensors). */
static void make_layout(layout *L, int kind) {
    memset(L, 0, sizeof *L);
    size_t total = 0;
    for (int g = 0; g < NG; g++) total += (GS[g].layers * GS[g].page + 64) * NBLK + 4096;
    L->bytes = total + 4096;
    L->mem = malloc(L->bytes);
    ASSERT_NOT_NULL(L->mem);
    size_t off = 13; /* deliberately not aligned */
    if (kind == L_PACKED) {
        /* One tensor [NBLK, row]: every group's layers side by side. */
        size_t row = 40;
        for (int g = 0; g < NG; g++) row += GS[g].layers * GS[g].page;
        size_t col = 8;
        for (int g = 0; g < NG; g++)
            for (uint32_t l = 0; l < GS[g].layers; l++, col += GS[g].page)
                add_seg(L, (uint32_t)g, off + col, row, GS[g].page);
        return;
    }
    for (int g = 0; g < NG; g++) {
        uint64_t P = GS[g].page, h = P / 2;
        if (kind == L_CROSS) {
            uint64_t page = GS[g].layers * P;
            add_seg(L, (uint32_t)g, off, page + 24, page);
            off += (page + 24) * NBLK + 72;
            continue;
        }
        for (uint32_t l = 0; l < GS[g].layers; l++) {
            switch (kind) {
            case L_SEPARATE: /* [2, NBLK, h] */
                add_seg(L, (uint32_t)g, off, h, h);
                add_seg(L, (uint32_t)g, off + h * NBLK, h, h);
                off += 2 * h * NBLK + 40;
                break;
            case L_INTERLEAVED_KV: /* [NBLK, 2, h]: K and V as two strided segments */
                add_seg(L, (uint32_t)g, off, 2 * h, h);
                add_seg(L, (uint32_t)g, off + h, 2 * h, h);
                off += 2 * h * NBLK + 40;
                break;
            case L_INTERLEAVED_PAGE: /* [NBLK, 2, h] as one segment per layer */
                add_seg(L, (uint32_t)g, off, P, P);
                off += P * NBLK + 40;
                break;
            }
        }
    }
    ASSERT_LE_U64(off, L->bytes);
}

static void fill_random(unsigned char *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = kvo_test_rand();
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++) p[i] = (unsigned char)kvo_test_rand();
}

/* Expected slot offset of (segment k of group g, chunk block b), from the
 * documented format: B * sum(pages of earlier segments of g) + b * page. */
static uint64_t expect_off(const layout *L, uint32_t g, size_t k, uint64_t B, uint64_t b, uint64_t *page) {
    uint64_t prefix = 0;
    size_t seen = 0;
    for (size_t i = 0; i < L->n; i++) {
        if (L->segs[i].group != g) continue;
        if (seen++ == k) {
            *page = L->segs[i].page_bytes;
            return B * prefix + b * L->segs[i].page_bytes;
        }
        prefix += L->segs[i].page_bytes;
    }
    FAILF("segment %zu of group %u not found", k, g);
}

static const kvo_segment *gseg(const layout *L, uint32_t g, size_t k) {
    size_t seen = 0;
    for (size_t i = 0; i < L->n; i++)
        if (L->segs[i].group == g && seen++ == k) return &L->segs[i];
    return NULL;
}

/* All bytes of engine block blk of group g, segment after segment (with
 * blocks_per_chunk 1 this is exactly the slot format). */
static void gather_block(const layout *L, uint32_t g, uint64_t blk, unsigned char *out) {
    size_t o = 0;
    for (size_t s = 0; gseg(L, g, s); s++) {
        const kvo_segment *sg = gseg(L, g, s);
        memcpy(out + o, (unsigned char *)sg->base + blk * sg->block_stride, sg->page_bytes);
        o += sg->page_bytes;
    }
}

/* A job: per offloaded group, a run of token blocks [start, start+count)
 * cut into chunks (partial first and last), each chunk with its own slot. */
typedef struct job {
    kvo_xfer_op ops[64];
    uint64_t blocks[64][8];
    unsigned char *slots[64];
    size_t n;
    uint64_t bytes;
} job;

static void make_job(job *J, const kvo_plan *p, const uint32_t start[3], const uint32_t count[3], bool consecutive) {
    memset(J, 0, sizeof *J);
    /* Engine blocks: a permutation so that loads never write a block twice. */
    for (uint32_t g = 0; g < 3; g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        uint64_t B = gp->blocks_per_chunk;
        uint64_t perm[NBLK];
        for (int i = 0; i < NBLK; i++) perm[i] = (uint64_t)i;
        if (!consecutive)
            for (int i = NBLK - 1; i > 0; i--) {
                int k = (int)(kvo_test_rand() % (uint64_t)(i + 1));
                uint64_t tmp = perm[i];
                perm[i] = perm[k];
                perm[k] = tmp;
            }
        uint32_t s = start[g], e = start[g] + count[g], used = 0;
        if (count[g] == 0) { /* an empty group: one op without blocks */
            J->ops[J->n++] = (kvo_xfer_op){g, 0, 0, NULL, NULL, 0};
            continue;
        }
        for (uint64_t c = s / B; c * B < e; c++) {
            uint64_t lo = c * B > s ? c * B : s, hi = (c + 1) * B < e ? (c + 1) * B : e;
            size_t k = J->n++;
            ASSERT_LT_U64(k, 64);
            kvo_xfer_op *op = &J->ops[k];
            op->group = g;
            op->first_block = (uint32_t)(lo - c * B);
            op->n_blocks = (uint32_t)(hi - lo);
            for (uint32_t b = 0; b < op->n_blocks; b++) J->blocks[k][b] = perm[used++ % NBLK];
            op->engine_blocks = J->blocks[k];
            J->slots[k] = malloc(gp->slot_bytes + 64);
            ASSERT_NOT_NULL(J->slots[k]);
            op->slot = J->slots[k] + (k % 3) * 8; /* unaligned slots too */
            op->slot_bytes = gp->chunk_bytes;
            J->bytes += op->n_blocks * GS[g].layers * GS[g].page;
        }
        ASSERT_LE_U64(used, NBLK);
    }
}

static void free_job(job *J) {
    for (size_t k = 0; k < J->n; k++) free(J->slots[k]);
}

static kvo_xfer_result wait_one(kvo_transfer *t, uint64_t id) {
    ASSERT_OK(kvo_transfer_wait(t, &id, 1, -1));
    kvo_xfer_result r[8];
    size_t n;
    for (;;) {
        ASSERT_OK(kvo_transfer_poll(t, r, 1, &n));
        ASSERT_EQ_U64(n, 1);
        if (r[0].job_id == id) return r[0];
    }
}

/* Check slot contents after a store: target bytes = engine page, others poison. */
static void check_slots(const layout *L, const kvo_plan *p, const job *J) {
    for (size_t k = 0; k < J->n; k++) {
        const kvo_xfer_op *op = &J->ops[k];
        if (!op->n_blocks) continue;
        const kvo_group_plan *gp = kvo_plan_group(p, op->group);
        uint64_t B = gp->blocks_per_chunk;
        unsigned char *want = malloc(gp->slot_bytes + 64);
        memset(want, POISON, gp->slot_bytes + 64);
        size_t nseg = 0;
        while (gseg(L, op->group, nseg)) nseg++;
        for (size_t s = 0; s < nseg; s++) {
            const kvo_segment *sg = gseg(L, op->group, s);
            for (uint32_t b = 0; b < op->n_blocks; b++) {
                uint64_t page, o = expect_off(L, op->group, s, B, op->first_block + b, &page);
                memcpy(want + ((unsigned char *)op->slot - J->slots[k]) + o,
                       (unsigned char *)sg->base + op->engine_blocks[b] * sg->block_stride, page);
            }
        }
        ASSERT_MEM_EQ(J->slots[k], want, gp->slot_bytes + 64);
        free(want);
    }
}

static void roundtrip(int kind, uint64_t bpc, int nt, uint32_t threads, bool consecutive) {
    fprintf(stderr, "round trip: layout %s, blocks_per_chunk %llu, nontemporal %d, %u threads%s\n", LNAMES[kind],
            (unsigned long long)bpc, nt, threads, consecutive ? ", consecutive blocks" : "");
    kvo_plan *p = make_plan(bpc);
    layout L;
    make_layout(&L, kind);
    fill_random(L.mem, L.bytes);
    unsigned char *orig = malloc(L.bytes);
    memcpy(orig, L.mem, L.bytes);

    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = threads;
    tp.nontemporal = nt;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_set_layout(t, L.segs, L.n));

    /* Partial first and last chunks; group 2 empty in every other pass. */
    uint32_t start[3] = {(uint32_t)(bpc > 1 ? 1 : 0), (uint32_t)(bpc > 1 ? 2 : 1), 0};
    uint32_t count[3] = {(uint32_t)(3 * bpc + (bpc > 1 ? 1 : 0)), (uint32_t)(2 * bpc), consecutive ? 0u : 2u};
    job J;
    make_job(&J, p, start, count, consecutive);
    for (size_t k = 0; k < J.n; k++) {
        const kvo_group_plan *gp = kvo_plan_group(p, J.ops[k].group);
        if (J.slots[k]) memset(J.slots[k], POISON, gp->slot_bytes + 64);
    }

    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, J.ops, J.n, &id));
    kvo_xfer_result r = wait_one(t, id);
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, J.bytes);
    ASSERT_EQ_U64(r.dir, KVO_XFER_STORE);
    ASSERT_MEM_EQ(L.mem, orig, L.bytes); /* sources never modified */
    check_slots(&L, p, &J);

    /* Library offsets agree with the documented format. */
    for (uint32_t g = 0; g < 3; g++)
        for (size_t s = 0; gseg(&L, g, s); s++)
            for (uint32_t b = 0; b < bpc; b++) {
                uint64_t page, o;
                ASSERT_OK(kvo_transfer_slot_offset(t, g, (uint32_t)s, b, &o));
                ASSERT_EQ_U64(o, expect_off(&L, g, s, bpc, b, &page));
            }

    /* Load back into poisoned engine memory. */
    size_t total_slot = 0;
    for (size_t k = 0; k < J.n; k++) total_slot += J.slots[k] ? kvo_plan_group(p, J.ops[k].group)->slot_bytes + 64 : 0;
    unsigned char *slot_copy = malloc(total_slot + 1);
    size_t pos = 0;
    for (size_t k = 0; k < J.n; k++)
        if (J.slots[k]) {
            size_t sz = kvo_plan_group(p, J.ops[k].group)->slot_bytes + 64;
            memcpy(slot_copy + pos, J.slots[k], sz);
            pos += sz;
        }
    memset(L.mem, POISON, L.bytes);
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, J.ops, J.n, &id));
    r = wait_one(t, id);
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, J.bytes);
    /* Expected engine memory: poison except the loaded pages. */
    unsigned char *want = malloc(L.bytes);
    memset(want, POISON, L.bytes);
    for (size_t k = 0; k < J.n; k++) {
        const kvo_xfer_op *op = &J.ops[k];
        for (size_t s = 0; gseg(&L, op->group, s); s++) {
            const kvo_segment *sg = gseg(&L, op->group, s);
            for (uint32_t b = 0; b < op->n_blocks; b++) {
                size_t eo = (size_t)((unsigned char *)sg->base - L.mem) + op->engine_blocks[b] * sg->block_stride;
                memcpy(want + eo, orig + eo, sg->page_bytes);
            }
        }
    }
    ASSERT_MEM_EQ(L.mem, want, L.bytes);
    pos = 0;
    for (size_t k = 0; k < J.n; k++) /* slots never modified by a load */
        if (J.slots[k]) {
            size_t sz = kvo_plan_group(p, J.ops[k].group)->slot_bytes + 64;
            ASSERT_MEM_EQ(J.slots[k], slot_copy + pos, sz);
            pos += sz;
        }
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.jobs_ok, 2);
    ASSERT_EQ_U64(st.bytes_stored, J.bytes);
    ASSERT_EQ_U64(st.bytes_loaded, J.bytes);
    ASSERT_EQ_INT(st.nontemporal, nt != 0);
    free(want);
    free(slot_copy);
    free(orig);
    free_job(&J);
    kvo_transfer_destroy(t);
    free(L.mem);
    kvo_plan_destroy(p);
}

KVO_TEST(roundtrip_every_layout_bpc1) {
    for (int k = 0; k < L_COUNT; k++) roundtrip(k, 1, -1, 2, false);
}

KVO_TEST(roundtrip_every_layout_bpc3) {
    for (int k = 0; k < L_COUNT; k++) roundtrip(k, 3, -1, 2, false);
}

KVO_TEST(roundtrip_consecutive_blocks_merge) {
    /* Consecutive engine blocks: adjacent pages are merged into one copy. */
    for (int k = 0; k < L_COUNT; k++) roundtrip(k, 3, -1, 1, true);
}

KVO_TEST(roundtrip_memcpy_and_many_threads) {
    for (int k = 0; k < L_COUNT; k++) {
        roundtrip(k, 3, 0, 1, false);
        roundtrip(k, 1, 1, 4, false);
    }
}

KVO_TEST(merging_counts_copies) {
    /* Cross-layer layout with stride == page: 3 consecutive blocks of one
     * chunk are one copy; shuffled ones are three. */
    kvo_plan *p = make_plan(3);
    static unsigned char eng[3][NBLK * 9000 * 3];
    kvo_segment segs[3];
    for (uint32_t g = 0; g < 3; g++) {
        uint64_t page = GS[g].layers * GS[g].page;
        segs[g] = (kvo_segment){g, eng[g], NBLK, page, page};
    }
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 1;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_set_layout(t, segs, 3));
    static unsigned char slot[3 * 9000];
    uint64_t ids[3] = {4, 5, 6}, shuf[3] = {9, 2, 7};
    kvo_xfer_op op = {1, 0, 3, ids, slot, sizeof slot};
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(wait_one(t, id).status, 0);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 1);
    op.engine_blocks = shuf;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(wait_one(t, id).status, 0);
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 4);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

/* ------------------------------------------------------------ errors -- */

typedef struct simple {
    kvo_plan *p;
    layout L;
    kvo_transfer *t;
} simple;

static void simple_open(simple *S, uint64_t bpc, uint32_t threads, uint32_t max_queued) {
    S->p = make_plan(bpc);
    make_layout(&S->L, L_SEPARATE);
    fill_random(S->L.mem, S->L.bytes);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = S->p;
    tp.threads = threads;
    tp.max_queued_jobs = max_queued;
    ASSERT_OK(kvo_transfer_create(&tp, &S->t));
    ASSERT_OK(kvo_transfer_set_layout(S->t, S->L.segs, S->L.n));
}

static void simple_close(simple *S) {
    kvo_transfer_destroy(S->t);
    free(S->L.mem);
    kvo_plan_destroy(S->p);
}

KVO_TEST(submit_errors_queue_nothing) {
    simple S;
    simple_open(&S, 3, 2, 16);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    memset(slot, POISON, gp->slot_bytes);
    unsigned char *before = malloc(S.L.bytes);
    memcpy(before, S.L.mem, S.L.bytes);
    uint64_t ok[3] = {0, 1, 2}, bad[3] = {0, NBLK, 2}, dup[3] = {5, 6, 5};
    uint64_t id = 12345;
    kvo_xfer_op op = {0, 0, 3, bad, slot, gp->slot_bytes};
    /* bad block id */
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "engine block 16");
    ASSERT_CONTAINS(kvo_last_error(), "full");
    /* bad id in the second op only: the first is not queued either */
    kvo_xfer_op two[2] = {{0, 0, 3, ok, slot, gp->slot_bytes}, {0, 0, 3, bad, slot, gp->slot_bytes}};
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, two, 2, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "op 1");
    /* slot too small */
    op = (kvo_xfer_op){0, 0, 3, ok, slot, gp->chunk_bytes - 1};
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "cannot hold");
    op.slot_bytes = gp->slot_bytes;
    op.slot = NULL;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.slot = slot;
    /* blocks beyond the chunk */
    op.first_block = 1;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not within the chunk");
    op.first_block = UINT32_MAX;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.first_block = 0;
    /* not offloaded, unknown group */
    op.group = 3;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not offloaded");
    op.group = 9;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.group = 0;
    /* NULL engine blocks, bad direction, NULL args */
    op.engine_blocks = NULL;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id), KVO_EINVAL);
    op.engine_blocks = ok;
    ASSERT_ERR(kvo_transfer_submit(S.t, (kvo_xfer_dir)7, &op, 1, &id), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, NULL, 1, &id), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, NULL), KVO_EINVAL);
    /* a load writing one engine block twice */
    op.engine_blocks = dup;
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &op, 1, &id), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "written twice");
    /* two ops sharing a slot: must be one group; stores must not overlap */
    {
        const kvo_group_plan *g1 = kvo_plan_group(S.p, 1);
        (void)g1;
        kvo_xfer_op sh[2] = {{0, 0, 2, ok, slot, gp->slot_bytes}, {0, 1, 2, ok + 1, slot, gp->slot_bytes}};
        ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, sh, 2, &id), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "overlap");
        sh[1].group = 1;
        sh[1].first_block = 2;
        sh[1].n_blocks = 1;
        ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_LOAD, sh, 2, &id), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "one slot");
    }
    /* ...but a store may read one engine block into two chunk positions */
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(wait_one(S.t, id).status, 0);

    /* Nothing of the failed submits ran: engine untouched, one job counted. */
    ASSERT_MEM_EQ(S.L.mem, before, S.L.bytes);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &st));
    ASSERT_EQ_U64(st.jobs_submitted, 1);
    ASSERT_EQ_U64(id, 1);
    free(before);
    free(slot);
    simple_close(&S);
}

KVO_TEST(submit_without_layout_and_after_close) {
    kvo_plan *p = make_plan(1);
    kvo_transfer_params tp = kvo_transfer_default_params();
    kvo_transfer *t;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_EINVAL); /* no plan */
    tp.plan = p;
    tp.threads = 0;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_EINVAL);
    tp.threads = 1;
    tp.device = "tpu";
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "host");
    tp.device = "host";
    tp.device_index = 1;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_ENOTSUP);
    tp.device_index = 0;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    uint64_t blk = 0, id;
    static unsigned char slot[8192];
    kvo_xfer_op op = {0, 0, 1, &blk, slot, sizeof slot};
    ASSERT_ERR(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id), KVO_ESTATE);
    uint64_t off;
    ASSERT_ERR(kvo_transfer_slot_offset(t, 0, 0, 0, &off), KVO_ESTATE);
    ASSERT_ERR(kvo_transfer_layout_hash(t, &off), KVO_ESTATE);
    kvo_transfer_close(t);
    kvo_transfer_close(t); /* idempotent */
    ASSERT_ERR(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id), KVO_ECLOSED);
    layout L;
    make_layout(&L, L_CROSS);
    ASSERT_ERR(kvo_transfer_set_layout(t, L.segs, L.n), KVO_ECLOSED);
    kvo_transfer_destroy(t);
    kvo_transfer_destroy(NULL);
    free(L.mem);
    kvo_plan_destroy(p);
}

KVO_TEST(queue_limit_counts_unpolled_results) {
    simple S;
    simple_open(&S, 1, 1, 2);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 1);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b0 = 0, b1 = 1, id[3];
    kvo_xfer_op a = {1, 0, 1, &b0, slot, gp->slot_bytes}, b = {1, 0, 1, &b1, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &b, 1, &id[1]));
    ASSERT_OK(kvo_transfer_wait(S.t, id, 2, -1));
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[2]), KVO_EAGAIN);
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_U64(r[0].job_id, id[0]); /* oldest first */
    ASSERT_EQ_U64(r[1].job_id, id[1]);
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &a, 1, &id[2]));
    ASSERT_OK(kvo_transfer_wait(S.t, &id[2], 1, -1));
    /* the second store overwrote the first in the same slot: in order */
    free(slot);
    simple_close(&S);
}

/* ---------------------------------------------------------- ordering -- */

KVO_TEST(load_waits_for_store_chain) {
    /* store blk a -> slot1, load slot1 -> blk b, store b -> slot2, load slot2
     * -> blk c, ... all submitted at once: the last block must equal the
     * first.  Also a store after a load of the same block sees the load. */
    for (int rep = 0; rep < 20; rep++) {
        simple S;
        simple_open(&S, 1, 4, 4096);
        const kvo_group_plan *gp = kvo_plan_group(S.p, 2); /* the 9000-byte group */
        enum { HOPS = 12 };
        unsigned char *slots[HOPS];
        uint64_t blk[HOPS + 1], ids[2 * HOPS];
        for (int i = 0; i <= HOPS; i++) blk[i] = (uint64_t)i;
        unsigned char *page0 = malloc(gp->chunk_bytes), *got = malloc(gp->chunk_bytes);
        gather_block(&S.L, 2, 0, page0);
        for (int i = 0; i < HOPS; i++) {
            slots[i] = malloc(gp->slot_bytes);
            kvo_xfer_op st = {2, 0, 1, &blk[i], slots[i], gp->slot_bytes};
            kvo_xfer_op ld = {2, 0, 1, &blk[i + 1], slots[i], gp->slot_bytes};
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[2 * i]));
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[2 * i + 1]));
        }
        ASSERT_OK(kvo_transfer_wait(S.t, ids, 2 * HOPS, -1));
        kvo_xfer_result r[2 * HOPS];
        size_t n;
        ASSERT_OK(kvo_transfer_poll(S.t, r, 2 * HOPS, &n));
        ASSERT_EQ_U64(n, 2 * HOPS);
        for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(r[i].status, 0);
        for (int i = 1; i <= HOPS; i++) {
            gather_block(&S.L, 2, blk[i], got);
            ASSERT_MEM_EQ(got, page0, gp->chunk_bytes);
        }
        for (int i = 0; i < HOPS; i++) free(slots[i]);
        free(page0);
        free(got);
        simple_close(&S);
    }
}

KVO_TEST(store_before_load_into_same_block_reads_old_bytes) {
    /* Write-after-read: store blk 3 -> slotA (reads the old bytes), then load
     * slotB -> blk 3.  slotA must hold the old bytes. */
    for (int rep = 0; rep < 20; rep++) {
        simple S;
        simple_open(&S, 1, 4, 4096);
        const kvo_group_plan *gp = kvo_plan_group(S.p, 2);
        unsigned char *old = malloc(gp->chunk_bytes), *got = malloc(gp->chunk_bytes);
        gather_block(&S.L, 2, 3, old);
        unsigned char *A = malloc(gp->slot_bytes), *B = malloc(gp->slot_bytes);
        memset(B, 0x5A, gp->slot_bytes);
        uint64_t b3 = 3, ids[2];
        kvo_xfer_op st = {2, 0, 1, &b3, A, gp->slot_bytes}, ld = {2, 0, 1, &b3, B, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
        ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
        ASSERT_MEM_EQ(A, old, gp->chunk_bytes);
        gather_block(&S.L, 2, 3, got);
        ASSERT_MEM_EQ(got, B, gp->chunk_bytes);
        free(old);
        free(got);
        free(A);
        free(B);
        simple_close(&S);
    }
}

KVO_TEST(many_readers_then_writer) {
    /* More loads from one slot than the tracked readers (4), then a store to
     * that slot: every load must see the old slot bytes. */
    simple S;
    simple_open(&S, 1, 3, 4096);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 2);
    unsigned char *got = malloc(gp->chunk_bytes);
    unsigned char *slot = malloc(gp->slot_bytes);
    fill_random(slot, gp->slot_bytes);
    unsigned char *old = malloc(gp->slot_bytes);
    memcpy(old, slot, gp->slot_bytes);
    uint64_t blk[10], ids[11];
    for (int i = 0; i < 10; i++) {
        blk[i] = (uint64_t)i;
        kvo_xfer_op ld = {2, 0, 1, &blk[i], slot, gp->slot_bytes};
        ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[i]));
    }
    /* Cancel the load that took the place of the fifth in the reader list:
     * the store below must still wait for the fifth. */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[5]));
    uint64_t b15 = 15;
    kvo_xfer_op st = {2, 0, 1, &b15, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[10]));
    kvo_transfer_stats stt = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &stt));
    ASSERT_GE_U64(stt.dep_waits, 1);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 11, -1));
    for (int i = 0; i < 10; i++) {
        if (i == 5) continue;
        gather_block(&S.L, 2, blk[i], got);
        ASSERT_MEM_EQ(got, old, gp->chunk_bytes);
    }
    gather_block(&S.L, 2, 15, got);
    ASSERT_MEM_EQ(slot, got, gp->chunk_bytes);
    free(old);
    free(got);
    free(slot);
    simple_close(&S);
}

/* --------------------------------------------- cancel, wait, event fd -- */

static bool fd_readable(int fd) {
    struct pollfd pf = {fd, POLLIN, 0};
    return poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN);
}

KVO_TEST(cancel_wait_and_event_fd) {
    simple S;
    simple_open(&S, 1, 2, 64);
    int fd = kvo_transfer_event_fd(S.t);
    ASSERT_GE_INT(fd, 0);
    ASSERT_FALSE(fd_readable(fd));
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes), *other = malloc(gp->slot_bytes);
    uint64_t b1 = 1, b2 = 2, b3 = 3, ids[4];
    kvo_xfer_op st = {0, 0, 1, &b1, slot, gp->slot_bytes};
    kvo_xfer_op ld = {0, 0, 1, &b2, slot, gp->slot_bytes};      /* reads what st writes */
    kvo_xfer_op ind = {0, 0, 1, &b3, other, gp->slot_bytes};    /* independent */
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &ind, 1, &ids[2]));
    /* Paused: nothing finishes; wait times out. */
    ASSERT_ERR(kvo_transfer_wait(S.t, &ids[2], 1, 20 * 1000 * 1000), KVO_ETIMEDOUT);
    ASSERT_FALSE(fd_readable(fd));
    /* Cancel the store: the load that reads its slot fails too. */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[0]));
    ASSERT_TRUE(fd_readable(fd));
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[0]), KVO_EBUSY); /* finished (canceled) */
    ASSERT_ERR(kvo_transfer_cancel(S.t, 999), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_transfer_wait(S.t, (uint64_t[]){999}, 1, 0), KVO_ENOTFOUND);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 3, -1));
    kvo_xfer_result r[8];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 3);
    ASSERT_FALSE(fd_readable(fd));
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].job_id == ids[0]) { ASSERT_EQ_INT(r[i].status, KVO_ECANCELED); seen |= 1; }
        if (r[i].job_id == ids[1]) { ASSERT_EQ_INT(r[i].status, KVO_ECANCELED); seen |= 2; }
        if (r[i].job_id == ids[2]) {
            ASSERT_EQ_INT(r[i].status, 0);
            ASSERT_EQ_U64(r[i].bytes, gp->layers * gp->page_bytes);
            seen |= 4;
        }
    }
    ASSERT_EQ_INT(seen, 7);
    /* Results already polled still count as finished for wait. */
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 3, 0));
    /* Cancel a waiting job whose predecessor runs: the predecessor's
     * successors stay ordered after it. */
    kvo__transfer_pause(S.t, true);
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[1]));
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].job_id == ids[1] ? r[0].status : r[1].status, KVO_ECANCELED);
    ASSERT_EQ_INT(r[0].job_id == ids[0] ? r[0].status : r[1].status, 0);
    free(slot);
    free(other);
    simple_close(&S);
}

KVO_TEST(close_cancels_queued_jobs) {
    simple S;
    simple_open(&S, 1, 2, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b = 1, ids[2];
    kvo_xfer_op st = {0, 0, 1, &b, slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &st, 1, &ids[1]));
    kvo_transfer_close(S.t);
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]), KVO_ECLOSED);
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, KVO_ECANCELED);
    ASSERT_EQ_INT(r[1].status, KVO_ECANCELED);
    free(slot);
    simple_close(&S);
}

KVO_TEST(layout_change_fails_only_affected_jobs) {
    simple S;
    simple_open(&S, 1, 2, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *g0 = kvo_plan_group(S.p, 0), *g1 = kvo_plan_group(S.p, 1);
    unsigned char *s0 = malloc(g0->slot_bytes), *s1 = malloc(g1->slot_bytes);
    memset(s1, POISON, g1->slot_bytes);
    uint64_t b = 4, ids[2], h0, h1;
    kvo_xfer_op o0 = {0, 0, 1, &b, s0, g0->slot_bytes}, o1 = {1, 0, 1, &b, s1, g1->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o0, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o1, 1, &ids[1]));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h0));
    /* Move group 0 to a new tensor: same shapes, other memory. */
    layout N = S.L;
    unsigned char *mem2 = malloc(S.L.bytes);
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h1));
    ASSERT_EQ_U64(h0, h1); /* same pages in the same order: same slot bytes */
    /* the engine-free computation agrees, and tells page lists apart */
    uint64_t h2;
    ASSERT_OK(kvo_layout_hash(S.p, N.segs, N.n, &h2));
    ASSERT_EQ_U64(h2, h1);
    kvo_segment dsegs[64];
    ASSERT_LE_U64(N.n, 64);
    memcpy(dsegs, N.segs, N.n * sizeof *dsegs);
    for (size_t i = 0; i < N.n; i++)
        if (dsegs[i].group == 0) { dsegs[i].page_bytes += 1; break; }
    ASSERT_OK(kvo_layout_hash(S.p, dsegs, N.n, &h2));
    ASSERT_NE_U64(h2, h1);
    dsegs[0].group = 999;
    ASSERT_ERR(kvo_layout_hash(S.p, dsegs, N.n, &h2), KVO_EINVAL);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    kvo_xfer_result r[4];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 4, &n));
    ASSERT_EQ_U64(n, 2);
    for (size_t i = 0; i < n; i++) {
        if (r[i].job_id == ids[0]) ASSERT_EQ_INT(r[i].status, KVO_ESTATE);
        else ASSERT_EQ_INT(r[i].status, 0);
    }
    unsigned char *got = malloc(g1->chunk_bytes);
    gather_block(&S.L, 1, 4, got);
    ASSERT_MEM_EQ(s1, got, g1->chunk_bytes);
    free(got);
    /* Reordering a group's segments changes the slot format: new hash. */
    kvo_segment tmp = N.segs[0];
    N.segs[0] = N.segs[1];
    N.segs[1] = tmp;
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    ASSERT_OK(kvo_transfer_layout_hash(S.t, &h1));
    ASSERT_EQ_U64(h0, h1); /* K and V halves have equal pages: still the same format */
    free(mem2);
    free(s0);
    free(s1);
    simple_close(&S);
}

KVO_TEST(layout_change_stops_running_job) {
    /* A job of many units on group 0 is started (one unit claimed), then
     * group 0's tensors move: the job fails with KVO_ESTATE after that unit,
     * nothing more is copied, a job of group 1 still succeeds. */
    simple S;
    simple_open(&S, 1, 1, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *g0 = kvo_plan_group(S.p, 0), *g1 = kvo_plan_group(S.p, 1);
    enum { OPS = 8 };
    unsigned char *slots = malloc(OPS * g0->slot_bytes), *s1 = malloc(g1->slot_bytes);
    memset(slots, POISON, OPS * g0->slot_bytes);
    uint64_t blk[OPS], ids[2];
    kvo_xfer_op ops[OPS];
    for (int i = 0; i < OPS; i++) {
        blk[i] = (uint64_t)i;
        ops[i] = (kvo_xfer_op){0, 0, 1, &blk[i], slots + i * g0->slot_bytes, g0->slot_bytes};
    }
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, ops, OPS, &ids[0]));
    kvo_xfer_op o1 = {1, 0, 1, &blk[3], s1, g1->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &o1, 1, &ids[1]));
    kvo__transfer_allow_units(S.t, 1);
    while (kvo__transfer_units_allowed(S.t) != 0) { /* until the unit is claimed */
    }
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[0]), KVO_EBUSY); /* running */
    layout N = S.L;
    unsigned char *mem2 = malloc(S.L.bytes);
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    ASSERT_OK(kvo_transfer_set_layout(S.t, N.segs, N.n));
    /* Returned: the job is over (nothing of it runs any more). */
    kvo_xfer_result r[2];
    size_t n;
    ASSERT_OK(kvo_transfer_wait(S.t, &ids[0], 1, 0));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_U64(r[0].job_id, ids[0]);
    ASSERT_EQ_INT(r[0].status, KVO_ESTATE);
    /* At most the claimed unit was copied: 3 segments per op (K/V of 3
     * layers = 6 segments) -> 48 units; one of them ran. */
    size_t touched = 0;
    for (size_t i = 0; i < OPS * g0->slot_bytes; i++) touched += slots[i] != POISON;
    ASSERT_LE_U64(touched, 100);
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, &ids[1], 1, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(r[0].status, 0);
    free(mem2);
    free(slots);
    free(s1);
    simple_close(&S);
}

KVO_TEST(loads_run_before_stores) {
    simple S;
    simple_open(&S, 1, 1, 64);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *a = malloc(gp->slot_bytes), *b = malloc(gp->slot_bytes);
    memset(b, 1, gp->slot_bytes);
    uint64_t b1 = 1, b2 = 2, ids[2];
    kvo_xfer_op st = {0, 0, 1, &b1, a, gp->slot_bytes}, ld = {0, 0, 1, &b2, b, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &ids[1]));
    kvo__transfer_allow_units(S.t, 1);
    while (kvo__transfer_units_allowed(S.t) != 0) {
    }
    ASSERT_ERR(kvo_transfer_cancel(S.t, ids[1]), KVO_EBUSY); /* the later load started */
    ASSERT_OK(kvo_transfer_cancel(S.t, ids[0]));             /* the earlier store did not */
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, ids, 2, -1));
    free(a);
    free(b);
    simple_close(&S);
}

/* ------------------------------------------------------ concurrency -- */

typedef struct cthread {
    simple *S;
    int idx;
    int fails;
} cthread;

static void *submitter(void *arg) {
    cthread *c = arg;
    simple *S = c->S;
    const kvo_group_plan *gp = kvo_plan_group(S->p, 0);
    const kvo_segment *k0 = gseg(&S->L, 0, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    unsigned char *want = malloc(gp->layers * gp->page_bytes);
    /* Thread idx owns engine blocks 4*idx .. 4*idx+3 of group 0. */
    for (int it = 0; it < 40; it++) {
        uint64_t src = (uint64_t)(4 * c->idx + it % 2), dst = (uint64_t)(4 * c->idx + 2 + it % 2), ids[2];
        kvo_xfer_op st = {0, 0, 1, &src, slot, gp->slot_bytes}, ld = {0, 0, 1, &dst, slot, gp->slot_bytes};
        int rc;
        while ((rc = kvo_transfer_submit(S->t, KVO_XFER_STORE, &st, 1, &ids[0])) == KVO_EAGAIN) {
        }
        if (rc) { c->fails++; break; }
        while ((rc = kvo_transfer_submit(S->t, KVO_XFER_LOAD, &ld, 1, &ids[1])) == KVO_EAGAIN) {
        }
        if (rc) { c->fails++; break; }
        if (kvo_transfer_wait(S->t, ids, 2, -1)) { c->fails++; break; }
        for (size_t s = 0; gseg(&S->L, 0, s); s++) {
            const kvo_segment *sg = gseg(&S->L, 0, s);
            if (memcmp((unsigned char *)sg->base + dst * sg->block_stride,
                       (unsigned char *)sg->base + src * sg->block_stride, sg->page_bytes))
                c->fails++;
        }
    }
    (void)k0;
    free(want);
    free(slot);
    return NULL;
}

static void *poller(void *arg) {
    simple *S = arg;
    kvo_xfer_result r[32];
    size_t n, total = 0;
    int fd = kvo_transfer_event_fd(S->t);
    while (total < 4 * 80) {
        struct pollfd pf = {fd, POLLIN, 0};
        poll(&pf, 1, 10);
        if (kvo_transfer_poll(S->t, r, 32, &n)) break;
        for (size_t i = 0; i < n; i++)
            if (r[i].status != 0) return (void *)1;
        total += n;
    }
    return NULL;
}

KVO_TEST(many_concurrent_jobs) {
    simple S;
    simple_open(&S, 1, 3, 8);
    pthread_t th[4], pt;
    cthread c[4];
    pthread_create(&pt, NULL, poller, &S);
    for (int i = 0; i < 4; i++) {
        c[i] = (cthread){&S, i, 0};
        pthread_create(&th[i], NULL, submitter, &c[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    void *prc;
    pthread_join(pt, &prc);
    ASSERT_NULL(prc);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(c[i].fails, 0);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(S.t, &st));
    ASSERT_EQ_U64(st.jobs_ok, 4 * 80);
    simple_close(&S);
}

KVO_TEST(concurrent_layout_changes_and_cancels) {
    /* Submitters on group 1 while another thread keeps re-registering
     * group 0's tensors and canceling: group-1 jobs never fail. */
    simple S;
    simple_open(&S, 3, 2, 256);
    const kvo_group_plan *g1 = kvo_plan_group(S.p, 1);
    unsigned char *slot = malloc(g1->slot_bytes);
    unsigned char *mem2 = malloc(S.L.bytes);
    memcpy(mem2, S.L.mem, S.L.bytes);
    layout N = S.L;
    for (size_t i = 0; i < N.n; i++)
        if (N.segs[i].group == 0) N.segs[i].base = mem2 + ((unsigned char *)N.segs[i].base - S.L.mem);
    uint64_t blk[3] = {1, 2, 3};
    kvo_xfer_op op1 = {1, 0, 3, blk, slot, g1->slot_bytes};
    uint64_t ids[200];
    for (int i = 0; i < 200; i++) {
        ASSERT_OK(kvo_transfer_submit(S.t, i % 2 ? KVO_XFER_LOAD : KVO_XFER_STORE, &op1, 1, &ids[i]));
        if (i % 20 == 0) ASSERT_OK(kvo_transfer_set_layout(S.t, (i / 20) % 2 ? S.L.segs : N.segs, N.n));
        if (i % 7 == 3) (void)kvo_transfer_cancel(S.t, ids[i]);
        if (i % 50 == 49) {
            ASSERT_OK(kvo_transfer_wait(S.t, ids, (size_t)i + 1, -1));
            kvo_xfer_result r[64];
            size_t n;
            do {
                ASSERT_OK(kvo_transfer_poll(S.t, r, 64, &n));
                for (size_t k = 0; k < n; k++)
                    ASSERT_TRUE(r[k].status == 0 || r[k].status == KVO_ECANCELED);
            } while (n);
        }
    }
    free(slot);
    simple_close(&S);
    free(mem2);
}

KVO_TEST(canceled_jobs_still_ordered_count_against_the_queue) {
    simple S;
    simple_open(&S, 1, 2, 4);
    kvo__transfer_pause(S.t, true);
    const kvo_group_plan *gp = kvo_plan_group(S.p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t b[8] = {0, 1, 2, 3, 4, 5, 6, 7}, id[8];
    kvo_xfer_result r[8];
    size_t n;
    kvo_xfer_op st = {0, 0, 1, &b[0], slot, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[0]));
    for (int i = 1; i <= 3; i++) {
        kvo_xfer_op ld = {0, 0, 1, &b[i], slot, gp->slot_bytes};
        if (i < 3) {
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &id[i]));
            ASSERT_OK(kvo_transfer_cancel(S.t, id[i])); /* waits for the store: stays ordered */
            ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
            ASSERT_EQ_U64(n, 1);
            ASSERT_EQ_INT(r[0].status, KVO_ECANCELED);
        } else {
            ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &ld, 1, &id[i]));
        }
    }
    /* 1 store + 2 canceled-but-ordered + 1 load = 4 = max_queued_jobs. */
    ASSERT_ERR(kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[4]), KVO_EAGAIN);
    ASSERT_CONTAINS(kvo_last_error(), "canceled");
    kvo__transfer_pause(S.t, false);
    ASSERT_OK(kvo_transfer_wait(S.t, (uint64_t[]){id[0], id[3]}, 2, -1));
    ASSERT_OK(kvo_transfer_poll(S.t, r, 8, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, 0);
    ASSERT_EQ_INT(r[1].status, 0);
    /* Room again once the canceled ones have left the order. */
    for (int tries = 0;; tries++) {
        int rc = kvo_transfer_submit(S.t, KVO_XFER_STORE, &st, 1, &id[4]);
        if (rc == 0) break;
        ASSERT_EQ_INT(rc, KVO_EAGAIN);
        ASSERT_LT_INT(tries, 1000000);
    }
    ASSERT_OK(kvo_transfer_wait(S.t, &id[4], 1, -1));
    unsigned char *got = malloc(gp->chunk_bytes), *want = malloc(gp->chunk_bytes);
    gather_block(&S.L, 0, 0, want);
    gather_block(&S.L, 0, 3, got);
    ASSERT_MEM_EQ(got, want, gp->chunk_bytes);
    free(got);
    free(want);
    free(slot);
    simple_close(&S);
}

KVO_TEST(empty_job_completes) {
    simple S;
    simple_open(&S, 3, 1, 8);
    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_STORE, NULL, 0, &id));
    kvo_xfer_op empty = {2, 1, 0, NULL, NULL, 0};
    uint64_t id2;
    ASSERT_OK(kvo_transfer_submit(S.t, KVO_XFER_LOAD, &empty, 1, &id2));
    ASSERT_OK(kvo_transfer_wait(S.t, (uint64_t[]){id, id2}, 2, -1));
    kvo_xfer_result r[2];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(S.t, r, 2, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_EQ_INT(r[0].status, 0);
    ASSERT_EQ_U64(r[0].bytes, 0);
    simple_close(&S);
}

KVO_TEST(roundtrip_presets_real_geometry) {
    /* Every preset's automatic plan (mixed block sizes, per-group
     * blocks_per_chunk): one segment per layer, a whole chunk stored and a
     * partial one loaded back, for every offloaded group with chunks up to
     * 8 MiB (to keep the test small). */
    for (size_t pi = 0; pi < kvo_model_preset_count(); pi++) {
        kvo_model *m;
        ASSERT_OK(kvo_model_preset(kvo_model_preset_name(pi), &m));
        kvo_plan *p;
        ASSERT_OK(kvo_plan_create(m, NULL, &p));
        kvo_model_destroy(m);
        size_t ng = kvo_plan_num_groups(p), nseg = 0;
        kvo_segment *segs = calloc(4096, sizeof *segs);
        unsigned char *mem[KVO_MAX_GROUPS] = {0}, *slot[KVO_MAX_GROUPS] = {0}, *orig[KVO_MAX_GROUPS] = {0};
        size_t bytes[KVO_MAX_GROUPS] = {0};
        uint64_t nb[KVO_MAX_GROUPS] = {0};
        bool used[KVO_MAX_GROUPS] = {0};
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded) continue;
            used[g] = gp->chunk_bytes <= (8u << 20);
            /* Groups left out of the test still need a (small) tensor. */
            nb[g] = used[g] ? gp->blocks_per_chunk + 2 : 1;
            bytes[g] = (size_t)(nb[g] * gp->layers * gp->page_bytes);
            mem[g] = malloc(bytes[g]);
            ASSERT_NOT_NULL(mem[g]);
            fill_random(mem[g], bytes[g]);
            for (uint32_t l = 0; l < gp->layers; l++) /* [layers, nb, page] */
                segs[nseg++] = (kvo_segment){(uint32_t)g, mem[g] + l * nb[g] * gp->page_bytes, nb[g], gp->page_bytes,
                                             gp->page_bytes};
        }
        kvo_transfer_params tp = kvo_transfer_default_params();
        tp.plan = p;
        kvo_transfer *t;
        ASSERT_OK(kvo_transfer_create(&tp, &t));
        ASSERT_OK(kvo_transfer_set_layout(t, segs, nseg));
        kvo_xfer_op ops[KVO_MAX_GROUPS];
        uint64_t *ids[KVO_MAX_GROUPS] = {0};
        size_t nops = 0;
        for (size_t g = 0; g < ng; g++) {
            if (!used[g]) continue;
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            ids[g] = malloc(sizeof(uint64_t) * gp->blocks_per_chunk);
            for (uint64_t b = 0; b < gp->blocks_per_chunk; b++) /* distinct, descending: no merging */
                ids[g][b] = nb[g] - 1 - b;
            slot[g] = malloc(gp->slot_bytes);
            memset(slot[g], POISON, gp->slot_bytes);
            ops[nops++] = (kvo_xfer_op){(uint32_t)g, 0, (uint32_t)gp->blocks_per_chunk, ids[g], slot[g], gp->slot_bytes};
        }
        uint64_t id;
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops, nops, &id));
        ASSERT_EQ_INT(wait_one(t, id).status, 0);
        /* Slot check: layer l, chunk block b at B*l*page + b*page. */
        for (size_t k = 0; k < nops; k++) {
            const kvo_group_plan *gp = kvo_plan_group(p, ops[k].group);
            uint32_t g = ops[k].group;
            for (uint32_t l = 0; l < gp->layers; l++)
                for (uint64_t b = 0; b < gp->blocks_per_chunk; b++)
                    ASSERT_MEM_EQ(slot[g] + (gp->blocks_per_chunk * l + b) * gp->page_bytes,
                                  mem[g] + (l * nb[g] + ids[g][b]) * gp->page_bytes, gp->page_bytes);
            for (uint64_t i = gp->chunk_bytes; i < gp->slot_bytes; i++) ASSERT_EQ_INT(slot[g][i], POISON);
        }
        /* Load chunk blocks 1.. (a first chunk starting mid-chunk) into
         * poisoned engine memory. */
        for (size_t k = 0; k < nops; k++) {
            uint32_t g = ops[k].group;
            orig[g] = malloc(bytes[g]);
            memcpy(orig[g], mem[g], bytes[g]);
            memset(mem[g], POISON, bytes[g]);
            if (ops[k].n_blocks > 1) {
                ops[k].first_block = 1;
                ops[k].n_blocks--;
                ops[k].engine_blocks = ids[g] + 1;
            }
        }
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, ops, nops, &id));
        ASSERT_EQ_INT(wait_one(t, id).status, 0);
        for (size_t k = 0; k < nops; k++) {
            uint32_t g = ops[k].group;
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            unsigned char *want = malloc(bytes[g]);
            memset(want, POISON, bytes[g]);
            for (uint32_t l = 0; l < gp->layers; l++)
                for (uint32_t b = 0; b < ops[k].n_blocks; b++) {
                    size_t eo = (size_t)((l * nb[g] + ops[k].engine_blocks[b]) * gp->page_bytes);
                    memcpy(want + eo, orig[g] + eo, gp->page_bytes);
                }
            ASSERT_MEM_EQ(mem[g], want, bytes[g]);
            free(want);
        }
        kvo_transfer_destroy(t);
        for (size_t g = 0; g < ng; g++) {
            free(mem[g]);
            free(slot[g]);
            free(orig[g]);
            free(ids[g]);
        }
        free(segs);
        kvo_plan_destroy(p);
    }
}

/* ------------------------------------------------ allocation failures -- */

KVO_TEST(allocation_failures_are_clean) {
    /* Fail the k-th allocation for k = 0, 1, ...: every call fails cleanly
     * with KVO_ENOMEM (no leak: ASan) or the whole round trip succeeds. */
    kvo_plan *p = make_plan(3);
    layout L;
    make_layout(&L, L_SEPARATE);
    fill_random(L.mem, L.bytes);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    unsigned char *slot = malloc(gp->slot_bytes);
    uint64_t blk[3] = {7, 2, 9};
    kvo_xfer_op op = {0, 0, 3, blk, slot, gp->slot_bytes};
    bool done = false;
    for (long k = 0; k < 1000 && !done; k++) {
        fa_install(k);
        kvo_transfer_params tp = kvo_transfer_default_params();
        tp.plan = p;
        tp.threads = 2;
        kvo_transfer *t = NULL;
        int rc = kvo_transfer_create(&tp, &t);
        uint64_t id[2];
        if (!rc) rc = kvo_transfer_set_layout(t, L.segs, L.n);
        if (!rc) rc = kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id[0]);
        if (!rc) rc = kvo_transfer_submit(t, KVO_XFER_LOAD, &op, 1, &id[1]);
        if (!rc) {
            ASSERT_OK(kvo_transfer_wait(t, id, 2, -1));
            kvo_xfer_result r[2];
            size_t n;
            ASSERT_OK(kvo_transfer_poll(t, r, 2, &n));
            ASSERT_EQ_U64(n, 2);
            ASSERT_EQ_INT(r[0].status, 0);
            ASSERT_EQ_INT(r[1].status, 0);
            done = fa_allocations() <= k; /* no allocation failed */
        } else {
            ASSERT_EQ_INT(rc, KVO_ENOMEM);
        }
        kvo_transfer_destroy(t);
        ASSERT_OK(kvo_set_allocator(NULL));
    }
    ASSERT_TRUE(done);
    free(slot);
    free(L.mem);
    kvo_plan_destroy(p);
}

KVO_TEST(huge_pages_split_into_parts) {
    /* A cross-layer segment of 3 layers of 1 MiB + 36 bytes: pages of about
     * 3 MiB (not a multiple of 64) are split into 4 parts, one work unit
     * each; bytes are exact. */
    kvo_model *m;
    ASSERT_OK(kvo_model_create("huge", 16, &m));
    kvo_group_desc d = kvo_group_desc_default();
    snprintf(d.name, sizeof d.name, "big");
    d.tokens_per_block = 16;
    d.layers = 3;
    d.page_bytes = (1u << 20) + 36;
    ASSERT_OK(kvo_model_add_group(m, &d));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    uint64_t page = 3 * gp->page_bytes, stride = page + 4096 + 8;
    size_t bytes = (size_t)(4 * stride);
    unsigned char *mem = malloc(bytes + 64), *orig = malloc(bytes + 64), *slot = malloc(gp->slot_bytes + 64);
    fill_random(mem, bytes + 64);
    memcpy(orig, mem, bytes + 64);
    memset(slot, POISON, gp->slot_bytes + 64);
    kvo_segment seg = {0, mem + 3, 4, stride, page};
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 3;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    uint64_t blk[2] = {3, 1}, id;
    kvo_xfer_op op = {0, 0, 2, blk, slot + 5, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(wait_one(t, id).status, 0);
    ASSERT_MEM_EQ(slot + 5, mem + 3 + 3 * stride, page);
    ASSERT_MEM_EQ(slot + 5 + page, mem + 3 + 1 * stride, page);
    for (size_t i = 0; i < 5; i++) ASSERT_EQ_INT(slot[i], POISON);
    for (size_t i = 5 + 2 * page; i < gp->slot_bytes + 64; i++) ASSERT_EQ_INT(slot[i], POISON);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 8); /* 4 parts per page */
    ASSERT_MEM_EQ(mem, orig, bytes + 64);
    /* Load chunk block 1 into engine block 2 of poisoned memory. */
    memset(mem, POISON, bytes + 64);
    uint64_t b2 = 2;
    op = (kvo_xfer_op){0, 1, 1, &b2, slot + 5, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, &op, 1, &id));
    ASSERT_EQ_INT(wait_one(t, id).status, 0);
    unsigned char *want = malloc(bytes + 64);
    memset(want, POISON, bytes + 64);
    memcpy(want + 3 + 2 * stride, orig + 3 + 1 * stride, page);
    ASSERT_MEM_EQ(mem, want, bytes + 64);
    kvo_transfer_destroy(t);
    free(want);
    free(mem);
    free(orig);
    free(slot);
    kvo_plan_destroy(p);
}

KVO_TEST(dependency_table_many_resources) {
    /* Three jobs of 4000 blocks each, all queued before any runs (the table
     * grows past its first size and later shrinks entry by entry): store
     * engine -> slots A (block order P), load slots A -> engine (order Q),
     * store engine -> slots B (order P); engine and B are checked against a
     * model computed here. */
    enum { NB = 4000, BPC = 100, PAGE = 72, NC = NB / BPC };
    kvo_model *m;
    ASSERT_OK(kvo_model_create("many", 16, &m));
    kvo_group_desc d = kvo_group_desc_default();
    snprintf(d.name, sizeof d.name, "g");
    d.tokens_per_block = 16;
    d.layers = 1;
    d.page_bytes = PAGE;
    ASSERT_OK(kvo_model_add_group(m, &d));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = BPC;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    unsigned char *eng = malloc(NB * PAGE), *orig = malloc(NB * PAGE);
    unsigned char *A = malloc(NC * gp->slot_bytes), *B = malloc(NC * gp->slot_bytes);
    fill_random(eng, NB * PAGE);
    memcpy(orig, eng, NB * PAGE);
    uint64_t *P = malloc(sizeof(uint64_t) * NB), *Q = malloc(sizeof(uint64_t) * NB);
    for (uint64_t i = 0; i < NB; i++) P[i] = Q[i] = i;
    for (uint64_t i = NB - 1; i > 0; i--) {
        uint64_t k = kvo_test_rand() % (i + 1), x = P[i];
        P[i] = P[k];
        P[k] = x;
        k = kvo_test_rand() % (i + 1);
        x = Q[i];
        Q[i] = Q[k];
        Q[k] = x;
    }
    kvo_segment seg = {0, eng, NB, PAGE, PAGE};
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 2;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_set_layout(t, &seg, 1));
    kvo__transfer_pause(t, true);
    kvo_xfer_op ops[3][NC];
    for (int c = 0; c < NC; c++) {
        ops[0][c] = (kvo_xfer_op){0, 0, BPC, P + c * BPC, A + c * gp->slot_bytes, gp->slot_bytes};
        ops[1][c] = (kvo_xfer_op){0, 0, BPC, Q + c * BPC, A + c * gp->slot_bytes, gp->slot_bytes};
        ops[2][c] = (kvo_xfer_op){0, 0, BPC, P + c * BPC, B + c * gp->slot_bytes, gp->slot_bytes};
    }
    uint64_t ids[3];
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops[0], NC, &ids[0]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, ops[1], NC, &ids[1]));
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops[2], NC, &ids[2]));
    kvo__transfer_pause(t, false);
    ASSERT_OK(kvo_transfer_wait(t, ids, 3, -1));
    /* Model: A[i] = orig[P[i]]; eng[Q[i]] = A[i]; B[i] = eng[P[i]]. */
    unsigned char *model = malloc(NB * PAGE);
    memcpy(model, orig, NB * PAGE);
    for (uint64_t i = 0; i < NB; i++) memcpy(model + Q[i] * PAGE, orig + P[i] * PAGE, PAGE);
    ASSERT_MEM_EQ(eng, model, NB * PAGE);
    for (uint64_t i = 0; i < NB; i++) {
        uint64_t c = i / BPC, b = i % BPC;
        ASSERT_MEM_EQ(B + c * gp->slot_bytes + b * PAGE, model + P[i] * PAGE, PAGE);
    }
    kvo_xfer_result r[3];
    size_t n;
    ASSERT_OK(kvo_transfer_poll(t, r, 3, &n));
    ASSERT_EQ_U64(n, 3);
    for (int i = 0; i < 3; i++) ASSERT_EQ_INT(r[i].status, 0);
    kvo_transfer_destroy(t);
    free(model);
    free(P);
    free(Q);
    free(A);
    free(B);
    free(eng);
    free(orig);
    kvo_plan_destroy(p);
}
