/*
 * The lower tiers' side of every chunk's way: writes (queued copies, loans,
 * the deferred list and its retries, the counters), the records of reads in
 * flight, and host reservations that write evicted chunks back.
 *
 * Writes.  kvo__casc_write hands chunks to the file tier
 * (kvo_file_tier_write) and the remote tier (kvo_remote_tier_put), which
 * copy them into their own staging memory before returning, so the bytes
 * may be reused at once.  A tier that refuses for back-pressure (KVO_EAGAIN:
 * its queue or staging memory full) gets the chunk again later when the
 * bytes stay somewhere: a READY host slot (re-checked before the retry:
 * still READY at the same offset, else the chunk is dropped) or a staging
 * slot (held PENDING in the staging store until every tier took it).
 * Retries run at every poll, in order, each entry at most retry_polls
 * times; whatever is dropped is counted (writes_dropped), never an error.
 * Write-back (kvo__casc_host_prepare) has no second chance: the evicted
 * slot is reused by the caller right after, so a refusal is a drop.
 *
 * Loans (file_zero_copy).  A completed store's host slot is lent to the
 * file tier (kvo_file_tier_write_borrowed): pinned in the host store (a
 * pinned entry is never evicted, so its slot is not rewritten) until the
 * write's completion (user data KVO__CASC_UD_LENT less the key's tenant
 * part) unpins it.  With
 * verify_checksums the tier checks the bytes against the sum taken at the
 * store, so bytes changed since never reach a file.
 *
 * Records.  Every read queued in a lower tier has a kvo__cop in c->ops,
 * keyed by the id the tier carries as its user data, so that the
 * dispatcher knows what to finish when it lands.
 */
#include "cascade/cascade_internal.h"
#include "core/xxh.h"

int kvo__casc_scratch(kvo_cascade *c, size_t n) {
    const kvo__arr a[] = {{(void **)&c->s_keys, sizeof *c->s_keys}, {(void **)&c->s_slots, sizeof *c->s_slots},
                          {(void **)&c->s_u8, sizeof *c->s_u8},     {(void **)&c->s_u8b, sizeof *c->s_u8b},
                          {(void **)&c->s_idx, sizeof *c->s_idx},   {(void **)&c->s_ud, sizeof *c->s_ud},
                          {(void **)&c->s_ptr, sizeof *c->s_ptr},   {(void **)&c->s_res, sizeof *c->s_res}};
    return kvo__grow_all(&c->s_cap, n ? n : 1, a, sizeof a / sizeof a[0], 64, "cascade: scratch");
}

void kvo__casc_file_lookup(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    for (size_t i = 0, j; i < n; i = j) {
        j = kvo__casc_run(c, keys, i, n);
        if (kvo_file_tier_lookup(kvo__casc_ft(c, &keys[i]), keys + i, j - i, states + i) != 0)
            memset(states + i, KVO_MISS, j - i);
    }
}

void kvo__casc_file_read(kvo_cascade *c, const kvo_chunk_key *keys, void *const *dsts, size_t n, const uint64_t *ud,
                         int *results) {
    for (size_t i = 0, j; i < n; i = j) {
        j = kvo__casc_run(c, keys, i, n);
        size_t nq = 0;
        int rc = kvo_file_tier_read(kvo__casc_ft(c, &keys[i]), keys + i, dsts + i, j - i, ud + i, results + i, &nq);
        for (size_t k = i; rc && k < j; k++) results[k] = rc;
    }
}

void kvo__casc_file_write(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, const uint64_t *sums,
                          size_t n, const uint64_t *ud, int *results, bool borrowed) {
    for (size_t i = 0, j; i < n; i = j) {
        j = kvo__casc_run(c, keys, i, n);
        size_t nq = 0;
        kvo_file_tier *ft = kvo__casc_ft(c, &keys[i]);
        int rc = borrowed ? kvo_file_tier_write_borrowed(ft, keys + i, srcs + i, sums ? sums + i : NULL, j - i,
                                                         ud + i, results + i, &nq)
                          : kvo_file_tier_write(ft, keys + i, srcs + i, j - i, NULL, results + i, &nq);
        for (size_t k = i; rc && k < j; k++) results[k] = rc;
    }
}

