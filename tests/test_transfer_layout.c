/*
 * Transfer layer: layout validation (every rejection names the group and the
 * segment; interleaved layouts that share no byte are accepted), the layout
 * hash, and the fast copy routine (exact bytes, nothing outside the
 * destination written, any alignment and length).
 */
#include <stdlib.h>

#include "kvo_test.h"
#include "transfer/copy.h"
#include "transfer/transfer_internal.h"
#include "xfer_test_util.h"

/* Groups: "attn" 2 layers x 100-byte pages, "ssm" (state) 1 layer x 4000,
 * "enc" not cacheable. */
static kvo_plan *plan3(void) {
    static const xt_gspec gs[] = {
        {"attn", KVO_GROUP_FULL, 2, 100, true},
        {"ssm", KVO_GROUP_STATE, 1, 4000, true},
        {"enc", KVO_GROUP_FULL, 1, 64, false},
    };
    return xt_group_plan(gs, 3, 2);
}

static unsigned char MEM[1 << 20];

/* A valid base layout: attn K/V interleaved per layer ([N, 2, 50] -> K at
 * +0 and V at +50 with stride 100), ssm one tensor. */
static size_t base_layout(kvo_segment *s) {
    size_t n = 0;
    for (int l = 0; l < 2; l++) {
        unsigned char *t = MEM + (size_t)l * 100 * 32;
        s[n++] = (kvo_segment){0, t, 32, 100, 50};
        s[n++] = (kvo_segment){0, t + 50, 32, 100, 50};
    }
    s[n++] = (kvo_segment){1, MEM + 200000, 32, 4000, 4000};
    return n;
}

static kvo_transfer *open_t(kvo_plan *p) {
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.threads = 1;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    return t;
}

