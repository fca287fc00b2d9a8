/*
 * kvoffload connector: what an inference engine's scheduler and workers call
 * to reuse KV-cache prefixes across requests through the offload tiers.
 *
 * One kvo_connector serves one engine instance (one plan, one engine KV
 * layout).  It owns a host arena + kvo_store (the host tier) and a
 * kvo_transfer engine; a kvo_file_tier and a kvo_remote_tier may be attached
 * behind the host tier (lookup order host -> file -> remote).
 *
 * Request lifecycle (vLLM-like scheduler/worker split; both halves may run in
 * different threads of one process):
 *
 *   add_request(id, prompt tokens or unit hashes, salt)
 *     -> lookup(id, local_tokens)          scheduler: how many prompt tokens
 *                                          can be loaded instead of computed?
 *                                          KVO_HIT / KVO_HIT_NONE /
 *                                          KVO_HIT_PENDING (ask again later)
 *     -> load(id, tokens, block tables)    after the engine allocated blocks:
 *                                          issues the copies (async)
 *     -> poll()                            worker: KVO_COMPLETION_LOAD tells
 *                                          which tokens are now computed
 *     -> append_tokens / update(computed, block tables)   every step: stores
 *                                          chunks as they become complete
 *     -> finish(id)                        final stores; blocks may be freed
 *                                          once KVO_COMPLETION_RELEASED is
 *                                          polled (or wait_request returns)
 *   preempt(id) / abort(id) at any point: pending copies are canceled or
 *   waited for, so the engine may free the request's blocks on return.
 *
 * Positions.  Token positions count from the start of the sequence.  A
 * "boundary" b means: KV for tokens [0, b) is present, token b is computed
 * next.  A hit may be any token count (not only multiples of
 * kvo_connector_step()): the load writes whole blocks, so a group's block
 * holding token b - 1 may receive KV for tokens from b to the block's end
 * too (the same tokens, computed by an earlier request: exact), and the
 * engine recomputes from b over that tail.  Hits are below the prompt length
 * (the last prompt token is always computed, the engine needs its logits).
 * local_tokens (the engine's own prefix) stays a multiple of the step.
 *
 * Block tables.  For each group, an array indexed by block index from token 0
 * (block i of group g covers tokens [i*tpb_g, (i+1)*tpb_g)) giving the engine
 * block id, or KVO_NO_BLOCK where the engine holds none (a sliding group's
 * blocks that left the window, state snapshots it did not keep).  For a state
 * group, block i holds the recurrent state after token (i+1)*tpb_g.  The
 * connector copies what it needs at each call; the arrays are not kept.
 *
 * Lookup agreement (docs/lookup.md): full groups need every chunk of the
 * prefix; sliding groups only the chunks covering the last `window` tokens
 * before the boundary (both rounded up to whole chunks: the engine recomputes
 * from the boundary over the tail of the last loaded block); state groups a
 * snapshot exactly at the boundary; draft (EAGLE / MTP) groups also the chunk
 * holding token b (their KV at b - 1 depends on token b); the boundary (any
 * token count) is lowered until every group agrees.  kvo_agree() is the pure
 * function.
 *
 * Controls: per request (kvo_request_desc) max_load_tokens,
 * max_offload_tokens and offload_prompt_only; per connector max_hit_tokens;
 * kvo_connector_reset drops everything cached (after a weight update).
 *
 * Non-cacheable groups are never offloaded.  The KV a non-cacheable group
 * holds for tokens before a boundary cannot in general be rebuilt by the
 * engine without recomputing from token 0 (its KV at a token depends on its
 * own KV at earlier tokens through the layer stack), so by default such a
 * group disables hits (conservative, always correct).  An engine that knows a
 * non-cacheable group carries nothing across a step-aligned boundary (a
 * scratch or compressor buffer that is refilled from the tokens after the
 * boundary) names it in params.scratch_groups; it then never limits hits.
 *
 * Thread rule: every function may be called from any thread.  One internal
 * lock protects the request table; it is never held while waiting for copies
 * (wait_blocks, wait_request, preempt, abort, destroy block without it) and
 * never while calling user code (there are no callbacks).  Calls on one
 * request id are meant to come in lifecycle order; a call out of order fails
 * with KVO_ESTATE for that request only.  Errors concern the one request
 * named; other requests are unaffected.
 */
#ifndef KVOFFLOAD_KVO_CONNECTOR_H
#define KVOFFLOAD_KVO_CONNECTOR_H

#include "kvo_store.h"
#include "kvo_transfer.h"
#include "kvo_file_tier.h"
#include "kvo_cascade.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Declared again here so that this header does not depend on the file-tier
 * header's contents (identical typedefs are allowed in C11). */
typedef struct kvo_file_tier kvo_file_tier;
/* The remote tier (kvo_remote_tier.h); only a pointer is kept here. */
typedef struct kvo_remote_tier kvo_remote_tier;

/** Block table entry for a block the engine does not hold. */
#define KVO_NO_BLOCK UINT64_MAX

/* ------------------------------------------------------ lookup agreement -- */

/** Per-chunk states given to kvo_agree: KVO_MISS, KVO_READY, KVO_PENDING
 *  (kvo_lookup_state), or KVO_CHUNK_LOCAL: the chunk's tokens are already in
 *  the engine's blocks (counts as READY, nothing to load). */
#define KVO_CHUNK_LOCAL 3

