/*
 * The chunk store: index + slots + eviction policy + admission + events, under
 * one mutex.
 *
 * Layout.  Entries live in one preallocated pool (kvo__entry, 64 bytes):
 * resident entries (PENDING or READY, each holding one slot) and ghosts
 * (keys the ARC / S3-FIFO policies remember after eviction, no slot).  The
 * pool holds max_entries residents + ghost_cap ghosts, so it never runs out;
 * free pool entries are chained through ent.next.  The index (index.c) maps
 * a chunk key to its pool entry; slots (slots.c) hand out per-class slots
 * from segments.  Nothing allocates after creation except the per-call
 * scratch arrays, which grow geometrically to the largest batch seen.
 *
 * Invariants (checked by kvo__store_check in tests):
 *  - a READY entry with pins == 0 and not protected is in exactly one policy
 *    queue; PENDING, pinned and protected entries are in none;
 *  - "busy" (counted per segment and class in slots) = PENDING or pinned or
 *    protected; a segment with a busy entry is never reclaimed;
 *  - every resident entry owns exactly one slot, slot_entry[slot] == entry,
 *    and bytes_used = sum of the slot sizes of resident entries.
 *
 * prepare_store, the only call that evicts, runs in phases so that it is
 * all-or-nothing without an undo log for the common failure:
 *  1. validate every key (group, duplicates) and resolve entries: no change;
 *  2. count the slots each class needs and test feasibility exactly in
 *     O(classes) (kvo__slots_feasible): ENOSPC here changes nothing;
 *  3. protect the batch's READY keys (out of the policy queues, busy);
 *  4. plan: take victims from the policy and simulate the slot frees until
 *     every class has room (after a walk budget without success the
 *     victim's whole segment is reclaimed; a class with four segments of
 *     spare slots gives up its emptiest partial segment first: see
 *     slots.c); the plan is guaranteed to succeed by 2, so the only failure
 *     left is an evicted[] buffer that is too small (ERANGE), undone by
 *     putting the victims back in reverse order (exact for victims taken
 *     from the victim end; reclaimed ones go back to the victim end);
 *  5. commit: free the victims' slots (ghosts or gone), allocate slots in key
 *     order, mark new entries PENDING, unprotect (the batch's present keys
 *     count as used).
 *
 * Admission: a count-min sketch (4 rows of 8-bit counters, 2 x max_entries
 * wide) counts lookups of absent keys; a key is stored once its estimate
 * reaches admit_after.  All counters are halved every 8 x width additions so
 * old interest fades (amortized O(1): 4 x width halvings per 8 x width adds).
 * Count-min only over-estimates, so a key is never refused after admit_after
 * real lookups made since the last halving.
 */
#include <stdio.h>
#include <stdlib.h>

#include "store/store_internal.h"

/* ------------------------------------------------------------- helpers -- */

const char *kvo_policy_name(kvo_policy_kind k) {
    switch (k) {
    case KVO_POLICY_LRU: return "lru";
    case KVO_POLICY_ARC: return "arc";
    case KVO_POLICY_S3FIFO: return "s3fifo";
    case KVO_POLICY_PREFIX: return "prefix";
    }
    return "?";
}

int kvo_policy_parse(const char *name, kvo_policy_kind *out) {
    if (!name || !out) return kvo__error(KVO_EINVAL, "policy: NULL argument");
    if (!strcmp(name, "lru")) *out = KVO_POLICY_LRU;
    else if (!strcmp(name, "arc")) *out = KVO_POLICY_ARC;
    else if (!strcmp(name, "s3fifo") || !strcmp(name, "s3-fifo")) *out = KVO_POLICY_S3FIFO;
    else if (!strcmp(name, "prefix")) *out = KVO_POLICY_PREFIX;
    else return kvo__error(KVO_EINVAL, "policy '%s' is unknown; use lru, arc, s3fifo or prefix", name);
    return 0;
}

kvo_store_params kvo_store_default_params(void) {
    kvo_store_params p;
    memset(&p, 0, sizeof p);
    p.policy = KVO_POLICY_LRU;
    return p;
}

static inline void kvo__lock(kvo_store *s) { pthread_mutex_lock(&s->mu); }
static inline void kvo__unlock(kvo_store *s) { pthread_mutex_unlock(&s->mu); }

/* Validate one key; sets the message on failure. */
static inline int kvo__check_key(const kvo_store *s, const kvo_chunk_key *k, size_t i, const char *fn) {
    if (KVO__UNLIKELY(k->group >= s->ngroups || s->group_cls[k->group] == 0xFF)) {
        if (k->group >= s->ngroups)
            return kvo__error(KVO_EINVAL, "%s: key %zu names group %u; the plan has %u groups", fn, i, k->group,
                              s->ngroups);
        return kvo__error(KVO_EINVAL, "%s: key %zu names group %u ('%s'), which is not offloaded", fn, i,
                          k->group, kvo_plan_group(s->plan, k->group)->name);
    }
    return 0;
}

static int kvo__check_batch(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out,
                            const char *fn) {
    if (!s) return kvo__error(KVO_EINVAL, "%s: NULL store", fn);
    if (!keys || !out) return kvo__error(KVO_EINVAL, "%s: NULL %s", fn, !keys ? "keys" : "output array");
    if (n == 0) return kvo__error(KVO_EINVAL, "%s: empty batch (n = 0)", fn);
    for (size_t i = 0; i < n; i++) {
        int rc = kvo__check_key(s, &keys[i], i, fn);
        if (rc) return rc;
    }
    return 0;
}

static void kvo__event(kvo_store *s, uint32_t type, const kvo_chunk_key *k) {
    kvo__event_ring *r = &s->events;
    if (!r->cap) return;
    if (r->n == r->cap) {
        r->head = (r->head + 1) % r->cap;
        r->n--;
        r->dropped++;
    }
    kvo_store_event *ev = &r->ev[(r->head + r->n) % r->cap];
    ev->type = type;
    ev->key = *k;
    r->n++;
}

