/*
 * kvoffload cascade layer: the one way through the tiers.
 *
 * A kvo_cascade owns, for one plan, the path a chunk takes between an
 * engine and kvoffload's tiers: a host tier (an arena of slots indexed by a
 * kvo_store), an optional file tier and an optional remote (Redis Cluster)
 * tier behind it.  Every engine adapter goes through it: the C connector,
 * the vLLM offloading manager and vLLM's secondary tiers, the SGLang HiCache
 * and LMCache back ends.  None of them holds a lookup order, a promotion
 * rule, a retry or a namespace rule of its own.
 *
 * The states of a key (docs/cascade.md has the whole essay):
 *
 *   MISS ---store--> host PENDING --complete_store(ok)--> host READY
 *                                                            |
 *                 write-through at complete_store, or        |
 *                 write-back when the host tier evicts it    v
 *                                              file / remote READY
 *   file / remote READY --lookup PROMOTE / promote--> host PENDING
 *                       --read lands and verifies-->  host READY
 *
 *  - lookup answers, per key, where it is held (HOST, then FILE, then
 *    REMOTE) and whether it is READY, PENDING (a write or a promotion in
 *    flight, or the cluster's answer still out: ask again) or a MISS.  The
 *    host tier and the file tier answer from their in-memory indexes; the
 *    cluster is asked with asynchronous EXISTS queries whose answers are
 *    kept for remote_exists_ttl_ms, and a lookup waits for them only within
 *    a budget the caller carries per request (kvo_cascade_wait).
 *  - Promotion copies lower-tier chunks into host slots: one batch per tier
 *    (one file-tier read call, one pipelined cluster batch), started by
 *    lookup itself (KVO_CASCADE_PROMOTE) or by kvo_cascade_promote, so that
 *    it overlaps the engine's work.  Each promotion ends in one completion.
 *  - Stores reserve host slots (prepare_store) and complete them
 *    (complete_store), which hands the chunks to the lower tiers: the file
 *    tier write-through or write-back, the remote tier always write-through.
 *    Stores that find no host room go through a staging area when one is
 *    configured; writes a tier refuses for back-pressure are retried at
 *    every poll while their bytes are still in host memory; every store
 *    that is dropped in the end is counted.  Nothing here blocks the engine
 *    except the calls whose names say they wait (flush, lookup with a wait).
 *  - Engines with host memory of their own (SGLang, LMCache, vLLM's
 *    secondary tiers) configure no host tier (host_bytes 0) and use the
 *    direct calls: read lower-tier chunks into their memory, write from it.
 *  - Completions of promotions and direct reads are polled from one ring
 *    (kvo_cascade_poll); kvo_cascade_event_fd is one descriptor that is
 *    readable whenever any tier has something for poll.
 *
 * Byte-exact or a miss: every lower-tier read is verified by its tier
 * (header, key, namespace, checksum); a promotion or read that fails is a
 * miss, never wrong bytes.  A key is never READY in the host tier before its
 * bytes are there.
 *
 * Namespaces: kvo_namespace_id derives one 128-bit namespace from the plan's
 * geometry, the model identity as configured, dtype, KV layout and tenant;
 * kvo_namespace_keys turns an engine's own identifiers (vLLM block hashes,
 * SGLang page keys, LMCache object keys) into chunk keys under it.  Two
 * namespaces never share a key (unless 128-bit XXH3 collides), so two models
 * or tenants never read each other's chunks from a shared tier.
 *
 * Thread rule: every function may be called from any thread; one internal
 * mutex guards the cascade's own state and is never held while waiting
 * (flush, lookup's wait, destroy) or while calling user code (there is
 * none).  The tiers given to it are borrowed: their owner creates them,
 * leaves their write_completions off, and destroys them after the cascade.
 * Nobody else may poll them while the cascade lives.
 */
#ifndef KVOFFLOAD_KVO_CASCADE_H
#define KVOFFLOAD_KVO_CASCADE_H

#include "kvo_store.h"
#include "kvo_file_tier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The remote tier (kvo_remote_tier.h, an optional part): only a pointer. */
typedef struct kvo_remote_tier kvo_remote_tier;

