/*
 * The error table and per-thread error messages.
 *
 * Every failing public call returns a negative KVO_E* code and leaves a
 * message in a thread-local buffer: the code says what kind of failure, the
 * message says which object, which numbers, and what would work.  A fixed
 * buffer (no allocation) so that reporting ENOMEM cannot itself fail.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

#define KVO__ERRBUF 1024
static _Thread_local char kvo__errbuf[KVO__ERRBUF];

const char *kvo_strerror(int err) {
    switch (err) {
#define KVO__CASE(name, value, text) case value: return text;
        KVO_ERROR_TABLE(KVO__CASE)
#undef KVO__CASE
    default: return "unknown error";
    }
}

const char *kvo_error_name(int err) {
    switch (err) {
#define KVO__CASE(name, value, text) case value: return #name;
        KVO_ERROR_TABLE(KVO__CASE)
#undef KVO__CASE
    default: return "KVO_E?";
    }
}

static const int kvo__codes[] = {
#define KVO__CODE(name, value, text) value,
    KVO_ERROR_TABLE(KVO__CODE)
#undef KVO__CODE
};

size_t kvo_error_count(void) { return sizeof kvo__codes / sizeof kvo__codes[0]; }
int kvo_error_code(size_t i) { return i < kvo_error_count() ? kvo__codes[i] : 0; }

int kvo__check_struct_size(const char *fn, const char *type, size_t given, size_t min, const char *init) {
    if (given >= min) return 0;
    return kvo__error(KVO_EINVAL,
                      "%s: %s.struct_size is %zu, must be at least %zu (start from %s, which sets it "
                      "to sizeof(%s))", fn, type, given, min, init, type);
}

const char *kvo_last_error(void) { return kvo__errbuf; }

int kvo__verror(int err, const char *fmt, va_list ap) {
    vsnprintf(kvo__errbuf, sizeof kvo__errbuf, fmt, ap);
    return err;
}

int kvo__error(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvo__verror(err, fmt, ap);
    va_end(ap);
    return err;
}

int kvo__error_prefix(int err, const char *fmt, ...) {
    char prefix[256], old[KVO__ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, kvo__errbuf, sizeof old);
    snprintf(kvo__errbuf, sizeof kvo__errbuf, "%s: %s", prefix, old);
    return err;
}

int kvo__strlcpy(char *dst, const char *src, size_t cap) {
    size_t n = strlen(src);
    if (n >= cap) {
        memcpy(dst, src, cap - 1);
        dst[cap - 1] = '\0';
        return KVO_ERANGE;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

uint64_t kvo__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kvo__deadline_ts(int timeout_ms, struct timespec *ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void kvo__efd_drain(int fd) {
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof v); /* EAGAIN when already empty */
    (void)r;
}

void kvo_u128_hex(kvo_u128 v, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)v.hi, (unsigned long long)v.lo);
}

const char *kvo_version(void) { return KVO_VERSION_STRING; }
int kvo_version_number(void) { return KVO_VERSION_NUMBER; }
