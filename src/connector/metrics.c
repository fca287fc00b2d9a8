/*
 * Connector statistics: the kvo_connector_stats and kvo_request_stats
 * structs (kvo_connector_get_stats, kvo_connector_request_stats), and the
 * metrics, one snapshot of every counter the connector can reach, written
 * as Prometheus exposition text or JSON (kvo_metrics.h).
 *
 * Layout.  A write goes in three steps.  (1) Snapshot: the connector's own
 * statistics and its load histogram under its lock, the host store's, the
 * transfer engine's and the file tier's through their get_stats (each
 * consistent on its own).  (2) Series: the snapshot becomes a flat, fixed
 * array of samples {family, TYPE, HELP, one optional label, value}, families
 * in a fixed order and the samples of one family next to each other -- the
 * one place that names the series (docs/metrics.md lists them).  (3)
 * Output: the Prometheus writer formats one line at a time into a stack
 * buffer and hands it to the caller's sink; the JSON writer builds a jansson
 * object from the same array and streams it with json_dump_callback.  No
 * lock is held in step 3, so the sink may block.
 *
 * The load histogram.  kvo__conn_hist_add runs where a load's result is
 * polled (poll.c, under the connector lock): a bounded scan of 16 fixed
 * bucket limits, three additions, no allocation.  Buckets are kept per
 * bucket and summed into Prometheus' cumulative `le` form only when written.
 *
 * Why a callback sink: it serves an HTTP handler, a FILE * and a buffer
 * alike without the library choosing the memory; kvo_connector_stats_format
 * is the buffer form (snprintf-like: the needed size when it did not fit).
 */
#include <assert.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "connector/connector_internal.h"
#include "kvoffload/kvo_metrics.h"

/* Bucket upper limits: ns for counting, the `le` text for output. */
static const struct {
    uint64_t ns;
    const char *le;
} kvo__buckets[KVO__LOAD_BUCKETS] = {
    {50000, "0.00005"},        {100000, "0.0001"},     {250000, "0.00025"},    {500000, "0.0005"},
    {1000000, "0.001"},        {2500000, "0.0025"},    {5000000, "0.005"},     {10000000, "0.01"},
    {25000000, "0.025"},       {50000000, "0.05"},     {100000000, "0.1"},     {250000000, "0.25"},
    {500000000, "0.5"},        {1000000000, "1"},      {2500000000u, "2.5"},   {10000000000u, "10"},
};

void kvo__conn_hist_add(kvo__hist *h, uint64_t ns) {
    size_t i = 0;
    while (i < KVO__LOAD_BUCKETS && ns > kvo__buckets[i].ns) i++;
    h->n[i]++;
    h->sum_ns += ns;
    h->count++;
}

/* ------------------------------------------- the statistics structs -- */

static int kvo__connector_request_stats_fill(kvo_connector *c, uint64_t id, kvo_request_stats *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_request_stats: NULL argument");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
    else {
        *out = r->st;
        out->tokens = r->n_tokens;
        uint64_t have = r->st.local_tokens + r->st.tokens_loaded;
        out->tokens_computed = r->prompt_tokens > have ? r->prompt_tokens - have : 0;
    }
    kvo__conn_unlock(c);
    return rc;
}

int kvo_connector_request_stats(kvo_connector *c, uint64_t id, kvo_request_stats *out) {
    kvo_request_stats full = KVO_REQUEST_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_connector_request_stats", kvo_request_stats, load_failures, "KVO_REQUEST_STATS_INIT", out, full,
                   kvo__connector_request_stats_fill(c, id, &full));
}