/* ------------------------------------------------------------ namespaces -- */

/** What decides the bytes of a chunk beyond the plan's geometry.  Every
 *  field is optional (NULL / 0 = absent); each is hashed with its length,
 *  so no two different descriptions give one namespace by folding,
 *  truncation or concatenation. */
typedef struct kvo_namespace_desc {
    size_t struct_size;        /* sizeof(kvo_namespace_desc): KVO_NAMESPACE_DESC_INIT sets it */
    const char *engine;        /* "vllm", "sglang", "lmcache", "kvoffload" ... */
    const void *model;         /* the model identity as configured (path or
                                  hub id, revision, weights' seed ...), any
                                  bytes */
    size_t model_len;
    const char *dtype;         /* e.g. "bfloat16", "fp8_e4m3" */
    const char *kv_layout;     /* e.g. "NHD", "HND", "layer_first" */
    const void *tenant;        /* tenant / cache salt (bytes) */
    size_t tenant_len;
    const void *extra;         /* anything else that decides the bytes (ranks,
                                  world size, engine version of the format) */
    size_t extra_len;
    uint64_t layout_hash;      /* the engine's slot layout
                                  (kvo_transfer_layout_hash) or 0 */
} kvo_namespace_desc;
/** kvo_namespace_desc d = KVO_NAMESPACE_DESC_INIT; */
#define KVO_NAMESPACE_DESC_INIT {sizeof(kvo_namespace_desc)}

/** The namespace of a plan (its fingerprint: model name and every group's
 *  geometry) under description d: XXH3-128 of a length-prefixed encoding of
 *  "kvoffload-namespace/1", the fingerprint and every field of d.  Pure;
 *  any thread.  Errors: KVO_EINVAL (NULL plan or out, struct_size not set,
 *  a length without its pointer). */
KVO_API int kvo_namespace_id(const kvo_plan *plan, const kvo_namespace_desc *d, kvo_u128 *out);

/** Chunk keys of n engine identifiers under namespace ns: key i =
 *  (XXH3-128 of ns.lo LE64 || ns.hi LE64 || id_len bytes at ids + i *
 *  stride, group).  For engines whose keys are their own hashes or strings
 *  (stride = id_len for a packed array).  Pure; any thread; no
 *  allocation.  Errors: KVO_EINVAL (NULL with n > 0, stride < id_len). */
KVO_API int kvo_namespace_keys(kvo_u128 ns, const void *ids, size_t id_len, size_t stride, size_t n, uint32_t group,
                               kvo_chunk_key *out);

/** Longest tenant label with its NUL ("t-" and 12 hex digits, or "default"). */
#define KVO_TENANT_LABEL_MAX 16

/** The label a tenant's counters go by (metrics, adapters' statistics):
 *  "default" for no salt (len 0), else "t-" and the 12 hex digits of the
 *  top 48 bits of XXH3-64 of the salt.  Never the salt itself: a cache salt
 *  may be a secret; an operator who knows one computes its label.  Two
 *  salts share a label only if their 48-bit hashes collide (counters only:
 *  namespaces keep the whole salt).  Writes at most cap bytes with the NUL
 *  (KVO_TENANT_LABEL_MAX always suffices).  Pure; any thread.  Errors:
 *  KVO_EINVAL (NULL out, or salt NULL with len > 0), KVO_ERANGE (cap too
 *  small: nothing written). */
KVO_API int kvo_tenant_label(const void *salt, size_t len, char *out, size_t cap);

/* --------------------------------------------------------------- cascade -- */

/** Where a key was found. */
typedef enum kvo_tier_id {
    KVO_TIER_NONE = 0,
    KVO_TIER_HOST = 1,
    KVO_TIER_FILE = 2,
    KVO_TIER_REMOTE = 3
} kvo_tier_id;

/** "none", "host", "file", "remote"; "?" otherwise. */
KVO_API const char *kvo_tier_name(kvo_tier_id t);

