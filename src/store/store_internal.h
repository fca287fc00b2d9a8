/*
 * Internals of the store layer, shared by store.c, index.c, slots.c and the
 * policy files.  Not installed; tests may include it to check invariants.
 */
#ifndef KVO_STORE_INTERNAL_H
#define KVO_STORE_INTERNAL_H

#include <pthread.h>

#include "core/internal.h"
#include "store/key_mix.h"

#define KVO__NIL UINT32_MAX

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
/* Policy queue ids (entry.q); 0 = in no queue. */
enum {
    KVO__Q_NONE = 0,
    KVO__Q_LRU = 1,
    KVO__Q_T1 = 2, KVO__Q_T2 = 3, KVO__Q_B1 = 4, KVO__Q_B2 = 5, /* ARC */
    KVO__Q_S = 6, KVO__Q_M = 7, KVO__Q_G = 8                    /* S3-FIFO */
};

typedef struct kvo__entry {
    kvo_chunk_key key;
    uint64_t offset;   /* slot offset in the store's space */
    uint32_t slot;     /* slot id (segment * kmax + index) or NIL */
    uint32_t pins;
    uint32_t prev, next; /* policy queue links; next = free-pool link when FREE */
    uint32_t tpos;     /* position in the index table */
    uint32_t stamp;    /* prefix policy: use counter at the last use */
    uint8_t state;
    uint8_t cls;       /* slot size class */
    uint8_t q;         /* policy queue */
    uint8_t freq;      /* S3-FIFO access count (0..3) */
    uint8_t flags;
    uint8_t ghost_q;   /* queue of the ghost this entry was revived from (0: none) */
    uint16_t use_tag;  /* branch policy: the request (its epoch) of the last use */
} kvo__entry;
_Static_assert(sizeof(kvo__entry) == 64, "a pool entry is one cache line");

typedef struct kvo__list {
    uint32_t head, tail; /* head = most recent end; tail = victim end */
    uint64_t n;
} kvo__list;

/* ----------------------------------------------------------------- index -- */
/* Open addressing, linear probing, backward-shift deletion (no tombstones).
 * Slots hold tag (32 bits of the key hash) << 32 | entry index; empty = ~0. */
typedef struct kvo__index {
    uint64_t *tab;
    uint64_t mask;
    void *base; /* the allocation holding tab (kvo__store_big_alloc) */
} kvo__index;

int kvo__index_init(kvo__index *ix, uint64_t max_items);
/* The store's large arrays (index table, entry pool): n bytes, 64-byte
 * aligned (a 64-byte entry then spans one cache line, not two); from 4 MiB
 * up 2 MiB aligned and advised to use transparent huge pages (at 1e6 keys
 * and more every probe is a TLB miss with 4 KiB pages).  Not zeroed.  Free
 * *base with kvo__free.  NULL when out of memory. */
void *kvo__store_big_alloc(size_t n, void **base);
void kvo__index_free(kvo__index *ix);
/* ----------------------------------------------------------------- slots -- */
#define KVO__MAX_CLASSES KVO_MAX_GROUPS
typedef struct kvo__slots {
    uint64_t capacity;
    uint64_t seg_bytes;
    uint32_t nseg, kmax, nclass;
    uint64_t kmax_m;        /* ceil(2^64 / kmax) for kmax > 1: kvo__slot_seg */
    uint64_t cls_bytes[KVO__MAX_CLASSES];
    uint32_t cls_k[KVO__MAX_CLASSES];      /* slots per segment */
    uint64_t cls_k_m[KVO__MAX_CLASSES];    /* ceil(2^64 / cls_k) for cls_k > 1: kvo__slots_segs */
    /* per class */
    uint32_t cls_partial[KVO__MAX_CLASSES]; /* list of segments with a free slot */
    uint64_t cls_free[KVO__MAX_CLASSES];    /* free slots in the class's segments */
    uint64_t cls_nseg[KVO__MAX_CLASSES];
    uint64_t cls_busy[KVO__MAX_CLASSES];    /* busy entries (pinned, pending, protected) */
    uint64_t cls_busyseg[KVO__MAX_CLASSES]; /* segments with busy > 0 (with one class: 0, kvo__slots_busy) */
    /* per segment, and per slot id: one record each, so that a victim's
     * segment and slot cost one cache miss each (at 1e6 entries these
     * tables are megabytes and every eviction touches them at random) */
    struct kvo__seg {
        uint32_t used, busy, bump;  /* busy: with one class 0 (kvo__slots_busy) */
        uint32_t free;          /* free-slot list inside the segment (slot ids) */
        uint32_t prev, next;    /* class partial list, or the free-segment list */
        uint32_t planned;       /* victims planned by the current prepare_store */
        uint8_t cls;            /* class, 0xFF = free */
    } *seg;
    uint32_t free_head;     /* list of free segments (seg.next links) */
    uint32_t nfree;
    struct kvo__slot_rec {
        uint32_t next;      /* free-slot list inside a segment */
        uint32_t entry;     /* entry holding the slot, or NIL */
    } *slot;
} kvo__slots;

