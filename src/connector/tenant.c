/*
 * Per-tenant counters: the connector's request, lookup, load and store
 * counts split by the requests' cache_salt.
 *
 * Layout.  A fixed table of KVO_CONNECTOR_TENANTS rows in kvo_connector,
 * filled in the order tenants first add a request, and one more row,
 * "other", for every tenant after the table is full.  A request keeps its
 * row's index (kvo__req.tenant) and so do its copy jobs (kvo__job.tenant),
 * whose results may land after the request is retired.  Each place that
 * counts a kvo_connector_stats field for a request counts its row too,
 * under the same lock, so the rows always sum to the connector's totals.
 *
 * Why this shape.  Salts are unbounded in number (one per user is common),
 * so memory and the metrics' series must not grow with them: the first
 * tenants get their own rows and the rest share one.  A row is found by
 * its label (kvo_tenant_label, computed once per request outside the lock)
 * with a scan of at most KVO_CONNECTOR_TENANTS labels, at add_request only;
 * the hot paths index the row directly.  Labels, not salts, are kept: a
 * salt may be a secret and never reaches the metrics.
 */
#include <string.h>

#include "connector/connector_internal.h"

uint8_t kvo__conn_tenant_row(kvo_connector *c, const char *label) {
    for (size_t i = 0; i < c->n_tenants; i++)
        if (!strcmp(c->tenants[i].label, label)) return (uint8_t)i;
    kvo_tenant_stats *t;
    uint8_t row;
    if (c->n_tenants < KVO_CONNECTOR_TENANTS) {
        row = (uint8_t)c->n_tenants++;
        t = &c->tenants[row];
        memset(t, 0, sizeof *t);
        memcpy(t->label, label, strnlen(label, KVO_TENANT_LABEL_MAX - 1));
    } else {
        row = KVO_CONNECTOR_TENANTS;
        t = &c->tenants[row];
        if (!t->label[0]) memcpy(t->label, "other", sizeof "other");
    }
    return row;
}

int kvo_connector_tenant_stats(kvo_connector *c, kvo_tenant_stats *out, size_t cap, size_t *n) {
    if (!c || !n || (!out && cap))
        return kvo__error(KVO_EINVAL, "kvo_connector_tenant_stats: NULL connector, n, or out with cap %zu", cap);
    kvo__conn_lock(c);
    const kvo_tenant_stats *other = &c->tenants[KVO_CONNECTOR_TENANTS];
    size_t used = c->n_tenants + (other->label[0] ? 1 : 0);
    if (!out) {
        *n = used;
        kvo__conn_unlock(c);
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < c->n_tenants && k < cap; i++) out[k++] = c->tenants[i];
    if (other->label[0] && k < cap) out[k++] = *other;
    *n = k;
    kvo__conn_unlock(c);
    return 0;
}
