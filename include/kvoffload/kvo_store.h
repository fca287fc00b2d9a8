/*
 * kvoffload store layer: the index of stored chunks, their slots in a byte
 * range, and eviction.
 *
 * A kvo_store manages `capacity_bytes` of slot space (offsets 0..capacity) for
 * the chunks of every offloaded group of one plan.  It does not own memory: a
 * tier pairs it with memory (kvo_arena for host memory) or with files.  Each
 * chunk takes a slot of its own group's slot_bytes (kvo_group_plan); no chunk
 * reserves room for another group.
 *
 * Entry states: absent (MISS) -> prepare_store -> PENDING (write in flight,
 * not loadable) -> complete_store(ok) -> READY; complete_store(fail) removes.
 * READY entries may be pinned by prepare_load (pin count); pinned and PENDING
 * entries are never evicted.
 *
 * Slot space is cut into equal segments; each segment holds slots of one slot
 * size (groups with equal slot_bytes share segments) and segments move
 * between sizes as the mix of stored groups changes (see src/store/slots.c
 * for the design and its fragmentation bound; docs/store.md).
 *
 * Thread rule: every function is safe to call from any thread; a store is
 * protected by one internal mutex held for the duration of a batch call and
 * never while calling out (the store calls no user code).  Batch calls are
 * all-or-nothing: on error nothing changed (no entry added, removed, pinned
 * or unpinned; statistics other than the rejected-store counter unchanged).
 * Every batch call rejects n == 0 and NULL arrays with KVO_EINVAL, and keys
 * naming a group that is unknown or not offloaded with KVO_EINVAL.
 */
#ifndef KVOFFLOAD_KVO_STORE_H
#define KVOFFLOAD_KVO_STORE_H

#include "kvo_keys.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvo_policy_kind {
    KVO_POLICY_LRU = 0,    /* default */
    KVO_POLICY_ARC = 1,
    KVO_POLICY_S3FIFO = 2,
    KVO_POLICY_PREFIX = 3, /* prefix-aware: evicts a request's chain from its leaf end and
                              protects reused prefixes when its simulations show that this
                              beats LRU, falling back to LRU when it does not
                              (src/store/policy_prefix.c, docs/replay.md); keeps 4x as many
                              ghost keys as entries */
    KVO_POLICY_ENSEMBLE = 4, /* removed: kvo_store_create fails with KVO_EINVAL (use PREFIX) */
    KVO_POLICY_BRANCH = 5  /* an alias of KVO_POLICY_PREFIX (kept for ABI) */
} kvo_policy_kind;

/** "lru", "arc", "s3fifo", "prefix" ("prefix" for KVO_POLICY_BRANCH too; "?"
 *  for a removed or unknown value).  Static strings. */
KVO_API const char *kvo_policy_name(kvo_policy_kind k);
/** Parse a policy name: "lru", "arc", "s3fifo" (or "s3-fifo"), "prefix", and
 *  "branch" as an alias of "prefix".  Errors: KVO_EINVAL listing the names
 *  ("ensemble", a removed policy, gets a message that names prefix). */
KVO_API int kvo_policy_parse(const char *name, kvo_policy_kind *out);

