/*
 * The library's log: one process-wide sink, rare lines only.
 *
 * Layout.  The sink (function, context, threshold) is three globals guarded by
 * a mutex that is held only to read or replace them -- never while the sink
 * runs, so a sink may take its own locks (or even call kvo_set_log) without a
 * deadlock.  The threshold is also kept in an atomic so that a line below it
 * costs one relaxed load and no formatting.
 *
 * Rate limits, two layers.  A caller that logs a repeating kind of event
 * (a full disk, an I/O error per chunk) owns a kvo__log_limit for that kind
 * and calls kvo__log_limited(): one line per interval, the next one saying
 * how many were suppressed.  The default stderr sink adds a second, global
 * bound (KVO__STDERR_BURST lines per KVO__STDERR_WINDOW_S seconds) so that
 * a bug in a caller's limit cannot flood a service's stderr; a sink the
 * application installs gets every line and applies its own policy.
 *
 * Messages are formatted into a fixed stack buffer (KVO__LOG_MAX bytes,
 * longer ones truncated): logging allocates nothing, so it works while
 * reporting an out-of-memory failure.
 */
#include <pthread.h>
#include <stdio.h>

#include "core/internal.h"

#define KVO__STDERR_BURST 20
#define KVO__STDERR_WINDOW_S 10

static pthread_mutex_t kvo__log_mu = PTHREAD_MUTEX_INITIALIZER;
static kvo_log_fn kvo__log_fn;       /* NULL: the default stderr sink */
static void *kvo__log_ctx;
static int kvo__log_level = KVO_LOG_WARN; /* atomic */

/* The default sink's global bound (under kvo__log_mu). */
static uint64_t kvo__stderr_window_ns, kvo__stderr_lines, kvo__stderr_dropped;

const char *kvo_log_level_name(kvo_log_level level) {
    switch (level) {
    case KVO_LOG_DEBUG: return "debug";
    case KVO_LOG_INFO: return "info";
    case KVO_LOG_WARN: return "warn";
    case KVO_LOG_ERROR: return "error";
    case KVO_LOG_OFF: return "off";
    }
    return "?";
}

int kvo_set_log(kvo_log_fn fn, void *ctx, kvo_log_level level) {
    if ((int)level < KVO_LOG_DEBUG || (int)level > KVO_LOG_OFF)
        return kvo__error(KVO_EINVAL, "kvo_set_log: level %d is not a kvo_log_level (KVO_LOG_DEBUG %d .. "
                          "KVO_LOG_OFF %d)", (int)level, KVO_LOG_DEBUG, KVO_LOG_OFF);
    pthread_mutex_lock(&kvo__log_mu);
    kvo__log_fn = fn;
    kvo__log_ctx = ctx;
    kvo__stderr_window_ns = kvo__stderr_lines = kvo__stderr_dropped = 0;
    __atomic_store_n(&kvo__log_level, (int)level, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&kvo__log_mu);
    return 0;
}

bool kvo__log_enabled(kvo_log_level level) {
    return (int)level >= __atomic_load_n(&kvo__log_level, __ATOMIC_RELAXED) && level < KVO_LOG_OFF;
}

/* Deliver one formatted line to the sink (not under the lock). */
static void kvo__log_emit(kvo_log_level level, const char *msg) {
    pthread_mutex_lock(&kvo__log_mu);
    kvo_log_fn fn = kvo__log_fn;
    void *ctx = kvo__log_ctx;
    uint64_t dropped = 0;
    bool out = true;
    if (!fn) {
        uint64_t now = kvo__now_ns(), window = (uint64_t)KVO__STDERR_WINDOW_S * 1000000000u;
        if (!kvo__stderr_window_ns || now - kvo__stderr_window_ns >= window) {
            dropped = kvo__stderr_dropped;
            kvo__stderr_window_ns = now;
            kvo__stderr_lines = kvo__stderr_dropped = 0;
        }
        if (kvo__stderr_lines >= KVO__STDERR_BURST) {
            kvo__stderr_dropped++;
            out = false;
        } else {
            kvo__stderr_lines++;
        }
    }
    pthread_mutex_unlock(&kvo__log_mu);
    if (!out) return;
    if (fn) {
        fn(level, msg, ctx);
        return;
    }
    /* The default sink: one whole line per fputs (stdio locks the stream, so
     * lines from several threads do not interleave).  The only place in src/
     * that writes to stderr. */
    char line[KVO__LOG_MAX + 96];
    if (dropped) {
        snprintf(line, sizeof line, "kvoffload: warn: %llu log lines dropped (more than %d in %d s)\n",
                 (unsigned long long)dropped, KVO__STDERR_BURST, KVO__STDERR_WINDOW_S);
        fputs(line, stderr);
    }
    snprintf(line, sizeof line, "kvoffload: %s: %s\n", kvo_log_level_name(level), msg);
    fputs(line, stderr);
}

void kvo__vlog(kvo_log_level level, const char *fmt, va_list ap) {
    if (!kvo__log_enabled(level)) return;
    char msg[KVO__LOG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    kvo__log_emit(level, msg);
}

void kvo__log(kvo_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvo__vlog(level, fmt, ap);
    va_end(ap);
}

void kvo__log_limited(kvo__log_limit *lim, uint32_t interval_s, kvo_log_level level, const char *fmt, ...) {
    if (!kvo__log_enabled(level)) return;
    uint64_t now = kvo__now_ns(), interval = (uint64_t)interval_s * 1000000000u;
    uint64_t last = __atomic_load_n(&lim->last_ns, __ATOMIC_RELAXED);
    /* One thread wins the interval (CAS); the others count themselves out. */
    if ((last && now - last < interval) ||
        !__atomic_compare_exchange_n(&lim->last_ns, &last, now ? now : 1, false, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED)) {
        __atomic_add_fetch(&lim->suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t suppressed = __atomic_exchange_n(&lim->suppressed, 0, __ATOMIC_RELAXED);
    char msg[KVO__LOG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed && n >= 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, " (%llu similar events not logged)",
                 (unsigned long long)suppressed);
    kvo__log_emit(level, msg);
}
