/*
 * kvo_store_prepare_store and kvo_store_complete_store: writing chunks.
 *
 * prepare_store, the only call that evicts, runs in phases so that it is
 * all-or-nothing without an undo log for the common failure:
 *  1. validate every key (group, duplicates: a bit filter, then only the
 *     keys it flags are compared) and resolve entries: no change;
 *  2. count the slots each class needs and test feasibility exactly in
 *     O(classes) (kvo__slots_feasible): ENOSPC here changes nothing;
 *  3. protect the batch's READY keys (out of the policy queues, busy; under
 *     LRU, when they lead the list as a touch of them left them, busy where
 *     they are: kvo__ps_protect says why the walk cannot reach them);
 *  4. plan: take victims from the policy and simulate the slot frees until
 *     every class has room (after a walk budget without success the
 *     victim's whole segment is reclaimed; a class with four segments of
 *     spare slots gives up its emptiest partial segment first: see
 *     slots.c); the plan is guaranteed to succeed by 2, so the only failure
 *     left is an evicted[] buffer that is too small (ERANGE), undone by
 *     putting the victims back in reverse order (exact for victims taken
 *     from the victim end; reclaimed ones go back to the victim end).  With
 *     one slot class (one slot size, as in vLLM's manager) every victim
 *     gives the class exactly one slot, so the plan is a count and victims
 *     come strictly in policy order, never by segment reclaim
 *     (kvo__ps_plan_one);
 *  5. commit: free the victims' slots (ghosts or gone), allocate slots in key
 *     order, mark new entries PENDING, unprotect (the batch's present keys
 *     count as used).  With one slot class a victim's slot is not freed but
 *     handed to the next new key (and the ones no new key takes freed last):
 *     the same room, without the segment bookkeeping of a free and an
 *     allocation; under LRU, which keeps no ghosts, the victim's whole entry
 *     is (KVO__HO_ENTRY below).
 *
 * Each phase is one function below; kvo_store_prepare_store only sequences
 * them and owns the lock.
 */
#include "store/store_internal.h"

/* -------------------------------------------------------------- store -- */

static inline int kvo__push_victim(kvo_store *s, size_t nv, uint32_t e) {
    int rc = nv < s->sc_vcap ? 0 : kvo__grow((void **)&s->sc_vict, &s->sc_vcap, nv + 1, sizeof *s->sc_vict, 256,
                                             "store: victim list");
    if (rc) return rc;
    s->sc_vict[nv] = e;
    return 0;
}

/* Duplicate detection over keys[0..n), resolved (s->sc_ent), which also
 * leaves each absent key's kvo__key_mix in s->sc_mix (its index insertion
 * at commit reuses it).  A present key is its entry (the index holds one per
 * key), so a repeat of it is the same entry: present keys are marked
 * (KVO__F_BATCH, cleared again before returning), as complete_store does,
 * with no hashing.  An absent key can only repeat an absent key: each sets
 * a bit of a 2048-bit filter chosen by its mix, and a key whose bit was set
 * already (a repeat, or a collision: about 1 in 14 of batches of 18 new
 * keys, vLLM's mean on the Mooncake trace) is a candidate, compared by mix,
 * then key, with the earlier absent keys.  Past KVO__DUP_CANDIDATES
 * candidates (batches of hundreds of new keys) the absent keys go through a
 * set of batch positions instead (s->sc_set, sized 2n), so a batch costs
 * O(n) either way.  Clearing and probing that set for every batch was 15 %
 * of prepare_store's time.  1 and *a < *b on a repeat. */
#define KVO__DUP_FILTER_WORDS 32
#define KVO__DUP_CANDIDATES 8
static int kvo__find_dup_set(kvo_store *s, const kvo_chunk_key *keys, size_t n, size_t *a, size_t *b) {
    const uint32_t *ent = s->sc_ent;
    size_t m = 16;
    while (m < 2 * n) m *= 2;
    uint64_t *t = s->sc_set;
    const uint64_t *mix = s->sc_mix;
    memset(t, 0xFF, m * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        if (ent[i] != KVO__NIL) continue;
        uint64_t h = mix[i];
        for (size_t j = h & (m - 1);; j = (j + 1) & (m - 1)) {
            if (t[j] == UINT64_MAX) { t[j] = i; break; }
            size_t o = (size_t)t[j];
            if (mix[o] == h && kvo_chunk_key_eq(&keys[o], &keys[i])) { *a = o; *b = i; return 1; }
        }
    }
    return 0;
}