kvo__cop *kvo__casc_op_new(kvo_cascade *c, uint64_t *id) {
    if (kvo__hmap_reserve(&c->ops, 1, 64, "cascade: reads in flight") || kvo__casc_promise(c, 1)) return NULL;
    *id = ++c->next_id;
    if (KVO__CASC_IS_LENT(*id)) *id = c->next_id = 1; /* never: 2^64 ops */
    bool existed;
    return kvo__hmap_insert(&c->ops, *id, 0, &existed);
}

kvo__cop *kvo__casc_op_get(kvo_cascade *c, uint64_t id) { return kvo__hmap_find(&c->ops, id, 0); }

void kvo__casc_op_del(kvo_cascade *c, kvo__cop *o) { kvo__hmap_erase(&c->ops, o); }

void kvo__casc_op_refused(kvo_cascade *c, kvo__cop *o) {
    kvo__ring_unreserve(&c->cq, 1);
    kvo__hmap_erase(&c->ops, o);
}

bool kvo__casc_host_ready_at(kvo_cascade *c, const kvo_chunk_key *k, uint64_t off) {
    kvo_store_entry e;
    return kvo_store_peek(kvo__casc_hs(c, k), k, &e) == 0 && e.state == KVO_READY && e.slot.offset == off;
}

uint64_t kvo__casc_sum(kvo_cascade *c, const kvo_chunk_key *k, kvo_slot s) {
    return XXH3_64bits(kvo__casc_host_ptr(c, s), kvo_plan_group(c->plan, k->group)->chunk_bytes);
}

static kvo_cascade_tier_stats *kvo__tst(kvo_cascade *c, unsigned tier) {
    return tier == KVO_TIER_FILE ? &c->st.file : &c->st.remote;
}

/* A lent write is over (every tier took it or dropped it): its completion. */
static void kvo__write_done(kvo_cascade *c, const kvo_chunk_key *k, uint64_t ud, int result) {
    kvo_cascade_completion cp = {ud, *k, KVO_CASCADE_OP_WRITE, KVO_TIER_NONE, result, 0, 0};
    if (result == 0) cp.bytes = kvo_plan_group(c->plan, k->group)->chunk_bytes;
    kvo__casc_emit(c, &cp);
}

/* Add one deferred write (dropped, counted, when out of memory). */
static void kvo__defer_add(kvo_cascade *c, const kvo__defer *d) {
    if (kvo__grow((void **)&c->defer, &c->cap_defer, c->n_defer + 1, sizeof *c->defer, 64, "cascade: deferred")) {
        for (unsigned t = KVO_TIER_FILE; t <= KVO_TIER_REMOTE; t++)
            if (d->tiers & KVO__CASC_TIER_BIT(t)) kvo__tst(c, t)->writes_dropped++;
        if (d->src) kvo__write_done(c, &d->key, d->user_data, d->best);
        return;
    }
    c->defer[c->n_defer++] = *d;
}

/* One tier's writes of a batch (m <= 64 chunks); per chunk its result. */
static void kvo__tier_put(kvo_cascade *c, unsigned tier, const kvo_chunk_key *keys, const void *const *srcs,
                          size_t m, int *r) {
    size_t nq = 0;
    int rc = 0;
    if (tier == KVO_TIER_FILE) kvo__casc_file_write(c, keys, srcs, NULL, m, NULL, r, false);
    else rc = kvo_remote_tier_put(c->remote, keys, srcs, m, NULL, r, &nq);
    kvo_cascade_tier_stats *ts = kvo__tst(c, tier);
    for (size_t k = 0; k < m; k++) {
        if (rc) r[k] = rc;
        if (r[k] == 0) {
            ts->writes++;
            ts->write_bytes += kvo_plan_group(c->plan, keys[k].group)->chunk_bytes;
        } else if (r[k] == KVO_EEXIST)
            ts->writes_skipped++;
        if (tier == KVO_TIER_REMOTE && (r[k] == 0 || r[k] == KVO_EEXIST)) kvo__casc_pres_put(c, &keys[k]);
    }
}

