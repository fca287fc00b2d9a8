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
 *
 * State: per store, p (arc_state); per entry, ent.pol.u8[0] = the list it
 * last left (ARC_FROM: untake puts a victim back there, evicted picks its
 * ghost list, insert sees a revived ghost's list).
 */
#include "store/store_internal.h"

enum { T1 = 1, T2, B1, B2 };
#define ARC_FROM(s, e) ((s)->ent[e].pol.u8[0])

typedef struct arc_state {
    uint64_t p; /* the target length of T1, in entries */
} arc_state;
#define ARC(s) ((arc_state *)(s)->ps)

static void arc_bound_ghosts(kvo_store *s) {
    uint64_t c = s->ghost_cap;
    kvo__list *t1 = &s->pq[T1], *b1 = &s->pq[B1], *b2 = &s->pq[B2];
    while (b1->n && t1->n + b1->n > c) kvo__ghost_drop(s, b1->tail);
    while (b1->n + b2->n > c) kvo__ghost_drop(s, b2->n ? b2->tail : b1->tail);
}

/* Leave the list it is in, remembering which. */
static void arc_leave(kvo_store *s, uint32_t e) {
    ARC_FROM(s, e) = s->ent[e].q;
    kvo__list_unlink(s, e);
}

static void arc_insert(kvo_store *s, uint32_t e) {
    uint8_t from = ARC_FROM(s, e);
    ARC_FROM(s, e) = 0;
    if (from == B1 || from == B2) {
        kvo__list_push_head(s, T2, e);
    } else {
        kvo__list_push_head(s, T1, e);
        arc_bound_ghosts(s);
    }
}

static void arc_hit(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, e);
    kvo__list_push_head(s, T2, e);
}

/* Back from a pin or a store batch: a use, so T2. */
static void arc_reinsert(kvo_store *s, uint32_t e) {
    ARC_FROM(s, e) = 0;
    kvo__list_push_head(s, T2, e);
}

static uint32_t arc_take(kvo_store *s) {
    kvo__list *t1 = &s->pq[T1], *t2 = &s->pq[T2];
    uint32_t e = t1->n && (t1->n > ARC(s)->p || !t2->n) ? t1->tail : t2->tail;
    if (e != KVO__NIL) arc_leave(s, e);
    return e;
}

static void arc_untake(kvo_store *s, uint32_t e) {
    uint8_t from = ARC_FROM(s, e);
    ARC_FROM(s, e) = 0;
    kvo__list_push_tail(s, from, e);
}

static void arc_evicted(kvo_store *s, uint32_t e) {
    uint8_t q = ARC_FROM(s, e) == T2 ? B2 : B1;
    ARC_FROM(s, e) = 0;
    kvo__list_push_head(s, q, e);
    arc_bound_ghosts(s);
}

/* A move of p towards the side a ghost came back from: by step times how
 * many more ghosts the other side has than this one (other / mine; at least
 * 1), within [0, max]. */
static uint64_t arc_adapt(uint64_t target, bool up, uint64_t mine, uint64_t other, uint64_t max) {
    uint64_t d = mine && other > mine ? other / mine : 1;
    if (up) return target + d > max ? max : target + d;
    return target > d ? target - d : 0;
}

static void arc_ghost_claim(kvo_store *s, uint32_t e) {
    uint64_t n1 = s->pq[B1].n, n2 = s->pq[B2].n;
    if (s->ent[e].q == B1) ARC(s)->p = arc_adapt(ARC(s)->p, true, n1, n2, s->ghost_cap);
    else ARC(s)->p = arc_adapt(ARC(s)->p, false, n2, n1, s->ghost_cap);
    arc_leave(s, e);
}

static int arc_init(kvo_store *s) {
    s->ps = kvo__calloc(1, sizeof(arc_state));
    return s->ps ? 0 : kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory for ARC's state");
}

static void arc_fini(kvo_store *s) {
    kvo__free(s->ps);
    s->ps = NULL;
}

uint64_t kvo__arc_p(kvo_store *s) { return s->pol == &kvo__policy_arc ? ARC(s)->p : 0; }

const kvo__policy_ops kvo__policy_arc = {
    .name = "arc", .lists = {"t1", "t2", "b1", "b2"}, .ghosts_per_entry = 1, .leaf_first = false,
    .insert = arc_insert, .hit = arc_hit, .remove = arc_leave, .reinsert = arc_reinsert, .take_victim = arc_take,
    .untake = arc_untake, .evicted = arc_evicted, .ghost_claim = arc_ghost_claim, .init = arc_init,
    .fini = arc_fini,
};
