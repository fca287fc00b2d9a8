/*
 * Internal declarations of the connector layer (also used by its tests).
 *
 * The connector is the engine-facing layer: request bookkeeping on top of
 * the keys, the host store, the transfer engine and, optionally, the file
 * and remote tiers.  It is split by job, one file each:
 *   create.c     create / destroy, the accessors, the event drain
 *   relayout.c   set_layout: what a change of the slot format invalidates
 *   poll.c       the dispatcher: transfer results, file and remote reads
 *                landing, the completions handed to the engine
 *   lifecycle.c  wait_blocks / wait_request / preempt / abort / finish
 *   load.c       load: building and submitting the load job
 *   update.c     update, store_snapshot: choosing, reserving and
 *                submitting store batches
 *   lookup.c     lookup: chunk states, agreement, pinning the hit, starting
 *                file and remote reads
 *   metrics.c    statistics: get_stats, request_stats, the load histogram,
 *                stats_write / stats_format (Prometheus, JSON)
 *   request.c    the request table, token and unit hashing, shared
 *                scratch, job tracking, block-table checks
 *   cq.c         the completion ring
 *   controls.c   per-request limits, the lookup cap, reset (epochs)
 *   agree.c      the hit agreement rule (kvo_agree)
 *   map.c        the connector's hash tables
 *   config.c     the configuration loader (kvo_config.h), on its own
 * Functions shared between these files are named kvo__conn_* (kvo__map_*,
 * kvo__agree_*) and declared below; everything else is static.  Unless a
 * comment says otherwise, a kvo__conn_* function expects the caller to hold
 * c->mu.
 *
 * Layering.  The files form layers, top to leaves; a file calls the
 * internal functions of files in lower layers only, never of its own layer
 * or a higher one, so that each file reads (and can be tested) with only
 * what is below it (tools/check-layering.py fails on a cycle):
 *   1  create.c, relayout.c   build / tear down and reconfigure; both first
 *                             finish the copies in flight through poll.c
 *   2  poll.c, lifecycle.c    the dispatcher (transfer results and the
 *                             cascade's completions -> load.c, the ring);
 *                             the end of a request (its last stores ->
 *                             update.c)
 *   3  load.c, update.c       the copies: one load job, store batches
 *   4  lookup.c, metrics.c    the hit (states and promotions through the
 *                             cascade); the statistics
 *   5  request.c              the request and job tables
 *   6  cq.c, controls.c, agree.c, map.c, config.c   the leaves
 * Completion flows upward only by return: the cascade's promotions come
 * back through poll.c, which completes the read and submits the deferred
 * load (load.c); the completions for the engine live in cq.c (reserved by
 * load.c and lifecycle.c, emitted by load.c and poll.c, dropped by
 * lifecycle.c), which calls no one.
 *
 * The design of the whole layer.
 *
 * Layout
 *  - One mutex protects everything below; it is held for bookkeeping and for
 *    calls into the store, the transfer engine's submit/poll/cancel and the
 *    file tier's queueing calls (library code that never blocks for long and
 *    never calls back), and released around every wait for copies (except
 *    set_layout's, see relayout.c: a reconfiguration, not a per-step call).
 *  - Requests live in a hash table by id.  Each keeps its chained unit
 *    hashes (16 bytes per tokens_per_hash tokens), the partial unit's tokens,
 *    how far each group has been considered for storing (next_chunk), the hit
 *    its last lookup pinned, and the ids of its copies in flight.
 *  - Jobs (one transfer job per load, one per update that stores something)
 *    live in a hash table by job id.  A job record owns the chunk keys it
 *    completes or unpins when its result is polled, so a request may be
 *    preempted or aborted while its copies are in flight: the results are
 *    still processed, only the engine notification is dropped (a generation
 *    number tells stale loads apart), and LOAD completions already queued
 *    in the ring for it are taken out again.
 *  - The block map counts, per (group, engine block), the store jobs in flight
 *    that read it and the newest such job id: wait_blocks waits for every
 *    in-flight store job up to that id, which covers every store reading the
 *    block (exact, and bounded by the in-flight job count).
 *  - The tiers.  Everything past the engine's blocks goes through one
 *    kvo_cascade (src/cascade, kvo_cascade.h): the host arena's slots and
 *    their store, the file tier and the remote tier, with their lookup
 *    order, promotion, write-through / write-back, staging, retries,
 *    presence answers and counters.  The connector asks it where a
 *    request's chunks are (one lookup per key set), has it promote the
 *    lower-tier chunks of a hit into host slots (user data: the
 *    connector's read id, a kvo__read record), reserves store slots
 *    through it (all or nothing per batch) and completes them through it,
 *    which hands them to the lower tiers.  The connector keeps only what is
 *    about requests and the engine's layout: which groups a lower tier
 *    holds in the current slot format (kvo_cascade_set_tier_groups), and
 *    the epochs that make reads of an older layout or reset land as
 *    failures.
 *
 * Invariants
 *  - A hit pinned by lookup is exactly the chunks that load will read; pins
 *    move into the load's job record and are released when its result is
 *    polled (or at preempt/abort/finish/next lookup if no load was issued).
 *  - A chunk is stored only from blocks that hold its complete tokens
 *    (computed >= chunk end) and whose keys are known (units >= chunk end).
 *  - Every completion owed to the engine has room in the ring: each request
 *    LOADING (owes its LOAD completion) or FINISHED (owes RELEASED) counts
 *    in cq_owed, and load / finish reserve cq.len + cq_owed + 1 entries before
 *    they accept, so a completion is never lost to a failed allocation.
 *  - Host chunks, file reads and file-tier use always match the registered
 *    layout's slot format per group (relayout.c): a change drops what was
 *    stored in the old format and stops using files that hold it.
 *  - A load completion reports tokens_valid = the hit only if the copy
 *    succeeded (and, with verify_checksums, every slot matched its stored
 *    checksum); otherwise local_tokens: nothing loaded is ever counted as
 *    computed.
 *
 * Why this shape: the engine already owns block allocation and scheduling;
 * the connector only needs ids and block tables at the moments data moves,
 * and must never block the scheduler except where the engine asks it to
 * (wait_blocks, wait_request, preempt, abort).
 */
