/*
 * kvoffload remote tier: a chunk cache shared by a fleet of engines, kept in
 * a Redis Cluster (or Valkey) that operators already run.
 *
 * What it is
 *  - One Redis key per chunk: "<key_prefix>:<fingerprint hex>[-<layout hash
 *    hex>]:<key hash hex>-g<group>".  key_prefix is the tenant / salt
 *    namespace; the fingerprint and layout hash keep incompatible layouts
 *    apart exactly like the file tier's namespace directories.
 *  - Each value is the file tier's 4096-byte chunk header (magic, format
 *    version, fingerprint, key, geometry, payload length, XXH3-64 of the
 *    payload, header checksum: docs/file-format.md) followed by the chunk's
 *    chunk_bytes.  Every read verifies all of it: a corrupt, truncated or
 *    foreign value is a miss, counted and deleted; its bytes are never
 *    delivered as valid.  With a fleet secret (params.secret) the value is
 *    sealed: the payload encrypted and, with the header and the key name,
 *    authenticated (XAES-256-GCM); one that fails is a miss counted in
 *    auth_failed.
 *  - Capacity and eviction are the server's (maxmemory + allkeys-lru, see
 *    docs/remote-tier.md); params.ttl_s optionally expires values.
 *  - The cluster client is the library's own (hiredis has no cluster
 *    support): CRC16 key slots, slot map from CLUSTER SLOTS, MOVED and ASK
 *    redirections, a small connection pool per node, pipelined batches,
 *    connect timeouts and I/O deadlines (per reply, per batch: a node that
 *    trickles its bytes cannot hold a worker), failed or slow nodes marked
 *    down with backoff.
 *
 * Asynchrony and completion (the shape of kvo_file_tier)
 *  - put, get and exists queue operations and return at once; worker threads
 *    run them in pipelined batches.  Each queued get and exists, and each
 *    queued put when params.write_completions is set, produces exactly one
 *    kvo_remote_completion, collected with kvo_remote_tier_poll;
 *    kvo_remote_tier_event_fd is readable while completions wait.  No user
 *    code is ever called by the tier.
 *  - Back-pressure: a put is dropped (result KVO_EAGAIN, counted) instead of
 *    blocking the caller when max_pending_writes puts are queued or staging
 *    memory is full; a get or exists is refused with KVO_EAGAIN when
 *    max_pending_reads are in flight.  While a node is down, operations
 *    routed to it fail at once (KVO_EIO) until its backoff expires.
 *
 * Thread rule: every function may be called from any thread, concurrently,
 * except kvo_remote_tier_destroy (no other call in progress on that tier).
 * The caller's thread never does network I/O except in create.
 *
 * Security: the password (from the URL, params or the environment variables
 * KVO_REDIS_USER / KVO_REDIS_PASSWORD) is never logged nor put in an error
 * message.  With a fleet secret (params.secret, env KVO_REMOTE_SECRET) every
 * value is sealed (XAES-256-GCM, OpenSSL): a client that can read or write
 * the cluster but lacks the secret can neither read a chunk nor make an
 * engine load one it forged (docs/security.md says what it does not cover).
 *
 * Built only with hiredis (CMake option KVO_WITH_REDIS); otherwise every
 * function returns KVO_ENOTSUP (create) or does nothing.
 */
#ifndef KVOFFLOAD_KVO_REMOTE_TIER_H
#define KVOFFLOAD_KVO_REMOTE_TIER_H

#include "kvo_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes of the header before each value's payload (the file tier's). */
#define KVO_REMOTE_HEADER_BYTES 4096u

