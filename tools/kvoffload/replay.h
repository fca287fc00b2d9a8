/* The replay engine of `kvoffload replay` (tools/kvoffload/replay*.c): a
 * Mooncake-format trace replayed through the real store, Belady's MIN and the
 * infinite cache on the same trace, and the hit-rate plot.  docs/replay.md. */
#ifndef KVO_REPLAY_H
#define KVO_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvoffload/kvo.h"

#define RP_NO_SESSION UINT64_MAX

/* A trace: per request, its 512-token block ids remapped to dense 0..ndistinct-1. */
typedef struct rp_trace {
    uint32_t *ids;       /* nids block references, request after request */
    size_t *starts;      /* nreq + 1: request r is ids[starts[r] .. starts[r + 1]) */
    uint64_t *session;   /* nreq: a key of the line's "session_id", or RP_NO_SESSION */
    size_t nreq, nids, ndistinct, maxlen;
} rp_trace;

/* The result of one replay (blocks = references replayed). */
typedef struct rp_result {
    uint64_t hits, blocks, evictions;
} rp_result;

/* Load a JSON-lines trace ({"hash_ids": [...], ...} per line, with an
 * optional "session_id", integer or string; blank lines skipped).  Returns 0, or -1 with a message (file, line, what) in err. */
int rp_trace_load(const char *path, rp_trace *t, char *err, size_t errlen);
void rp_trace_free(rp_trace *t);
/* The chunk key the replays give dense block id `id` (group 0 of a one-group
 * plan); bench store times its own calls on the same keys. */
kvo_chunk_key rp_trace_key(uint32_t id);

/* The 64-bit finalizer of MurmurHash3 (the dense-id table's hash; routing). */
uint64_t rp_mix(uint64_t x);

/* One cache of the replays: a kvo_store of cap blocks (one 4096-byte slot
 * each, nothing allocated for the bytes) and the buffers of one request of at
 * most maxlen blocks.  rp_cache_open returns 0 or a KVO_E* code (closed). */
typedef struct rp_cache {
    kvo_plan *plan;
    kvo_store *s;
    kvo_chunk_key *todo;
    uint8_t *st, *need;  /* need: after rp_cache_request, which blocks were stored anew */
    kvo_slot *sl;
    uint64_t cap;
    bool ignore_present;
} rp_cache;
int rp_cache_open(rp_cache *c, kvo_policy_kind pol, uint64_t cap, bool ignore_present, size_t maxlen);
void rp_cache_close(rp_cache *c);
/* *hits = the READY blocks of keys[from .. len) before the first other one
 * (lookup: no recency change). */
int rp_cache_hits(rp_cache *c, const kvo_chunk_key *keys, size_t from, size_t len, size_t *hits);
/* Store keys[0 .. len) in batches of at most cap (present ones count as
 * used unless ignore_present); need[i] (len entries, or NULL) = stored anew. */
int rp_cache_store(rp_cache *c, const kvo_chunk_key *keys, size_t len, uint8_t *need);
/* One request of the single-cache replay: its prefix hits, their touches
 * with ignore_present, then the store of all of it (into c->need). */
int rp_cache_request(rp_cache *c, const kvo_chunk_key *keys, size_t len, size_t *hits);
uint64_t rp_cache_evictions(const rp_cache *c);

/* Replay through a kvo_store of cap blocks with policy pol: per request, its
 * prefix hits are its leading READY blocks (lookup), then all its blocks are
 * stored (present ones count as used), in batches of at most cap blocks.
 * With ignore_present, vLLM's manager instead: the prefix hits are touched
 * (its load), and a store leaves present blocks alone
 * (kvo_store_params.ignore_present).  Returns 0 or a KVO_E* code (message
 * in kvo_last_error). */
int rp_replay_store(const rp_trace *t, kvo_policy_kind pol, uint64_t cap, bool ignore_present, rp_result *out);
/* Belady's MIN at cap blocks, same batches (replay_min.c). */
int rp_replay_min(const rp_trace *t, uint64_t cap, rp_result *out);
/* The infinite cache: a block hits when seen before and its prefix hit. */
void rp_replay_infinite(const rp_trace *t, rp_result *out);

/* ------------------------------------------------------------ fleets -- */

typedef enum rp_routing { RP_ROUTE_RR, RP_ROUTE_SESSION, RP_ROUTE_PREFIX, RP_ROUTE_COUNT } rp_routing;
extern const char *const rp_routing_names[RP_ROUTE_COUNT]; /* round-robin, session, prefix-hash */

/* A fleet (replay_fleet.c): engines engines, each with a host tier of cap
 * blocks and policy pol; requests routed by routing (prefix-hash: the first
 * prefix_blocks blocks); and, per entry of shared_caps (0: none), a shared
 * remote tier of that many blocks and policy shared_pol, all replayed in one
 * pass (the host tiers do not depend on the shared one). */
typedef struct rp_fleet_params {
    size_t engines, prefix_blocks;
    rp_routing routing;
    kvo_policy_kind pol, shared_pol;
    uint64_t cap;
    bool ignore_present;
    const uint64_t *shared_caps;
    size_t nshared;
} rp_fleet_params;

/* Per engine and shared capacity (index s * engines + e). */
typedef struct rp_fleet_cell {
    uint64_t requests, blocks;
    uint64_t local_hits;   /* prefix hits in the engine's host tier */
    uint64_t shared_hits;  /* the prefix continued from the shared tier (loads over the network) */
    uint64_t shared_puts;  /* blocks written to the shared tier (write-through of computed blocks) */
} rp_fleet_cell;

/* Replay; cells: nshared * engines entries (caller-owned), shared_evictions:
 * nshared (or NULL).  Returns 0 or a KVO_E* code. */
int rp_replay_fleet(const rp_trace *t, const rp_fleet_params *p, rp_fleet_cell *cells, uint64_t *shared_evictions);

/* One curve of the plot. */
typedef struct rp_curve {
    const char *name;
    const double *hit_rate;   /* per capacity */
    bool dashed;              /* references (MIN, infinite, one pool) */
} rp_curve;
/* Draw hit rate vs capacity as a PNG (replay_plot.c).  Returns 0, or -1 with
 * a message in err (no cairo in this build, cannot write). */
int rp_plot_png(const char *path, const char *title, const char *xlabel, const double *xs, size_t nx,
                const rp_curve *curves, size_t ncurves, char *err, size_t errlen);

#endif
