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
 * Thread rule: every function is safe to call from any thread; a store is
 * protected by one internal lock held for the duration of a batch call and
 * never while calling out.  Batch calls are all-or-nothing: on error nothing
 * changed.
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
    KVO_POLICY_S3FIFO = 2
} kvo_policy_kind;

/** "lru", "arc", "s3fifo". */
const char *kvo_policy_name(kvo_policy_kind k);
/** Parse a policy name.  Errors: KVO_EINVAL listing the names. */
int kvo_policy_parse(const char *name, kvo_policy_kind *out);

typedef struct kvo_store_params {
    const kvo_plan *plan;       /* required; must outlive the store */
    uint64_t capacity_bytes;    /* required, >= the largest slot_bytes */
    kvo_policy_kind policy;     /* default LRU */
    uint32_t admit_after;       /* store a chunk only once it was looked up this
                                   many times (0 or 1: always); default 0 */
    uint64_t max_entries;       /* index capacity; 0 = capacity / smallest slot */
    uint32_t event_capacity;    /* events kept until drained; 0 = no events.
                                   When full, the oldest are dropped and counted */
} kvo_store_params;

kvo_store_params kvo_store_default_params(void);

typedef struct kvo_store kvo_store;

/** Create a store.  *out owned by the caller (kvo_store_destroy).
 *  Errors: KVO_EINVAL (no plan, capacity below the largest slot: message names
 *  the group and sizes), KVO_ENOMEM. */
int kvo_store_create(const kvo_store_params *p, kvo_store **out);
/** Destroy; the caller guarantees no call is in progress. */
void kvo_store_destroy(kvo_store *s);

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

/** Per key: MISS, READY or PENDING into states[i].  Counts hits/misses, feeds
 *  admission counters; does not change recency (use touch).  Errors:
 *  KVO_EINVAL (NULL, unknown or non-offloaded group id). */
int kvo_store_lookup(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *states);

/** Reserve slots for a batch about to be written.  For each key: need[i] = 1
 *  and slots[i] set when the key must be written (it becomes PENDING); need[i]
 *  = 0 when it is already present (READY or PENDING) or not yet admitted.
 *  Room is made by evicting unpinned READY entries not in this batch; evicted
 *  keys and their (old) slots are written to evicted/evicted_slots (cap
 *  entries; pass cap >= n * 64 or check the error) so a lower tier can copy
 *  them before the slots are reused.  All-or-nothing: KVO_ENOSPC (nothing
 *  changed; message says how many bytes were needed and how many are pinned or
 *  pending), KVO_EINVAL (NULL, bad group, duplicate key in the batch),
 *  KVO_ERANGE (evicted buffer too small; nothing changed). */
int kvo_store_prepare_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots,
                            kvo_chunk_key *evicted, kvo_slot *evicted_slots, size_t evicted_cap,
                            size_t *n_evicted);

/** Finish writes started by prepare_store: ok -> READY; !ok -> the entries are
 *  removed and their slots freed.  Every key must be PENDING (else KVO_ESTATE,
 *  nothing changed). */
int kvo_store_complete_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, bool ok);

/** Pin READY keys for reading and return their slots.  Any key not READY ->
 *  KVO_ENOTFOUND or KVO_EAGAIN (PENDING), nothing pinned. */
int kvo_store_prepare_load(kvo_store *s, const kvo_chunk_key *keys, size_t n, kvo_slot *slots);
/** Unpin keys pinned by prepare_load.  KVO_ESTATE if one is not pinned. */
int kvo_store_complete_load(kvo_store *s, const kvo_chunk_key *keys, size_t n);

/** Mark keys as used now (recency/frequency).  Absent keys are ignored. */
int kvo_store_touch(kvo_store *s, const kvo_chunk_key *keys, size_t n);
/** Remove READY unpinned keys (absent ones ignored).  KVO_EBUSY if one is
 *  pinned or pending (nothing removed). */