/** How chunks reach the file tier (when one is given). */
typedef enum kvo_file_mode {
    /* Every chunk whose host store completes is written to the file tier
     * (complete_store).  Default. */
    KVO_FILE_WRITE_THROUGH = 0,
    /* A chunk is written to the file tier only when the host tier evicts it
     * and the file tier lacks it (queued before the slot is reused); chunks
     * still in host memory reach files through kvo_cascade_persist. */
    KVO_FILE_WRITE_BACK = 1
} kvo_file_mode;


/** Most tenants with parts of their own (kvo_cascade_params.tenants). */
#define KVO_CASCADE_TENANTS_MAX 15

/** A tenant's own part of the tiers: a quota and a reservation at once.
 *  Host: its chunks live in host_bytes of their own, evicted only by its
 *  own stores (its own eviction order); no other tenant's traffic evicts
 *  them, and it never holds more than host_bytes.  File: its chunks go to
 *  (and are looked up, read, promoted and removed from) a file tier of its
 *  own, whose quota is its share of the disk.  Tenants without a part
 *  share the rest of each tier.  The remote tier is not parted (one
 *  cluster, Redis's own eviction). */
typedef struct kvo_cascade_tenant {
    const char *label;    /* kvo_tenant_label of the tenant's salt ("t-" and
                             12 hex digits, or "default"): configuration
                             never holds the salt itself */
    uint64_t host_bytes;  /* its host part: 0 (none: it shares the host
                             tier), or at least the largest slot and a
                             multiple of KVO_SLOT_ALIGN */
    kvo_file_tier *file_tier; /* its own file tier (borrowed, as the
                             cascade's: its own root or namespace, its own
                             quota), or NULL: it shares the cascade's.
                             Needs the cascade's file tier too (same thread
                             rule: nobody else polls it) */
} kvo_cascade_tenant;

typedef struct kvo_cascade_params {
    size_t struct_size;           /* sizeof(kvo_cascade_params): kvo_cascade_default_params() sets it */
    const kvo_plan *plan;         /* required; must outlive the cascade */
    /* Host tier.  host_bytes 0: none (the direct calls only). */
    uint64_t host_bytes;          /* slot bytes of the host tier */
    uint64_t staging_bytes;       /* with a lower tier: a further area of the
                                     arena for stores that find no host room:
                                     such a chunk is written to the lower
                                     tiers from it at complete_store and its
                                     slot freed; 0 = none (default) */
    kvo_arena *arena;             /* NULL (default): the cascade maps its own
                                     arena of host_bytes + staging_bytes
                                     (huge_pages ... below).  Else an arena
                                     the caller made (e.g. shared memory with
                                     the engine's workers; borrowed, must
                                     outlive the cascade) of at least that
                                     size: the host tier's slots are at its
                                     offsets [0, host_bytes), staging after */
    bool huge_pages, lock_memory; /* own arena: kvo_arena_params; default false */
    bool prefault;                /* own arena; default true */
    kvo_policy_kind policy;       /* host eviction; default LRU */
    uint32_t admit_after;         /* kvo_store_params.admit_after; default 0 */
    uint32_t event_capacity;      /* host store events kept; default 0 */
    bool ignore_present;          /* kvo_store_params.ignore_present */
    bool lookups_per_key;         /* kvo_store_params.lookups_per_key */
    bool verify_checksums;        /* keep an XXH3-64 per host chunk, taken
                                     when its store or promotion completes;
                                     lower-tier writes check it (a changed
                                     chunk is never written) and
                                     kvo_cascade_verify checks loads;
                                     default false */
    /* Lower tiers (borrowed, see the thread rule). */
    kvo_file_tier *file_tier;
    kvo_file_mode file_mode;      /* default WRITE_THROUGH */
    bool file_zero_copy;          /* WRITE_THROUGH: lend each stored chunk's
                                     host slot to the file tier instead of a
                                     staging copy (pinned until its write
                                     ends); default false */
    kvo_remote_tier *remote_tier;
    uint32_t remote_lookup_budget_us; /* how long lookups carrying one
                                     kvo_cascade_wait count the cluster's
                                     answers still out as PENDING; 0: never;
                                     default 20000 */
    uint32_t remote_exists_ttl_ms;/* how long an EXISTS answer is reused;
                                     0 or default: 1000 */
    uint32_t retry_polls;         /* how many polls a write refused for
                                     back-pressure is retried before it is
                                     dropped (counted); 0 or default: 200 */
    /* Tenant quotas: n_tenants parts (kvo_cascade_tenant).  Host parts are
     * carved out of host_bytes, laid out before the shared part (whose size
     * is host_bytes less theirs and must hold the largest slot).  Part
     * i + 1 is tenants[i]; part 0 is shared.  Copied at create (labels
     * too).  Default none. */
    const kvo_cascade_tenant *tenants;
    uint32_t n_tenants;
} kvo_cascade_params;