/** What limited (or decided) an agreement. */
typedef enum kvo_agree_reason {
    KVO_AGREE_OK = 0,          /* every group agreed at the candidate maximum */
    KVO_AGREE_LOWERED = 1,     /* some group lowered the boundary */
    KVO_AGREE_TOO_SHORT = 2,   /* agreement below min_hit_tokens: no hit */
    KVO_AGREE_NONCACHEABLE = 3,/* a non-cacheable, non-scratch group: no hit */
    KVO_AGREE_NO_PROMPT = 4    /* n_tokens <= local_tokens + 1: nothing to hit */
} kvo_agree_reason;

/** A state snapshot taken at a position that need not be a block boundary
 *  (e.g. at the end of a request's prompt).  state: KVO_READY, KVO_PENDING or
 *  KVO_MISS. */
typedef struct kvo_agree_snapshot {
    uint64_t tokens;          /* the state after tokens [0, tokens) */
    uint8_t state;
} kvo_agree_snapshot;

/** Input of kvo_agree.  Arrays have one entry per plan group. */
typedef struct kvo_agree_input {
    const kvo_plan *plan;
    uint64_t n_tokens;        /* prompt tokens; the boundary is <= n_tokens - 1 */
    uint64_t local_tokens;    /* tokens already computed in the engine
                                 (<= n_tokens, a multiple of the alignment
                                 below); the hit is >= this */
    uint64_t boundary_align;  /* hits are multiples of this many tokens.
                                 1: any token count (the rule of
                                 docs/lookup.md: the engine loads whole blocks
                                 and recomputes from the hit over the tail of
                                 the last one).  0: kvo_agree_step() (every
                                 group's block at the hit starts empty), for
                                 loaders that copy only whole blocks below the
                                 hit.  The connector passes 1. */
    uint64_t min_hit_tokens;  /* a hit adding fewer than this many tokens
                                 beyond local_tokens counts as none; 0 = the
                                 largest tokens_per_chunk over offloaded
                                 groups (a hit shorter than a chunk counts as
                                 none) */
    uint64_t scratch_groups;  /* bit g set: non-cacheable group g is scratch
                                 and does not limit hits */
    /* Per group: chunk states (chunk c covers tokens [c*T_g, (c+1)*T_g));
     * chunks at index >= n_chunks[g] are MISS.  NULL entries / NULL arrays
     * for groups that are not offloaded. */
    const uint8_t *const *chunk_states;
    const size_t *n_chunks;
    /* Optional, state groups only: extra snapshots at any position, sorted
     * ascending without duplicates (n_snapshots[g] entries).  NULL arrays or
     * entries: only the block-boundary snapshots held in the chunks. */
    const kvo_agree_snapshot *const *snapshots;
    const size_t *n_snapshots;
} kvo_agree_input;

typedef struct kvo_agree_result {
    uint64_t tokens;          /* agreed boundary counting PENDING as MISS
                                 (>= local_tokens; == local_tokens: no hit) */
    uint64_t tokens_if_pending; /* agreed boundary counting PENDING as READY */
    int32_t limiting_group;   /* group that lowered the boundary last, -1 none */
    kvo_agree_reason reason;
    uint32_t rounds;          /* lowering rounds used (for tests/diagnostics) */
} kvo_agree_result;

/** lcm of every group's tokens_per_block (including groups that are not
 *  offloaded); 0 on overflow.  kvo_agree no longer limits hits to multiples
 *  of it (any token count can be a hit); the connector still uses it to
 *  check local_tokens and checkpoint_interval. */
KVO_API uint64_t kvo_agree_step(const kvo_plan *plan);

/** The lookup agreement rule as a pure function (docs/lookup.md).  Returns the
 *  largest token count b with local_tokens <= b <= n_tokens - 1 that every
 *  group serves: full and sliding groups from READY or LOCAL chunks covering
 *  their needed range rounded up to whole chunks (a partly needed last chunk
 *  is fine: the engine recomputes from b over the loaded block's tail), state
 *  groups from a READY snapshot exactly at b (a block boundary, or an extra
 *  snapshot), scratch groups when b is a multiple of their tokens_per_block,
 *  draft groups (full or sliding) when they would serve b + 1 with the same
 *  window start (the chunk holding token b READY too);
 *  b = local_tokens when none, or when b - local_tokens < min_hit_tokens.
 *  b is a multiple of boundary_align (0: of kvo_agree_step()).
 *  Pure, thread-safe, no allocation; reads the inputs only during the call.
 *  Errors: KVO_EINVAL (NULL plan/out, NULL states for an offloaded group with
 *  n_chunks > 0, local_tokens > n_tokens or not a multiple of the alignment,
 *  snapshots for a group that is not a state group, snapshots not strictly
 *  ascending), KVO_ERANGE (the step overflows). */
KVO_API int kvo_agree(const kvo_agree_input *in, kvo_agree_result *out);

/* ------------------------------------------------------------- connector -- */

typedef enum kvo_sliding_store {
    /* Store every complete chunk of sliding groups. */
    KVO_SLIDING_STORE_ALL = 0,
    /* Store only the chunks that cover the window before checkpoint
     * positions: multiples of checkpoint_interval (when not 0), the best
     * boundaries for the prompt (and the prompt minus its last token), and the
     * end of the request at finish (from the blocks the engine still holds). */
    KVO_SLIDING_STORE_CHECKPOINTS = 1,
    /* Store only the chunks some future lookup can use: those covering the
     * window before a reachable boundary.  Boundaries are reachable where
     * every state group has a snapshot and every scratch group a block
     * edge: multiples of R = lcm of their tokens_per_block (R = 1 without
     * such groups: every chunk, as ALL).  A chunk [cs, ce) is kept when a
     * multiple of R lies in (cs, ce + window) ([cs, ce + window) for a
     * draft group, whose range also holds token b).  Default. */
    KVO_SLIDING_STORE_REACHABLE = 2
} kvo_sliding_store;

