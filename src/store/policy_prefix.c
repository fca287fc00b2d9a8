/*
 * Prefix-cache eviction: recency, or protection of reused prefixes, chosen
 * online by miniature simulations, with LRU as the fallback.
 *
 * What a prefix cache sees: a request looks its chunks up in order and hits
 * until its first miss, then stores all of them.  Reuse comes in two shapes.
 * Conversations: turn k+1 extends turn k a little later, so the chunks used
 * last are the ones wanted next (LRU is right, and protecting "frequent" old
 * turns only keeps dead conversations).  Shared prefixes: documents or system
 * prompts reused by many requests among many one-off ones; there a chunk that
 * was used again is worth far more than a fresh one, and a burst of one-off
 * requests must not flush it (LRU loses them).
 *
 * How: two LRU lists through the entries, P (used once) and M (used again,
 * or stored again while the store still remembered it as a ghost), and a
 * ghost history of evicted keys 4 times the store's size (a ghost is an
 * index entry without a slot: 64 bytes against the megabytes of a KV
 * chunk).  Each use stamps the entry with a use count (a ghost: the
 * eviction count).  The victim is P's oldest entry unless M's oldest is
 * older than it by more than A uses: A = 0 is exactly LRU (the older of the
 * two tails is the global LRU entry), A = infinity protects every reused
 * key.  W, the second knob, is how recent an eviction must be for a key
 * stored again to count as reused: 4 cache sizes (the whole history) or 1.
 * minisim.c runs this same rule at each of its settings of (A, W) on a
 * hashed sample of the keys and the store follows the best of them once it
 * beats the LRU simulation by a margin.
 *
 * The bound against LRU: the store scores its own hits on the sampled keys
 * like a simulation; when they fall below the LRU simulation's by more than
 * the sampling explains, it goes back to A = 0, exact LRU, and doubles the
 * margin it asks before leaving it again (minisim.c).  So where protection
 * does not pay (chat) the policy is LRU after a short detour, and it only
 * stays away from LRU while its own hits show that this pays.
 *
 * Prefix order: the store hands this policy a batch's uses deepest key first
 * (ops.leaf_first), so a request's root is its newest chunk and each list
 * evicts a chain from its leaf end, leaving a prefix that still hits
 * (evicting the root first takes its descendants' hits with it); a reused
 * parent is in M whenever its child is.
 *
 * What it cannot do: the two lists hold recency only, so where frequency
 * decides (popular documents among ones read twice) S3-FIFO's use counts and
 * ARC's adaptation keep up to ~1.5 points more (docs/replay.md has the
 * measured gaps, on traces its settings were not chosen on).
 *
 * State: per entry (ent.pol) the stamp and the list it last left; per store
 * (pfx_state) the use and eviction counts and the simulations.  Invariants:
 * a queued entry is READY, unpinned and in exactly one of P, M; a ghost is
 * in G; the stamps of a list are in use order (head newest).  All operations
 * are O(1): take_victim compares two tails.  Stamps are 32 bits: an age gap
 * over 2^31 uses compares wrongly, which costs hit rate and nothing else.
 */
#include "store/minisim.h"
#include "store/store_internal.h"

enum { P = 1, M, G };
/* Per entry: the use count at its last use (a ghost: the eviction count at
 * its eviction), and the list it last left (a revived ghost: G when it
 * counts as reused). */
#define PFX_STAMP(s, e) ((s)->ent[e].pol.u32[0])
#define PFX_FROM(s, e) ((s)->ent[e].pol.u8[4])

typedef struct pfx_state {
    uint32_t clock;  /* uses so far (PFX_STAMP of queued entries) */
    uint32_t evseq;  /* evictions so far (PFX_STAMP of ghosts) */
    kvo__mini *mini; /* the simulations */
} pfx_state;
#define PFX(s) ((pfx_state *)(s)->ps)

/* A use of e (not queued now) by the store: stamp it, queue it in q, and
 * tell the simulations. */
