/*
 * The eviction policies' interface to the store.
 *
 * A policy orders the store's evictable entries (READY, unpinned, not
 * protected by a store batch) and the ghosts it keeps (evicted keys, an
 * index entry without a slot), through lists linked in the entries
 * (ent.prev/next, ent.q = the list's number, 1..KVO__POL_LISTS; 0: in none).
 * What else it keeps is its own: per entry 8 bytes (ent.pol), whose layout
 * its file defines, and per store one struct (kvo_store.ps) it allocates at
 * create (ops.init).  The store calls it under its lock and only through
 * kvo__policy_ops; a policy calls back only the store's list helpers and
 * kvo__ghost_drop (store_internal.h).
 *
 * Policies: policy_lru.c (the default), policy_arc.c, policy_s3fifo.c,
 * policy_prefix.c (with its simulations, minisim.c).
 */
#ifndef KVO_STORE_POLICY_H
#define KVO_STORE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

/* Most lists a policy links (ARC: T1, T2, B1, B2). */
#define KVO__POL_LISTS 4
/* LRU's one list (policy_lru.c): store.c and store_prepare.c read its head
 * to skip work that would leave it as it is (kvo__lru_leads, in-place
 * protection). */
#define KVO__LRU_LIST 1

struct kvo_store;
typedef struct kvo__policy_ops {
    const char *name;
    /* Its lists' names, for tests and messages (kvo__store_list_len). */
    const char *lists[KVO__POL_LISTS];
    /* Ghosts it keeps per entry the store can hold (the store's ghost_cap). */
    uint32_t ghosts_per_entry;
    /* The order a batch's uses reach the policy (touch, complete_load,
     * prepare_store's present keys, complete_store's new ones): false, the
     * batch's order; true, deepest key first (the batch's last key first),
     * so that a request's root is its newest chunk and an LRU order evicts a
     * prefix chain from its leaf end, leaving a prefix that still hits
     * (evicting the root first leaves its descendants unreachable until
     * they are evicted too).  Events keep the batch's order either way. */
    bool leaf_first;
    /* A new READY entry joins (after ghost_claim when it was a ghost). */
    void (*insert)(struct kvo_store *s, uint32_t e);
    /* A queued entry was used (touch). */
    void (*hit)(struct kvo_store *s, uint32_t e);
    /* Leave the lists without a ghost (pin, protect, remove, reclaim). */
    void (*remove)(struct kvo_store *s, uint32_t e);
    /* Rejoin after pin/protect: counts as a use. */
    void (*reinsert)(struct kvo_store *s, uint32_t e);
    /* Remove and return the next victim (KVO__NIL when no entry is queued).
     * May reorder the lists (promotions) on the way. */
    uint32_t (*take_victim)(struct kvo_store *s);
    /* Put a taken victim back at the victim end (rollback, reverse order). */
    void (*untake)(struct kvo_store *s, uint32_t e);
    /* A taken victim is gone: its slot is freed and the entry is already a
     * GHOST (state, counted in s->ghosts, still in the index).  The policy
     * links it in a ghost list (dropping old ghosts to stay within
     * ghost_cap) or drops it with kvo__ghost_drop. */
    void (*evicted)(struct kvo_store *s, uint32_t e);
    /* A ghost is being revived for a new store: unlink it from its list. */
    void (*ghost_claim)(struct kvo_store *s, uint32_t e);
    /* Optional (NULL): allocate / free the policy's own state (s->ps) at
     * store create (after the pool; 0 or a KVO_E* code with a message) /
     * destroy (also after a failed init). */
    int (*init)(struct kvo_store *s);
    void (*fini)(struct kvo_store *s);
} kvo__policy_ops;

/* Position k of a batch of n in the order its uses reach the policy. */
static inline size_t kvo__use_at(const kvo__policy_ops *p, size_t n, size_t k) {
    return p->leaf_first ? n - 1 - k : k;
}

extern const kvo__policy_ops kvo__policy_lru;
extern const kvo__policy_ops kvo__policy_arc;
extern const kvo__policy_ops kvo__policy_s3fifo;
extern const kvo__policy_ops kvo__policy_prefix;

/* Introspection for tests (0 for a store of another policy): ARC's target
 * size of T1 (policy_arc.c); the prefix policy's victim rule in force, its
 * age gap in eighths of the cache (UINT32_MAX: infinite; policy_prefix.c). */
uint64_t kvo__arc_p(struct kvo_store *s);
uint32_t kvo__prefix_knob(struct kvo_store *s);

#endif