#ifndef KVO_CONNECTOR_INTERNAL_H
#define KVO_CONNECTOR_INTERNAL_H

#include <pthread.h>

#include "core/internal.h"
#include "core/ring.h"

/* The default min_hit_tokens: the largest tokens_per_chunk of an offloaded
 * group (0 when none is offloaded). */
uint64_t kvo__agree_min_hit_default(const kvo_plan *plan);

/* ---- map.c: uint64 -> (pointer, two uint64) table over core/hmap.c ---- */
typedef struct kvo__map_entry {
    uint64_t key, key_hi; /* kvo__hmap's two-word key (key_hi always 0) */
    uint32_t used;
    uint64_t a, b;
    void *p;
} kvo__map_entry;

typedef struct kvo__map {
    kvo__map_entry *e;
    size_t cap, n;
} kvo__map;

int kvo__map_init(kvo__map *m, size_t cap_hint);
void kvo__map_free(kvo__map *m);
/* Entry of key or NULL.  Entry pointers die at the next put or del. */
kvo__map_entry *kvo__map_get(const kvo__map *m, uint64_t key);
/* Insert key (values zeroed) or find it: 0 inserted, 1 existed, <0 error. */
int kvo__map_put(kvo__map *m, uint64_t key, kvo__map_entry **out);
void kvo__map_del(kvo__map *m, kvo__map_entry *e);
/* Grow so that `extra` more inserts cannot fail (nor grow). */
int kvo__map_reserve(kvo__map *m, size_t extra);

/* ---- the connector's records (see the design above) ---- */
enum { REQ_ACTIVE = 0, REQ_LOADING = 1, REQ_FINISHED = 2 };

typedef struct kvo__hit_item {
    kvo_chunk_key key;
    kvo_slot slot;
    uint64_t chunk;
    uint8_t tier;    /* where the data came from: KVO_TIER_HOST / _FILE / _REMOTE */
    uint8_t pinned;  /* pinned in the host store */
    uint8_t snap;    /* a state snapshot at the hit (request.c's snapshot
                        key), loaded into the block holding token hit - 1 */
} kvo__hit_item;

/* A promotion of a hit's chunk into a host slot (the cascade's user data is
 * its id; PENDING in the host store until done). */
typedef struct kvo__read {
    kvo_chunk_key key;
    uint8_t tier;   /* KVO_TIER_FILE or KVO_TIER_REMOTE */
    uint64_t req;
    uint32_t gen;
    uint32_t lay_epoch; /* lay_epoch of its group when started (relayout.c) */
    uint32_t epoch;     /* the connector's reset epoch when started (controls.c) */
    size_t item;
} kvo__read;

typedef struct kvo__job kvo__job;

/* Load latency histogram (metrics.c): counts per fixed bucket (the last one
 * is +Inf), not cumulative; updated under mu where loads complete. */
#define KVO__LOAD_BUCKETS 16
typedef struct kvo__hist {
    uint64_t n[KVO__LOAD_BUCKETS + 1];
    uint64_t sum_ns, count;
} kvo__hist;

