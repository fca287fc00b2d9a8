/*
 * Ensemble eviction: the store evicts what its shadows vote out.
 *
 * How: the store keeps full shadows of seven policies (follow.c: LRU, ARC,
 * S3-FIFO and the prefix policy at four fixed settings), each a keys-only
 * store that gets every call first, and marks each of its own entries with
 * the set of shadows that have evicted the entry's key since its last use.
 * The victim is an entry whose set carries the most weight: each shadow's
 * weight falls from 1 to 0 as its recent prefix hits fall from the best
 * shadow's to KVO__FOLLOW_DELTA below them (follow.c).  When no shadow has
 * evicted anything the store holds, the store's own LRU order decides.
 *
 * Invariants: a queued entry is READY, unpinned, in the LRU list, and in
 * the list of its mask, exactly the set of shadows that do not hold its
 * key (kvo__follow_check); no ghosts (ghost_cap 0, the
 * shadows keep their own).  All operations are O(1) in the store; each
 * call costs one call per shadow (follow.c).
 *
 * Why: no one rule is best on every workload (docs/replay.md): ARC and
 * S3-FIFO on popular documents, protection of reused prefixes on shared
 * prompts, recency on chat.  Following the single best shadow pays each
 * change of leader and the long start before one leads; a vote of the ones
 * that do about as well keeps what they agree on and needs no leader.
 * What it does not promise: the LRU floor of the prefix policy (a vote of
 * near-LRU settings falls below LRU on chat traffic by up to 0.2 points).
 */
#include "store/store_internal.h"

/* Joining the queue (a store, a use, back from a pin or a batch): the
 * entry's mask from the shadows, which have seen the call already. */
static void ens_insert(kvo_store *s, uint32_t e) {
    kvo__list_push_head(s, &s->q[KVO__Q_LRU], e, KVO__Q_LRU);
    kvo__follow_join(s, e);
}

static void ens_remove(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[KVO__Q_LRU], e);
    kvo__follow_leave(s->follow, e);
}

static void ens_hit(kvo_store *s, uint32_t e) {
    ens_remove(s, e);
    ens_insert(s, e);
}

static uint32_t ens_take(kvo_store *s) {
    uint32_t e = kvo__follow_victim(s->follow);
    if (e == KVO__NIL) e = s->q[KVO__Q_LRU].tail;
    if (e != KVO__NIL) ens_remove(s, e);
    return e;
}

static void ens_untake(kvo_store *s, uint32_t e) {
    kvo__list_push_tail(s, &s->q[KVO__Q_LRU], e, KVO__Q_LRU);
    kvo__follow_join(s, e);
}

static void ens_evicted(kvo_store *s, uint32_t e) { kvo__ghost_drop(s, e); }

static void ens_ghost_claim(kvo_store *s, uint32_t e) {
    (void)s;
    (void)e;
}

static int ens_init(kvo_store *s) { return kvo__follow_create(s, &s->follow); }

static void ens_fini(kvo_store *s) {
    kvo__follow_destroy(s->follow);
    s->follow = NULL;
}

const kvo__policy_ops kvo__policy_ensemble = {
    "ensemble", ens_insert, ens_hit, ens_remove, ens_insert, ens_take, ens_untake, ens_evicted, ens_ghost_claim,
    ens_init, ens_fini, false, kvo__follow_observe, kvo__follow_check,
};
