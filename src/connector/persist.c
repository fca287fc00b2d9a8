/*
 * File-tier hand-off: checksums of host slots, handing READY host chunks to
 * the file tier (write-through after a store, write-back at eviction), and
 * flush_to_file.
 *
 * Write-back is safe because evicted slots keep their bytes until the
 * caller writes the new slots, which happens only after
 * kvo__conn_prepare_store returns, and the tier copies the bytes into its
 * own staging memory before kvo_file_tier_write returns.  flush_to_file
 * scans the host store in batches under c->mu (READY slots only change
 * under mu), releasing it while it waits for the tier's queue to drain.
 * Writes the tier refuses are counted (file_writes_dropped), never errors.
 *
 * Zero-copy write-through (file_zero_copy): a stored chunk's host slot is
 * lent to the tier (kvo_file_tier_write_borrowed) instead of copied into its
 * staging memory.  The loan is a pin in the host store, taken before the
 * write is queued and released by the write's completion
 * (kvo__conn_file_lent_done, from poll): a pinned chunk is never evicted, so
 * its slot is not rewritten while the tier reads it; with verify_checksums
 * the tier checks the bytes against the checksum the store took, so bytes
 * changed since (a stray write by the engine) never reach a file.  destroy
 * waits for every loan before the arena goes (create.c).
 */
#include <limits.h>

#include "core/xxh.h"

#include "connector/connector_internal.h"

uint64_t kvo__conn_slot_sum(kvo_connector *c, const kvo_chunk_key *k, kvo_slot s) {
    const kvo_group_plan *gp = kvo_plan_group(c->plan, k->group);
    return XXH3_64bits(kvo__conn_slot_ptr(c, s), gp->chunk_bytes);
}

/* Hand n host chunks (keys[i] READY in host slot slots[i]) to the file
 * tier, which copies them before returning.  lookup: ask the tier first and
 * skip the chunks it holds or is writing (not counted as drops).  verify
 * (with verify_checksums; false only where the checksums were just taken
 * from these bytes under mu): a chunk whose host bytes no longer match their
 * checksum is never written (a file would give it a valid checksum of its
 * own): counted in checksum_failures, res KVO_ECORRUPT.  A chunk of a group
 * whose current slot format the tier does not hold (file_groups, see
 * relayout.c) is dropped, res KVO_ESTATE.  res[i] (may be NULL): 0
 * queued, KVO_EEXIST held already, KVO_ECORRUPT, or why it was dropped
 * (KVO_EAGAIN back-pressure, KVO_ENOSPC quota, KVO_ECLOSED).  Counts
 * file_writes and file_writes_skipped; returns how many were dropped (the
 * caller counts them: a retry may still queue them).  Caller holds mu. */
size_t kvo__conn_file_put(kvo_connector *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n,
                     bool lookup, bool verify, int *res) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *srcs[B];
    uint8_t st[B];
    int wr[B];
    size_t idx[B], dropped = 0;
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B, m = 0, nq = 0;
        if (lookup && kvo_file_tier_lookup(c->file, keys + i, b, st) != 0) memset(st, KVO_MISS, b);
        for (size_t k = 0; k < b; k++) {
            if (!((c->file_groups >> keys[i + k].group) & 1)) { /* the tier holds another format */
                dropped++;
                if (res) res[i + k] = KVO_ESTATE;
                continue;
            }
            if (lookup && st[k] != KVO_MISS) {
                c->st.file_writes_skipped++;
                if (res) res[i + k] = KVO_EEXIST;
                continue;
            }
            if (verify && c->sums &&
                c->sums[slots[i + k].offset / KVO_SLOT_ALIGN] != kvo__conn_slot_sum(c, &keys[i + k], slots[i + k])) {
                c->st.checksum_failures++;
                if (res) res[i + k] = KVO_ECORRUPT;
                continue;
            }
            wk[m] = keys[i + k];
            srcs[m] = kvo__conn_slot_ptr(c, slots[i + k]);
            wr[m] = KVO_EINVAL;
            idx[m++] = i + k;
        }
        if (m == 0) continue;
        int rc = kvo_file_tier_write(c->file, wk, srcs, m, NULL, wr, &nq);
        c->st.file_writes += nq;
        for (size_t k = 0; k < m; k++) {
            int r = rc ? rc : wr[k];
            if (r == KVO_EEXIST) c->st.file_writes_skipped++;
            else if (r != 0) dropped++;
            if (res) res[idx[k]] = r;
        }
    }
    return dropped;
}

