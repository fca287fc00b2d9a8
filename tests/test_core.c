/* Tests of the core: the error table, allocator hooks, version, logging. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvo_test.h"
#include "core/internal.h"

KVO_TEST(error_table) {
    ASSERT_EQ_STR(kvo_strerror(KVO_OK), "success");
    ASSERT_EQ_STR(kvo_error_name(KVO_EINVAL), "KVO_EINVAL");
    ASSERT_EQ_STR(kvo_strerror(12345), "unknown error");
    ASSERT_EQ_STR(kvo_error_name(-999), "KVO_E?");
    /* every code of the table has a distinct name, a text and a distinct value */
    size_t n = kvo_error_count();
    ASSERT_GT_U64(n, 1);
    ASSERT_EQ_INT(kvo_error_code(0), KVO_OK);
    for (size_t i = 0; i < n; i++) {
        int a = kvo_error_code(i);
        ASSERT_NE_INT(strcmp(kvo_error_name(a), "KVO_E?"), 0);
        ASSERT_NE_INT(strcmp(kvo_strerror(a), "unknown error"), 0);
        for (size_t j = 0; j < i; j++) {
            int b = kvo_error_code(j);
            ASSERT_NE_INT(a, b);
            ASSERT_NE_INT(strcmp(kvo_error_name(a), kvo_error_name(b)), 0);
        }
    }
}

/* No KVO_E* code can be mistaken for a negated errno value: every failure
 * code is at or below KVO_ERROR_BASE, and every errno value this platform
 * names is unknown to the table. */
KVO_TEST(error_codes_never_overlap_errno) {
    for (size_t i = 1; i < kvo_error_count(); i++) ASSERT_TRUE(kvo_error_code(i) < KVO_ERROR_BASE);
    for (int e = 1; e < -KVO_ERROR_BASE; e++) { /* Linux errno values end at 133 */
        ASSERT_EQ_STR(kvo_error_name(-e), "KVO_E?");
        ASSERT_EQ_STR(kvo_strerror(-e), "unknown error");
    }
    ASSERT_EQ_INT(kvo_error_code(kvo_error_count()), 0);
}

static size_t live_allocs;
static void *t_malloc(size_t n, void *c) { (void)c; live_allocs++; return malloc(n); }
static void *t_calloc(size_t n, size_t s, void *c) { (void)c; live_allocs++; return calloc(n, s); }
static void *t_realloc(void *p, size_t n, void *c) { (void)c; if (!p) live_allocs++; return realloc(p, n); }
static void t_free(void *p, void *c) { (void)c; if (p) live_allocs--; free(p); }

KVO_TEST(allocator_hooks) {
    kvo_allocator a = KVO_ALLOCATOR_INIT(t_malloc, t_calloc, t_realloc, t_free, NULL);
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
    kvo_allocator half = KVO_ALLOCATOR_INIT(t_malloc, NULL, NULL, NULL, NULL);
    ASSERT_ERR(kvo_set_allocator(&half), KVO_EINVAL);
    /* struct_size convention: a brace-initialised struct without it is refused */
    kvo_allocator nosize = a;
    nosize.struct_size = 0;
    ASSERT_ERR(kvo_set_allocator(&nosize), KVO_EINVAL);
    ASSERT_TRUE(strstr(kvo_last_error(), "struct_size") != NULL);
}

static void *fail_malloc(size_t n, void *c) { (void)n; (void)c; return NULL; }
static void *fail_calloc(size_t n, size_t s, void *c) { (void)n; (void)s; (void)c; return NULL; }
static void *fail_realloc(void *p, size_t n, void *c) { (void)p; (void)n; (void)c; return NULL; }
static void fail_free(void *p, void *c) { (void)c; free(p); }

KVO_TEST(out_of_memory_is_an_error) {
    kvo_allocator a = KVO_ALLOCATOR_INIT(fail_malloc, fail_calloc, fail_realloc, fail_free, NULL);
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
    ASSERT_EQ_INT(kvo_version_number(), KVO_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KVO_VERSION_MAJOR, KVO_VERSION_MINOR, KVO_VERSION_PATCH);
    ASSERT_EQ_STR(kvo_version(), want);
    char hex[33];
    kvo_u128 v = {0x0123456789abcdefull, 0xfedcba9876543210ull};
    kvo_u128_hex(v, hex);
    ASSERT_EQ_STR(hex, "fedcba98765432100123456789abcdef");
}