KVO_API kvo_cascade_params kvo_cascade_default_params(void);

typedef struct kvo_cascade kvo_cascade;

/** Create a cascade over the given tiers.  *out owned by the caller
 *  (kvo_cascade_destroy).  Errors: KVO_EINVAL (no plan, host_bytes or
 *  staging_bytes below the largest slot when not 0, staging without a
 *  lower tier or a host tier, a borrowed arena smaller than host_bytes +
 *  staging_bytes, no tier at all, a bad mode: the message names the field
 *  and the numbers), KVO_ENOMEM and the arena's and store's errors. */
KVO_API int kvo_cascade_create(const kvo_cascade_params *p, kvo_cascade **out);

/** Wait for every promotion, direct read and lent write still touching the
 *  arena or the caller's memory, retry the deferred writes once, then free
 *  everything (the lower tiers' queued writes keep running in them: flush
 *  them before destroying them).  The caller guarantees no other call is
 *  in progress or follows.  NULL: no-op. */
KVO_API void kvo_cascade_destroy(kvo_cascade *c);

/** The part of the tenant whose salt is salt (len bytes; len 0: no salt):
 *  *part = its index (1..n_tenants) when its label is configured, else 0,
 *  the shared part.  Tag every key of that tenant with it
 *  (kvo_chunk_key.tenant) before passing it to any cascade call: a key's
 *  host entry and files live in the part its tag names; a tag past the last
 *  part is KVO_EINVAL, and a call that reserves host slots (prepare_store,
 *  prepare_load) takes keys of one part only.  Keys tagged inconsistently
 *  are misses, never another key's bytes.  Any thread.  Errors: KVO_EINVAL
 *  (NULL c or part, salt NULL with len > 0). */
KVO_API int kvo_cascade_tenant_part(const kvo_cascade *c, const void *salt, size_t len, uint32_t *part);

/** The store of host-tier part `part` (0: the shared part, as
 *  kvo_cascade_store; a tenant without a host part: the shared one); NULL
 *  past the last part or without a host tier.  Owned by the cascade: for
 *  statistics (kvo_cascade_host_stats sums them; events:
 *  kvo_cascade_drain_events); its slots are arena offsets. */
KVO_API kvo_store *kvo_cascade_part_store(kvo_cascade *c, uint32_t part);

/** The host tier's store statistics over every part (kvo_store_get_stats
 *  of each, summed; segment_bytes the shared part's).  Errors: KVO_EINVAL
 *  (NULL, no host tier, out's struct_size not set). */
KVO_API int kvo_cascade_host_stats(kvo_cascade *c, kvo_store_stats *out);

/** The host tier's pending store events of every part (kvo_store_drain_events
 *  on each in turn: each part's events in order, the parts one after the
 *  other; keys tagged with their part); returns the count, *dropped (may be
 *  NULL) the events dropped since the last drain.  Any thread. */
KVO_API size_t kvo_cascade_drain_events(kvo_cascade *c, kvo_store_event *out, size_t cap, uint64_t *dropped);

/** The parts (owned by the cascade unless given; NULL when absent). */
KVO_API kvo_store *kvo_cascade_store(kvo_cascade *c);
KVO_API kvo_arena *kvo_cascade_arena(kvo_cascade *c);
KVO_API kvo_file_tier *kvo_cascade_file_tier(kvo_cascade *c);
KVO_API kvo_remote_tier *kvo_cascade_remote_tier(kvo_cascade *c);
/** Address of a host (or staging) slot; NULL when there is no arena or the
 *  slot does not fit.  Any thread. */
