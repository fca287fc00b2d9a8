/*
 * Engine layout registration: validation of the segments against the plan.
 *
 * A segment is an arithmetic progression of pages: page i (i < num_blocks)
 * occupies [base + i*stride, base + i*stride + page).  A layout is accepted
 * only if, for every group, the numbers agree with the geometry (the pages of
 * an offloaded group's segments add up to layers * page_bytes, every segment
 * has the same num_blocks), every segment is well formed (page >= 1, stride
 * >= page, the last page's end representable), and no byte belongs to two
 * segments.
 *
 * Overlap, exactly.  Extents [base, end of last page) are sorted by start and
 * swept; only pairs whose extents intersect are examined.  Interleaved
 * layouts (K and V pages alternating in one tensor, several layers or groups
 * packed in one block row) have intersecting extents but disjoint bytes, so
 * extents alone would give false alarms.  For a pair with the same stride d
 * the question is arithmetic: pages i of A and j of B intersect iff
 * -pB < (bB - bA) + (j - i)d < pA, an open interval of length pA + pB <= 2d
 * that holds at most two multiples of d; for each candidate k = j - i we check
 * that some i in [0, nA) has i + k in [0, nB).  O(1) per pair.  Pairs with
 * different strides whose extents intersect (rare: two tensors of different
 * shapes sharing memory) are checked by walking the pages of the one with
 * fewer pages inside the other's extent and testing the (at most two) pages
 * of the other that can touch each, O(min pages) per such pair.  Validation
 * runs once per registration, never on the copy path.
 *
 * Order.  Segments are regrouped by group, keeping the caller's order within
 * a group: that order defines the slot format (segment-major, see
 * kvo_transfer.h and docs/slot-format.md), so slot_prefix is the running sum
 * of the group's pages.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/xxh.h"

#include "transfer/transfer_internal.h"

typedef struct kvo__xext {
    uintptr_t lo, hi;   /* [lo, hi) */
    uint32_t idx;       /* index in the caller's array */
} kvo__xext;

