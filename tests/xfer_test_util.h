/*
 * The transfer tests' fixture (tests/test_transfer_*.c, test_cuda.c): plans,
 * engine layouts, jobs and the checks of what a job copied.
 *
 * Plans: xt_group_plan(specs) for any groups; xt_plan(bpc) for the four
 * groups of XT_GS (full, sliding, state, one not offloaded; pages that are
 * not multiples of 64, one above the streaming threshold);
 * xt_one_group_plan(layers, page, bpc) for one group "kv".
 *
 * Layouts (xt_make_layout, XT_L_*): every group of XT_GS in one malloc'd
 * buffer with unaligned offsets and gaps: K and V as separate tensors
 * ([2, N, h]), K/V interleaved per block as two strided segments, one
 * segment per layer, one cross-layer segment, and every layer of every group
 * packed side by side in one tensor.
 *
 * Checks compute slot offsets from the documented slot format
 * (xt_expect_off: B * pages of the group's earlier segments + b * page),
 * never from the library.  XT_POISON marks bytes no copy may touch.
 */
#ifndef KVO_XFER_TEST_UTIL_H
#define KVO_XFER_TEST_UTIL_H

#include <stdlib.h>

#include "kvo_test.h"

#define XT_POISON 0xA5
#define XT_NBLK 16 /* engine blocks per group */

typedef struct xt_gspec {
    const char *name;
    kvo_group_kind kind;
    uint32_t layers;
    uint64_t page;   /* even: K and V halves */
    bool cacheable;
} xt_gspec;

/* Three offloaded groups (pages not multiples of 64; one above the
 * streaming threshold) and one that is not offloaded. */
static const xt_gspec XT_GS[] __attribute__((unused)) = {
    {"full", KVO_GROUP_FULL, 3, 200, true},
    {"swa", KVO_GROUP_SLIDING, 2, 136, true},
    {"state", KVO_GROUP_STATE, 1, 9000, true},
    {"nocache", KVO_GROUP_FULL, 1, 64, false},
};
#define XT_NG 4

/* A plan of the groups gs[0..n-1] (16 tokens per block; a sliding group
 * gets a 64-token window), blocks_per_chunk = bpc. */