KVO_API void *kvo_cascade_slot_ptr(kvo_cascade *c, kvo_slot s);

/** A request's wait budget for the cluster's answers: zero-initialise one
 *  per request and pass it to every lookup of that request. */
typedef struct kvo_cascade_wait {
    uint64_t since_ns;   /* when its lookups began waiting (0: not waiting) */
} kvo_cascade_wait;

/* lookup flags */
#define KVO_CASCADE_PREFIX 1u  /* the keys are one chain in order: lower tiers
                                  are asked only up to the first key no tier
                                  holds, the keys after it are MISS */
#define KVO_CASCADE_PROMOTE 2u /* start promoting the lower-tier keys found
                                  READY (with PREFIX: those before the first
                                  miss) into host slots; their completions
                                  carry user data 0 */

typedef struct kvo_cascade_lookup_result {
    size_t prefix;        /* leading keys READY in some tier */
    size_t prefix_if_pending; /* ... counting PENDING as READY */
    size_t host, file, remote; /* of the READY keys: where they were found */
    size_t promoting;     /* promotions this call started */
    bool remote_pending;  /* some PENDING state is an answer still out */
} kvo_cascade_lookup_result;

/** Where each of n keys is: states[i] = KVO_READY, KVO_PENDING or KVO_MISS
 *  (kvo_lookup_state) and tiers[i] (may be NULL) the kvo_tier_id that holds
 *  it (NONE for a miss; for PENDING the tier being written or asked).  Host
 *  hits are not touched (kvo_cascade_touch).  Lower tiers are asked only for
 *  keys the host tier misses and only for groups they hold
 *  (kvo_cascade_set_tier_groups).  Keys the cluster has not answered for
 *  get a query; with wait not NULL they count as PENDING for
 *  remote_lookup_budget_us from the first lookup that waited, after which
 *  they count as MISS until the answers land (the budget starts again once
 *  every answer is in).  With wait_ns > 0 the call itself waits (without
 *  the lock) up to wait_ns for those answers and answers again.  Any thread.
 *  Errors: KVO_EINVAL (NULL with n > 0, a group not offloaded, unknown
 *  flags); nothing started. */
KVO_API int kvo_cascade_lookup(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags,
                               kvo_cascade_wait *wait, int64_t wait_ns, uint8_t *states, uint8_t *tiers,
                               kvo_cascade_lookup_result *out);

/** Promote n lower-tier keys into host slots: reserve a slot per key
 *  (PENDING in the host store; its eviction may write chunks back to the
 *  file tier, never the files being promoted) and queue the reads, one
 *  batch per tier.  tiers[i] (may be NULL: the cascade looks) names the
 *  tier to read from.  results[i] (may be NULL): 0 queued (exactly one
 *  completion with user_data[i] follows); KVO_EEXIST the host tier holds
 *  the key or is receiving it (no completion); KVO_ENOTFOUND the tier does
 *  not hold it; KVO_ENOSPC no host slot free (pinned or pending
 *  everywhere); KVO_EAGAIN no slot while slots are lent to file writes, or
 *  the tier refused (queue full): ask again later.  Returns 0 when every
 *  key was handled, KVO_EINVAL (NULL arguments, no host tier), KVO_ENOMEM. */
KVO_API int kvo_cascade_promote(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint8_t *tiers,
                                const uint64_t *user_data, int *results);

/* Host tier calls (KVO_EINVAL without a host tier).  As the kvo_store
 * calls of the same names (kvo_store.h), all or nothing. */
KVO_API int kvo_cascade_prepare_load(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, kvo_slot *slots);
KVO_API int kvo_cascade_complete_load(kvo_cascade *c, const kvo_chunk_key *keys, size_t n);
KVO_API int kvo_cascade_touch(kvo_cascade *c, const kvo_chunk_key *keys, size_t n);

