/*
 * kvoffload metrics: a connector's counters as Prometheus exposition text or
 * as JSON, for an engine's /metrics endpoint, a log line or a file.
 *
 * One call merges everything a connector knows: its own request, lookup,
 * load and store counters, the host store's (hits, evictions, bytes), the
 * transfer engine's (jobs, bytes, queue depth) and, with a file tier, the
 * tier's (hits, bytes, drops, write queue), plus a latency histogram of
 * loads (kvo_connector_load to the poll that completes it, fixed buckets).
 * Every series is named kvoffload_*; docs/metrics.md lists them.
 *
 * The output sink is a write callback (the shape of jansson's
 * json_dump_callback): the library calls fn(data, len, ctx) with pieces of
 * the text in order, and never holds a lock of its own while fn runs.  A
 * caller who wants a buffer uses kvo_connector_stats_format, which returns
 * the size it needs when the buffer is too small.  A FILE * is two lines:
 *     static int to_file(const char *d, size_t n, void *f)
 *     { return fwrite(d, 1, n, f) == n ? 0 : -1; }
 */
#ifndef KVOFFLOAD_KVO_METRICS_H
#define KVOFFLOAD_KVO_METRICS_H

#include "kvo_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvo_connector kvo_connector;

/** Output formats (exactly one per call). */
#define KVO_STATS_PROMETHEUS 0x1u /* text exposition format 0.0.4: # HELP,
                                     # TYPE, one sample per line */
#define KVO_STATS_JSON 0x2u       /* one JSON object: {"name": value,
                                     "labelled": {"label value": value},
                                     "histogram": {"buckets": [{"le": "0.001",
                                     "count":..}], "sum":.., "count":..}} */

/** A write sink: consume len bytes at data (not NUL-terminated, valid only
 *  during the call).  Return 0 to go on, nonzero to stop the write (the
 *  library then returns KVO_EIO). */
typedef int (*kvo_stats_write_fn)(const char *data, size_t len, void *ctx);

/** Write a snapshot of the connector's metrics in `format` through fn.
 *  The counters are read first (under the connector's and each part's own
 *  locks, briefly; the snapshot is consistent per part, not across parts),
 *  then formatted with no lock held, so fn may take its time.  The
 *  Prometheus path allocates nothing; the JSON path builds a small jansson
 *  tree.  Thread rules: any thread, concurrently with every other
 *  connector call.
 *  Errors: KVO_EINVAL (NULL c or fn, format not exactly one of
 *  KVO_STATS_PROMETHEUS / KVO_STATS_JSON), KVO_ENOMEM (JSON), KVO_EIO (fn
 *  returned nonzero; what it was given so far stays written). */
KVO_API int kvo_connector_stats_write(kvo_connector *c, unsigned format, kvo_stats_write_fn fn, void *ctx);

/** kvo_connector_stats_write into buf (cap bytes, NUL-terminated).  *len
 *  (required) = the text's length without the NUL, also when it did not fit.
 *  Errors: as kvo_connector_stats_write; KVO_ERANGE when cap < *len + 1
 *  (buf then holds a truncated, NUL-terminated prefix when cap > 0; call
 *  again with cap = *len + 1 -- a little more, as counters may grow). */
KVO_API int kvo_connector_stats_format(kvo_connector *c, unsigned format, char *buf, size_t cap, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
