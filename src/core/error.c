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

void kvo_u128_hex(kvo_u128 v, char out[33]) {
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)v.hi, (unsigned long long)v.lo);
}

const char *kvo_version(void) { return KVO_VERSION_STRING; }
int kvo_version_number(void) {
    return KVO_VERSION_MAJOR * 10000 + KVO_VERSION_MINOR * 100 + KVO_VERSION_PATCH;
}