/** With verify_checksums: whether the n host slots (pinned by
 *  prepare_load) still hold the bytes their stores or promotions left;
 *  bad[i] (may be NULL) = 1 where not; a bad key is retired (never hit
 *  again).  Returns the number of bad keys (0 without verify_checksums). */
KVO_API size_t kvo_cascade_verify(kvo_cascade *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n,
                                  uint8_t *bad);

/* prepare_store: what to do with key i (need[i]) */
#define KVO_CASCADE_SKIP 0    /* held already (or being stored), or not admitted */
#define KVO_CASCADE_HOST 1    /* write it into host slot slots[i] */
#define KVO_CASCADE_STAGED 2  /* write it into staging slot slots[i]: it goes
                                 to the lower tiers only */
#define KVO_CASCADE_REFUSED 3 /* no room anywhere: not stored (counted) */
/* prepare_store flags */
#define KVO_CASCADE_ALL_OR_NOTHING 1u /* KVO_ENOSPC unless the host tier takes
                                         every key that needs a slot */

/** Reserve slots for a batch about to be written (the keys then PENDING).
 *  The host tier takes what it has room for (the longest leading part of
 *  the batch when it cannot take all), the staging area the rest, and what
 *  neither can take is REFUSED (counted in stores_refused).  Host slots are
 *  made by evicting READY entries; in write-back mode the evicted chunks the
 *  file tier lacks are queued to it before this returns.  Errors:
 *  KVO_EINVAL (NULL, n 0, bad group, duplicate key, no host tier),
 *  KVO_ENOSPC (ALL_OR_NOTHING and no room; nothing changed). */
KVO_API int kvo_cascade_prepare_store(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags,
                                      uint8_t *need, kvo_slot *slots);

/** Finish writes started by prepare_store (HOST or STAGED keys; others are
 *  ignored): ok -> host keys READY (checksums taken) and every chunk handed
 *  to the lower tiers (file: write-through, zero-copy when configured;
 *  remote: put); staged slots are freed once their writes are queued.
 *  !ok -> the entries are removed.  Writes a tier refuses for back-pressure
 *  are retried at later polls while their bytes are in memory.  Errors:
 *  KVO_EINVAL (NULL, bad group), KVO_ESTATE (a key neither PENDING nor
 *  READY in the host tier nor staged: nothing changed). */
KVO_API int kvo_cascade_complete_store(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool ok);

/** The slots of keys reserved by prepare_store and not yet completed, as
 *  prepare_store gave them (arena offsets; staged keys after host_bytes);
 *  slots[i] = {0, 0} for a key not being stored.  For a caller whose
 *  writers report failed writes by slot (a worker process that knows
 *  offsets, not keys): match them here, then complete those keys !ok.
 *  Reads only.  Any thread (takes the cascade's lock).  Errors: KVO_EINVAL
 *  (NULL, n 0, no host tier). */
KVO_API int kvo_cascade_pending_slots(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, kvo_slot *slots);

/** Remove keys from every tier: host (READY and unpinned go now, pinned
 *  ones are retired: hidden, gone at their last unpin) and file
 *  (kvo_file_tier_remove; a file being written stays) at once, the remote
 *  tier by a queued DEL (kvo_remote_tier_remove).  results[i] (may be
 *  NULL): with user_data given, 0 = a completion (op
 *  KVO_CASCADE_OP_REMOVE, user_data[i]) follows once every tier is done:
 *  result 0 removed from some tier, KVO_ENOTFOUND no tier held it, KVO_EIO
 *  the remote tier failed (its value may remain); a key with no remote
 *  part completes at once (queued before this returns).  Without
 *  user_data: 0 removed or asked to be, KVO_ENOTFOUND held by no local
 *  tier (the remote DELs' outcomes are not reported).  KVO_EAGAIN: the
 *  remote tier refused the DEL (too many in flight; local tiers done).
 *  Errors: KVO_EINVAL, KVO_ENOMEM. */
KVO_API int kvo_cascade_remove(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint64_t *user_data,
                               int *results);

/* -------------------------------------------------- direct (engine memory) */