static int kvo__connector_get_stats_fill(kvo_connector *c, kvo_connector_stats *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_get_stats: NULL argument");
    kvo__conn_lock(c);
    *out = c->st;
    kvo__conn_unlock(c);
    /* the tiers' writes, presence queries and checksums: the cascade's */
    kvo_cascade_stats cs = KVO_CASCADE_STATS_INIT;
    int rc = kvo_cascade_get_stats(c->casc, &cs);
    if (rc) return rc;
    out->file_writes = cs.file.writes;
    out->file_writebacks = cs.file.writebacks;
    out->file_writes_skipped = cs.file.writes_skipped;
    out->file_writes_dropped = cs.file.writes_dropped;
    out->file_lent_now = cs.lent_now;
    out->remote_writes = cs.remote.writes;
    out->remote_write_bytes = cs.remote.write_bytes;
    out->remote_writes_dropped = cs.remote.writes_dropped;
    out->remote_exists = cs.remote_exists;
    out->remote_exists_refused = cs.remote_exists_refused;
    out->remote_budget_expired = cs.remote_budget_expired;
    out->checksum_failures = cs.checksum_failures;
    out->host.struct_size = sizeof out->host;
    return kvo_cascade_host_stats(c->casc, &out->host);
}

int kvo_connector_get_stats(kvo_connector *c, kvo_connector_stats *out) {
    kvo_connector_stats full = KVO_CONNECTOR_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_connector_get_stats", kvo_connector_stats, host, "KVO_CONNECTOR_STATS_INIT", out, full,
                   kvo__connector_get_stats_fill(c, &full));
}

/* ------------------------------------------------------------ snapshot -- */

typedef struct kvo__snap {
    kvo_connector_stats cs;
    kvo_transfer_stats ts;
    kvo_file_tier_stats fs;
    bool file, remote;
    kvo_tenant_stats tenants[KVO_CONNECTOR_TENANTS + 1];
    size_t n_tenants;
    kvo__hist hist;
    uint64_t completions; /* queued for the engine, not yet polled */
} kvo__snap;

static int kvo__snapshot(kvo_connector *c, kvo__snap *s) {
    memset(s, 0, sizeof *s);
    s->cs.struct_size = sizeof s->cs;
    s->ts.struct_size = sizeof s->ts;
    s->fs.struct_size = sizeof s->fs;
    kvo__conn_lock(c);
    s->hist = c->load_ns;
    s->completions = c->cq.len;
    kvo__conn_unlock(c);
    int rc = kvo_connector_get_stats(c, &s->cs);
    if (!rc) rc = kvo_connector_tenant_stats(c, s->tenants, KVO_CONNECTOR_TENANTS + 1, &s->n_tenants);
    if (!rc) rc = kvo_transfer_get_stats(c->xfer, &s->ts);
    if (!rc && c->file) {
        rc = kvo_file_tier_get_stats(c->file, &s->fs);
        s->file = true;
    }
    s->remote = c->remote != NULL;
    return rc;
}

/* -------------------------------------------------------------- series -- */

typedef struct kvo__sample {
    const char *name, *type, *help;
    const char *lkey, *lval; /* NULL: no label */
    uint64_t v;
} kvo__sample;

/* the fixed series, and 6 per-tenant families of up to 33 rows each */
#define KVO__MAX_SAMPLES (112 + 6 * (KVO_CONNECTOR_TENANTS + 1))

typedef struct kvo__series {
    kvo__sample s[KVO__MAX_SAMPLES];
    size_t n;
} kvo__series;

static void kvo__add(kvo__series *o, const char *name, const char *type, const char *help, const char *lkey,
                     const char *lval, uint64_t v) {
    assert(o->n < KVO__MAX_SAMPLES);
    if (o->n < KVO__MAX_SAMPLES) o->s[o->n++] = (kvo__sample){name, type, help, lkey, lval, v};
}
#define C_(name, help, v) kvo__add(o, "kvoffload_" name, "counter", help, NULL, NULL, v)
#define G_(name, help, v) kvo__add(o, "kvoffload_" name, "gauge", help, NULL, NULL, v)
#define CL_(name, help, k, l, v) kvo__add(o, "kvoffload_" name, "counter", help, k, l, v)
#define GL_(name, help, k, l, v) kvo__add(o, "kvoffload_" name, "gauge", help, k, l, v)