static int kvo__find_dup(kvo_store *s, const kvo_chunk_key *keys, size_t n, size_t *a, size_t *b) {
    const uint32_t *ent = s->sc_ent;
    size_t i, nc = 0, cand[KVO__DUP_CANDIDATES];
    int dup = 0;
    uint64_t filter[KVO__DUP_FILTER_WORDS] = {0};
    for (i = 0; i < n; i++) {
        uint32_t e = ent[i];
        if (e == KVO__NIL) {
            uint64_t h = kvo__key_mix(&keys[i]), bit = UINT64_C(1) << (h >> 58);
            uint64_t *w = &filter[(h >> 53) & (KVO__DUP_FILTER_WORDS - 1)];
            s->sc_mix[i] = h;
            if (KVO__UNLIKELY(*w & bit)) {
                if (nc < KVO__DUP_CANDIDATES) cand[nc] = i;
                nc++;
            }
            *w |= bit;
        } else if (s->ent[e].flags & KVO__F_BATCH) {
            size_t o = 0;
            while (ent[o] != e) o++;
            *a = o;
            *b = i;
            dup = 1;
            break;
        } else {
            s->ent[e].flags |= KVO__F_BATCH;
        }
    }
    while (i > 0)
        if (ent[--i] != KVO__NIL) s->ent[ent[i]].flags &= (uint8_t)~KVO__F_BATCH;
    if (dup || nc == 0) return dup;
    if (nc > KVO__DUP_CANDIDATES) return kvo__find_dup_set(s, keys, n, a, b);
    const uint64_t *mix = s->sc_mix;
    for (size_t c = 0; c < nc; c++) {
        size_t k = cand[c];
        for (size_t o = 0; o < k; o++)
            if (ent[o] == KVO__NIL && mix[o] == mix[k] && kvo_chunk_key_eq(&keys[o], &keys[k])) {
                *a = o;
                *b = k;
                return 1;
            }
    }
    return 0;
}

/* Simulation state of the eviction plan. */
typedef struct kvo__plan {
    uint64_t demand[KVO__MAX_CLASSES];
    int64_t freeslots[KVO__MAX_CLASSES]; /* free slots in the class's non-empty segments */
    uint64_t segs_needed;                /* sum over classes of segments still needed */
    uint64_t nfree;                      /* free segments */
    int64_t entries_short;               /* residents to evict for pool room */
} kvo__plan;

/* Only the store's classes are read: zeroing the whole struct (a rep stos
 * of 1 KiB) was 4 % of prepare_store's time in vLLM's cycle. */
static inline void kvo__plan_init(const kvo_store *s, kvo__plan *pl) {
    for (uint32_t c = 0; c < s->sl.nclass; c++) pl->demand[c] = 0, pl->freeslots[c] = 0;
    pl->segs_needed = pl->nfree = 0;
    pl->entries_short = 0;
}

static uint64_t kvo__cls_need(const kvo_store *s, const kvo__plan *pl, uint32_t c) {
    int64_t d = (int64_t)pl->demand[c] - pl->freeslots[c];
    if (d <= 0) return 0;
    return kvo__slots_segs(&s->sl, c, (uint64_t)d);
}

/* Apply a planned victim to the simulation. */
static void kvo__plan_victim(kvo_store *s, kvo__plan *pl, uint32_t e) {
    kvo__slots *sl = &s->sl;
    kvo__entry *x = &s->ent[e];
    uint32_t g = kvo__slot_seg(sl, x->slot);
    uint32_t c = x->cls;
    uint64_t before = kvo__cls_need(s, pl, c);
    sl->seg[g].planned++;
    if (sl->seg[g].used - sl->seg[g].planned > 0) {
        pl->freeslots[c]++;
    } else {
        pl->freeslots[c] -= (int64_t)sl->cls_k[c] - 1;
        pl->nfree++;
    }
    pl->segs_needed = pl->segs_needed - before + kvo__cls_need(s, pl, c);
    pl->entries_short--;
    x->flags |= KVO__F_VICTIM;
}

/* How far the eviction walk may go in policy order, in bytes, before it
 * reclaims a whole segment for a class that lacks room.  Victims taken in
 * policy order cost no hits (the policy chose them) and their slots are
 * reused by their own classes' next stores; a reclaim evicts the segment's
 * other entries out of order.  32 segments (at most 1/32 of the store) keeps
 * hit rates within 1 % of an ideal unsegmented LRU in tests/test_store_frag.c
 * while the transient over-eviction stays small. */