typedef struct kvo__req {
    uint64_t id;
    int state;
    uint32_t gen;
    bool hash_mode;
    kvo_u128 ns;
    uint8_t *extra;
    size_t extra_len;
    kvo_u128 *units;
    size_t n_units, cap_units;
    uint32_t *tail;
    size_t n_tail;
    uint64_t prompt_tokens, n_tokens, computed;
    uint64_t ckpt[2];
    size_t n_ckpt;
    uint64_t next_chunk[KVO_MAX_GROUPS];
    /* chunks whose store was skipped (no room, queue full, not admitted),
     * retried at the next update / finish while the table holds their
     * blocks: (group, chunk) pairs */
    uint64_t *retry;
    size_t n_retry, cap_retry;
    /* controls (controls.c) */
    uint64_t max_load;    /* 0: no limit on tokens loaded per lookup */
    uint64_t store_limit; /* chunks ending beyond this token are not stored
                             (UINT64_MAX: no limit) */
    uint32_t epoch;       /* connector epoch at add_request */
    bool hit_stale;       /* the pinned hit predates a reset: its load fails */
    /* the hit pinned by the last lookup */
    bool hit_pinned;
    uint64_t hit_tokens, hit_local, hit_host_tokens, hit_file_tokens, hit_remote_tokens;
    /* the request's budget for the cluster's presence answers */
    kvo_cascade_wait rwait;
    kvo__hit_item *hit;
    size_t n_hit, cap_hit;
    /* copies in flight */
    uint64_t *jobs;
    size_t n_jobs, cap_jobs;
    uint64_t load_job;
    /* file-tier reads of the pinned hit still running, their first error,
     * and a load waiting for them */
    size_t file_pending;
    int file_status;
    kvo__job *deferred;
    /* blocks written by the last failed load (room reserved by load) */
    kvo_block_ref *invalid;
    size_t n_invalid, cap_invalid;
    kvo_request_stats st;
    uint8_t tenant;       /* its row in kvo_connector.tenants (tenant.c) */
    uint8_t part;         /* its tenant's host-tier part (kvo_cascade_tenant_part): every key's tag */
} kvo__req;

struct kvo__job {
    uint64_t id;
    uint64_t req;
    uint32_t gen;
    uint32_t epoch; /* connector epoch at submit: older results are dropped */
    uint8_t dir;
    size_t n_keys;
    kvo_chunk_key *keys;
    kvo_slot *slots;
    size_t n_blocks;
    kvo_block_ref *blocks;
    /* loads: the ops with their own copy of the engine block ids, so that a
     * load waiting for file reads can be submitted later */
    kvo_xfer_op *ops;
    uint64_t *eblk;
    uint64_t tokens, local, host_tokens, file_tokens, remote_tokens;
    uint64_t t0_ns; /* loads: when kvo_connector_load accepted it */
    uint8_t tenant; /* the request's tenant row (its counters outlive the request) */
};

struct kvo_connector {
    kvo_connector_params p;
    uint8_t *salt;
    const kvo_plan *plan;
    size_t ng;
    uint64_t step, min_hit;
    kvo_u128 fingerprint;
    kvo_arena *arena;
    uint8_t *arena_base;
    kvo_cascade *casc;  /* the tiers: host (arena + store), file, remote */
    kvo_store *store;   /* the cascade's host store */
    kvo_transfer *xfer;
    kvo_file_tier *file;       /* the lower tiers, for their statistics only */
    kvo_remote_tier *remote;
    pthread_mutex_t mu;
    bool layout_set;
    /* the registered layout, per group: a hash of what decides its slot
     * format (its segments' page_bytes in order), its engine block count,
     * and an epoch bumped when the format changes (promotions started
     * before land as failures); lay_first: the hashes at the first
     * set_layout (what an unnamespaced file tier holds); file_groups /
     * remote_groups, bit g: that tier holds group g in the current format
     * (the cascade reads and writes it only then) */
    uint64_t lay_hash[KVO_MAX_GROUPS], lay_first[KVO_MAX_GROUPS], lay_blocks[KVO_MAX_GROUPS];
    uint32_t lay_epoch[KVO_MAX_GROUPS];
    uint64_t file_groups;
    uint64_t remote_groups;
    kvo__map reqs, jobs, blocks, reads;
    uint64_t next_read;
    /* completions for the engine (ring) */
    kvo__ring cq;   /* src/core/ring.c, no eventfd */
    size_t cq_owed; /* completions still to come: requests LOADING or FINISHED */
    /* scratch, guarded by mu */
    kvo_chunk_key *s_keys;
    uint8_t *s_u8;
    kvo_slot *s_slots;
    uint32_t *s_grp;
    uint64_t *s_chunk;
    size_t s_cap;
    kvo_xfer_op *s_ops;
    size_t s_ops_cap;
    uint8_t *ones;
    size_t ones_cap;
    uint8_t *s_tier;
    /* snapshots off block boundaries (kvo_connector_store_snapshot):
     * snap_groups bit g: one was ever stored for group g (lookups of other
     * groups never ask for them); scratch of their lookup (sn_tier: the
     * kvo_tier_id that holds each) */
    uint64_t snap_groups;
    kvo_chunk_key *sn_keys;
    uint8_t *sn_st;
    uint8_t *sn_tier;
    uint8_t *sn_hs; /* 2 bytes per snapshot: the cascade's answers */
    kvo_agree_snapshot *sn;
    size_t sn_cap;
    uint32_t epoch; /* bumped by kvo_connector_reset */
    uint32_t inject_load_fail, inject_store_fail;
    kvo_connector_stats st; /* the connector's own counters (the tiers' come from the cascade) */
    /* per-tenant counters (tenant.c): rows [0, n_tenants) by first use, and
     * row KVO_CONNECTOR_TENANTS, "other", for tenants beyond them */
    kvo_tenant_stats tenants[KVO_CONNECTOR_TENANTS + 1];
    size_t n_tenants;
    kvo__hist load_ns; /* kvo_connector_load -> completion polled */
};

