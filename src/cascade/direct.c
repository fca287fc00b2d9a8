/*
 * The direct calls: engines with host memory of their own (SGLang's and
 * LMCache's host pools, vLLM's primary tier under its tiering spec) read
 * lower-tier chunks into it and write from it, through the same tiers,
 * namespaces, retries and counters as everything else.
 *
 * read: per key, the file tier when its index holds the key, else the
 * remote tier (when it holds the group's format); a file read that fails
 * goes on to the remote tier under the same record (dispatch.c), and a
 * chunk the remote tier served is written to the file tier too, so the
 * next read of it is local.  write: every lower tier, copying before the
 * call returns; a tier that refuses for back-pressure is waited for (its
 * queue drains, the lock released) and asked again until timeout_ns.
 * write_async lends the caller's memory instead: refusals are retried at
 * later polls (tierio.c's deferred list) and each key completes once.
 * remove: every tier.
 */
#include "cascade/cascade_internal.h"

static int kvo__direct_check(kvo_cascade *c, const char *fn, const kvo_chunk_key *keys, const void *ptrs, size_t n) {
    if (!c || (n && (!keys || !ptrs))) return kvo__error(KVO_EINVAL, "%s: NULL argument", fn);
    return kvo__casc_check_keys(c, keys, n, false, fn);
}

/* Queue the reads of the m keys (s_keys, dsts in s_ptr, caller's index in
 * s_idx) on tier t; results at the caller's positions. */
static void kvo__queue(kvo_cascade *c, unsigned t, size_t m, const uint64_t *user_data, int *results) {
    uint64_t now = kvo__now_ns();
    size_t nq = 0, k = 0;
    for (size_t j = 0; j < m; j++) {
        uint64_t id;
        kvo__cop *o = kvo__casc_op_new(c, &id);
        if (!o) {
            if (results) results[c->s_idx[j]] = KVO_ENOMEM;
            continue;
        }
        o->op = KVO_CASCADE_OP_READ;
        o->tier = (uint8_t)t;
        o->chain = t == KVO_TIER_FILE && c->remote && kvo__casc_uses(c, KVO_TIER_REMOTE, c->s_keys[j].group);
        o->fill_file = t == KVO_TIER_REMOTE && c->file && kvo__casc_uses(c, KVO_TIER_FILE, c->s_keys[j].group);
        o->gen = c->gen[c->s_keys[j].group];
        o->key = c->s_keys[j];
        o->dst = c->s_ptr[j];
        o->user_data = user_data ? user_data[c->s_idx[j]] : 0;
        o->t0 = now;
        c->s_keys[k] = c->s_keys[j];
        c->s_ptr[k] = c->s_ptr[j];
        c->s_idx[k] = c->s_idx[j];
        c->s_ud[k++] = id;
    }
    if (!k) return;
    int rc = 0;
    if (t == KVO_TIER_FILE) kvo__casc_file_read(c, c->s_keys, c->s_ptr, k, c->s_ud, c->s_res);
    else rc = kvo_remote_tier_get(c->remote, c->s_keys, c->s_ptr, k, c->s_ud, c->s_res, &nq);
    for (size_t j = 0; j < k; j++) {
        int r = rc ? rc : c->s_res[j];
        if (results) results[c->s_idx[j]] = r;
        if (r == 0) {
            c->reading++;
            if (t == KVO_TIER_FILE) c->file_reads++;
            else c->remote_gets++;
            continue;
        }
        kvo__casc_op_refused(c, kvo__casc_op_get(c, c->s_ud[j]));
    }
}

