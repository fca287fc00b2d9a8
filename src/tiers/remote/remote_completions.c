/*
 * The remote tier's completion side: poll, wait, the event fd, flush and
 * statistics.  Completions are posted by remote_tier.c's finish() into a
 * ring under t->mu (room reserved when each reporting op was queued), with
 * the eventfd written under the same lock, so a waiter that sees one also
 * finds the fd readable.
 */
#include <errno.h>
#include <time.h>
#include <unistd.h>

#include "tiers/remote/remote_tier_internal.h"

/* ------------------------------------------------------- completions -- */

int kvo_remote_tier_poll(kvo_remote_tier *t, kvo_remote_completion *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_remote_tier_poll: NULL argument");
    pthread_mutex_lock(&t->mu);
    size_t n = 0;
    while (n < cap && t->cq_len) {
        out[n++] = t->cq[t->cq_head];
        t->cq_head = (t->cq_head + 1) % t->cq_cap;
        t->cq_len--;
    }
    if (t->cq_len == 0) {
        kvo__efd_drain(t->efd);
    }
    pthread_mutex_unlock(&t->mu);
    *n_out = n;
    return 0;
}

int kvo_remote_tier_wait(kvo_remote_tier *t, int64_t timeout_ns) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_remote_tier_wait: NULL tier");
    int timeout_ms = kvo__timeout_ms(timeout_ns);
    struct timespec ts;
    if (timeout_ms >= 0) kvo__deadline_ts(timeout_ms, &ts);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    while (!t->cq_len) {
        if (timeout_ms < 0 && !t->inflight_reports) {
            rc = KVO_ENOTFOUND;
            break;
        }
        if (timeout_ms < 0) pthread_cond_wait(&t->done_cv, &t->mu);
        else if (pthread_cond_timedwait(&t->done_cv, &t->mu, &ts) == ETIMEDOUT) {
            rc = t->cq_len ? 0 : KVO_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kvo_remote_tier_event_fd(const kvo_remote_tier *t) { return t ? t->efd : -1; }

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
    pthread_mutex_unlock(&t->mu);
    return rc;
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