/* The better of two outcomes for the caller: queued, held, then refusals. */
static int kvo__best(int a, int b) {
    if (a == 0 || b == 0) return 0;
    if (a == KVO_EEXIST || b == KVO_EEXIST) return KVO_EEXIST;
    return a == 1 ? b : a; /* 1: no tier asked yet */
}

size_t kvo__casc_write(kvo_cascade *c, unsigned tiers, const kvo_chunk_key *keys, const void *const *srcs,
                       const kvo_slot *slots, bool staged, size_t n, unsigned how, const uint64_t *notify, int *res) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *ws[B];
    size_t wi[B], deferred = 0;
    int r[B], best[B];
    unsigned again[B];
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B;
        for (size_t k = 0; k < b; k++) {
            again[k] = 0;
            best[k] = 1;
        }
        for (unsigned t = KVO_TIER_FILE; t <= KVO_TIER_REMOTE; t++) {
            if (!(tiers & KVO__CASC_TIER_BIT(t)) || !(t == KVO_TIER_FILE ? (void *)c->file : (void *)c->remote))
                continue;
            size_t m = 0;
            for (size_t k = 0; k < b; k++) {
                if (!kvo__casc_uses(c, t, keys[i + k].group)) continue; /* the tier holds another format */
                wk[m] = keys[i + k];
                ws[m] = srcs[i + k];
                wi[m++] = k;
            }
            if (!m) continue;
            kvo__tier_put(c, t, wk, ws, m, r);
            kvo_cascade_tier_stats *ts = kvo__tst(c, t);
            for (size_t k = 0; k < m; k++) {
                best[wi[k]] = kvo__best(best[wi[k]], r[k]);
                if (r[k] == 0 && (how & KVO__CASC_W_WRITEBACK)) ts->writebacks++;
                if (r[k] == KVO_EAGAIN) again[wi[k]] |= KVO__CASC_TIER_BIT(t);
                else if (r[k] != 0 && r[k] != KVO_EEXIST) ts->writes_dropped++;
            }
        }
        for (size_t k = 0; k < b; k++) {
            if (best[k] == 1) best[k] = KVO_ESTATE; /* no tier holds this group's format */
            if (res) res[i + k] = best[k];
            if (!again[k]) continue;
            /* refused for back-pressure by the tiers in again[k]: deferred
             * while the bytes stay in a slot; else dropped, unless every
             * tier refused and the caller retries (KVO__CASC_W_CALLER) */
            if (slots || notify) {
                for (unsigned t = KVO_TIER_FILE; t <= KVO_TIER_REMOTE; t++)
                    if ((again[k] & KVO__CASC_TIER_BIT(t)) && !(how & KVO__CASC_W_RETRY)) kvo__tst(c, t)->writes_deferred++;
                kvo__defer d = {keys[i + k], {0, 0}, NULL, 0, best[k], (uint8_t)again[k], (uint8_t)staged, 0};
                if (slots) d.slot = slots[i + k];
                else {
                    d.src = srcs[i + k];
                    d.user_data = notify[i + k];
                }
                kvo__defer_add(c, &d);
                deferred++;
            } else if (!((how & KVO__CASC_W_CALLER) && best[k] == KVO_EAGAIN)) {
                for (unsigned t = KVO_TIER_FILE; t <= KVO_TIER_REMOTE; t++)
                    if (again[k] & KVO__CASC_TIER_BIT(t)) kvo__tst(c, t)->writes_dropped++;
            }
        }
        if (notify && !(how & KVO__CASC_W_RETRY)) /* lent memory: done now unless deferred (a retry's caller
                                                    completes it itself) */
            for (size_t k = 0; k < b; k++)
                if (!again[k]) kvo__write_done(c, &keys[i + k], notify[i + k], best[k]);
    }
    return deferred;
}

