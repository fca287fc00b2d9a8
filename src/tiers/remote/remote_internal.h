/*
 * Remote tier internals: the Redis Cluster client (cluster.c, pipeline.c,
 * reply.c) used by the tier (remote_tier.c, remote_completions.c; their
 * shared object is in remote_tier_internal.h).  hiredis appears in the
 * client's files only.
 *
 * Layering (a file calls kvo__ functions only of the files below it;
 * tools/check-layering.py fails on a cycle):
 *   remote_tier.c         top: the public API (create/destroy, put, get,
 *                         exists, remove, the workers) -> pipeline.c,
 *                         cluster.c
 *   remote_completions.c  top: poll, wait, flush, stats -> cluster.c
 *   pipeline.c            kvo__rc_exec, batches over the nodes
 *                         -> cluster.c, reply.c (through the reader)
 *   cluster.c             nodes, connection pools, the slot map, URL
 *                         parsing -> reply.c (kvo__rc_reader_setup)
 *   reply.c               leaf: hiredis reader functions (GET sinks),
 *                         replies and commands bounded by a deadline
 * Of src/tiers (another folder): file_format.c's header code and seal.c's
 * sealing (remote_tier.c, reply.c); the completion ring is the core's
 * (core/ring.h).
 */
#ifndef KVO_TIERS_REMOTE_INTERNAL_H
#define KVO_TIERS_REMOTE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>

#include "core/internal.h"
#include "kvoffload/kvo_remote_tier.h"

#ifdef KVO_TESTING
/* Tests only: hold (true) or release the tier's puts.  While held, the
 * workers take gets and exists only and the puts stay queued (destroy
 * releases them), so that a test can queue reads of keys whose puts are
 * certainly still pending. */
void kvo__remote_test_hold_puts(kvo_remote_tier *t, bool hold);
#endif

#define KVO__RC_SLOTS 16384u
#define KVO__RC_MAX_NODES 128u
#define KVO__RC_MAX_SEEDS 16u
#define KVO__RC_HOST_MAX 64u
#define KVO__RC_SECRET_MAX 256u

/* Seed nodes and credentials parsed from redis://[user:pass@]host:port,... */
typedef struct kvo__rc_url {
    char user[KVO__RC_SECRET_MAX];
    char pass[KVO__RC_SECRET_MAX];
    size_t n_seeds;
    char host[KVO__RC_MAX_SEEDS][KVO__RC_HOST_MAX];
    int port[KVO__RC_MAX_SEEDS];
} kvo__rc_url;

/* Parse a URL.  KVO_EINVAL with a message that never contains the
 * credentials nor any other text of the URL, except a host made of host
 * name characters only; every seed needs its port. */
int kvo__rc_url_parse(const char *url, kvo__rc_url *out);

typedef struct kvo__rc_cfg {
    kvo__rc_url url;             /* seeds, user, pass (pass "" = none) */
    uint32_t connect_timeout_ms;
    uint32_t io_timeout_ms;
    uint32_t down_backoff_ms;
    uint32_t conns_per_node;     /* idle connections kept per node */
    uint32_t max_redirects;
    uint64_t max_value_bytes;    /* idle reader buffers up to 2x this are
                                    kept (no regrowth per large reply) */
} kvo__rc_cfg;

typedef struct kvo__rc kvo__rc;

/* Counters of the client (atomics: any thread reads them). */
typedef struct kvo__rc_counters {
    atomic_uint_fast64_t moved, asked, refreshes, node_failures, batches;
} kvo__rc_counters;

/* Connect to the first seed that answers, authenticate, load the slot map.
 * KVO_EIO (no seed, auth refused, not a cluster), KVO_ENOMEM. */
int kvo__rc_create(const kvo__rc_cfg *cfg, kvo__rc **out);
void kvo__rc_destroy(kvo__rc *c);
const kvo__rc_counters *kvo__rc_stats(const kvo__rc *c);
/* Nodes known and nodes in backoff now. */
void kvo__rc_nodes(kvo__rc *c, uint64_t *known, uint64_t *down);

enum { KVO__RC_GET = 1, KVO__RC_SET = 2, KVO__RC_EXISTS = 3, KVO__RC_DEL = 4 };

/* One command of a pipelined batch.  The caller fills the inputs; exec
 * fills the outputs.  A GET's reply (a redisReply *, NULL unless result 0)
 * belongs to the caller: kvo__rc_reply_free. */
