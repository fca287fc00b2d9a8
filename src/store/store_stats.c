/*
 * The store's statistics (kvo_store_get_stats) and, for tests, its
 * introspection and invariant check (kvo__store_check walks every entry and
 * segment and recounts what the store keeps incrementally).  Both take the
 * whole picture under the store's lock; neither is on a hot path.
 */
#include "store/store_internal.h"

/* -------------------------------------------------------------- stats -- */

static int kvo__store_get_stats_fill(kvo_store *s, kvo_store_stats *out) {
    if (!s || !out) return kvo__error(KVO_EINVAL, "kvo_store_get_stats: NULL argument");
    kvo__store_lock(s);
    memset(out, 0, sizeof *out);
    out->capacity_bytes = s->params.capacity_bytes;
    out->bytes_used = s->bytes_used;
    /* unusable bytes: segment tails of owned segments + the capacity tail */
    uint64_t reserved = s->params.capacity_bytes - (uint64_t)s->sl.nseg * s->sl.seg_bytes;
    for (uint32_t c = 0; c < s->sl.nclass; c++)
        reserved += s->sl.cls_nseg[c] * (s->sl.seg_bytes % s->sl.cls_bytes[c]);
    out->bytes_reserved = reserved;
    out->entries = s->resident;
    out->pinned = s->pinned;
    out->pending = s->pending;
    out->hits = s->hits;
    out->misses = s->misses;
    out->pending_hits = s->pending_hits;
    out->stores = s->stores;
    out->store_skipped_present = s->store_skipped_present;
    out->store_not_admitted = s->store_not_admitted;
    out->rejected_stores = s->rejected_stores;
    out->evictions = s->evictions;
    out->removals = s->removals;
    out->events_dropped = s->events.dropped;
    out->segment_bytes = s->sl.seg_bytes;
    out->segments = s->sl.nseg;
    out->segments_free = s->sl.nfree;
    out->n_groups = s->ngroups;
    for (uint32_t g = 0; g < s->ngroups; g++) {
        kvo_store_group_stats *gs = &out->groups[g];
        gs->chunks = s->g_chunks[g];
        gs->bytes_used = s->g_chunks[g] * s->group_slot[g];
        gs->slot_bytes = s->group_slot[g];
        if (s->group_cls[g] != 0xFF) {
            uint64_t k = kvo__slots_class_capacity(&s->sl, s->group_cls[g]);
            gs->capacity_chunks = k < s->max_entries ? k : s->max_entries;
        }
        gs->hits = s->g_hits[g];
        gs->misses = s->g_misses[g];
        gs->stores = s->g_stores[g];
        gs->evictions = s->g_evictions[g];
    }
    kvo__store_unlock(s);
    return 0;
}

int kvo_store_get_stats(kvo_store *s, kvo_store_stats *out) {
    kvo_store_stats full = KVO_STORE_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_store_get_stats", kvo_store_stats, groups, "KVO_STORE_STATS_INIT", out, full,
                   kvo__store_get_stats_fill(s, &full));
}

/* ------------------------------------------------------------ checking -- */

uint64_t kvo__store_list_len(kvo_store *s, const char *name) {
    for (int i = 0; i < KVO__POL_LISTS; i++)
        if (s->pol->lists[i] && !strcmp(s->pol->lists[i], name)) return s->pq[i + 1].n;
    return 0;
}
uint64_t kvo__store_reclaims(kvo_store *s) { return s->reclaims; }

