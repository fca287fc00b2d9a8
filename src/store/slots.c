/*
 * Slot allocator: per-group slot sizes in one byte range, with little waste.
 *
 * The problem.  Groups have very different slot sizes (the GLM-like plan
 * mixes 51.7 MB, 14.2 MB, 1.5 MB and 1 MB).  A slot is one contiguous byte
 * range (it is handed to DMA and to files as one piece).  A general offset
 * allocator wastes nothing up front but fragments under churn: a 51.7 MB
 * store can need 50 scattered 1 MB chunks evicted before a hole is big
 * enough, and which ones is not what the eviction policy would choose.  One
 * slot size for all groups (the peers' bug) wastes most of the space.
 *
 * The design: size-class segments that move between classes.
 *  - Groups with equal slot_bytes form one class (GLM: 4 classes for 7 groups).
 *  - The range is cut into nseg equal segments of S bytes.  A segment is free
 *    or owned by one class and then holds k_c = floor(S / slot_c) slots of
 *    that class.  Slot ids are segment * kmax + index (kmax = the largest
 *    k_c), so the per-slot records (owner entry, free link) are one plain array.
 *  - Each class keeps a list of its segments that have a free slot; inside a
 *    segment, never-used slots come from a bump index and freed ones from a
 *    free list, so assigning a segment is O(1).  Allocation takes a slot from
 *    the class's partial segments first, then a free segment: O(1).
 *  - A segment whose last slot is freed goes back to the free pool at once,
 *    so space flows to whichever class needs it.  Eviction (store.c) walks
 *    the policy's victims in order; each victim frees a slot of its own class
 *    (reused by that class's next stores) and, when it empties a segment,
 *    a whole segment any class can take.  A class whose entries are far from
 *    the victim end is a class with too little space: once the walk has
 *    taken a budget of bytes (32 segments, at most 1/32 of the store) and the
 *    class still lacks room, the victim's whole segment is reclaimed (its
 *    other entries evicted; only if none is pinned or pending).  And when a
 *    class needs a segment while another holds four segments' worth of free
 *    slots, the emptiest of a few of that class's partial segments is
 *    reclaimed (compaction by eviction).  Per segment a call needs, it evicts
 *    at most the walk budget plus one segment beyond what it needs.
 *
 * Fragmentation bound.  Held-but-unusable bytes are (a) the tail of each
 * segment, S mod slot_c < slot_c, i.e. at most max_slot / S of the space,
 * (b) the capacity tail, capacity - nseg * S < S, and (c) free slots in
 * partially used segments, which exist only transiently: they are the room
 * the last evictions made beyond need and are used by the next stores of
 * their class.  S is chosen at creation among all segment counts N
 * (S = capacity / N rounded down to 4096, S >= max_slot) to minimise
 *     sum_c w_c * (S mod slot_c) / S  +  tail / capacity  +  nclass / (2 N)
 * where w_c is class c's share of bytes per token (the shares of a workload
 * that stores every group's chunks for the same tokens) and the last term
 * prices coarse segments (slack per class, collateral of a reclaim).  With
 * capacity >= 40 * max_slot * nclass the first two terms are at most a few
 * per cent.  Measured (tests/test_store_frag.c, a full store after three
 * turnovers, sampled after every request): at least 96 % of the bytes hold
 * chunks at every sample for the deepseek-v4-flash-like and
 * glm-5.3-flash-like plans (automatic and block_size plans, LRU/ARC/S3-FIFO;
 * 97-99.6 % typical minimum), 98-99.7 % on average, and hit rates within 1 %
 * of an ideal LRU that has no slot structure.
 * Feasibility (whether evicting everything evictable could make room) is
 * exact and O(classes): per class, the segments that keep a busy entry
 * (pinned/pending/protected) and the busy entries in them are counted.  With
 * one class (one slot size, as vLLM's manager has) only the busy entries
 * are: every slot not busy can be had, so the per-segment counts, which only
 * reclaim across classes needs, are not kept (kvo__slots_busy).
 */
#include <stdlib.h>

#include "store/slots.h"

static double kvo__seg_cost(uint64_t capacity, uint64_t S, uint64_t N, const uint64_t *b, const double *w,
                            uint32_t nclass) {
    double cost = (double)(capacity - N * S) / (double)capacity;
    double wsum = 0;
    for (uint32_t c = 0; c < nclass; c++) wsum += w[c];
    for (uint32_t c = 0; c < nclass; c++) cost += (w[c] / wsum) * (double)(S % b[c]) / (double)S;
    cost += (double)nclass / (2.0 * (double)N);
    return cost;
}