/* Per tier: the host store's figures, then the file tier's when attached. */
static void kvo__tier_series(kvo__series *o, const kvo__snap *s) {
    const kvo_store_stats *h = &s->cs.host;
    const kvo_file_tier_stats *f = &s->fs;
    struct {
        const char *name, *type, *help;
        uint64_t host, file;
    } t[] = {
        {"kvoffload_tier_hits_total", "counter", "Chunk lookups that found the chunk, by tier.", h->hits, f->hits},
        {"kvoffload_tier_misses_total", "counter", "Chunk lookups that did not, by tier.", h->misses, f->misses},
        {"kvoffload_tier_read_bytes_total", "counter",
         "Bytes read out of the tier (host: copied to the engine; file: read and verified).", s->ts.bytes_loaded,
         f->read_bytes},
        {"kvoffload_tier_written_bytes_total", "counter",
         "Bytes written into the tier (host: copied from the engine; file: files written).", s->ts.bytes_stored,
         f->write_bytes},
        {"kvoffload_tier_evictions_total", "counter", "Chunks evicted to make room, by tier.", h->evictions,
         f->evictions},
        {"kvoffload_tier_entries", "gauge", "Chunks held now, by tier.", h->entries, f->files},
        {"kvoffload_tier_used_bytes", "gauge", "Slot bytes held now, by tier.", h->bytes_used, f->bytes_used},
        {"kvoffload_tier_capacity_bytes", "gauge", "Capacity (host) or quota (file), by tier.", h->capacity_bytes,
         f->quota_bytes},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kvo__add(o, t[i].name, t[i].type, t[i].help, "tier", "host", t[i].host);
        if (s->file) kvo__add(o, t[i].name, t[i].type, t[i].help, "tier", "file", t[i].file);
    }
}

static void kvo__file_series(kvo__series *o, const kvo__snap *s) {
    const kvo_connector_stats *c = &s->cs;
    const kvo_file_tier_stats *f = &s->fs;
    C_("file_writes_queued_total", "Chunks the connector handed to the file tier (write-back ones included).",
       c->file_writes);
    C_("file_writebacks_total", "Of those, chunks handed over when the host tier evicted them.", c->file_writebacks);
    C_("file_writes_skipped_total", "Chunks the file tier held or was writing already.", c->file_writes_skipped);
    C_("file_reads_total", "File-tier reads started for hits.", c->file_reads);
    C_("file_read_failures_total", "File-tier reads for hits that failed.", c->file_read_failures);
    const char *h = "File-tier writes dropped, by reason.";
    CL_("file_dropped_writes_total", h, "reason", "refused", c->file_writes_dropped);
    CL_("file_dropped_writes_total", h, "reason", "backpressure", f->dropped_backpressure);
    CL_("file_dropped_writes_total", h, "reason", "quota", f->dropped_quota);
    CL_("file_dropped_writes_total", h, "reason", "nospace", f->dropped_nospace);
    CL_("file_dropped_writes_total", h, "reason", "io", f->dropped_io);
    C_("file_read_errors_total", "File reads that failed with an I/O error.", f->read_errors);
    C_("file_corrupt_removed_total", "Files that failed verification and were removed.", f->corrupt_removed);
    G_("file_staging_bytes", "Staging memory holding queued file writes now.", f->staging_bytes);
}

/* The connector's remote-tier counters (kvo_connector_stats.remote_*). */
static void kvo__remote_series(kvo__series *o, const kvo__snap *s) {
    const kvo_connector_stats *c = &s->cs;
    C_("remote_reads_total", "Remote-tier chunks read into host slots for hits.", c->remote_reads);
    C_("remote_read_bytes_total", "Bytes read from the remote tier.", c->remote_read_bytes);
    C_("remote_read_failures_total", "Remote reads that failed (absent, corrupt, node down).",
       c->remote_read_failures);
    C_("remote_writes_total", "Chunks put to the remote tier.", c->remote_writes);
    C_("remote_written_bytes_total", "Bytes put to the remote tier.", c->remote_write_bytes);
    C_("remote_dropped_writes_total", "Remote puts refused (back-pressure, tier down).", c->remote_writes_dropped);
    C_("remote_exists_queries_total", "Remote presence queries queued.", c->remote_exists);
    C_("remote_exists_refused_total", "Remote presence queries not queued (too many in flight).",
       c->remote_exists_refused);
    C_("remote_lookups_pending_total", "Lookups answered PENDING for remote presence queries.",
       c->remote_lookups_pending);
    C_("remote_budget_expired_total", "Lookups that answered without the remote tier (budget spent).",
       c->remote_budget_expired);
}

