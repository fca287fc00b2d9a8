/*
 * Stores: reserving slots for a batch (prepare_store) and handing the
 * written chunks to the lower tiers (complete_store); checksums.
 *
 * prepare_store asks the host store for the whole batch first (write-back
 * mode: the chunks it evicts go to the file tier before it returns, see
 * tierio.c).  When the host tier cannot take every key that needs a slot
 * (its room is pinned by loads or PENDING with other stores), the longest
 * leading part that fits is taken (halving the part on KVO_ENOSPC: the
 * store is all or nothing per call) and, with a staging area, the rest
 * goes there: a staged chunk is written by the engine into a staging slot,
 * handed to the lower tiers at complete_store and its slot freed once
 * every tier took it, so it reaches them without ever holding a host slot.
 * What neither has room for is REFUSED and counted.  A key being staged
 * counts as present to later batches (it is on its way).  Every reserved
 * key is remembered in c->pend with its slot, so that complete_store needs
 * no second look-up in the store.
 *
 * complete_store takes the host keys' checksums while they are still
 * PENDING (nothing can pin, evict or rewrite them), completes them, and
 * hands the chunks to the lower tiers: the file tier write-through (lent
 * from the host slot with file_zero_copy) and the remote tier always.
 *
 * Locks: the public calls take c->mu; the store's calls never block.
 */
#include "cascade/cascade_internal.h"

#define KVO__PEND_SEEN 2u /* complete_store: this key was seen in the batch */

static kvo__pend *kvo__pend_find(kvo_cascade *c, const kvo_chunk_key *k) {
    return kvo__hmap_find(&c->pend, k->hash.lo, kvo__casc_k1(k));
}

/* one: the keys must be of one tenant part (a call that reserves slots) */
static int kvo__check_keys(kvo_cascade *c, const char *fn, const kvo_chunk_key *keys, size_t n, bool one) {
    if (!c->store) return kvo__error(KVO_EINVAL, "%s: the cascade has no host tier", fn);
    if (!keys || !n) return kvo__error(KVO_EINVAL, "%s: no keys", fn);
    return kvo__casc_check_keys(c, keys, n, one, fn);
}

/* Reserve in store s the longest leading part of the m keys of keys that
 * fits (host: with write-back); need/slots as prepare_store.  *took. */
static int kvo__fill(kvo_cascade *c, bool host, const kvo_chunk_key *keys, size_t m, uint8_t *need, kvo_slot *slots,
                     size_t *took) {
    size_t i = 0, part = m;
    while (i < m && part > 0) {
        if (part > m - i) part = m - i;
        int rc = host ? kvo__casc_host_prepare(c, keys + i, part, need + i, slots + i)
                      : kvo_store_prepare_store(c->stage, keys + i, part, need + i, slots + i, NULL, NULL, 0, NULL);
        if (rc == KVO_ENOSPC) {
            part /= 2;
            continue;
        }
        if (rc) return rc;
        i += part;
    }
    *took = i;
    return 0;
}

/* Room was reserved (kvo__hmap_reserve) for every key of the batch. */
static void kvo__remember(kvo_cascade *c, const kvo_chunk_key *k, kvo_slot s, bool staged) {
    bool existed;
    kvo__pend *e = kvo__hmap_insert(&c->pend, k->hash.lo, kvo__casc_k1(k), &existed);
    e->slot = s;
    e->staged = staged;
}

static int kvo__prepare(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags, uint8_t *need,
                        kvo_slot *slots) {
    int rc = kvo__check_keys(c, "kvo_cascade_prepare_store", keys, n, true);
    if (rc) return rc;
    if (!need || !slots) return kvo__error(KVO_EINVAL, "kvo_cascade_prepare_store: need and slots must not be NULL");
    if ((rc = kvo__hmap_reserve(&c->pend, n, 64, "cascade: stores in flight"))) return rc;
    if ((rc = kvo__casc_scratch(c, n))) return rc;
    /* keys on their way through staging count as present */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        need[i] = KVO_CASCADE_SKIP;
        memset(&slots[i], 0, sizeof slots[i]);
        kvo__pend *e = c->stage ? kvo__pend_find(c, &keys[i]) : NULL;
        if (e && (e->staged & 1)) continue;
        c->s_keys[m] = keys[i];
        c->s_idx[m++] = i;
    }
    c->st.stores_offered += n;
    if (!m) return 0;
    rc = kvo__casc_host_prepare(c, c->s_keys, m, c->s_u8, c->s_slots);
    size_t took = m;
    if (rc == KVO_ENOSPC && !(flags & KVO_CASCADE_ALL_OR_NOTHING)) rc = kvo__fill(c, true, c->s_keys, m, c->s_u8,
                                                                                   c->s_slots, &took);
    if (rc) return rc;
    for (size_t k = 0; k < took; k++) {
        size_t i = c->s_idx[k];
        if (!c->s_u8[k]) continue;
        need[i] = KVO_CASCADE_HOST;
        slots[i] = c->s_slots[k];
        kvo__remember(c, &keys[i], slots[i], false);
        c->st.stores_host++;
    }
    if (took == m) return 0;
    /* the rest: the staging area takes the keys the host tier does not hold */
    size_t r = 0;
    for (size_t k = took; k < m; k++) {
        kvo_store_entry e;
        if (kvo_store_peek(kvo__casc_hs(c, &c->s_keys[k]), &c->s_keys[k], &e) == 0) continue; /* held, or on its
                                                                                                 way */
        c->s_keys[r] = c->s_keys[k];
        c->s_idx[r++] = c->s_idx[k];
    }
    size_t staged = 0;
    if (c->stage && r && (rc = kvo__fill(c, false, c->s_keys, r, c->s_u8, c->s_slots, &staged))) return rc;
    for (size_t k = 0; k < staged; k++) {
        if (!c->s_u8[k]) continue;
        size_t i = c->s_idx[k];
        need[i] = KVO_CASCADE_STAGED;
        slots[i] = c->s_slots[k];
        slots[i].offset += c->p.host_bytes; /* the caller sees arena offsets */
        kvo__remember(c, &keys[i], c->s_slots[k], true);
        c->st.stores_staged++;
    }
    for (size_t k = staged; k < r; k++) need[c->s_idx[k]] = KVO_CASCADE_REFUSED;
    c->st.stores_refused += r - staged;
    return 0;
}

