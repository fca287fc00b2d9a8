/*
 * The chunk store: index + slots + eviction policy + admission + events, under
 * one mutex.
 *
 * Layout.  Entries live in one preallocated pool (kvo__entry, 64 bytes):
 * resident entries (PENDING or READY, each holding one slot) and ghosts
 * (keys the ARC, S3-FIFO and prefix policies remember after eviction, no
 * slot).  The
 * pool holds max_entries residents + ghost_cap ghosts, so it never runs out;
 * free pool entries are chained through ent.next.  The index (index.c) maps
 * a chunk key to its pool entry; slots (slots.c) hand out per-class slots
 * from segments.  Nothing allocates after creation except the per-call
 * scratch arrays, which grow geometrically to the largest batch seen.
 *
 * Files: store.c (create, lookup, load, remove, scan, admission, entry life),
 * store_prepare.c (prepare_store's phases and complete_store), store_stats.c
 * (statistics and the invariant check).
 *
 * Invariants (checked by kvo__store_check in tests):
 *  - a READY entry with pins == 0 and not protected is in exactly one policy
 *    queue; PENDING, pinned and protected entries are in none;
 *  - "busy" (counted per class in slots, and per segment with several
 *    classes) = PENDING or pinned or protected; a segment with a busy entry
 *    is never reclaimed (one class reclaims no segments);
 *  - every resident entry owns exactly one slot, slot[slot].entry == entry,
 *    and bytes_used = sum of the slot sizes of resident entries.
 *
 * Admission: a count-min sketch (4 rows of 8-bit counters, 2 x max_entries
 * wide) counts lookups of absent keys; a key is stored once its estimate
 * reaches admit_after.  All counters are halved every 8 x width additions so
 * old interest fades (amortized O(1): 4 x width halvings per 8 x width adds).
 * Count-min only over-estimates, so a key is never refused after admit_after
 * real lookups made since the last halving.
 *
 * Memo.  A client's calls come in cycles over one batch: lookup, then
 * prepare_load / complete_load / touch of its prefix, prepare_store of the
 * batch, complete_store of the keys it said to write.  Each call used to mix
 * and probe every key again.  The store remembers the last batch's resident
 * entries by position (memo, written by lookup, by every resolve and, for
 * the new keys in order, by prepare_store); a call whose keys are all found
 * there uses them instead of probing.  A memo entry is used only after
 * checking that it is resident (PENDING or READY) and holds the key: the
 * index maps a key to at most one entry, so that entry is the one a probe
 * would find, whatever happened since (the memo is never invalidated, only
 * verified).  The memo also remembers the misses of lookup and resolve (the
 * key, at its position): such a key is still absent while no key has become
 * resident since (res_gen, bumped by every prepare_store that stores, equals
 * memo_gen), since only prepare_store makes keys resident; so prepare_store
 * of the batch a lookup just answered resolves without probing.  Any key not
 * confirmed this way sends the whole call down the probing path.  Keys the
 * memo confirms were checked by the call that recorded them (their group is
 * valid), so those calls skip the per-key check too.
 */
#include <stdlib.h>

#include "store/store_internal.h"

/* ------------------------------------------------------------- helpers -- */

const char *kvo_policy_name(kvo_policy_kind k) {
    static const char *const names[] = {[KVO_POLICY_LRU] = "lru", [KVO_POLICY_ARC] = "arc",
                                        [KVO_POLICY_S3FIFO] = "s3fifo", [KVO_POLICY_PREFIX] = "prefix",
                                        [KVO_POLICY_BRANCH] = "prefix"};
    return (unsigned)k < sizeof names / sizeof names[0] && names[k] ? names[k] : "?";
}

