/* Host arena: one pre-faulted mapping; slots addressed inside it; a shared
 * file mapped by two arenas shows the same bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvo_test.h"

KVO_TEST(anonymous_prefaulted) {
    kvo_arena_params p = kvo_arena_default_params();
    ASSERT_TRUE(p.prefault);
    p.bytes = 3 * 4096 + 100; /* not a page multiple */
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_EQ_U64(kvo_arena_size(a), 3 * 4096 + 100);
    unsigned char *b = kvo_arena_base(a);
    ASSERT_NOT_NULL(b);
    ASSERT_EQ_U64((uintptr_t)b % 4096, 0);
    for (size_t i = 0; i < kvo_arena_size(a); i++) ASSERT_EQ_INT(b[i], 0);
    kvo_slot s = {4096, 4096};
    unsigned char *q = kvo_arena_slot(a, s);
    ASSERT_EQ_PTR(q, b + 4096);
    memset(q, 0xAB, 4096);
    ASSERT_EQ_INT(b[8191], 0xAB);
    kvo_slot edge = {3 * 4096, 100};
    ASSERT_NOT_NULL(kvo_arena_slot(a, edge));
    kvo_slot past = {3 * 4096, 101};
    ASSERT_NULL(kvo_arena_slot(a, past));
    kvo_slot wrap = {UINT64_MAX - 10, 100};
    ASSERT_NULL(kvo_arena_slot(a, wrap));
    kvo_arena_destroy(a);
    kvo_arena_destroy(NULL);
}

KVO_TEST(bad_params) {
    kvo_arena_params p = kvo_arena_default_params();
    kvo_arena *a = NULL;
    ASSERT_ERR(kvo_arena_create(&p, &a), KVO_EINVAL); /* bytes 0 */
    ASSERT_ERR(kvo_arena_create(NULL, &a), KVO_EINVAL);
    p.bytes = 4096;
    ASSERT_ERR(kvo_arena_create(&p, NULL), KVO_EINVAL);
    p.shm_path = "/nonexistent-dir-kvo/arena";
    ASSERT_ERR(kvo_arena_create(&p, &a), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "nonexistent");
    ASSERT_NULL(a);
}

KVO_TEST(shared_file_two_mappings) {
    char path[512];
    snprintf(path, sizeof path, "%s/arena.shm", kvo_test_tmpdir());
    kvo_arena_params p = kvo_arena_default_params();
    p.bytes = 64 * 1024;
    p.shm_path = path;
    kvo_arena *a = NULL, *b = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_OK(kvo_arena_create(&p, &b)); /* maps the existing file */
    ASSERT_NE_U64((uintptr_t)kvo_arena_base(a), (uintptr_t)kvo_arena_base(b));
    kvo_slot s = {8192, 4096};
    memset(kvo_arena_slot(a, s), 0x5C, 4096);
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_slot(b, s))[4095], 0x5C);
    /* another size: refused, the file is kept */
    kvo_arena_params q = p;
    q.bytes = 128 * 1024;
    kvo_arena *c = NULL;
    ASSERT_ERR(kvo_arena_create(&q, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "same size");
    kvo_arena_destroy(b);
    /* the last one unlinks */
    kvo_arena_destroy(a);
    ASSERT_EQ_INT(access(path, F_OK), 0);
    p.shm_unlink = true;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_slot(a, s))[0], 0x5C); /* data persisted in the file */
    kvo_arena_destroy(a);
    ASSERT_NE_INT(access(path, F_OK), 0);
}

KVO_TEST(huge_pages_and_lock_options) {
    kvo_arena_params p = kvo_arena_default_params();
    p.bytes = 4 << 20;
    p.huge_pages = true; /* falls back to normal pages + MADV_HUGEPAGE */
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    memset(kvo_arena_base(a), 1, 4 << 20);
    kvo_arena_destroy(a);
    p.require_huge_pages = true;
    int rc = kvo_arena_create(&p, &a);
    if (rc == 0) {
        ASSERT_TRUE(kvo_arena_huge(a));
        kvo_arena_destroy(a);
    } else {
        ASSERT_EQ_INT(rc, KVO_ENOTSUP);
        ASSERT_CONTAINS(kvo_last_error(), "huge");
    }
    kvo_arena_params l = kvo_arena_default_params();
    l.bytes = 64 * 1024;
    l.lock = true;
    rc = kvo_arena_create(&l, &a);
    if (rc == 0) {
        ASSERT_TRUE(kvo_arena_locked(a));
        kvo_arena_destroy(a);
    } else {
        ASSERT_EQ_INT(rc, KVO_ENOTSUP);
        ASSERT_CONTAINS(kvo_last_error(), "RLIMIT_MEMLOCK");
    }
}

/* A store over an arena: stored bytes land in the slot the store gave. */
KVO_TEST(store_over_arena) {
    kvo_model *m = NULL;
    kvo_plan *pl = NULL;
    ASSERT_OK(kvo_model_preset("deepseek-v4-flash-like", &m));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.block_size = 256;
    ASSERT_OK(kvo_plan_create(m, &pp, &pl));
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = 32 << 20;
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&ap, &a));
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = pl;
    sp.capacity_bytes = kvo_arena_size(a);
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    kvo_chunk_key k[8];
    for (uint32_t g = 0; g < 8; g++) {
        memset(&k[g], 0, sizeof k[g]);
        k[g].hash.lo = 1000 + g;
        k[g].group = g;
    }
    uint8_t need[8];
    kvo_slot sl[8];
    ASSERT_OK(kvo_store_prepare_store(s, k, 8, need, sl, NULL, NULL, 0, NULL));
    for (int i = 0; i < 8; i++) {
        unsigned char *d = kvo_arena_slot(a, sl[i]);
        ASSERT_NOT_NULL(d);
        ASSERT_EQ_U64(sl[i].bytes, kvo_plan_group(pl, (size_t)i)->slot_bytes);
        memset(d, 0x10 + i, sl[i].bytes);
    }
    ASSERT_OK(kvo_store_complete_store(s, k, 8, true));
    kvo_slot ld[8];
    ASSERT_OK(kvo_store_prepare_load(s, k, 8, ld));
    for (int i = 0; i < 8; i++) {
        unsigned char *d = kvo_arena_slot(a, ld[i]);
        ASSERT_EQ_INT(d[0], 0x10 + i);
        ASSERT_EQ_INT(d[ld[i].bytes - 1], 0x10 + i);
    }
    ASSERT_OK(kvo_store_complete_load(s, k, 8));
    kvo_store_destroy(s);
    kvo_arena_destroy(a);
    kvo_plan_destroy(pl);
    kvo_model_destroy(m);
}