/* ---- small helpers shared by every file ---- */
static inline void kvo__conn_lock(kvo_connector *c) { pthread_mutex_lock(&c->mu); }
static inline void kvo__conn_unlock(kvo_connector *c) { pthread_mutex_unlock(&c->mu); }

/* The live request with this id, or NULL. */
static inline kvo__req *kvo__conn_req_get(kvo_connector *c, uint64_t id) {
    kvo__map_entry *e = kvo__map_get(&c->reqs, id);
    return e ? e->p : NULL;
}

/* Key of (group, engine block) in the block map. */
static inline uint64_t kvo__conn_block_key(uint32_t group, uint64_t block) { return (block << 6) | group; }

static inline void *kvo__conn_slot_ptr(kvo_connector *c, kvo_slot s) { return c->arena_base + s.offset; }

/* ---- tenant.c: per-tenant counters ---- */
/* The row of the tenant labelled `label` (kvo_tenant_label), added when new
 * and a row is free, else the "other" row.  Lock held. */
uint8_t kvo__conn_tenant_row(kvo_connector *c, const char *label);
/* A tenant row's counters (row from kvo__req.tenant / kvo__job.tenant). */
static inline kvo_tenant_stats *kvo__conn_tenant(kvo_connector *c, uint8_t row) { return &c->tenants[row]; }

/* ---- request.c: request table, scratch ---- */
/* Scratch arrays (s_keys, s_u8, s_slots, s_grp, s_chunk, s_tier) for n
 * chunk entries. */
int kvo__conn_scratch(kvo_connector *c, size_t n);
/* The key of r's state snapshot of group g after unit `unit` (the state
 * after (unit + 1) * tokens_per_hash tokens): XXH3-128(unit hash || one tag
 * byte), 17 input bytes, a length no unit hash input has (16 + 4 per token
 * + extra >= 20), so it never equals a chunk key. */
void kvo__conn_snap_key(const kvo__req *r, uint32_t g, size_t unit, kvo_chunk_key *out);
/* The key of request r's chunk ch of group gp (from its unit hashes),
 * tagged with the request's tenant part. */
void kvo__conn_chunk_key(const kvo__req *r, const kvo_group_plan *gp, uint64_t ch, kvo_chunk_key *out);
/* The host store holding key k (its tenant part's). */
static inline kvo_store *kvo__conn_hs(kvo_connector *c, const kvo_chunk_key *k) {
    return kvo_cascade_part_store(c->casc, k->tenant);
}
/* Sets and returns KVO_ENOTFOUND naming id. */
int kvo__conn_req_missing(uint64_t id);
void kvo__conn_job_free(kvo__job *j);
void kvo__conn_req_free(kvo__req *r);
/* Change r's state, keeping cq_owed = requests LOADING or FINISHED. */
void kvo__conn_req_set_state(kvo_connector *c, kvo__req *r, int state);
/* Drop r from the table and free it (what it owed is emitted or dropped). */
void kvo__conn_req_remove(kvo_connector *c, kvo__req *r);
/* The best boundary <= x for a sequence whose chunks within x are all
 * present (checkpoint policy); 0 when none or out of memory. */