/* kvo_file_mode (how chunks reach the file tier): kvo_cascade.h. */

typedef struct kvo_connector_params {
    size_t struct_size;   /* sizeof(kvo_connector_params): kvo_connector_default_params() sets it */
    const kvo_plan *plan;         /* required; must outlive the connector */
    /* Host tier */
    uint64_t host_bytes;          /* arena bytes; required, >= the largest slot */
    kvo_policy_kind policy;       /* eviction policy; default LRU */
    uint32_t admit_after;         /* kvo_store_params.admit_after; default 0 */
    uint32_t event_capacity;      /* store events kept for drain_events;
                                     default 4096; 0 = no events */
    bool huge_pages, lock_memory; /* kvo_arena_params; default false */
    bool prefault;                /* default true */
    const char *shm_path;         /* NULL (default) or a shared-memory file */
    /* Transfer engine */
    uint32_t transfer_threads;    /* default 2 */
    uint32_t max_queued_jobs;     /* default 4096 */
    int nontemporal;              /* -1 auto (default), 0, 1 */
    /* Keys: namespace = kvo_keys_namespace(fingerprint, salt || request
     * cache_salt) */
    const void *salt;             /* copied; may be NULL when salt_len is 0 */
    size_t salt_len;
    /* Lookup */
    uint64_t min_hit_tokens;      /* 0 (default): the largest tokens_per_chunk */
    uint64_t scratch_groups;      /* bit g: non-cacheable group g is scratch */
    uint64_t max_hit_tokens;      /* a lookup never returns a boundary above
                                     this many tokens (bounds the prefix one
                                     request reuses, e.g. to bound load time
                                     or to match a peer's limit); 0 (default):
                                     no cap */
    /* Store */
    kvo_sliding_store sliding_store; /* default REACHABLE */
    uint64_t checkpoint_interval; /* CHECKPOINTS: tokens, a multiple of the
                                     step; 0 = no periodic checkpoints */
    bool verify_checksums;        /* keep an XXH3-64 of every host chunk and
                                     verify loads (a mismatch fails the load)
                                     and chunks before they are written to
                                     the file tier (a mismatch is not
                                     written); costs one read pass per store,
                                     load and file write (a write-through
                                     write shares its store's); default
                                     false */
    /* File tier (optional): created and destroyed by the caller, must
     * outlive the connector; chunks reach it as file_mode says, and host
     * misses are looked up and read from it.  Writes the tier drops
     * (back-pressure, quota, a full disk) are counted, never an error. */
    kvo_file_tier *file_tier;
    kvo_file_mode file_mode;      /* default KVO_FILE_WRITE_THROUGH */
    bool file_persist_on_destroy; /* WRITE_BACK only: kvo_connector_destroy
                                     first writes the host tier's READY
                                     chunks that the file tier lacks
                                     (kvo_connector_flush_to_file, no
                                     timeout), so a restarted engine finds
                                     them; default true.  Costs the time to
                                     write up to host_bytes to the file
                                     system at destroy */
    uint32_t max_requests;        /* request table size; default 4096 */
    /* Remote tier (optional, kvo_remote_tier.h): created and destroyed by
     * the caller (leave its write_completions off), must outlive the
     * connector; the connector consumes all of its completions.  Every
     * chunk stored in the host tier is put to it once its host store
     * completes (write-through, whatever file_mode says); puts the tier
     * drops (back-pressure, a node down) are counted, never an error.
     * Chunks neither host nor file holds are asked for with asynchronous
     * EXISTS queries; present ones are read remote -> host slot -> engine
     * like file hits (docs/remote-tier.md). */
    kvo_remote_tier *remote_tier;
    uint32_t remote_lookup_budget_us; /* how long lookups of one request may
                                     answer KVO_HIT_PENDING while remote
                                     presence queries run; after that,
                                     lookup answers what host and file
                                     serve (the queries keep running and a
                                     later lookup may use them).  0: never
                                     wait.  Default 20000 (20 ms) */
    uint32_t remote_exists_ttl_ms; /* how long an EXISTS answer is reused by
                                     later lookups; default 1000 */
    uint64_t snapshot_groups;     /* bit g: state group g has snapshots off
                                     the block grid in the tiers already
                                     (stored by an earlier process), so
                                     lookups ask for them from the start;
                                     a group gets its bit anyway at its
                                     first kvo_connector_store_snapshot.
                                     Default 0 */
    bool file_zero_copy;          /* WRITE_THROUGH: lend each stored chunk's
                                     host slot to the file tier
                                     (kvo_file_tier_write_borrowed) instead
                                     of the tier's staging copy: the chunk
                                     stays pinned in the host tier until its
                                     file is written (host capacity held by
                                     the writes in flight, at most the
                                     tier's max_pending_writes chunks), and
                                     with verify_checksums the tier checks
                                     the bytes against the store's checksum.
                                     Write-back and flush_to_file copy as
                                     before.  Default false */
    /* Tenant quotas: n_tenants tenants (by label) with a part of the host
     * tier of their own (kvo_cascade_params.tenants: kept from every other
     * tenant's traffic, bounding their own), carved out of host_bytes.  A
     * request's tenant is its cache_salt.  Borrowed until create returns.
     * Default none. */
    const kvo_cascade_tenant *tenants;
    uint32_t n_tenants;
} kvo_connector_params;

