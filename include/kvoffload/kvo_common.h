/*
 * kvoffload: common definitions shared by every layer.
 *
 * Conventions used by every public function of the library
 * --------------------------------------------------------
 *  - Functions that can fail return int: 0 on success, a negative KVO_E* code
 *    on failure.  kvo_strerror() turns a code into a short constant string;
 *    kvo_last_error() returns a longer message for the most recent failure on
 *    the calling thread that names the object and the numbers involved and,
 *    where one exists, a value that would work.
 *  - On failure, output parameters are left untouched unless the function's
 *    comment says otherwise, and no state visible to the caller has changed.
 *  - Objects are opaque handles created by kvo_X_create() and released by
 *    kvo_X_destroy().  destroy(NULL) is a no-op.
 *  - Parameter structs are initialised with kvo_X_default_params(); new fields
 *    are always added with a default that keeps old behaviour.
 *  - Error codes are their own range, -1000 and below (KVO_EINVAL is -1001):
 *    they never collide with a negated errno value, and no raw -errno value is
 *    ever returned (the errno text goes into the kvo_last_error() message).
 *  - The library never aborts or exits on bad input.  Debug builds (no NDEBUG)
 *    assert internal invariants, never caller input.
 *  - Timeouts are int64_t nanoseconds everywhere (transfer, file and remote
 *    tiers, connector): negative waits forever (KVO_TIMEOUT_FOREVER), 0 does
 *    not wait; KVO_MS(n) converts milliseconds.
 *  - Polls have one shape: int X_poll(h, out, cap, size_t *n) moves up to
 *    cap items to out, sets *n to the count and returns 0 or KVO_EINVAL;
 *    they never block.
 *  - Logging: rare operational events only, through kvo_set_log() (below).
 *  - docs/api.md describes these rules, versions and exported symbols.
 *
 * Growing structs without breaking callers (the struct_size convention)
 * ---------------------------------------------------------------------
 *  A struct the caller fills and hands to the library (parameters, hooks) or
 *  that the library fills for the caller (statistics) starts with
 *      size_t struct_size;
 *  set to sizeof(the struct) as the caller's header declared it --
 *  kvo_X_default_params() and the KVO_X_INIT initialisers do this for you,
 *  so code that starts from the defaults never writes it by hand (for a
 *  struct the library fills, e.g. statistics, the caller initialises it with
 *  its KVO_X_INIT before the call, e.g. kvo_store_stats st =
 *  KVO_STORE_STATS_INIT; -- every params and statistics struct follows
 *  this, docs/api.md lists them).  New fields
 *  are only ever appended.  The library reads (or writes) only the first
 *  struct_size bytes: a program compiled against an older, shorter struct
 *  keeps working with a newer library, which uses the defaults for the fields
 *  the program does not know about.  struct_size 0 or smaller than the
 *  first release's layout is KVO_EINVAL (it catches a struct that was
 *  memset or brace-initialised instead of taken from the defaults).
 *  Opaque handles need no such field: they grow freely.
 */
#ifndef KVOFFLOAD_KVO_COMMON_H
#define KVOFFLOAD_KVO_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* KVO_API marks every public declaration: exported from the shared library,
 * which hides everything else (-fvisibility=hidden).  KVO_STATIC (defined by
 * the static target and its consumers through CMake/pkg-config) makes it a
 * plain declaration. */
#ifndef KVO_API
#if defined(__GNUC__) && !defined(KVO_STATIC)
#define KVO_API __attribute__((visibility("default")))
#else
#define KVO_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The version numbers, generated from CMake's project(VERSION):
 * KVO_VERSION_MAJOR, _MINOR, _PATCH, _STRING and _NUMBER. */
#include "kvoffload/kvo_version.h"

/** The library's version string, e.g. "0.2.0": the library's, which may be
 *  newer than the KVO_VERSION_STRING a program was compiled with.  Static
 *  storage; any thread. */
KVO_API const char *kvo_version(void);
/** The version as one integer: major*10000 + minor*100 + patch. */
KVO_API int kvo_version_number(void);

/*
 * The one error table.  Values are stable; new codes are appended (the next
 * is -1018).  KVO_E* codes are -1000 - n: far from every negated errno value
 * (Linux's end at -133), so a code can never be mistaken for one.
 */
#define KVO_ERROR_BASE (-1000)
#define KVO_ERROR_TABLE(X)                                                      \
    X(KVO_OK,        0,     "success")                                          \
    X(KVO_EINVAL,   -1001,  "invalid argument")                                 \
    X(KVO_ENOMEM,   -1002,  "out of memory")                                    \
    X(KVO_ERANGE,   -1003,  "value out of range or arithmetic overflow")        \
    X(KVO_EPARSE,   -1004,  "malformed input")                                  \
    X(KVO_ENOTFOUND,-1005,  "not found")                                        \
    X(KVO_EEXIST,   -1006,  "already exists")                                   \
    X(KVO_ENOSPC,   -1007,  "no space: cannot make room")                       \
    X(KVO_EBUSY,    -1008,  "busy: pinned or in flight")                        \
    X(KVO_ESTATE,   -1009,  "call not valid in the current state")              \
    X(KVO_EIO,      -1010,  "input/output error")                               \
    X(KVO_ECORRUPT, -1011,  "stored data failed verification")                  \
    X(KVO_ECANCELED,-1012,  "operation canceled")                               \
    X(KVO_ENOTSUP,  -1013,  "not supported by this build or platform")          \
    X(KVO_EAGAIN,   -1014,  "not ready yet: try again later")                   \
    X(KVO_ECLOSED,  -1015,  "object shut down or destroyed")                    \
    X(KVO_ELAYOUT,  -1016,  "layout does not match the model geometry")         \
    X(KVO_ETIMEDOUT,-1017,  "timed out")