/* Grow the per-call scratch to hold n keys (and a set of 2n). */
static int kvo__scratch(kvo_store *s, size_t n) {
    if (n > s->sc_cap) {
        size_t cap = s->sc_cap ? s->sc_cap : 64;
        while (cap < n) cap *= 2;
        uint32_t *e = kvo__realloc(s->sc_ent, cap * sizeof *e);
        if (!e) return kvo__error(KVO_ENOMEM, "store: cannot grow scratch to %zu keys", cap);
        s->sc_ent = e;
        s->sc_cap = cap;
    }
    size_t want = 16;
    while (want < 2 * n) want *= 2;
    if (want > s->sc_setcap) {
        uint64_t *t = kvo__realloc(s->sc_set, want * sizeof *t);
        if (!t) return kvo__error(KVO_ENOMEM, "store: cannot grow scratch set to %zu", want);
        s->sc_set = t;
        s->sc_setcap = want;
    }
    return 0;
}

static int kvo__push_victim(kvo_store *s, size_t nv, uint32_t e) {
    if (nv >= s->sc_vcap) {
        size_t cap = s->sc_vcap ? s->sc_vcap * 2 : 256;
        uint32_t *v = kvo__realloc(s->sc_vict, cap * sizeof *v);
        if (!v) return KVO_ENOMEM;
        s->sc_vict = v;
        s->sc_vcap = cap;
    }
    s->sc_vict[nv] = e;
    return 0;
}

/* Duplicate detection over keys[0..n): set of indices into keys, sized 2n. */
static int kvo__find_dup(kvo_store *s, const kvo_chunk_key *keys, size_t n, size_t *a, size_t *b) {
    size_t m = 16;
    while (m < 2 * n) m *= 2;
    uint64_t *t = s->sc_set;
    memset(t, 0xFF, m * sizeof *t);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = kvo__key_mix(&keys[i]);
        for (size_t j = h & (m - 1);; j = (j + 1) & (m - 1)) {
            if (t[j] == UINT64_MAX) { t[j] = i; break; }
            if (kvo_chunk_key_eq(&keys[t[j]], &keys[i])) { *a = (size_t)t[j]; *b = i; return 1; }
        }
    }
    return 0;
}

/* ---------------------------------------------------------- admission -- */

static inline uint64_t kvo__cms_h(const kvo_chunk_key *k, int row) {
    uint64_t h = kvo__key_mix(k) ^ k->hash.hi;
    h += (uint64_t)(row + 1) * UINT64_C(0xC2B2AE3D27D4EB4F);
    h ^= h >> 33;
    h *= UINT64_C(0xFF51AFD7ED558CCD);
    h ^= h >> 29;
    return h;
}

static unsigned kvo__cms_get(const kvo_store *s, const kvo_chunk_key *k) {
    unsigned m = 255;
    for (int r = 0; r < 4; r++) {
        unsigned v = s->cms[(uint64_t)r * (s->cms_mask + 1) + (kvo__cms_h(k, r) & s->cms_mask)];
        if (v < m) m = v;
    }
    return m;
}

static void kvo__cms_add(kvo_store *s, const kvo_chunk_key *k) {
    for (int r = 0; r < 4; r++) {
        uint8_t *c = &s->cms[(uint64_t)r * (s->cms_mask + 1) + (kvo__cms_h(k, r) & s->cms_mask)];
        if (*c < 255) (*c)++;
    }
    if (++s->cms_adds >= s->cms_period) {
        uint64_t w = 4 * (s->cms_mask + 1);
        for (uint64_t i = 0; i < w; i++) s->cms[i] >>= 1;
        s->cms_adds = 0;
    }
}

/* ------------------------------------------------------------- create -- */

