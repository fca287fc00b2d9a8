/*
 * The raw Redis Cluster limit of the benchmarks (bench_remote.c,
 * bench_cascade.c): hiredis alone, pipelined, with the cluster's slot map,
 * no cache work (no staging, header, checksum or verification).
 */
#ifndef KVO_BENCH_REDIS_H
#define KVO_BENCH_REDIS_H

#if KVO_HAVE_REDIS
#include <stdbool.h>
#include <stdint.h>

#include "tiers/remote/remote_internal.h" /* the tier's URL parser: one rule for both */

typedef struct kvo_bench_redis {
    kvo__rc_url url;          /* seed 0 is asked for the slot map; user, pass */
    int n;                    /* masters */
    char host[16][64];
    int port[16];
    uint8_t slot_node[16384]; /* slot -> master */
} kvo_bench_redis;

/* Parse url as the tier does (then KVO_REDIS_USER / KVO_REDIS_PASSWORD as
 * the tier takes them) and read the slot map from the first seed.  0,
 * KVO_EINVAL (a malformed URL) or -1 (no seed answered, no slot map), with
 * why (never the password) written to why. */
int kvo_bench_redis_open(const char *url, kvo_bench_redis *m, char *why, size_t cap);

/* The name of key i of a raw pass (written to out, cap bytes). */
typedef void (*kvo_bench_redis_name_fn)(uint64_t i, char *out, size_t cap, const void *ctx);

/* One raw pass over keys 0..n_keys-1: `threads` threads (at most 64), each
 * with a connection per master (connected inside the pass), appending
 * batches of `batch` commands (GET, or SET of the size bytes at val) and
 * reading their replies.  Seconds; the value bytes moved in *bytes; -1 on
 * a failure (a connection, a missing value). */
double kvo_bench_redis_pass(const kvo_bench_redis *m, uint32_t threads, uint32_t batch, uint64_t n_keys,
                            kvo_bench_redis_name_fn name, const void *ctx, const unsigned char *val, uint64_t size,
                            uint64_t *bytes);
#endif

#endif