typedef struct kvo_store_params {
    size_t struct_size;   /* sizeof(kvo_store_params): kvo_store_default_params() sets it */
    const kvo_plan *plan;       /* required; must outlive the store */
    uint64_t capacity_bytes;    /* required, >= the largest slot_bytes */
    kvo_policy_kind policy;     /* default LRU */
    uint32_t admit_after;       /* store a chunk only once it was looked up this
                                   many times (0 or 1: always); default 0 */
    uint64_t max_entries;       /* most entries held; 0 = as many as slots fit
                                   (capacity / smallest slot).  A smaller value
                                   bounds the index; stores then evict to free
                                   entries as well as bytes */
    uint32_t event_capacity;    /* events kept until drained; 0 = no events.
                                   When full, the oldest are dropped and counted */
    uint64_t segment_bytes;     /* 0 = automatic (recommended): the segment size
                                   that wastes least for this plan and capacity */
    bool ignore_present;        /* false (default): prepare_store counts the
                                   batch's present READY keys as used (moved to
                                   the recent end) and never evicts them for
                                   the batch.  true: it leaves them alone, as
                                   vLLM's offloading manager does (no recency
                                   change; they may be evicted to make room);
                                   callers mark hits used with touch.  On the
                                   Mooncake trace (LRU, 10k blocks, hits
                                   touched) true gives vLLM's 42.39 %. */
    bool policy_admission;      /* accepted and ignored: no current policy
                                   turns a key away (the connector still sets
                                   it when the host tier is the last tier) */
    bool lookups_per_key;       /* accepted and ignored by the current
                                   policies: says that lookups come one key at
                                   a time (vLLM's OffloadingManager.lookup) */
    uint64_t base_offset;       /* added to every slot offset the store hands
                                   out: a store over [base_offset, base_offset
                                   + capacity_bytes) of a larger arena (a
                                   multiple of KVO_SLOT_ALIGN); default 0 */
} kvo_store_params;

KVO_API kvo_store_params kvo_store_default_params(void);

typedef struct kvo_store kvo_store;

/** Create a store.  *out owned by the caller (kvo_store_destroy).  All memory
 *  is allocated here: about 112 bytes per entry (max_entries: a 64-byte entry
 *  and 32 bytes of index, rounded up; twice that with ARC or S3-FIFO and five
 *  times with prefix, whose ghost keys take entries too, plus its ~4 MiB of
 *  simulations) plus 8 bytes per slot.
 *  Errors: KVO_EINVAL (no plan, a plan that offloads nothing, capacity below
 *  the largest slot: message names the group and sizes, a bad or removed
 *  policy (KVO_POLICY_ENSEMBLE), or segment_bytes), KVO_ERANGE (over 2^30
 *  entries), KVO_ENOMEM. */
KVO_API int kvo_store_create(const kvo_store_params *p, kvo_store **out);
/** Destroy; the caller guarantees no call is in progress.  NULL is a no-op. */
KVO_API void kvo_store_destroy(kvo_store *s);
/** The plan the store was created with (borrowed). */
KVO_API const kvo_plan *kvo_store_plan(const kvo_store *s);
/** capacity_bytes as given. */
KVO_API uint64_t kvo_store_capacity(const kvo_store *s);

typedef enum kvo_lookup_state {
    KVO_MISS = 0,
    KVO_READY = 1,
    KVO_PENDING = 2   /* write in flight: ask again later */
} kvo_lookup_state;

/** A slot: a byte range of the store's space. */
typedef struct kvo_slot {
    uint64_t offset;
    uint64_t bytes;   /* the group's slot_bytes */
} kvo_slot;

/** Per key: MISS, READY or PENDING into states[i] (n entries, caller-owned).
 *  Counts hits/misses, feeds admission counters; does not change recency (use
 *  touch).  Errors: KVO_EINVAL (NULL, n 0, unknown or non-offloaded group id;
 *  nothing counted). */
KVO_API int kvo_store_lookup(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *states);