int kvo_store_create(const kvo_store_params *p, kvo_store **out) {
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_store_create: NULL %s", !p ? "params" : "out");
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_store_create: params.plan is required");
    if ((unsigned)p->policy > KVO_POLICY_PREFIX)
        return kvo__error(KVO_EINVAL, "kvo_store_create: policy %d is unknown; use lru, arc, s3fifo or prefix",
                          (int)p->policy);
    const kvo_plan *plan = p->plan;
    size_t ng = kvo_plan_num_groups(plan);
    uint64_t maxb = kvo_plan_max_slot_bytes(plan);
    if (maxb == 0) return kvo__error(KVO_EINVAL, "kvo_store_create: the plan offloads no group");
    if (p->capacity_bytes < maxb) {
        const char *gname = "?";
        for (size_t g = 0; g < ng; g++)
            if (kvo_plan_group(plan, g)->slot_bytes == maxb) gname = kvo_plan_group(plan, g)->name;
        return kvo__error(KVO_EINVAL,
                          "kvo_store_create: capacity_bytes %llu is below group '%s''s slot of %llu bytes; "
                          "use at least %llu (and many times that to hold useful prefixes)",
                          (unsigned long long)p->capacity_bytes, gname, (unsigned long long)maxb,
                          (unsigned long long)maxb);
    }
    kvo_store *s = kvo__calloc(1, sizeof *s);
    if (!s) return kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory");
    s->plan = plan;
    s->params = *p;
    s->ngroups = (uint32_t)ng;
    s->pol = p->policy == KVO_POLICY_ARC ? &kvo__policy_arc
           : p->policy == KVO_POLICY_S3FIFO ? &kvo__policy_s3fifo
           : p->policy == KVO_POLICY_PREFIX ? &kvo__policy_prefix : &kvo__policy_lru;
    /* classes: distinct slot sizes, weights = bytes per token */
    uint64_t cls_bytes[KVO__MAX_CLASSES];
    double cls_w[KVO__MAX_CLASSES];
    uint32_t ncls = 0;
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        s->group_cls[g] = 0xFF;
        if (!gp->offloaded || !gp->slot_bytes) continue;
        uint32_t c = 0;
        while (c < ncls && cls_bytes[c] != gp->slot_bytes) c++;
        if (c == ncls) {
            cls_bytes[c] = gp->slot_bytes;
            cls_w[c] = 0;
            ncls++;
        }
        cls_w[c] += (double)gp->slot_bytes / (double)(gp->tokens_per_chunk ? gp->tokens_per_chunk : 1);
        s->group_cls[g] = (uint8_t)c;
        s->group_slot[g] = gp->slot_bytes;
    }
    int rc = kvo__slots_init(&s->sl, p->capacity_bytes, cls_bytes, cls_w, ncls, p->segment_bytes);
    if (rc) goto fail;
    uint64_t slots_total = 0;
    for (uint32_t c = 0; c < ncls; c++) {
        uint64_t k = kvo__slots_class_capacity(&s->sl, c);
        if (k > slots_total) slots_total = k;
    }
    s->max_entries = p->max_entries ? p->max_entries : slots_total;
    if (s->max_entries > slots_total) s->max_entries = slots_total;
    s->ghost_cap = (p->policy == KVO_POLICY_LRU) ? 0 : s->max_entries;
    if (s->max_entries + s->ghost_cap >= (UINT64_C(1) << 30)) {
        rc = kvo__error(KVO_ERANGE, "kvo_store_create: %llu entries is over the 2^30 limit; set max_entries",
                        (unsigned long long)s->max_entries);
        goto fail;
    }
    s->pool_cap = (uint32_t)(s->max_entries + s->ghost_cap);
    s->ent = kvo__calloc(s->pool_cap, sizeof *s->ent);
    if (!s->ent) {
        rc = kvo__error(KVO_ENOMEM, "kvo_store_create: cannot allocate %u entries", s->pool_cap);
        goto fail;
    }
    for (uint32_t i = 0; i < s->pool_cap; i++) {
        s->ent[i].next = i + 1 < s->pool_cap ? i + 1 : KVO__NIL;
        s->ent[i].slot = KVO__NIL;
    }
    s->pool_free = 0;
    rc = kvo__index_init(&s->ix, s->pool_cap);
    if (rc) goto fail;
    for (int q = 0; q < 9; q++) kvo__list_init(&s->q[q]);
    if (p->admit_after > 1) {
        uint64_t w = 1024;
        while (w < 2 * s->max_entries) w *= 2;
        s->cms = kvo__calloc(4, (size_t)w);
        if (!s->cms) {
            rc = kvo__error(KVO_ENOMEM, "kvo_store_create: cannot allocate the admission sketch");
            goto fail;
        }
        s->cms_mask = w - 1;
        s->cms_period = 8 * w;
    }
    if (p->event_capacity) {
        s->events.ev = kvo__calloc(p->event_capacity, sizeof *s->events.ev);
        if (!s->events.ev) {
            rc = kvo__error(KVO_ENOMEM, "kvo_store_create: cannot allocate %u events", p->event_capacity);
            goto fail;
        }
        s->events.cap = p->event_capacity;
    }
    if (pthread_mutex_init(&s->mu, NULL)) {
        rc = kvo__error(KVO_ENOMEM, "kvo_store_create: pthread_mutex_init failed");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    kvo__slots_free(&s->sl);
    kvo__index_free(&s->ix);
    kvo__free(s->ent);
    kvo__free(s->cms);
    kvo__free(s->events.ev);
    kvo__free(s);
    return rc;
}

void kvo_store_destroy(kvo_store *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    kvo__slots_free(&s->sl);
    kvo__index_free(&s->ix);
    kvo__free(s->ent);
    kvo__free(s->cms);
    kvo__free(s->events.ev);
    kvo__free(s->sc_ent);
    kvo__free(s->sc_vict);
    kvo__free(s->sc_set);
    kvo__free(s);
}

const kvo_plan *kvo_store_plan(const kvo_store *s) { return s ? s->plan : NULL; }
uint64_t kvo_store_capacity(const kvo_store *s) { return s ? s->params.capacity_bytes : 0; }

/* -------------------------------------------------------- entry life -- */

static uint32_t kvo__entry_new(kvo_store *s, const kvo_chunk_key *k) {
    uint32_t e = s->pool_free;
    assert(e != KVO__NIL);
    kvo__entry *x = &s->ent[e];
    s->pool_free = x->next;
    memset(x, 0, sizeof *x);
    x->key = *k;
    x->key.reserved = 0;
    x->prev = x->next = KVO__NIL;
    x->slot = KVO__NIL;
    kvo__index_insert(s, e);
    return e;
}

static void kvo__entry_free(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    kvo__index_remove(s, e);
    x->state = KVO__E_FREE;
    x->q = KVO__Q_NONE;
    x->next = s->pool_free;
    s->pool_free = e;
}

void kvo__ghost_drop(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    assert(x->state == KVO__E_GHOST);
    if (x->q != KVO__Q_NONE) kvo__list_unlink(s, &s->q[x->q], e);
    s->ghosts--;
    kvo__entry_free(s, e);
}

/* Release a resident entry's slot and accounting (not the policy queues). */
static void kvo__resident_release(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint32_t g = x->key.group;
    kvo__slots_release(&s->sl, x->slot);
    x->slot = KVO__NIL;
    s->bytes_used -= s->group_slot[g];
    s->g_chunks[g]--;
    s->resident--;
}

/* Busy transitions: an entry leaves/enters the evictable set. */
static inline void kvo__busy(kvo_store *s, uint32_t e, int d) { kvo__slots_busy(&s->sl, s->ent[e].slot, d); }