int kvo__store_check(kvo_store *s) {
    uint64_t resident = 0, ghosts = 0, pinned = 0, pending = 0, bytes = 0;
    uint64_t listed[1 + KVO__POL_LISTS] = {0};
    uint8_t kind[1 + KVO__POL_LISTS] = {0}; /* what a list holds: 0 nothing yet, else KVO__E_READY or _GHOST */
    for (uint32_t e = 0; e < s->pool_cap; e++) {
        kvo__entry *x = &s->ent[e];
        if (x->state == KVO__E_FREE) continue;
        if (kvo__index_find(s, &x->key) != e)
            return kvo__error(KVO_ECORRUPT, "check: entry %u not found through the index", e);
        if (x->q > KVO__POL_LISTS || (x->q && kind[x->q] && kind[x->q] != x->state))
            return kvo__error(KVO_ECORRUPT, "check: entry %u (state %u) in list %u, which holds others", e,
                              x->state, x->q);
        if (x->q) {
            listed[x->q]++;
            kind[x->q] = x->state;
        }
        if (x->state == KVO__E_GHOST) {
            ghosts++;
            if (!x->q) return kvo__error(KVO_ECORRUPT, "check: ghost %u in no list", e);
            if (x->slot != KVO__NIL) return kvo__error(KVO_ECORRUPT, "check: ghost %u holds a slot", e);
            continue;
        }
        if (x->flags & (KVO__F_BATCH | KVO__F_VICTIM | KVO__F_PROTECT))
            return kvo__error(KVO_ECORRUPT, "check: entry %u keeps call-time flags 0x%x", e, x->flags);
        if ((x->flags & KVO__F_RETIRED) && (x->state != KVO__E_READY || x->pins == 0))
            return kvo__error(KVO_ECORRUPT, "check: entry %u retired but not a pinned READY entry", e);
        resident++;
        bytes += s->group_slot[x->key.group];
        if (x->slot == KVO__NIL || s->sl.slot[x->slot].entry != e)
            return kvo__error(KVO_ECORRUPT, "check: entry %u slot %u not owned", e, x->slot);
        if (x->state == KVO__E_PENDING) pending++;
        if (x->pins) pinned++;
        bool should_queue = x->state == KVO__E_READY && x->pins == 0 && !(x->flags & KVO__F_PROTECT);
        if (should_queue != (x->q != 0))
            return kvo__error(KVO_ECORRUPT, "check: entry %u in list %u but evictable %d", e, x->q, should_queue);
        uint32_t g = kvo__slot_seg(&s->sl, x->slot);
        if (kvo__slot_offset(&s->sl, x->slot, g, x->cls) != x->offset ||
            x->offset + s->group_slot[x->key.group] > s->sl.base + (uint64_t)(g + 1) * s->sl.seg_bytes)
            return kvo__error(KVO_ECORRUPT, "check: entry %u offset %llu wrong", e, (unsigned long long)x->offset);
        if (s->sl.seg[g].cls != x->cls) return kvo__error(KVO_ECORRUPT, "check: entry %u in a segment of another class", e);
    }
    if (resident != s->resident || ghosts != s->ghosts || pinned != s->pinned || pending != s->pending ||
        bytes != s->bytes_used)
        return kvo__error(KVO_ECORRUPT, "check: counters differ (resident %llu/%llu ghosts %llu/%llu pinned %llu/%llu "
                          "pending %llu/%llu bytes %llu/%llu)",
                          (unsigned long long)resident, (unsigned long long)s->resident, (unsigned long long)ghosts,
                          (unsigned long long)s->ghosts, (unsigned long long)pinned, (unsigned long long)s->pinned,
                          (unsigned long long)pending, (unsigned long long)s->pending, (unsigned long long)bytes,
                          (unsigned long long)s->bytes_used);
    for (int q = 1; q <= KVO__POL_LISTS; q++)
        if (listed[q] != s->pq[q].n)
            return kvo__error(KVO_ECORRUPT, "check: policy list %d (%s) counts %llu, %llu entries are in it", q,
                              s->pol->lists[q - 1] ? s->pol->lists[q - 1] : "unused", (unsigned long long)s->pq[q].n,
                              (unsigned long long)listed[q]);
    /* slots: per segment used counts and busy counts (with one class, the
     * class's busy count: kvo__slots_busy) */
    uint64_t busy_all = 0;
    for (uint32_t g = 0; g < s->sl.nseg; g++) {
        if (s->sl.seg[g].cls == 0xFF) continue;
        uint32_t c = s->sl.seg[g].cls, used = 0, busy = 0;
        for (uint32_t j = 0; j < s->sl.cls_k[c]; j++) {
            uint32_t e = s->sl.slot[g * s->sl.kmax + j].entry;
            if (e == KVO__NIL) continue;
            used++;
            kvo__entry *x = &s->ent[e];
            if (x->state == KVO__E_PENDING || x->pins || (x->flags & KVO__F_PROTECT)) busy++;
        }
        busy_all += busy;
        uint32_t want_busy = s->sl.nclass == 1 ? 0 : busy; /* one class counts no segment busy */
        if (used != s->sl.seg[g].used || s->sl.seg[g].busy != want_busy || used == 0)
            return kvo__error(KVO_ECORRUPT, "check: segment %u used %u/%u busy %u/%u", g, used, s->sl.seg[g].used,
                              busy, s->sl.seg[g].busy);
    }
    uint64_t cls_busy = 0;
    for (uint32_t c = 0; c < s->sl.nclass; c++) cls_busy += s->sl.cls_busy[c];
    if (busy_all != cls_busy)
        return kvo__error(KVO_ECORRUPT, "check: %llu busy slots, the classes count %llu", (unsigned long long)busy_all,
                          (unsigned long long)cls_busy);
    return 0;
}