/* ------------------------------------------------------------ logging -- */

typedef struct log_sink {
    int lines;
    kvo_log_level last_level;
    char last[KVO__LOG_MAX];
} log_sink;

static void sink_fn(kvo_log_level level, const char *msg, void *ctx) {
    log_sink *s = ctx;
    s->lines++;
    s->last_level = level;
    snprintf(s->last, sizeof s->last, "%s", msg);
}

KVO_TEST(log_hook_and_threshold) {
    log_sink s = {0};
    ASSERT_OK(kvo_set_log(sink_fn, &s, KVO_LOG_INFO));
    kvo__log(KVO_LOG_DEBUG, "below the threshold %d", 1);
    ASSERT_EQ_INT(s.lines, 0);
    kvo__log(KVO_LOG_WARN, "disk %s is full (%d%%)", "/x", 99);
    ASSERT_EQ_INT(s.lines, 1);
    ASSERT_EQ_INT(s.last_level, KVO_LOG_WARN);
    ASSERT_EQ_STR(s.last, "disk /x is full (99%)");
    ASSERT_OK(kvo_set_log(sink_fn, &s, KVO_LOG_OFF));
    kvo__log(KVO_LOG_ERROR, "silenced");
    ASSERT_EQ_INT(s.lines, 1);
    ASSERT_ERR(kvo_set_log(sink_fn, &s, (kvo_log_level)7), KVO_EINVAL);
    ASSERT_OK(kvo_set_log(NULL, NULL, KVO_LOG_WARN));
    ASSERT_EQ_STR(kvo_log_level_name(KVO_LOG_ERROR), "error");
}

KVO_TEST(log_limited_counts_suppressed_lines) {
    log_sink s = {0};
    kvo__log_limit lim = {0};
    ASSERT_OK(kvo_set_log(sink_fn, &s, KVO_LOG_DEBUG));
    /* a one-hour interval: the first line passes, the next ones are counted */
    for (int i = 0; i < 5; i++) kvo__log_limited(&lim, 3600, KVO_LOG_WARN, "event %d", i);
    ASSERT_EQ_INT(s.lines, 1);
    ASSERT_EQ_STR(s.last, "event 0");
    ASSERT_EQ_U64(lim.suppressed, 4);
    /* interval 0: every line passes, the first one reports the 4 suppressed */
    kvo__log_limited(&lim, 0, KVO_LOG_WARN, "event %d", 5);
    ASSERT_EQ_INT(s.lines, 2);
    ASSERT_TRUE(strstr(s.last, "event 5") == s.last);
    ASSERT_TRUE(strstr(s.last, "4 similar events not logged") != NULL);
    ASSERT_OK(kvo_set_log(NULL, NULL, KVO_LOG_WARN));
}

/* The default sink writes "kvoffload: <level>: <message>" lines to stderr and
 * bounds a flood: 100 lines logged at once do not all come out. */
KVO_TEST(log_default_sink_is_bounded) {
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", kvo_test_tmpdir());
    FILE *cap = fopen(path, "w+");
    ASSERT_NOT_NULL(cap);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ASSERT_TRUE(saved >= 0);
    ASSERT_TRUE(dup2(fileno(cap), STDERR_FILENO) >= 0);
    ASSERT_OK(kvo_set_log(NULL, NULL, KVO_LOG_WARN));
    kvo__log(KVO_LOG_INFO, "below the default threshold");
    for (int i = 0; i < 100; i++) kvo__log(KVO_LOG_WARN, "flood %d", i);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(cap);
    char line[256], first[256] = "";
    int lines = 0;
    while (fgets(line, sizeof line, cap)) {
        if (!lines) snprintf(first, sizeof first, "%s", line);
        lines++;
    }
    fclose(cap);
    ASSERT_EQ_STR(first, "kvoffload: warn: flood 0\n");
    ASSERT_GT_INT(lines, 0);
    ASSERT_LT_INT(lines, 100);
}