/* Remove a resident entry entirely (remove, clear, failed store). */
static void kvo__resident_drop(kvo_store *s, uint32_t e, uint32_t evtype) {
    kvo__entry *x = &s->ent[e];
    if (x->q != KVO__Q_NONE) s->pol->remove(s, e);
    if (x->state == KVO__E_PENDING) {
        kvo__busy(s, e, -1);
        s->pending--;
    }
    kvo__event(s, evtype, &x->key);
    kvo__resident_release(s, e);
    kvo__entry_free(s, e);
}

/* ------------------------------------------------------------- lookup -- */

/* Two-stage prefetch for batch probes: the table slot of key i+8, and the
 * entry that the (by then cached) table slot of key i+4 points to.  Memory
 * latency, not instructions, bounds a lookup on a large store.  Each key's
 * mix is computed once, into a ring of 16. */
typedef struct kvo__pipe {
    uint64_t h[16];
} kvo__pipe;

static inline void kvo__pipe_init(kvo__pipe *p, const kvo_chunk_key *keys, size_t n) {
    for (size_t i = 0; i < 8 && i < n; i++) p->h[i] = kvo__key_mix(&keys[i]);
}

/* Returns key i's mix. */
static inline uint64_t kvo__pipe_step(const kvo_store *s, kvo__pipe *p, const kvo_chunk_key *keys, size_t n,
                                      size_t i) {
    if (i + 8 < n) {
        uint64_t h = kvo__key_mix(&keys[i + 8]);
        p->h[(i + 8) & 15] = h;
        __builtin_prefetch(&s->ix.tab[h & s->ix.mask]);
    }
    if (i + 4 < n) {
        uint64_t v = s->ix.tab[p->h[(i + 4) & 15] & s->ix.mask];
        if (v != UINT64_MAX) __builtin_prefetch(&s->ent[(uint32_t)v]);
    }
    return p->h[i & 15];
}

/* Resolve a batch into s->sc_ent (grown to n): each key's resident entry
 * (PENDING or READY), or NIL for an absent key or a ghost.  Changes nothing
 * else; the calls that change entries check the resolved batch first, so a
 * refused batch leaves the store as it was. */
static int kvo__resolve(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    int rc = kvo__scratch(s, n);
    if (rc) return rc;
    kvo__pipe pp;
    kvo__pipe_init(&pp, keys, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvo__index_find_h(s, &keys[i], kvo__pipe_step(s, &pp, keys, n, i));
        s->sc_ent[i] = e != KVO__NIL && s->ent[e].state != KVO__E_GHOST ? e : KVO__NIL;
    }
    return 0;
}

int kvo_store_lookup(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    int rc = kvo__check_batch(s, keys, n, states, "kvo_store_lookup");
    if (rc) return rc;
    kvo__lock(s);
    kvo__pipe pp;
    kvo__pipe_init(&pp, keys, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvo__index_find_h(s, &keys[i], kvo__pipe_step(s, &pp, keys, n, i));
        uint32_t g = keys[i].group;
        uint8_t st = KVO_MISS;
        if (e != KVO__NIL) {
            uint8_t es = s->ent[e].state;
            st = es == KVO__E_READY ? KVO_READY : es == KVO__E_PENDING ? KVO_PENDING : KVO_MISS;
        }
        states[i] = st;
        if (st == KVO_READY) {
            s->hits++;
            s->g_hits[g]++;
        } else if (st == KVO_PENDING) {
            s->pending_hits++;
        } else {
            s->misses++;
            s->g_misses[g]++;
            if (s->cms) kvo__cms_add(s, &keys[i]);
        }
    }
    kvo__unlock(s);
    return 0;
}

/* A resident entry as the public kvo_store_entry (peek, scan). */
static void kvo__entry_out(const kvo_store *s, uint32_t e, kvo_store_entry *out) {
    const kvo__entry *x = &s->ent[e];
    out->key = x->key;
    out->slot.offset = x->offset;
    out->slot.bytes = s->group_slot[x->key.group];
    out->state = x->state == KVO__E_READY ? KVO_READY : KVO_PENDING;
    out->pins = x->pins;
}

int kvo_store_peek(kvo_store *s, const kvo_chunk_key *key, kvo_store_entry *out) {
    int rc = kvo__check_batch(s, key, 1, out, "kvo_store_peek");
    if (rc) return rc;
    kvo__lock(s);
    uint32_t e = kvo__index_find(s, key);
    if (e == KVO__NIL || s->ent[e].state == KVO__E_GHOST) {
        kvo__unlock(s);
        return kvo__error(KVO_ENOTFOUND, "kvo_store_peek: key of group %u is not stored", key->group);
    }
    kvo__entry_out(s, e, out);
    kvo__unlock(s);
    return 0;
}

/* -------------------------------------------------------------- store -- */

/* Simulation state of the eviction plan. */
typedef struct kvo__plan {
    uint64_t demand[KVO__MAX_CLASSES];
    int64_t freeslots[KVO__MAX_CLASSES]; /* free slots in the class's non-empty segments */
    uint64_t segs_needed;                /* sum over classes of segments still needed */
    uint64_t nfree;                      /* free segments */
    int64_t entries_short;               /* residents to evict for pool room */
} kvo__plan;

static uint64_t kvo__cls_need(const kvo_store *s, const kvo__plan *pl, uint32_t c) {
    int64_t d = (int64_t)pl->demand[c] - pl->freeslots[c];
    if (d <= 0) return 0;
    return kvo__div_ceil_u64((uint64_t)d, s->sl.cls_k[c]);
}

