/*
 * lookup: where each key of a request is, in one call.
 *
 * The host store answers for every key (one kvo_store_lookup); the file
 * tier's index for the keys the host misses (one kvo_file_tier_lookup);
 * the cluster's presence answers (presence.c) for what is left.  With
 * KVO_CASCADE_PREFIX the keys are one chain, so only the part up to the
 * first key no tier can hold matters: the file tier is asked for the host
 * misses (its index is in memory, so one call for all of them costs less
 * than stopping early), the cluster only for the host and file misses from
 * the first one on (its answers are cached, so a request asks once).  With
 * KVO_CASCADE_PROMOTE the READY lower-tier keys (before the first miss,
 * with PREFIX) are promoted into host slots at once, one batch per tier
 * (promote.c); they are reported PENDING from then on.
 *
 * With wait_ns the call waits (the lock released) for the cluster's
 * answers it needs, consuming every tier's completions meanwhile
 * (dispatch.c), and answers again, until none is out or the time is up.
 */
#include "cascade/cascade_internal.h"

/* One pass: states and tiers of the n keys; the prefixes into *out.
 * force_wait: count answers still out as PENDING whatever the budget. */
static int kvo__pass(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags, kvo_cascade_wait *w,
                     bool force_wait, uint8_t *states, uint8_t *tiers, kvo_cascade_lookup_result *out) {
    memset(out, 0, sizeof *out);
    if (c->store) {
        for (size_t i = 0, j; i < n; i = j) { /* each run of one tenant part in its store */
            j = kvo__casc_run(c, keys, i, n);
            int rc = kvo_store_lookup(kvo__casc_hs(c, &keys[i]), keys + i, j - i, states + i);
            if (rc) return rc;
        }
    } else
        memset(states, KVO_MISS, n);
    size_t nmiss = 0;
    for (size_t i = 0; i < n; i++) {
        tiers[i] = states[i] == KVO_MISS ? KVO_TIER_NONE : KVO_TIER_HOST;
        nmiss += states[i] == KVO_MISS;
    }
    /* the file tier, for the host misses */
    if (nmiss && c->file) {
        int rc = kvo__casc_scratch(c, nmiss);
        if (rc) return rc;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (states[i] == KVO_MISS && kvo__casc_uses(c, KVO_TIER_FILE, keys[i].group)) {
                c->s_keys[m] = keys[i];
                c->s_idx[m++] = i;
            }
        if (m) kvo__casc_file_lookup(c, c->s_keys, m, c->s_u8);
        for (size_t k = 0; k < m; k++) {
            if (c->s_u8[k] == KVO_MISS) continue;
            states[c->s_idx[k]] = c->s_u8[k];
            tiers[c->s_idx[k]] = KVO_TIER_FILE;
        }
    }
    /* the cluster, for what is left (from the first miss on, with PREFIX) */
    kvo__casc_round rr;
    bool asked = false;
    if (c->remote) {
        size_t from = 0;
        if (flags & KVO_CASCADE_PREFIX)
            while (from < n && states[from] != KVO_MISS) from++;
        if (from < n) {
            kvo__casc_pres_begin(c, w, force_wait, &rr);
            kvo__casc_pres_ask(c, &rr, keys + from, n - from, NULL, states + from, tiers + from);
            kvo__casc_pres_end(c, w, &rr);
            asked = true;
        }
    }
    /* promotion of the READY lower-tier keys in scope */
    size_t scope = n;
    if (flags & KVO_CASCADE_PREFIX)
        for (scope = 0; scope < n && states[scope] != KVO_MISS;) scope++;
    if ((flags & KVO_CASCADE_PROMOTE) && c->store) {
        size_t m = 0;
        for (size_t i = 0; i < scope; i++) m += states[i] == KVO_READY && tiers[i] != KVO_TIER_HOST;
        if (m) {
            kvo_chunk_key *pk = kvo__malloc(m * (sizeof *pk + 1 + sizeof(int) + sizeof(size_t)));
            if (!pk) return kvo__error(KVO_ENOMEM, "kvo_cascade_lookup: out of memory");
            int *res = (int *)(pk + m);
            size_t *at = (size_t *)(res + m);
            uint8_t *pt = (uint8_t *)(at + m);
            size_t k = 0;
            for (size_t i = 0; i < scope; i++)
                if (states[i] == KVO_READY && tiers[i] != KVO_TIER_HOST) {
                    pk[k] = keys[i];
                    pt[k] = tiers[i];
                    at[k++] = i;
                }
            int rc = kvo__casc_promote(c, pk, m, pt, NULL, res);
            for (size_t j = 0; !rc && j < m; j++) {
                if (res[j] == 0) out->promoting++;
                if (res[j] == 0 || res[j] == KVO_EEXIST || res[j] == KVO_EAGAIN) states[at[j]] = KVO_PENDING;
                else states[at[j]] = KVO_MISS; /* no room, or gone: not loadable now */
            }
            kvo__free(pk);
            if (rc) return rc;
        }
    }
    bool hole = false, pend_hole = false;
    for (size_t i = 0; i < n; i++) {
        if (states[i] == KVO_READY) {
            if (tiers[i] == KVO_TIER_HOST) out->host++;
            else if (tiers[i] == KVO_TIER_FILE) out->file++;
            else out->remote++;
        }
        if (!hole && states[i] == KVO_READY) out->prefix++;
        else hole = true;
        if (!pend_hole && states[i] != KVO_MISS) out->prefix_if_pending++;
        else pend_hole = true;
    }
    out->remote_pending = asked && rr.inflight && rr.wait;
    c->st.host.hits += out->host;
    c->st.file.hits += out->file;
    c->st.remote.hits += out->remote;
    return 0;
}