static void pfx_use_in(kvo_store *s, uint32_t e, uint8_t q, bool hit) {
    PFX_STAMP(s, e) = ++PFX(s)->clock;
    kvo__list_push_head(s, q, e);
    kvo__mini_ref(PFX(s)->mini, kvo__key_mix(&s->ent[e].key), s->resident, hit);
}

static void pfx_insert(kvo_store *s, uint32_t e) {
    uint8_t q = PFX_FROM(s, e) == G ? M : P;
    PFX_FROM(s, e) = 0;
    pfx_use_in(s, e, q, false);
}

/* Leave the list it is in, remembering which (untake puts it back). */
static void pfx_leave(kvo_store *s, uint32_t e) {
    PFX_FROM(s, e) = s->ent[e].q;
    kvo__list_unlink(s, e);
}

static void pfx_reinsert(kvo_store *s, uint32_t e) { pfx_use_in(s, e, M, true); }

static void pfx_hit(kvo_store *s, uint32_t e) {
    pfx_leave(s, e);
    pfx_use_in(s, e, M, true);
}

static uint32_t pfx_take(kvo_store *s) {
    uint32_t tp = s->pq[P].tail, tm = s->pq[M].tail, e;
    if (tp == KVO__NIL) e = tm;
    else if (tm == KVO__NIL) e = tp;
    else {
        uint64_t gap = kvo__prefix_gap(kvo__mini_knob8[kvo__mini_best(PFX(s)->mini)], s->resident);
        e = kvo__prefix_take_m(PFX_STAMP(s, tp), PFX_STAMP(s, tm), gap) ? tm : tp;
    }
    if (e != KVO__NIL) pfx_leave(s, e);
    return e;
}

static void pfx_untake(kvo_store *s, uint32_t e) {
    uint8_t from = PFX_FROM(s, e);
    PFX_FROM(s, e) = 0;
    kvo__list_push_tail(s, from, e);
}

static void pfx_evicted(kvo_store *s, uint32_t e) {
    PFX_FROM(s, e) = 0;
    PFX_STAMP(s, e) = ++PFX(s)->evseq;
    kvo__list_push_head(s, G, e);
    while (s->pq[G].n > s->ghost_cap) kvo__ghost_drop(s, s->pq[G].tail);
}

/* A ghost stored again: reused (M at insert) when evicted within the
 * current setting's ghost window, W cache sizes of evictions ago. */
static void pfx_ghost_claim(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, e);
    uint64_t w = kvo__mini_ghostw[kvo__mini_best(PFX(s)->mini)];
    PFX_FROM(s, e) = (uint64_t)(uint32_t)(PFX(s)->evseq - PFX_STAMP(s, e)) < w * s->resident ? G : 0;
}

static int pfx_init(kvo_store *s) {
    pfx_state *st = kvo__calloc(1, sizeof *st);
    if (!st) return kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory for the prefix policy's state");
    s->ps = st;
    return kvo__mini_create(&st->mini, s->max_entries);
}

static void pfx_fini(kvo_store *s) {
    if (s->ps) kvo__mini_destroy(PFX(s)->mini);
    kvo__free(s->ps);
    s->ps = NULL;
}

uint32_t kvo__prefix_knob(kvo_store *s) {
    return s->pol == &kvo__policy_prefix ? kvo__mini_knob8[kvo__mini_best(PFX(s)->mini)] : 0;
}

const kvo__policy_ops kvo__policy_prefix = {
    .name = "prefix", .lists = {"p", "m", "g"}, .ghosts_per_entry = KVO__PREFIX_GHOSTS, .leaf_first = true,
    .insert = pfx_insert, .hit = pfx_hit, .remove = pfx_leave, .reinsert = pfx_reinsert, .take_victim = pfx_take,
    .untake = pfx_untake, .evicted = pfx_evicted, .ghost_claim = pfx_ghost_claim, .init = pfx_init,
    .fini = pfx_fini,
};
