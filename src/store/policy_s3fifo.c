/*
 * S3-FIFO eviction (Yang et al., SOSP '23: "FIFO queues are all you need for
 * cache eviction").
 *
 * How: three FIFO queues.  New entries enter the small queue S; entries
 * whose key is in the ghost queue G (recently evicted from S) enter the main
 * queue M directly.  Each resident entry has a 2-bit use counter (touch, load:
 * +1, capped at 3).  To evict: while |S| >= 10 % of the resident entries (or
 * M is empty), look at S's oldest entry: used at least once since it came in
 * -> moved to M with its counter reset; otherwise it is the victim and its key
 * goes to G.  Else look at M's oldest: counter > 0 -> decremented and moved to
 * M's head (a second chance); otherwise it is the victim (no ghost).  G keeps
 * at most as many keys as M can hold (ghost_cap) and drops its oldest.
 *
 * Cost: each step either returns a victim or moves an entry whose counter was
 * paid for by an earlier use, so take_victim is O(1) amortized.
 *
 * Why: most KV chunks are stored once and never reused (one-off prompts); S
 * filters them out quickly ("quick demotion") while reused prefixes earn a
 * place in M, and FIFO queues need no reordering on a hit (hit = a counter
 * increment, lighter than LRU's list move).
 *
 * State: per entry, ent.pol.u8[0] = the queue it last left (S3_FROM: untake
 * and reinsert put it back there, evicted keeps a ghost only of S's
 * victims, insert sees a revived ghost) and u8[1] = its use counter
 * (S3_FREQ); nothing per store.
 */
#include "store/store_internal.h"

enum { S = 1, M, G };
#define S3_FROM(s, e) ((s)->ent[e].pol.u8[0])
#define S3_FREQ(s, e) ((s)->ent[e].pol.u8[1])

static void s3_insert(kvo_store *s, uint32_t e) {
    uint8_t from = S3_FROM(s, e);
    S3_FROM(s, e) = 0;
    S3_FREQ(s, e) = 0;
    kvo__list_push_head(s, from == G ? M : S, e);
}

static void s3_hit(kvo_store *s, uint32_t e) {
    if (S3_FREQ(s, e) < 3) S3_FREQ(s, e)++;
}

/* Leave the queue it is in, remembering which. */
static void s3_leave(kvo_store *s, uint32_t e) {
    S3_FROM(s, e) = s->ent[e].q;
    kvo__list_unlink(s, e);
}

/* Back from a pin or a store batch: same queue, at its head, and one use. */
static void s3_reinsert(kvo_store *s, uint32_t e) {
    uint8_t from = S3_FROM(s, e);
    S3_FROM(s, e) = 0;
    kvo__list_push_head(s, from == M ? M : S, e);
    s3_hit(s, e);
}

static uint32_t s3_take(kvo_store *s) {
    kvo__list *qs = &s->pq[S], *qm = &s->pq[M];
    for (;;) {
        uint64_t total = qs->n + qm->n;
        if (total == 0) return KVO__NIL;
        uint8_t from = qs->n && (qs->n * 10 >= total || qm->n == 0) ? S : M;
        uint32_t e = s->pq[from].tail;
        kvo__list_unlink(s, e);
        if (S3_FREQ(s, e) > 0) { /* S: promoted with its count reset; M: a second chance */
            S3_FREQ(s, e) = from == S ? 0 : S3_FREQ(s, e) - 1;
            kvo__list_push_head(s, M, e);
            continue;
        }
        S3_FROM(s, e) = from;
        return e;
    }
}

static void s3_untake(kvo_store *s, uint32_t e) {
    uint8_t from = S3_FROM(s, e);
    S3_FROM(s, e) = 0;
    kvo__list_push_tail(s, from, e);
}

static void s3_evicted(kvo_store *s, uint32_t e) {
    uint8_t from = S3_FROM(s, e);
    S3_FROM(s, e) = 0;
    if (from != S) {
        kvo__ghost_drop(s, e);
        return;
    }
    kvo__list_push_head(s, G, e);
    while (s->pq[G].n > s->ghost_cap) kvo__ghost_drop(s, s->pq[G].tail);
}

const kvo__policy_ops kvo__policy_s3fifo = {
    .name = "s3fifo", .lists = {"s", "m", "g"}, .ghosts_per_entry = 1, .leaf_first = false,
    .insert = s3_insert, .hit = s3_hit, .remove = s3_leave, .reinsert = s3_reinsert, .take_victim = s3_take,
    .untake = s3_untake, .evicted = s3_evicted, .ghost_claim = s3_leave,
};