KVO_TEST(valid_layouts_accepted) {
    kvo_plan *p = plan3();
    kvo_transfer *t = open_t(p);
    kvo_segment s[16];
    size_t n = base_layout(s);
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    /* Non-offloaded group segments are accepted (and never copied). */
    s[n++] = (kvo_segment){2, MEM + 400000, 32, 64, 64};
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    /* Both attn layers and ssm packed in one tensor of rows of 4200 bytes:
     * strided footprints interleave, no byte shared. */
    n = 0;
    for (int l = 0; l < 2; l++) s[n++] = (kvo_segment){0, MEM + (size_t)l * 100, 32, 4200, 100};
    s[n++] = (kvo_segment){1, MEM + 200, 32, 4200, 4000};
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    /* Different strides, extents intersecting, bytes disjoint: attn as one
     * cross-layer segment (pages of 200 every 400 bytes) and the
     * non-offloaded group's 64-byte pages in the gaps, every 800 bytes. */
    n = 0;
    s[n++] = (kvo_segment){0, MEM, 32, 400, 200};
    s[n++] = (kvo_segment){1, MEM + 200000, 32, 4000, 4000};
    s[n++] = (kvo_segment){2, MEM + 200, 16, 800, 64};
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

KVO_TEST(layout_errors_name_group_and_segment) {
    kvo_plan *p = plan3();
    kvo_transfer *t = open_t(p);
    kvo_segment s[16];
    size_t n;
    uint64_t h;
    ASSERT_ERR(kvo_transfer_layout_hash(t, &h), KVO_ESTATE);

    /* stride < page */
    n = base_layout(s);
    s[1].block_stride = 49;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'attn'");
    ASSERT_CONTAINS(kvo_last_error(), "segment 1");
    ASSERT_CONTAINS(kvo_last_error(), "stride");

    /* interleaved K/V overlapping by one byte */
    n = base_layout(s);
    s[1].base = (unsigned char *)s[1].base - 1;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "overlap");
    ASSERT_CONTAINS(kvo_last_error(), "segment 0");
    ASSERT_CONTAINS(kvo_last_error(), "segment 1");

    /* the last page of one layer's tensor runs into the next layer's */
    n = base_layout(s);
    s[2].base = (unsigned char *)s[2].base - 100;
    s[3].base = (unsigned char *)s[3].base - 100;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "overlap");

    /* same base in two groups */
    n = base_layout(s);
    s[4].base = MEM;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'ssm'");

    /* different strides, one shared byte deep inside */
    n = 0;
    s[n++] = (kvo_segment){0, MEM, 32, 400, 200};
    s[n++] = (kvo_segment){1, MEM + 12600 - 1, 3, 4400, 4000};
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "overlap");
    n = 0;
    s[n++] = (kvo_segment){0, MEM + 5000, 32, 400, 200};     /* pages at 5000+400i */
    s[n++] = (kvo_segment){1, MEM, 4, 6000, 4000};           /* [6000,10000) hits 6200.. */
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    /* The first pages fall in gaps, a later one hits: page 1 of enc at
     * 1200 meets attn's page [1200, 1400). */
    n = 0;
    s[n++] = (kvo_segment){0, MEM, 32, 400, 200};
    s[n++] = (kvo_segment){1, MEM + 200000, 32, 4000, 4000};
    s[n++] = (kvo_segment){2, MEM + 200, 16, 1000, 64};
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'enc'");
    ASSERT_CONTAINS(kvo_last_error(), "block 1 ");
    s[2].block_stride = 800; /* in the gaps: fine */
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    ASSERT_OK(kvo_transfer_set_layout(t, s, 0) == KVO_ELAYOUT ? 0 : -1);

    /* pages of a group not adding up to layers * page_bytes */
    n = base_layout(s);
    s[3].page_bytes = 49;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'attn'");
    ASSERT_CONTAINS(kvo_last_error(), "199");
    ASSERT_CONTAINS(kvo_last_error(), "200");
    ASSERT_CONTAINS(kvo_last_error(), "segment");

    /* one layer missing */
    n = base_layout(s);
    s[2] = s[4];
    n = 3;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'attn'");

    /* an offloaded group without segments */
    n = base_layout(s) - 1;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "'ssm'");
    ASSERT_CONTAINS(kvo_last_error(), "no segment");

    /* num_blocks differing within a group */
    n = base_layout(s);
    s[2].num_blocks = 31;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_CONTAINS(kvo_last_error(), "num_blocks");

    /* pointer overflow */
    n = base_layout(s);
    s[4].base = (void *)(UINTPTR_MAX - 4096);
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ERANGE);
    ASSERT_CONTAINS(kvo_last_error(), "'ssm'");
    n = base_layout(s);
    s[4].num_blocks = UINT64_MAX;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ERANGE);

    /* zero sizes, NULL base, unknown group, NULL array */
    n = base_layout(s);
    s[4].page_bytes = 0;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    n = base_layout(s);
    s[4].num_blocks = 0;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    n = base_layout(s);
    s[4].base = NULL;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_EINVAL);
    n = base_layout(s);
    s[4].group = 7;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "group id 7");
    ASSERT_ERR(kvo_transfer_set_layout(t, NULL, 3), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_set_layout(NULL, s, 3), KVO_EINVAL);

    /* A failure keeps the previous layout. */
    n = base_layout(s);
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    uint64_t h1, h2;
    ASSERT_OK(kvo_transfer_layout_hash(t, &h1));
    s[0].block_stride = 1;
    ASSERT_ERR(kvo_transfer_set_layout(t, s, n), KVO_ELAYOUT);
    ASSERT_OK(kvo_transfer_layout_hash(t, &h2));
    ASSERT_EQ_U64(h1, h2);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