enum kvo_error {
#define KVO__ENUM(name, value, text) name = value,
    KVO_ERROR_TABLE(KVO__ENUM)
#undef KVO__ENUM
};

/** Number of entries of the error table (KVO_OK included). */
KVO_API size_t kvo_error_count(void);
/** Code of table entry i (< kvo_error_count()), in table order; 0 past the
 *  end.  With kvo_error_name() and kvo_strerror() it lets bindings list the
 *  codes without copying the table. */
KVO_API int kvo_error_code(size_t i);

/** Short description of an error code.  Static storage; never NULL; any thread.
 *  Unknown codes give "unknown error". */
KVO_API const char *kvo_strerror(int err);
/** Symbolic name of an error code ("KVO_EINVAL"); "KVO_E?" when unknown. */
KVO_API const char *kvo_error_name(int err);

/** Detailed message for the most recent failure of a kvo_ call on the calling
 *  thread ("" if none).  Thread-local storage, valid until the next kvo_ call on
 *  this thread that fails.  Never NULL. */
KVO_API const char *kvo_last_error(void);

/*
 * Replaceable allocator.  Every allocation the library makes goes through these
 * hooks (except memory obtained with mmap for arenas and the JSON parser's own
 * small allocations).  Set them once, before creating any object; objects must be
 * destroyed with the allocator they were created with.  NULL restores malloc.
 * Not thread-safe against concurrent kvo_ calls.
 */
typedef struct kvo_allocator {
    size_t struct_size;         /* sizeof(kvo_allocator): KVO_ALLOCATOR_INIT sets it */
    void *(*malloc_fn)(size_t size, void *ctx);
    void *(*calloc_fn)(size_t n, size_t size, void *ctx);
    void *(*realloc_fn)(void *ptr, size_t size, void *ctx);
    void (*free_fn)(void *ptr, void *ctx);
    void *ctx;
} kvo_allocator;
/** Initialiser: kvo_allocator a = KVO_ALLOCATOR_INIT(my_malloc, my_calloc,
 *  my_realloc, my_free, ctx); */
#define KVO_ALLOCATOR_INIT(malloc_fn, calloc_fn, realloc_fn, free_fn, ctx) \
    {sizeof(kvo_allocator), (malloc_fn), (calloc_fn), (realloc_fn), (free_fn), (ctx)}
/** Install allocator hooks (copied).  All four functions must be set, or pass
 *  NULL to restore the C library's.  Returns KVO_EINVAL if some but not all
 *  are set, or struct_size is too small (see "the struct_size convention"). */
KVO_API int kvo_set_allocator(const kvo_allocator *a);

/*
 * Logging.  The library logs rare operational events (a quota clamped at
 * create, a disk that became full, a corrupt file dropped) -- never per
 * operation.  By default lines at KVO_LOG_WARN and above go to stderr as
 * "kvoffload: <level>: <message>\n", and a repeating kind of event is
 * rate-limited by the code that logs it (at most one line per interval, with
 * the number suppressed).
 */
typedef enum kvo_log_level {
    KVO_LOG_DEBUG = 0,
    KVO_LOG_INFO = 1,
    KVO_LOG_WARN = 2,
    KVO_LOG_ERROR = 3,
    KVO_LOG_OFF = 4     /* as a threshold: log nothing */
} kvo_log_level;

/** A log sink: one message (no trailing newline, NUL-terminated, valid only
 *  during the call).  Called from whatever library thread logs (worker
 *  threads included), possibly from several at once; it must not call back
 *  into the library.  No library lock is held while it runs. */
typedef void (*kvo_log_fn)(kvo_log_level level, const char *msg, void *ctx);

/** Route the library's log lines at `level` and above to fn(level, msg, ctx);
 *  fn NULL restores the default (stderr).  level KVO_LOG_OFF silences the
 *  library.  Process-wide; safe to call at any time from any thread (a line
 *  being logged concurrently goes to the old or the new sink).  Errors:
 *  KVO_EINVAL for a level outside KVO_LOG_DEBUG..KVO_LOG_OFF. */
KVO_API int kvo_set_log(kvo_log_fn fn, void *ctx, kvo_log_level level);

/** "debug", "info", "warn", "error", "off"; "?" for other values. */
KVO_API const char *kvo_log_level_name(kvo_log_level level);

/** Timeouts (one unit everywhere): int64_t nanoseconds; a negative value
 *  waits forever, 0 does not wait.  KVO_MS(250) = 250 milliseconds. */
#define KVO_TIMEOUT_FOREVER INT64_C(-1)
#define KVO_MS(ms) ((int64_t)(ms) * INT64_C(1000000))

/** A 128-bit value (hash, fingerprint).  lo/hi as XXH3-128's low64/high64. */
typedef struct kvo_u128 {
    uint64_t lo;
    uint64_t hi;
} kvo_u128;

/** Format a 128-bit value as 32 lowercase hex digits (hi then lo) + NUL.
 *  out must hold at least 33 bytes. */
KVO_API void kvo_u128_hex(kvo_u128 v, char out[33]);

#ifdef __cplusplus
}
#endif
#endif