/* Apply a planned victim to the simulation. */
static void kvo__plan_victim(kvo_store *s, kvo__plan *pl, uint32_t e) {
    kvo__slots *sl = &s->sl;
    kvo__entry *x = &s->ent[e];
    uint32_t g = kvo__slot_seg(sl, x->slot);
    uint32_t c = x->cls;
    uint64_t before = kvo__cls_need(s, pl, c);
    sl->seg_planned[g]++;
    if (sl->seg_used[g] - sl->seg_planned[g] > 0) {
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
    uint32_t c = s->sl.seg_cls[g];
    s->reclaims++;
    for (uint32_t j = 0; j < s->sl.cls_k[c]; j++) {
        uint32_t x = s->sl.slot_entry[g * s->sl.kmax + j];
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
        for (int t = 0; t < 8 && g != KVO__NIL; t++, g = sl->seg_next[g]) {
            if (sl->seg_busy[g]) continue;
            uint32_t live = sl->seg_used[g] - sl->seg_planned[g];
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
 * nothing, counts as used): READY and not pinned (pinned is busy already). */
static inline bool kvo__protectable(const kvo_store *s, uint32_t e) {
    return e < KVO__NOT_ADMITTED && s->ent[e].state == KVO__E_READY && s->ent[e].pins == 0;
}

/* Undo the protection of a present batch key (commit or rollback): it
 * rejoins the policy queues, as a use.  No-op for other sc_ent values. */
static inline void kvo__unprotect(kvo_store *s, uint32_t e) {
    if (e >= KVO__NOT_ADMITTED || !(s->ent[e].flags & KVO__F_PROTECT)) return;
    s->ent[e].flags &= (uint8_t)~KVO__F_PROTECT;
    kvo__busy(s, e, -1);
    s->pol->reinsert(s, e);
}

static inline bool kvo__plan_done(const kvo__plan *pl) {
    return pl->segs_needed <= pl->nfree && pl->entries_short <= 0;
}

int kvo_store_prepare_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots,
                            kvo_chunk_key *evicted, kvo_slot *evicted_slots, size_t evicted_cap,
                            size_t *n_evicted) {
    static const char fn[] = "kvo_store_prepare_store";
    int rc = kvo__check_batch(s, keys, n, need, fn);
    if (rc) return rc;
    if (!slots) return kvo__error(KVO_EINVAL, "%s: NULL slots", fn);
    if (evicted_cap && (!evicted || !evicted_slots))
        return kvo__error(KVO_EINVAL, "%s: evicted_cap %zu with a NULL evicted array", fn, evicted_cap);
    kvo__lock(s);
    rc = kvo__resolve(s, keys, n);
    if (rc) goto out;
    size_t da, db;
    if (kvo__find_dup(s, keys, n, &da, &db)) {
        rc = kvo__error(KVO_EINVAL, "%s: key %zu repeats key %zu (group %u); a batch names each chunk once", fn, db,
                        da, keys[db].group);
        goto out;
    }
    /* 1. classify the resolved keys */
    kvo__plan pl;
    memset(&pl, 0, sizeof pl);
    uint64_t n_new = 0, bytes_new = 0, n_not_admitted = 0, n_present = 0;
    for (size_t i = 0; i < n; i++) {
        if (s->sc_ent[i] != KVO__NIL) {
            n_present++;
            continue;
        }
        if (s->cms && kvo__cms_get(s, &keys[i]) < s->params.admit_after) {
            n_not_admitted++;
            s->sc_ent[i] = KVO__NOT_ADMITTED;
            continue;
        }
        pl.demand[s->group_cls[keys[i].group]]++;
        n_new++;
        bytes_new += s->group_slot[keys[i].group];
    }
    /* 2. feasibility (exact): protected batch keys count as busy, so add them */
    if (n_new) {
        uint64_t busy_extra = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t e = s->sc_ent[i];
            if (kvo__protectable(s, e)) {
                kvo__busy(s, e, +1);
                busy_extra++;
            }
        }
        uint64_t busy_total = s->pending + s->pinned + busy_extra;
        bool ok = busy_total + n_new <= s->max_entries && kvo__slots_feasible(&s->sl, pl.demand);
        if (!ok) {
            for (size_t i = 0; i < n; i++) {
                uint32_t e = s->sc_ent[i];
                if (kvo__protectable(s, e)) kvo__busy(s, e, -1);
            }
            s->rejected_stores++;
            uint64_t pinned_b = 0;
            for (uint32_t c = 0; c < s->sl.nclass; c++) pinned_b += s->sl.cls_busy[c] * s->sl.cls_bytes[c];
            rc = kvo__error(KVO_ENOSPC,
                            "%s: %llu new chunks need %llu bytes; capacity %llu, of which %llu bytes are pinned, "
                            "pending or in this batch (%llu pinned, %llu pending entries, %llu entries max); "
                            "complete loads/stores first, store fewer chunks per batch, or raise capacity",
                            fn, (unsigned long long)n_new, (unsigned long long)bytes_new,
                            (unsigned long long)s->params.capacity_bytes, (unsigned long long)pinned_b,
                            (unsigned long long)s->pinned, (unsigned long long)s->pending,
                            (unsigned long long)s->max_entries);
            goto out;
        }
        /* 3. protect: out of the policy queues (busy already counted) */
        for (size_t i = 0; i < n; i++) {
            uint32_t e = s->sc_ent[i];
            if (kvo__protectable(s, e)) {
                s->pol->remove(s, e);
                s->ent[e].flags |= KVO__F_PROTECT;
            }
        }
    } else {
        /* nothing to write: present READY keys just count as used */
        for (size_t i = 0; i < n; i++) {
            uint32_t e = s->sc_ent[i];
            if (kvo__protectable(s, e)) s->pol->hit(s, e);
        }
    }
    /* 4. plan victims */
    size_t nv = 0;
    if (n_new) {
        for (uint32_t c = 0; c < s->sl.nclass; c++) pl.freeslots[c] = (int64_t)s->sl.cls_free[c];
        pl.nfree = s->sl.nfree;
        for (uint32_t c = 0; c < s->sl.nclass; c++) pl.segs_needed += kvo__cls_need(s, &pl, c);
        pl.entries_short = (int64_t)(s->resident + n_new) - (int64_t)s->max_entries;
        uint64_t walked_bytes = 0;
        while (!kvo__plan_done(&pl)) {
            if (pl.segs_needed > pl.nfree) {
                uint32_t g = kvo__compact_pick(s, &pl);
                if (g != KVO__NIL) {
                    if (kvo__reclaim_seg(s, &pl, g, &nv)) {
                        rc = kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
                        goto rollback;
                    }
                    continue;
                }
            }
            uint32_t v = s->pol->take_victim(s);
            if (v == KVO__NIL) break; /* cannot happen after the feasibility test */
            if (kvo__push_victim(s, nv, v)) {
                s->pol->untake(s, v);
                rc = kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
                goto rollback;
            }
            nv++;
            kvo__plan_victim(s, &pl, v);
            walked_bytes += s->group_slot[s->ent[v].key.group];
            if (!kvo__plan_done(&pl) && pl.segs_needed > pl.nfree && walked_bytes >= kvo__walk_budget(s)) {
                /* reclaim v's whole segment if nothing in it is busy */
                uint32_t g = kvo__slot_seg(&s->sl, s->ent[v].slot);
                if (s->sl.seg_busy[g] == 0 && s->sl.seg_used[g] > s->sl.seg_planned[g]) {
                    if (kvo__reclaim_seg(s, &pl, g, &nv)) {
                        rc = kvo__error(KVO_ENOMEM, "%s: cannot grow the victim list", fn);
                        goto rollback;
                    }
                    walked_bytes = 0;
                }
            }
        }
        if (!kvo__plan_done(&pl)) {
            rc = kvo__error(KVO_ENOSPC, "%s: internal: eviction plan fell short (%llu segments needed, %llu free)",
                            fn, (unsigned long long)pl.segs_needed, (unsigned long long)pl.nfree);
            goto rollback;
        }
        if (nv > evicted_cap && (evicted || evicted_slots || evicted_cap)) {
            rc = kvo__error(KVO_ERANGE, "%s: %zu chunks must be evicted, evicted arrays hold %zu", fn, nv,
                            evicted_cap);
            if (n_evicted) *n_evicted = nv;
            goto rollback;
        }
    }
    /* 5. commit */
    for (size_t i = 0; i < nv; i++) {
        uint32_t v = s->sc_vict[i];
        kvo__entry *x = &s->ent[v];
        uint32_t g = x->key.group;
        if (evicted) {
            evicted[i] = x->key;
            evicted_slots[i].offset = x->offset;
            evicted_slots[i].bytes = s->group_slot[g];
        }
        s->sl.seg_planned[kvo__slot_seg(&s->sl, x->slot)] = 0;
        x->flags &= (uint8_t)~KVO__F_VICTIM;
        kvo__event(s, KVO_EVENT_EVICTED, &x->key);
        kvo__resident_release(s, v);
        s->evictions++;
        s->g_evictions[g]++;
        x->state = KVO__E_GHOST;
        s->ghosts++;
        s->pol->evicted(s, v);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL) {
            uint32_t g = keys[i].group;
            uint32_t c = s->group_cls[g];
            e = kvo__index_find(s, &keys[i]);
            if (e != KVO__NIL) { /* a ghost: revive */
                assert(s->ent[e].state == KVO__E_GHOST);
                s->pol->ghost_claim(s, e);
                s->ghosts--;
            } else {
                e = kvo__entry_new(s, &keys[i]);
            }
            kvo__entry *x = &s->ent[e];
            uint64_t off = 0;
            uint32_t slot = kvo__slots_alloc(&s->sl, c, e, &off);
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
            need[i] = 1;
            slots[i].offset = off;
            slots[i].bytes = s->group_slot[g];
        } else {
            need[i] = 0;
            slots[i].offset = 0;
            slots[i].bytes = 0;
            kvo__unprotect(s, e);
        }
    }
    s->store_skipped_present += n_present;
    s->store_not_admitted += n_not_admitted;
    if (n_evicted) *n_evicted = nv;
    kvo__unlock(s);
    return 0;
rollback:
    while (nv > 0) {
        uint32_t v = s->sc_vict[--nv];
        s->ent[v].flags &= (uint8_t)~KVO__F_VICTIM;
        s->sl.seg_planned[kvo__slot_seg(&s->sl, s->ent[v].slot)] = 0;
        s->pol->untake(s, v);
    }
    for (size_t i = 0; i < n; i++) kvo__unprotect(s, s->sc_ent[i]);
    s->rejected_stores++;
out:
    kvo__unlock(s);
    return rc;
}