static inline kvo_plan *xt_group_plan(const xt_gspec *gs, size_t n, uint64_t bpc) {
    kvo_model *m;
    ASSERT_OK(kvo_model_create("xfer-test", 16, &m));
    for (size_t g = 0; g < n; g++) {
        kvo_group_desc d = kvo_group_desc_default();
        snprintf(d.name, sizeof d.name, "%s", gs[g].name);
        d.kind = gs[g].kind;
        d.tokens_per_block = 16;
        d.layers = gs[g].layers;
        d.page_bytes = gs[g].page;
        d.window = gs[g].kind == KVO_GROUP_SLIDING ? 64 : 0;
        d.cacheable = gs[g].cacheable;
        ASSERT_OK(kvo_model_add_group(m, &d));
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = bpc;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    return p;
}

/* The four groups of XT_GS. */
static inline kvo_plan *xt_plan(uint64_t bpc) { return xt_group_plan(XT_GS, XT_NG, bpc); }

/* One group "kv" (full attention) of `layers` layers of `page`-byte pages. */
static inline kvo_plan *xt_one_group_plan(uint32_t layers, uint64_t page, uint64_t bpc) {
    const xt_gspec g = {"kv", KVO_GROUP_FULL, layers, page, true};
    return xt_group_plan(&g, 1, bpc);
}

enum { XT_L_SEPARATE, XT_L_INTERLEAVED_KV, XT_L_INTERLEAVED_PAGE, XT_L_CROSS, XT_L_PACKED, XT_L_COUNT };
static const char *const XT_LNAMES[] __attribute__((unused)) = {"kv-separate", "kv-interleaved",
                                                                 "interleaved-page", "cross-layer", "packed"};

typedef struct xt_layout {
    kvo_segment segs[64];
    size_t n;
    unsigned char *mem;
    size_t bytes;
} xt_layout;

static inline void xt_add_seg(xt_layout *L, uint32_t g, size_t off, uint64_t stride, uint64_t page) {
    ASSERT_LT_U64(L->n, 64);
    L->segs[L->n++] = (kvo_segment){g, L->mem + off, XT_NBLK, stride, page};
}

/* Build a layout of `kind` for every group in one buffer (unaligned
 * offsets, gaps between tensors). */
static inline void xt_make_layout(xt_layout *L, int kind) {
    memset(L, 0, sizeof *L);
    size_t total = 0;
    for (int g = 0; g < XT_NG; g++) total += (XT_GS[g].layers * XT_GS[g].page + 64) * XT_NBLK + 4096;
    L->bytes = total + 4096;
    L->mem = malloc(L->bytes);
    ASSERT_NOT_NULL(L->mem);
    size_t off = 13; /* deliberately not aligned */
    if (kind == XT_L_PACKED) {
        /* One tensor [XT_NBLK, row]: every group's layers side by side. */
        size_t row = 40;
        for (int g = 0; g < XT_NG; g++) row += XT_GS[g].layers * XT_GS[g].page;
        size_t col = 8;
        for (int g = 0; g < XT_NG; g++)
            for (uint32_t l = 0; l < XT_GS[g].layers; l++, col += XT_GS[g].page)
                xt_add_seg(L, (uint32_t)g, off + col, row, XT_GS[g].page);
        return;
    }
    for (int g = 0; g < XT_NG; g++) {
        uint64_t P = XT_GS[g].page, h = P / 2;
        if (kind == XT_L_CROSS) {
            uint64_t page = XT_GS[g].layers * P;
            xt_add_seg(L, (uint32_t)g, off, page + 24, page);
            off += (page + 24) * XT_NBLK + 72;
            continue;
        }
        for (uint32_t l = 0; l < XT_GS[g].layers; l++) {
            switch (kind) {
            case XT_L_SEPARATE: /* [2, XT_NBLK, h] */
                xt_add_seg(L, (uint32_t)g, off, h, h);
                xt_add_seg(L, (uint32_t)g, off + h * XT_NBLK, h, h);
                off += 2 * h * XT_NBLK + 40;
                break;
            case XT_L_INTERLEAVED_KV: /* [XT_NBLK, 2, h]: K and V as two strided segments */
                xt_add_seg(L, (uint32_t)g, off, 2 * h, h);
                xt_add_seg(L, (uint32_t)g, off + h, 2 * h, h);
                off += 2 * h * XT_NBLK + 40;
                break;
            case XT_L_INTERLEAVED_PAGE: /* [XT_NBLK, 2, h] as one segment per layer */
                xt_add_seg(L, (uint32_t)g, off, P, P);
                off += P * XT_NBLK + 40;
                break;
            }
        }
    }
    ASSERT_LE_U64(off, L->bytes);
}

static inline void xt_fill_random(unsigned char *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = kvo_test_rand();
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++) p[i] = (unsigned char)kvo_test_rand();
}

/* Expected slot offset of (segment k of group g, chunk block b), from the
 * documented format: B * sum(pages of earlier segments of g) + b * page. */