/** Reserve slots for a batch about to be written.  For each key: need[i] = 1
 *  and slots[i] set when the key must be written (it becomes PENDING); need[i]
 *  = 0 (slots[i] zeroed) when it is already present (READY or PENDING) or not
 *  yet admitted.  Slots follow key order.  Room is made by evicting unpinned
 *  READY entries not in this batch (present READY keys of the batch count as
 *  used now); evicted keys and their (old) slots are written to
 *  evicted/evicted_slots (evicted_cap entries; with ignore_present they
 *  are neither touched nor protected) so a lower tier can copy them
 *  before the slots are reused; evicted and evicted_slots may both be NULL
 *  with evicted_cap 0 when the caller does not need them (the events still
 *  record evictions).  Beyond the bytes it needs, one call evicts at most, per
 *  segment it needs, a walk budget (32 segments, at most 1/32 of the store)
 *  plus one segment (kvo_store_stats.segment_bytes).  All arrays are
 *  caller-owned; n_evicted may be NULL.
 *  All-or-nothing: KVO_ENOSPC (nothing changed; message says how many bytes
 *  were needed and how many are pinned or pending), KVO_EINVAL (NULL, n 0,
 *  bad group, duplicate key in the batch), KVO_ERANGE (evicted buffer too
 *  small: nothing changed, *n_evicted = the count that was needed). */
KVO_API int kvo_store_prepare_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots,
                            kvo_chunk_key *evicted, kvo_slot *evicted_slots, size_t evicted_cap,
                            size_t *n_evicted);

/** Finish writes started by prepare_store: ok -> READY (a STORED event);
 *  !ok -> the entries are removed and their slots freed (REMOVED events).
 *  Keys already READY are left as they are (no event, not an error, for ok
 *  and !ok alike: a second completion of the same write, as vLLM's manager
 *  allows).  Every other key must be PENDING (absent -> KVO_ESTATE, nothing
 *  changed); a PENDING key given twice -> KVO_EINVAL. */
KVO_API int kvo_store_complete_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, bool ok);

/** Pin READY keys for reading and return their slots (slots[i] for keys[i];
 *  a key given twice is pinned twice).  A pinned entry counts as used when it
 *  is unpinned.  Any key not READY -> KVO_ENOTFOUND (absent) or KVO_EAGAIN
 *  (PENDING), nothing pinned. */
KVO_API int kvo_store_prepare_load(kvo_store *s, const kvo_chunk_key *keys, size_t n, kvo_slot *slots);
/** Unpin keys pinned by prepare_load.  KVO_ESTATE if one is not pinned. */
KVO_API int kvo_store_complete_load(kvo_store *s, const kvo_chunk_key *keys, size_t n);

/** Mark keys as used now (recency/frequency).  Absent and PENDING keys are
 *  ignored (bad group ids are still KVO_EINVAL). */
KVO_API int kvo_store_touch(kvo_store *s, const kvo_chunk_key *keys, size_t n);
/** Remove READY unpinned keys (absent ones ignored).  KVO_EBUSY if one is
 *  pinned or pending (nothing removed). */
KVO_API int kvo_store_remove(kvo_store *s, const kvo_chunk_key *keys, size_t n);
/** Remove keys whose data is known bad or gone (a file that failed
 *  verification), even while readers pin them: an unpinned READY key is
 *  removed now (a REMOVED event); a pinned one is retired, that is hidden at
 *  once (lookup says MISS, prepare_load and peek KVO_ENOTFOUND, scan lists
 *  it as MISS while its slot is held, prepare_store reports it present and
 *  skips it, remove ignores it) and
 *  removed when its last pin is released.  Absent and PENDING keys are
 *  ignored.  Errors: KVO_EINVAL (NULL, n 0, bad group); nothing changed. */
KVO_API int kvo_store_retire(kvo_store *s, const kvo_chunk_key *keys, size_t n);
/** Remove every READY unpinned entry (REMOVED events); returns how many
 *  remain (pinned/pending).  Work proportional to the entries. */
KVO_API size_t kvo_store_clear(kvo_store *s);

/** One entry as seen by iteration. */
typedef struct kvo_store_entry {
    kvo_chunk_key key;
    kvo_slot slot;
    uint8_t state;     /* kvo_lookup_state; MISS: retired, its slot held
                          until the last unpin (kvo_store_retire) */
    uint32_t pins;
} kvo_store_entry;
/** Iterate in chunks: start with *cursor = 0; fills up to cap entries, sets
 *  *n; *cursor = 0 after the last.  Concurrent changes may be missed or seen
 *  twice, never crash.  Errors: KVO_EINVAL (NULL, cap 0). */
