/*
 * The remote tier's completion side: poll, wait, the event fd, flush and
 * statistics.  Completions are posted by remote_tier.c's finish() into the
 * core's completion ring (core/ring.h) under t->mu, room promised when each
 * reporting op was queued; the ring's eventfd changes under the same lock,
 * so a waiter that sees a completion also finds the fd readable.  Wait and
 * flush say why they return an error (kvo_last_error).
 */
#include <errno.h>
#include <time.h>

#include "tiers/remote/remote_tier_internal.h"

/* ------------------------------------------------------- completions -- */

int kvo_remote_tier_poll(kvo_remote_tier *t, kvo_remote_completion *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_remote_tier_poll: NULL argument");
    pthread_mutex_lock(&t->mu);
    *n_out = kvo__ring_take(&t->cq, out, cap);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int kvo_remote_tier_wait(kvo_remote_tier *t, int64_t timeout_ns) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_remote_tier_wait: NULL tier");
    pthread_mutex_lock(&t->mu);
    int rc = kvo__ring_wait(&t->cq, &t->mu, &t->done_cv, timeout_ns, false);
    uint64_t reads = t->pending_reads, writes = t->pending_writes;
    pthread_mutex_unlock(&t->mu);
    if (rc == KVO_ENOTFOUND)
        return kvo__error(rc, "remote tier: nothing in flight that reports a completion (waited without a timeout)");
    if (rc == KVO_ETIMEDOUT)
        return kvo__error(rc, "remote tier: no completion within %d ms (%llu reads and %llu puts in flight)",
                          kvo__timeout_ms(timeout_ns), (unsigned long long)reads, (unsigned long long)writes);
    return 0;
}

int kvo_remote_tier_event_fd(const kvo_remote_tier *t) { return t ? t->cq.efd : -1; }

int kvo_remote_tier_flush(kvo_remote_tier *t, int64_t timeout_ns) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_remote_tier_flush: NULL tier");
    int timeout_ms = kvo__timeout_ms(timeout_ns);
    struct timespec ts;
    if (timeout_ms >= 0) kvo__deadline_ts(timeout_ms, &ts);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    while (t->pending_writes) {
        if (timeout_ms < 0) pthread_cond_wait(&t->done_cv, &t->mu);
        else if (pthread_cond_timedwait(&t->done_cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->pending_writes ? KVO_ETIMEDOUT : 0;
            break;
        }
    }
    uint64_t left = t->pending_writes;
    pthread_mutex_unlock(&t->mu);
    if (rc)
        return kvo__error(rc, "remote tier flush: %llu puts still queued or running after %d ms (a slow or "
                          "unreachable cluster: each batch ends within (max_redirects + 1) x io_timeout_ms)",
                          (unsigned long long)left, timeout_ms);
    return 0;
}

static int kvo__remote_tier_get_stats_fill(kvo_remote_tier *t, kvo_remote_tier_stats *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_remote_tier_get_stats: NULL argument");
    kvo_store_stats sst = KVO_STORE_STATS_INIT;
    bool have_sst = kvo_store_get_stats(t->stage_index, &sst) == 0;
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->pending_writes = t->pending_writes;
    out->pending_reads = t->pending_reads;
    pthread_mutex_unlock(&t->mu);
    out->staging_bytes = have_sst ? sst.bytes_used : 0;
    const kvo__rc_counters *c = kvo__rc_stats(t->rc);
    out->moved = atomic_load(&c->moved);
    out->asked = atomic_load(&c->asked);
    out->slot_refreshes = atomic_load(&c->refreshes);
    out->node_failures = atomic_load(&c->node_failures);
    out->batches = atomic_load(&c->batches);
    kvo__rc_nodes(t->rc, &out->nodes, &out->nodes_down);
    return 0;
}

int kvo_remote_tier_get_stats(kvo_remote_tier *t, kvo_remote_tier_stats *out) {
    kvo_remote_tier_stats full = KVO_REMOTE_TIER_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_remote_tier_get_stats", kvo_remote_tier_stats, staging_bytes, "KVO_REMOTE_TIER_STATS_INIT",
                   out, full,
                   kvo__remote_tier_get_stats_fill(t, &full));
}
