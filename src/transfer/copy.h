/* Fast host copies: streaming (non-temporal) stores for large pieces. */
#ifndef KVO_TRANSFER_COPY_H
#define KVO_TRANSFER_COPY_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvo__copy_kind {
    KVO__COPY_MEMCPY = 0,  /* plain memcpy */
    KVO__COPY_SSE2 = 1,    /* 16-byte streaming stores */
    KVO__COPY_AVX2 = 2     /* 32-byte loads and streaming stores */
} kvo__copy_kind;

/* Pieces below this many bytes always use memcpy: streaming stores bypass
 * the cache, which only pays when the destination is not read back soon and
 * the piece is large enough to amortise the head/tail handling and the
 * fence. */
#define KVO__COPY_NT_MIN 4096u

/* The best kind this CPU supports (runtime detection). */
kvo__copy_kind kvo__copy_best(void);
const char *kvo__copy_kind_name(kvo__copy_kind k);
/* Copy n bytes; any alignment, any n.  Streaming kinds use streaming stores
 * for the 64-byte-aligned body of the destination when n >= KVO__COPY_NT_MIN
 * and memcpy for the head, the tail and small pieces.  After streaming
 * stores, call kvo__copy_fence() before another thread may read dst. */
void kvo__copy(kvo__copy_kind k, void *dst, const void *src, size_t n);
void kvo__copy_fence(void);

#endif
