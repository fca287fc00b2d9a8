/* An allocator for kvo_set_allocator whose fa_fail_at-th call (counting
 * from 0 at fa_install or fa_arm) returns NULL: sweeps over k find the error
 * paths that leak or leave state behind.  As kvo_set_allocator requires, it
 * is installed before the objects under test are created and removed after
 * they are destroyed; fa_arm moves the failure in between. */
#ifndef KVO_FAIL_ALLOC_H
#define KVO_FAIL_ALLOC_H

#include <stdlib.h>

#include "kvo_test.h"

static long fa_count, fa_fail_at;

static void *fa_malloc(size_t n, void *ctx) {
    (void)ctx;
    return __atomic_fetch_add(&fa_count, 1, __ATOMIC_SEQ_CST) == __atomic_load_n(&fa_fail_at, __ATOMIC_SEQ_CST)
               ? NULL
               : malloc(n);
}
static void *fa_calloc(size_t n, size_t s, void *ctx) {
    (void)ctx;
    return __atomic_fetch_add(&fa_count, 1, __ATOMIC_SEQ_CST) == __atomic_load_n(&fa_fail_at, __ATOMIC_SEQ_CST)
               ? NULL
               : calloc(n, s);
}
static void *fa_realloc(void *p, size_t n, void *ctx) {
    (void)ctx;
    return __atomic_fetch_add(&fa_count, 1, __ATOMIC_SEQ_CST) == __atomic_load_n(&fa_fail_at, __ATOMIC_SEQ_CST)
               ? NULL
               : realloc(p, n);
}
static void fa_free(void *p, void *ctx) {
    (void)ctx;
    free(p);
}

/* The k-th allocation from now on fails (k < 0: none). */
static inline void fa_arm(long k) {
    __atomic_store_n(&fa_fail_at, -1L, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fa_count, 0L, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fa_fail_at, k, __ATOMIC_SEQ_CST);
}

/* Install the allocator (before creating objects), armed as fa_arm(k). */
static inline void fa_install(long k) {
    static const kvo_allocator fa = KVO_ALLOCATOR_INIT(fa_malloc, fa_calloc, fa_realloc, fa_free, NULL);
    fa_arm(k);
    ASSERT_OK(kvo_set_allocator(&fa));
}

/* Allocations made since fa_install. */
static inline long fa_allocations(void) { return __atomic_load_n(&fa_count, __ATOMIC_SEQ_CST); }

#endif
