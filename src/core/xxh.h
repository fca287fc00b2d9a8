/*
 * xxHash as the library uses it: include this, not <xxhash.h>.
 *
 * XXH3_state_t on the stack (XXH_STATIC_LINKING_ONLY), and on x86 with a
 * libxxhash that has it (CMake's KVO_HAVE_XXH_DISPATCH check), the
 * library's own run-time dispatch (xxh_x86dispatch.h): XXH3_64bits,
 * XXH3_64bits_update, XXH3_128bits and their seeded forms then run the
 * widest vector code the CPU has (AVX-512, AVX2, else SSE2) instead of the
 * SSE2 code a generic x86-64 build compiles.  The values are the same (XXH3
 * is defined independently of the vector width); on long inputs the
 * payload checksums are 2.5-3x faster (20 -> 51 GB/s with AVX2, 63 with
 * AVX-512 on the development VM, 256 KiB), which every file and remote
 * write and read, and the connector's verify_checksums, pay per chunk.
 * Short one-shot hashes (keys.c's chained units and namespace.c's chunk
 * keys, inlined with XXH_INLINE_ALL) keep their inline form: the dispatched
 * call would cost more than it saves below a few hundred bytes.
 */
#ifndef KVO_CORE_XXH_H
#define KVO_CORE_XXH_H

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#if defined(KVO_HAVE_XXH_DISPATCH) && KVO_HAVE_XXH_DISPATCH && (defined(__x86_64__) || defined(__i386__))
#include <xxh_x86dispatch.h>
#endif

#endif