/* Per tenant (kvo_connector_tenant_stats): one family per counter, a
 * sample per row, labelled by the row's tenant label. */
static void kvo__tenant_series(kvo__series *o, const kvo__snap *s) {
    static const struct {
        const char *name, *help;
        size_t off;
    } f[] = {
        {"kvoffload_tenant_requests_total", "Requests added, by tenant (cache_salt label).",
         offsetof(kvo_tenant_stats, requests)},
        {"kvoffload_tenant_lookup_tokens_total", "Prompt tokens looked up, by tenant.",
         offsetof(kvo_tenant_stats, lookup_tokens)},
        {"kvoffload_tenant_hit_tokens_total", "Tokens the lookups offered to load, by tenant.",
         offsetof(kvo_tenant_stats, hit_tokens)},
        {"kvoffload_tenant_loaded_tokens_total", "Tokens loaded, by tenant.", offsetof(kvo_tenant_stats, loaded_tokens)},
        {"kvoffload_tenant_stored_chunks_total", "Chunks stored, by tenant.", offsetof(kvo_tenant_stats, stored_chunks)},
        {"kvoffload_tenant_load_failures_total", "Loads that completed with an error, by tenant.",
         offsetof(kvo_tenant_stats, load_failures)},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        for (size_t t = 0; t < s->n_tenants; t++) {
            uint64_t v;
            memcpy(&v, (const char *)&s->tenants[t] + f[i].off, sizeof v);
            kvo__add(o, f[i].name, "counter", f[i].help, "tenant", s->tenants[t].label, v);
        }
}

static void kvo__series_build(kvo__series *o, const kvo__snap *s) {
    const kvo_connector_stats *c = &s->cs;
    const kvo_transfer_stats *t = &s->ts;
    o->n = 0;
    C_("requests_added_total", "Requests registered.", c->requests_added);
    C_("requests_finished_total", "Requests finished.", c->requests_finished);
    G_("requests_live", "Requests registered and not yet retired.", c->requests_live);
    C_("lookups_total", "Lookups.", c->lookups);
    C_("lookup_hits_total", "Lookups that found tokens to load.", c->lookup_hits);
    C_("lookup_pending_total", "Lookups answered PENDING.", c->lookup_pending);
    C_("lookups_wait_lent_total", "Lookups answered PENDING: host slots lent to file writes (file_zero_copy).",
       c->lookups_wait_lent);
    C_("lookup_tokens_total", "Prompt tokens looked up.", c->lookup_tokens);
    C_("hit_tokens_total", "Tokens the lookups offered to load.", c->hit_tokens);
    C_("loads_total", "Loads issued.", c->loads);
    C_("load_failures_total", "Loads that completed with an error (the engine recomputes).", c->load_failures);
    C_("checksum_failures_total", "Chunks that failed checksum verification on load.", c->checksum_failures);
    const char *lh = "Tokens loaded, by the tier their chunks came from (file: at least one).";
    CL_("loaded_tokens_total", lh, "tier", "host", c->tokens_loaded_host);
    CL_("loaded_tokens_total", lh, "tier", "file", c->tokens_loaded_file);
    CL_("loaded_tokens_total", lh, "tier", "remote", c->tokens_loaded_remote);
    C_("loaded_chunks_total", "Chunks loaded into engine blocks.", c->chunks_loaded);
    C_("loaded_bytes_total", "Bytes loaded into engine blocks.", c->bytes_loaded);
    C_("stored_chunks_total", "Chunks stored from engine blocks.", c->chunks_stored);
    C_("stored_bytes_total", "Bytes stored from engine blocks.", c->bytes_stored);
    const char *dh = "Chunk stores dropped, by reason.";
    CL_("stores_dropped_total", dh, "reason", "nospace", c->stores_skipped_nospace);
    CL_("stores_dropped_total", dh, "reason", "queue", c->stores_skipped_queue);
    CL_("stores_dropped_total", dh, "reason", "failed", c->stores_failed);
    kvo__tier_series(o, s);
    G_("host_pinned_chunks", "Host chunks pinned by hits and loads now.", c->host.pinned);
    G_("host_pending_chunks", "Host chunks being written now.", c->host.pending);
    C_("host_rejected_stores_total", "Host stores refused: no room without evicting pinned or pending chunks.",
       c->host.rejected_stores);
    if (s->file) kvo__file_series(o, s);
    if (s->remote) kvo__remote_series(o, s);
    const char *jh = "Transfer jobs finished, by result.";
    C_("transfer_jobs_submitted_total", "Transfer jobs submitted.", t->jobs_submitted);
    CL_("transfer_jobs_total", jh, "result", "ok", t->jobs_ok);
    CL_("transfer_jobs_total", jh, "result", "failed", t->jobs_failed);
    CL_("transfer_jobs_total", jh, "result", "canceled", t->jobs_canceled);
    C_("transfer_copies_total", "Copy calls after merging adjacent pieces.", t->copies);
    C_("transfer_dependency_waits_total", "Transfer jobs that waited for an earlier one.", t->dep_waits);
    const char *qh = "Items waiting now, by queue.";
    GL_("queue_depth", qh, "queue", "transfer_jobs", t->jobs_queued);
    GL_("queue_depth", qh, "queue", "transfer_results", t->results_pending);
    GL_("queue_depth", qh, "queue", "completions", s->completions);
    if (s->file) GL_("queue_depth", qh, "queue", "file_writes", s->fs.pending_writes);
    kvo__tenant_series(o, s);
}

#define KVO__HIST_NAME "kvoffload_load_duration_seconds"
#define KVO__HIST_HELP "Loads from kvo_connector_load to the poll that completed them (file reads included)."

/* ---------------------------------------------------------- Prometheus -- */

typedef struct kvo__out {
    kvo_stats_write_fn fn;
    void *ctx;
    int err;
} kvo__out;

static void kvo__put(kvo__out *w, const char *fmt, ...) KVO__PRINTF(2, 3);
static void kvo__put(kvo__out *w, const char *fmt, ...) {
    if (w->err) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    assert(n >= 0 && (size_t)n < sizeof line); /* our own short strings */
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
    if (w->fn(line, (size_t)n, w->ctx)) w->err = 1;
}

static void kvo__prometheus(kvo__out *w, const kvo__series *o, const kvo__hist *h) {
    for (size_t i = 0; i < o->n; i++) {
        const kvo__sample *s = &o->s[i];
        if (i == 0 || strcmp(s->name, o->s[i - 1].name))
            kvo__put(w, "# HELP %s %s\n# TYPE %s %s\n", s->name, s->help, s->name, s->type);
        if (s->lkey)
            kvo__put(w, "%s{%s=\"%s\"} %llu\n", s->name, s->lkey, s->lval, (unsigned long long)s->v);
        else
            kvo__put(w, "%s %llu\n", s->name, (unsigned long long)s->v);
    }
    kvo__put(w, "# HELP %s %s\n# TYPE %s histogram\n", KVO__HIST_NAME, KVO__HIST_HELP, KVO__HIST_NAME);
    uint64_t cum = 0;
    for (size_t i = 0; i < KVO__LOAD_BUCKETS; i++) {
        cum += h->n[i];
        kvo__put(w, "%s_bucket{le=\"%s\"} %llu\n", KVO__HIST_NAME, kvo__buckets[i].le, (unsigned long long)cum);
    }
    kvo__put(w, "%s_bucket{le=\"+Inf\"} %llu\n", KVO__HIST_NAME, (unsigned long long)h->count);
    kvo__put(w, "%s_sum %.9f\n", KVO__HIST_NAME, (double)h->sum_ns / 1e9);
    kvo__put(w, "%s_count %llu\n", KVO__HIST_NAME, (unsigned long long)h->count);
}

/* ---------------------------------------------------------------- JSON -- */

static json_t *kvo__jint(uint64_t v) { return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v); }