static int kvo__xext_cmp(const void *a, const void *b) {
    const kvo__xext *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

/* floor(a / b) for b > 0. */
static __int128 kvo__floordiv(__int128 a, __int128 b) {
    __int128 q = a / b;
    if ((a % b) != 0 && a < 0) q--;
    return q;
}

/* Do segments a and b share a byte?  On true, *ia and *ib name a page of each. */
static bool kvo__seg_overlap(const kvo_segment *a, const kvo_segment *b, uint64_t *ia, uint64_t *ib) {
    __int128 ba = (__int128)(uintptr_t)a->base, bb = (__int128)(uintptr_t)b->base;
    if (a->block_stride == b->block_stride) {
        __int128 d = a->block_stride, delta = bb - ba;
        __int128 pa = a->page_bytes, pb = b->page_bytes;
        /* k*d in (-pb - delta, pa - delta) */
        __int128 kmin = kvo__floordiv(-pb - delta, d) + 1;
        __int128 kmax = -kvo__floordiv(-(pa - delta), d) - 1; /* ceil((pa-delta)/d) - 1 */
        for (__int128 k = kmin; k <= kmax && k <= kmin + 2; k++) {
            __int128 lo = k < 0 ? -k : 0;
            __int128 hi_a = a->num_blocks, hi_b = (__int128)b->num_blocks - k;
            __int128 hi = hi_a < hi_b ? hi_a : hi_b;
            if (lo < hi) {
                *ia = (uint64_t)lo;
                *ib = (uint64_t)(lo + k);
                return true;
            }
        }
        return false;
    }
    /* Different strides: walk the pages of the segment with fewer pages. */
    bool swap = a->num_blocks > b->num_blocks;
    const kvo_segment *x = swap ? b : a, *y = swap ? a : b;
    __int128 bx = (__int128)(uintptr_t)x->base, by = (__int128)(uintptr_t)y->base;
    __int128 y_end = by + (__int128)(y->num_blocks - 1) * y->block_stride + y->page_bytes;
    __int128 first = 0;
    if (by > bx) first = kvo__floordiv(by - bx - x->page_bytes, x->block_stride) + 1;
    if (first < 0) first = 0;
    for (__int128 i = first; i < (__int128)x->num_blocks; i++) {
        __int128 s = bx + i * x->block_stride, e = s + x->page_bytes;
        if (s >= y_end) break;
        __int128 j = s < by ? 0 : kvo__floordiv(s - by, y->block_stride);
        for (__int128 jj = j; jj <= j + 1 && jj < (__int128)y->num_blocks; jj++) {
            __int128 ys = by + jj * y->block_stride, ye = ys + y->page_bytes;
            if (ys < e && s < ye) {
                *ia = (uint64_t)(swap ? jj : i);
                *ib = (uint64_t)(swap ? i : jj);
                return true;
            }
        }
    }
    return false;
}

static const char *kvo__gname(const kvo_plan *plan, uint32_t g) {
    const kvo_group_plan *gp = kvo_plan_group(plan, g);
    return gp ? gp->name : "?";
}

void kvo__xlayout_free(kvo__xlayout *l) {
    if (!l) return;
    kvo__free(l->segs);
    kvo__free(l);
}

/* The slot-layout hash: per offloaded group (in id order), its id, its
 * segment count and its segments' page_bytes in the caller's order.  Nothing
 * else (addresses, strides, block counts) changes the slot bytes.  O(groups *
 * segments), both small. */
uint64_t kvo__segments_hash(const kvo_plan *plan, const kvo_segment *segs, size_t n) {
    XXH64_state_t st;
    XXH64_reset(&st, 0x6b766f2d6c61796fULL);
    for (size_t g = 0; g < kvo_plan_num_groups(plan); g++) {
        if (!kvo_plan_group(plan, g)->offloaded) continue;
        uint64_t hdr[2] = {g, 0};
        for (size_t i = 0; i < n; i++) hdr[1] += segs[i].group == g;
        XXH64_update(&st, hdr, sizeof hdr);
        for (size_t i = 0; i < n; i++)
            if (segs[i].group == g) XXH64_update(&st, &segs[i].page_bytes, sizeof(uint64_t));
    }
    return XXH64_digest(&st);
}

int kvo_layout_hash(const kvo_plan *plan, const kvo_segment *segs, size_t n, uint64_t *out) {
    if (!plan || !out || (n && !segs))
        return kvo__error(KVO_EINVAL, "kvo_layout_hash: plan, out (and segs when n > 0) must not be NULL");
    for (size_t i = 0; i < n; i++)
        if (segs[i].group >= kvo_plan_num_groups(plan))
            return kvo__error(KVO_EINVAL, "kvo_layout_hash: segment %zu names group %u; the plan has %zu groups", i,
                              segs[i].group, kvo_plan_num_groups(plan));
    *out = kvo__segments_hash(plan, segs, n);
    return 0;
}

/* One segment on its own: group, base, sizes, address range, reachability. */
static int kvo__xcheck_segment(const kvo_plan *plan, const kvo__xfer_device_ops *dev, void *dev_state,
                               const kvo_segment *s, size_t i) {
    size_t ng = kvo_plan_num_groups(plan);
    if (s->group >= ng)
        return kvo__error(KVO_EINVAL, "segment %zu: group id %u does not exist (the plan has %zu groups)", i,
                          s->group, ng);
    const char *gn = kvo__gname(plan, s->group);
    if (!s->base)
        return kvo__error(KVO_EINVAL, "group '%s' (id %u), segment %zu: base is NULL", gn, s->group, i);
    if (s->num_blocks == 0 || s->page_bytes == 0)
        return kvo__error(KVO_ELAYOUT, "group '%s' (id %u), segment %zu: num_blocks %llu and page_bytes %llu must be >= 1",
                          gn, s->group, i, (unsigned long long)s->num_blocks, (unsigned long long)s->page_bytes);
    if (s->block_stride < s->page_bytes)
        return kvo__error(KVO_ELAYOUT,
                          "group '%s' (id %u), segment %zu: block_stride %llu is smaller than page_bytes %llu "
                          "(pages of consecutive blocks would overlap; stride must be >= %llu)",
                          gn, s->group, i, (unsigned long long)s->block_stride,
                          (unsigned long long)s->page_bytes, (unsigned long long)s->page_bytes);
    uint64_t span, end;
    if (kvo__mul_u64(s->num_blocks - 1, s->block_stride, &span) || kvo__add_u64(span, s->page_bytes, &span) ||
        kvo__add_u64((uint64_t)(uintptr_t)s->base, span, &end) || end > (uint64_t)UINTPTR_MAX)
        return kvo__error(KVO_ERANGE,
                          "group '%s' (id %u), segment %zu: base %p + (num_blocks %llu - 1) * stride %llu + "
                          "page %llu overflows the address space",
                          gn, s->group, i, s->base, (unsigned long long)s->num_blocks,
                          (unsigned long long)s->block_stride, (unsigned long long)s->page_bytes);
    if (dev->check_engine_range) {
        int rc = dev->check_engine_range(dev_state, s->base, span);
        if (rc) return kvo__error_prefix(rc, "group '%s' (id %u), segment %zu", gn, s->group, i);
    }
    return 0;
}

/* Segments regrouped by group, in caller order within a group. */
static void kvo__xregroup(kvo__xlayout *l, const kvo_segment *segs, size_t n) {
    for (size_t i = 0; i < n; i++) l->groups[segs[i].group].n_segs++;
    uint32_t pos = 0;
    for (size_t g = 0; g < l->n_groups; g++) {
        l->groups[g].first_seg = pos;
        pos += l->groups[g].n_segs;
        l->groups[g].n_segs = 0;
    }
    for (size_t i = 0; i < n; i++) {
        kvo__xgroup *G = &l->groups[segs[i].group];
        kvo__xseg *x = &l->segs[G->first_seg + G->n_segs++];
        x->base = (uintptr_t)segs[i].base;
        x->num_blocks = segs[i].num_blocks;
        x->stride = segs[i].block_stride;
        x->page = segs[i].page_bytes;
        x->group = segs[i].group;
        x->user_index = (uint32_t)i;
    }
}

/* Group g's geometry from its segments: they hold the same blocks and their
 * pages add up to the plan's block; work-unit sizes. */
static int kvo__xgroup_geometry(const kvo_plan *plan, const kvo__xfer_device_ops *dev, kvo__xlayout *l, size_t g) {
    const kvo_group_plan *gp = kvo_plan_group(plan, g);
    kvo__xgroup *G = &l->groups[g];
    if (!gp->offloaded) return 0;
    if (G->n_segs == 0) {
        return kvo__error(KVO_ELAYOUT,
                          "group '%s' (id %zu) is offloaded but has no segment in the layout (it needs segments "
                          "whose pages add up to layers %u * page_bytes %llu = %llu bytes per block)",
                          gp->name, g, gp->layers, (unsigned long long)gp->page_bytes,
                          (unsigned long long)(gp->layers * gp->page_bytes));
    }
    uint64_t sum = 0, maxpage = 0;
    const kvo__xseg *s0 = &l->segs[G->first_seg];
    for (uint32_t k = 0; k < G->n_segs; k++) {
        kvo__xseg *x = &l->segs[G->first_seg + k];
        if (x->num_blocks != s0->num_blocks) {
            return kvo__error(KVO_ELAYOUT,
                              "group '%s' (id %zu), segment %u: num_blocks %llu differs from segment %u's %llu "
                              "(every segment of a group holds the same engine blocks)",
                              gp->name, g, x->user_index, (unsigned long long)x->num_blocks, s0->user_index,
                              (unsigned long long)s0->num_blocks);
        }
        x->slot_prefix = sum;
        if (kvo__add_u64(sum, x->page, &sum)) sum = UINT64_MAX;
        if (x->page > maxpage) maxpage = x->page;
    }
    uint64_t want = (uint64_t)gp->layers * gp->page_bytes; /* < 2^63: checked by the plan */
    if (sum != want) {
        char idx[160];
        size_t o = 0;
        idx[0] = '\0';
        for (uint32_t k = 0; k < G->n_segs && o < sizeof idx - 16; k++)
            o += (size_t)snprintf(idx + o, sizeof idx - o, "%s%u", k ? "," : "",
                                  l->segs[G->first_seg + k].user_index);
        if (o >= sizeof idx - 16) snprintf(idx + o, sizeof idx - o, ",...");
        return kvo__error(KVO_ELAYOUT,
                          "group '%s' (id %zu): the pages of its %u segment(s) [%s] add up to %llu bytes per "
                          "block, but the geometry needs layers %u * page_bytes %llu = %llu (last segment %u "
                          "has page_bytes %llu)",
                          gp->name, g, G->n_segs, idx, (unsigned long long)sum, gp->layers,
                          (unsigned long long)gp->page_bytes, (unsigned long long)want,
                          l->segs[G->first_seg + G->n_segs - 1].user_index,
                          (unsigned long long)l->segs[G->first_seg + G->n_segs - 1].page);
    }
    G->num_blocks = s0->num_blocks;
    G->block_bytes = sum;
    G->blocks_per_chunk = gp->blocks_per_chunk;
    G->chunk_bytes = gp->chunk_bytes;
    /* Work units: the device may ask for larger ones (device.h). */
    uint64_t unit = dev->unit_bytes ? dev->unit_bytes : KVO__XUNIT_BYTES;
    uint64_t split = dev->unit_bytes ? 2 * unit : KVO__XSPLIT_BYTES;
    uint64_t part = dev->unit_bytes ? unit : KVO__XPART_BYTES;
    uint64_t ub = unit / maxpage;
    if (ub < 1) ub = 1;
    if (ub > gp->blocks_per_chunk) ub = gp->blocks_per_chunk;
    G->unit_blocks = (uint32_t)ub;
    G->unit_parts = 1;
    if (maxpage >= split) {
        uint64_t parts = kvo__div_ceil_u64(maxpage, part);
        G->unit_parts = parts > UINT32_MAX ? UINT32_MAX : (uint32_t)parts;
    }
    return 0;
}

/* No byte in two segments: extents sorted by start, each compared with the
 * ones starting before it ends.  ext: scratch of n entries. */
static int kvo__xcheck_overlaps(const kvo_plan *plan, const kvo_segment *segs, size_t n, kvo__xext *ext) {
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        ext[i].lo = (uintptr_t)segs[i].base;
        ext[i].hi = ext[i].lo + (uintptr_t)((segs[i].num_blocks - 1) * segs[i].block_stride + segs[i].page_bytes);
        ext[i].idx = (uint32_t)i;
    }
    qsort(ext, n, sizeof *ext, kvo__xext_cmp);
    for (size_t i = 0; i < n && !rc; i++) {
        for (size_t j = i + 1; j < n && ext[j].lo < ext[i].hi; j++) {
            const kvo_segment *a = &segs[ext[i].idx], *b = &segs[ext[j].idx];
            uint64_t pa, pb;
            if (kvo__seg_overlap(a, b, &pa, &pb)) {
                rc = kvo__error(KVO_ELAYOUT,
                                "segments overlap: group '%s' (id %u) segment %u (block %llu at %p, %llu bytes) "
                                "and group '%s' (id %u) segment %u (block %llu at %p, %llu bytes) share bytes",
                                kvo__gname(plan, a->group), a->group, ext[i].idx, (unsigned long long)pa,
                                (void *)((uintptr_t)a->base + pa * a->block_stride),
                                (unsigned long long)a->page_bytes, kvo__gname(plan, b->group), b->group,
                                ext[j].idx, (unsigned long long)pb,
                                (void *)((uintptr_t)b->base + pb * b->block_stride),
                                (unsigned long long)b->page_bytes);
                break;
            }
        }
    }
    return rc;
}

