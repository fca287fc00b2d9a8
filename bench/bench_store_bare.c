/*
 * The bare LRU index: the same-work limit of `bench store`'s index figures.
 *
 * What it is.  The store's lookup, touch and store cycle (prepare_store +
 * complete_store into a full store) done by the least code that does the
 * same memory work: one power-of-two table of 8-byte slots (tag << 32 |
 * entry), at least KVO__INDEX_SLOTS_PER_ITEM (4) slots per entry, linear probing; a pool
 * of 64-byte entries (key, LRU links, table position, slot offset, state),
 * 64-byte aligned; deletion by backward shift; one doubly linked LRU list.
 * Sizes equal the store's for the same key count (src/store/index.c), the
 * key mix is the store's (kvo__key_mix from src/store/key_mix.h, the same
 * inline function the index calls), and batches probe with the store's two-stage prefetch (the
 * table slot 8 keys ahead, the entry 4 ahead).  So per key it takes the
 * same random misses as the store:
 *   - lookup: the key's table slot, its entry;
 *   - touch: the same, plus its LRU neighbours (unlink, push at the head);
 *   - store cycle: the new key's table slot (a miss), the victim's entry
 *     (the LRU tail), the victim's table slot (deletion), then the new
 *     key's insertion at the probed slot and at the LRU head; complete_store
 *     finds each key again (cached by then) and marks it READY.
 * What it leaves out, and the figures' ratios therefore price: the lock,
 * argument and key checks, statistics, duplicate detection, the slot
 * allocator (here a new key simply takes its victim's slot), the policy
 * indirection and the all-or-nothing phases.
 *
 * Best case on purpose: both arrays are 2 MiB aligned and advised to use
 * huge pages, and victims' table slots are prefetched as the victims are
 * collected (the tail is walked before any is removed).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_store.h"
#include "store/key_mix.h"

#define BB_NIL UINT32_MAX
#define BB_EMPTY UINT64_MAX

typedef struct bb_ent {
    kvo_chunk_key key;
    uint64_t offset; /* slot offset (inherited from the victim) */
    uint32_t prev, next, tpos;
    uint8_t ready, busy; /* busy: a present key of the current batch */
    uint8_t pad[64 - 24 - 8 - 12 - 2];
} bb_ent;
_Static_assert(sizeof(bb_ent) == 64, "the store's entry size (kvo__pipe_walks)");

struct kvo__bs_bare {
    uint64_t *tab;
    uint64_t mask;
    bb_ent *ent;
    uint32_t cap, n, head, tail;
    bool walk; /* the store's prefetch rule for this size (key_mix.h) */
    uint32_t *vict; /* per batch */
    uint32_t *found;
    size_t vcap;
};

/* The store's own key mix (src/store/key_mix.h). */
static inline uint64_t bb_mix(const kvo_chunk_key *k) { return kvo__key_mix(k); }

static void *bb_alloc(size_t n) {
    size_t a = (size_t)2 << 20;
    n = (n + a - 1) / a * a;
    void *p = aligned_alloc(a, n);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, n, MADV_HUGEPAGE);
#endif
    return p;
}

kvo__bs_bare *kvo__bs_bare_create(uint64_t nkeys) {
    kvo__bs_bare *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    uint64_t t = 16;
    while (t < nkeys * KVO__INDEX_SLOTS_PER_ITEM) t <<= 1;
    b->tab = bb_alloc(t * sizeof *b->tab);
    b->ent = bb_alloc(nkeys * sizeof *b->ent);
    if (!b->tab || !b->ent) {
        kvo__bs_bare_destroy(b);
        return NULL;
    }
    memset(b->tab, 0xFF, t * sizeof *b->tab);
    memset(b->ent, 0, nkeys * sizeof *b->ent);
    b->mask = t - 1;
    b->cap = (uint32_t)nkeys;
    b->walk = kvo__pipe_walks(t, nkeys);
    b->head = b->tail = BB_NIL;
    return b;
}

void kvo__bs_bare_destroy(kvo__bs_bare *b) {
    if (!b) return;
    free(b->tab);
    free(b->ent);
    free(b->vict);
    free(b->found);
    free(b);
}

static inline uint32_t bb_find(const kvo__bs_bare *b, const kvo_chunk_key *k, uint64_t h) {
    uint64_t tag = h & 0xFFFFFFFFu;
    for (uint64_t i = h & b->mask;; i = (i + 1) & b->mask) {
        uint64_t v = b->tab[i];
        if (v == BB_EMPTY) return BB_NIL;
        if ((v >> 32) == tag && kvo_chunk_key_eq(&b->ent[(uint32_t)v].key, k)) return (uint32_t)v;
    }
}

/* The store's batch pipeline: key i+8's table slot, key i+4's entry (by
 * the store's rule, kvo__pipe_ahead). */