KVO_API kvo_connector_params kvo_connector_default_params(void);

typedef struct kvo_connector kvo_connector;

/** Create a connector: arena, store and transfer engine.  *out owned by the
 *  caller (kvo_connector_destroy).  Errors: KVO_EINVAL (no plan, host_bytes
 *  below the largest slot, checkpoint_interval not a multiple of the step,
 *  scratch_groups naming a cacheable group, snapshot_groups naming a group
 *  that is not an offloaded state group: the message names group and
 *  numbers), KVO_ENOMEM, and the arena's / transfer engine's errors. */
KVO_API int kvo_connector_create(const kvo_connector_params *p, kvo_connector **out);

/** Cancel queued copies, wait for running ones, free everything.  In
 *  write-back mode with file_persist_on_destroy, first persist the host
 *  tier's READY chunks (completed stores included) to the file tier (see
 *  kvo_connector_flush_to_file).  The caller guarantees no other call on c
 *  is in progress or follows.  NULL: no-op. */
KVO_API void kvo_connector_destroy(kvo_connector *c);

/** Register (replace) the engine's KV layout (see kvo_transfer_set_layout).
 *  Must be called before the first load or store.  Replacing it with one
 *  that changes a group's slot format (its segments' page_bytes in order,
 *  e.g. the same bytes per block split into K and V) invalidates what was
 *  stored in the old format (docs/connector.md, "Layout changes"): the
 *  group's host chunks are removed, hits pinned by lookup that read it are
 *  released (load then fails with KVO_ESTATE: look up again), a load
 *  waiting for file reads of such a hit completes as failed (KVO_ESTATE),
 *  copies in flight of it fail (KVO_ESTATE, reported as usual), and the
 *  file tier is read and written only for groups whose current format it
 *  holds (a tier with params.layout_hash: while the layout has that hash;
 *  without: while the group's format is the first registered one).  Holds
 *  the connector lock while the transfer engine waits for copy pieces in
 *  flight; do not call it concurrently with loads it would invalidate.
 *  Errors as kvo_transfer_set_layout (the old layout stays). */
KVO_API int kvo_connector_set_layout(kvo_connector *c, const kvo_segment *segs, size_t n);

/** The plan's step (kvo_agree_step: lcm of every group's tokens_per_block).
 *  lookup's local_tokens and checkpoint_interval are multiples of it; hits
 *  are not (any token count). */
KVO_API uint64_t kvo_connector_step(const kvo_connector *c);

/** The parts, for statistics and advanced use; owned by the connector. */
KVO_API kvo_store *kvo_connector_store(kvo_connector *c);
KVO_API kvo_transfer *kvo_connector_transfer(kvo_connector *c);
KVO_API kvo_arena *kvo_connector_arena(kvo_connector *c);

/* -------------------------------------------------------------- requests -- */

typedef struct kvo_request_desc {
    size_t struct_size;             /* sizeof(kvo_request_desc): KVO_REQUEST_DESC_INIT sets it */
    uint64_t id;                    /* engine's request id; unique while live */
    /* Either the prompt's token ids ... */
    const uint32_t *tokens;         /* copied (only partial-unit tail kept) */
    size_t n_tokens;
    /* ... or the engine's own chained hashes of the prompt's complete units
     * of tokens_per_hash tokens (then tokens must be NULL); the connector
     * mixes them with its namespace.  prompt_tokens gives the prompt length
     * (>= n_units * tokens_per_hash, < (n_units + 1) * tokens_per_hash). */
    const kvo_u128 *unit_hashes;
    size_t n_units;
    uint64_t prompt_tokens;
    /* Per-tenant cache salt, mixed into the namespace (copied; may be NULL). */
    const void *cache_salt;
    size_t cache_salt_len;
    /* Bytes appended to every hash unit: adapter id, multimodal content hash
     * (copied; may be NULL). */
    const void *extra;
    size_t extra_len;
    /* Controls (0 / false: none).  max_load_tokens: a lookup of this request
     * loads at most this many tokens (hit - local_tokens <= it).
     * max_offload_tokens: only chunks ending at or before this token are
     * stored.  offload_prompt_only: only chunks ending within the prompt are
     * stored (generated tokens are not offloaded); combined with
     * max_offload_tokens the smaller limit applies. */
    uint64_t max_load_tokens;
    uint64_t max_offload_tokens;
    bool offload_prompt_only;
} kvo_request_desc;
/** Initialiser (the struct_size convention, kvo_common.h): every field past
 *  struct_size zero.  kvo_request_desc d = KVO_REQUEST_DESC_INIT; or, in one
 *  expression, (kvo_request_desc){.struct_size = sizeof(kvo_request_desc),
 *  .id = ..., .tokens = ..., .n_tokens = ...}. */
#define KVO_REQUEST_DESC_INIT {sizeof(kvo_request_desc)}

/** Register a request.  d and what it points to are read during the call
 *  only (copied).  Errors: KVO_EINVAL (NULL, struct_size not set by
 *  KVO_REQUEST_DESC_INIT, both or neither of tokens / unit_hashes, empty
 *  prompt, inconsistent prompt_tokens), KVO_EEXIST (id live), KVO_ENOSPC
 *  (max_requests live), KVO_ENOMEM. */
