/*
 * Shared by the `bench store` files: key generation, the benchmark plan, the
 * bare LRU index that gives the index figures their same-work limits
 * (bench_store_bare.c), and the trace replays (bench_store_trace.c).
 */
#ifndef KVO_BENCH_STORE_H
#define KVO_BENCH_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "bench.h"
#include "kvoffload/kvo.h"

/* splitmix64's finalizer. */
static inline uint64_t kvo__bs_mix(uint64_t x) {
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* Key number i of the index benchmark (group 0). */
static inline kvo_chunk_key kvo__bs_key(uint64_t i) {
    kvo_chunk_key k;
    k.hash.lo = kvo__bs_mix(i);
    k.hash.hi = kvo__bs_mix(i ^ UINT64_C(0x5555));
    k.group = 0;
    k.tenant = 0;
    return k;
}

/* One group, one layer, 4 KiB pages, one block per chunk: a store of this
 * plan has one slot size, so its LRU is exact. */
kvo_plan *kvo__bs_plan(void);

/* ------------------------------------------------------- bare index -- */
/* The same work as the store's index operations (the same table and entry
 * sizes, the same probes, the same two-stage prefetch, the same LRU list and
 * eviction by backward-shift deletion) with nothing else: no lock, no
 * argument checks, no statistics, no slot allocator (a new key takes its
 * victim's slot), no policy indirection.  See bench_store_bare.c. */
typedef struct kvo__bs_bare kvo__bs_bare;

kvo__bs_bare *kvo__bs_bare_create(uint64_t nkeys);
void kvo__bs_bare_destroy(kvo__bs_bare *b);
/* states[i] = KVO_READY or KVO_MISS. */
void kvo__bs_bare_lookup(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n, uint8_t *states);
void kvo__bs_bare_touch(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n);
/* prepare_store + complete_store of a batch of distinct keys: absent keys
 * evict the LRU tail when full and become READY; present ones count as
 * used.  Returns the number stored. */
size_t kvo__bs_bare_store(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n);

/* ------------------------------------------------------------ trace -- */
/* Policy hit rates on the Mooncake trace against Belady's MIN, and vLLM's
 * CPU-manager cycle on it against the Python peer.  path NULL: search the
 * usual places.  peer: run shared/tools/peer_vllm_manager.py when python3
 * is there. */
int kvo__bs_trace_bench(const kvo_bench_out *o, const char *path, bool peer);

#endif