/* Choose the segment size for these classes and capacity (seg_bytes 0 = auto). */
int kvo__slots_init(kvo__slots *sl, uint64_t capacity, const uint64_t *cls_bytes, const double *cls_weight,
                    uint32_t nclass, uint64_t seg_bytes);
void kvo__slots_free(kvo__slots *sl);
/* Allocate a slot of class c; NIL if none (no free slot and no free segment). */
uint32_t kvo__slots_alloc(kvo__slots *sl, uint32_t c, uint32_t entry, uint64_t *offset);
/* Give allocated slot id to entry (its former owner gone); sets *offset.
 * Nothing else changes: the segment stays as full as it was. */
uint32_t kvo__slots_reuse(kvo__slots *sl, uint32_t id, uint32_t entry, uint64_t *offset);
/* Free a slot; releases its segment when it empties. */
void kvo__slots_release(kvo__slots *sl, uint32_t slot);
/* slot / kmax by multiplication (Lemire, Kaser, Kurz 2019: exact for every
 * 32-bit dividend with a 64-bit ceil(2^64 / d)); a hardware division took
 * ~8 % of the store cycle, which divides several times per key. */
static inline uint32_t kvo__slot_seg(const kvo__slots *sl, uint32_t slot) {
    return sl->kmax == 1 ? slot : (uint32_t)(((unsigned __int128)sl->kmax_m * slot) >> 64);
}
#define KVO__SEG_FREE 0xFF /* seg.cls of a free segment */
/* A slot's entry becomes busy (delta > 0: pinned, pending, protected) or
 * evictable again: its segment's and class's busy counts.  With one class
 * only the class's count: the segments' counts serve feasibility across
 * classes and the reclaim of whole segments for another class, neither of
 * which one class has (kvo__slots_feasible counts its busy slots; seg.busy
 * and cls_busyseg stay 0).  Inline: four calls per hit of vLLM's store cycle,
 * whose segment updates (a division and a segment record each) were 7 % of
 * it (docs/benchmarks.md). */
static inline void kvo__slots_busy(kvo__slots *sl, uint32_t id, int delta) {
    if (sl->nclass == 1) {
        assert(delta > 0 || sl->cls_busy[0] > 0);
        sl->cls_busy[0] += (uint64_t)(int64_t)delta;
        return;
    }
    uint32_t g = kvo__slot_seg(sl, id);
    uint32_t c = sl->seg[g].cls;
    assert(c != KVO__SEG_FREE);
    if (delta > 0) {
        if (sl->seg[g].busy++ == 0) sl->cls_busyseg[c]++;
        sl->cls_busy[c]++;
    } else {
        assert(sl->seg[g].busy > 0);
        if (--sl->seg[g].busy == 0) sl->cls_busyseg[c]--;
        sl->cls_busy[c]--;
    }
}
/* Segments of class c that n slots fill, ceil(n / cls_k[c]), by
 * multiplication like kvo__slot_seg (prepare_store's plan computes it twice
 * per victim; the division was ~4 % of vLLM's store cycle). */
static inline uint64_t kvo__slots_segs(const kvo__slots *sl, uint32_t c, uint64_t n) {
    uint64_t k = sl->cls_k[c];
    if (k == 1) return n;
    if (n + k - 1 > UINT32_MAX) return kvo__div_ceil_u64(n, k);
    return (uint64_t)(((unsigned __int128)sl->cls_k_m[c] * (n + k - 1)) >> 64);
}
/* Whether n_c slots for every class c could be had with no evictions at all
 * beyond what `evict everything evictable` gives.  demand: per class. */