int kvo_cascade_prepare_store(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags, uint8_t *need,
                              kvo_slot *slots) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_prepare_store: c must not be NULL");
    if (flags & ~KVO_CASCADE_ALL_OR_NOTHING)
        return kvo__error(KVO_EINVAL, "kvo_cascade_prepare_store: unknown flags 0x%x", flags);
    kvo__casc_lock(c);
    int rc = kvo__prepare(c, keys, n, flags, need, slots);
    kvo__casc_unlock(c);
    return rc;
}

/* The lower tiers the host tier writes through to at complete_store. */
static unsigned kvo__through(const kvo_cascade *c) {
    unsigned t = 0;
    if (c->file && c->p.file_mode == KVO_FILE_WRITE_THROUGH && !c->p.file_zero_copy)
        t |= KVO__CASC_TIER_BIT(KVO_TIER_FILE);
    if (c->remote) t |= KVO__CASC_TIER_BIT(KVO_TIER_REMOTE);
    return t;
}

static int kvo__complete(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool ok) {
    int rc = kvo__check_keys(c, "kvo_cascade_complete_store", keys, n, false);
    if (rc) return rc;
    if ((rc = kvo__casc_scratch(c, n))) return rc;
    /* sort into host keys (s_keys/s_slots from 0) and staged ones (from the
     * end), checking every key before anything changes */
    size_t nh = 0, ns = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        kvo__pend *e = kvo__pend_find(c, &keys[i]);
        if (!e) {
            kvo_store_entry se;
            if (kvo_store_peek(kvo__casc_hs(c, &keys[i]), &keys[i], &se) == 0 && se.state == KVO_READY)
                continue; /* done already */
            rc = kvo__error(KVO_ESTATE, "kvo_cascade_complete_store: key %zu (group %u) is not being stored", i,
                            keys[i].group);
            break;
        }
        if (e->staged & KVO__PEND_SEEN) {
            rc = kvo__error(KVO_EINVAL, "kvo_cascade_complete_store: key %zu (group %u) is given twice", i,
                            keys[i].group);
            break;
        }
        e->staged |= KVO__PEND_SEEN;
        if (e->staged & 1) {
            c->s_keys[n - 1 - ns] = keys[i];
            c->s_slots[n - 1 - ns++] = e->slot;
        } else {
            c->s_keys[nh] = keys[i];
            c->s_slots[nh++] = e->slot;
        }
    }
    for (size_t i = 0; i < nh + ns; i++) { /* forget them (or, on error, clear the marks) */
        size_t k = i < nh ? i : n - 1 - (i - nh);
        kvo__pend *e = kvo__pend_find(c, &c->s_keys[k]);
        if (rc) e->staged &= ~KVO__PEND_SEEN;
        else kvo__hmap_erase(&c->pend, e);
    }
    if (rc) return rc;
    if (nh) {
        if (ok && c->sums)
            for (size_t i = 0; i < nh; i++)
                c->sums[c->s_slots[i].offset / KVO_SLOT_ALIGN] = kvo__casc_sum(c, &c->s_keys[i], c->s_slots[i]);
        for (size_t i = 0, j; i < nh && !rc; i = j) {
            j = kvo__casc_run(c, c->s_keys, i, nh);
            rc = kvo_store_complete_store(kvo__casc_hs(c, &c->s_keys[i]), c->s_keys + i, j - i, ok);
        }
        if (rc == 0 && ok) {
            for (size_t i = 0; i < nh; i++) c->s_ptr[i] = kvo__casc_host_ptr(c, c->s_slots[i]);
            unsigned t = kvo__through(c);
            if (t)
                kvo__casc_write(c, t, c->s_keys, (const void *const *)c->s_ptr, c->s_slots, false, nh, 0, NULL,
                                NULL);
            if (c->file && c->p.file_mode == KVO_FILE_WRITE_THROUGH && c->p.file_zero_copy)
                kvo__casc_lend(c, c->s_keys, c->s_slots, nh);
        }
    }
    for (size_t j = 0; j < ns; j++) {
        const kvo_chunk_key *k = &c->s_keys[n - 1 - j];
        kvo_slot s = c->s_slots[n - 1 - j];
        const void *src = kvo__casc_stage_ptr(c, s);
        unsigned t = kvo__casc_lower(c);
        /* deferred: the staging slot stays PENDING until the retries end */
        if (ok && kvo__casc_write(c, t, k, &src, &s, true, 1, 0, NULL, NULL)) continue;
        (void)kvo_store_complete_store(c->stage, k, 1, false);
    }
    return rc;
}