KVO_API int kvo_connector_add_request(kvo_connector *c, const kvo_request_desc *d);

/** Drop everything cached, e.g. after a weight update made every stored KV
 *  stale: no request added after the call hits anything stored before it,
 *  in any tier.  Requests added after the call use a new key namespace (an
 *  epoch counter mixed into it), so older chunks, wherever they are, never
 *  match; the host tier's are also removed to free room.  Safe with
 *  requests in flight; the rule:
 *   - every READY host chunk is removed at once (REMOVED events); chunks
 *     pinned by loads already submitted are removed when those loads
 *     complete (the loads themselves complete normally: they copy data from
 *     before the reset, which the engine may keep or recompute, as with its
 *     own prefix cache);
 *   - stores and file-tier reads in flight never become READY: their
 *     entries are dropped when they complete;
 *   - a hit pinned by a lookup and not yet loaded is released; its load is
 *     accepted and completes at once with status KVO_ECANCELED and
 *     tokens_valid = local_tokens (nothing written);
 *   - requests added before the reset neither store nor hit any more
 *     (their KV in the engine predates it); requests added after it behave
 *     normally.
 *  The file tier (the caller's) keeps its files: they are not deleted, only
 *  never hit again by this connector.  The epoch starts at 0 in every new
 *  connector, so a restarted engine whose weights changed must use another
 *  salt (or clear the directory).  *n_removed (may be NULL): host chunks
 *  removed now.
 *  Thread rule: any thread; takes the connector lock (never waits for
 *  copies).  Errors: KVO_EINVAL (NULL c). */
KVO_API int kvo_connector_reset(kvo_connector *c, uint64_t *n_removed);

/** Append generated (or further prompt) tokens to the request's sequence, so
 *  that their chunks can be stored.  Only in token mode.  Errors:
 *  KVO_ENOTFOUND, KVO_ESTATE (hash mode, finished), KVO_ENOMEM. */
KVO_API int kvo_connector_append_tokens(kvo_connector *c, uint64_t id, const uint32_t *tokens, size_t n);
/** Hash mode: append unit hashes; n_tokens_total is the new sequence length. */
KVO_API int kvo_connector_append_unit_hashes(kvo_connector *c, uint64_t id, const kvo_u128 *units, size_t n,
                                     uint64_t n_tokens_total);

typedef enum kvo_hit_status {
    KVO_HIT_NONE = 0,     /* nothing to load: compute from local_tokens */
    KVO_HIT = 1,          /* tokens [local_tokens, tokens) can be loaded */
    KVO_HIT_PENDING = 2   /* chunks being stored would give a longer hit:
                             ask again later (tokens is the hit available now) */
} kvo_hit_status;

typedef struct kvo_lookup_result {
    kvo_hit_status status;
    uint64_t tokens;            /* boundary available now (>= local_tokens) */
    uint64_t tokens_if_pending; /* boundary once in-flight stores land */
    uint64_t local_tokens;      /* as passed */
    uint64_t tokens_host;       /* of [local, tokens): tokens all of whose
                                   chunks are in host memory */
    uint64_t tokens_file;       /* ... that need at least one file-tier chunk
                                   and no remote one */
    int32_t limiting_group;     /* kvo_agree_result.limiting_group */
    kvo_agree_reason reason;
    uint64_t tokens_remote;     /* ... that need at least one remote chunk */
    bool remote_pending;        /* the PENDING status (or part of it) is
                                   remote presence queries in flight */
} kvo_lookup_result;

/** How many tokens of the request's current sequence (the prompt, or after a
 *  preemption everything appended so far) can be loaded, agreed by every
 *  group.  local_tokens: the prefix the engine already holds (its own prefix
 *  cache hit), a multiple of the step.  The hit is any token count up to
 *  n - 1 (n: the sequence length), at most max_hit_tokens (connector) and
 *  local_tokens + max_load_tokens (request) when those are set.  A hit
 *  (status KVO_HIT) pins its
 *  chunks until load(), the next lookup, update, preempt, finish or abort, so that
 *  the load cannot miss.  A PENDING result pins nothing.  A hit on chunks
 *  that only the file tier holds starts reading them into host slots at once
 *  (file -> host); a load issued before the reads finish waits for them (its
 *  completion comes later; a failed read fails the load with tokens_valid =
 *  local_tokens and nothing written).  Those files are pinned in the file
 *  tier while the host slots for them are reserved, so a write-back that
 *  reservation causes never evicts them.  With a remote tier, chunks
 *  neither host nor file holds are asked for with EXISTS queries that run
 *  asynchronously: while some that could lengthen the hit are in flight,
 *  lookup answers KVO_HIT_PENDING (remote_pending set: ask again), for at
 *  most params.remote_lookup_budget_us per request, then what host and file
 *  serve.  A hit on remote chunks reads them into host slots at once
 *  (remote -> host, like file reads; a read that fails fails the load).
 *  Errors: KVO_ENOTFOUND (id), KVO_ESTATE (a load of the request in flight,
 *  or finished), KVO_EINVAL (local_tokens not a multiple of the step or beyond
 *  the sequence). */
KVO_API int kvo_connector_lookup(kvo_connector *c, uint64_t id, uint64_t local_tokens, kvo_lookup_result *out);

/** One group's engine block table. */
typedef struct kvo_block_table {
    const uint64_t *blocks;   /* block ids by block index from token 0 */
    size_t n;
} kvo_block_table;

