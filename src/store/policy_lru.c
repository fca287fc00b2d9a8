/*
 * LRU eviction (the default).
 *
 * How: one doubly linked list through the entries (KVO__LRU_LIST), most
 * recently used at the head, victims taken from the tail.  insert, hit,
 * remove and take_victim are O(1); no ghosts, no state of its own.
 *
 * Why default: KV prefix reuse is dominated by recency (a conversation's next
 * turn, a shared system prompt that keeps being hit); LRU is predictable and
 * cheap.  Only READY, unpinned entries are in the list (the store removes an
 * entry while it is pinned, pending, or protected by a store batch), so the
 * tail is always evictable and no call skips over entries.
 */
#include "store/store_internal.h"

#define L KVO__LRU_LIST

static void lru_insert(kvo_store *s, uint32_t e) { kvo__list_push_head(s, L, e); }

static void lru_hit(kvo_store *s, uint32_t e) {
    if (s->pq[L].head == e) return;
    kvo__list_unlink(s, e);
    kvo__list_push_head(s, L, e);
}

static void lru_remove(kvo_store *s, uint32_t e) { kvo__list_unlink(s, e); }

static uint32_t lru_take(kvo_store *s) {
    uint32_t e = s->pq[L].tail;
    if (e != KVO__NIL) kvo__list_unlink(s, e);
    return e;
}

static void lru_untake(kvo_store *s, uint32_t e) { kvo__list_push_tail(s, L, e); }

static void lru_evicted(kvo_store *s, uint32_t e) { kvo__ghost_drop(s, e); }

static void lru_ghost_claim(kvo_store *s, uint32_t e) {
    (void)s; (void)e;
}

const kvo__policy_ops kvo__policy_lru = {
    .name = "lru", .lists = {"lru"}, .ghosts_per_entry = 0,
    .leaf_first = false, /* vLLM's own order: its manager calls in the batch's order */
    .insert = lru_insert, .hit = lru_hit, .remove = lru_remove, .reinsert = lru_insert, .take_victim = lru_take,
    .untake = lru_untake, .evicted = lru_evicted, .ghost_claim = lru_ghost_claim,
};
