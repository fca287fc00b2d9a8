/*
 * Fast host copies for the transfer engine.
 *
 * Why streaming stores.  KV pages are 16 KiB to a few MiB and are copied once:
 * a store into a slot is not read back by this core soon, and a load into an
 * engine tensor is read by the engine much later (or by another core).
 * Ordinary stores first read each destination line into the cache (read for
 * ownership) and then evict something useful; streaming (non-temporal) stores
 * write whole lines straight to memory, skipping the read.  glibc's memcpy
 * only switches to them above a threshold tied to the cache size (240 MiB on
 * the reference machine), never at KV page sizes; measured here they copy
 * 1.5-1.7x faster (reference.md: 11-13 GB/s memcpy vs 18-19 GB/s streaming,
 * one thread).
 *
 * Layout of one copy: [head | body | tail].  The head (memcpy) brings the
 * destination to a 64-byte boundary; the body is whole 64-byte lines written
 * with streaming stores from unaligned loads (with AVX2, 16 KiB at a time as
 * four interleaved 4 KiB streams, see kvo__stream4_avx2) (the source alignment does not
 * matter for loads on any x86 CPU of the last decade); the tail (< 64 bytes,
 * memcpy) finishes.  So any address and any length, including page sizes that
 * are not multiples of 64, are copied exactly; nothing outside [dst, dst + n)
 * is written.  Pieces below KVO__COPY_NT_MIN use memcpy: for them the fixed
 * costs dominate and the destination may well be read soon.
 *
 * Streaming stores are weakly ordered: the caller issues kvo__copy_fence()
 * (sfence) once per work unit, before publishing completion to other threads
 * through the engine lock.
 *
 * Selection is at run time (__builtin_cpu_supports): AVX2 when present, else
 * SSE2 (always present on x86-64); other architectures use memcpy.  Whether
 * streaming at all beats memcpy is measured, not assumed: on an AMD EPYC
 * machine memcpy was 1.4-2.5x faster at every size, the reverse of the
 * figures above (copy_auto.c chooses per process).
 */
#include <string.h>

#include "transfer/copy.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVO__X86 1
#else
#define KVO__X86 0
#endif

kvo__copy_kind kvo__copy_best(void) {
#if KVO__X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return KVO__COPY_AVX2;
    if (__builtin_cpu_supports("sse2")) return KVO__COPY_SSE2;
#endif
    return KVO__COPY_MEMCPY;
}

const char *kvo__copy_kind_name(kvo__copy_kind k) {
    switch (k) {
    case KVO__COPY_AVX2: return "avx2-stream";
    case KVO__COPY_SSE2: return "sse2-stream";
    default: return "memcpy";
    }
}

#if KVO__X86
/* Body: n is a multiple of 64, dst is 64-byte aligned. */
__attribute__((target("avx2"))) static void kvo__stream_avx2(unsigned char *dst, const unsigned char *src,
                                                              size_t n) {
    size_t i = 0;
    /* 128 bytes a step, 64 for the tail: all loads of a step, then its
     * streaming stores (constant-bound loops, fully unrolled). */
    for (; i + 128 <= n; i += 128) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_si256((const __m256i *)(src + i + 32 * k));
        for (int k = 0; k < 4; k++) _mm256_stream_si256((__m256i *)(dst + i + 32 * k), v[k]);
    }
    for (; i < n; i += 64) {
        __m256i v[2];
        for (int k = 0; k < 2; k++) v[k] = _mm256_loadu_si256((const __m256i *)(src + i + 32 * k));
        for (int k = 0; k < 2; k++) _mm256_stream_si256((__m256i *)(dst + i + 32 * k), v[k]);
    }
}

/* Body of >= 16 KiB: each 16 KiB block is copied as four 4 KiB streams
 * advanced together, one 64-byte line of each in turn.  Four concurrent read
 * streams keep more DRAM pages open and more misses in flight than one;
 * measured here 11-12.5 GB/s against 9-10 for the single-stream loop (glibc
 * uses the same trick in its large-copy path, which it only enters far above
 * KV page sizes).  No software prefetch: the hardware prefetcher follows four
 * sequential streams, and a prefetch instruction per line cost 5-7 % of the
 * copy's CPU time at pages of 64 KiB and more for no gain in bandwidth
 * (docs/benchmarks.md). */
#define KVO__Q 4096u
__attribute__((target("avx2"))) static void kvo__stream4_avx2(unsigned char *dst, const unsigned char *src,
                                                               size_t n) {
    size_t i = 0;
    for (; i + 4 * KVO__Q <= n; i += 4 * KVO__Q) {
        const unsigned char *s = src + i;
        unsigned char *d = dst + i;
        for (size_t o = 0; o < KVO__Q; o += 64) {
            for (size_t p = 0; p < 4; p++) {
                const unsigned char *ss = s + p * KVO__Q + o;
                unsigned char *dd = d + p * KVO__Q + o;
                __m256i a = _mm256_loadu_si256((const __m256i *)ss);
                __m256i b = _mm256_loadu_si256((const __m256i *)(ss + 32));
                _mm256_stream_si256((__m256i *)dd, a);
                _mm256_stream_si256((__m256i *)(dd + 32), b);
            }
        }
    }
    if (i < n) kvo__stream_avx2(dst + i, src + i, n - i);
}

__attribute__((target("sse2"))) static void kvo__stream_sse2(unsigned char *dst, const unsigned char *src,
                                                              size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m128i v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm_loadu_si128((const __m128i *)(src + i + 16 * k));
        for (int k = 0; k < 4; k++) _mm_stream_si128((__m128i *)(dst + i + 16 * k), v[k]);
    }
}
#endif

void kvo__copy(kvo__copy_kind k, void *dst, const void *src, size_t n) {
#if KVO__X86
    if (k != KVO__COPY_MEMCPY && n >= KVO__COPY_NT_MIN) {
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t head = (size_t)(-(uintptr_t)d & 63u);
        size_t body = (n - head) & ~(size_t)63;
        size_t tail = n - head - body;
        if (head) memcpy(d, s, head);
        if (k == KVO__COPY_AVX2) kvo__stream4_avx2(d + head, s + head, body);
        else kvo__stream_sse2(d + head, s + head, body);
        if (tail) memcpy(d + head + body, s + head + body, tail);
        return;
    }
#else
    (void)k;
#endif
    memcpy(dst, src, n);
}

void kvo__copy_fence(void) {
#if KVO__X86
    _mm_sfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}
