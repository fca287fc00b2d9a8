/*
 * LRU eviction (the default).
 *
 * How: one doubly linked list through the entries (ent.prev/next), most
 * recently used at the head, victims taken from the tail.  insert, hit,
 * remove and take_victim are O(1); no ghosts.
 *
 * Why default: KV prefix reuse is dominated by recency (a conversation's next
 * turn, a shared system prompt that keeps being hit); LRU is predictable and
 * cheap.  Only READY, unpinned entries are in the list (the store removes an
 * entry while it is pinned, pending, or protected by a store batch), so the
 * tail is always evictable and no call skips over entries.
 */
#include "store/store_internal.h"

static void lru_insert(kvo_store *s, uint32_t e) {
    kvo__list_push_head(s, &s->q[KVO__Q_LRU], e, KVO__Q_LRU);
}

static void lru_hit(kvo_store *s, uint32_t e) {
    kvo__list *l = &s->q[KVO__Q_LRU];
    if (l->head == e) return;
    kvo__list_unlink(s, l, e);
    kvo__list_push_head(s, l, e, KVO__Q_LRU);
}

static void lru_remove(kvo_store *s, uint32_t e) {
    kvo__list_unlink(s, &s->q[KVO__Q_LRU], e);
}

static uint32_t lru_take(kvo_store *s) {
    kvo__list *l = &s->q[KVO__Q_LRU];
    uint32_t e = l->tail;
    if (e != KVO__NIL) kvo__list_unlink(s, l, e);
    return e;
}

static void lru_untake(kvo_store *s, uint32_t e) {
    kvo__list_push_tail(s, &s->q[KVO__Q_LRU], e, KVO__Q_LRU);
}

static void lru_evicted(kvo_store *s, uint32_t e) {
    kvo__ghost_drop(s, e);
}

static void lru_ghost_claim(kvo_store *s, uint32_t e) {
    (void)s; (void)e;
}

const kvo__policy_ops kvo__policy_lru = {
    "lru", lru_insert, lru_hit, lru_remove, lru_insert, lru_take, lru_untake, lru_evicted, lru_ghost_claim, NULL, NULL,
    false, /* vLLM's own order: its manager calls in the batch's order */
};