int kvo_policy_parse(const char *name, kvo_policy_kind *out) {
    if (!name || !out) return kvo__error(KVO_EINVAL, "policy: NULL argument");
    if (!strcmp(name, "lru")) *out = KVO_POLICY_LRU;
    else if (!strcmp(name, "arc")) *out = KVO_POLICY_ARC;
    else if (!strcmp(name, "s3fifo") || !strcmp(name, "s3-fifo")) *out = KVO_POLICY_S3FIFO;
    else if (!strcmp(name, "prefix") || !strcmp(name, "branch")) *out = KVO_POLICY_PREFIX; /* branch: an alias */
    else if (!strcmp(name, "ensemble"))
        return kvo__error(KVO_EINVAL, "policy 'ensemble' was removed; use prefix (or lru, arc, s3fifo)");
    else return kvo__error(KVO_EINVAL, "policy '%s' is unknown; use lru, arc, s3fifo or prefix", name);
    return 0;
}

kvo_store_params kvo_store_default_params(void) {
    kvo_store_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.policy = KVO_POLICY_LRU;
    return p;
}

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

int kvo__check_args(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out, const char *fn) {
    if (!s) return kvo__error(KVO_EINVAL, "%s: NULL store", fn);
    if (!keys || !out) return kvo__error(KVO_EINVAL, "%s: NULL %s", fn, !keys ? "keys" : "output array");
    if (n == 0) return kvo__error(KVO_EINVAL, "%s: empty batch (n = 0)", fn);
    return 0;
}

int kvo__check_keys(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn) {
    /* one branch for the batch (a branch per key was 3 % of vLLM's store
     * cycle); the slow loop below finds the bad key for the message */
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t g = keys[i].group;
        bad |= (g >> 6) | (~s->group_ok >> (g & 63) & 1);
    }
    if (KVO__LIKELY(!bad)) return 0;
    for (size_t i = 0; i < n; i++) {
        int rc = kvo__check_key(s, &keys[i], i, fn);
        if (rc) return rc;
    }
    return 0;
}

int kvo__check_batch(const kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out,
                     const char *fn) {
    int rc = kvo__check_args(s, keys, n, out, fn);
    return rc ? rc : kvo__check_keys(s, keys, n, fn);
}

