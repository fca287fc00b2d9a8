/*
 * Promotion: lower-tier chunks into host slots, one batch per tier.
 *
 * For a set of keys (each with the tier to read it from, or looked up
 * here: the file tier's index first, then the remote tier) the files are
 * pinned in the file tier first (the host slots reserved next may evict
 * host chunks whose write-back needs file quota, which must never come
 * from the files about to be read; the pin also refreshes their recency: a
 * hit is a use), host slots are reserved (PENDING in the host store; the
 * longest leading part that fits when not all do), and the reads are
 * queued: one kvo_file_tier_read call for the file keys, one
 * kvo_remote_tier_get call for the remote keys (the tiers batch them: one
 * io_uring submission, pipelined GETs per node).  Each queued read has a
 * record (tierio.c); its completion (dispatch.c) finishes the host entry
 * and emits one completion.  The pins go once the reads are queued: each
 * queued read holds the file open itself.
 *
 * A key the host tier holds or is receiving is not read again (KVO_EEXIST);
 * a read a tier refuses gives its PENDING entry back at once.
 */
#include "cascade/cascade_internal.h"

/* Reserve host slots for the m keys in s_keys (need -> s_u8, slots ->
 * s_slots): all, or the longest leading part that fits (*took keys).  0,
 * KVO_ENOSPC (none fits) or another error. */
static int kvo__reserve(kvo_cascade *c, size_t m, size_t *took) {
    size_t i = 0;
    *took = 0;
    while (i < m) { /* each run of one tenant part in its store */
        size_t end = kvo__casc_run(c, c->s_keys, i, m), part = end - i;
        while (i < end && part > 0) {
            if (part > end - i) part = end - i;
            int rc = kvo__casc_host_prepare(c, c->s_keys + i, part, c->s_u8 + i, c->s_slots + i);
            if (rc == KVO_ENOSPC) {
                part /= 2;
                continue;
            }
            if (rc) return rc;
            i += part;
        }
        if (i < end) break; /* the longest leading part */
    }
    *took = i;
    return i ? 0 : KVO_ENOSPC;
}

/* Queue the reads of tier t among the m reserved keys; results into res
 * at s_idx positions. */
static void kvo__queue_reads(kvo_cascade *c, unsigned t, size_t m, const uint8_t *tier_of, const uint64_t *user_data,
                             int *res) {
    enum { B = 64 };
    kvo_chunk_key rk[B];
    void *dst[B];
    uint64_t ud[B];
    int r[B];
    size_t at[B], nr = 0;
    uint64_t now = kvo__now_ns();
    for (size_t k = 0; k <= m; k++) {
        if (k < m) {
            if (c->s_u8[k] != 1 || tier_of[k] != t) continue;
            uint64_t id;
            kvo__cop *o = kvo__casc_op_new(c, &id);
            if (!o) { /* cannot track: give the slot back */
                (void)kvo_store_complete_store(kvo__casc_hs(c, &c->s_keys[k]), &c->s_keys[k], 1, false);
                if (res) res[c->s_idx[k]] = KVO_ENOMEM;
                continue;
            }
            o->op = KVO_CASCADE_OP_PROMOTE;
            o->tier = (uint8_t)t;
            o->gen = c->gen[c->s_keys[k].group];
            o->key = c->s_keys[k];
            o->slot = c->s_slots[k];
            o->user_data = user_data ? user_data[c->s_idx[k]] : 0;
            o->t0 = now;
            rk[nr] = c->s_keys[k];
            dst[nr] = kvo__casc_host_ptr(c, c->s_slots[k]);
            ud[nr] = id;
            at[nr++] = k;
            if (nr < B) continue;
        }
        if (!nr) continue;
        size_t nq = 0;
        int rc = 0;
        if (t == KVO_TIER_FILE) kvo__casc_file_read(c, rk, dst, nr, ud, r);
        else rc = kvo_remote_tier_get(c->remote, rk, dst, nr, ud, r, &nq);
        for (size_t j = 0; j < nr; j++) {
            int x = rc ? rc : r[j];
            if (res) res[c->s_idx[at[j]]] = x;
            if (x == 0) {
                c->promoting++;
                if (t == KVO_TIER_FILE) c->file_reads++;
                else c->remote_gets++;
                continue;
            }
            kvo__casc_op_refused(c, kvo__casc_op_get(c, ud[j]));
            (void)kvo_store_complete_store(kvo__casc_hs(c, &rk[j]), &rk[j], 1, false);
            if (t == KVO_TIER_FILE) c->st.file.promotion_failures++;
            else c->st.remote.promotion_failures++;
        }
        nr = 0;
    }
}

