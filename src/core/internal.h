/*
 * Internal helpers shared by every layer: error reporting, allocation through
 * the user's hooks, checked arithmetic.  Symbols are kvo__ prefixed.
 */
#ifndef KVO_CORE_INTERNAL_H
#define KVO_CORE_INTERNAL_H

#include <assert.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvoffload/kvo.h"

#if defined(__GNUC__)
#define KVO__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KVO__LIKELY(x) __builtin_expect(!!(x), 1)
#define KVO__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define KVO__PRINTF(a, b)
#define KVO__LIKELY(x) (x)
#define KVO__UNLIKELY(x) (x)
#endif

/* Record a detailed message for kvo_last_error() and return err. */
int kvo__error(int err, const char *fmt, ...) KVO__PRINTF(2, 3);
int kvo__verror(int err, const char *fmt, va_list ap);
/* Prepend context to the current thread's last error message; returns err. */
int kvo__error_prefix(int err, const char *fmt, ...) KVO__PRINTF(2, 3);

void *kvo__malloc(size_t n);
void *kvo__calloc(size_t n, size_t size);
void *kvo__realloc(void *p, size_t n);
void kvo__free(void *p);
char *kvo__strdup(const char *s);

/* Checked arithmetic: 0 on success, KVO_ERANGE on overflow (no message set). */
static inline int kvo__mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out) ? KVO_ERANGE : 0;
}
static inline int kvo__add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out) ? KVO_ERANGE : 0;
}
static inline uint64_t kvo__gcd_u64(uint64_t a, uint64_t b) {
    while (b) { uint64_t t = a % b; a = b; b = t; }
    return a;
}
/* lcm, 0 on overflow. */
static inline uint64_t kvo__lcm_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    if (a == 0 || b == 0) return 0;
    if (__builtin_mul_overflow(a / kvo__gcd_u64(a, b), b, &r)) return 0;
    return r;
}
/* Round up to a power-of-two alignment; 0 on overflow. */
static inline uint64_t kvo__align_up_u64(uint64_t v, uint64_t align) {
    uint64_t r;
    if (__builtin_add_overflow(v, align - 1, &r)) return 0;
    return r & ~(align - 1);
}
static inline uint64_t kvo__div_ceil_u64(uint64_t a, uint64_t b) {
    return a / b + (a % b != 0);
}

/* Grow the heap array *p (elements of elem bytes, capacity *cap) to hold at
 * least need elements, doubling from `initial` (16 when 0).  0, or KVO_ENOMEM
 * with a message naming `what`; on failure *p and *cap are unchanged. */
int kvo__grow(void **p, size_t *cap, size_t need, size_t elem, size_t initial, const char *what);

/* Several arrays sharing one capacity, grown together.  On failure *cap is
 * unchanged; arrays already reallocated are merely larger. */
typedef struct kvo__arr {
    void **p;
    size_t elem;
} kvo__arr;
int kvo__grow_all(size_t *cap, size_t need, const kvo__arr *a, size_t n, size_t initial, const char *what);

/* The struct_size convention (kvo_common.h): a caller's struct must hold at
 * least the first release's fields, up to and including `last_v1`.  0, or
 * KVO_EINVAL naming the function, the struct, the size given and the
 * initialiser that sets it.  Fields past struct_size are read as defaults by
 * the caller of this check (KVO__HAS_FIELD). */
int kvo__check_struct_size(const char *fn, const char *type, size_t given, size_t min, const char *init);
#define KVO__CHECK_STRUCT_SIZE(fn, type, ptr, T, last_v1, init)                          \
    kvo__check_struct_size(fn, type, (ptr)->struct_size,                                  \
                           offsetof(T, last_v1) + sizeof(((T *)0)->last_v1), init)
/* A caller's struct in: when p is not NULL, check its struct_size (an
 * error names `init`, what sets it), copy its first struct_size bytes over
 * the value `whole` in `local` and point p at local (the library then sees a
 * whole struct of this version). */