static inline uint64_t xt_expect_off(const xt_layout *L, uint32_t g, size_t k, uint64_t B, uint64_t b, uint64_t *page) {
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

static inline const kvo_segment *xt_gseg(const xt_layout *L, uint32_t g, size_t k) {
    size_t seen = 0;
    for (size_t i = 0; i < L->n; i++)
        if (L->segs[i].group == g && seen++ == k) return &L->segs[i];
    return NULL;
}

/* All bytes of engine block blk of group g, segment after segment (with
 * blocks_per_chunk 1 this is exactly the slot format). */
static inline void xt_gather_block(const xt_layout *L, uint32_t g, uint64_t blk, unsigned char *out) {
    size_t o = 0;
    for (size_t s = 0; xt_gseg(L, g, s); s++) {
        const kvo_segment *sg = xt_gseg(L, g, s);
        memcpy(out + o, (unsigned char *)sg->base + blk * sg->block_stride, sg->page_bytes);
        o += sg->page_bytes;
    }
}

/* A job: per offloaded group, a run of token blocks [start, start+count)
 * cut into chunks (partial first and last), each chunk with its own slot. */
typedef struct xt_job {
    kvo_xfer_op ops[64];
    uint64_t blocks[64][8];
    unsigned char *slots[64];
    size_t n;
    uint64_t bytes;
} xt_job;

static inline void xt_make_job(xt_job *J, const kvo_plan *p, const uint32_t start[3], const uint32_t count[3],
                               bool consecutive) {
    memset(J, 0, sizeof *J);
    /* Engine blocks: a permutation so that loads never write a block twice. */
    for (uint32_t g = 0; g < 3; g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        uint64_t B = gp->blocks_per_chunk;
        uint64_t perm[XT_NBLK];
        for (int i = 0; i < XT_NBLK; i++) perm[i] = (uint64_t)i;
        if (!consecutive)
            for (int i = XT_NBLK - 1; i > 0; i--) {
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
            for (uint32_t b = 0; b < op->n_blocks; b++) J->blocks[k][b] = perm[used++ % XT_NBLK];
            op->engine_blocks = J->blocks[k];
            J->slots[k] = malloc(gp->slot_bytes + 64);
            ASSERT_NOT_NULL(J->slots[k]);
            op->slot = J->slots[k] + (k % 3) * 8; /* unaligned slots too */
            op->slot_bytes = gp->chunk_bytes;
            J->bytes += op->n_blocks * XT_GS[g].layers * XT_GS[g].page;
        }
        ASSERT_LE_U64(used, XT_NBLK);
    }
}

static inline void xt_free_job(xt_job *J) {
    for (size_t k = 0; k < J->n; k++) free(J->slots[k]);
}

static inline kvo_xfer_result xt_wait_one(kvo_transfer *t, uint64_t id) {
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
static inline void xt_check_slots(const xt_layout *L, const kvo_plan *p, const xt_job *J) {
    for (size_t k = 0; k < J->n; k++) {
        const kvo_xfer_op *op = &J->ops[k];
        if (!op->n_blocks) continue;
        const kvo_group_plan *gp = kvo_plan_group(p, op->group);
        uint64_t B = gp->blocks_per_chunk;
        unsigned char *want = malloc(gp->slot_bytes + 64);
        memset(want, XT_POISON, gp->slot_bytes + 64);
        size_t nseg = 0;
        while (xt_gseg(L, op->group, nseg)) nseg++;
        for (size_t s = 0; s < nseg; s++) {
            const kvo_segment *sg = xt_gseg(L, op->group, s);
            for (uint32_t b = 0; b < op->n_blocks; b++) {
                uint64_t page, o = xt_expect_off(L, op->group, s, B, op->first_block + b, &page);
                memcpy(want + ((unsigned char *)op->slot - J->slots[k]) + o,
                       (unsigned char *)sg->base + op->engine_blocks[b] * sg->block_stride, page);
            }
        }
        ASSERT_MEM_EQ(J->slots[k], want, gp->slot_bytes + 64);
        free(want);
    }
}

typedef struct xt_simple {
    kvo_plan *p;
    xt_layout L;
    kvo_transfer *t;
} xt_simple;

static inline void xt_simple_open(xt_simple *S, uint64_t bpc, uint32_t threads, uint32_t max_queued) {
    S->p = xt_plan(bpc);
    xt_make_layout(&S->L, XT_L_SEPARATE);
    xt_fill_random(S->L.mem, S->L.bytes);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = S->p;
    tp.threads = threads;
    tp.max_queued_jobs = max_queued;
    ASSERT_OK(kvo_transfer_create(&tp, &S->t));
    ASSERT_OK(kvo_transfer_set_layout(S->t, S->L.segs, S->L.n));
}

static inline void xt_simple_close(xt_simple *S) {
    kvo_transfer_destroy(S->t);
    free(S->L.mem);
    kvo_plan_destroy(S->p);
}

#endif