bool kvo__slots_feasible(const kvo__slots *sl, const uint64_t *demand);
uint64_t kvo__slots_class_capacity(const kvo__slots *sl, uint32_t c);

/* ---------------------------------------------------------------- policy -- */
struct kvo_store;
typedef struct kvo__policy_ops {
    const char *name;
    /* A new READY entry joins (e->ghost_q tells a revived ghost's queue). */
    void (*insert)(struct kvo_store *s, uint32_t e);
    /* A queued entry was used (touch). */
    void (*hit)(struct kvo_store *s, uint32_t e);
    /* Leave the queues without a ghost (pin, protect, remove, reclaim). */
    void (*remove)(struct kvo_store *s, uint32_t e);
    /* Rejoin after pin/protect: counts as a use. */
    void (*reinsert)(struct kvo_store *s, uint32_t e);
    /* Remove and return the next victim (NIL when no entry is queued).
     * May reorder the queues (promotions) on the way. */
    uint32_t (*take_victim)(struct kvo_store *s);
    /* Put a taken victim back at the victim end (rollback, reverse order). */
    void (*untake)(struct kvo_store *s, uint32_t e);
    /* A taken victim is gone: its slot is freed and the entry is already a
     * GHOST (state, counted in s->ghosts, still in the index).  The policy
     * links it in a ghost queue (dropping old ghosts to stay in bounds) or
     * drops it with kvo__ghost_drop. */
    void (*evicted)(struct kvo_store *s, uint32_t e);
    /* A ghost is being revived for a new store: unlink it from its queue. */
    void (*ghost_claim)(struct kvo_store *s, uint32_t e);
    /* Optional (NULL): allocate / free the policy's own state at store
     * create (after the pool; 0 or a KVO_E* code with a message) / destroy. */
    int (*init)(struct kvo_store *s);
    void (*fini)(struct kvo_store *s);
    /* (The optional members follow leaf_first, so that the tables of the
     * policies without them end with it.) */
    /* The order a batch's uses reach the policy (touch, complete_load,
     * prepare_store's present keys, complete_store's new ones): false, the
     * batch's order; true, deepest key first (the batch's last key first),
     * so that a request's root is its newest chunk and an LRU order evicts a
     * prefix chain from its leaf end, leaving a prefix that still hits
     * (evicting the root first leaves its descendants unreachable until
     * they are evicted too).  Events keep the batch's order either way. */
    bool leaf_first;
    /* Optional (NULL): the store's calls as they come (a KVO__CALL_*; the
     * batch, already checked; lock held): lookups after the store's own
     * work, the others before it.  The ensemble policy hands them to its
     * shadows (follow.c). */
    void (*observe)(struct kvo_store *s, int call, const kvo_chunk_key *keys, size_t n);
    /* Optional (NULL): the policy's own invariants, for kvo__store_check. */
    int (*check)(struct kvo_store *s);
    /* Optional (NULL): whether prepare_store stores absent key i of the
     * batch (after observe; lock held; s->sc_mix[i] is its kvo__key_mix),
     * n_new being the batch's keys before it that will be stored; *state is
     * the policy's, 0 at each batch's start.  A key turned away gets need 0
     * and stays a MISS, counted in store_not_admitted (as admit_after's). */
    bool (*admit)(struct kvo_store *s, const kvo_chunk_key *keys, size_t i, uint64_t n_new, uint64_t *state);
} kvo__policy_ops;
enum { KVO__CALL_LOOKUP, KVO__CALL_STORE, KVO__CALL_TOUCH, KVO__CALL_REMOVE, KVO__CALL_CLEAR };

/* Position k of a batch of n in the order its uses reach the policy. */
static inline size_t kvo__use_at(const struct kvo__policy_ops *p, size_t n, size_t k) {
    return p->leaf_first ? n - 1 - k : k;
}

extern const kvo__policy_ops kvo__policy_lru;
extern const kvo__policy_ops kvo__policy_arc;
extern const kvo__policy_ops kvo__policy_s3fifo;
extern const kvo__policy_ops kvo__policy_prefix;
extern const kvo__policy_ops kvo__policy_ensemble;
extern const kvo__policy_ops kvo__policy_branch;
/* The branch policy's history table (policy_branch.c). */
typedef struct kvo__branch kvo__branch;
/* Requests since entry e's last use under the branch policy (exact below
 * 2^15; capped, never wrapped, past it).  For tests. */