int kvo_cascade_lookup(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint32_t flags, kvo_cascade_wait *wait,
                       int64_t wait_ns, uint8_t *states, uint8_t *tiers, kvo_cascade_lookup_result *out) {
    kvo_cascade_lookup_result local;
    if (!out) out = &local;
    memset(out, 0, sizeof *out);
    if (!c || (n && (!keys || !states)))
        return kvo__error(KVO_EINVAL, "kvo_cascade_lookup: c, keys and states must not be NULL");
    if (flags & ~(KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE))
        return kvo__error(KVO_EINVAL, "kvo_cascade_lookup: unknown flags 0x%x", flags);
    int rc = kvo__casc_check_keys(c, keys, n, false, "kvo_cascade_lookup");
    if (rc || !n) return rc;
    uint8_t *tv = tiers;
    if (!tv && !(tv = kvo__malloc(n))) return kvo__error(KVO_ENOMEM, "kvo_cascade_lookup: out of memory");
    uint64_t deadline = wait_ns > 0 ? kvo__now_ns() + (uint64_t)wait_ns : 0;
    kvo__casc_lock(c);
    c->st.lookups++;
    for (;;) {
        /* while waiting, answers still out count as PENDING without a budget
         * (the pass that ends the wait uses the caller's) */
        bool waiting = deadline && kvo__now_ns() < deadline;
        rc = kvo__pass(c, keys, n, waiting ? flags & ~KVO_CASCADE_PROMOTE : flags, wait, waiting, states, tv, out);
        if (rc || !waiting || !out->remote_pending) {
            if (!rc && waiting && (flags & KVO_CASCADE_PROMOTE)) /* answers in: promote now */
                rc = kvo__pass(c, keys, n, flags, wait, false, states, tv, out);
            break;
        }
        kvo__casc_unlock(c);
        uint64_t now = kvo__now_ns();
        (void)kvo_remote_tier_wait(c->remote, now < deadline ? (int64_t)(deadline - now) : 0);
        kvo__casc_lock(c);
        kvo__casc_drive(c);
    }
    kvo__casc_unlock(c);
    if (tv != tiers) kvo__free(tv);
    return rc;
}
