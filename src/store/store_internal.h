/*
 * Internals of the store layer: the entry pool, the store, and what store.c,
 * store_prepare.c, store_stats.c, index.c and the policies share.  Not
 * installed; tests may include it to check invariants.
 *
 * Files, from the leaves up (a file calls only those before it, and the
 * policies call back only kvo__ghost_drop and the list helpers below):
 *   slots.c (slots.h)     the slot allocator
 *   minisim.c (minisim.h) the prefix policy's simulations
 *   index.c (index.h)     key -> entry
 *   policy_lru.c, policy_arc.c, policy_s3fifo.c, policy_prefix.c
 *                         eviction (policy.h: their interface)
 *   store.c               create, lookup, load, touch, remove, entry life
 *   store_prepare.c       prepare_store, complete_store
 *   store_stats.c         statistics and the invariant check
 */
#ifndef KVO_STORE_INTERNAL_H
#define KVO_STORE_INTERNAL_H

#include <pthread.h>

#include "core/internal.h"
#include "store/index.h"
#include "store/key_mix.h"
#include "store/policy.h"
#include "store/slots.h"

/* Entry states (an entry in the pool is one of these). */
enum { KVO__E_FREE = 0, KVO__E_PENDING = 1, KVO__E_READY = 2, KVO__E_GHOST = 3 };
/* Entry flags. */
enum {
    KVO__F_PROTECT = 1,   /* READY key of the current prepare_store batch: not evictable */
    KVO__F_VICTIM = 2,    /* planned victim of the current prepare_store */
    KVO__F_BATCH = 4,     /* seen in the current batch (duplicate detection) */
    KVO__F_RETIRED = 8,   /* lasting: a pinned READY key kvo_store_retire removed; hidden
                             (lookups miss, loads ENOTFOUND), dropped at its last unpin */
    KVO__F_IN_PLACE = 16  /* with PROTECT: protected where it is, at the head of the LRU list
                             (store_prepare.c, kvo__ps_protect), not taken out of it */
};
/* 8 bytes of per-entry state that belong to the policy: each policy file
 * says what its words hold (reset to 0 when an entry gets a new key). */
typedef union kvo__pol_ent {
    uint64_t u64;
    uint32_t u32[2];
    uint8_t u8[8];
} kvo__pol_ent;

typedef struct kvo__entry {
    kvo_chunk_key key;
    uint64_t offset;   /* slot offset in the store's space */
    uint32_t slot;     /* slot id (segment * kmax + index) or NIL */
    uint32_t pins;
    uint32_t prev, next; /* policy list links; next = free-pool link when FREE */
    uint32_t tpos;     /* position in the index table */
    uint8_t state;
    uint8_t cls;       /* slot size class */
    uint8_t q;         /* the policy list holding it (1..KVO__POL_LISTS), 0: none */
    uint8_t flags;
    kvo__pol_ent pol;  /* the policy's own (policy.h) */
} kvo__entry;
_Static_assert(sizeof(kvo__entry) == 64, "a pool entry is one cache line");

typedef struct kvo__list {
    uint32_t head, tail; /* head = most recent end; tail = victim end */
    uint64_t n;
} kvo__list;

/* ----------------------------------------------------------------- store -- */
typedef struct kvo__event_ring {
    kvo_store_event *ev;
    uint32_t cap, head, n;
    uint64_t dropped;
} kvo__event_ring;

_Static_assert(KVO_MAX_GROUPS <= 64, "kvo_store.group_ok holds a bit per group");
struct kvo_store {
    pthread_mutex_t mu;
    const kvo_plan *plan;
    kvo_store_params params;
    const kvo__policy_ops *pol;
    uint32_t ngroups;
    uint8_t group_cls[KVO_MAX_GROUPS];     /* 0xFF: not offloaded */
    uint64_t group_ok;                     /* bit g: group g is offloaded (kvo__check_keys) */
    uint64_t group_slot[KVO_MAX_GROUPS];

    kvo__entry *ent;
    void *ent_base;                        /* the allocation holding ent */
    uint32_t pool_cap, pool_free;          /* free list head */
    uint64_t max_entries, ghost_cap;
    uint64_t resident, ghosts, pinned, pending;
    kvo__index ix;
    bool pipe_walk;                        /* batch probes' prefetch rule (key_mix.h, kvo__pipe_ahead) */
    kvo__slots sl;