unsigned kvo__branch_age(const struct kvo_store *s, uint32_t e);

/* ------------------------------------------- miniature simulations (minisim.c) -- */
/* Evicted keys the prefix policy remembers per key the store can hold (the
 * store's ghost_cap, and the same in its simulations). */
#define KVO__PREFIX_GHOSTS 4u
/* The prefix policy's knob settings, in eighths of the cache size
 * (UINT32_MAX: infinite), one simulation each. */
#define KVO__MINI_N 10
extern const uint32_t kvo__mini_knob8[KVO__MINI_N];
/* ... and each setting's ghost window, in cache sizes (at most
 * KVO__PREFIX_GHOSTS): a key stored again counts as reused when it was
 * evicted at most that many cache sizes of evictions ago. */
extern const uint8_t kvo__mini_ghostw[KVO__MINI_N];
/* The prefix policy's rule, one definition for the store and its
 * simulations.  The knob k8 (eighths of a cache of `size` keys) as an age
 * gap in uses: */
static inline uint64_t kvo__prefix_gap(uint32_t k8, uint64_t size) {
    return k8 == UINT32_MAX ? UINT64_MAX : (uint64_t)k8 * size / 8;
}
/* Whether the victim is M's oldest (last used at stamp m) rather than P's
 * oldest (stamp p): M's is older by more than gap uses. */
static inline bool kvo__prefix_take_m(uint32_t p, uint32_t m, uint64_t gap) {
    int32_t d = (int32_t)(p - m);
    return d > 0 && (uint64_t)d > gap;
}
typedef struct kvo__mini kvo__mini;
/* Simulations for a store of at most max_entries keys: ~4 MiB whatever the
 * size.  0 or KVO_ENOMEM (message set). */
int kvo__mini_create(kvo__mini **out, uint64_t max_entries);
void kvo__mini_destroy(kvo__mini *m);
/* One use of the key whose kvo__key_mix is mix, by a store now holding
 * `resident` keys; updates the simulations when the key is in the sample. */
void kvo__mini_ref(kvo__mini *m, uint64_t mix, uint64_t resident, bool hit);
/* The setting (index into kvo__mini_knob8) with the most recent hits. */
uint32_t kvo__mini_best(const kvo__mini *m);

/* ------------------------------------------------ shadows (follow.c) -- */
/* The ensemble policy's full shadows of its candidates, and the real
 * store's mask lists (follow.c's essay). */
#define KVO__FOLLOW_MAX 8
typedef struct kvo__follow kvo__follow;
/* Shadows for store s (its pool allocated): 0 or KVO_ENOMEM (message). */
int kvo__follow_create(struct kvo_store *s, kvo__follow **out);
void kvo__follow_destroy(kvo__follow *f);
/* The ensemble policy's kvo__policy_ops.observe: a store, touch, remove or
 * clear handed to every shadow; a lookup scored in every shadow (its prefix
 * hits), and the weights recomputed. */
void kvo__follow_observe(struct kvo_store *s, int call, const kvo_chunk_key *keys, size_t n);
/* Entry e joins the real store's queue: its mask from the shadows. */
void kvo__follow_join(struct kvo_store *s, uint32_t e);
/* Entry e leaves the real store's queue: off its list. */
void kvo__follow_leave(kvo__follow *f, uint32_t e);
/* The queued entry the shadows' weighted vote would evict (follow.c), or
 * NIL when no shadow has evicted a key the real store holds. */
uint32_t kvo__follow_victim(const kvo__follow *f);
/* Invariant check for tests (kvo__policy_ops.check): 0 or KVO_ECORRUPT
 * (message set). */
int kvo__follow_check(struct kvo_store *s);
/* Introspection for tests: how many shadows store s has (0: not the
 * ensemble policy), and shadow i (NULL past the last). */
uint32_t kvo__follow_shadows(struct kvo_store *s);
struct kvo_store *kvo__follow_shadow(struct kvo_store *s, uint32_t i);
/* What makes a store a shadow of another (follow.c): the store it shadows,
 * told of each eviction, and the prefix policy's fixed setting (-1: none). */