int kvo__slots_init(kvo__slots *sl, uint64_t capacity, const uint64_t *cls_bytes, const double *cls_weight,
                    uint32_t nclass, uint64_t seg_bytes) {
    memset(sl, 0, sizeof *sl);
    uint64_t maxb = 0, minb = UINT64_MAX;
    for (uint32_t c = 0; c < nclass; c++) {
        if (cls_bytes[c] > maxb) maxb = cls_bytes[c];
        if (cls_bytes[c] < minb) minb = cls_bytes[c];
    }
    if (nclass == 0 || maxb == 0) return kvo__error(KVO_EINVAL, "store: the plan offloads no group");
    uint64_t S = seg_bytes;
    if (S) {
        if (S % KVO_SLOT_ALIGN || S < maxb || S > capacity)
            return kvo__error(KVO_EINVAL,
                              "store: segment_bytes %llu must be a multiple of %u between the largest slot (%llu) "
                              "and capacity (%llu); 0 picks one",
                              (unsigned long long)S, KVO_SLOT_ALIGN, (unsigned long long)maxb,
                              (unsigned long long)capacity);
    } else {
        uint64_t nmax = capacity / maxb;
        if (nmax > 65536) nmax = 65536;
        double best = 1e300;
        for (uint64_t N = 1; N <= nmax; N++) {
            uint64_t s = capacity / N / KVO_SLOT_ALIGN * KVO_SLOT_ALIGN;
            if (s < maxb) break;
            double cost = kvo__seg_cost(capacity, s, N, cls_bytes, cls_weight, nclass);
            if (cost < best - 1e-12) {
                best = cost;
                S = s;
            }
        }
        if (!S) return kvo__error(KVO_EINVAL, "store: capacity %llu is below the largest slot %llu",
                                  (unsigned long long)capacity, (unsigned long long)maxb);
    }
    uint64_t nseg = capacity / S, kmax = S / minb;
    uint64_t nslots;
    if (nseg >= KVO__NIL || kvo__mul_u64(nseg, kmax, &nslots) || nslots >= KVO__NIL)
        return kvo__error(KVO_ERANGE,
                          "store: %llu segments of %llu slots is over 2^32 slots; raise the chunk size or lower "
                          "capacity",
                          (unsigned long long)nseg, (unsigned long long)kmax);
    sl->capacity = capacity;
    sl->seg_bytes = S;
    sl->nseg = (uint32_t)nseg;
    sl->kmax = (uint32_t)kmax;
    sl->kmax_m = kmax > 1 ? UINT64_MAX / kmax + 1 : 0;
    sl->nclass = nclass;
    for (uint32_t c = 0; c < nclass; c++) {
        sl->cls_bytes[c] = cls_bytes[c];
        sl->cls_k[c] = (uint32_t)(S / cls_bytes[c]);
        sl->cls_k_m[c] = sl->cls_k[c] > 1 ? UINT64_MAX / sl->cls_k[c] + 1 : 0;
        sl->cls_partial[c] = KVO__NIL;
    }
    size_t ns = (size_t)nseg;
    sl->seg = kvo__malloc(ns * sizeof *sl->seg);
    sl->slot = kvo__malloc((size_t)nslots * sizeof *sl->slot);
    if (!sl->seg || !sl->slot) {
        kvo__slots_free(sl);
        return kvo__error(KVO_ENOMEM, "store: cannot allocate the slot tables (%llu slots)",
                          (unsigned long long)nslots);
    }
    memset(sl->seg, 0, ns * sizeof *sl->seg);
    for (uint64_t i = 0; i < nslots; i++) sl->slot[i].entry = KVO__NIL;
    /* free list in address order */
    for (uint32_t i = 0; i < sl->nseg; i++) {
        sl->seg[i].cls = KVO__SEG_FREE;
        sl->seg[i].next = i + 1 < sl->nseg ? i + 1 : KVO__NIL;
        sl->seg[i].prev = KVO__NIL;
        sl->seg[i].free = KVO__NIL;
    }
    sl->free_head = 0;
    sl->nfree = sl->nseg;
    return 0;
}

void kvo__slots_free(kvo__slots *sl) {
    kvo__free(sl->seg);
    kvo__free(sl->slot);
    memset(sl, 0, sizeof *sl);
}

static void kvo__partial_push(kvo__slots *sl, uint32_t c, uint32_t g) {
    sl->seg[g].prev = KVO__NIL;
    sl->seg[g].next = sl->cls_partial[c];
    if (sl->cls_partial[c] != KVO__NIL) sl->seg[sl->cls_partial[c]].prev = g;
    sl->cls_partial[c] = g;
}