int kvo_cascade_read(kvo_cascade *c, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                     const uint64_t *user_data, int *results) {
    int rc = kvo__direct_check(c, "kvo_cascade_read", keys, dsts, n);
    if (rc || !n) return rc;
    kvo__casc_lock(c);
    if ((rc = kvo__casc_scratch(c, n))) goto out;
    /* file tier: the keys its index holds (READY; PENDING ones are being
     * written: the remote tier, if any, may have them) */
    uint8_t *fst = c->s_u8b;
    memset(fst, KVO_MISS, n);
    if (c->file) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (kvo__casc_uses(c, KVO_TIER_FILE, keys[i].group)) {
                c->s_keys[m] = keys[i];
                c->s_idx[m++] = i;
            }
        if (m) kvo__casc_file_lookup(c, c->s_keys, m, c->s_u8);
        for (size_t k = 0; k < m; k++) fst[c->s_idx[k]] = c->s_u8[k];
    }
    for (int pass = 0; pass < 2; pass++) {
        unsigned t = pass == 0 ? KVO_TIER_FILE : KVO_TIER_REMOTE;
        if (!(t == KVO_TIER_FILE ? (void *)c->file : (void *)c->remote)) continue;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            bool mine = t == KVO_TIER_FILE ? fst[i] == KVO_READY
                                           : fst[i] != KVO_READY && kvo__casc_uses(c, KVO_TIER_REMOTE, keys[i].group);
            if (!mine) continue;
            c->s_keys[m] = keys[i];
            c->s_ptr[m] = dsts[i];
            c->s_idx[m++] = i;
        }
        kvo__queue(c, t, m, user_data, results);
    }
    if (results)
        for (size_t i = 0; i < n; i++) {
            bool asked = fst[i] == KVO_READY ||
                         (c->remote && kvo__casc_uses(c, KVO_TIER_REMOTE, keys[i].group));
            if (!asked) results[i] = KVO_ENOTFOUND;
        }
out:
    kvo__casc_unlock(c);
    return rc;
}

int kvo_cascade_write(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                      int64_t timeout_ns, int *results) {
    int rc = kvo__direct_check(c, "kvo_cascade_write", keys, srcs, n);
    if (rc || !n) return rc;
    if (!c->file && !c->remote) return kvo__error(KVO_EINVAL, "kvo_cascade_write: the cascade has no lower tier");
    uint64_t deadline = timeout_ns > 0 ? kvo__now_ns() + (uint64_t)timeout_ns : 0;
    int *res = kvo__malloc(n * (sizeof(int) + sizeof(size_t) + sizeof(kvo_chunk_key) + sizeof(void *)));
    if (!res) return kvo__error(KVO_ENOMEM, "kvo_cascade_write: out of memory");
    size_t *todo = (size_t *)(res + n);
    kvo_chunk_key *wk = (kvo_chunk_key *)(todo + n);
    const void **ws = (const void **)(wk + n);
    for (size_t i = 0; i < n; i++) todo[i] = i;
    size_t m = n;
    unsigned tiers = kvo__casc_lower(c);
    for (bool first = true;; first = false) {
        for (size_t j = 0; j < m; j++) {
            wk[j] = keys[todo[j]];
            ws[j] = srcs[todo[j]];
        }
        kvo__casc_lock(c);
        /* no slots: a refusal is counted as dropped; retried here instead */
        kvo__casc_write(c, tiers, wk, ws, NULL, false, m, KVO__CASC_W_CALLER, NULL, res);
        kvo__casc_unlock(c);
        size_t k = 0;
        for (size_t j = 0; j < m; j++) {
            if (results) results[todo[j]] = res[j];
            if (res[j] == KVO_EAGAIN) {
                wk[k] = wk[j];
                todo[k++] = todo[j];
            }
        }
        uint64_t now = kvo__now_ns();
        /* an attempt right after a drain that takes nothing is a real
         * refusal (a chunk larger than the tiers' staging memory) */
        if (!k || !deadline || now >= deadline || (!first && k == m)) {
            kvo__casc_lock(c); /* refused for good: counted */
            for (size_t j = 0; j < k; j++) {
                if (c->file && kvo__casc_uses(c, KVO_TIER_FILE, wk[j].group)) c->st.file.writes_dropped++;
                if (c->remote && kvo__casc_uses(c, KVO_TIER_REMOTE, wk[j].group)) c->st.remote.writes_dropped++;
            }
            kvo__casc_unlock(c);
            break;
        }
        /* let the queues drain, then ask again */
        int64_t left = (int64_t)(deadline - now);
        for (uint32_t f = 0; f < c->nft; f++) (void)kvo_file_tier_flush(c->ftiers[f], left);
        if (c->remote) (void)kvo_remote_tier_flush(c->remote, left);
        m = k;
    }
    kvo__free(res);
    return 0;
}