static uint64_t kvo__walk_budget(const kvo_store *s) {
    uint64_t w = 32 * s->sl.seg_bytes, cap = s->params.capacity_bytes / 32;
    if (w > cap) w = cap;
    return w > s->sl.seg_bytes ? w : s->sl.seg_bytes;
}

/* Compaction (below) only takes from a class with at least this many free
 * slots beyond the batch's needs: four segments' worth.  Smaller thresholds
 * reclaim constantly in plans with few slots per segment and evict entries
 * out of policy order. */
static uint64_t kvo__compact_min(const kvo_store *s, uint32_t c) { return 4 * (uint64_t)s->sl.cls_k[c]; }

/* Take every live entry of segment g (none busy) as a victim. */
static int kvo__reclaim_seg(kvo_store *s, kvo__plan *pl, uint32_t g, size_t *nv) {
    uint32_t c = s->sl.seg[g].cls;
    s->reclaims++;
    for (uint32_t j = 0; j < s->sl.cls_k[c]; j++) {
        uint32_t x = s->sl.slot[g * s->sl.kmax + j].entry;
        if (x == KVO__NIL || (s->ent[x].flags & KVO__F_VICTIM)) continue;
        s->pol->remove(s, x);
        if (kvo__push_victim(s, *nv, x)) {
            s->pol->reinsert(s, x);
            return KVO_ENOMEM;
        }
        (*nv)++;
        kvo__plan_victim(s, pl, x);
    }
    return 0;
}

/* Compaction by eviction: when a class needs a segment and another class
 * holds at least a segment's worth of free slots (left by earlier
 * evictions), the emptiest of the first few partial segments of that class
 * (at most half full, nothing busy) is reclaimed: few evictions buy a whole
 * segment, and stray free slots turn back into usable space.  Bounded: 8
 * segments per class looked at. */
static uint32_t kvo__compact_pick(kvo_store *s, const kvo__plan *pl) {
    kvo__slots *sl = &s->sl;
    uint32_t best = KVO__NIL, best_live = UINT32_MAX;
    for (uint32_t c = 0; c < sl->nclass; c++) {
        uint32_t k = sl->cls_k[c];
        /* only classes with a segment's worth of slots to spare beyond
         * what this batch needs from them */
        if (pl->freeslots[c] - (int64_t)pl->demand[c] < (int64_t)kvo__compact_min(s, c)) continue;
        uint32_t g = sl->cls_partial[c];
        for (int t = 0; t < 8 && g != KVO__NIL; t++, g = sl->seg[g].next) {
            if (sl->seg[g].busy) continue;
            uint32_t live = sl->seg[g].used - sl->seg[g].planned;
            if (live == 0 || live * 2 > k || live >= best_live) continue;
            best = g;
            best_live = live;
        }
    }
    return best;
}

/* prepare_store's scratch: sc_ent[i] is a present key's entry, NIL for a key
 * to store, or this marker for a key the admission sketch turned away. */
#define KVO__NOT_ADMITTED (KVO__NIL - 1)

/* A present key of the batch that prepare_store protects (or, storing
 * nothing, counts as used): READY and not pinned (pinned is busy already);
 * none with params.ignore_present (left alone, possibly evicted). */
static inline bool kvo__protectable(const kvo_store *s, uint32_t e) {
    return e < KVO__NOT_ADMITTED && s->ent[e].state == KVO__E_READY && s->ent[e].pins == 0 &&
           !s->params.ignore_present;
}

/* Undo the protection of a present batch key (commit or rollback): it
 * rejoins the policy queues, as a use (one protected in place is there
 * already).  No-op for other sc_ent values. */
static inline void kvo__unprotect(kvo_store *s, uint32_t e) {
    if (e >= KVO__NOT_ADMITTED || !(s->ent[e].flags & KVO__F_PROTECT)) return;
    bool in_place = s->ent[e].flags & KVO__F_IN_PLACE;
    s->ent[e].flags &= (uint8_t)~(KVO__F_PROTECT | KVO__F_IN_PLACE);
    kvo__busy(s, e, -1);
    if (!in_place) s->pol->reinsert(s, e);
}

static inline bool kvo__plan_done(const kvo__plan *pl) {
    return pl->segs_needed <= pl->nfree && pl->entries_short <= 0;
}

/* What resolution found in a batch. */
typedef struct kvo__batch {
    uint64_t n_new, bytes_new, n_not_admitted, n_present;
} kvo__batch;

