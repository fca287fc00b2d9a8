/*
 * A small test runner.  Each test file defines tests with
 *
 *     KVO_TEST(name) { ... ASSERT_EQ_U64(a, b); ... }
 *
 * (KVO_TEST must start a line: cmake/KvoTests.cmake registers every one as a
 * ctest entry "<suite>.<name>").  Run a test binary with a test name to run
 * that test, with no argument to run all, with --list to list them.
 * A failed ASSERT prints file:line and both sides and ends the test; SKIP()
 * ends it with exit code 77 (ctest reports it as skipped).
 */
#ifndef KVO_TEST_H
#define KVO_TEST_H

#include <inttypes.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvoffload/kvo.h"

typedef void (*kvo_test_fn)(void);
void kvo_test_register(const char *name, kvo_test_fn fn);
void kvo_test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
void kvo_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Deterministic PRNG for tests (splitmix64).  Seed from KVO_TEST_SEED env or default. */
uint64_t kvo_test_rand(void);
uint64_t kvo_test_seed(void);
/* Read a whole file (malloc'd, NUL-terminated) or NULL. */
char *kvo_test_read_file(const char *path, size_t *len);
/* Path under ../shared, or skip the test when shared/ is missing. */
const char *kvo_test_shared_path(const char *rel);
/* Run a shell command; capture stdout (malloc'd) and return the exit code. */
int kvo_test_run(const char *cmd, char **out);
/* A fresh temporary directory for this test (removed at exit when it passed). */
const char *kvo_test_tmpdir(void);

#define KVO_TEST(name)                                                                 \
    static void kvo_test_##name(void);                                                 \
    __attribute__((constructor)) static void kvo_test_reg_##name(void) {               \
        kvo_test_register(#name, kvo_test_##name);                                     \
    }                                                                                  \
    static void kvo_test_##name(void)

#define FAILF(...) kvo_test_fail(__FILE__, __LINE__, __VA_ARGS__)
#define SKIP(...) kvo_test_skip(__VA_ARGS__)

#define ASSERT_TRUE(c) do { if (!(c)) FAILF("ASSERT_TRUE(%s)", #c); } while (0)
#define ASSERT_FALSE(c) do { if (c) FAILF("ASSERT_FALSE(%s)", #c); } while (0)
#define KVO__ASSERT_OP(T, fmt, a, op, b) do { T a_ = (a); T b_ = (b); \
    if (!(a_ op b_)) FAILF("%s %s %s: " fmt " vs " fmt, #a, #op, #b, a_, b_); } while (0)
#define ASSERT_EQ_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, ==, b)
#define ASSERT_NE_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, !=, b)
#define ASSERT_LT_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, <, b)
#define ASSERT_LE_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, <=, b)
#define ASSERT_GE_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, >=, b)
#define ASSERT_GT_INT(a, b) KVO__ASSERT_OP(long long, "%lld", a, >, b)
#define ASSERT_EQ_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, ==, b)
#define ASSERT_NE_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, !=, b)
#define ASSERT_LE_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, <=, b)
#define ASSERT_GE_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, >=, b)
#define ASSERT_LT_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, <, b)
#define ASSERT_GT_U64(a, b) KVO__ASSERT_OP(unsigned long long, "%llu", a, >, b)
#define ASSERT_EQ_DBL(a, b) KVO__ASSERT_OP(double, "%.17g", a, ==, b)
#define ASSERT_EQ_PTR(a, b) KVO__ASSERT_OP(const void *, "%p", a, ==, b)
#define ASSERT_NULL(a) ASSERT_EQ_PTR(a, NULL)
#define ASSERT_NOT_NULL(a) do { if ((a) == NULL) FAILF("%s is NULL", #a); } while (0)
#define ASSERT_EQ_STR(a, b) do { const char *a_ = (a), *b_ = (b); \
    if (!a_ || !b_ || strcmp(a_, b_)) FAILF("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } while (0)
#define ASSERT_CONTAINS(hay, needle) do { const char *h_ = (hay), *n_ = (needle); \
    if (!h_ || !strstr(h_, n_)) FAILF("%s does not contain \"%s\": \"%s\"", #hay, n_, h_ ? h_ : "(null)"); } while (0)
#define ASSERT_MEM_EQ(a, b, n) do { const unsigned char *a_ = (const void *)(a), *b_ = (const void *)(b); size_t n_ = (n); \
    for (size_t i_ = 0; i_ < n_; i_++) if (a_[i_] != b_[i_]) \
        FAILF("%s and %s differ at byte %zu of %zu: 0x%02x vs 0x%02x", #a, #b, i_, n_, a_[i_], b_[i_]); } while (0)
/* A kvo_ call that must succeed: prints kvo_last_error() otherwise. */
#define ASSERT_OK(expr) do { int rc_ = (expr); if (rc_ != 0) \
    FAILF("%s returned %d (%s): %s", #expr, rc_, kvo_error_name(rc_), kvo_last_error()); } while (0)
/* A kvo_ call that must fail with code err. */
#define ASSERT_ERR(expr, err) do { int rc_ = (expr); if (rc_ != (err)) \
    FAILF("%s returned %d (%s), expected %s: %s", #expr, rc_, kvo_error_name(rc_), kvo_error_name(err), kvo_last_error()); } while (0)

#endif