/** Load the last lookup's hit: tokens [local_tokens, tokens) into the engine
 *  blocks of tables (n_tables = the plan's group count; entries of groups that
 *  are not offloaded are ignored).  tokens must be the lookup's tokens
 *  (load everything) or its local_tokens (decline: unpin, nothing loaded).
 *  Which blocks are written: full groups every block with tokens in
 *  [local, tokens); sliding groups the blocks with tokens in
 *  [max(local, tokens - window), tokens) (the window start rounded down to
 *  a block); state groups the one block holding the state at `tokens`.  The
 *  last block of a full or sliding group may be only partly valid (tokens
 *  not a multiple of its tokens_per_block): it receives whole-block KV for
 *  the same tokens; the engine recomputes from `tokens` over its tail.
 *  Tables must hold ceil(tokens / tokens_per_block) entries per group.  The copies run
 *  asynchronously; a KVO_COMPLETION_LOAD from poll reports the outcome, and
 *  until then the engine must not read or write those blocks.
 *  Errors (nothing issued, the request keeps its pins): KVO_ENOTFOUND,
 *  KVO_ESTATE (no hit pinned by a lookup, no layout), KVO_EINVAL (tokens not
 *  the lookup's, a table shorter than the tokens, KVO_NO_BLOCK or an id >=
 *  the layout's num_blocks where a block is to be written (checked at once,
 *  also for a load that waits for file reads), n_tables wrong), KVO_EAGAIN
 *  (transfer queue full: retry). */
KVO_API int kvo_connector_load(kvo_connector *c, uint64_t id, uint64_t tokens, const kvo_block_table *tables,
                       size_t n_tables);

/** The engine has written KV for tokens [0, computed_tokens) into the blocks of
 *  tables (computed_tokens never decreases, except after preempt).  Stores
 *  every chunk that became complete (and is wanted: see sliding_store and
 *  the request's max_offload_tokens / offload_prompt_only) and whose blocks
 *  the table holds; chunks already stored are skipped.  A draft group's
 *  chunk is stored only once computed_tokens is beyond its end, or at
 *  finish (while the request decodes, the draft KV of the last computed
 *  token is not final: it depends on the token after it).  A chunk whose
 *  store was skipped (no room, transfer queue full, not admitted) is retried
 *  at every later update and at finish while the table still holds its
 *  blocks.  A hit
 *  pinned by lookup and not loaded is released (the engine computes).  Stores
 *  that would need to evict pinned or pending data are skipped and counted.
 *  The engine must not modify or free a block in such a store before
 *  wait_blocks / wait_request / a RELEASED completion says so.
 *  Errors: KVO_ENOTFOUND, KVO_ESTATE (a load in flight, finished, no layout),
 *  KVO_EINVAL (computed beyond the sequence, tables shorter than
 *  computed_tokens, n_tables wrong). */
KVO_API int kvo_connector_update(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables);

/** Store a state snapshot that is not on a block boundary: engine block
 *  `engine_block` of state group `group` holds the state after the
 *  request's first `tokens` tokens (e.g. the end of its prompt).  Later
 *  lookups of any request sharing those tokens may end their hit at
 *  `tokens` (docs/lookup.md); such a load writes the snapshot into the
 *  table entry of the block holding token `tokens - 1` (entry
 *  ceil(tokens / tokens_per_block) - 1, where a block-boundary snapshot at
 *  that position would go) and nothing else of that group.  `tokens` must
 *  be a multiple of tokens_per_hash (the snapshot is keyed by the unit hash
 *  ending there, in a key space no chunk key can reach) within the units
 *  known.  The copy is queued like update's stores (best effort: no room is
 *  counted, never retried); the engine must not modify or free the block
 *  before wait_blocks / wait_request / a RELEASED completion says so.
 *  Thread-safe.  Errors: KVO_ENOTFOUND, KVO_ESTATE (a load in flight,
 *  finished, no layout), KVO_EINVAL (not an offloaded state group, tokens
 *  0, not a multiple of tokens_per_hash or beyond the units known, block
 *  id beyond the layout's num_blocks). */
KVO_API int kvo_connector_store_snapshot(kvo_connector *c, uint64_t id, uint32_t group, uint64_t tokens,
                                         uint64_t engine_block);

/** A block reference for wait_blocks. */
typedef struct kvo_block_ref {
    uint32_t group;
    uint64_t block;
} kvo_block_ref;

/** Block until no store in flight reads any of these engine blocks, so the
 *  engine may free or overwrite them (sliding blocks leaving the window, a
 *  state block updated in place, blocks of a finished request).  Does not
 *  hold the connector lock while waiting.  Errors: KVO_EINVAL. */
KVO_API int kvo_connector_wait_blocks(kvo_connector *c, const kvo_block_ref *blocks, size_t n);

/** Block until every copy of the request has finished (stores and loads). */
KVO_API int kvo_connector_wait_request(kvo_connector *c, uint64_t id);

/** The request is done: store the chunks completed by computed_tokens and
 *  the final checkpoint chunks (sliding CHECKPOINTS policy) from tables (may
 *  be NULL: no final stores), unpin anything pinned, and retire the request
 *  once its copies finish (read kvo_connector_request_stats before: a retired
 *  request is unknown).  *busy
 *  (may be NULL) = true when stores are still in flight: free the request's
 *  blocks only after the KVO_COMPLETION_RELEASED for it (or wait_request);
 *  false: free at once (no RELEASED completion follows).  Errors:
 *  KVO_ENOTFOUND, KVO_EINVAL (tables). */