static void kvo__partial_unlink(kvo__slots *sl, uint32_t c, uint32_t g) {
    if (sl->seg[g].prev != KVO__NIL) sl->seg[sl->seg[g].prev].next = sl->seg[g].next;
    else sl->cls_partial[c] = sl->seg[g].next;
    if (sl->seg[g].next != KVO__NIL) sl->seg[sl->seg[g].next].prev = sl->seg[g].prev;
    sl->seg[g].prev = sl->seg[g].next = KVO__NIL;
}

uint32_t kvo__slots_alloc(kvo__slots *sl, uint32_t c, uint32_t entry, uint64_t *offset) {
    uint32_t g = sl->cls_partial[c];
    uint32_t k = sl->cls_k[c];
    if (g == KVO__NIL) {
        g = sl->free_head;
        if (g == KVO__NIL) return KVO__NIL;
        sl->free_head = sl->seg[g].next;
        sl->nfree--;
        sl->seg[g].cls = (uint8_t)c;
        sl->seg[g].used = 0;
        sl->seg[g].bump = 0;
        sl->seg[g].free = KVO__NIL;
        assert(sl->seg[g].busy == 0);
        kvo__partial_push(sl, c, g);
        sl->cls_free[c] += k;
        sl->cls_nseg[c]++;
    }
    uint32_t id;
    if (sl->seg[g].free != KVO__NIL) {
        id = sl->seg[g].free;
        sl->seg[g].free = sl->slot[id].next;
    } else {
        assert(sl->seg[g].bump < k);
        id = g * sl->kmax + sl->seg[g].bump++;
    }
    sl->seg[g].used++;
    sl->cls_free[c]--;
    if (sl->seg[g].used == k) kvo__partial_unlink(sl, c, g);
    sl->slot[id].entry = entry;
    *offset = kvo__slot_offset(sl, id, g, c);
    return id;
}

uint32_t kvo__slots_reuse(kvo__slots *sl, uint32_t id, uint32_t entry, uint64_t *offset) {
    uint32_t g = kvo__slot_seg(sl, id);
    sl->slot[id].entry = entry;
    *offset = kvo__slot_offset(sl, id, g, sl->seg[g].cls);
    return id;
}

void kvo__slots_release(kvo__slots *sl, uint32_t id) {
    uint32_t g = kvo__slot_seg(sl, id);
    uint32_t c = sl->seg[g].cls;
    uint32_t k = sl->cls_k[c];
    assert(c != KVO__SEG_FREE && sl->seg[g].used > 0 && sl->slot[id].entry != KVO__NIL);
    sl->slot[id].entry = KVO__NIL;
    if (sl->seg[g].used == k) kvo__partial_push(sl, c, g);
    sl->seg[g].used--;
    sl->cls_free[c]++;
    if (sl->seg[g].used == 0) {
        assert(sl->seg[g].busy == 0);
        kvo__partial_unlink(sl, c, g);
        sl->cls_free[c] -= k;
        sl->cls_nseg[c]--;
        sl->seg[g].cls = KVO__SEG_FREE;
        sl->seg[g].next = sl->free_head;
        sl->free_head = g;
        sl->nfree++;
    } else {
        sl->slot[id].next = sl->seg[g].free;
        sl->seg[g].free = id;
    }
}

bool kvo__slots_feasible(const kvo__slots *sl, const uint64_t *demand) {
    /* one class: every slot not busy can be had, evicted or free (the
     * general count below comes to the same, from per-segment counts that
     * one class does not keep) */
    if (sl->nclass == 1) return demand[0] <= (uint64_t)sl->cls_k[0] * sl->nseg - sl->cls_busy[0];
    uint64_t busyseg = 0, need = 0;
    for (uint32_t c = 0; c < sl->nclass; c++) busyseg += sl->cls_busyseg[c];
    for (uint32_t c = 0; c < sl->nclass; c++) {
        if (!demand[c]) continue;
        uint64_t k = sl->cls_k[c];
        uint64_t room = k * sl->cls_busyseg[c] - sl->cls_busy[c];
        if (demand[c] > room) need += kvo__div_ceil_u64(demand[c] - room, k);
    }
    return need <= sl->nseg - busyseg;
}

uint64_t kvo__slots_class_capacity(const kvo__slots *sl, uint32_t c) {
    return (uint64_t)sl->cls_k[c] * sl->nseg;
}