int kvo_store_complete_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, bool ok) {
    static const char fn[] = "kvo_store_complete_store";
    int rc = kvo__check_batch(s, keys, n, keys, fn);
    if (rc) return rc;
    kvo__lock(s);
    rc = kvo__resolve(s, keys, n);
    if (rc) goto out;
    /* every key must name a PENDING entry; duplicates are caught by marking
     * the entries (no set needed: all keys are present) */
    size_t i;
    for (i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || s->ent[e].state != KVO__E_PENDING) {
            rc = kvo__error(KVO_ESTATE, "%s: key %zu (group %u) is %s, not PENDING (it was not prepared, or "
                            "was already completed)", fn, i, keys[i].group, e == KVO__NIL ? "absent" : "READY");
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
        x->flags &= (uint8_t)~KVO__F_BATCH;
        if (ok) {
            x->state = KVO__E_READY;
            s->pending--;
            kvo__busy(s, e, -1);
            s->pol->insert(s, e);
            kvo__event(s, KVO_EVENT_STORED, &x->key);
        } else {
            s->removals++;
            kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
        }
    }
out:
    kvo__unlock(s);
    return rc;
}

/* --------------------------------------------------------------- load -- */

int kvo_store_prepare_load(kvo_store *s, const kvo_chunk_key *keys, size_t n, kvo_slot *slots) {
    static const char fn[] = "kvo_store_prepare_load";
    int rc = kvo__check_batch(s, keys, n, slots, fn);
    if (rc) return rc;
    kvo__lock(s);
    rc = kvo__resolve(s, keys, n);
    if (rc) goto out;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL) {
            rc = kvo__error(KVO_ENOTFOUND, "%s: key %zu (group %u) is not stored (evicted or never stored)", fn, i,
                            keys[i].group);
            goto out;
        }
        if (s->ent[e].state == KVO__E_PENDING) {
            rc = kvo__error(KVO_EAGAIN, "%s: key %zu (group %u) is still being written; load after "
                            "complete_store", fn, i, keys[i].group);
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        kvo__entry *x = &s->ent[e];
        if (x->pins++ == 0) {
            s->pol->remove(s, e);
            kvo__busy(s, e, +1);
            s->pinned++;
        }
        slots[i].offset = x->offset;
        slots[i].bytes = s->group_slot[x->key.group];
    }