KVO_API int kvo_store_scan(kvo_store *s, uint64_t *cursor, kvo_store_entry *out, size_t cap, size_t *n);
/** One key's entry without counting a lookup or changing recency.
 *  Errors: KVO_EINVAL (NULL, bad group), KVO_ENOTFOUND (absent). */
KVO_API int kvo_store_peek(kvo_store *s, const kvo_chunk_key *key, kvo_store_entry *out);

typedef enum kvo_store_event_type {
    KVO_EVENT_STORED = 1,   /* became READY */
    KVO_EVENT_EVICTED = 2,  /* evicted to make room */
    KVO_EVENT_REMOVED = 3   /* removed by remove/clear/failed store */
} kvo_store_event_type;

typedef struct kvo_store_event {
    uint32_t type;
    kvo_chunk_key key;
} kvo_store_event;

/** Move up to cap pending events to out (oldest first); returns the count
 *  (0 for a NULL store or out).  *dropped (may be NULL) receives how many
 *  were dropped since the last drain and resets that count. */
KVO_API size_t kvo_store_drain_events(kvo_store *s, kvo_store_event *out, size_t cap, uint64_t *dropped);

typedef struct kvo_store_group_stats {
    uint64_t chunks;          /* entries of this group (any state) */
    uint64_t bytes_used;      /* chunks * slot_bytes */
    uint64_t capacity_chunks; /* chunks of this group that fit in an empty store */
    uint64_t slot_bytes;      /* the group's slot size (0: not offloaded) */
    uint64_t hits, misses, stores, evictions;
} kvo_store_group_stats;

typedef struct kvo_store_stats {
    size_t struct_size;   /* sizeof(kvo_store_stats): KVO_STORE_STATS_INIT sets it */
    uint64_t capacity_bytes;
    uint64_t bytes_used;      /* slot bytes held by entries */
    uint64_t bytes_reserved;  /* bytes no slot can use: the tails of segments
                                 (segment_bytes mod slot size) and of the
                                 capacity (capacity mod segment_bytes) */
    uint64_t entries, pinned, pending;
    uint64_t hits, misses, pending_hits;
    uint64_t stores, store_skipped_present, store_not_admitted, rejected_stores;
    uint64_t evictions, removals, events_dropped;
    uint64_t segment_bytes;   /* the slot-space segment size chosen */
    uint64_t segments, segments_free;
    size_t n_groups;
    kvo_store_group_stats groups[KVO_MAX_GROUPS];
} kvo_store_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_store_stats st = KVO_STORE_STATS_INIT; */
#define KVO_STORE_STATS_INIT {sizeof(kvo_store_stats)}

/** A consistent snapshot of the counters.  Errors: KVO_EINVAL (NULL). */
KVO_API int kvo_store_get_stats(kvo_store *s, kvo_store_stats *out);

/* ---------------------------------------------------------------- arena -- */