void kvo__event_push(kvo_store *s, uint32_t type, const kvo_chunk_key *k) {
    kvo__event_ring *r = &s->events;
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
    if (n <= s->sc_fit) return 0; /* every call but the first few */
    int rc = kvo__grow((void **)&s->sc_ent, &s->sc_cap, n, sizeof *s->sc_ent, 64, "store: scratch");
    size_t want = 16;
    while (want < 2 * n) want *= 2;
    if (!rc) rc = kvo__grow((void **)&s->sc_set, &s->sc_setcap, want, sizeof *s->sc_set, 16, "store: scratch set");
    if (!rc) rc = kvo__grow((void **)&s->sc_mix, &s->sc_mixcap, n, sizeof *s->sc_mix, 64, "store: scratch mix");
    if (!rc) rc = kvo__grow((void **)&s->memo, &s->memo_cap, n, sizeof *s->memo, 64, "store: scratch memo");
    if (!rc) rc = kvo__grow((void **)&s->memo_key, &s->memo_kcap, n, sizeof *s->memo_key, 64, "store: scratch memo");
    if (s->memo_kcap < s->memo_cap) s->memo_cap = s->memo_kcap; /* the memo holds what both hold */
    if (!rc) s->sc_fit = n; /* the arrays never shrink */
    return rc;
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

unsigned kvo__cms_get(const kvo_store *s, const kvo_chunk_key *k) {
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

/* The policy a params.policy names, or NULL with a message. */
static const kvo__policy_ops *kvo__policy_of(kvo_policy_kind k) {
    switch (k) {
    case KVO_POLICY_LRU: return &kvo__policy_lru;
    case KVO_POLICY_ARC: return &kvo__policy_arc;
    case KVO_POLICY_S3FIFO: return &kvo__policy_s3fifo;
    case KVO_POLICY_PREFIX: case KVO_POLICY_BRANCH: return &kvo__policy_prefix; /* branch: an alias */
    case KVO_POLICY_ENSEMBLE:
        kvo__error(KVO_EINVAL, "kvo_store_create: policy 4 (ensemble) was removed; use KVO_POLICY_PREFIX");
        return NULL;
    }
    kvo__error(KVO_EINVAL, "kvo_store_create: policy %d is unknown; use lru, arc, s3fifo or prefix", (int)k);
    return NULL;
}

int kvo_store_create(const kvo_store_params *p, kvo_store **out) {
    kvo_store_params p_in_;
    KVO__PARAMS_IN(p, kvo_store_params, p_in_, kvo_store_default_params, segment_bytes, "kvo_store_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_store_create: NULL %s", !p ? "params" : "out");
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_store_create: params.plan is required");
    const kvo__policy_ops *pol = kvo__policy_of(p->policy);
    if (!pol) return KVO_EINVAL;
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
    if (p->base_offset % KVO_SLOT_ALIGN)
        return kvo__error(KVO_EINVAL, "kvo_store_create: base_offset %llu is not a multiple of %u",
                          (unsigned long long)p->base_offset, (unsigned)KVO_SLOT_ALIGN);
    kvo_store *s = kvo__calloc(1, sizeof *s);
    if (!s) return kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory");
    s->plan = plan;
    s->params = *p;
    s->ngroups = (uint32_t)ng;
    s->pol = pol;
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
        s->group_ok |= UINT64_C(1) << g;
    }
    int rc = kvo__slots_init(&s->sl, p->capacity_bytes, cls_bytes, cls_w, ncls, p->segment_bytes);
    if (rc) goto fail;
    s->sl.base = p->base_offset;
    uint64_t slots_total = 0;
    for (uint32_t c = 0; c < ncls; c++) {
        uint64_t k = kvo__slots_class_capacity(&s->sl, c);
        if (k > slots_total) slots_total = k;
    }
    s->max_entries = p->max_entries ? p->max_entries : slots_total;
    if (s->max_entries > slots_total) s->max_entries = slots_total;
    /* ghosts: none for LRU; as many as residents for ARC and S3-FIFO; 4x for
     * prefix, whose reuse signal is a key coming back (policy_prefix.c) */
    s->ghost_cap = (uint64_t)pol->ghosts_per_entry * s->max_entries;
    if (s->max_entries + s->ghost_cap >= (UINT64_C(1) << 30)) {
        rc = kvo__error(KVO_ERANGE,
                        "kvo_store_create: %llu entries + %llu ghosts (policy %s) is over the 2^30 limit; set "
                        "max_entries",
                        (unsigned long long)s->max_entries, (unsigned long long)s->ghost_cap, s->pol->name);
        goto fail;
    }
    s->pool_cap = (uint32_t)(s->max_entries + s->ghost_cap);
    s->ent = kvo__store_big_alloc((size_t)s->pool_cap * sizeof *s->ent, &s->ent_base);
    if (!s->ent) {
        rc = kvo__error(KVO_ENOMEM, "kvo_store_create: cannot allocate %u entries", s->pool_cap);
        goto fail;
    }
    memset(s->ent, 0, (size_t)s->pool_cap * sizeof *s->ent);
    for (uint32_t i = 0; i < s->pool_cap; i++) {
        s->ent[i].next = i + 1 < s->pool_cap ? i + 1 : KVO__NIL;
        s->ent[i].slot = KVO__NIL;
    }
    s->pool_free = 0;
    rc = kvo__index_init(&s->ix, s->pool_cap);
    if (rc) goto fail;
    s->pipe_walk = kvo__pipe_walks(s->ix.mask + 1, s->pool_cap);
    for (int q = 0; q <= KVO__POL_LISTS; q++) kvo__list_init(&s->pq[q]);
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
    if (s->pol->init && (rc = s->pol->init(s))) goto fail;
    if (pthread_mutex_init(&s->mu, NULL)) {
        rc = kvo__error(KVO_ENOMEM, "kvo_store_create: pthread_mutex_init failed");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    if (s->pol->fini) s->pol->fini(s);
    kvo__slots_free(&s->sl);
    kvo__index_free(&s->ix);
    kvo__free(s->ent_base);
    kvo__free(s->cms);
    kvo__free(s->events.ev);
    kvo__free(s);
    return rc;
}

void kvo_store_destroy(kvo_store *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    if (s->pol->fini) s->pol->fini(s);
    kvo__slots_free(&s->sl);
    kvo__index_free(&s->ix);
    kvo__free(s->ent_base);
    kvo__free(s->cms);
    kvo__free(s->events.ev);
    kvo__free(s->sc_ent);
    kvo__free(s->sc_vict);
    kvo__free(s->sc_set);
    kvo__free(s->sc_mix);
    kvo__free(s->memo);
    kvo__free(s->memo_key);
    kvo__free(s);
}

const kvo_plan *kvo_store_plan(const kvo_store *s) { return s ? s->plan : NULL; }
uint64_t kvo_store_capacity(const kvo_store *s) { return s ? s->params.capacity_bytes : 0; }

/* -------------------------------------------------------- entry life -- */

void kvo__entry_init(kvo_store *s, uint32_t e, const kvo_chunk_key *k, uint64_t h) {
    kvo__entry *x = &s->ent[e];
    memset(x, 0, sizeof *x);
    x->key = *k;
    x->key.tenant = 0;
    x->prev = x->next = KVO__NIL;
    x->slot = KVO__NIL;
    kvo__index_insert(s, e, h);
}

uint32_t kvo__entry_new(kvo_store *s, const kvo_chunk_key *k, uint64_t h) {
    uint32_t e = s->pool_free;
    assert(e != KVO__NIL);
    s->pool_free = s->ent[e].next;
    kvo__entry_init(s, e, k, h);
    return e;
}

static void kvo__entry_free(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    kvo__index_remove(s, e);
    x->state = KVO__E_FREE;
    x->q = 0;
    x->next = s->pool_free;
    s->pool_free = e;
}

void kvo__ghost_drop(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    assert(x->state == KVO__E_GHOST);
    if (x->q) kvo__list_unlink(s, e);
    s->ghosts--;
    kvo__entry_free(s, e);
}

void kvo__resident_leave(kvo_store *s, uint32_t e) {
    uint32_t g = s->ent[e].key.group;
    s->bytes_used -= s->group_slot[g];
    s->g_chunks[g]--;
    s->resident--;
}

/* A resident entry's accounting released and its slot taken from it (still
 * allocated, owned by nobody the entry knows); returns the slot. */
uint32_t kvo__resident_unslot(kvo_store *s, uint32_t e) {
    kvo__entry *x = &s->ent[e];
    uint32_t slot = x->slot;
    kvo__resident_leave(s, e);
    x->slot = KVO__NIL;
    return slot;
}

/* Release a resident entry's slot and accounting (not the policy queues). */
void kvo__resident_release(kvo_store *s, uint32_t e) { kvo__slots_release(&s->sl, kvo__resident_unslot(s, e)); }

/* Remove a resident entry entirely (remove, clear, failed store). */
void kvo__resident_drop(kvo_store *s, uint32_t e, uint32_t evtype) {
    kvo__entry *x = &s->ent[e];
    if (x->q) s->pol->remove(s, e);
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
    if (i + 4 < n) { /* key i+4's entry (key_mix.h: the rule) */
        uint32_t e = kvo__pipe_ahead(s->ix.tab, s->ix.mask, p->h[(i + 4) & 15], s->pipe_walk, s->pool_cap);
        if (e != UINT32_MAX) __builtin_prefetch(&s->ent[e]);
    }
    return p->h[i & 15];
}

/* Key i's entry (ghosts included), advancing the pipeline. */
static inline uint32_t kvo__pipe_find(kvo_store *s, kvo__pipe *p, const kvo_chunk_key *keys, size_t n, size_t i) {
    return kvo__index_find_h(s, &keys[i], kvo__pipe_step(s, p, keys, n, i));
}

/* Preamble of the calls that only probe: check the batch, lock, start the
 * pipeline.  0 with the lock held, or an error without it. */
static int kvo__pipe_begin(kvo_store *s, kvo__pipe *p, const kvo_chunk_key *keys, size_t n, const void *out,
                           const char *fn) {
    int rc = kvo__check_batch(s, keys, n, out, fn);
    if (rc) return rc;
    kvo__store_lock(s);
    kvo__pipe_init(p, keys, n);
    return 0;
}

/* Resolve a batch into s->sc_ent (grown to n): each key's resident entry
 * (PENDING or READY), or NIL for an absent key or a ghost.  Changes nothing
 * else; the calls that change entries check the resolved batch first, so a
 * refused batch leaves the store as it was. */
int kvo__resolve(kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn) {
    int rc = kvo__scratch(s, n);
    if (rc) return rc;
    if (kvo__memo_all(s, keys, n)) {
        memcpy(s->sc_ent, s->memo, n * sizeof *s->sc_ent);
        return 0;
    }
    rc = kvo__check_keys(s, keys, n, fn);
    if (rc) return rc;
    kvo__pipe pp;
    kvo__pipe_init(&pp, keys, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvo__pipe_find(s, &pp, keys, n, i);
        s->sc_ent[i] = e != KVO__NIL && s->ent[e].state != KVO__E_GHOST ? e : KVO__NIL;
    }
    kvo__memo_set(s, s->sc_ent, keys, n);
    return 0;
}

int kvo__batch_begin(kvo_store *s, const kvo_chunk_key *keys, size_t n, const void *out, const char *fn) {
    int rc = kvo__check_args(s, keys, n, out, fn);
    if (rc) return rc;
    kvo__store_lock(s);
    rc = kvo__resolve(s, keys, n, fn);
    if (rc) kvo__store_unlock(s);
    return rc;
}

int kvo_store_lookup(kvo_store *s, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    kvo__pipe pp;
    int rc = kvo__pipe_begin(s, &pp, keys, n, states, "kvo_store_lookup");
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = kvo__pipe_find(s, &pp, keys, n, i);
        uint32_t g = keys[i].group;
        uint8_t st = KVO_MISS;
        if (e != KVO__NIL) {
            uint8_t es = s->ent[e].state;
            st = es == KVO__E_READY ? KVO_READY : es == KVO__E_PENDING ? KVO_PENDING : KVO_MISS;
            if (s->ent[e].flags & KVO__F_RETIRED) st = KVO_MISS;
        }
        states[i] = st;
        if (i < s->memo_cap) { /* as kvo__resolve would: resident entries (retired too), else NIL */
            bool res = e != KVO__NIL && s->ent[e].state != KVO__E_GHOST;
            s->memo[i] = res ? e : KVO__NIL;
            if (!res) s->memo_key[i] = keys[i];
        }
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
    s->memo_n = n <= s->memo_cap ? n : 0;
    s->memo_gen = s->res_gen;
    kvo__store_unlock(s);
    return 0;
}

/* A resident entry as the public kvo_store_entry (peek, scan); a retired
 * one says MISS (its slot is held until its last unpin). */
static void kvo__entry_out(const kvo_store *s, uint32_t e, kvo_store_entry *out) {
    const kvo__entry *x = &s->ent[e];
    out->key = x->key;
    out->slot.offset = x->offset;
    out->slot.bytes = s->group_slot[x->key.group];
    out->state = x->flags & KVO__F_RETIRED ? KVO_MISS : x->state == KVO__E_READY ? KVO_READY : KVO_PENDING;
    out->pins = x->pins;
}

int kvo_store_peek(kvo_store *s, const kvo_chunk_key *key, kvo_store_entry *out) {
    int rc = kvo__check_batch(s, key, 1, out, "kvo_store_peek");
    if (rc) return rc;
    kvo__store_lock(s);
    uint32_t e = kvo__index_find(s, key);
    if (e == KVO__NIL || s->ent[e].state == KVO__E_GHOST || (s->ent[e].flags & KVO__F_RETIRED)) {
        kvo__store_unlock(s);
        return kvo__error(KVO_ENOTFOUND, "kvo_store_peek: key of group %u is not stored", key->group);
    }
    kvo__entry_out(s, e, out);
    kvo__store_unlock(s);
    return 0;
}
/* --------------------------------------------------------------- load -- */

int kvo_store_prepare_load(kvo_store *s, const kvo_chunk_key *keys, size_t n, kvo_slot *slots) {
    static const char fn[] = "kvo_store_prepare_load";
    int rc = kvo__batch_begin(s, keys, n, slots, fn);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || (s->ent[e].flags & KVO__F_RETIRED)) {
            rc = kvo__error(KVO_ENOTFOUND, "%s: key %zu (group %u) is not stored (evicted, removed or never stored)",
                            fn, i, keys[i].group);
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
    kvo__store_unlock(s);
    return rc;
}

/* Unpin every key once, tentatively: all or nothing (a key given twice
 * needs two pins, hence counting per entry).  Lock held. */
static int kvo__unpin_batch(kvo_store *s, const kvo_chunk_key *keys, size_t n, const char *fn) {
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || s->ent[e].state != KVO__E_READY || s->ent[e].pins == 0) {
            int rc = kvo__error(KVO_ESTATE, "%s: key %zu (group %u) is not pinned", fn, i, keys[i].group);
            while (i > 0) s->ent[s->sc_ent[--i]].pins++; /* undo the tentative unpins */
            return rc;
        }
        s->ent[e].pins--;
    }
    return 0;
}