int kvo__xlayout_build(const kvo_plan *plan, const kvo__xfer_device_ops *dev, void *dev_state,
                       const kvo_segment *segs, size_t n, kvo__xlayout **out) {
    size_t ng = kvo_plan_num_groups(plan);
    if (n && !segs) return kvo__error(KVO_EINVAL, "kvo_transfer_set_layout: segs is NULL but n = %zu", n);
    if (n > UINT32_MAX) return kvo__error(KVO_EINVAL, "kvo_transfer_set_layout: %zu segments is too many", n);
    for (size_t i = 0; i < n; i++) {
        int rc = kvo__xcheck_segment(plan, dev, dev_state, &segs[i], i);
        if (rc) return rc;
    }

    kvo__xlayout *l = kvo__calloc(1, sizeof *l);
    kvo__xext *ext = kvo__malloc(sizeof *ext * (n ? n : 1));
    if (!l || !ext || !(l->segs = kvo__malloc(sizeof *l->segs * (n ? n : 1)))) {
        kvo__free(ext);
        kvo__xlayout_free(l);
        return kvo__error(KVO_ENOMEM, "kvo_transfer_set_layout: out of memory for %zu segments", n);
    }
    l->refs = 1;
    l->n_segs = n;
    l->n_groups = ng;
    kvo__xregroup(l, segs, n);
    int rc = 0;
    for (size_t g = 0; g < ng && !rc; g++) rc = kvo__xgroup_geometry(plan, dev, l, g);
    if (!rc) rc = kvo__xcheck_overlaps(plan, segs, n, ext);
    kvo__free(ext);
    if (rc) {
        kvo__xlayout_free(l);
        return rc;
    }

    /* What decides slot bytes: per offloaded group, the pages in order. */
    l->hash = kvo__segments_hash(plan, segs, n);
    *out = l;
    return 0;
}

uint64_t kvo__xlayout_changed(const kvo__xlayout *a, const kvo__xlayout *b) {
    uint64_t mask = 0;
    for (size_t g = 0; g < b->n_groups; g++) {
        const kvo__xgroup *gb = &b->groups[g];
        if (!a) {
            if (gb->n_segs) mask |= UINT64_C(1) << g;
            continue;
        }
        const kvo__xgroup *ga = &a->groups[g];
        if (ga->n_segs != gb->n_segs) {
            mask |= UINT64_C(1) << g;
            continue;
        }
        for (uint32_t k = 0; k < ga->n_segs; k++) {
            const kvo__xseg *x = &a->segs[ga->first_seg + k], *y = &b->segs[gb->first_seg + k];
            if (x->base != y->base || x->num_blocks != y->num_blocks || x->stride != y->stride ||
                x->page != y->page) {
                mask |= UINT64_C(1) << g;
                break;
            }
        }
    }
    return mask;
}