/* Validation: arguments, keys, no key twice; resolves the batch into
 * s->sc_ent.  Lock held; changes nothing the caller can see. */
static int kvo__ps_validate(kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn) {
    int rc = kvo__resolve(s, keys, n, fn);
    if (rc) return rc;
    size_t da = 0, db = 0;
    if (kvo__find_dup(s, keys, n, &da, &db))
        return kvo__error(KVO_EINVAL, "%s: key %zu repeats key %zu (group %u); a batch names each chunk once", fn,
                          db, da, keys[db].group);
    return 0;
}

/* Resolution, step 1: classify the resolved keys (present, turned away by
 * admission (admit_after's count), or new: counted in pl->demand per
 * class). */
static void kvo__ps_classify(kvo_store *s, const kvo_chunk_key *keys, size_t n, kvo__plan *pl, kvo__batch *b) {
    for (size_t i = 0; i < n; i++) {
        if (s->sc_ent[i] != KVO__NIL) {
            b->n_present++;
            continue;
        }
        if (s->cms && kvo__cms_get(s, &keys[i]) < s->params.admit_after) {
            b->n_not_admitted++;
            s->sc_ent[i] = KVO__NOT_ADMITTED;
            continue;
        }
        pl->demand[s->group_cls[keys[i].group]]++;
        b->n_new++;
        b->bytes_new += s->group_slot[keys[i].group];
    }
}

/* Resolution, steps 2 and 3: exact feasibility (the batch's protectable keys
 * count as busy), then protect them (out of the policy queues).  ENOSPC
 * changes nothing but the rejected_stores counter. */
static int kvo__ps_protect(kvo_store *s, size_t n, const kvo__plan *pl, const kvo__batch *b, const char *fn) {
    uint64_t busy_extra = 0;
    /* in place: under LRU, the protectable keys are the list's first ones,
     * the last key at the head and each earlier one next after the later
     * (as a touch of them in key order leaves them: vLLM touches its hits
     * just before it stores the request) */
    bool in_place = s->pol == &kvo__policy_lru;
    uint32_t later = KVO__NIL; /* the last protectable key so far */
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (kvo__protectable(s, e)) {
            kvo__busy(s, e, +1);
            busy_extra++;
            in_place = in_place && (later == KVO__NIL || s->ent[e].next == later);
            later = e;
        }
    }
    in_place = in_place && later != KVO__NIL && s->pq[KVO__LRU_LIST].head == later;
    uint64_t busy_total = s->pending + s->pinned + busy_extra;
    if (busy_total + b->n_new > s->max_entries || !kvo__slots_feasible(&s->sl, pl->demand)) {
        for (size_t i = 0; i < n; i++) {
            uint32_t e = s->sc_ent[i];
            if (kvo__protectable(s, e)) kvo__busy(s, e, -1);
        }
        s->rejected_stores++;
        uint64_t pinned_b = 0;
        for (uint32_t c = 0; c < s->sl.nclass; c++) pinned_b += s->sl.cls_busy[c] * s->sl.cls_bytes[c];
        return kvo__error(KVO_ENOSPC,
                          "%s: %llu new chunks need %llu bytes; capacity %llu, of which %llu bytes are pinned, "
                          "pending or in this batch (%llu pinned, %llu pending entries, %llu entries max); "
                          "complete loads/stores first, store fewer chunks per batch, or raise capacity",
                          fn, (unsigned long long)b->n_new, (unsigned long long)b->bytes_new,
                          (unsigned long long)s->params.capacity_bytes, (unsigned long long)pinned_b,
                          (unsigned long long)s->pinned, (unsigned long long)s->pending,
                          (unsigned long long)s->max_entries);
    }
    /* Protection takes each key out of the policy's queues, and unprotect
     * puts it back as a use: under LRU, in key order at the head.  Keys
     * found in place (above) are there already, so they stay: the same
     * list after the call.  The eviction walk cannot reach them while they
     * stay: it takes from the tail, and the list minus these keys (the list
     * the walk would see had they been taken out) sits in front of them in
     * the same order, so it takes the same victims in the same order; the
     * feasibility test above guarantees those suffice (the walk never runs
     * out).  Segment reclaim and compaction skip busy segments, and these
     * keys are busy.  kvo__ps_plan still refuses a protected victim. */
    uint8_t f = (uint8_t)(KVO__F_PROTECT | (in_place ? KVO__F_IN_PLACE : 0));
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (kvo__protectable(s, e)) {
            if (!in_place) s->pol->remove(s, e);
            s->ent[e].flags |= f;
        }
    }
    return 0;
}