/** Host memory for a store's slots: one region, allocated once, pre-faulted. */
typedef struct kvo_arena_params {
    size_t struct_size;   /* sizeof(kvo_arena_params): kvo_arena_default_params() sets it */
    uint64_t bytes;          /* required */
    bool huge_pages;         /* try MAP_HUGETLB, else madvise(MADV_HUGEPAGE) */
    bool lock;               /* mlock the region (fails if RLIMIT_MEMLOCK is low) */
    bool prefault;           /* touch every page at creation (default true) */
    const char *shm_path;    /* NULL: anonymous memory; else a file (e.g. under
                                /dev/shm) that several processes map shared:
                                created (0600) and sized when absent or empty,
                                mapped as is when it already has exactly
                                `bytes`.  An existing file must be a regular
                                file of this uid with mode 0600 and no
                                symbolic link may be at the name (O_NOFOLLOW):
                                else KVO_ESTATE naming path, owner and mode,
                                so another local user cannot plant the file
                                (docs/security.md) */
    bool shm_unlink;         /* unlink shm_path when this arena is destroyed */
    bool require_huge_pages; /* huge_pages: fail (KVO_ENOTSUP) instead of
                                falling back to normal pages */
    /* Owned sharing between the processes of ONE engine (shm_path given and
     * share_processes > 0; else shm_path behaves as above).  The file holds a
     * 4096-byte header before the `bytes` of slot space (base and slots
     * exclude it): the plan fingerprint, a random instance id, the processes
     * expected and attached and their pids.  The first process creates the
     * file (O_EXCL), the others wait for its header and must ask for the same
     * bytes and fingerprint (else KVO_ESTATE: another engine's arena); the
     * last of share_processes to attach unlinks the name, so the memory lives
     * only as long as the mappings (a crash leaves nothing behind) and nobody
     * else can attach.  A file whose recorded processes are all dead (a crash
     * during start-up) is removed and created afresh.  shm_unlink is
     * ignored: the creator removes the name at destroy if it is still there
     * and still its own.  See docs/python.md. */
    uint32_t share_processes;
    kvo_u128 share_fingerprint;  /* e.g. kvo_plan_fingerprint(plan) */
    uint32_t share_timeout_ms;   /* how long a non-creator waits for the
                                    creator's header; 0 = 60000 */
} kvo_arena_params;

KVO_API kvo_arena_params kvo_arena_default_params(void);

typedef struct kvo_arena kvo_arena;
/** Map the region once (never grown, never moved).  *out owned by the caller.
 *  Thread rule: the arena has no mutable state after creation; every accessor
 *  is safe from any thread.  Errors: KVO_EINVAL (NULL, bytes 0, shm file of
 *  another size), KVO_ENOMEM (mmap failed, message says how much),
 *  KVO_EIO (shm file), KVO_ESTATE (shm file of another uid, with group or
 *  other permissions, or a symbolic link; owned sharing: another engine's),
 *  KVO_ENOTSUP (lock/huge pages refused when required). */
KVO_API int kvo_arena_create(const kvo_arena_params *p, kvo_arena **out);
/** Unmap (and unlink when asked).  NULL is a no-op.  Slot pointers die here. */
KVO_API void kvo_arena_destroy(kvo_arena *a);
/** Whether the region got huge pages (MAP_HUGETLB) / is mlocked. */
KVO_API bool kvo_arena_huge(const kvo_arena *a);
KVO_API bool kvo_arena_locked(const kvo_arena *a);
/** Base address (64-byte aligned at least; 4096 in practice) and size. */
KVO_API void *kvo_arena_base(const kvo_arena *a);
KVO_API uint64_t kvo_arena_size(const kvo_arena *a);
/** Address of a slot: base + slot.offset, or NULL if it does not fit. */
KVO_API void *kvo_arena_slot(const kvo_arena *a, kvo_slot slot);
/** Owned sharing: whether this process created the file, and the instance
 *  id its creator chose (zero when not shared this way).  Any thread. */
KVO_API bool kvo_arena_creator(const kvo_arena *a);
KVO_API kvo_u128 kvo_arena_instance(const kvo_arena *a);
/** Remove files named dir/<prefix>* that are owned-sharing arenas none of
 *  whose recorded processes is alive (left by a crash during start-up);
 *  *n_removed (may be NULL) = how many; also files whose creator died
 *  between writing the header and attaching.  Files in use, files without a
 *  valid header younger than 10 s, files of other users and other files are
 *  left alone.  Errors:
 *  KVO_EINVAL (NULL dir or prefix), KVO_EIO (dir cannot be read). */
KVO_API int kvo_arena_sweep_stale(const char *dir, const char *prefix, size_t *n_removed);

#ifdef __cplusplus
}
#endif
#endif