void kvo__casc_lend(kvo_cascade *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *srcs[B];
    uint64_t sums[B], ud[B];
    kvo_slot ws[B];
    int wr[B];
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B, m = 0;
        for (size_t k = 0; k < b; k++) {
            const kvo_chunk_key *key = &keys[i + k];
            kvo_slot pin;
            if (!kvo__casc_uses(c, KVO_TIER_FILE, key->group)) continue;
            if (kvo_store_prepare_load(kvo__casc_hs(c, key), key, 1, &pin) != 0) { /* not READY: nothing to lend */
                c->st.file.writes_dropped++;
                continue;
            }
            assert(pin.offset == slots[i + k].offset);
            wk[m] = *key;
            ws[m] = slots[i + k];
            srcs[m] = kvo__casc_host_ptr(c, slots[i + k]);
            sums[m] = c->sums ? c->sums[slots[i + k].offset / KVO_SLOT_ALIGN] : 0;
            ud[m] = KVO__CASC_UD_LENT - key->tenant; /* the completion's key has no tag */
            wr[m++] = KVO_EINVAL;
        }
        if (m == 0) continue;
        kvo__casc_file_write(c, wk, srcs, c->sums ? sums : NULL, m, ud, wr, true);
        for (size_t k = 0; k < m; k++) {
            if (wr[k] == 0) { /* lent: the completion unpins it */
                c->lent++;
                c->st.file.lent++;
                c->st.file.writes++;
                c->st.file.write_bytes += kvo_plan_group(c->plan, wk[k].group)->chunk_bytes;
                continue;
            }
            (void)kvo_store_complete_load(kvo__casc_hs(c, &wk[k]), &wk[k], 1);
            if (wr[k] == KVO_EEXIST) c->st.file.writes_skipped++;
            else if (wr[k] == KVO_EAGAIN) {
                c->st.file.writes_deferred++;
                kvo__defer d = {wk[k], ws[k], NULL, 0, KVO_EAGAIN, KVO__CASC_TIER_BIT(KVO_TIER_FILE), 0, 0};
                kvo__defer_add(c, &d);
            } else
                c->st.file.writes_dropped++;
        }
    }
}

void kvo__casc_lent_done(kvo_cascade *c, const kvo_file_completion *fc) {
    if (c->lent) c->lent--;
    kvo_chunk_key k = fc->key;
    k.tenant = (uint32_t)(KVO__CASC_UD_LENT - fc->user_data);
    (void)kvo_store_complete_load(kvo__casc_hs(c, &k), &k, 1);
    if (fc->result == KVO_ECORRUPT) c->st.checksum_failures++; /* changed since its store: not written */
}

/* Give up on deferred entry d's remaining tiers (counted); a lent write
 * completes. */
static void kvo__defer_drop(kvo_cascade *c, const kvo__defer *d) {
    for (unsigned t = KVO_TIER_FILE; t <= KVO_TIER_REMOTE; t++)
        if (d->tiers & KVO__CASC_TIER_BIT(t)) kvo__tst(c, t)->writes_dropped++;
    if (d->src) kvo__write_done(c, &d->key, d->user_data, d->best);
}