static json_t *kvo__json(const kvo__series *o, const kvo__hist *h) {
    json_t *root = json_object(), *buckets = json_array(), *hist = json_object();
    bool ok = root && buckets && hist;
    for (size_t i = 0; ok && i < o->n; i++) {
        const kvo__sample *s = &o->s[i];
        if (!s->lkey) {
            ok = !json_object_set_new(root, s->name, kvo__jint(s->v));
            continue;
        }
        json_t *m = json_object_get(root, s->name);
        if (!m) ok = (m = json_object()) && !json_object_set_new(root, s->name, m);
        ok = ok && !json_object_set_new(m, s->lval, kvo__jint(s->v));
    }
    uint64_t cum = 0;
    for (size_t i = 0; ok && i <= KVO__LOAD_BUCKETS; i++) {
        cum += h->n[i];
        json_t *b = json_object();
        ok = b && !json_array_append_new(buckets, b);
        ok = ok && !json_object_set_new(b, "le", json_string(i < KVO__LOAD_BUCKETS ? kvo__buckets[i].le : "+Inf"));
        ok = ok && !json_object_set_new(b, "count", kvo__jint(cum));
    }
    ok = ok && !json_object_set_new(hist, "buckets", buckets);
    buckets = NULL;
    ok = ok && !json_object_set_new(hist, "sum", json_real((double)h->sum_ns / 1e9));
    ok = ok && !json_object_set_new(hist, "count", kvo__jint(h->count));
    ok = ok && !json_object_set_new(root, KVO__HIST_NAME, hist);
    hist = NULL;
    json_decref(buckets);
    json_decref(hist);
    if (!ok) {
        json_decref(root);
        return NULL;
    }
    return root;
}