typedef struct kvo_remote_tier_params {
    size_t struct_size;   /* sizeof(kvo_remote_tier_params): kvo_remote_tier_default_params() sets it */
    const char *url;               /* required: redis://[user:pass@]host:port
                                      [,host:port...] (seed nodes; copied).
                                      Only one user:pass, before the first
                                      host; it ends at the last '@' (a
                                      password may hold '@' and ':') and both
                                      are percent-decoded (%40 = '@').
                                      Prefer KVO_REDIS_PASSWORD: a URL ends
                                      up in configs and logs */
    const char *user;              /* ACL user; overrides the URL's; NULL:
                                      URL, then env KVO_REDIS_USER */
    const char *password;          /* overrides the URL's; NULL: URL, then
                                      env KVO_REDIS_PASSWORD */
    const kvo_plan *plan;          /* required; must outlive the tier */
    uint64_t layout_hash;          /* engine slot layout
                                      (kvo_transfer_layout_hash) or 0 */
    const char *key_prefix;        /* namespace (tenant / salt); default
                                      "kvo"; copied; no spaces, at most 64 */
    uint32_t ttl_s;                /* expire values after this; 0 = never
                                      (default: the server's LRU evicts) */
    uint32_t io_threads;           /* workers, each with its own pipeline;
                                      default 4 */
    uint32_t conns_per_node;       /* idle connections kept per node (at most
                                      64); default io_threads */
    uint32_t batch_max;            /* operations per pipelined batch;
                                      default 16 */
    uint64_t batch_max_bytes;      /* payload bytes per batch; default 32 MiB */
    uint32_t max_pending_writes;   /* queued + running puts; default 64 */
    uint32_t max_pending_reads;    /* queued + running gets and exists;
                                      default 1024 */
    uint64_t max_staging_bytes;    /* copies of queued puts: one region,
                                      pre-faulted at create; default 64 MiB,
                                      at least one chunk */
    uint32_t connect_timeout_ms;   /* default 500 */
    uint32_t io_timeout_ms;        /* a deadline per whole reply (however a
                                      node spaces its bytes), and (max_redirects
                                      + 1) x this per batch; at create each
                                      seed costs at most connect_timeout_ms +
                                      2 x this (AUTH, CLUSTER SLOTS); a node
                                      past a deadline is marked down;
                                      default 2000 */
    uint32_t down_backoff_ms;      /* first backoff of a failed node, doubled
                                      per failure up to 16x; default 500 */
    uint32_t max_redirects;        /* MOVED/ASK hops per operation; default 5 */
    bool write_completions;        /* a completion per queued put; default
                                      false (use flush/stats) */
    const char *secret;            /* the fleet secret: NULL = env
                                      KVO_REMOTE_SECRET (unset: none); "" =
                                      none.  At least 16 bytes (any bytes up
                                      to a NUL), the same on every engine of
                                      the fleet; not kept (an AES-256 key is
                                      derived with HKDF-SHA256) and never in
                                      a message.  With one, every value is
                                      sealed: XAES-256-GCM, bound to its key
                                      name and header; a value sealed under
                                      another key, not sealed, forged or
                                      tampered with is a miss (KVO_ECORRUPT,
                                      counted in auth_failed, not deleted).
                                      Needs OpenSSL (else create fails
                                      KVO_ENOTSUP).  docs/security.md */
    const char *secret_previous;   /* a second secret accepted for reading
                                      only while a fleet rotates; NULL with
                                      secret NULL: env
                                      KVO_REMOTE_SECRET_PREVIOUS; NULL or ""
                                      otherwise: none */
} kvo_remote_tier_params;

KVO_API kvo_remote_tier_params kvo_remote_tier_default_params(void);

typedef struct kvo_remote_tier kvo_remote_tier;

/** Create a tier: parse the URL, connect to a seed node (in order, the first
 *  that answers), authenticate, read the slot map (CLUSTER SLOTS), map and
 *  pre-fault the staging memory and start the workers.  A URL that carries
 *  a password is logged once per process as a warning (without it:
 *  KVO_REDIS_PASSWORD keeps the secret out of configs and their logs).
 *  *out owned by the caller (kvo_remote_tier_destroy).
 *  Errors: KVO_EINVAL (NULL, no plan, bad URL or key prefix, a secret under
 *  16 bytes: the message names the seed or field, never the password nor a
 *  secret, nor any text of the URL but a well-formed host), KVO_EIO (no seed answered, or the
 *  server refused authentication: "authentication refused by 127.0.0.1:7000
 *  for user ..." -- check the password; or the node is not in cluster mode /
 *  the cluster has no slots), KVO_ENOTSUP (built without hiredis),
 *  KVO_ENOMEM. */
KVO_API int kvo_remote_tier_create(const kvo_remote_tier_params *p, kvo_remote_tier **out);

/** Finish running batches (each bounded by io_timeout_ms), cancel queued
 *  gets and exists (completions discarded, destinations not written), send
 *  queued puts when the cluster answers (else drop them), close the
 *  connections and free everything.  When this returns no destination is
 *  touched any more.  Completions not polled are discarded.  The caller
 *  guarantees no other call on t is in progress or follows.  NULL is a
 *  no-op. */
KVO_API void kvo_remote_tier_destroy(kvo_remote_tier *t);