out:
    kvo__unlock(s);
    return rc;
}

int kvo_store_complete_load(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    static const char fn[] = "kvo_store_complete_load";
    int rc = kvo__check_batch(s, keys, n, keys, fn);
    if (rc) return rc;
    kvo__lock(s);
    rc = kvo__resolve(s, keys, n);
    if (rc) goto out;
    /* count per entry so a key given twice needs two pins */
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || s->ent[e].state != KVO__E_READY || s->ent[e].pins == 0) {
            rc = kvo__error(KVO_ESTATE, "%s: key %zu (group %u) is not pinned", fn, i, keys[i].group);
            while (i > 0) s->ent[s->sc_ent[--i]].pins++; /* undo the tentative unpins */
            goto out;
        }
        s->ent[e].pins--; /* tentatively */
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        kvo__entry *x = &s->ent[e];
        if (x->pins == 0 && !(x->flags & KVO__F_BATCH)) {
            x->flags |= KVO__F_BATCH; /* handle each entry once */
            kvo__busy(s, e, -1);
            s->pinned--;
            s->pol->reinsert(s, e);
        }
    }
    for (size_t i = 0; i < n; i++) s->ent[s->sc_ent[i]].flags &= (uint8_t)~KVO__F_BATCH;
out:
    kvo__unlock(s);
    return rc;
}

/* ------------------------------------------------------ touch, remove -- */

int kvo_store_touch(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    int rc = kvo__check_batch(s, keys, n, keys, "kvo_store_touch");
    if (rc) return rc;
    kvo__lock(s);
    kvo__pipe pp;
    kvo__pipe_init(&pp, keys, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvo__index_find_h(s, &keys[i], kvo__pipe_step(s, &pp, keys, n, i));
        if (e != KVO__NIL && s->ent[e].q != KVO__Q_NONE && s->ent[e].state == KVO__E_READY) s->pol->hit(s, e);
    }
    kvo__unlock(s);
    return 0;
}

int kvo_store_remove(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    static const char fn[] = "kvo_store_remove";
    int rc = kvo__check_batch(s, keys, n, keys, fn);
    if (rc) return rc;
    kvo__lock(s);
    rc = kvo__resolve(s, keys, n);
    if (rc) goto out;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e != KVO__NIL && (s->ent[e].state == KVO__E_PENDING || s->ent[e].pins)) {
            rc = kvo__error(KVO_EBUSY, "%s: key %zu (group %u) is %s; nothing removed", fn, i, keys[i].group,
                            s->ent[e].pins ? "pinned by a load" : "being written");
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || s->ent[e].state != KVO__E_READY) continue; /* absent or a duplicate already gone */
        s->removals++;
        kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
    }
out:
    kvo__unlock(s);
    return rc;
}

size_t kvo_store_clear(kvo_store *s) {
    if (!s) return 0;
    kvo__lock(s);
    for (uint32_t e = 0; e < s->pool_cap; e++) {
        kvo__entry *x = &s->ent[e];
        if (x->state == KVO__E_READY && x->pins == 0) {
            s->removals++;
            kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
        } else if (x->state == KVO__E_GHOST) {
            kvo__ghost_drop(s, e);
        }
    }
    size_t left = (size_t)s->resident;
    kvo__unlock(s);
    return left;
}

/* ------------------------------------------------------ scan, events -- */

int kvo_store_scan(kvo_store *s, uint64_t *cursor, kvo_store_entry *out, size_t cap, size_t *n) {
    if (!s || !cursor || !out || !n) return kvo__error(KVO_EINVAL, "kvo_store_scan: NULL argument");
    if (cap == 0) return kvo__error(KVO_EINVAL, "kvo_store_scan: cap is 0");
    kvo__lock(s);
    uint64_t i = *cursor;
    size_t w = 0;
    for (; i < s->pool_cap && w < cap; i++) {
        uint8_t st = s->ent[i].state;
        if (st == KVO__E_READY || st == KVO__E_PENDING) kvo__entry_out(s, (uint32_t)i, &out[w++]);
    }
    /* skip to the next live entry so that *cursor = 0 means done */
    while (i < s->pool_cap && s->ent[i].state != KVO__E_READY && s->ent[i].state != KVO__E_PENDING) i++;
    *cursor = i >= s->pool_cap ? 0 : i;
    *n = w;
    kvo__unlock(s);
    return 0;
}