size_t kvo__conn_file_lend(kvo_connector *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *srcs[B];
    uint64_t sums[B], ud[B];
    int wr[B];
    size_t dropped = 0;
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B, m = 0, nq = 0;
        for (size_t k = 0; k < b; k++) {
            const kvo_chunk_key *key = &keys[i + k];
            kvo_slot pin;
            if (!((c->file_groups >> key->group) & 1)) { /* the tier holds another format */
                dropped++;
                continue;
            }
            if (kvo_store_prepare_load(c->store, key, 1, &pin) != 0) { /* not READY: nothing to lend */
                dropped++;
                continue;
            }
            assert(pin.offset == slots[i + k].offset);
            wk[m] = *key;
            srcs[m] = kvo__conn_slot_ptr(c, slots[i + k]);
            sums[m] = c->sums ? c->sums[slots[i + k].offset / KVO_SLOT_ALIGN] : 0;
            ud[m] = KVO__CONN_LENT_UD;
            wr[m++] = KVO_EINVAL;
        }
        if (m == 0) continue;
        (void)kvo_file_tier_write_borrowed(c->file, wk, srcs, c->sums ? sums : NULL, m, ud, wr, &nq);
        c->st.file_writes += nq;
        c->file_lent += nq;
        for (size_t k = 0; k < m; k++) {
            if (wr[k] == 0) continue; /* lent: the completion unpins it */
            (void)kvo_store_complete_load(c->store, &wk[k], 1);
            if (wr[k] == KVO_EEXIST) c->st.file_writes_skipped++;
            else dropped++;
        }
    }
    return dropped;
}

void kvo__conn_file_lent_done(kvo_connector *c, const kvo_file_completion *fc) {
    if (c->file_lent) c->file_lent--;
    (void)kvo_store_complete_load(c->store, &fc->key, 1);
    if (fc->result == KVO_ECORRUPT) c->st.checksum_failures++; /* changed since its store: not written */
}

/* kvo_store_prepare_store on the host store; in write-back mode the READY
 * chunks it evicts are handed to the file tier before this returns (their
 * slots still hold their bytes: the caller writes the new slots later).
 * Caller holds mu. */
int kvo__conn_prepare_store(kvo_connector *c, const kvo_chunk_key *keys, size_t n, uint8_t *need,
                       kvo_slot *slots) {
    if (!c->file || c->p.file_mode != KVO_FILE_WRITE_BACK)
        return kvo_store_prepare_store(c->store, keys, n, need, slots, NULL, NULL, 0, NULL);
    size_t want = 64; /* buffers must exist: with NULL ones the store evicts without reporting */
    for (;;) {
        const kvo__arr ev[] = {{(void **)&c->ev_keys, sizeof *c->ev_keys},
                               {(void **)&c->ev_slots, sizeof *c->ev_slots}};
        if (kvo__grow_all(&c->ev_cap, want, ev, 2, 64, "connector: evicted chunks")) return KVO_ENOMEM;
        size_t nev = 0;
        int rc = kvo_store_prepare_store(c->store, keys, n, need, slots, c->ev_keys, c->ev_slots, c->ev_cap, &nev);
        if (rc == KVO_ERANGE && nev > c->ev_cap) {
            want = nev;
            continue;
        }
        if (rc) return rc;
        assert(nev <= c->ev_cap);
        if (nev) {
            size_t q0 = c->st.file_writes;
            c->st.file_writes_dropped += kvo__conn_file_put(c, c->ev_keys, c->ev_slots, nev, true, true, NULL);
            c->st.file_writebacks += c->st.file_writes - q0;
        }
        return 0;
    }
}