uint64_t kvo__conn_best_boundary(kvo_connector *c, uint64_t x);
/* Check that n_tables block tables cover `tokens` tokens of every offloaded
 * group (KVO_EINVAL naming the group otherwise): ceil(tokens / tpb) entries
 * when partial (a load's last block may be partly valid), else the whole
 * blocks only (update: a partial block is never stored). */
int kvo__conn_check_tables(kvo_connector *c, uint64_t id, const kvo_block_table *tables, size_t n_tables,
                           uint64_t tokens, bool partial);
/* Room for tracking one more job of r over n_blocks engine blocks, so that
 * kvo__conn_job_register cannot fail. */
int kvo__conn_job_reserve(kvo_connector *c, kvo__req *r, size_t n_blocks);
void kvo__conn_job_register(kvo_connector *c, kvo__req *r, kvo__job *j);

/* ---- lookup.c ---- */
/* Token range [*lo, *hi) of chunk ch needed to serve boundary b above
 * local L; empty when *lo >= *hi. */
void kvo__conn_need_range(const kvo_group_plan *gp, uint64_t ch, uint64_t L, uint64_t b, uint64_t *lo,
                          uint64_t *hi);
/* Release the hit pinned by r's last lookup; its running file reads become
 * orphans. */
void kvo__conn_unpin_hit(kvo_connector *c, kvo__req *r);

/* ---- load.c ---- */
/* Emit a failed LOAD completion for a load that never reached the transfer
 * engine, unpin the hit, back to ACTIVE. */
void kvo__conn_fail_load_now(kvo_connector *c, kvo__req *r, int status);
/* Submit a prepared load job (every item pinned); 0 or an error (nothing
 * changed). */
int kvo__conn_submit_load(kvo_connector *c, kvo__req *r, kvo__job *j);

/* ---- update.c ---- */
/* The checks of update (also used by finish with tables). */
int kvo__conn_check_update(kvo_connector *c, kvo__req *r, uint64_t id, uint64_t computed,
                           const kvo_block_table *tables, size_t n_tables);
/* Store every newly complete chunk of r (up to computed tokens) and retry
 * skipped ones; final: at finish (draft groups store their last chunk). */
void kvo__conn_issue_stores(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, uint64_t computed,
                            bool final);
/* Store the end-of-request checkpoint of r (sliding_store CHECKPOINTS). */
void kvo__conn_store_final_checkpoint(kvo_connector *c, kvo__req *r, const kvo_block_table *tables,
                                      uint64_t computed);

/* ---- poll.c ---- */
/* Consume every finished transfer job. */
void kvo__conn_process_results(kvo_connector *c);

/* ---- cq.c: the completion ring ---- */
/* Room in the completion ring for every completion owed plus one more
 * (call before accepting a load or a finish). */
int kvo__conn_cq_reserve_owed(kvo_connector *c);
/* Queue a completion; room was reserved when it became owed. */
void kvo__conn_emit(kvo_connector *c, const kvo_completion *cp);
/* Take the LOAD completions of request id out of the ring (preempt, abort);
 * returns how many. */
size_t kvo__conn_cq_drop_loads(kvo_connector *c, uint64_t id);
/* Move up to cap queued completions, oldest first, into out; returns how
 * many. */
size_t kvo__conn_cq_take(kvo_connector *c, kvo_completion *out, size_t cap);

/* ---- controls.c ---- */
/* The largest boundary a lookup of r above local L may return: N - 1, lowered
 * by max_hit_tokens and the request's max_load_tokens (may be <= L: no hit). */
uint64_t kvo__conn_bmax(const kvo_connector *c, const kvo__req *r, uint64_t L);
/* Set r's controls from its descriptor (add_request). */
void kvo__conn_req_controls(kvo_connector *c, kvo__req *r, const kvo_request_desc *d);
/* Whether r may store chunks now (requests added before a reset may not). */
static inline bool kvo__conn_may_store(const kvo_connector *c, const kvo__req *r) { return r->epoch == c->epoch; }

/* ---- metrics.c (also kvo_connector_get_stats / _request_stats) ---- */
/* Count one load that took ns. */
void kvo__conn_hist_add(kvo__hist *h, uint64_t ns);

/* ---- create.c: test hooks, built only with KVO_TESTING ---- */
#ifdef KVO_TESTING
/* The next n load jobs of c complete as failed (KVO_EIO) whatever the copy
 * did; the next n store jobs likewise when stores is true. */
void kvo__connector_inject_failures(kvo_connector *c, uint32_t loads, uint32_t stores);
#endif

#endif