int kvo_store_complete_load(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    static const char fn[] = "kvo_store_complete_load";
    int rc = kvo__batch_begin(s, keys, n, keys, fn);
    if (rc) return rc;
    rc = kvo__unpin_batch(s, keys, n, fn);
    for (size_t k = 0; k < n && !rc; k++) {
        uint32_t e = s->sc_ent[kvo__use_at(s->pol, n, k)];
        kvo__entry *x = &s->ent[e];
        if (x->pins == 0 && !(x->flags & KVO__F_BATCH)) {
            x->flags |= KVO__F_BATCH; /* handle each entry once */
            kvo__busy(s, e, -1);
            s->pinned--;
            if (!(x->flags & KVO__F_RETIRED)) s->pol->reinsert(s, e);
        }
    }
    /* clear the marks; a retired entry goes with its last pin (here, not
     * above: a key given twice names its entry twice, and a later copy
     * finds it gone, no longer READY) */
    for (size_t i = 0; i < n && !rc; i++) {
        kvo__entry *x = &s->ent[s->sc_ent[i]];
        x->flags &= (uint8_t)~KVO__F_BATCH;
        if (x->state == KVO__E_READY && x->pins == 0 && (x->flags & KVO__F_RETIRED)) {
            x->flags &= (uint8_t)~KVO__F_RETIRED;
            s->removals++;
            kvo__resident_drop(s, s->sc_ent[i], KVO_EVENT_REMOVED);
        }
    }
    kvo__store_unlock(s);
    return rc;
}