/* The policy's next victim into s->sc_vict[(*nv)++] and *v: 0, or 1 when
 * the policy has none (cannot happen after the feasibility test), or an
 * error with the victim given back: a key of the batch reached (cannot
 * happen either: kvo__ps_protect), no memory for the victim list. */
static inline int kvo__ps_take_victim(kvo_store *s, size_t *nv, uint32_t *v, const char *fn) {
    *v = s->pol->take_victim(s);
    if (*v == KVO__NIL) return 1;
    if (s->ent[*v].flags & KVO__F_PROTECT) {
        s->pol->untake(s, *v);
        return kvo__error(KVO_ENOSPC, "%s: internal: the eviction walk reached a key of the batch", fn);
    }
    if (kvo__push_victim(s, *nv, *v)) {
        s->pol->untake(s, *v);
        return kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
    }
    (*nv)++;
    return 0;
}

/* Step 4 with one slot class: every victim makes exactly one more slot
 * available to the class (a slot in a segment that stays partly used, or its
 * segment becomes free: k - 1 free slots leave the class's count and k join
 * the free segments), so the plan's simulation reduces to a count: the
 * victims needed are the larger of the slots short, demand - free slots -
 * free segments x k, and the entries short.  The victims are the same ones
 * the general walk takes (in policy order; it reclaims segments only for a
 * class lacking room while free slots of the class sit in other segments,
 * which cannot happen with one class), without their per-victim bookkeeping
 * (7 % of vLLM's store cycle in instructions). */
static int kvo__ps_plan_one(kvo_store *s, const kvo__plan *pl, size_t *nv, const char *fn) {
    int64_t slots_short = (int64_t)pl->demand[0] - pl->freeslots[0] - (int64_t)(pl->nfree * s->sl.cls_k[0]);
    int64_t want = slots_short > pl->entries_short ? slots_short : pl->entries_short;
    for (int64_t i = 0; i < want; i++) {
        uint32_t v;
        int rc = kvo__ps_take_victim(s, nv, &v, fn);
        if (rc == 1) /* cannot happen after the feasibility test */
            return kvo__error(KVO_ENOSPC, "%s: internal: eviction plan fell short (%lld more victims needed)", fn,
                              (long long)(want - i));
        if (rc) return rc;
    }
    return 0;
}

/* Eviction, step 4: take victims (into s->sc_vict[0..*nv)) until every class
 * has room.  On failure the caller rolls back the *nv victims taken. */
static int kvo__ps_plan(kvo_store *s, kvo__plan *pl, uint64_t n_new, size_t *nv, const char *fn) {
    for (uint32_t c = 0; c < s->sl.nclass; c++) pl->freeslots[c] = (int64_t)s->sl.cls_free[c];
    pl->nfree = s->sl.nfree;
    for (uint32_t c = 0; c < s->sl.nclass; c++) pl->segs_needed += kvo__cls_need(s, pl, c);
    pl->entries_short = (int64_t)(s->resident + n_new) - (int64_t)s->max_entries;
    if (s->sl.nclass == 1) return kvo__ps_plan_one(s, pl, nv, fn);
    uint64_t walked_bytes = 0;
    while (!kvo__plan_done(pl)) {
        if (pl->segs_needed > pl->nfree) {
            uint32_t g = kvo__compact_pick(s, pl);
            if (g != KVO__NIL) {
                if (kvo__reclaim_seg(s, pl, g, nv))
                    return kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
                continue;
            }
        }
        uint32_t v;
        int rc = kvo__ps_take_victim(s, nv, &v, fn);
        if (rc == 1) break; /* reported below */
        if (rc) return rc;
        kvo__plan_victim(s, pl, v);
        walked_bytes += s->group_slot[s->ent[v].key.group];
        if (!kvo__plan_done(pl) && pl->segs_needed > pl->nfree && walked_bytes >= kvo__walk_budget(s)) {
            /* reclaim v's whole segment if nothing in it is busy */
            uint32_t g = kvo__slot_seg(&s->sl, s->ent[v].slot);
            if (s->sl.seg[g].busy == 0 && s->sl.seg[g].used > s->sl.seg[g].planned) {
                if (kvo__reclaim_seg(s, pl, g, nv))
                    return kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
                walked_bytes = 0;
            }
        }
    }
    if (!kvo__plan_done(pl))
        return kvo__error(KVO_ENOSPC, "%s: internal: eviction plan fell short (%llu segments needed, %llu free)", fn,
                          (unsigned long long)pl->segs_needed, (unsigned long long)pl->nfree);
    return 0;
}

