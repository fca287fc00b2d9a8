/* The test runner: registration, main, failure reporting, small utilities. */
#include "kvo_test.h"

#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include <ftw.h>
#include <sys/wait.h>

#define KVO_TEST_MAX 512
static struct { const char *name; kvo_test_fn fn; } kvo__tests[KVO_TEST_MAX];
static int kvo__ntests;
static jmp_buf kvo__jmp;
static int kvo__in_test;
static int kvo__skipped;
static char kvo__tmp[256];
static uint64_t kvo__rng;
static uint64_t kvo__seed;

void kvo_test_register(const char *name, kvo_test_fn fn) {
    if (kvo__ntests < KVO_TEST_MAX) {
        kvo__tests[kvo__ntests].name = name;
        kvo__tests[kvo__ntests].fn = fn;
        kvo__ntests++;
    }
}

void kvo_test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s:%d: FAIL: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (seed %llu; rerun with KVO_TEST_SEED=%llu)\n", (unsigned long long)kvo__seed,
            (unsigned long long)kvo__seed);
    fflush(stderr);
    if (kvo__in_test) longjmp(kvo__jmp, 1);
    exit(1);
}

void kvo_test_skip(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "SKIP: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    kvo__skipped = 1;
    if (kvo__in_test) longjmp(kvo__jmp, 2);
    exit(77);
}

uint64_t kvo_test_seed(void) { return kvo__seed; }
uint64_t kvo_test_rand(void) {
    uint64_t z = (kvo__rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

char *kvo_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; if (len) *len = (size_t)n; }
    return buf;
}

const char *kvo_test_shared_path(const char *rel) {
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", KVO_SHARED_DIR, rel);
    if (access(buf, R_OK) != 0) kvo_test_skip("shared file %s not present", buf);
    return buf;
}

int kvo_test_run(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

const char *kvo_test_tmpdir(void) {
    if (!kvo__tmp[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(kvo__tmp, sizeof kvo__tmp, "%s/kvotest.XXXXXX", base ? base : "/tmp");
        if (!mkdtemp(kvo__tmp)) kvo_test_fail(__FILE__, __LINE__, "mkdtemp failed");
    }
    return kvo__tmp;
}

static int kvo__rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static int kvo__run_one(int i) {
    kvo__rng = kvo__seed;
    kvo__skipped = 0;
    kvo__in_test = 1;
    int r = setjmp(kvo__jmp);
    if (r == 0) kvo__tests[i].fn();
    kvo__in_test = 0;
    if (kvo__tmp[0] && r == 0) { nftw(kvo__tmp, kvo__rm, 16, FTW_DEPTH | FTW_PHYS); kvo__tmp[0] = 0; }
    if (r == 2) return 77;
    return r == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *s = getenv("KVO_TEST_SEED");
    kvo__seed = s ? strtoull(s, NULL, 0) : 0x6b766f66666c6f61ull;
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < kvo__ntests; i++) printf("%s\n", kvo__tests[i].name);
        return 0;
    }
    int failed = 0, passed = 0, skipped = 0, ran = 0;
    for (int i = 0; i < kvo__ntests; i++) {
        if (argc > 1 && strcmp(argv[1], kvo__tests[i].name) != 0) continue;
        ran++;
        int r = kvo__run_one(i);
        if (r == 0) passed++; else if (r == 77) skipped++; else failed++;
        fprintf(stderr, "%s %s\n", r == 0 ? "ok  " : r == 77 ? "skip" : "FAIL", kvo__tests[i].name);
    }
    if (argc > 1 && ran == 0) {
        fprintf(stderr, "no test named %s\n", argv[1]);
        return 2;
    }
    if (argc > 1) return failed ? 1 : skipped ? 77 : 0;
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
