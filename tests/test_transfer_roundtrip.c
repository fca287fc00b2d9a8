/*
 * Transfer engine: byte-exact round trips.
 *
 * Every round trip fills engine memory with random bytes, poisons the slots,
 * stores, checks that each target byte of each slot equals the engine page
 * it came from (offsets computed from the documented slot format by
 * xfer_test_util.h, not by the library) and every other byte is still
 * poison, and that the engine memory is unchanged; then it poisons the
 * engine memory, loads, and checks the reverse.  Covered: every layout kind
 * of the fixture, chunks of 1 and 3 blocks, streaming and plain copies, one
 * to four workers, merging of adjacent pages (and its copy count), every
 * preset's real geometry, and pages large enough to be split into parts.
 */
#include <stdlib.h>

#include "xfer_test_util.h"

static void roundtrip(int kind, uint64_t bpc, int nt, uint32_t threads, bool consecutive) {
    fprintf(stderr, "round trip: layout %s, blocks_per_chunk %llu, nontemporal %d, %u threads%s\n", XT_LNAMES[kind],
            (unsigned long long)bpc, nt, threads, consecutive ? ", consecutive blocks" : "");
    kvo_plan *p = xt_plan(bpc);
    xt_layout L;
    xt_make_layout(&L, kind);
    xt_fill_random(L.mem, L.bytes);
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
    xt_job J;
    xt_make_job(&J, p, start, count, consecutive);
    for (size_t k = 0; k < J.n; k++) {
        const kvo_group_plan *gp = kvo_plan_group(p, J.ops[k].group);
        if (J.slots[k]) memset(J.slots[k], XT_POISON, gp->slot_bytes + 64);
    }

    uint64_t id;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, J.ops, J.n, &id));
    kvo_xfer_result r = xt_wait_one(t, id);
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, J.bytes);
    ASSERT_EQ_U64(r.dir, KVO_XFER_STORE);
    ASSERT_MEM_EQ(L.mem, orig, L.bytes); /* sources never modified */
    xt_check_slots(&L, p, &J);

    /* Library offsets agree with the documented format. */
    for (uint32_t g = 0; g < 3; g++)
        for (size_t s = 0; xt_gseg(&L, g, s); s++)
            for (uint32_t b = 0; b < bpc; b++) {
                uint64_t page, o;
                ASSERT_OK(kvo_transfer_slot_offset(t, g, (uint32_t)s, b, &o));
                ASSERT_EQ_U64(o, xt_expect_off(&L, g, s, bpc, b, &page));
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
    memset(L.mem, XT_POISON, L.bytes);
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, J.ops, J.n, &id));
    r = xt_wait_one(t, id);
    ASSERT_EQ_INT(r.status, 0);
    ASSERT_EQ_U64(r.bytes, J.bytes);
    /* Expected engine memory: poison except the loaded pages. */
    unsigned char *want = malloc(L.bytes);
    memset(want, XT_POISON, L.bytes);
    for (size_t k = 0; k < J.n; k++) {
        const kvo_xfer_op *op = &J.ops[k];
        for (size_t s = 0; xt_gseg(&L, op->group, s); s++) {
            const kvo_segment *sg = xt_gseg(&L, op->group, s);
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
    xt_free_job(&J);
    kvo_transfer_destroy(t);
    free(L.mem);
    kvo_plan_destroy(p);
}

KVO_TEST(roundtrip_every_layout_bpc1) {
    for (int k = 0; k < XT_L_COUNT; k++) roundtrip(k, 1, -1, 2, false);
}

KVO_TEST(roundtrip_every_layout_bpc3) {
    for (int k = 0; k < XT_L_COUNT; k++) roundtrip(k, 3, -1, 2, false);
}

KVO_TEST(roundtrip_consecutive_blocks_merge) {
    /* Consecutive engine blocks: adjacent pages are merged into one copy. */
    for (int k = 0; k < XT_L_COUNT; k++) roundtrip(k, 3, -1, 1, true);
}

KVO_TEST(roundtrip_memcpy_and_many_threads) {
    for (int k = 0; k < XT_L_COUNT; k++) {
        roundtrip(k, 3, 0, 1, false);
        roundtrip(k, 1, 1, 4, false);
    }
}

KVO_TEST(merging_counts_copies) {
    /* Cross-layer layout with stride == page: 3 consecutive blocks of one
     * chunk are one copy; shuffled ones are three. */
    kvo_plan *p = xt_plan(3);
    static unsigned char eng[3][XT_NBLK * 9000 * 3];
    kvo_segment segs[3];
    for (uint32_t g = 0; g < 3; g++) {
        uint64_t page = XT_GS[g].layers * XT_GS[g].page;
        segs[g] = (kvo_segment){g, eng[g], XT_NBLK, page, page};
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
    ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 1);
    op.engine_blocks = shuf;
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 4);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
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
            xt_fill_random(mem[g], bytes[g]);
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
            memset(slot[g], XT_POISON, gp->slot_bytes);
            ops[nops++] = (kvo_xfer_op){(uint32_t)g, 0, (uint32_t)gp->blocks_per_chunk, ids[g], slot[g], gp->slot_bytes};
        }
        uint64_t id;
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, ops, nops, &id));
        ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
        /* Slot check: layer l, chunk block b at B*l*page + b*page. */
        for (size_t k = 0; k < nops; k++) {
            const kvo_group_plan *gp = kvo_plan_group(p, ops[k].group);
            uint32_t g = ops[k].group;
            for (uint32_t l = 0; l < gp->layers; l++)
                for (uint64_t b = 0; b < gp->blocks_per_chunk; b++)
                    ASSERT_MEM_EQ(slot[g] + (gp->blocks_per_chunk * l + b) * gp->page_bytes,
                                  mem[g] + (l * nb[g] + ids[g][b]) * gp->page_bytes, gp->page_bytes);
            for (uint64_t i = gp->chunk_bytes; i < gp->slot_bytes; i++) ASSERT_EQ_INT(slot[g][i], XT_POISON);
        }
        /* Load chunk blocks 1.. (a first chunk starting mid-chunk) into
         * poisoned engine memory. */
        for (size_t k = 0; k < nops; k++) {
            uint32_t g = ops[k].group;
            orig[g] = malloc(bytes[g]);
            memcpy(orig[g], mem[g], bytes[g]);
            memset(mem[g], XT_POISON, bytes[g]);
            if (ops[k].n_blocks > 1) {
                ops[k].first_block = 1;
                ops[k].n_blocks--;
                ops[k].engine_blocks = ids[g] + 1;
            }
        }
        ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, ops, nops, &id));
        ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
        for (size_t k = 0; k < nops; k++) {
            uint32_t g = ops[k].group;
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            unsigned char *want = malloc(bytes[g]);
            memset(want, XT_POISON, bytes[g]);
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

KVO_TEST(huge_pages_split_into_parts) {
    /* A cross-layer segment of 3 layers of 1 MiB + 36 bytes: pages of about
     * 3 MiB (not a multiple of 64) are split into 4 parts, one work unit
     * each; bytes are exact. */
    kvo_plan *p = xt_one_group_plan(3, (1u << 20) + 36, 2);
    const kvo_group_plan *gp = kvo_plan_group(p, 0);
    uint64_t page = 3 * gp->page_bytes, stride = page + 4096 + 8;
    size_t bytes = (size_t)(4 * stride);
    unsigned char *mem = malloc(bytes + 64), *orig = malloc(bytes + 64), *slot = malloc(gp->slot_bytes + 64);
    xt_fill_random(mem, bytes + 64);
    memcpy(orig, mem, bytes + 64);
    memset(slot, XT_POISON, gp->slot_bytes + 64);
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
    ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
    ASSERT_MEM_EQ(slot + 5, mem + 3 + 3 * stride, page);
    ASSERT_MEM_EQ(slot + 5 + page, mem + 3 + 1 * stride, page);
    for (size_t i = 0; i < 5; i++) ASSERT_EQ_INT(slot[i], XT_POISON);
    for (size_t i = 5 + 2 * page; i < gp->slot_bytes + 64; i++) ASSERT_EQ_INT(slot[i], XT_POISON);
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 8); /* 4 parts per page */
    ASSERT_MEM_EQ(mem, orig, bytes + 64);
    /* Load chunk block 1 into engine block 2 of poisoned memory. */
    memset(mem, XT_POISON, bytes + 64);
    uint64_t b2 = 2;
    op = (kvo_xfer_op){0, 1, 1, &b2, slot + 5, gp->slot_bytes};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_LOAD, &op, 1, &id));
    ASSERT_EQ_INT(xt_wait_one(t, id).status, 0);
    unsigned char *want = malloc(bytes + 64);
    memset(want, XT_POISON, bytes + 64);
    memcpy(want + 3 + 2 * stride, orig + 3 + 1 * stride, page);
    ASSERT_MEM_EQ(mem, want, bytes + 64);
    kvo_transfer_destroy(t);
    free(want);
    free(mem);
    free(orig);
    free(slot);
    kvo_plan_destroy(p);
}
