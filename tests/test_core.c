/* Tests of the core: the error table, allocator hooks, version. */
#include <stdlib.h>

#include "kvo_test.h"

KVO_TEST(error_table) {
    ASSERT_EQ_STR(kvo_strerror(KVO_OK), "success");
    ASSERT_EQ_STR(kvo_error_name(KVO_EINVAL), "KVO_EINVAL");
    ASSERT_EQ_STR(kvo_strerror(12345), "unknown error");
    ASSERT_EQ_STR(kvo_error_name(-999), "KVO_E?");
    /* every code from 0 down to KVO_ERROR_MIN has a distinct name */
    for (int a = KVO_ERROR_MIN; a <= 0; a++) {
        ASSERT_NE_INT(strcmp(kvo_error_name(a), "KVO_E?"), 0);
        for (int b = KVO_ERROR_MIN; b < a; b++) ASSERT_NE_INT(strcmp(kvo_error_name(a), kvo_error_name(b)), 0);
    }
}

static size_t live_allocs;
static void *t_malloc(size_t n, void *c) { (void)c; live_allocs++; return malloc(n); }
static void *t_calloc(size_t n, size_t s, void *c) { (void)c; live_allocs++; return calloc(n, s); }
static void *t_realloc(void *p, size_t n, void *c) { (void)c; if (!p) live_allocs++; return realloc(p, n); }
static void t_free(void *p, void *c) { (void)c; if (p) live_allocs--; free(p); }

KVO_TEST(allocator_hooks) {
    kvo_allocator a = {t_malloc, t_calloc, t_realloc, t_free, NULL};
    ASSERT_OK(kvo_set_allocator(&a));
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_model_preset("gemma-4-31b-like", &m));
    ASSERT_OK(kvo_plan_create(m, NULL, &p));
    ASSERT_GT_U64(live_allocs, 0);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    ASSERT_EQ_U64(live_allocs, 0);
    ASSERT_OK(kvo_set_allocator(NULL));
    kvo_allocator half = {t_malloc, NULL, NULL, NULL, NULL};
    ASSERT_ERR(kvo_set_allocator(&half), KVO_EINVAL);
}

static void *fail_malloc(size_t n, void *c) { (void)n; (void)c; return NULL; }
static void *fail_calloc(size_t n, size_t s, void *c) { (void)n; (void)s; (void)c; return NULL; }
static void *fail_realloc(void *p, size_t n, void *c) { (void)p; (void)n; (void)c; return NULL; }
static void fail_free(void *p, void *c) { (void)c; free(p); }

KVO_TEST(out_of_memory_is_an_error) {
    kvo_allocator a = {fail_malloc, fail_calloc, fail_realloc, fail_free, NULL};
    kvo_model *m = NULL;
    ASSERT_OK(kvo_set_allocator(&a));
    int rc = kvo_model_create("x", 16, &m);
    ASSERT_OK(kvo_set_allocator(NULL));
    ASSERT_EQ_INT(rc, KVO_ENOMEM);
    ASSERT_NULL(m);
}

KVO_TEST(version) {
    ASSERT_EQ_STR(kvo_version(), KVO_VERSION_STRING);
    ASSERT_EQ_INT(kvo_version_number(), KVO_VERSION_MAJOR * 10000 + KVO_VERSION_MINOR * 100 + KVO_VERSION_PATCH);
    char hex[33];
    kvo_u128 v = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    kvo_u128_hex(v, hex);
    ASSERT_EQ_STR(hex, "fedcba98765432100123456789abcdef");
}
