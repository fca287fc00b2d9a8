/*
 * The file tier's test hooks (file_testing.h), built only with KVO_TESTING:
 * an injected errno and a count of writes to fail, process-wide atomics
 * that the write path (file_ops.c) takes one at a time.
 */
#include "tiers/file_testing.h"

#ifdef KVO_TESTING
#include <stdatomic.h>

static atomic_int g_inject_err;
static atomic_uint g_inject_count;

void kvo__file_tier_inject_write_error(int err, uint32_t count) {
    atomic_store(&g_inject_err, err);
    atomic_store(&g_inject_count, count);
}

int kvo__file_take_injected(void) {
    unsigned c = atomic_load(&g_inject_count);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&g_inject_count, &c, c - 1)) return atomic_load(&g_inject_err);
    }
    return 0;
}
#else
typedef int kvo__file_testing_unused; /* ISO C: no empty translation unit */
#endif