KVO_API int kvo_connector_finish(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables, bool *busy);

/** Preemption: the engine is about to free the request's blocks and will
 *  compute it again later.  Queued copies are canceled, running ones waited
 *  for; a load in flight (or waiting for file reads) is dropped and no
 *  KVO_COMPLETION_LOAD follows for it; pins are released, computed tokens
 *  reset to 0; the token sequence is kept, and the request may be looked up
 *  again.  A KVO_COMPLETION_LOAD of the request already queued and not yet
 *  polled is removed too: after preempt, the next LOAD the engine polls for
 *  this id is that of a load issued after it.  Blocks may be freed on
 *  return (file reads still running land in host slots, never in engine
 *  blocks).  Errors: KVO_ENOTFOUND. */
KVO_API int kvo_connector_preempt(kvo_connector *c, uint64_t id);

/** Abort: like preempt, then the request is removed (no completion follows;
 *  LOAD completions of it still queued are removed, so a request that
 *  reuses the id never receives one; a queued RELEASED of an earlier,
 *  finished request with this id stays).
 *  Blocks may be freed on return.  Errors: KVO_ENOTFOUND. */
KVO_API int kvo_connector_abort(kvo_connector *c, uint64_t id);

typedef enum kvo_completion_type {
    KVO_COMPLETION_LOAD = 1,     /* a load finished (ok or not) */
    KVO_COMPLETION_RELEASED = 2  /* a finished request's stores are done: its
                                    blocks may be freed */
} kvo_completion_type;

typedef struct kvo_completion {
    uint64_t request;
    uint32_t type;           /* kvo_completion_type */
    int status;              /* 0, or the failure (KVO_ECORRUPT, KVO_EIO,
                                KVO_ECANCELED...) */
    uint64_t tokens_valid;   /* LOAD: tokens [0, tokens_valid) are computed
                                (the hit on success; local_tokens on failure:
                                everything loaded must be recomputed) */
    uint64_t n_invalid_blocks; /* LOAD failure: blocks written by the failed
                                  load (kvo_connector_invalid_blocks) */
} kvo_completion;

/** Process finished copies (completes stores, verifies and completes loads,
 *  writes stored chunks through to the file tier in write-through mode,
 *  finishes file reads and
 *  submits the loads that waited for them) and move up to cap completions for
 *  the engine to out; *n = the count.  Call every step (or when event_fd
 *  is readable).  With a file or remote tier, the connector consumes all of the tier's
 *  completions (leave its write_completions off).  Errors: KVO_EINVAL (NULL
 *  c or n, out NULL with cap > 0). */
KVO_API int kvo_connector_poll(kvo_connector *c, kvo_completion *out, size_t cap, size_t *n);

/** A file descriptor readable when poll may have work (the transfer engine's
 *  eventfd; with a file tier, also watch kvo_file_tier_event_fd, with a
 *  remote tier kvo_remote_tier_event_fd).  Owned by
 *  the connector. */
KVO_API int kvo_connector_event_fd(const kvo_connector *c);

/** The engine blocks of group that the request's last failed load wrote
 *  (their contents are not valid KV).  Writes up to cap, *n = total.
 *  Errors: KVO_ENOTFOUND, KVO_EINVAL. */
KVO_API int kvo_connector_invalid_blocks(kvo_connector *c, uint64_t id, uint32_t group, uint64_t *out, size_t cap,
                                 size_t *n);

/* ------------------------------------------------------------- reporting -- */

typedef struct kvo_request_stats {
    size_t struct_size;   /* sizeof(kvo_request_stats): KVO_REQUEST_STATS_INIT sets it */
    uint64_t prompt_tokens;
    uint64_t tokens;              /* sequence length now */
    uint64_t lookups, pending_lookups;
    uint64_t local_tokens;        /* engine's own prefix at the last load */
    uint64_t tokens_loaded;       /* valid loaded tokens (all loads) */
    uint64_t tokens_loaded_host;  /* of which all chunks came from host */
    uint64_t tokens_loaded_file;  /* of which some chunk came from a file
                                     (and none from the remote tier) */
    uint64_t tokens_computed;     /* prompt tokens the engine computed */
    uint64_t bytes_loaded, bytes_stored;
    uint64_t chunks_loaded, chunks_stored;
    uint64_t stores_skipped;      /* no room (pinned/pending) or queue full */
    uint64_t load_failures;
    uint64_t tokens_loaded_remote; /* of tokens_loaded: some chunk came from
                                      the remote tier (then not counted in
                                      tokens_loaded_file) */
} kvo_request_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_request_stats st = KVO_REQUEST_STATS_INIT; */
#define KVO_REQUEST_STATS_INIT {sizeof(kvo_request_stats)}

/** Statistics of a live (or finished, not yet retired) request.
 *  Errors: KVO_ENOTFOUND. */
KVO_API int kvo_connector_request_stats(kvo_connector *c, uint64_t id, kvo_request_stats *out);