int kvo_cascade_write_async(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                            const uint64_t *user_data, int *results) {
    int rc = kvo__direct_check(c, "kvo_cascade_write_async", keys, srcs, n);
    if (rc || !n) return rc;
    if (!user_data) return kvo__error(KVO_EINVAL, "kvo_cascade_write_async: user_data must not be NULL");
    if (!c->file && !c->remote)
        return kvo__error(KVO_EINVAL, "kvo_cascade_write_async: the cascade has no lower tier");
    unsigned tiers = kvo__casc_lower(c);
    kvo__casc_lock(c);
    rc = kvo__casc_promise(c, n); /* one completion per key */
    if (!rc) kvo__casc_write(c, tiers, keys, srcs, NULL, false, n, 0, user_data, NULL);
    kvo__casc_unlock(c);
    if (rc) return rc;
    if (results) memset(results, 0, n * sizeof *results);
    return 0;
}

int kvo_cascade_remove(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint64_t *user_data,
                       int *results) {
    int rc = kvo__direct_check(c, "kvo_cascade_remove", keys, keys, n);
    if (rc || !n) return rc;
    kvo__casc_lock(c);
    uint64_t now = kvo__now_ns();
    for (size_t i = 0; i < n; i++) {
        const kvo_chunk_key *k = &keys[i];
        bool found = false;
        kvo_store_entry e;
        kvo_store *hs = c->store ? kvo__casc_hs(c, k) : NULL;
        if (hs && kvo_store_peek(hs, k, &e) == 0) {
            found = true;
            /* READY and unpinned go now; pinned ones are retired (hidden,
             * gone at their last unpin) */
            if (kvo_store_remove(hs, k, 1) == KVO_EBUSY) (void)kvo_store_retire(hs, k, 1);
        }
        uint8_t fst = KVO_MISS;
        if (c->file && kvo__casc_uses(c, KVO_TIER_FILE, k->group) &&
            kvo_file_tier_lookup(kvo__casc_ft(c, k), k, 1, &fst) == 0 && fst != KVO_MISS) {
            found = true;
            (void)kvo_file_tier_remove(kvo__casc_ft(c, k), k, 1); /* a file being written stays (KVO_EBUSY) */
        }
        int r = found ? 0 : KVO_ENOTFOUND;
        bool remote = c->remote && kvo__casc_uses(c, KVO_TIER_REMOTE, k->group);
        if (remote) kvo__casc_pres_absent(c, k);
        if (remote) {
            uint64_t id = 0;
            kvo__cop *o = NULL;
            if (user_data && !(o = kvo__casc_op_new(c, &id))) {
                rc = KVO_ENOMEM;
                break;
            }
            if (o) {
                o->op = KVO_CASCADE_OP_REMOVE;
                o->tier = KVO_TIER_REMOTE;
                o->chain = found; /* the local tiers held it: removed whatever the DEL says */
                o->key = *k;
                o->user_data = user_data[i];
                o->t0 = now;
            }
            int q = KVO_EINVAL;
            if (kvo_remote_tier_remove(c->remote, k, 1, &id, &q, NULL) != 0 || q != 0) {
                if (o) kvo__casc_op_refused(c, o);
                r = q == KVO_EAGAIN ? KVO_EAGAIN : KVO_EIO;
            } else
                r = 0;
        } else if (user_data) { /* nothing remote: done now */
            if ((rc = kvo__casc_promise(c, 1))) break;
            kvo_cascade_completion cp = {user_data[i], *k, KVO_CASCADE_OP_REMOVE, KVO_TIER_NONE, r, 0, 0};
            kvo__casc_emit(c, &cp);
            r = 0;
        }
        if (results) results[i] = r;
    }
    kvo__casc_unlock(c);
    return rc ? kvo__error(rc, "kvo_cascade_remove: out of memory") : 0;
}
