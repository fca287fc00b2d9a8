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
 *  - The library never aborts or exits on bad input.  Debug builds (no NDEBUG)
 *    assert internal invariants, never caller input.
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

#define KVO_VERSION_MAJOR 0
#define KVO_VERSION_MINOR 1
#define KVO_VERSION_PATCH 0
#define KVO_VERSION_STRING "0.1.0"

/** The library's version string, e.g. "0.1.0".  Static storage; any thread. */
KVO_API const char *kvo_version(void);
/** The version as one integer: major*10000 + minor*100 + patch. */
KVO_API int kvo_version_number(void);

/*
 * The one error table.  Values are stable; new codes are appended.
 */
#define KVO_ERROR_TABLE(X)                                                      \
    X(KVO_OK,        0,   "success")                                            \
    X(KVO_EINVAL,   -1,   "invalid argument")                                   \
    X(KVO_ENOMEM,   -2,   "out of memory")                                      \
    X(KVO_ERANGE,   -3,   "value out of range or arithmetic overflow")          \
    X(KVO_EPARSE,   -4,   "malformed input")                                    \
    X(KVO_ENOTFOUND,-5,   "not found")                                          \
    X(KVO_EEXIST,   -6,   "already exists")                                     \
    X(KVO_ENOSPC,   -7,   "no space: cannot make room")                         \
    X(KVO_EBUSY,    -8,   "busy: pinned or in flight")                          \
    X(KVO_ESTATE,   -9,   "call not valid in the current state")                \
    X(KVO_EIO,      -10,  "input/output error")                                 \
    X(KVO_ECORRUPT, -11,  "stored data failed verification")                    \
    X(KVO_ECANCELED,-12,  "operation canceled")                                 \
    X(KVO_ENOTSUP,  -13,  "not supported by this build or platform")            \
    X(KVO_EAGAIN,   -14,  "not ready yet: try again later")                     \
    X(KVO_ECLOSED,  -15,  "object shut down or destroyed")                      \
    X(KVO_ELAYOUT,  -16,  "layout does not match the model geometry")           \
    X(KVO_ETIMEDOUT,-17,  "timed out")

enum kvo_error {
#define KVO__ENUM(name, value, text) name = value,
    KVO_ERROR_TABLE(KVO__ENUM)
#undef KVO__ENUM
    KVO_ERROR_MIN = -17
};

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
    void *(*malloc_fn)(size_t size, void *ctx);
    void *(*calloc_fn)(size_t n, size_t size, void *ctx);
    void *(*realloc_fn)(void *ptr, size_t size, void *ctx);
    void (*free_fn)(void *ptr, void *ctx);
    void *ctx;
} kvo_allocator;
/** Install allocator hooks.  All four functions must be set, or pass NULL to
 *  restore the C library's.  Returns KVO_EINVAL if some but not all are set. */
KVO_API int kvo_set_allocator(const kvo_allocator *a);

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