typedef struct kvo__rc_cmd {
    /* inputs */
    int kind;
    const char *key;
    size_t klen;
    uint32_t slot;               /* kvo_remote_key_slot(key) */
    const struct iovec *val;     /* SET: the value's pieces */
    int nval;
    uint32_t ttl_s;              /* SET: EX seconds, 0 = none */
    bool skip;                   /* not sent: completes KVO_EIO (a put that
                                    could not be sealed) */
    /* GET: when set, a reply of exactly sink_hdr_len + sink_len bytes is
     * parsed straight into sink_hdr (its first sink_hdr_len bytes) and
     * sink_dst (the rest) instead of a heap copy; str is then NULL and len
     * the value's length.  Other lengths arrive in str as usual. */
    void *sink_hdr, *sink_dst;
    size_t sink_hdr_len, sink_len;
    /* GET with a sink, out: XXH3-64 of sink_dst (the tier's payload
     * checksum) when the value went into the sink (str NULL), taken by the
     * reader as the bytes arrived, while they are in cache: verifying it
     * afterwards read each value back from memory, 15-20 % of a 256 KiB
     * read's time (docs/benchmarks.md). */
    uint64_t sink_sum;
    /* GET with a sink and a seal op (a tier with a fleet secret): instead of
     * the checksum, the reader opens the sealed payload in place as it
     * arrives (tiers/seal.h: the record is read from sink_hdr once the
     * header is in, the key name is the authenticated name), while the
     * bytes are in cache; sink_seal_rc out: 0 authentic, KVO_ECORRUPT not
     * sealed by a key of this tier or failed authentication (the value
     * went into the sink; str NULL). */
    struct kvo__seal_op *sink_seal;
    int sink_seal_rc;
    /* outputs */
    int result;                  /* 0 ok, KVO_ENOTFOUND (GET nil, EXISTS 0,
                                    DEL 0),
                                    KVO_ECORRUPT (GET of a key holding
                                    another type: WRONGTYPE), KVO_EIO (node
                                    down/failed/past a deadline, or another
                                    error reply) */
    void *reply;                 /* GET: the bulk reply */
    const char *str;             /* GET: the value bytes (inside reply) */
    size_t len;
    /* exec's state */
    int node;
    int hops;
    bool asking;
    bool done;
} kvo__rc_cmd;

/* Per-thread workspace of kvo__rc_exec (RESP headers, iovecs, grouping):
 * one per worker, allocated once.  NULL on allocation failure. */
typedef struct kvo__rc_ws kvo__rc_ws;
kvo__rc_ws *kvo__rc_ws_create(void);
void kvo__rc_ws_destroy(kvo__rc_ws *w);

/* Run n commands: route by slot, one pipeline per node (all nodes written,
 * then all read), follow MOVED (slot map updated, refreshed afterwards) and
 * ASK (ASKING + retry on the named node), fail fast on nodes in backoff.
 * Never blocks longer than (max_redirects + 1) x io_timeout_ms per 64
 * commands (plus one send timeout), however a node spaces its bytes. */
void kvo__rc_exec(kvo__rc *c, kvo__rc_ws *w, kvo__rc_cmd *cmds, size_t n);
void kvo__rc_reply_free(void *reply);

/* Between cluster.c (nodes, pools, slot map) and pipeline.c (exec). */
struct redisContext;
struct redisContext *kvo__rc_conn_take(kvo__rc *c, int ni);
void kvo__rc_conn_give(kvo__rc *c, int ni, struct redisContext *ctx);
void kvo__rc_node_fail(kvo__rc *c, int ni);
bool kvo__rc_node_down(kvo__rc *c, int ni);
void kvo__rc_route(kvo__rc *c, kvo__rc_cmd *cmds, size_t n);
int kvo__rc_redirect(kvo__rc *c, const char *target, int from_node, bool moved, uint32_t slot);
void kvo__rc_maybe_refresh(kvo__rc *c);
void kvo__rc_count_batch(kvo__rc *c);
uint32_t kvo__rc_max_redirects(const kvo__rc *c);
uint64_t kvo__rc_io_timeout_ns(const kvo__rc *c);

/* reply.c: install the reader functions on a new connection (cluster.c,
 * at connect); a GET with a sink is parsed into it while the reader's
 * privdata points at its kvo__rc_cmd (pipeline.c sets and clears it). */
void kvo__rc_reader_setup(struct redisContext *ctx, uint64_t max_value_bytes);

/* reply.c: one whole reply by deadline_ns (kvo__now_ns's clock), however
 * the node spaces its bytes: REDIS_OK with *reply set, or REDIS_ERR with
 * ctx->err / ctx->errstr set ("no whole reply within N ms (timed out)", EOF,
 * protocol).  kvo__rc_command sends argv (NUL-terminated strings) first,
 * within the same deadline.  The connection is unusable after an error. */
int kvo__rc_get_reply(struct redisContext *ctx, void **reply, uint64_t deadline_ns);
int kvo__rc_command(struct redisContext *ctx, void **reply, uint64_t deadline_ns, int argc, const char **argv);

/* CRC16-XMODEM slot of a key with hash tags (kvo_remote_key_slot). */
uint32_t kvo__rc_slot(const char *key, size_t len);

#endif
