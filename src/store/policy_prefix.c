/*
 * Prefix-cache eviction: recency, or protection of reused prefixes, chosen
 * online by miniature simulations of both on a sample of the keys.
 *
 * What a prefix cache sees: a request looks its chunks up in order and hits
 * until its first miss, then stores all of them.  Reuse comes in two shapes.
 * Conversations: turn k+1 extends turn k a little later, so the chunks used
 * last are the ones wanted next (LRU is right, and protecting "frequent" old
 * turns only keeps dead conversations).  Shared prefixes: long documents or
 * system prompts reused by many requests, among many one-off requests whose
 * chunks are never used again (on the Mooncake trace 58 % of chunks are used
 * once); there a chunk that was used again is worth far more than a fresh
 * one, and a burst of one-off requests must not flush it (LRU loses them).
 *
 * How: two LRU lists through the entries, P (used once) and M (used again,
 * or stored again while the store still remembered it as a ghost), and a
 * ghost history of evicted keys 4 times the store's size (ghost_cap; a ghost
 * is an index entry without a slot, 64 bytes, against the megabytes of a KV
 * chunk).  Each use stamps the entry with a use counter (ent.stamp; a
 * ghost's stamp is its eviction number instead).  The victim is P's oldest
 * entry, unless M's oldest is older than it by more than A uses.  A = 0 is
 * exactly LRU (the older of two LRU tails is the global LRU entry); A =
 * infinity is 2Q-like protection of every reused key.  The second knob, W,
 * is how recent an eviction must be for a key stored again to count as
 * reused (join M): W = 4 cache sizes (the whole history) or 1.  Both are
 * learnt: minisim.c runs this same policy at 10 settings of (A, W), keys
 * only, on a hashed sample of the keys scaled to the store's size, and the
 * store follows the one with the most (recent, decayed) hits once it beats
 * the LRU simulation by a margin, and goes back to LRU when its own hits on
 * the sample fall below the LRU simulation's (the guard; the margin then
 * doubles).  Prefix order: the store hands this policy a batch's uses
 * deepest key first (ops.leaf_first), so a request's root is its newest
 * chunk and each list evicts a chain from its leaf end, leaving a prefix
 * that still hits (root first, the root went first and took its
 * descendants' hits with it); a reused parent is in M whenever its child
 * is.
 *
 * Why this design (docs/replay.md has the numbers): recency wins on chat
 * traces (protection alone loses up to 9 points to LRU there), protection
 * on shared prefixes (Mooncake: +2-3 points over LRU at 4k-14k blocks), and
 * a short ghost window (W = 1) on popular documents among one-off ones (up
 * to +10 points over LRU with W = 4, +2 more with W = 1: with W = 4 a
 * document seen twice in a long while crowds out the popular ones in M).
 * Against the best of LRU, ARC and S3-FIFO over 84-capacity sweeps
 * (200..50,000 blocks): Mooncake on average +0.10 points, worst -0.73;
 * document traces -0.3..-0.4 on average, worst -1.3 (S3-FIFO's frequency
 * counts, which two LRU lists cannot express, and protection's small leads
 * at large caches, within the sampling noise); chat never below.
 * The rest of the gap to Belady's MIN is dead chunks of requests that look
 * like the ones that get reused: no recency or frequency signal separates
 * them (docs/replay.md shows the bounds with oracles).
 *
 * Invariants: a queued entry is READY, unpinned and in exactly one of P, M;
 * a ghost is in G; the stamps of a list are in use order (head newest).
 * All operations are O(1): take_victim compares two tails.  The stamp is 32
 * bits: an age gap over 2^31 uses compares wrongly, which costs hit rate and
 * nothing else.
 */
#include "store/store_internal.h"

#define PFX_P KVO__Q_T1
#define PFX_M KVO__Q_T2

/* A use of e (not queued now) by the store: stamp it, queue it in q, and
 * tell the simulations. */
static void pfx_use_in(kvo_store *s, uint32_t e, uint8_t q, bool hit) {
    kvo__entry *x = &s->ent[e];
    x->stamp = ++s->pfx_clock;
    kvo__list_push_head(s, &s->q[q], e, q);
    if (s->pfx_mini) kvo__mini_ref(s->pfx_mini, kvo__key_mix(&x->key), s->resident, hit);
}

static void pfx_insert(kvo_store *s, uint32_t e) {
    uint8_t q = s->ent[e].ghost_q == KVO__Q_G ? PFX_M : PFX_P;
    s->ent[e].ghost_q = 0;
    pfx_use_in(s, e, q, false);
}

static void pfx_remove(kvo_store *s, uint32_t e) {
    uint8_t q = s->ent[e].q;
    kvo__list_unlink(s, &s->q[q], e);
    s->ent[e].ghost_q = q; /* for untake (a reclaimed victim put back) */
}

static void pfx_reinsert(kvo_store *s, uint32_t e) { pfx_use_in(s, e, PFX_M, true); }

static void pfx_hit(kvo_store *s, uint32_t e) {
    pfx_remove(s, e);
    pfx_use_in(s, e, PFX_M, true);
}

static uint32_t pfx_take(kvo_store *s) {
    uint32_t tp = s->q[PFX_P].tail, tm = s->q[PFX_M].tail, e;
    if (tp == KVO__NIL) e = tm;
    else if (tm == KVO__NIL) e = tp;
    else {
        uint64_t gap = kvo__prefix_gap(kvo__mini_knob8[kvo__prefix_setting(s)], s->resident);
        e = kvo__prefix_take_m(s->ent[tp].stamp, s->ent[tm].stamp, gap) ? tm : tp;
    }
    if (e != KVO__NIL) pfx_remove(s, e);
    return e;
}

static void pfx_evicted(kvo_store *s, uint32_t e) {
    s->ent[e].ghost_q = 0;
    s->ent[e].stamp = ++s->pfx_evseq;
    kvo__list *G = &s->q[KVO__Q_G];
    kvo__list_push_head(s, G, e, KVO__Q_G);
    while (G->n > s->ghost_cap) kvo__ghost_drop(s, G->tail);
}

/* A ghost stored again: reused (M at insert) when evicted within the
 * current setting's ghost window, W cache sizes of evictions ago. */
static void pfx_ghost_claim(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[KVO__Q_G], e);
    uint64_t w = kvo__mini_ghostw[kvo__prefix_setting(s)];
    s->ent[e].ghost_q = (uint64_t)(uint32_t)(s->pfx_evseq - s->ent[e].stamp) < w * s->resident ? KVO__Q_G : 0;
}

static int pfx_init(kvo_store *s) {
    if (s->pfx_force >= 0) return 0; /* an ensemble's shadow at a fixed setting: nothing to learn */
    return kvo__mini_create(&s->pfx_mini, s->max_entries);
}

static void pfx_fini(kvo_store *s) {
    kvo__mini_destroy(s->pfx_mini);
    s->pfx_mini = NULL;
}

const kvo__policy_ops kvo__policy_prefix = {
    "prefix", pfx_insert, pfx_hit, pfx_remove, pfx_reinsert, pfx_take, kvo__untake_to_origin, pfx_evicted,
    pfx_ghost_claim, pfx_init, pfx_fini, true,
};