KVO_TEST(layout_hash_and_slot_offsets) {
    kvo_plan *p = plan3();
    kvo_transfer *t = open_t(p);
    kvo_segment s[16];
    size_t n = base_layout(s);
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    uint64_t h1, h2, h3, off;
    ASSERT_OK(kvo_transfer_layout_hash(t, &h1));
    /* Segment-major, blocks_per_chunk 2: attn segments of 50 bytes each. */
    ASSERT_OK(kvo_transfer_slot_offset(t, 0, 0, 1, &off));
    ASSERT_EQ_U64(off, 50);
    ASSERT_OK(kvo_transfer_slot_offset(t, 0, 1, 0, &off));
    ASSERT_EQ_U64(off, 100);
    ASSERT_OK(kvo_transfer_slot_offset(t, 0, 3, 1, &off));
    ASSERT_EQ_U64(off, 2 * 150 + 50);
    ASSERT_OK(kvo_transfer_slot_offset(t, 1, 0, 1, &off));
    ASSERT_EQ_U64(off, 4000);
    ASSERT_ERR(kvo_transfer_slot_offset(t, 0, 4, 0, &off), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_slot_offset(t, 0, 0, 2, &off), KVO_EINVAL);
    ASSERT_ERR(kvo_transfer_slot_offset(t, 2, 0, 0, &off), KVO_EINVAL);
    /* Moving tensors keeps the hash; a different split of pages changes it. */
    for (size_t i = 0; i < n; i++) s[i].base = (unsigned char *)s[i].base + 8;
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    ASSERT_OK(kvo_transfer_layout_hash(t, &h2));
    ASSERT_EQ_U64(h1, h2);
    n = 0;
    s[n++] = (kvo_segment){0, MEM, 32, 200, 200}; /* cross-layer */
    s[n++] = (kvo_segment){1, MEM + 200000, 32, 4000, 4000};
    ASSERT_OK(kvo_transfer_set_layout(t, s, n));
    ASSERT_OK(kvo_transfer_layout_hash(t, &h3));
    ASSERT_NE_U64(h1, h3);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}

/* ------------------------------------------------------ copy routine -- */

KVO_TEST(fast_copy_exact_any_alignment) {
    static const size_t sizes[] = {0, 1, 63, 64, 65, 100, 4095, 4096, 4097, 4100, 5000, 8191, 65536 + 17, 200000};
    kvo__copy_kind kinds[3] = {KVO__COPY_MEMCPY, KVO__COPY_SSE2, KVO__COPY_AVX2};
    kvo__copy_kind best = kvo__copy_best();
    size_t cap = 200000 + 256;
    unsigned char *src = malloc(cap), *dst = malloc(cap), *want = malloc(cap);
    for (size_t i = 0; i < cap; i++) src[i] = (unsigned char)kvo_test_rand();
    for (int k = 0; k < 3; k++) {
        if (kinds[k] > best) continue; /* not supported by this CPU */
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t so = 0; so < 64; so += 13)
                for (size_t d = 0; d < 64; d += 7) {
                    size_t n = sizes[si];
                    memset(dst, 0x3C, cap);
                    memset(want, 0x3C, cap);
                    memcpy(want + 64 + d, src + so, n);
                    kvo__copy(kinds[k], dst + 64 + d, src + so, n);
                    kvo__copy_fence();
                    if (memcmp(dst, want, cap)) FAILF("%s: %zu bytes, src +%zu, dst +%zu differ",
                                                     kvo__copy_kind_name(kinds[k]), n, so, d);
                }
    }
    free(src);
    free(dst);
    free(want);
}

KVO_TEST(copy_kind_reported) {
    kvo_plan *p = plan3();
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.nontemporal = 0;
    kvo_transfer *t;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_STR(st.copy_kind, "memcpy");
    ASSERT_EQ_STR(st.device, "host");
    ASSERT_FALSE(st.nontemporal);
    kvo_transfer_destroy(t);
    tp.nontemporal = 1;
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_STR(st.copy_kind, kvo__copy_kind_name(kvo__copy_best()));
    kvo_transfer_destroy(t);
    tp.nontemporal = -1; /* measured: test_transfer_copy_auto.c */
    ASSERT_OK(kvo_transfer_create(&tp, &t));
    kvo_transfer_destroy(t);
    tp.nontemporal = 2;
    ASSERT_ERR(kvo_transfer_create(&tp, &t), KVO_EINVAL);
    kvo_plan_destroy(p);
}