/** Read n keys from the lower tiers into dsts[i] (room for the group's
 *  slot_bytes; stays untouched by the caller until the completion): the
 *  file tier when it holds the key, else the remote tier; a file read that
 *  fails goes on to the remote tier.  A key the remote tier serves is also
 *  written to the file tier.  results[i] (may be NULL): 0 queued (one
 *  completion with user_data[i] and the tier that served it follows;
 *  result 0 means dsts[i] holds the verified chunk); KVO_ENOTFOUND no tier
 *  holds it; KVO_EAGAIN refused (queue full).  Returns 0, KVO_EINVAL. */
KVO_API int kvo_cascade_read(kvo_cascade *c, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                             const uint64_t *user_data, int *results);

/** Write n chunks (srcs[i]: the group's chunk_bytes) to every lower tier;
 *  the tiers copy them before this returns.  While a tier refuses for
 *  back-pressure, waits (without the lock) for its queue to drain and
 *  retries, up to timeout_ns (0: no wait).  results[i] (may be NULL): 0
 *  queued by some tier, KVO_EEXIST held already, else why every tier
 *  refused (counted).  Returns 0, KVO_EINVAL. */
KVO_API int kvo_cascade_write(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                              int64_t timeout_ns, int *results);

/** kvo_cascade_write without waiting and without a copy kept by the caller
 *  beyond the write: the caller lends srcs[i] until the key's completion
 *  (op KVO_CASCADE_OP_WRITE, user_data[i]; result 0 when some tier queued
 *  it or held it, else why none did), which comes once every lower tier
 *  took the chunk or dropped it.  Tiers that refuse for back-pressure are
 *  asked again at later polls (retry_polls times) from the lent memory.
 *  For engines whose rows stay pinned until a job is reported (vLLM's
 *  secondary tiers).  results[i] (may be NULL): 0 (a completion follows,
 *  possibly already queued) or KVO_EINVAL.  Returns 0, KVO_EINVAL (NULL
 *  arguments, no lower tier). */
KVO_API int kvo_cascade_write_async(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                                    const uint64_t *user_data, int *results);

/* ----------------------------------------------------------- completions -- */

typedef enum kvo_cascade_op {
    KVO_CASCADE_OP_PROMOTE = 1, /* a lower-tier chunk into a host slot */
    KVO_CASCADE_OP_READ = 2,    /* kvo_cascade_read into caller memory */
    KVO_CASCADE_OP_WRITE = 3,   /* kvo_cascade_write_async: the lent memory is free */
    KVO_CASCADE_OP_REMOVE = 4   /* kvo_cascade_remove with user data: every tier done */
} kvo_cascade_op;

typedef struct kvo_cascade_completion {
    uint64_t user_data;
    kvo_chunk_key key;
    uint32_t op;          /* kvo_cascade_op */
    uint32_t tier;        /* kvo_tier_id that served (or failed) it */
    int result;           /* 0 (host entry READY / dsts filled), or a miss:
                             KVO_ENOTFOUND, KVO_ECORRUPT, KVO_EIO,
                             KVO_ESTATE (invalidated while in flight),
                             KVO_ECANCELED */
    uint64_t bytes;       /* payload bytes moved */
    uint64_t latency_ns;  /* from the call that started it */
} kvo_cascade_completion;

/** Drive the cascade and collect completions: consume every tier's
 *  completions (finishing promotions into host entries, lent writes,
 *  presence answers), retry deferred writes, then move up to cap
 *  completions to out (oldest first); *n = the count.  Never blocks.  Call
 *  it every engine step, or when the event fd is readable.  Errors:
 *  KVO_EINVAL (NULL c or n, out NULL with cap > 0). */
KVO_API int kvo_cascade_poll(kvo_cascade *c, kvo_cascade_completion *out, size_t cap, size_t *n);

/** One descriptor, readable while any tier has completions for poll (an
 *  epoll set over the tiers' eventfds and the cascade's own).  Owned by the
 *  cascade. */
KVO_API int kvo_cascade_event_fd(const kvo_cascade *c);