typedef struct kvo__shadow_of {
    struct kvo_store *up;
    uint32_t index;
    int setting;
    void (*evicted)(struct kvo_store *up, uint32_t index, const kvo_chunk_key *k);
} kvo__shadow_of;

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

    /* policy state */
    kvo__list q[9];
    uint64_t arc_p;                        /* ARC target size of T1 (entries) */
    uint32_t pfx_clock;                    /* prefix policy: uses so far (ent.stamp) */
    uint32_t pfx_evseq;                    /* prefix policy: evictions so far (a ghost's ent.stamp) */
    kvo__mini *pfx_mini;                   /* prefix policy: its simulations */
    int pfx_force;                         /* prefix policy: a fixed setting (a shadow's), or -1 */
    kvo__follow *follow;                   /* ensemble policy: its shadows (follow.c), or NULL */
    kvo__shadow_of shadow;                 /* a shadow's: the store it shadows (up NULL: none) */
    kvo__branch *branch;                   /* branch policy: its history table, or NULL */

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

/* list helpers over s->ent */
/* Link e at the head (most recent end) or the tail (victim end) of l, as
 * queue q.  `head` is a constant at every call, so each use compiles to one
 * straight-line variant. */
static inline void kvo__list_push(kvo_store *s, kvo__list *l, uint32_t e, uint8_t q, bool head) {
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
/* Whether entry e (KVO__NIL: none) holds a READY chunk. */
static inline bool kvo__entry_ready(const kvo_store *s, uint32_t e) {
    return e != KVO__NIL && s->ent[e].state == KVO__E_READY;
}

static inline void kvo__list_push_head(kvo_store *s, kvo__list *l, uint32_t e, uint8_t q) {
    kvo__list_push(s, l, e, q, true);
}
static inline void kvo__list_push_tail(kvo_store *s, kvo__list *l, uint32_t e, uint8_t q) {
    kvo__list_push(s, l, e, q, false);
}
static inline void kvo__list_unlink(kvo_store *s, kvo__list *l, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    if (x->prev != KVO__NIL) s->ent[x->prev].next = x->next; else l->head = x->next;
    if (x->next != KVO__NIL) s->ent[x->next].prev = x->prev; else l->tail = x->prev;
    x->prev = x->next = KVO__NIL;
    l->n--;
    x->q = KVO__Q_NONE;
}
static inline void kvo__list_init(kvo__list *l) { l->head = l->tail = KVO__NIL; l->n = 0; }

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

/* ARC's adaptation (ARC's ghost_claim, the branch policy's floor): a
 * target in [0, max] moved up or down after a return to one side, by step
 * times how many more victims or ghosts the other side has than this one
 * (other / mine; at least 1). */
static inline uint64_t kvo__adapt(uint64_t target, bool up, uint64_t mine, uint64_t other, uint64_t step,
                                  uint64_t max) {
    uint64_t d = mine && other > mine ? step * other / mine : step;
    if (up) return target + d > max ? max : target + d;
    return target > d ? target - d : 0;
}

/* Policies' untake for victims whose queue was remembered in ghost_q by
 * take_victim (ARC, S3-FIFO): back at that queue's victim end. */
static inline void kvo__untake_to_origin(kvo_store *s, uint32_t e) {
    uint8_t q = s->ent[e].ghost_q;
    s->ent[e].ghost_q = 0;
    kvo__list_push_tail(s, &s->q[q], e, q);
}

/* Ghosts: drop one (remove from index, free the pool entry). */
void kvo__ghost_drop(kvo_store *s, uint32_t e);

/* kvo_store_create for a shadow (follow.c), as *sh says. */
int kvo__store_create_shadow(const kvo_store_params *p, const kvo__shadow_of *sh, kvo_store **out);

/* Internal checks for tests: 0 or KVO_ECORRUPT with a message. */
int kvo__store_check(kvo_store *s);
/* Introspection for policy tests. */
uint64_t kvo__store_queue_len(kvo_store *s, int q);
uint64_t kvo__store_arc_p(kvo_store *s);
uint64_t kvo__store_reclaims(kvo_store *s);
/* The prefix policy's current knob, in eighths of the cache (UINT32_MAX:
 * infinite; 0 for other policies). */
uint32_t kvo__store_prefix_knob(kvo_store *s);

/* The prefix policy's setting in force (an index into kvo__mini_knob8 and
 * kvo__mini_ghostw): an ensemble shadow's fixed one, else what its
 * simulations choose. */
static inline uint32_t kvo__prefix_setting(const kvo_store *s) {
    return s->pfx_force >= 0 ? (uint32_t)s->pfx_force : kvo__mini_best(s->pfx_mini);
}

#endif
