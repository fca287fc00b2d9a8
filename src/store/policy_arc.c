/*
 * ARC eviction (Megiddo & Modha, FAST '03), adapted to a store whose entries
 * can be pinned and whose capacity is in bytes.
 *
 * How: resident entries are in T1 (seen once since they were stored) or T2
 * (used again: a touch, a load, or stored again after being a ghost).  Keys
 * evicted from T1 go to ghost list B1, from T2 to B2; a ghost keeps only the
 * key (an index entry in state GHOST, no slot).  p is the target length of
 * T1: a new store of a key found in B1 means T1 was too short (p grows by
 * max(1, |B2|/|B1|)); one found in B2 means T2 was too short (p shrinks by
 * max(1, |B1|/|B2|)); the revived key goes to T2.  The victim is T1's LRU
 * entry when |T1| > p (or T2 is empty), else T2's.
 *
 * Sizes are counted in entries, with c = max_entries: p stays in [0, c], and
 * the ghost lists are bounded: |T1| + |B1| <= c and |B1| + |B2| <= c (the
 * LRU ghost of B1, else of B2, is dropped).  All operations are O(1).
 *
 * Why: a scan of one-off prompts (each chunk stored once, never reused) only
 * cycles through T1, while chunks that were reused stay in T2; p adapts to
 * the mix without a tuning knob.  Pinned and protected entries are out of the
 * lists while pinned and come back to T2 (a load is a use).
 */
#include "store/store_internal.h"

static void arc_bound_ghosts(kvo_store *s) {
    uint64_t c = s->ghost_cap;
    kvo__list *t1 = &s->q[KVO__Q_T1], *b1 = &s->q[KVO__Q_B1], *b2 = &s->q[KVO__Q_B2];
    while (b1->n && t1->n + b1->n > c) kvo__ghost_drop(s, b1->tail);
    while (b1->n + b2->n > c) kvo__ghost_drop(s, b2->n ? b2->tail : b1->tail);
}

static void arc_insert(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    if (x->ghost_q == KVO__Q_B1 || x->ghost_q == KVO__Q_B2) {
        kvo__list_push_head(s, &s->q[KVO__Q_T2], e, KVO__Q_T2);
    } else {
        kvo__list_push_head(s, &s->q[KVO__Q_T1], e, KVO__Q_T1);
        arc_bound_ghosts(s);
    }
    x->ghost_q = 0;
}

/* Leaving the lists (pin, protect, remove, reclaim): remember the list in
 * ghost_q (untake and evicted read it). */
static void arc_remove(kvo_store *s, uint32_t e) {
    uint8_t q = s->ent[e].q;
    kvo__list_unlink(s, &s->q[q], e);
    s->ent[e].ghost_q = q;
}

static void arc_hit(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[s->ent[e].q], e);
    kvo__list_push_head(s, &s->q[KVO__Q_T2], e, KVO__Q_T2);
}

/* Back from a pin or a store batch: a use, so T2. */
static void arc_reinsert(kvo_store *s, uint32_t e) {
    s->ent[e].ghost_q = 0;
    kvo__list_push_head(s, &s->q[KVO__Q_T2], e, KVO__Q_T2);
}

static uint32_t arc_take(kvo_store *s) {
    kvo__list *t1 = &s->q[KVO__Q_T1], *t2 = &s->q[KVO__Q_T2];
    uint32_t e;
    if (t1->n && (t1->n > s->arc_p || !t2->n)) e = t1->tail;
    else e = t2->tail;
    if (e == KVO__NIL) return e;
    /* remember where it came from for untake/evicted */
    uint8_t q = s->ent[e].q;
    kvo__list_unlink(s, &s->q[q], e);
    s->ent[e].ghost_q = q;
    return e;
}

static void arc_evicted(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint8_t q = x->ghost_q == KVO__Q_T2 ? KVO__Q_B2 : KVO__Q_B1;
    x->ghost_q = 0;
    kvo__list_push_head(s, &s->q[q], e, q);
    arc_bound_ghosts(s);
}

static void arc_ghost_claim(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    kvo__list *b1 = &s->q[KVO__Q_B1], *b2 = &s->q[KVO__Q_B2];
    if (x->q == KVO__Q_B1) s->arc_p = kvo__adapt(s->arc_p, true, b1->n, b2->n, 1, s->ghost_cap);
    else if (x->q == KVO__Q_B2) s->arc_p = kvo__adapt(s->arc_p, false, b2->n, b1->n, 1, s->ghost_cap);
    uint8_t q = x->q;
    kvo__list_unlink(s, &s->q[q], e);
    x->ghost_q = q;
}

const kvo__policy_ops kvo__policy_arc = {
    "arc", arc_insert, arc_hit, arc_remove, arc_reinsert, arc_take, kvo__untake_to_origin, arc_evicted,
    arc_ghost_claim, NULL, NULL, false,
};