/* Nanoseconds left until deadline (ns, 0 = none: -1). */
static int64_t kvo__ns_left(uint64_t deadline) {
    if (!deadline) return -1;
    uint64_t now = kvo__now_ns();
    if (now >= deadline) return 0;
    return deadline - now > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)(deadline - now);
}

int kvo_connector_flush_to_file(kvo_connector *c, int64_t timeout_ns, uint64_t *n_queued) {
    if (n_queued) *n_queued = 0;
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_flush_to_file: c must not be NULL");
    if (!c->file)
        return kvo__error(KVO_ESTATE, "kvo_connector_flush_to_file: no file tier attached (params.file_tier)");
    enum { B = 64 };
    uint64_t deadline = timeout_ns < 0 ? 0 : kvo__now_ns() + (uint64_t)timeout_ns + 1;
    kvo_store_entry ents[B];
    kvo_chunk_key keys[B];
    kvo_slot slots[B];
    int res[B];
    uint64_t cursor = 0, queued = 0;
    int rc = 0;
    do {
        size_t n = 0, m = 0;
        if (queued) { /* pace: one batch in the tier's queue at a time, so that
                         the tier's back-pressure does not refuse the next */
            rc = kvo_file_tier_flush(c->file, kvo__ns_left(deadline));
            if (rc) break;
        }
        kvo__conn_lock(c);
        rc = kvo_store_scan(c->store, &cursor, ents, B, &n);
        for (size_t i = 0; i < n && !rc; i++)
            if (ents[i].state == KVO_READY) {
                keys[m] = ents[i].key;
                slots[m++] = ents[i].slot;
            }
        for (int attempt = 0; !rc && m; attempt++) {
            uint64_t q0 = c->st.file_writes;
            size_t dropped = kvo__conn_file_put(c, keys, slots, m, true, true, res), k = 0;
            uint64_t progress = c->st.file_writes - q0;
            queued += progress;
            for (size_t i = 0; i < m; i++) {
                if (res[i] == KVO_ECLOSED) rc = KVO_ECLOSED;
                if (res[i] != KVO_EAGAIN) continue;
                keys[k] = keys[i];
                slots[k++] = slots[i];
            }
            /* after a drained queue, an attempt that queues nothing is a
             * real refusal (staging, quota): give up on those chunks */
            if (rc || k == 0 || (attempt > 0 && progress == 0)) {
                c->st.file_writes_dropped += dropped;
                break;
            }
            /* back-pressure: let the tier's queue drain, then retry what it
             * refused if it is still in host memory at the same slot */
            c->st.file_writes_dropped += dropped - k;
            kvo__conn_unlock(c);
            int w = kvo_file_tier_flush(c->file, kvo__ns_left(deadline));
            kvo__conn_lock(c);
            if (w) {
                c->st.file_writes_dropped += k;
                rc = w;
                break;
            }
            m = 0;
            for (size_t i = 0; i < k; i++) {
                kvo_store_entry e;
                if (kvo_store_peek(c->store, &keys[i], &e) == 0 && e.state == KVO_READY &&
                    e.slot.offset == slots[i].offset) {
                    keys[m] = keys[i];
                    slots[m++] = e.slot;
                }
            }
        }
        kvo__conn_unlock(c);
    } while (!rc && cursor);
    if (!rc) rc = kvo_file_tier_flush(c->file, kvo__ns_left(deadline));
    if (n_queued) *n_queued = queued;
    if (rc == KVO_ETIMEDOUT)
        return kvo__error(KVO_ETIMEDOUT,
                          "kvo_connector_flush_to_file: file writes not finished after %lld ns (%llu chunks queued "
                          "by this call; they continue)",
                          (long long)timeout_ns, (unsigned long long)queued);
    if (rc == KVO_ECLOSED) return kvo__error(KVO_ECLOSED, "kvo_connector_flush_to_file: the file tier is closing");
    return rc;
}