static int kvo__json_cb(const char *buf, size_t size, void *data) {
    kvo__out *w = data;
    if (w->fn(buf, size, w->ctx)) w->err = 1;
    return w->err ? -1 : 0;
}

/* ------------------------------------------------------------- the API -- */

int kvo_connector_stats_write(kvo_connector *c, unsigned format, kvo_stats_write_fn fn, void *ctx) {
    if (!c || !fn) return kvo__error(KVO_EINVAL, "kvo_connector_stats_write: NULL %s", c ? "fn" : "connector");
    if (format != KVO_STATS_PROMETHEUS && format != KVO_STATS_JSON)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_stats_write: format is 0x%x; use KVO_STATS_PROMETHEUS (0x1) or "
                          "KVO_STATS_JSON (0x2), one per call",
                          format);
    kvo__snap s;
    int rc = kvo__snapshot(c, &s);
    if (rc) return rc;
    kvo__series o;
    kvo__series_build(&o, &s);
    kvo__out w = {fn, ctx, 0};
    if (format == KVO_STATS_PROMETHEUS) {
        kvo__prometheus(&w, &o, &s.hist);
    } else {
        json_t *j = kvo__json(&o, &s.hist);
        if (!j) return kvo__error(KVO_ENOMEM, "kvo_connector_stats_write: out of memory building the JSON object");
        int jr = json_dump_callback(j, kvo__json_cb, &w, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(j);
        if (jr && !w.err)
            return kvo__error(KVO_ENOMEM, "kvo_connector_stats_write: out of memory writing the JSON text");
        if (!w.err) w.err = fn("\n", 1, ctx) != 0;
    }
    if (w.err) return kvo__error(KVO_EIO, "kvo_connector_stats_write: the write callback returned nonzero");
    return 0;
}

typedef struct kvo__buf {
    char *buf;
    size_t cap, len;
} kvo__buf;

static int kvo__buf_write(const char *data, size_t len, void *ctx) {
    kvo__buf *b = ctx;
    if (b->len < b->cap) {
        size_t room = b->cap - b->len, k = len < room ? len : room;
        memcpy(b->buf + b->len, data, k);
    }
    b->len += len;
    return 0;
}

int kvo_connector_stats_format(kvo_connector *c, unsigned format, char *buf, size_t cap, size_t *len) {
    if (!len || (!buf && cap))
        return kvo__error(KVO_EINVAL, "kvo_connector_stats_format: NULL %s", len ? "buf with cap > 0" : "len");
    kvo__buf b = {buf, cap, 0};
    int rc = kvo_connector_stats_write(c, format, kvo__buf_write, &b);
    if (rc) return rc;
    *len = b.len;
    if (b.len >= cap) {
        if (cap) buf[cap - 1] = 0;
        return kvo__error(KVO_ERANGE, "kvo_connector_stats_format: the text needs %zu bytes with its NUL; cap is %zu",
                          b.len + 1, cap);
    }
    buf[b.len] = 0;
    return 0;
}