    /* the policy's: its lists (pq[1..KVO__POL_LISTS]; pq[0] unused) and
     * its own state (ops.init), or NULL */
    kvo__list pq[1 + KVO__POL_LISTS];
    void *ps;

    /* admission: count-min sketch, 4 rows of uint8, halved every `cms_period` adds */
    uint8_t *cms;
    uint64_t cms_mask, cms_adds, cms_period;

    kvo__event_ring events;

    /* per-call scratch, grown geometrically (no allocation in steady state) */
    uint32_t *sc_ent;                      /* per batch key: entry or NIL */
    uint32_t *sc_vict;                     /* victims */
    uint64_t *sc_set;                      /* duplicate detection */
    uint64_t *sc_mix;                      /* prepare_store: an absent key's kvo__key_mix, by batch position */
    size_t sc_cap, sc_vcap, sc_setcap, sc_mixcap;
    size_t sc_fit;                         /* batches of up to this many keys fit every scratch array */
    /* the last batch's resident entries by position (store.c, "Memo"); the
     * keys of its NIL positions, absent while res_gen == memo_gen */
    uint32_t *memo;
    kvo_chunk_key *memo_key;
    size_t memo_n, memo_cap, memo_kcap;
    uint64_t memo_gen, res_gen;            /* res_gen: bumped when keys become resident */

    /* stats */
    uint64_t hits, misses, pending_hits, stores, store_skipped_present, store_not_admitted, rejected_stores;
    uint64_t evictions, removals, bytes_used, reclaims;
    uint64_t g_chunks[KVO_MAX_GROUPS], g_hits[KVO_MAX_GROUPS], g_misses[KVO_MAX_GROUPS];
    uint64_t g_stores[KVO_MAX_GROUPS], g_evictions[KVO_MAX_GROUPS];
};

/* index operations need the entry array */
uint32_t kvo__index_find(kvo_store *s, const kvo_chunk_key *k);
/* The same with h = kvo__key_mix(k) already computed. */
uint32_t kvo__index_find_h(kvo_store *s, const kvo_chunk_key *k, uint64_t h);
/* Insert entry e, whose key's kvo__key_mix is h (asserted). */
void kvo__index_insert(kvo_store *s, uint32_t e, uint64_t h);
void kvo__index_remove(kvo_store *s, uint32_t e);

/* The policy lists (s->pq), linked through the entries.  Link e at the
 * head (most recent end) or the tail (victim end) of list q.  `head` is a
 * constant at every call, so each use compiles to one straight-line
 * variant. */
static inline void kvo__list_push(kvo_store *s, uint8_t q, uint32_t e, bool head) {
    kvo__list *l = &s->pq[q];
    kvo__entry *x = &s->ent[e];
    uint32_t *end = head ? &l->head : &l->tail, *other_end = head ? &l->tail : &l->head;
    *(head ? &x->prev : &x->next) = KVO__NIL;
    *(head ? &x->next : &x->prev) = *end;
    if (*end != KVO__NIL) *(head ? &s->ent[*end].prev : &s->ent[*end].next) = e;
    else *other_end = e;
    *end = e;
    l->n++;
    x->q = q;
}
static inline void kvo__list_push_head(kvo_store *s, uint8_t q, uint32_t e) { kvo__list_push(s, q, e, true); }
static inline void kvo__list_push_tail(kvo_store *s, uint8_t q, uint32_t e) { kvo__list_push(s, q, e, false); }
/* Unlink e from the list holding it (e->q != 0). */
static inline void kvo__list_unlink(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    kvo__list *l = &s->pq[x->q];
    if (x->prev != KVO__NIL) s->ent[x->prev].next = x->next; else l->head = x->next;
    if (x->next != KVO__NIL) s->ent[x->next].prev = x->prev; else l->tail = x->prev;
    x->prev = x->next = KVO__NIL;
    l->n--;
    x->q = 0;
}
static inline void kvo__list_init(kvo__list *l) { l->head = l->tail = KVO__NIL; l->n = 0; }
/* Whether entry e (KVO__NIL: none) holds a READY chunk. */
static inline bool kvo__entry_ready(const kvo_store *s, uint32_t e) {
    return e != KVO__NIL && s->ent[e].state == KVO__E_READY;
}