int kvo_cascade_complete_store(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool ok) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_complete_store: c must not be NULL");
    kvo__casc_lock(c);
    int rc = kvo__complete(c, keys, n, ok);
    kvo__casc_unlock(c);
    return rc;
}

int kvo_cascade_pending_slots(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, kvo_slot *slots) {
    if (!c || !keys || !slots || !n)
        return kvo__error(KVO_EINVAL, "kvo_cascade_pending_slots: c, keys and slots must not be NULL, n not 0");
    if (!c->store) return kvo__error(KVO_EINVAL, "kvo_cascade_pending_slots: the cascade has no host tier");
    int rc = kvo__casc_check_parts(c, keys, n, false, "kvo_cascade_pending_slots");
    if (rc) return rc;
    kvo__casc_lock(c);
    for (size_t i = 0; i < n; i++) {
        const kvo__pend *e = kvo__pend_find(c, &keys[i]);
        memset(&slots[i], 0, sizeof slots[i]);
        if (!e) continue;
        slots[i] = e->slot;
        if (e->staged & 1) slots[i].offset += c->p.host_bytes;
    }
    kvo__casc_unlock(c);
    return 0;
}

size_t kvo_cascade_verify(kvo_cascade *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n, uint8_t *bad) {
    if (bad && n) memset(bad, 0, n);
    if (!c || !c->sums || !keys || !slots || kvo__casc_check_parts(c, keys, n, false, "kvo_cascade_verify")) return 0;
    size_t nbad = 0;
    kvo__casc_lock(c);
    for (size_t i = 0; i < n; i++) {
        if (c->sums[slots[i].offset / KVO_SLOT_ALIGN] == kvo__casc_sum(c, &keys[i], slots[i])) continue;
        /* a corrupt chunk must not be hit again: retired (hidden at once,
         * removed when its last pin goes) */
        (void)kvo_store_retire(kvo__casc_hs(c, &keys[i]), &keys[i], 1);
        c->st.checksum_failures++;
        if (bad) bad[i] = 1;
        nbad++;
    }
    kvo__casc_unlock(c);
    return nbad;
}

int kvo_cascade_prepare_load(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, kvo_slot *slots) {
    if (!c || !c->store) return kvo__error(KVO_EINVAL, "kvo_cascade_prepare_load: no host tier");
    if (c->nparts > 1 && keys) {
        int rc = kvo__casc_check_parts(c, keys, n, true, "kvo_cascade_prepare_load");
        if (rc) return rc;
        if (n) return kvo_store_prepare_load(kvo__casc_hs(c, keys), keys, n, slots);
    }
    return kvo_store_prepare_load(c->store, keys, n, slots);
}

/* complete_load / touch: each run of one tenant part to its store. */
static int kvo__by_part(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const char *fn,
                        int (*call)(kvo_store *, const kvo_chunk_key *, size_t)) {
    if (!c || !c->store) return kvo__error(KVO_EINVAL, "%s: no host tier", fn);
    if (c->nparts <= 1 || !keys || !n) return call(c->store, keys, n);
    int rc = kvo__casc_check_parts(c, keys, n, false, fn);
    for (size_t i = 0, j; i < n && !rc; i = j) {
        j = kvo__casc_run(c, keys, i, n);
        rc = call(kvo__casc_hs(c, &keys[i]), keys + i, j - i);
    }
    return rc;
}

int kvo_cascade_complete_load(kvo_cascade *c, const kvo_chunk_key *keys, size_t n) {
    return kvo__by_part(c, keys, n, "kvo_cascade_complete_load", kvo_store_complete_load);
}

int kvo_cascade_touch(kvo_cascade *c, const kvo_chunk_key *keys, size_t n) {
    return kvo__by_part(c, keys, n, "kvo_cascade_touch", kvo_store_touch);
}
