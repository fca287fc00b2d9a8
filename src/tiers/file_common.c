/*
 * Small helpers of every layer of the file tier: the key's path and group
 * (from the namespace directory and the plan, both fixed at create) and the
 * rate-limited log (at most one line per log_interval_s per kind, with a
 * count of the lines it held back; the rate state is under mu, taken only
 * briefly and never while the line is written).
 *
 * A leaf: it calls file_format.c (kvo_file_chunk_path) only, so that
 * file_ops.c, file_quota.c and file_scan.c need not call up into
 * file_tier.c.
 */
#include <stdarg.h>
#include <stdio.h>

#include "tiers/file_internal.h"

void kvo__file_log(kvo_file_tier *t, int kind, const char *fmt, ...) {
    uint64_t now = kvo__now_ns(), interval = (uint64_t)t->p.log_interval_s * 1000000000u, suppressed;
    pthread_mutex_lock(&t->mu);
    if (t->last_log_ns[kind] && now - t->last_log_ns[kind] < interval) {
        t->suppressed[kind]++;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    t->last_log_ns[kind] = now;
    suppressed = t->suppressed[kind];
    t->suppressed[kind] = 0;
    pthread_mutex_unlock(&t->mu);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed)
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s (%llu similar events not logged)", msg,
                 (unsigned long long)suppressed);
    else
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s", msg);
}

void kvo__file_key_path(const kvo_file_tier *t, const kvo_chunk_key *k, char *out) {
    kvo_file_chunk_path(t->ns_dir, k, out, KVO__FILE_PATH_MAX);
}

const kvo_group_plan *kvo__file_group_of(const kvo_file_tier *t, const kvo_chunk_key *k) {
    const kvo_group_plan *g = kvo_plan_group(t->plan, k->group);
    return g && g->offloaded ? g : NULL;
}