KVO_TEST(worked_example_from_docs) {
    /* docs/slot-format.md: layers 2, page 200 (K 100 + V 100), 3 blocks per
     * chunk, K and V separate per layer; store blocks [17, 4, 5]. */
    kvo_model *m;
    ASSERT_OK(kvo_model_create("doc", 16, &m));
    kvo_group_desc d = kvo_group_desc_default();
    snprintf(d.name, sizeof d.name, "full");
    d.tokens_per_block = 16;
    d.layers = 2;
    d.page_bytes = 200;
    ASSERT_OK(kvo_model_add_group(m, &d));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 3;
    kvo_plan *p;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->chunk_bytes, 1200);
    enum { N = 32 };
    kvo_segment s[4];
    for (int l = 0; l < 2; l++) {
        unsigned char *t = MEM + (size_t)l * 2 * 100 * N;
        s[2 * l] = (kvo_segment){0, t, N, 100, 100};
        s[2 * l + 1] = (kvo_segment){0, t + 100 * N, N, 100, 100};
    }
    for (size_t i = 0; i < 4 * 100 * N; i++) MEM[i] = (unsigned char)(i * 7 + 3);
    kvo_transfer *t = open_t(p);
    ASSERT_OK(kvo_transfer_set_layout(t, s, 4));
    static const uint64_t want_off[4][3] = {{0, 100, 200}, {300, 400, 500}, {600, 700, 800}, {900, 1000, 1100}};
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 3; b++) {
            uint64_t off;
            ASSERT_OK(kvo_transfer_slot_offset(t, 0, k, b, &off));
            ASSERT_EQ_U64(off, want_off[k][b]);
        }
    static unsigned char slot[4096];
    memset(slot, 0xEE, sizeof slot);
    uint64_t blocks[3] = {17, 4, 5}, id;
    kvo_xfer_op op = {0, 0, 3, blocks, slot, sizeof slot};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_OK(kvo_transfer_wait(t, &id, 1, -1));
    kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
    ASSERT_OK(kvo_transfer_get_stats(t, &st));
    ASSERT_EQ_U64(st.copies, 8);
    ASSERT_EQ_U64(st.bytes_stored, 1200);
    for (uint32_t k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 3; b++)
            ASSERT_MEM_EQ(slot + want_off[k][b], (unsigned char *)s[k].base + blocks[b] * 100, 100);
    for (size_t i = 1200; i < sizeof slot; i++) ASSERT_EQ_INT(slot[i], 0xEE);
    /* Partial: first_block 1, n_blocks 2 touches only [100,300), [400,600), ... */
    memset(slot, 0xEE, sizeof slot);
    op = (kvo_xfer_op){0, 1, 2, blocks, slot, sizeof slot};
    ASSERT_OK(kvo_transfer_submit(t, KVO_XFER_STORE, &op, 1, &id));
    ASSERT_OK(kvo_transfer_wait(t, &id, 1, -1));
    for (size_t i = 0; i < sizeof slot; i++) {
        bool target = i < 1200 && (i % 300) >= 100;
        if (!target) ASSERT_EQ_INT(slot[i], 0xEE);
    }
    ASSERT_MEM_EQ(slot + 100, (unsigned char *)s[0].base + 17 * 100, 100);
    ASSERT_MEM_EQ(slot + 1000, (unsigned char *)s[3].base + 17 * 100, 100);
    ASSERT_MEM_EQ(slot + 1100, (unsigned char *)s[3].base + 4 * 100, 100);
    kvo_transfer_destroy(t);
    kvo_plan_destroy(p);
}