/* What commit does with the victims (prepare_store's step 5):
 *  - KVO__HO_NONE (several slot classes): each victim's slot is freed, then
 *    each new key allocates one;
 *  - KVO__HO_SLOT (one slot class): victim i's slot goes to new key i (the
 *    same room, without the segment bookkeeping of a free and an
 *    allocation: ~7 % of vLLM's store cycle), the victim becomes a ghost;
 *  - KVO__HO_ENTRY (one slot class, and a policy that keeps no ghosts: LRU):
 *    victim i's whole entry goes to new key i, slot and all: its key leaves
 *    the index and the new one enters, and nothing else moves (the slot's
 *    record already names the entry, the offset is the entry's own).  The
 *    victim's entry is in cache (the plan took it); the slot record a reuse
 *    rewrites, and the ghost's trip through the pool, were 6 % of the
 *    cycle. */
enum { KVO__HO_NONE, KVO__HO_SLOT, KVO__HO_ENTRY };

/* Victims' entries are cached (the plan read them), but the table slot
 * each one's removal rewrites (ent.tpos) and its slot's record are cold:
 * at 1e6 keys and more that read was 30 % of a store cycle.  Fetch them a
 * few victims ahead so that the misses overlap (the record only when it
 * will be written). */
#define KVO__VICTIM_AHEAD 6
static inline void kvo__victim_prefetch(const kvo_store *s, uint32_t v, int ho) {
    const kvo__entry *x = &s->ent[v];
    __builtin_prefetch(&s->ix.tab[x->tpos], 1);
    if (ho != KVO__HO_ENTRY) __builtin_prefetch(&s->sl.slot[x->slot], 1);
}

/* A victim's end as a ghost (which the policy keeps or drops). */
static inline void kvo__victim_ghost(kvo_store *s, uint32_t v) {
    s->ent[v].state = KVO__E_GHOST;
    s->ghosts++;
    s->pol->evicted(s, v);
}

/* Commit, step 5a: the planned victims leave, reported in evicted[] when
 * given.  KVO__HO_NONE: their slots freed, they become ghosts; KVO__HO_SLOT:
 * sc_vict[i] becomes victim i's slot, still allocated, for step 5b to hand
 * to new key i, and they become ghosts; KVO__HO_ENTRY: they stay as they
 * are (entry, slot, index) for step 5b, which takes them in order and ends
 * the ones left over (kvo__ps_commit_rest). */
static void kvo__ps_commit_victims(kvo_store *s, size_t nv, kvo_chunk_key *evicted, kvo_slot *evicted_slots,
                                   int ho) {
    for (size_t i = 0; i < nv; i++) {
        if (i + KVO__VICTIM_AHEAD < nv) kvo__victim_prefetch(s, s->sc_vict[i + KVO__VICTIM_AHEAD], ho);
        uint32_t v = s->sc_vict[i];
        kvo__entry *x = &s->ent[v];
        uint32_t g = x->key.group;
        if (evicted) {
            evicted[i] = x->key;
            evicted_slots[i].offset = x->offset;
            evicted_slots[i].bytes = s->group_slot[g];
        }
        if (ho == KVO__HO_NONE) s->sl.seg[kvo__slot_seg(&s->sl, x->slot)].planned = 0; /* one class: never planned */
        x->flags &= (uint8_t)~KVO__F_VICTIM;
        kvo__event(s, KVO_EVENT_EVICTED, &x->key);
        s->evictions++;
        s->g_evictions[g]++;
        if (ho == KVO__HO_ENTRY) {
            kvo__resident_leave(s, v);
            continue;
        }
        if (ho == KVO__HO_SLOT) s->sc_vict[i] = kvo__resident_unslot(s, v);
        else kvo__resident_release(s, v);
        kvo__victim_ghost(s, v);
    }
}

/* Commit, step 5b: new key i gets an entry and a slot, PENDING; returns the
 * entry.  While *ho < nho it takes what victim *ho left (step 5a: its slot,
 * KVO__HO_SLOT, or its entry with the slot, KVO__HO_ENTRY) and *ho
 * advances; otherwise a revived ghost or a fresh entry, and a free slot. */
