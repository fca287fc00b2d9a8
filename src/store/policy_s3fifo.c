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
 */
#include "store/store_internal.h"

static void s3_insert(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    x->freq = 0;
    if (x->ghost_q == KVO__Q_G) kvo__list_push_head(s, &s->q[KVO__Q_M], e, KVO__Q_M);
    else kvo__list_push_head(s, &s->q[KVO__Q_S], e, KVO__Q_S);
    x->ghost_q = 0;
}

static void s3_hit(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    if (x->freq < 3) x->freq++;
}

/* Leaving the queues (pin, protect, remove): remember the queue in ghost_q so
 * that reinsert puts the entry back into the same one. */
static void s3_remove(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint8_t q = x->q;
    kvo__list_unlink(s, &s->q[q], e);
    x->ghost_q = q;
}

/* Back from a pin or a store batch: same queue, at its head, and one use. */
static void s3_reinsert(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint8_t q = x->ghost_q == KVO__Q_M ? KVO__Q_M : KVO__Q_S;
    x->ghost_q = 0;
    kvo__list_push_head(s, &s->q[q], e, q);
    if (x->freq < 3) x->freq++;
}

static uint32_t s3_take(kvo_store *s) {
    kvo__list *S = &s->q[KVO__Q_S], *M = &s->q[KVO__Q_M];
    for (;;) {
        uint64_t total = S->n + M->n;
        if (total == 0) return KVO__NIL;
        if (S->n && (S->n * 10 >= total || M->n == 0)) {
            uint32_t e = S->tail;
            kvo__list_unlink(s, S, e);
            if (s->ent[e].freq > 0) {
                s->ent[e].freq = 0;
                kvo__list_push_head(s, M, e, KVO__Q_M);
                continue;
            }
            s->ent[e].ghost_q = KVO__Q_S;
            return e;
        }
        uint32_t e = M->tail;
        kvo__list_unlink(s, M, e);
        if (s->ent[e].freq > 0) {
            s->ent[e].freq--;
            kvo__list_push_head(s, M, e, KVO__Q_M);
            continue;
        }
        s->ent[e].ghost_q = KVO__Q_M;
        return e;
    }
}

static void s3_evicted(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint8_t from = x->ghost_q;
    x->ghost_q = 0;
    if (from != KVO__Q_S) {
        kvo__ghost_drop(s, e);
        return;
    }
    kvo__list *G = &s->q[KVO__Q_G];
    kvo__list_push_head(s, G, e, KVO__Q_G);
    while (G->n > s->ghost_cap) kvo__ghost_drop(s, G->tail);
}

static void s3_ghost_claim(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint8_t q = x->q;
    kvo__list_unlink(s, &s->q[q], e);
    x->ghost_q = q;
}

const kvo__policy_ops kvo__policy_s3fifo = {
    "s3fifo", s3_insert, s3_hit, s3_remove, s3_reinsert, s3_take, kvo__untake_to_origin, s3_evicted,
    s3_ghost_claim, NULL, NULL, false,
};