/* ------------------------------------------------------ touch, remove -- */

/* Whether touching these resolved entries would leave the LRU list as it
 * is: they lead it in the order a touch leaves them (the batch's last key at
 * the head, each earlier one next after the later).  vLLM touches a load's
 * keys right after complete_load put them there in that order; the touch's
 * unlinks and pushes then changed nothing (3 % of its store cycle). */
static bool kvo__lru_leads(const kvo_store *s, const uint32_t *ent, size_t n) {
    if (s->pol != &kvo__policy_lru) return false;
    uint32_t e = s->pq[KVO__LRU_LIST].head;
    for (size_t i = n; i-- > 0;) {
        if (e == KVO__NIL || ent[i] != e) return false;
        e = s->ent[e].next;
    }
    return true;
}

int kvo_store_touch(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    static const char fn[] = "kvo_store_touch";
    int rc = kvo__check_args(s, keys, n, keys, fn);
    if (rc) return rc;
    kvo__store_lock(s);
    kvo__pipe pp;
    bool memo = kvo__memo_all(s, keys, n); /* confirmed keys were checked when recorded */
    /* leaf first: resolved in order (the probes are pipelined; resolve
     * checks the keys), used backwards */
    if (!memo && (rc = s->pol->leaf_first ? kvo__resolve(s, keys, n, fn) : kvo__check_keys(s, keys, n, fn))) {
        kvo__store_unlock(s);
        return rc;
    }
    const uint32_t *ent = memo ? s->memo : s->pol->leaf_first ? s->sc_ent : NULL;
    if (ent && kvo__lru_leads(s, ent, n)) n = 0;
    if (!ent) kvo__pipe_init(&pp, keys, n);
    for (size_t k = 0; k < n; k++) {
        size_t i = kvo__use_at(s->pol, n, k);
        uint32_t e = ent ? ent[i] : kvo__pipe_find(s, &pp, keys, n, i);
        if (e != KVO__NIL && s->ent[e].q && s->ent[e].state == KVO__E_READY) s->pol->hit(s, e);
    }
    kvo__store_unlock(s);
    return 0;
}