/* ------------------------------------------ shared by the store's files -- */
/* store.c: the pieces prepare_store and the stats share with the rest. */
static inline void kvo__store_lock(kvo_store *s) { pthread_mutex_lock(&s->mu); }
static inline void kvo__store_unlock(kvo_store *s) { pthread_mutex_unlock(&s->mu); }
/* Busy transitions: an entry leaves/enters the evictable set. */
static inline void kvo__busy(kvo_store *s, uint32_t e, int d) { kvo__slots_busy(&s->sl, s->ent[e].slot, d); }
/* The memo (store.c): true when every keys[i] (i < n) is the resident entry
 * memo[i] (each verified by its state and key) or, memo[i] NIL, the key
 * recorded there while no key has become resident since (still absent);
 * memo_set records a batch's entries (NIL: not resident), when the memo has
 * room. */
static inline bool kvo__memo_all(const kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    if (n > s->memo_n) return false;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->memo[i];
        if (e == KVO__NIL) {
            if (s->memo_gen != s->res_gen || !kvo_chunk_key_eq(&s->memo_key[i], &keys[i])) return false;
            continue;
        }
        const kvo__entry *x = &s->ent[e];
        if ((x->state != KVO__E_READY && x->state != KVO__E_PENDING) || !kvo_chunk_key_eq(&x->key, &keys[i]))
            return false;
    }
    return true;
}
static inline void kvo__memo_set(kvo_store *s, const uint32_t *ents, const kvo_chunk_key *keys, size_t n) {
    if (n > s->memo_cap) n = 0;
    for (size_t i = 0; i < n; i++)
        if ((s->memo[i] = ents[i]) == KVO__NIL) s->memo_key[i] = keys[i];
    s->memo_n = n;
    s->memo_gen = s->res_gen;
}
/* Validate a batch's arguments and keys (message names fn); the arguments
 * only (NULLs, n); the keys only (their groups). */
int kvo__check_batch(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out, const char *fn);
int kvo__check_args(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out, const char *fn);
int kvo__check_keys(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn);
/* Check the keys and resolve a batch into s->sc_ent (grown to n): each key's
 * resident entry (PENDING or READY), or NIL for an absent key or a ghost.
 * Keys the memo confirms need no check (a checked call recorded them).  Lock
 * held. */
int kvo__resolve(kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn);
/* A batch call's preamble: check the batch, lock, resolve.  0 with the lock
 * held, or an error with it released. */
int kvo__batch_begin(kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out, const char *fn);
/* Admission sketch estimate for k (s->cms must exist). */
unsigned kvo__cms_get(const kvo_store *s, const kvo_chunk_key *k);
/* Append an event to the ring (dropping the oldest when full); nothing when
 * events are off (no ring), checked inline: two calls per stored chunk in
 * vLLM's store cycle. */
void kvo__event_push(kvo_store *s, uint32_t type, const kvo_chunk_key *k);
static inline void kvo__event(kvo_store *s, uint32_t type, const kvo_chunk_key *k) {
    if (s->events.cap) kvo__event_push(s, type, k);
}
/* A fresh pool entry for key k (h: its kvo__key_mix), in the index. */
uint32_t kvo__entry_new(kvo_store *s, const kvo_chunk_key *k, uint64_t h);
/* Entry e (out of the pool and the index) reset to hold key k, in the
 * index: kvo__entry_new's second half, and prepare_store's recycling of a
 * victim's entry for a new key. */
void kvo__entry_init(kvo_store *s, uint32_t e, const kvo_chunk_key *k, uint64_t h);
/* A resident entry's accounting (bytes, chunks, residents) released; its
 * slot and everything else left as they are. */
void kvo__resident_leave(kvo_store *s, uint32_t e);
/* Release a resident entry's slot and accounting (not the policy queues). */
void kvo__resident_release(kvo_store *s, uint32_t e);
/* The same, but the slot stays allocated and is returned (prepare_store
 * hands it to a new key: kvo__slots_reuse). */
uint32_t kvo__resident_unslot(kvo_store *s, uint32_t e);
/* Remove a resident entry entirely (remove, clear, failed store). */
void kvo__resident_drop(kvo_store *s, uint32_t e, uint32_t evtype);

/* Ghosts: drop one (remove from index, free the pool entry). */
void kvo__ghost_drop(kvo_store *s, uint32_t e);

/* Internal checks for tests: 0 or KVO_ECORRUPT with a message. */
int kvo__store_check(kvo_store *s);
/* Introspection for tests: the length of the policy's list `name`
 * (kvo__policy_ops.lists; 0 when it has none of that name); segment
 * reclaims so far. */
uint64_t kvo__store_list_len(kvo_store *s, const char *name);
uint64_t kvo__store_reclaims(kvo_store *s);

#endif