#define KVO__STRUCT_IN(p, T, local, whole, last_v1, fn, init)                              \
    do {                                                                                 \
        if (p) {                                                                         \
            int rc_ = KVO__CHECK_STRUCT_SIZE(fn, #T, p, T, last_v1, init);               \
            if (rc_) return rc_;                                                         \
            local = whole;                                                               \
            memcpy(&local, p, (p)->struct_size < sizeof local ? (p)->struct_size : sizeof local); \
            local.struct_size = sizeof local;                                            \
            p = &local;                                                                  \
        }                                                                                \
    } while (0)
/* Create functions: the defaults under the caller's params. */
#define KVO__PARAMS_IN(p, T, local, defaults, last_v1, fn) \
    KVO__STRUCT_IN(p, T, local, defaults(), last_v1, fn, #defaults "()")
/* get_stats: copy a whole statistics struct into the caller's, whose
 * struct_size (checked, at least the first field past it) says how many
 * bytes it has; its struct_size stays. */
static inline void kvo__copy_out(void *dst, const void *src, size_t full) {
    size_t given = *(const size_t *)dst, n = given < full ? given : full;
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), n - sizeof(size_t));
}
/* The body of a public get_stats: check out's struct_size (KVO_EINVAL
 * naming `init`), run `fill` (an int call filling the local `full`), copy
 * full into out up to out's struct_size. */
#define KVO__STATS_OUT(fn, T, last_v1, init, out, full, fill)                 \
    do {                                                                    \
        if (!(out)) return kvo__error(KVO_EINVAL, fn ": NULL statistics struct"); \
        int rc_ = KVO__CHECK_STRUCT_SIZE(fn, #T, out, T, last_v1, init);    \
        if (!rc_) rc_ = (fill);                                             \
        if (!rc_) kvo__copy_out(out, &(full), sizeof(full));                \
        return rc_;                                                         \
    } while (0)
/* True when the caller's struct (struct_size bytes) includes `field`. */
#define KVO__HAS_FIELD(ptr, T, field) \
    ((ptr)->struct_size >= offsetof(T, field) + sizeof(((T *)0)->field))

/* Copy a string into a fixed buffer, always NUL-terminated; returns 0 or
 * KVO_ERANGE if it did not fit (truncated copy made). */
int kvo__strlcpy(char *dst, const char *src, size_t cap);

/* Logging (src/core/log.c).  kvo__log formats and hands a line to the sink
 * set with kvo_set_log (default stderr) when level passes its threshold.
 * kvo__log_limited logs one line per interval_s for one kind of event, whose
 * kvo__log_limit (zero-initialised, owned by the caller, any thread) counts
 * the lines it suppressed; the next line logged says how many. */
#define KVO__LOG_MAX 1024
typedef struct kvo__log_limit {
    uint64_t last_ns;
    uint64_t suppressed;
} kvo__log_limit;
bool kvo__log_enabled(kvo_log_level level);
void kvo__log(kvo_log_level level, const char *fmt, ...) KVO__PRINTF(2, 3);
void kvo__vlog(kvo_log_level level, const char *fmt, va_list ap);
void kvo__log_limited(kvo__log_limit *lim, uint32_t interval_s, kvo_log_level level, const char *fmt, ...)
    KVO__PRINTF(4, 5);

/* Read the file at path whole: *out (library allocator, kvo__free; not
 * NUL-terminated; NULL when empty) and *out_len.  Errors: KVO_EIO (cannot open
 * with the errno text, a directory, a read error), KVO_ERANGE (over max_bytes),
 * KVO_ENOMEM; messages name the path and `what` the file should be. */
int kvo__read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *out_len);

/* Monotonic clock in nanoseconds. */
uint64_t kvo__now_ns(void);

/* The CLOCK_REALTIME deadline timeout_ms from now, for pthread_cond_timedwait
 * (timeout_ms >= 0). */
struct timespec;
void kvo__deadline_ts(int timeout_ms, struct timespec *ts);

/* Empty an eventfd (non-blocking; nothing to do when it is already empty). */
void kvo__efd_drain(int fd);

/* A public timeout (int64_t ns; < 0 forever, 0 no wait) as the milliseconds
 * a condition-variable wait uses: -1 forever, else rounded up, capped. */
static inline int kvo__timeout_ms(int64_t ns) {
    if (ns < 0) return -1;
    int64_t ms = ns / 1000000 + (ns % 1000000 != 0);
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

#endif