int kvo_store_remove(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    static const char fn[] = "kvo_store_remove";
    int rc = kvo__batch_begin(s, keys, n, keys, fn);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e != KVO__NIL && !(s->ent[e].flags & KVO__F_RETIRED) &&
            (s->ent[e].state == KVO__E_PENDING || s->ent[e].pins)) {
            rc = kvo__error(KVO_EBUSY, "%s: key %zu (group %u) is %s; nothing removed", fn, i, keys[i].group,
                            s->ent[e].pins ? "pinned by a load" : "being written");
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        /* absent, a duplicate already gone, or retired (gone for callers) */
        if (e == KVO__NIL || s->ent[e].state != KVO__E_READY || (s->ent[e].flags & KVO__F_RETIRED)) continue;
        s->removals++;
        kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
    }
out:
    kvo__store_unlock(s);
    return rc;
}

int kvo_store_retire(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    int rc = kvo__batch_begin(s, keys, n, keys, "kvo_store_retire");
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        uint32_t e = s->sc_ent[i];
        if (e == KVO__NIL || s->ent[e].state != KVO__E_READY) continue; /* absent, PENDING or gone already */
        if (s->ent[e].pins) {
            s->ent[e].flags |= KVO__F_RETIRED; /* complete_load drops it */
        } else {
            s->removals++;
            kvo__resident_drop(s, e, KVO_EVENT_REMOVED);
        }
    }
    kvo__store_unlock(s);
    return 0;
}

size_t kvo_store_clear(kvo_store *s) {
    if (!s) return 0;
    kvo__store_lock(s);
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
    kvo__store_unlock(s);
    return left;
}

/* ------------------------------------------------------ scan, events -- */

int kvo_store_scan(kvo_store *s, uint64_t *cursor, kvo_store_entry *out, size_t cap, size_t *n) {
    if (!s || !cursor || !out || !n) return kvo__error(KVO_EINVAL, "kvo_store_scan: NULL argument");
    if (cap == 0) return kvo__error(KVO_EINVAL, "kvo_store_scan: cap is 0");
    kvo__store_lock(s);
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
    kvo__store_unlock(s);
    return 0;
}

size_t kvo_store_drain_events(kvo_store *s, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (!s) return 0;
    kvo__store_lock(s);
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
    kvo__store_unlock(s);
    return w;
}