size_t kvo_store_drain_events(kvo_store *s, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (!s) return 0;
    kvo__lock(s);
    kvo__event_ring *r = &s->events;
    size_t w = 0;
    while (out && w < cap && r->n) {
        out[w++] = r->ev[r->head];
        r->head = (r->head + 1) % r->cap;
        r->n--;
    }
    if (dropped) {
        *dropped = r->dropped;
        r->dropped = 0;
    }
    kvo__unlock(s);
    return w;
}

/* -------------------------------------------------------------- stats -- */

int kvo_store_get_stats(kvo_store *s, kvo_store_stats *out) {
    if (!s || !out) return kvo__error(KVO_EINVAL, "kvo_store_get_stats: NULL argument");
    kvo__lock(s);
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
    kvo__unlock(s);
    return 0;
}

/* ------------------------------------------------------------ checking -- */

uint64_t kvo__store_queue_len(kvo_store *s, int q) { return s->q[q].n; }
uint64_t kvo__store_arc_p(kvo_store *s) { return s->arc_p; }
uint64_t kvo__store_reclaims(kvo_store *s) { return s->reclaims; }

int kvo__store_check(kvo_store *s) {
    uint64_t resident = 0, ghosts = 0, pinned = 0, pending = 0, bytes = 0, queued = 0;
    for (uint32_t e = 0; e < s->pool_cap; e++) {
        kvo__entry *x = &s->ent[e];
        if (x->state == KVO__E_FREE) continue;
        if (kvo__index_find(s, &x->key) != e)
            return kvo__error(KVO_ECORRUPT, "check: entry %u not found through the index", e);
        if (x->state == KVO__E_GHOST) {
            ghosts++;
            if (x->slot != KVO__NIL) return kvo__error(KVO_ECORRUPT, "check: ghost %u holds a slot", e);
            continue;
        }
        if (x->flags & (KVO__F_BATCH | KVO__F_VICTIM | KVO__F_PROTECT))
            return kvo__error(KVO_ECORRUPT, "check: entry %u keeps call-time flags 0x%x", e, x->flags);
        resident++;
        bytes += s->group_slot[x->key.group];
        if (x->slot == KVO__NIL || s->sl.slot_entry[x->slot] != e)
            return kvo__error(KVO_ECORRUPT, "check: entry %u slot %u not owned", e, x->slot);
        if (x->state == KVO__E_PENDING) pending++;
        if (x->pins) pinned++;
        bool should_queue = x->state == KVO__E_READY && x->pins == 0 && !(x->flags & KVO__F_PROTECT);
        if (should_queue != (x->q != KVO__Q_NONE))
            return kvo__error(KVO_ECORRUPT, "check: entry %u queue %u but evictable %d", e, x->q, should_queue);
        if (x->q) queued++;
        uint32_t g = kvo__slot_seg(&s->sl, x->slot);
        uint64_t expect = (uint64_t)g * s->sl.seg_bytes + (uint64_t)(x->slot - g * s->sl.kmax) * s->sl.cls_bytes[x->cls];
        if (expect != x->offset || x->offset + s->group_slot[x->key.group] > (uint64_t)(g + 1) * s->sl.seg_bytes)
            return kvo__error(KVO_ECORRUPT, "check: entry %u offset %llu wrong", e, (unsigned long long)x->offset);
        if (s->sl.seg_cls[g] != x->cls) return kvo__error(KVO_ECORRUPT, "check: entry %u in a segment of another class", e);
    }
    if (resident != s->resident || ghosts != s->ghosts || pinned != s->pinned || pending != s->pending ||
        bytes != s->bytes_used)
        return kvo__error(KVO_ECORRUPT, "check: counters differ (resident %llu/%llu ghosts %llu/%llu pinned %llu/%llu "
                          "pending %llu/%llu bytes %llu/%llu)",
                          (unsigned long long)resident, (unsigned long long)s->resident, (unsigned long long)ghosts,
                          (unsigned long long)s->ghosts, (unsigned long long)pinned, (unsigned long long)s->pinned,
                          (unsigned long long)pending, (unsigned long long)s->pending, (unsigned long long)bytes,
                          (unsigned long long)s->bytes_used);
    uint64_t qsum = 0;
    static const int resq[] = {KVO__Q_LRU, KVO__Q_T1, KVO__Q_T2, KVO__Q_S, KVO__Q_M};
    for (size_t i = 0; i < sizeof resq / sizeof resq[0]; i++) qsum += s->q[resq[i]].n;
    if (qsum != queued) return kvo__error(KVO_ECORRUPT, "check: queue lengths %llu vs %llu queued",
                                          (unsigned long long)qsum, (unsigned long long)queued);
    if (s->q[KVO__Q_B1].n + s->q[KVO__Q_B2].n + s->q[KVO__Q_G].n != ghosts)
        return kvo__error(KVO_ECORRUPT, "check: ghost queues do not match ghosts");
    /* slots: per segment used counts and busy counts */
    for (uint32_t g = 0; g < s->sl.nseg; g++) {
        if (s->sl.seg_cls[g] == 0xFF) continue;
        uint32_t c = s->sl.seg_cls[g], used = 0, busy = 0;
        for (uint32_t j = 0; j < s->sl.cls_k[c]; j++) {
            uint32_t e = s->sl.slot_entry[g * s->sl.kmax + j];
            if (e == KVO__NIL) continue;
            used++;
            kvo__entry *x = &s->ent[e];
            if (x->state == KVO__E_PENDING || x->pins || (x->flags & KVO__F_PROTECT)) busy++;
        }
        if (used != s->sl.seg_used[g] || busy != s->sl.seg_busy[g] || used == 0)
            return kvo__error(KVO_ECORRUPT, "check: segment %u used %u/%u busy %u/%u", g, used, s->sl.seg_used[g],
                              busy, s->sl.seg_busy[g]);
    }
    return 0;
}
