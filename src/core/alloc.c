/*
 * Allocation through replaceable hooks.  The hooks are a plain global set once
 * before use (documented as not thread-safe against concurrent calls).
 */
#include <stdlib.h>

#include "core/internal.h"

static void *kvo__libc_malloc(size_t n, void *ctx) { (void)ctx; return malloc(n); }
static void *kvo__libc_calloc(size_t n, size_t s, void *ctx) { (void)ctx; return calloc(n, s); }
static void *kvo__libc_realloc(void *p, size_t n, void *ctx) { (void)ctx; return realloc(p, n); }
static void kvo__libc_free(void *p, void *ctx) { (void)ctx; free(p); }

static kvo_allocator kvo__alloc = KVO_ALLOCATOR_INIT(kvo__libc_malloc, kvo__libc_calloc,
                                                     kvo__libc_realloc, kvo__libc_free, NULL);

int kvo_set_allocator(const kvo_allocator *a) {
    if (!a) {
        kvo__alloc = (kvo_allocator)KVO_ALLOCATOR_INIT(kvo__libc_malloc, kvo__libc_calloc,
                                                       kvo__libc_realloc, kvo__libc_free, NULL);
        return 0;
    }
    int rc = KVO__CHECK_STRUCT_SIZE("kvo_set_allocator", "kvo_allocator", a, kvo_allocator, ctx,
                                    "KVO_ALLOCATOR_INIT");
    if (rc) return rc;
    if (!a->malloc_fn || !a->calloc_fn || !a->realloc_fn || !a->free_fn)
        return kvo__error(KVO_EINVAL,
                          "kvo_set_allocator: malloc_fn, calloc_fn, realloc_fn and free_fn "
                          "must all be set (or pass NULL to restore the C library's)");
    kvo__alloc = *a;
    kvo__alloc.struct_size = sizeof kvo__alloc;
    return 0;
}

void *kvo__malloc(size_t n) { return kvo__alloc.malloc_fn(n ? n : 1, kvo__alloc.ctx); }
void *kvo__calloc(size_t n, size_t s) {
    return kvo__alloc.calloc_fn(n ? n : 1, s ? s : 1, kvo__alloc.ctx);
}
void *kvo__realloc(void *p, size_t n) { return kvo__alloc.realloc_fn(p, n ? n : 1, kvo__alloc.ctx); }
void kvo__free(void *p) {
    if (p) kvo__alloc.free_fn(p, kvo__alloc.ctx);
}
void kvo_free(void *p) { kvo__free(p); }

char *kvo__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = kvo__malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}