static inline uint64_t bb_pipe(const kvo__bs_bare *b, uint64_t *ring, const kvo_chunk_key *keys, size_t n,
                               size_t i) {
    if (i == 0)
        for (size_t j = 0; j < 8 && j < n; j++) ring[j] = bb_mix(&keys[j]);
    if (i + 8 < n) {
        uint64_t h = bb_mix(&keys[i + 8]);
        ring[(i + 8) & 15] = h;
        __builtin_prefetch(&b->tab[h & b->mask]);
    }
    if (i + 4 < n) { /* the store's rule (key_mix.h) */
        uint32_t e = kvo__pipe_ahead(b->tab, b->mask, ring[(i + 4) & 15], b->walk, b->cap);
        if (e != BB_NIL) __builtin_prefetch(&b->ent[e]);
    }
    return ring[i & 15];
}

static inline void bb_unlink(kvo__bs_bare *b, uint32_t e) {
    bb_ent *x = &b->ent[e];
    if (x->prev != BB_NIL) b->ent[x->prev].next = x->next; else b->head = x->next;
    if (x->next != BB_NIL) b->ent[x->next].prev = x->prev; else b->tail = x->prev;
}

static inline void bb_push_head(kvo__bs_bare *b, uint32_t e) {
    bb_ent *x = &b->ent[e];
    x->prev = BB_NIL;
    x->next = b->head;
    if (b->head != BB_NIL) b->ent[b->head].prev = e; else b->tail = e;
    b->head = e;
}

void kvo__bs_bare_lookup(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    uint64_t ring[16];
    for (size_t i = 0; i < n; i++) {
        uint32_t e = bb_find(b, &keys[i], bb_pipe(b, ring, keys, n, i));
        states[i] = e != BB_NIL && b->ent[e].ready ? KVO_READY : KVO_MISS;
    }
}

void kvo__bs_bare_touch(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n) {
    uint64_t ring[16];
    for (size_t i = 0; i < n; i++) {
        uint32_t e = bb_find(b, &keys[i], bb_pipe(b, ring, keys, n, i));
        if (e == BB_NIL || !b->ent[e].ready || b->head == e) continue;
        bb_unlink(b, e);
        bb_push_head(b, e);
    }
}

/* Backward-shift deletion of entry e's table slot (src/store/index.c). */
static void bb_tab_remove(kvo__bs_bare *b, uint32_t e) {
    uint64_t i = b->ent[e].tpos, j = i;
    for (;;) {
        j = (j + 1) & b->mask;
        uint64_t v = b->tab[j];
        if (v == BB_EMPTY) break;
        uint64_t home = (v >> 32) & b->mask;
        if (((j - home) & b->mask) >= ((j - i) & b->mask)) { /* home not in (i, j] */
            b->tab[i] = v;
            b->ent[(uint32_t)v].tpos = (uint32_t)i;
            i = j;
        }
    }
    b->tab[i] = BB_EMPTY;
}

static void bb_tab_insert(kvo__bs_bare *b, uint32_t e, uint64_t h) {
    uint64_t i = h & b->mask;
    while (b->tab[i] != BB_EMPTY) i = (i + 1) & b->mask;
    b->tab[i] = ((h & 0xFFFFFFFFu) << 32) | e;
    b->ent[e].tpos = (uint32_t)i;
}

size_t kvo__bs_bare_store(kvo__bs_bare *b, const kvo_chunk_key *keys, size_t n) {
    if (n > b->vcap) {
        free(b->vict);
        free(b->found);
        b->vict = malloc(n * sizeof *b->vict);
        b->found = malloc(n * sizeof *b->found);
        if (!b->vict || !b->found) abort(); /* a benchmark's own scratch */
        b->vcap = n;
    }
    /* prepare: resolve (present keys count as used) */
    uint64_t ring[16];
    size_t nnew = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = bb_find(b, &keys[i], bb_pipe(b, ring, keys, n, i));
        b->found[i] = e;
        if (e != BB_NIL) b->ent[e].busy = 1;
        nnew += e == BB_NIL;
    }
    /* victims from the tail, their table slots prefetched as collected */
    size_t nv = 0;
    uint32_t v = b->tail;
    while (b->n + nnew - nv > b->cap && v != BB_NIL) {
        if (!b->ent[v].busy) {
            b->vict[nv++] = v;
            __builtin_prefetch(&b->tab[b->ent[v].tpos], 1);
        }
        v = b->ent[v].prev;
    }
    for (size_t k = 0; k < nv; k++) {
        bb_unlink(b, b->vict[k]);
        bb_tab_remove(b, b->vict[k]);
    }
    b->n -= (uint32_t)nv;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        if (b->found[i] != BB_NIL) {
            uint32_t e = b->found[i];
            b->ent[e].busy = 0;
            if (b->head != e) {
                bb_unlink(b, e);
                bb_push_head(b, e);
            }
            continue;
        }
        uint32_t e = used < nv ? b->vict[used++] : b->n;
        bb_ent *x = &b->ent[e];
        x->key = keys[i];
        x->ready = 0;
        bb_tab_insert(b, e, bb_mix(&keys[i]));
        b->n++;
    }
    /* complete: find each stored key again, READY, at the LRU head */
    for (size_t i = 0; i < n; i++) {
        uint32_t e = bb_find(b, &keys[i], bb_pipe(b, ring, keys, n, i));
        if (b->found[i] != BB_NIL || e == BB_NIL) continue;
        b->ent[e].ready = 1;
        bb_push_head(b, e);
    }
    return nnew;
}