/** Queue stores of n chunks.  srcs[i] points to the group's chunk_bytes bytes
 *  of key i; they are copied into staging memory before this returns (the
 *  caller may reuse srcs at once).  results[i] (may be NULL): 0 queued;
 *  KVO_EEXIST the same key is being stored right now (skipped); KVO_EAGAIN
 *  dropped by back-pressure (counted); KVO_EINVAL bad key (group not offloaded) or
 *  NULL src; KVO_ECLOSED destroy began.  *n_queued (may be NULL) receives
 *  how many were queued.  Returns 0 when every key was handled (even if some
 *  were dropped: see results and stats), KVO_EINVAL for NULL arguments (nothing
 *  queued), KVO_ECLOSED after destroy began.  Write completion results (with
 *  params.write_completions): 0 stored; KVO_EIO the node was down, failed or
 *  timed out (dropped, counted in dropped_io). */
KVO_API int kvo_remote_tier_put(kvo_remote_tier *t, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                                const uint64_t *user_data, int *results, size_t *n_queued);

/** Queue loads of n chunks into dsts[i] (room for the group's chunk_bytes).
 *  dsts[i] must stay valid and untouched until the completion is polled (or
 *  destroy returned); only a completion with result 0 means it holds the
 *  chunk's bytes.  results[i] (may be NULL): 0 queued (one completion will
 *  follow); KVO_EAGAIN too many in flight (max_pending_reads, or
 *  completions not polled: counted in refused_reads); KVO_EINVAL bad key or
 *  NULL dst; KVO_ECLOSED destroy began.
 *  Completion results: 0 ok; KVO_ENOTFOUND absent (a miss); KVO_ECORRUPT the
 *  value failed verification (deleted, counted; a miss); KVO_EIO the node
 *  is down, failed or timed out (a miss).  Returns 0, KVO_EINVAL (NULL
 *  arguments, nothing queued), KVO_ECLOSED. */
KVO_API int kvo_remote_tier_get(kvo_remote_tier *t, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                                const uint64_t *user_data, int *results, size_t *n_queued);

/** Queue presence queries (EXISTS) for n keys; same results as get.
 *  Completion results: 0 present (a get will very probably hit);
 *  KVO_ENOTFOUND absent; KVO_EIO unknown (node down). */
KVO_API int kvo_remote_tier_exists(kvo_remote_tier *t, const kvo_chunk_key *keys, size_t n,
                                   const uint64_t *user_data, int *results, size_t *n_queued);

/** Queue deletions (DEL, pipelined like the other operations) of n keys:
 *  a cache that keeps its own accounting (LMCache's L2 usage) frees what it
 *  evicts.  Asynchronous like get: each queued key yields exactly one
 *  completion (op KVO_REMOTE_OP_REMOVE), and the deletion has happened when
 *  it is polled: 0 deleted; KVO_ENOTFOUND there was no value; KVO_EIO the
 *  node was down, failed or timed out (the value may remain);
 *  KVO_ECANCELED never (completions of removes still queued at destroy are
 *  discarded).  A remove of a key whose put is queued or running waits for
 *  that put, then deletes (the put never lands after it); a put of the key
 *  queued after the remove may land before or after it.  results[i] (may
 *  be NULL): 0 queued; KVO_EAGAIN too many in flight (they share
 *  max_pending_reads and the completion ring with gets; counted in
 *  refused_reads); KVO_EINVAL bad key; KVO_ECLOSED destroy began.  Returns
 *  0, KVO_EINVAL (NULL arguments, nothing queued), KVO_ECLOSED.  Any
 *  thread. */
KVO_API int kvo_remote_tier_remove(kvo_remote_tier *t, const kvo_chunk_key *keys, size_t n,
                                   const uint64_t *user_data, int *results, size_t *n_queued);

typedef enum kvo_remote_op_kind {
    KVO_REMOTE_OP_PUT = 1,
    KVO_REMOTE_OP_GET = 2,
    KVO_REMOTE_OP_EXISTS = 3,
    KVO_REMOTE_OP_REMOVE = 4
} kvo_remote_op_kind;

/** One finished operation. */
typedef struct kvo_remote_completion {
    uint64_t user_data;
    kvo_chunk_key key;
    uint32_t op;          /* kvo_remote_op_kind */
    int result;           /* 0 or a negative KVO_E* code (see above) */
    uint64_t bytes;       /* payload bytes moved (0 on error, and exists) */
    uint64_t latency_ns;  /* from queueing to completion */
} kvo_remote_completion;