static uint32_t kvo__ps_commit_new(kvo_store *s, const kvo_chunk_key *key, uint64_t mix, kvo_slot *slot_out,
                                   size_t *ho, size_t nho, int mode) {
    uint32_t g = key->group;
    uint32_t c = s->group_cls[g];
    uint32_t e, slot;
    uint64_t off = 0;
    if (mode == KVO__HO_ENTRY && *ho < nho) {
        e = s->sc_vict[(*ho)++];
        slot = s->ent[e].slot;
        off = s->ent[e].offset;
        kvo__index_remove(s, e); /* the victim's key */
        kvo__entry_init(s, e, key, mix);
    } else {
        /* resolution found no resident entry; only a ghost can be there
         * (none exist under LRU: skip the second probe) */
        e = s->ghosts ? kvo__index_find_h(s, key, mix) : KVO__NIL;
        if (e != KVO__NIL) { /* a ghost: revive */
            assert(s->ent[e].state == KVO__E_GHOST);
            s->pol->ghost_claim(s, e);
            s->ghosts--;
        } else {
            e = kvo__entry_new(s, key, mix);
        }
        slot = mode == KVO__HO_SLOT && *ho < nho ? kvo__slots_reuse(&s->sl, s->sc_vict[(*ho)++], e, &off)
                                                 : kvo__slots_alloc(&s->sl, c, e, &off);
    }
    kvo__entry *x = &s->ent[e];
    assert(slot != KVO__NIL);
    x->slot = slot;
    x->offset = off;
    x->cls = (uint8_t)c;
    x->state = KVO__E_PENDING;
    x->pins = 0;
    x->flags = 0;
    kvo__busy(s, e, +1);
    s->pending++;
    s->resident++;
    s->bytes_used += s->group_slot[g];
    s->g_chunks[g]++;
    s->stores++;
    s->g_stores[g]++;
    slot_out->offset = off;
    slot_out->bytes = s->group_slot[g];
    return e;
}

/* Commit, step 5c: what victims no new key took.  KVO__HO_SLOT: their
 * slots freed; KVO__HO_ENTRY: their slots freed and they become ghosts
 * (which LRU drops), as step 5a ends victims in the other modes. */
static void kvo__ps_commit_rest(kvo_store *s, size_t ho, size_t nv, int mode) {
    for (; ho < nv; ho++) {
        if (mode == KVO__HO_SLOT) {
            kvo__slots_release(&s->sl, s->sc_vict[ho]);
            continue;
        }
        uint32_t v = s->sc_vict[ho];
        kvo__slots_release(&s->sl, s->ent[v].slot);
        s->ent[v].slot = KVO__NIL;
        kvo__victim_ghost(s, v);
    }
}

/* Undo steps 3 and 4: victims back in reverse order, protection lifted. */
static void kvo__ps_rollback(kvo_store *s, size_t n, size_t nv) {
    while (nv > 0) {
        uint32_t v = s->sc_vict[--nv];
        s->ent[v].flags &= (uint8_t)~KVO__F_VICTIM;
        s->sl.seg[kvo__slot_seg(&s->sl, s->ent[v].slot)].planned = 0;
        s->pol->untake(s, v);
    }
    for (size_t i = 0; i < n; i++) kvo__unprotect(s, s->sc_ent[i]);
    s->rejected_stores++;
}