void kvo__casc_retry(kvo_cascade *c) {
    size_t n = c->n_defer;
    if (!n) return;
    c->n_defer = 0; /* retries that are refused again are re-added by kvo__casc_write */
    kvo__defer *d = c->defer;
    /* entries are handled in place: the list only shrinks while we walk it
     * (kvo__defer_add appends after n_defer, which starts at 0 and stays
     * below the read position) */
    for (size_t i = 0; i < n; i++) {
        kvo__defer e = d[i];
        bool live = e.src || e.staged || kvo__casc_host_ready_at(c, &e.key, e.slot.offset);
        if (!live || ++e.polls > c->p.retry_polls) {
            kvo__defer_drop(c, &e);
            if (e.staged) (void)kvo_store_complete_store(c->stage, &e.key, 1, false);
            continue;
        }
        const void *src = e.src ? e.src : e.staged ? kvo__casc_stage_ptr(c, e.slot) : kvo__casc_host_ptr(c, e.slot);
        size_t before = c->n_defer;
        int r = 1;
        kvo__casc_write(c, e.tiers, &e.key, &src, e.src ? NULL : &e.slot, e.staged, 1, KVO__CASC_W_RETRY,
                        e.src ? &e.user_data : NULL, &r);
        if (c->n_defer > before) { /* refused again: keep its poll count and its best outcome */
            c->defer[c->n_defer - 1].polls = e.polls;
            c->defer[c->n_defer - 1].best = kvo__best(e.best, c->defer[c->n_defer - 1].best);
        } else if (e.src)
            kvo__write_done(c, &e.key, e.user_data, kvo__best(e.best, r));
        else if (e.staged)
            (void)kvo_store_complete_store(c->stage, &e.key, 1, false); /* every tier took it: free the slot */
    }
}

int kvo__casc_host_prepare(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots) {
    kvo_store *hs = kvo__casc_hs(c, keys); /* the keys are of one part (the callers' rule) */
    if (!c->file || c->p.file_mode != KVO_FILE_WRITE_BACK)
        return kvo_store_prepare_store(hs, keys, n, need, slots, NULL, NULL, 0, NULL);
    size_t want = 64; /* buffers must exist: with NULL ones the store evicts without reporting */
    for (;;) {
        const kvo__arr ev[] = {{(void **)&c->ev_keys, sizeof *c->ev_keys}, {(void **)&c->ev_slots, sizeof *c->ev_slots}};
        if (kvo__grow_all(&c->ev_cap, want, ev, 2, 64, "cascade: evicted chunks")) return KVO_ENOMEM;
        size_t nev = 0;
        int rc = kvo_store_prepare_store(hs, keys, n, need, slots, c->ev_keys, c->ev_slots, c->ev_cap, &nev);
        if (rc == KVO_ERANGE && nev > c->ev_cap) {
            want = nev;
            continue;
        }
        if (rc) return rc;
        assert(nev <= c->ev_cap);
        for (size_t i = 0; i < nev; i++) c->ev_keys[i].tenant = keys[0].tenant; /* their part: its file tier */
        /* the evicted slots keep their bytes until the caller writes the new
         * ones: queue the chunks the file tier lacks (it copies them now) */
        enum { B = 64 };
        uint8_t st[B];
        for (size_t i = 0; i < nev; i += B) {
            size_t b = nev - i < B ? nev - i : B, m = 0;
            kvo__casc_file_lookup(c, c->ev_keys + i, b, st);
            kvo_chunk_key wk[B];
            const void *srcs[B];
            for (size_t k = 0; k < b; k++) {
                if (st[k] != KVO_MISS) {
                    c->st.file.writes_skipped++;
                    continue;
                }
                const kvo_slot s = c->ev_slots[i + k];
                if (c->sums && c->sums[s.offset / KVO_SLOT_ALIGN] != kvo__casc_sum(c, &c->ev_keys[i + k], s)) {
                    c->st.checksum_failures++; /* changed since its store: never written */
                    continue;
                }
                wk[m] = c->ev_keys[i + k];
                srcs[m++] = kvo__casc_host_ptr(c, s);
            }
            if (m)
                kvo__casc_write(c, KVO__CASC_TIER_BIT(KVO_TIER_FILE), wk, srcs, NULL, false, m, KVO__CASC_W_WRITEBACK,
                                NULL, NULL);
        }
        return 0;
    }
}