/** Move up to cap completions to out (oldest first); *n = the count.  Never
 *  blocks.  Errors: KVO_EINVAL (NULL t or n, out NULL with cap > 0). */
KVO_API int kvo_remote_tier_poll(kvo_remote_tier *t, kvo_remote_completion *out, size_t cap, size_t *n);

/** Block until a completion waits or timeout_ns passes (< 0: forever, but
 *  KVO_ENOTFOUND at once when nothing that reports is in flight).
 *  0, KVO_ETIMEDOUT, KVO_ENOTFOUND (each with a message), KVO_EINVAL. */
KVO_API int kvo_remote_tier_wait(kvo_remote_tier *t, int64_t timeout_ns);

/** An eventfd (EFD_NONBLOCK), readable while completions wait; poll drains
 *  it.  Owned by the tier; valid until destroy. */
KVO_API int kvo_remote_tier_event_fd(const kvo_remote_tier *t);

/** Wait until no put is queued or running.  timeout_ns < 0 = forever.
 *  0 or KVO_ETIMEDOUT (the message says how many are left), KVO_EINVAL. */
KVO_API int kvo_remote_tier_flush(kvo_remote_tier *t, int64_t timeout_ns);

/** The Redis key of a chunk into out (cap bytes); KVO_ERANGE if it does not
 *  fit (128 bytes always do).  For tools and tests. */
KVO_API int kvo_remote_tier_key_name(const kvo_remote_tier *t, const kvo_chunk_key *key, char *out, size_t cap);

/** The layout hash the tier was created with (params.layout_hash; 0 = not
 *  namespaced by layout, or NULL).  Any thread. */
KVO_API uint64_t kvo_remote_tier_layout_hash(const kvo_remote_tier *t);

/** The cluster hash slot (0..16383) of a key name: CRC16-CCITT (XMODEM) of
 *  the key, or of its hash tag (the part between the first '{' and the
 *  next '}' when not empty), modulo 16384.  Any thread. */
KVO_API uint32_t kvo_remote_key_slot(const char *key, size_t len);

typedef struct kvo_remote_tier_stats {
    size_t struct_size;   /* sizeof(kvo_remote_tier_stats): KVO_REMOTE_TIER_STATS_INIT sets it */
    uint64_t puts, put_bytes;          /* values stored */
    uint64_t gets, get_bytes;          /* values loaded and verified */
    uint64_t get_misses;               /* absent */
    uint64_t exists_hits, exists_misses;
    uint64_t put_skipped;              /* same key being stored */
    uint64_t dropped_backpressure;     /* queue or staging memory full */
    uint64_t dropped_io;               /* puts lost to a failed/down node */
    uint64_t read_errors;              /* gets/exists that failed (EIO) */
    uint64_t refused_reads;            /* gets/exists refused: too many */
    uint64_t corrupt_deleted;          /* values that failed verification */
    uint64_t moved, asked;             /* redirections followed */
    uint64_t slot_refreshes;           /* CLUSTER SLOTS reloads */
    uint64_t node_failures;            /* nodes marked down */
    uint64_t batches;                  /* pipelined batches sent */
    uint64_t nodes;                    /* nodes known now (masters in the
                                          slot map, redirect targets) */
    uint64_t nodes_down;               /* nodes in backoff now */
    uint64_t pending_writes, pending_reads; /* in flight now */
    uint64_t staging_bytes;            /* staging memory held now */
    uint64_t reads_after_put;          /* gets/exists of a key whose put was
                                          queued or running: answered from
                                          the put (also counted in gets,
                                          exists_hits/misses) */
    uint64_t auth_failed;              /* gets of values that failed
                                          authentication (a secret: another
                                          key's, not sealed, forged or
                                          tampered with; no secret: a sealed
                                          value): misses, not deleted, not in
                                          corrupt_deleted */
    uint64_t removes;                  /* values deleted by
                                          kvo_remote_tier_remove */
    uint64_t remove_misses;            /* removes that found no value */
    uint64_t remove_errors;            /* removes that failed (EIO) */
} kvo_remote_tier_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_remote_tier_stats st = KVO_REMOTE_TIER_STATS_INIT; */
#define KVO_REMOTE_TIER_STATS_INIT {sizeof(kvo_remote_tier_stats)}

KVO_API int kvo_remote_tier_get_stats(kvo_remote_tier *t, kvo_remote_tier_stats *out);

#ifdef __cplusplus
}
#endif
#endif