typedef struct kvo_connector_stats {
    size_t struct_size;   /* sizeof(kvo_connector_stats): KVO_CONNECTOR_STATS_INIT sets it */
    uint64_t requests_added, requests_live, requests_finished;
    uint64_t lookups, lookup_hits, lookup_pending, lookup_tokens, hit_tokens;
    uint64_t loads, load_failures, checksum_failures;
    uint64_t tokens_loaded, tokens_loaded_host, tokens_loaded_file;
    uint64_t bytes_loaded, bytes_stored;
    uint64_t chunks_stored, chunks_loaded;
    uint64_t stores_skipped_nospace, stores_skipped_queue, stores_failed;
    uint64_t file_writes, file_reads, file_read_failures;
    uint64_t file_writebacks;     /* of file_writes: chunks queued when the
                                     host tier evicted them (WRITE_BACK) */
    uint64_t file_writes_skipped; /* the file tier held (or was writing)
                                     the chunk already */
    uint64_t file_writes_dropped; /* refused by the file tier when queued:
                                     back-pressure or quota (failures of
                                     queued writes, e.g. ENOSPC, are in the
                                     tier's own statistics) */
    kvo_store_stats host;
    /* remote tier */
    uint64_t tokens_loaded_remote; /* of tokens_loaded (not in _file) */
    uint64_t remote_reads, remote_read_bytes; /* chunks read into host slots */
    uint64_t remote_read_failures; /* reads that failed (absent, corrupt,
                                      node down): those loads failed */
    uint64_t remote_writes, remote_write_bytes; /* puts queued */
    uint64_t remote_writes_dropped; /* refused by the tier: back-pressure,
                                       closing (failures of queued puts are
                                       in the tier's own statistics) */
    uint64_t remote_exists;       /* presence queries queued */
    uint64_t remote_exists_refused; /* not queued (too many in flight) */
    uint64_t remote_lookups_pending; /* lookups answered PENDING because of
                                        remote queries */
    uint64_t remote_budget_expired; /* lookups that answered without the
                                       remote queries still running */
    /* zero-copy write-through (file_zero_copy) */
    uint64_t file_lent_now;       /* host chunks lent to file writes now
                                     (pinned until their completion) */
    uint64_t lookups_wait_lent;   /* lookups answered PENDING: no host slot
                                     for a lower tier's chunk while slots
                                     were lent */
} kvo_connector_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT; */
#define KVO_CONNECTOR_STATS_INIT {sizeof(kvo_connector_stats)}

KVO_API int kvo_connector_get_stats(kvo_connector *c, kvo_connector_stats *out);

/** Rows of per-tenant counters a connector keeps: the first tenants (by
 *  cache_salt) to add a request get one each; later ones count under the
 *  row labelled "other" (memory and metrics stay bounded; every count lands
 *  in some row, so the rows sum to the connector's totals). */
#define KVO_CONNECTOR_TENANTS 32

/** One tenant's counters (kvo_connector_tenant_stats).  The same events as
 *  kvo_connector_stats' fields of the same meaning, for this tenant's
 *  requests only. */
typedef struct kvo_tenant_stats {
    char label[KVO_TENANT_LABEL_MAX]; /* kvo_tenant_label of the requests'
                                         cache_salt ("default": none), or
                                         "other" */
    uint64_t requests;       /* requests added (requests_added) */
    uint64_t lookup_tokens;  /* tokens looked up, every lookup (lookup_tokens) */
    uint64_t hit_tokens;     /* tokens lookups offered to load (hit_tokens) */
    uint64_t loaded_tokens;  /* tokens loaded (tokens_loaded) */
    uint64_t stored_chunks;  /* chunks stored (chunks_stored) */
    uint64_t load_failures;  /* loads that failed (load_failures) */
} kvo_tenant_stats;

/** The per-tenant counters: up to cap rows into out, in the order the
 *  tenants first added a request ("other", when in use, last); *n: the
 *  rows written.  Rows are copied under the connector lock (consistent with
 *  each other).  cap = 0 with out NULL: *n = the rows in use.  Errors:
 *  KVO_EINVAL (NULL c or n, NULL out with cap > 0). */
KVO_API int kvo_connector_tenant_stats(kvo_connector *c, kvo_tenant_stats *out, size_t cap, size_t *n);

/** Write the host tier's READY chunks that the file tier does not hold yet
 *  (lookup first: chunks it holds or is writing are skipped, never
 *  rewritten), then wait until the file tier's queued writes have finished.
 *  For write-back mode before a planned restart (or at destroy, see
 *  file_persist_on_destroy); in write-through mode it writes what
 *  back-pressure dropped.  Paced: waits for the tier's queue to drain
 *  between batches; chunks the tier still refuses (queue or staging memory
 *  full) are retried after another drain as long as each attempt queues
 *  some; chunks refused right after a drain are counted in
 *  file_writes_dropped.
 *  Chunks stored or evicted concurrently may be missed or seen twice
 *  (harmless).  The connector lock is released while waiting; other calls
 *  may run meanwhile.  timeout_ns bounds the whole call (< 0: none).
 *  *n_queued (may be NULL): chunks queued by this call.
 *  Errors: KVO_EINVAL (NULL c), KVO_ESTATE (no file tier), KVO_ETIMEDOUT
 *  (the writes did not finish in time; they continue), KVO_ECLOSED (the
 *  tier is shutting down). */
KVO_API int kvo_connector_flush_to_file(kvo_connector *c, int64_t timeout_ns, uint64_t *n_queued);

/** Events for an external router or index: the host store's stored /
 *  evicted / removed events (kvo_store_drain_events).  Returns the count. */
KVO_API size_t kvo_connector_drain_events(kvo_connector *c, kvo_store_event *out, size_t cap, uint64_t *dropped);

#ifdef __cplusplus
}
#endif
#endif