/** Block until poll has work or timeout_ns passes (< 0: forever).
 *  0 or KVO_ETIMEDOUT. */
KVO_API int kvo_cascade_wait_events(kvo_cascade *c, int64_t timeout_ns);

/** Wait until every write queued so far has left every tier's queue (the
 *  deferred ones retried until queued or dropped).  timeout_ns < 0:
 *  forever.  0 or KVO_ETIMEDOUT. */
KVO_API int kvo_cascade_flush(kvo_cascade *c, int64_t timeout_ns);

/** Write the host tier's READY chunks the file tier lacks (its lookup
 *  first), paced by the tier's queue, then flush it: write-back before a
 *  restart.  *n_queued (may be NULL): chunks queued.  Errors: KVO_ESTATE
 *  (no file tier or no host tier), KVO_ETIMEDOUT, KVO_ECLOSED. */
KVO_API int kvo_cascade_persist(kvo_cascade *c, int64_t timeout_ns, uint64_t *n_queued);

/* --------------------------------------------------------------- control -- */

/** Use a lower tier (KVO_TIER_FILE or KVO_TIER_REMOTE) only for the groups
 *  whose bit is set in groups (default: every offloaded group): a tier that
 *  holds another slot format of a group is neither asked, read nor written
 *  for it.  Errors: KVO_EINVAL. */
KVO_API int kvo_cascade_set_tier_groups(kvo_cascade *c, kvo_tier_id tier, uint64_t groups);

/** The chunks of the groups in `groups` are no longer valid (a weight
 *  update, a slot format change): their promotions and direct reads still
 *  in flight complete with KVO_ESTATE and leave no host entry, their
 *  deferred writes are dropped, their READY host entries are removed
 *  (pinned ones retired).  Lower tiers keep their files (namespace them
 *  anew to stop hitting them).  *n_removed (may be NULL): host entries
 *  removed now.  Errors: KVO_EINVAL. */
KVO_API int kvo_cascade_invalidate(kvo_cascade *c, uint64_t groups, uint64_t *n_removed);

/* ------------------------------------------------------------- counters -- */

typedef struct kvo_cascade_tier_stats {
    uint64_t hits;            /* keys lookup found READY here */
    uint64_t promotions;      /* chunks promoted from here into host slots */
    uint64_t promotion_failures; /* ... that failed (a miss) */
    uint64_t reads, read_bytes;  /* direct reads served from here */
    uint64_t read_failures;
    uint64_t writes, write_bytes; /* chunks queued to this tier */
    uint64_t writes_skipped;  /* held (or being written) already */
    uint64_t writebacks;      /* of writes: evicted from host (write-back) */
    uint64_t writes_deferred; /* refused for back-pressure, retried later */
    uint64_t writes_dropped;  /* refused for good (back-pressure past the
                                 retries, quota, closing, the slot reused
                                 before the retry) */
    uint64_t lent;            /* file: zero-copy writes lent from host slots */
} kvo_cascade_tier_stats;

typedef struct kvo_cascade_stats {
    size_t struct_size;   /* sizeof(kvo_cascade_stats): KVO_CASCADE_STATS_INIT sets it */
    kvo_cascade_tier_stats host, file, remote;
    uint64_t lookups;               /* calls */
    uint64_t remote_exists;         /* presence queries queued */
    uint64_t remote_exists_refused; /* not queued (too many in flight) */
    uint64_t remote_budget_expired; /* lookups that answered without answers still out */
    uint64_t stores_offered, stores_host, stores_staged, stores_refused;
    uint64_t checksum_failures;     /* verify_checksums mismatches */
    uint64_t promotions_now, reads_now, deferred_now, lent_now, staged_now; /* in flight now */
} kvo_cascade_stats;
#define KVO_CASCADE_STATS_INIT {sizeof(kvo_cascade_stats)}

/** A consistent snapshot of the counters.  Errors: KVO_EINVAL. */
KVO_API int kvo_cascade_get_stats(kvo_cascade *c, kvo_cascade_stats *out);

#ifdef __cplusplus
}
#endif
#endif
