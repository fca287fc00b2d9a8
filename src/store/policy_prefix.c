/*
 * Prefix-aware eviction: frequency with dynamic ageing (LFU-DA) in a bucket
 * queue, so that a prefix is never worth less than what hangs below it.
 *
 * How: every queued entry has a use count f (1..PFX_FMAX, in ent.freq) and a
 * priority p = clock + f, where clock is the priority of the last victim
 * (s->pfx_clock).  A store inserts with f = 1; a use (touch, a present key of
 * a store batch, an unpin) raises f by one, capped, and sets p = clock + f.
 * The victim is the entry of least priority, least recently used among equals.
 * Taking it advances the clock to its priority, which ages every other entry:
 * an entry that was used often long ago ends up below one used once recently.
 *
 * Layout: every priority lies in [clock, clock + PFX_FMAX] (a new priority is
 * clock + f <= clock + PFX_FMAX, and the clock only rises to the least
 * priority present), so PFX_W = PFX_FMAX + 1 LRU lists indexed by
 * p mod PFX_W hold all entries and an entry's priority is recovered from the
 * list it is in.  The lists are the store's resident queues s->q[] (only one
 * policy runs per store).  insert, hit, remove are O(1); take_victim looks at
 * most PFX_W lists: O(1).  untake (rollback, reverse order of the takes)
 * lowers the clock back to the victim's priority, which is within PFX_FMAX
 * of the clock since no entry entered in between.  Ghosts: an evicted key
 * stays in the ghost queue (KVO__Q_G, at most ghost_cap keys, the oldest
 * dropped); stored again while there, it starts at the top count.
 *
 * Why it suits prefix caches: key k+1 of a request is only ever used with key
 * k before it, so a parent's use count is at least its child's and, in one
 * ageing epoch, parents outrank children: the tree is cut from its leaves
 * (a chunk without its prefix is worthless).  Among equal counts the order is
 * LRU in the order the store reports uses (a batch's keys in key order, so in
 * a freshly stored chain the root is the oldest); ordering those leaf-first
 * was measured at under 0.1 point on the Mooncake trace, not worth a hint in
 * the API.  The first chunks of a
 * conversation, shared by all its turns and by other requests, gather uses
 * and stay; the chunks of a one-off request keep f = 1 and go first once the
 * clock passes them.  The cap keeps ageing fast (a burst of uses cannot pin an
 * entry for long).  docs/replay.md has the replay numbers that chose the cap
 * and the ghosts (Mooncake trace at 10k blocks: LRU 0.4235, this 0.4379,
 * MIN 0.6174), and why no recency/frequency policy gets much closer to MIN.
 */
#include "store/store_internal.h"

#define PFX_FMAX 3u                /* use-count cap (docs/replay.md: 2 and 4 did worse) */
#define PFX_GHOST_F PFX_FMAX       /* count of a key that returns from the ghost list */
#define PFX_W (PFX_FMAX + 1u)      /* buckets */

/* The store queue ids used as the buckets (resident queues of kvo__store_check). */
static const uint8_t pfx_q[PFX_W] = {KVO__Q_LRU, KVO__Q_T1, KVO__Q_T2, KVO__Q_S};

static void pfx_push(kvo_store *s, uint32_t e, uint64_t prio) {
    uint8_t q = pfx_q[prio % PFX_W];
    kvo__list_push_head(s, &s->q[q], e, q);
}

static void pfx_insert(kvo_store *s, uint32_t e) {
    s->ent[e].freq = (uint8_t)(s->ent[e].ghost_q == KVO__Q_G ? PFX_GHOST_F : 1);
    s->ent[e].ghost_q = 0;
    pfx_push(s, e, s->pfx_clock + s->ent[e].freq);
}

static void pfx_use(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    if (x->freq < PFX_FMAX) x->freq++;
    pfx_push(s, e, s->pfx_clock + x->freq);
}

static void pfx_remove(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[s->ent[e].q], e);
}

static void pfx_hit(kvo_store *s, uint32_t e) {
    pfx_remove(s, e);
    pfx_use(s, e);
}

static uint32_t pfx_take(kvo_store *s) {
    for (uint32_t d = 0; d < PFX_W; d++) {
        uint64_t p = s->pfx_clock + d;
        kvo__list *l = &s->q[pfx_q[p % PFX_W]];
        if (l->tail == KVO__NIL) continue;
        uint32_t e = l->tail;
        kvo__list_unlink(s, l, e);
        s->ent[e].ghost_q = (uint8_t)(p % PFX_W + 1); /* bucket + 1, for untake */
        s->pfx_clock = p;
        return e;
    }
    return KVO__NIL;
}

static void pfx_untake(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint32_t b = x->ghost_q ? (uint32_t)x->ghost_q - 1 : (uint32_t)(s->pfx_clock % PFX_W);
    x->ghost_q = 0;
    /* the victim's priority: the value <= clock, within PFX_FMAX of it, that is b mod PFX_W */
    uint64_t back = (s->pfx_clock % PFX_W + PFX_W - b) % PFX_W;
    s->pfx_clock -= back;
    uint8_t q = pfx_q[b];
    kvo__list_push_tail(s, &s->q[q], e, q);
}

static void pfx_evicted(kvo_store *s, uint32_t e) {
    s->ent[e].ghost_q = 0;
    kvo__list *G = &s->q[KVO__Q_G];
    kvo__list_push_head(s, G, e, KVO__Q_G);
    while (G->n > s->ghost_cap) kvo__ghost_drop(s, G->tail);
}

static void pfx_ghost_claim(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[KVO__Q_G], e);
    s->ent[e].ghost_q = KVO__Q_G;
}

const kvo__policy_ops kvo__policy_prefix = {
    "prefix", pfx_insert, pfx_hit, pfx_remove, pfx_use, pfx_take, pfx_untake, pfx_evicted, pfx_ghost_claim,
};