int kvo__casc_promote(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint8_t *tiers,
                      const uint64_t *user_data, int *results) {
    if (!c->store) return kvo__error(KVO_EINVAL, "kvo_cascade_promote: the cascade has no host tier");
    if (n && !keys) return kvo__error(KVO_EINVAL, "kvo_cascade_promote: keys must not be NULL");
    int rc = kvo__casc_scratch(c, n);
    if (rc) return rc;
    /* the tier of each key; candidates into s_keys (their index in s_idx,
     * their tier in s_u8b) */
    uint8_t fst[64];
    size_t m = 0, nfile = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned t = tiers ? tiers[i] : KVO_TIER_NONE;
        if (t == KVO_TIER_NONE) {
            if (c->file && kvo__casc_uses(c, KVO_TIER_FILE, keys[i].group) &&
                kvo_file_tier_lookup(kvo__casc_ft(c, &keys[i]), &keys[i], 1, fst) == 0 && fst[0] == KVO_READY)
                t = KVO_TIER_FILE;
            else if (c->remote && kvo__casc_uses(c, KVO_TIER_REMOTE, keys[i].group))
                t = KVO_TIER_REMOTE;
        }
        bool ok = (t == KVO_TIER_FILE && c->file) || (t == KVO_TIER_REMOTE && c->remote);
        if (!ok || !kvo__casc_uses(c, t, keys[i].group)) {
            if (results) results[i] = KVO_ENOTFOUND;
            continue;
        }
        if (results) results[i] = KVO_ENOSPC;
        c->s_keys[m] = keys[i];
        c->s_idx[m] = i;
        c->s_u8b[m++] = (uint8_t)t;
        nfile += t == KVO_TIER_FILE;
    }
    if (!m) return 0;
    /* pin the files (one by one where the batch fails: one left the tier) */
    if (nfile) {
        for (size_t k = 0; k < m; k++) {
            if (c->s_u8b[k] != KVO_TIER_FILE) continue;
            int pr = kvo_file_tier_pin(kvo__casc_ft(c, &c->s_keys[k]), &c->s_keys[k], 1);
            if (pr == 0) continue;
            c->s_u8b[k] = KVO_TIER_NONE; /* not read: drop from the batch below */
            if (results) results[c->s_idx[k]] = pr == KVO_EAGAIN ? KVO_EAGAIN : KVO_ENOTFOUND;
        }
        size_t w = 0;
        for (size_t k = 0; k < m; k++) {
            if (c->s_u8b[k] == KVO_TIER_NONE) continue;
            c->s_keys[w] = c->s_keys[k];
            c->s_idx[w] = c->s_idx[k];
            c->s_u8b[w++] = c->s_u8b[k];
        }
        m = w;
    }
    size_t took = 0;
    rc = m ? kvo__reserve(c, m, &took) : 0;
    if (rc == KVO_ENOSPC && c->lent) rc = KVO_EAGAIN; /* room once the lent writes end */
    if (rc && rc != KVO_ENOSPC && rc != KVO_EAGAIN) goto unpin;
    for (size_t k = took; k < m; k++) {
        c->s_u8[k] = 0;
        if (results) results[c->s_idx[k]] = c->lent ? KVO_EAGAIN : KVO_ENOSPC;
    }
    for (size_t k = 0; k < took; k++)
        if (c->s_u8[k] == 0 && results) results[c->s_idx[k]] = KVO_EEXIST;
    rc = 0;
    if (c->file) kvo__queue_reads(c, KVO_TIER_FILE, took, c->s_u8b, user_data, results);
    if (c->remote) kvo__queue_reads(c, KVO_TIER_REMOTE, took, c->s_u8b, user_data, results);
unpin:
    for (size_t k = 0; k < m; k++)
        if (c->s_u8b[k] == KVO_TIER_FILE) {
            (void)kvo_file_tier_touch(kvo__casc_ft(c, &c->s_keys[k]), &c->s_keys[k], 1);
            (void)kvo_file_tier_unpin(kvo__casc_ft(c, &c->s_keys[k]), &c->s_keys[k], 1);
        }
    return rc;
}
