/*
 * The store's slot allocator (slots.c): size-class segments of one byte
 * range.  A leaf: it knows slots, segments and classes, not entries,
 * policies or the store (an entry id is an opaque number it records per
 * slot).  slots.c's essay has the design and its fragmentation bound.
 */
#ifndef KVO_STORE_SLOTS_H
#define KVO_STORE_SLOTS_H

#include "core/internal.h"

#define KVO__NIL UINT32_MAX
#define KVO__MAX_CLASSES KVO_MAX_GROUPS
typedef struct kvo__slots {
    uint64_t base;          /* added to every offset handed out (a range of a larger arena) */
    uint64_t capacity;
    uint64_t seg_bytes;
    uint32_t nseg, kmax, nclass;
    uint64_t kmax_m;        /* ceil(2^64 / kmax) for kmax > 1: kvo__slot_seg */
    uint64_t cls_bytes[KVO__MAX_CLASSES];
    uint32_t cls_k[KVO__MAX_CLASSES];      /* slots per segment */
    uint64_t cls_k_m[KVO__MAX_CLASSES];    /* ceil(2^64 / cls_k) for cls_k > 1: kvo__slots_segs */
    /* per class */
    uint32_t cls_partial[KVO__MAX_CLASSES]; /* list of segments with a free slot */
    uint64_t cls_free[KVO__MAX_CLASSES];    /* free slots in the class's segments */
    uint64_t cls_nseg[KVO__MAX_CLASSES];
    uint64_t cls_busy[KVO__MAX_CLASSES];    /* busy entries (pinned, pending, protected) */
    uint64_t cls_busyseg[KVO__MAX_CLASSES]; /* segments with busy > 0 (with one class: 0, kvo__slots_busy) */
    /* per segment, and per slot id: one record each, so that a victim's
     * segment and slot cost one cache miss each (at 1e6 entries these
     * tables are megabytes and every eviction touches them at random) */
    struct kvo__seg {
        uint32_t used, busy, bump;  /* busy: with one class 0 (kvo__slots_busy) */
        uint32_t free;          /* free-slot list inside the segment (slot ids) */
        uint32_t prev, next;    /* class partial list, or the free-segment list */
        uint32_t planned;       /* victims planned by the current prepare_store */
        uint8_t cls;            /* class, 0xFF = free */
    } *seg;
    uint32_t free_head;     /* list of free segments (seg.next links) */
    uint32_t nfree;
    struct kvo__slot_rec {
        uint32_t next;      /* free-slot list inside a segment */
        uint32_t entry;     /* entry holding the slot, or NIL */
    } *slot;
} kvo__slots;

/* Choose the segment size for these classes and capacity (seg_bytes 0 = auto). */
int kvo__slots_init(kvo__slots *sl, uint64_t capacity, const uint64_t *cls_bytes, const double *cls_weight,
                    uint32_t nclass, uint64_t seg_bytes);
void kvo__slots_free(kvo__slots *sl);
/* Allocate a slot of class c; NIL if none (no free slot and no free segment). */
uint32_t kvo__slots_alloc(kvo__slots *sl, uint32_t c, uint32_t entry, uint64_t *offset);
/* Give allocated slot id to entry (its former owner gone); sets *offset.
 * Nothing else changes: the segment stays as full as it was. */
uint32_t kvo__slots_reuse(kvo__slots *sl, uint32_t id, uint32_t entry, uint64_t *offset);
/* Free a slot; releases its segment when it empties. */
void kvo__slots_release(kvo__slots *sl, uint32_t slot);
/* slot / kmax by multiplication (Lemire, Kaser, Kurz 2019: exact for every
 * 32-bit dividend with a 64-bit ceil(2^64 / d)); a hardware division took
 * ~8 % of the store cycle, which divides several times per key. */
static inline uint32_t kvo__slot_seg(const kvo__slots *sl, uint32_t slot) {
    return sl->kmax == 1 ? slot : (uint32_t)(((unsigned __int128)sl->kmax_m * slot) >> 64);
}
/* The offset of slot id (of class cls, in segment g = kvo__slot_seg) in
 * the store's space: base + its segment + its index in the segment. */
static inline uint64_t kvo__slot_offset(const kvo__slots *sl, uint32_t id, uint32_t g, uint32_t cls) {
    return sl->base + (uint64_t)g * sl->seg_bytes + (uint64_t)(id - g * sl->kmax) * sl->cls_bytes[cls];
}
#define KVO__SEG_FREE 0xFF /* seg.cls of a free segment */
/* A slot's entry becomes busy (delta > 0: pinned, pending, protected) or
 * evictable again: its segment's and class's busy counts.  With one class
 * only the class's count: the segments' counts serve feasibility across
 * classes and the reclaim of whole segments for another class, neither of
 * which one class has (kvo__slots_feasible counts its busy slots; seg.busy
 * and cls_busyseg stay 0).  Inline: four calls per hit of vLLM's store cycle,
 * whose segment updates (a division and a segment record each) were 7 % of
 * it (`kvoffload bench store`, commit 91ea845). */
static inline void kvo__slots_busy(kvo__slots *sl, uint32_t id, int delta) {
    if (sl->nclass == 1) {
        assert(delta > 0 || sl->cls_busy[0] > 0);
        sl->cls_busy[0] += (uint64_t)(int64_t)delta;
        return;
    }
    uint32_t g = kvo__slot_seg(sl, id);
    uint32_t c = sl->seg[g].cls;
    assert(c != KVO__SEG_FREE);
    if (delta > 0) {
        if (sl->seg[g].busy++ == 0) sl->cls_busyseg[c]++;
        sl->cls_busy[c]++;
    } else {
        assert(sl->seg[g].busy > 0);
        if (--sl->seg[g].busy == 0) sl->cls_busyseg[c]--;
        sl->cls_busy[c]--;
    }
}
/* Segments of class c that n slots fill, ceil(n / cls_k[c]), by
 * multiplication like kvo__slot_seg (prepare_store's plan computes it twice
 * per victim; the division was ~4 % of vLLM's store cycle). */
static inline uint64_t kvo__slots_segs(const kvo__slots *sl, uint32_t c, uint64_t n) {
    uint64_t k = sl->cls_k[c];
    if (k == 1) return n;
    if (n + k - 1 > UINT32_MAX) return kvo__div_ceil_u64(n, k);
    return (uint64_t)(((unsigned __int128)sl->cls_k_m[c] * (n + k - 1)) >> 64);
}
/* Whether n_c slots for every class c could be had with no evictions at all
 * beyond what `evict everything evictable` gives.  demand: per class. */
bool kvo__slots_feasible(const kvo__slots *sl, const uint64_t *demand);
uint64_t kvo__slots_class_capacity(const kvo__slots *sl, uint32_t c);

#endif