int kvo_store_remove(kvo_store *s, const kvo_chunk_key *keys, size_t n);
/** Remove every READY unpinned entry; returns how many remain (pinned/pending). */
size_t kvo_store_clear(kvo_store *s);

/** One entry as seen by iteration. */
typedef struct kvo_store_entry {
    kvo_chunk_key key;
    kvo_slot slot;
    uint8_t state;     /* kvo_lookup_state */
    uint32_t pins;
} kvo_store_entry;
/** Iterate in chunks: start with *cursor = 0; fills up to cap entries, sets
 *  *n; *cursor = 0 after the last.  Concurrent changes may be missed or seen
 *  twice, never crash. */
int kvo_store_scan(kvo_store *s, uint64_t *cursor, kvo_store_entry *out, size_t cap, size_t *n);

typedef enum kvo_store_event_type {
    KVO_EVENT_STORED = 1,   /* became READY */
    KVO_EVENT_EVICTED = 2,  /* evicted to make room */
    KVO_EVENT_REMOVED = 3   /* removed by remove/clear/failed store */
} kvo_store_event_type;

typedef struct kvo_store_event {
    uint32_t type;
    kvo_chunk_key key;
} kvo_store_event;

/** Move up to cap pending events to out (oldest first); returns the count.
 *  *dropped (may be NULL) receives how many were dropped since the last drain. */
size_t kvo_store_drain_events(kvo_store *s, kvo_store_event *out, size_t cap, uint64_t *dropped);

typedef struct kvo_store_group_stats {
    uint64_t chunks;          /* entries of this group (any state) */
    uint64_t bytes_used;      /* chunks * slot_bytes */
    uint64_t capacity_chunks; /* chunks of this group that fit in an empty store */
} kvo_store_group_stats;

typedef struct kvo_store_stats {
    uint64_t capacity_bytes;
    uint64_t bytes_used;      /* slot bytes held by entries */
    uint64_t bytes_reserved;  /* allocator overhead (fragmentation), if any */
    uint64_t entries, pinned, pending;
    uint64_t hits, misses, pending_hits;
    uint64_t stores, store_skipped_present, store_not_admitted, rejected_stores;
    uint64_t evictions, removals, events_dropped;
    size_t n_groups;
    kvo_store_group_stats groups[KVO_MAX_GROUPS];
} kvo_store_stats;

int kvo_store_get_stats(kvo_store *s, kvo_store_stats *out);

/* ---------------------------------------------------------------- arena -- */

/** Host memory for a store's slots: one region, allocated once, pre-faulted. */
typedef struct kvo_arena_params {
    uint64_t bytes;          /* required */
    bool huge_pages;         /* try MAP_HUGETLB, else madvise(MADV_HUGEPAGE) */
    bool lock;               /* mlock the region (fails if RLIMIT_MEMLOCK is low) */
    bool prefault;           /* touch every page at creation (default true) */
    const char *shm_path;    /* NULL: anonymous memory; else a file (e.g. under
                                /dev/shm) that several processes map shared */
} kvo_arena_params;

kvo_arena_params kvo_arena_default_params(void);

typedef struct kvo_arena kvo_arena;
/** Errors: KVO_EINVAL, KVO_ENOMEM (mmap failed, message says how much),
 *  KVO_EIO (shm file), KVO_ENOTSUP (lock/huge pages refused when required). */
int kvo_arena_create(const kvo_arena_params *p, kvo_arena **out);
void kvo_arena_destroy(kvo_arena *a);
/** Base address (64-byte aligned at least; 4096 in practice) and size. */
void *kvo_arena_base(const kvo_arena *a);
uint64_t kvo_arena_size(const kvo_arena *a);
/** Address of a slot: base + slot.offset, or NULL if it does not fit. */
void *kvo_arena_slot(const kvo_arena *a, kvo_slot slot);

#ifdef __cplusplus
}
#endif
#endif