int kvo_store_prepare_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots,
                            kvo_chunk_key *evicted, kvo_slot *evicted_slots, size_t evicted_cap,
                            size_t *n_evicted) {
    static const char fn[] = "kvo_store_prepare_store";
    int rc = kvo__check_args(s, keys, n, need, fn); /* the keys: in kvo__resolve */
    if (rc) return rc;
    if (!slots) return kvo__error(KVO_EINVAL, "%s: NULL slots", fn);
    if (evicted_cap && (!evicted || !evicted_slots))
        return kvo__error(KVO_EINVAL, "%s: evicted_cap %zu with a NULL evicted array", fn, evicted_cap);
    kvo__store_lock(s);
    rc = kvo__ps_validate(s, keys, n, fn);
    if (rc) goto out;
    kvo__plan pl;
    kvo__plan_init(s, &pl);
    kvo__batch b = {0};
    kvo__ps_classify(s, keys, n, &pl, &b);
    size_t nv = 0;
    if (b.n_new) {
        rc = kvo__ps_protect(s, n, &pl, &b, fn);
        if (rc) goto out;
        rc = kvo__ps_plan(s, &pl, b.n_new, &nv, fn);
        if (!rc && nv > evicted_cap && (evicted || evicted_slots || evicted_cap)) {
            rc = kvo__error(KVO_ERANGE, "%s: %zu chunks must be evicted, evicted arrays hold %zu", fn, nv,
                            evicted_cap);
            if (n_evicted) *n_evicted = nv;
        }
        if (rc) {
            kvo__ps_rollback(s, n, nv);
            goto out;
        }
    } else {
        /* nothing to write: present READY keys just count as used */
        for (size_t k = 0; k < n; k++) {
            uint32_t e = s->sc_ent[kvo__use_at(s->pol, n, k)];
            if (kvo__protectable(s, e)) s->pol->hit(s, e);
        }
    }
    /* One slot class (one slot size): a victim's slot (under LRU its entry)
     * goes straight to a new key (KVO__HO_SLOT, KVO__HO_ENTRY above).  With
     * several classes the plan may count on a victim's segment emptying
     * for another class, so each victim's slot is freed first. */
    int mode = s->sl.nclass > 1 ? KVO__HO_NONE : s->ghost_cap == 0 ? KVO__HO_ENTRY : KVO__HO_SLOT;
    size_t ho = 0;
    kvo__ps_commit_victims(s, nv, evicted, evicted_slots, mode);
    /* the memo becomes the new keys' entries in order: complete_store of
     * exactly those keys (the usual next call) resolves without probing */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        need[i] = e == KVO__NIL;
        if (e == KVO__NIL) {
            s->memo[m++] = kvo__ps_commit_new(s, &keys[i], s->sc_mix[i], &slots[i], &ho, nv, mode);
        } else {
            slots[i].offset = 0;
            slots[i].bytes = 0;
        }
    }
    /* the present keys rejoin the queues as uses, in the policy's order */
    for (size_t k = 0; k < n; k++) kvo__unprotect(s, s->sc_ent[kvo__use_at(s->pol, n, k)]);
    if (mode != KVO__HO_NONE) kvo__ps_commit_rest(s, ho, nv, mode); /* victims no new key took */
    s->memo_n = m;
    s->res_gen += m > 0; /* the memo's remembered misses may be stored now */
    s->store_skipped_present += b.n_present;
    s->store_not_admitted += b.n_not_admitted;
    if (n_evicted) *n_evicted = nv;
out:
    kvo__store_unlock(s);
    return rc;
}

int kvo_store_complete_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, bool ok) {
    static const char fn[] = "kvo_store_complete_store";
    int rc = kvo__batch_begin(s, keys, n, keys, fn);
    if (rc) return rc;
    /* every key must name a PENDING entry; duplicates are caught by marking
     * the entries (no set needed: all keys are present) */
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (kvo__entry_ready(s, e)) continue; /* completed already: no-op */
        if (e == KVO__NIL || s->ent[e].state != KVO__E_PENDING) {
            rc = kvo__error(KVO_ESTATE, "%s: key %zu (group %u) is absent, not PENDING (it was not prepared, or "
                            "its failed store removed it)", fn, i, keys[i].group);
            break;
        }
        if (s->ent[e].flags & KVO__F_BATCH) {
            rc = kvo__error(KVO_EINVAL, "%s: key %zu repeats an earlier key of the batch (group %u)", fn, i,
                            keys[i].group);
            break;
        }
        s->ent[e].flags |= KVO__F_BATCH;
    }
    if (rc) {
        while (i > 0) s->ent[s->sc_ent[--i]].flags &= (uint8_t)~KVO__F_BATCH;
        goto out;
    }
    for (i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        kvo__entry *x = &s->ent[e];
        if (!(x->flags & KVO__F_BATCH)) continue; /* READY already */
        x->flags &= (uint8_t)~KVO__F_BATCH;
        if (ok) {
            x->state = KVO__E_READY;
            s->pending--;
            kvo__busy(s, e, -1);
            if (s->pol->leaf_first) x->flags |= KVO__F_BATCH; /* queued below, backwards */
            else s->pol->insert(s, e);
            kvo__event(s, KVO_EVENT_STORED, &x->key);
        } else {
            s->removals++;
            kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
        }
    }
    for (i = n; ok && s->pol->leaf_first && i > 0; i--) {
        uint32_t e = s->sc_ent[i - 1];
        if (!(s->ent[e].flags & KVO__F_BATCH)) continue;
        s->ent[e].flags &= (uint8_t)~KVO__F_BATCH;
        s->pol->insert(s, e);
    }
out:
    kvo__store_unlock(s);
    return rc;
}
