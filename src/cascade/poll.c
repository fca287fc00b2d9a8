/*
 * poll and the calls that wait: flush, persist, wait_events.
 *
 * kvo_cascade_poll drives the cascade (dispatch.c: every tier's
 * completions, the deferred writes' retries) and hands the ring's
 * completions to the caller.  The event descriptor is an epoll set over the
 * tiers' eventfds and the ring's own, so one descriptor says "poll has
 * work" whichever tier it comes from.
 *
 * flush retries the deferred writes until they are queued or dropped and
 * waits for the tiers' queues.  persist (write-back before a restart) scans
 * the host store in batches under c->mu (a READY slot is only reused by a
 * prepare_store, which runs under c->mu too), queues what the file tier
 * lacks (refusals are deferred: their slots hold the bytes) and releases
 * the lock while it waits for the tier's queue to drain.
 */
#include <limits.h>
#include <errno.h>
#include <sys/epoll.h>

#include "cascade/cascade_internal.h"

int kvo_cascade_poll(kvo_cascade *c, kvo_cascade_completion *out, size_t cap, size_t *n) {
    if (n) *n = 0;
    if (!c || !n || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_cascade_poll: NULL argument");
    kvo__casc_lock(c);
    kvo__casc_drive(c);
    *n = out ? kvo__ring_take(&c->cq, out, cap) : 0;
    kvo__casc_unlock(c);
    return 0;
}

int kvo_cascade_event_fd(const kvo_cascade *c) { return c ? c->epfd : -1; }

int kvo_cascade_wait_events(kvo_cascade *c, int64_t timeout_ns) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_wait_events: c must not be NULL");
    struct epoll_event ev;
    int ms = kvo__timeout_ms(timeout_ns);
    int r;
    do r = epoll_wait(c->epfd, &ev, 1, ms);
    while (r < 0 && errno == EINTR);
    return r > 0 ? 0 : kvo__error(KVO_ETIMEDOUT, "kvo_cascade_wait_events: nothing to poll after %lld ns",
                                  (long long)timeout_ns);
}

/* Nanoseconds left until deadline (0 = none: -1). */
static int64_t kvo__left(uint64_t deadline) {
    if (!deadline) return -1;
    uint64_t now = kvo__now_ns();
    if (now >= deadline) return 0;
    return deadline - now > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)(deadline - now);
}

int kvo_cascade_flush(kvo_cascade *c, int64_t timeout_ns) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_flush: c must not be NULL");
    uint64_t deadline = timeout_ns < 0 ? 0 : kvo__now_ns() + (uint64_t)timeout_ns + 1;
    for (;;) {
        kvo__casc_lock(c);
        kvo__casc_drive(c); /* retries the deferred writes once */
        size_t deferred = c->n_defer;
        kvo__casc_unlock(c);
        int64_t left = kvo__left(deadline);
        /* with writes still deferred, drain the queues briefly and retry */
        int64_t step = deferred && (left < 0 || left > KVO_MS(50)) ? KVO_MS(50) : left;
        int rc = 0;
        for (uint32_t f = 0; !rc && f < c->nft; f++) rc = kvo_file_tier_flush(c->ftiers[f], step);
        if (!rc && c->remote) rc = kvo_remote_tier_flush(c->remote, step);
        if (!deferred && !rc) return 0;
        if (left == 0)
            return kvo__error(KVO_ETIMEDOUT, "kvo_cascade_flush: %zu writes still deferred or queued after %lld ns",
                              deferred, (long long)timeout_ns);
    }
}

int kvo_cascade_persist(kvo_cascade *c, int64_t timeout_ns, uint64_t *n_queued) {
    if (n_queued) *n_queued = 0;
    if (!c) return kvo__error(KVO_EINVAL, "kvo_cascade_persist: c must not be NULL");
    if (!c->file || !c->store)
        return kvo__error(KVO_ESTATE, "kvo_cascade_persist: needs a host tier and a file tier");
    enum { B = 64 };
    uint64_t deadline = timeout_ns < 0 ? 0 : kvo__now_ns() + (uint64_t)timeout_ns + 1;
    kvo_store_entry ents[B];
    kvo_chunk_key keys[B];
    kvo_slot slots[B];
    const void *srcs[B];
    uint8_t st[B];
    int res[B];
    uint64_t cursor = 0, queued = 0;
    uint32_t part = 0; /* the tenant part being scanned */
    int rc = 0;
    do {
        size_t n = 0, m = 0;
        if (!kvo__casc_own_store(c, part)) { /* a tenant without a host part: its chunks are in the shared one */
            part++;
            continue;
        }
        if (queued) { /* pace: one batch in the tier's queue at a time */
            rc = kvo_file_tier_flush(c->files[part], kvo__left(deadline));
            if (rc) break;
        }
        kvo__casc_lock(c);
        rc = kvo_store_scan(c->parts[part], &cursor, ents, B, &n);
        if (!rc && n) {
            for (size_t i = 0; i < n; i++)
                if (ents[i].state == KVO_READY && kvo__casc_uses(c, KVO_TIER_FILE, ents[i].key.group)) {
                    keys[m] = ents[i].key;
                    keys[m].tenant = part; /* deferred retries find its entry by it */
                    slots[m++] = ents[i].slot;
                }
            if (m) kvo__casc_file_lookup(c, keys, m, st);
            size_t w = 0;
            for (size_t i = 0; i < m; i++) {
                if (st[i] != KVO_MISS) { /* held or being written */
                    c->st.file.writes_skipped++;
                    continue;
                }
                if (c->sums && c->sums[slots[i].offset / KVO_SLOT_ALIGN] != kvo__casc_sum(c, &keys[i], slots[i])) {
                    c->st.checksum_failures++;
                    continue;
                }
                keys[w] = keys[i];
                slots[w] = slots[i];
                srcs[w++] = kvo__casc_host_ptr(c, slots[i]);
            }
            /* refused for back-pressure: deferred (the slots hold the bytes),
             * retried by the flushes below */
            if (w) kvo__casc_write(c, KVO__CASC_TIER_BIT(KVO_TIER_FILE), keys, srcs, slots, false, w, 0, NULL, res);
            for (size_t i = 0; i < w; i++) {
                queued += res[i] == 0 || res[i] == KVO_EAGAIN;
                if (res[i] == KVO_ECLOSED) rc = KVO_ECLOSED;
            }
        }
        kvo__casc_unlock(c);
        if (!cursor) part++;
    } while (!rc && (cursor || part < c->nparts));
    if (!rc) rc = kvo_cascade_flush(c, kvo__left(deadline));
    if (n_queued) *n_queued = queued;
    if (rc == KVO_ETIMEDOUT)
        return kvo__error(KVO_ETIMEDOUT, "kvo_cascade_persist: file writes not finished after %lld ns (%llu chunks "
                                         "queued; they continue)",
                          (long long)timeout_ns, (unsigned long long)queued);
    if (rc == KVO_ECLOSED) return kvo__error(KVO_ECLOSED, "kvo_cascade_persist: the file tier is closing");
    return rc;
}
