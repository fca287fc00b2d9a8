/*
 * kvo_connector_stats_write / _format: after a store and a load through the
 * simulated engine, the Prometheus exposition text is parsed line by line
 * (HELP then TYPE before a family's samples, metric and label names, label
 * syntax, values; histogram buckets rising in `le` and in count, +Inf equal
 * to _count, _sum present) and compared with kvo_connector_get_stats; the
 * JSON form is parsed with jansson and compared with the text.  Plus the
 * sink's errors, the buffer form's size contract and bad arguments.
 */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "connector_sim.h"
#include "kvoffload/kvo_metrics.h"

/* ----------------------------------------------------------- the setup -- */

static kvo_plan *one_group_plan(void) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 2, true, false}};
    return sim_plan("one", 16, gs, 1);
}

static void do_update(sim *s, sim_req *r) {
    kvo_block_table t[SIM_MAXG];
    sim_tables(s, r, t);
    ASSERT_OK(kvo_connector_update(s->c, r->id, r->computed, t, s->ng));
}

/* Store tok[0, n) through request 1 (then dropped); load it back through
 * request 2 (loads times): leaves two loads' worth of counters. */
static void store_and_load(sim *s, const uint32_t *tok, size_t n, int loads) {
    sim_req a;
    sim_req_init(&a, 1);
    sim_req_tokens(&a, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 1, .tokens = tok, .n_tokens = n}));
    sim_compute(s, &a, n);
    do_update(s, &a);
    sim_drain(s);
    ASSERT_OK(kvo_connector_abort(s->c, 1));
    sim_req_free(s, &a);
    for (int k = 0; k < loads; k++) {
        sim_req b;
        uint64_t id = 2 + (uint64_t)k;
        sim_req_init(&b, id);
        sim_req_tokens(&b, tok, n);
        ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n}));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(s->c, id, 0, &lr));
        ASSERT_EQ_INT(lr.status, KVO_HIT);
        sim_table_len(s, &b, 0, (size_t)(lr.tokens / 16));
        for (size_t i = 0; i < b.tn[0]; i++) b.tab[0][i] = sim_alloc(s, 0);
        kvo_block_table t[SIM_MAXG];
        sim_tables(s, &b, t);
        ASSERT_OK(kvo_connector_load(s->c, id, lr.tokens, t, s->ng));
        kvo_completion cp = sim_wait_completion(s, id, KVO_COMPLETION_LOAD);
        ASSERT_EQ_INT(cp.status, 0);
        ASSERT_OK(kvo_connector_abort(s->c, id));
        sim_req_free(s, &b);
    }
}

/* A connector with n tokens stored and loaded back `loads` times. */
static void sim_with_loads(sim *s, size_t n, uint32_t mul, int loads) {
    sim_init(s, one_group_plan(), NULL, 256);
    uint32_t *tok = malloc(n * sizeof *tok);
    ASSERT_NOT_NULL(tok);
    for (size_t i = 0; i < n; i++) tok[i] = (uint32_t)(i * mul + 5);
    store_and_load(s, tok, n, loads);
    free(tok);
}

/* Grow-as-needed text sink. */
typedef struct text {
    char *p;
    size_t n, cap;
    int fail_after; /* calls before it refuses; -1 never */
} text;

static int text_write(const char *d, size_t n, void *ctx) {
    text *t = ctx;
    if (t->fail_after == 0) return -1;
    if (t->fail_after > 0) t->fail_after--;
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->p = realloc(t->p, t->cap);
        ASSERT_NOT_NULL(t->p);
    }
    memcpy(t->p + t->n, d, n);
    t->n += n;
    t->p[t->n] = 0;
    return 0;
}

/* ------------------------------------------------- the exposition parser -- */

#define MAXF 96
typedef struct family {
    char name[96], type[16];
    bool help;
    size_t samples;
} family;

typedef struct sample {
    char name[96], lkey[32], lval[64];
    double v;
} sample;

typedef struct expo {
    family f[MAXF];
    size_t nf;
    sample s[512];
    size_t ns;
} expo;

static bool is_name(const char *p, size_t n) {
    if (n == 0 || !(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':')) return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)p[i]) || p[i] == '_' || p[i] == ':')) return false;
    return true;
}

static family *find_family(expo *e, const char *name) {
    for (size_t i = 0; i < e->nf; i++)
        if (!strcmp(e->f[i].name, name)) return &e->f[i];
    return NULL;
}

/* The family a sample belongs to: itself, or a histogram's base name. */
static family *sample_family(expo *e, const char *name) {
    family *f = find_family(e, name);
    if (f) return f;
    static const char *sfx[] = {"_bucket", "_sum", "_count"};
    for (size_t k = 0; k < 3; k++) {
        size_t n = strlen(name), m = strlen(sfx[k]);
        if (n > m && !strcmp(name + n - m, sfx[k])) {
            char base[96];
            snprintf(base, sizeof base, "%.*s", (int)(n - m), name);
            f = find_family(e, base);
            if (f && !strcmp(f->type, "histogram")) return f;
        }
    }
    return NULL;
}

static void parse_expo(const char *text, expo *e) {
    memset(e, 0, sizeof *e);
    family *cur = NULL;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        ASSERT_NOT_NULL(end); /* every line ends with \n */
        char l[512];
        ASSERT_LT_U64((size_t)(end - line), sizeof l);
        snprintf(l, sizeof l, "%.*s", (int)(end - line), line);
        line = end + 1;
        ASSERT_GT_U64(strlen(l), 0);
        if (!strncmp(l, "# HELP ", 7)) {
            char *nm = l + 7, *sp = strchr(nm, ' ');
            ASSERT_NOT_NULL(sp);
            ASSERT_TRUE(is_name(nm, (size_t)(sp - nm)));
            ASSERT_GT_U64(strlen(sp + 1), 0); /* some help text */
            *sp = 0;
            ASSERT_NULL(find_family(e, nm)); /* one HELP per family, families not split */
            ASSERT_LT_U64(e->nf, MAXF);
            cur = &e->f[e->nf++];
            snprintf(cur->name, sizeof cur->name, "%s", nm);
            cur->help = true;
            continue;
        }
        if (!strncmp(l, "# TYPE ", 7)) {
            char *nm = l + 7, *sp = strchr(nm, ' ');
            ASSERT_NOT_NULL(sp);
            *sp = 0;
            ASSERT_NOT_NULL(cur);
            ASSERT_EQ_STR(nm, cur->name); /* TYPE right after its HELP */
            ASSERT_EQ_STR(cur->type, "");
            const char *ty = sp + 1;
            ASSERT_TRUE(!strcmp(ty, "counter") || !strcmp(ty, "gauge") || !strcmp(ty, "histogram"));
            snprintf(cur->type, sizeof cur->type, "%s", ty);
            continue;
        }
        ASSERT_TRUE(l[0] != '#');
        /* name[{key="value"}] value */
        sample *s = &e->s[e->ns++];
        ASSERT_LT_U64(e->ns, 512);
        size_t nl = strcspn(l, "{ ");
        ASSERT_TRUE(is_name(l, nl));
        snprintf(s->name, sizeof s->name, "%.*s", (int)nl, l);
        ASSERT_TRUE(!strncmp(s->name, "kvoffload_", 10));
        const char *p = l + nl;
        if (*p == '{') {
            p++;
            size_t kl = strcspn(p, "=");
            ASSERT_TRUE(is_name(p, kl));
            ASSERT_TRUE(strncmp(p, "__", 2) != 0); /* reserved label names */
            snprintf(s->lkey, sizeof s->lkey, "%.*s", (int)kl, p);
            p += kl;
            ASSERT_TRUE(p[0] == '=' && p[1] == '"');
            p += 2;
            size_t vl = strcspn(p, "\"\\\n");
            ASSERT_EQ_INT(p[vl], '"'); /* no escapes needed in our values */
            snprintf(s->lval, sizeof s->lval, "%.*s", (int)vl, p);
            p += vl + 1;
            ASSERT_EQ_INT(*p, '}');
            p++;
        }
        ASSERT_EQ_INT(*p, ' ');
        char *vend;
        s->v = strtod(p + 1, &vend);
        ASSERT_TRUE(vend != p + 1 && *vend == 0);
        ASSERT_TRUE(s->v >= 0 && isfinite(s->v));
        family *f = sample_family(e, s->name);
        ASSERT_NOT_NULL(f);
        ASSERT_TRUE(f == cur); /* a family's samples follow its TYPE line */
        ASSERT_TRUE(f->help && f->type[0]);
        f->samples++;
        /* naming conventions: counters end in _total */
        if (!strcmp(f->type, "counter")) ASSERT_TRUE(strstr(s->name, "_total") == s->name + strlen(s->name) - 6);
    }
    for (size_t i = 0; i < e->nf; i++) ASSERT_GT_U64(e->f[i].samples, 0);
}

static double value_of(const expo *e, const char *name, const char *lval) {
    for (size_t i = 0; i < e->ns; i++)
        if (!strcmp(e->s[i].name, name) && (!lval || !strcmp(e->s[i].lval, lval))) return e->s[i].v;
    FAILF("no sample %s{%s}", name, lval ? lval : "");
}

/* Buckets rise in le and in count; +Inf last and equal to _count; _sum. */
static void check_histogram(const expo *e, const char *base, double *count) {
    char bn[128], cn[128], sn[128];
    snprintf(bn, sizeof bn, "%s_bucket", base);
    snprintf(cn, sizeof cn, "%s_count", base);
    snprintf(sn, sizeof sn, "%s_sum", base);
    double last_le = -1, last_n = 0;
    size_t nb = 0;
    bool inf = false;
    for (size_t i = 0; i < e->ns; i++) {
        if (strcmp(e->s[i].name, bn)) continue;
        ASSERT_FALSE(inf); /* nothing after +Inf */
        ASSERT_EQ_STR(e->s[i].lkey, "le");
        double le = !strcmp(e->s[i].lval, "+Inf") ? INFINITY : strtod(e->s[i].lval, NULL);
        inf = isinf(le);
        ASSERT_TRUE(le > last_le);
        ASSERT_TRUE(e->s[i].v >= last_n);
        last_le = le;
        last_n = e->s[i].v;
        nb++;
    }
    ASSERT_TRUE(inf);
    ASSERT_GT_U64(nb, 2);
    *count = value_of(e, cn, NULL);
    ASSERT_EQ_DBL(last_n, *count);
    double sum = value_of(e, sn, NULL);
    ASSERT_TRUE(*count == 0 ? sum == 0 : sum > 0);
}

/* ------------------------------------------------------------- the tests -- */

KVO_TEST(prometheus_text_parses_and_matches_stats) {
    sim s;
    sim_with_loads(&s, 300, 13, 2);
    text t = {NULL, 0, 0, -1};
    ASSERT_OK(kvo_connector_stats_write(s.c, KVO_STATS_PROMETHEUS, text_write, &t));
    expo *e = calloc(1, sizeof *e);
    ASSERT_NOT_NULL(e);
    parse_expo(t.p, e);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &cs));
    ASSERT_EQ_U64(cs.loads, 2);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_loads_total", NULL), (double)cs.loads);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_lookup_hits_total", NULL), (double)cs.lookup_hits);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_loaded_tokens_total", "host"), (double)cs.tokens_loaded_host);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_stored_bytes_total", NULL), (double)cs.bytes_stored);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_tier_hits_total", "host"), (double)cs.host.hits);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_tier_entries", "host"), (double)cs.host.entries);
    ASSERT_GT_U64((uint64_t)value_of(e, "kvoffload_tier_read_bytes_total", "host"), 0);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_load_failures_total", NULL), 0);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_queue_depth", "transfer_jobs"), 0);
    /* no file tier: no file series */
    ASSERT_NULL(find_family(e, "kvoffload_file_reads_total"));
    for (size_t i = 0; i < e->ns; i++)
        if (!strncmp(e->s[i].name, "kvoffload_tier_", 15)) ASSERT_EQ_STR(e->s[i].lval, "host");
    /* the two loads are in the histogram */
    family *h = find_family(e, "kvoffload_load_duration_seconds");
    ASSERT_NOT_NULL(h);
    ASSERT_EQ_STR(h->type, "histogram");
    double count;
    check_histogram(e, "kvoffload_load_duration_seconds", &count);
    ASSERT_EQ_DBL(count, 2);
    free(e);
    free(t.p);
    sim_destroy(&s);
}

KVO_TEST(json_matches_the_text) {
    sim s;
    sim_with_loads(&s, 200, 29, 1);
    text tp = {NULL, 0, 0, -1}, tj = {NULL, 0, 0, -1};
    ASSERT_OK(kvo_connector_stats_write(s.c, KVO_STATS_PROMETHEUS, text_write, &tp));
    ASSERT_OK(kvo_connector_stats_write(s.c, KVO_STATS_JSON, text_write, &tj));
    expo *e = calloc(1, sizeof *e);
    ASSERT_NOT_NULL(e);
    parse_expo(tp.p, e);
    json_error_t jerr;
    json_t *j = json_loads(tj.p, 0, &jerr);
    if (!j) FAILF("JSON does not parse: %s at %d", jerr.text, jerr.position);
    ASSERT_TRUE(json_is_object(j));
    /* every sample of the text is in the JSON with the same value (no
     * traffic between the two calls changes a counter here) */
    for (size_t i = 0; i < e->ns; i++) {
        const sample *sm = &e->s[i];
        if (strstr(sm->name, "kvoffload_load_duration_seconds")) continue;
        json_t *v = json_object_get(j, sm->name);
        if (sm->lkey[0]) v = json_object_get(v, sm->lval);
        if (!v) FAILF("JSON lacks %s{%s}", sm->name, sm->lval);
        ASSERT_TRUE(json_is_integer(v));
        ASSERT_EQ_DBL((double)json_integer_value(v), sm->v);
    }
    json_t *h = json_object_get(j, "kvoffload_load_duration_seconds");
    ASSERT_TRUE(json_is_object(h));
    json_t *b = json_object_get(h, "buckets");
    ASSERT_TRUE(json_is_array(b));
    ASSERT_GT_U64(json_array_size(b), 2);
    json_int_t prev = 0;
    for (size_t i = 0; i < json_array_size(b); i++) {
        json_t *c = json_object_get(json_array_get(b, i), "count");
        ASSERT_TRUE(json_is_integer(c));
        ASSERT_GE_INT(json_integer_value(c), prev);
        prev = json_integer_value(c);
    }
    ASSERT_EQ_STR(json_string_value(json_object_get(json_array_get(b, json_array_size(b) - 1), "le")), "+Inf");
    ASSERT_EQ_INT(json_integer_value(json_object_get(h, "count")), 1);
    ASSERT_EQ_INT(prev, 1);
    ASSERT_TRUE(json_real_value(json_object_get(h, "sum")) > 0);
    json_decref(j);
    free(e);
    free(tp.p);
    free(tj.p);
    sim_destroy(&s);
}

KVO_TEST(buffer_form_and_errors) {
    sim s;
    sim_init(&s, one_group_plan(), NULL, 64);
    size_t len = 0;
    /* size query, then a buffer that fits */
    ASSERT_ERR(kvo_connector_stats_format(s.c, KVO_STATS_PROMETHEUS, NULL, 0, &len), KVO_ERANGE);
    ASSERT_GT_U64(len, 100);
    char small[32];
    ASSERT_ERR(kvo_connector_stats_format(s.c, KVO_STATS_PROMETHEUS, small, sizeof small, &len), KVO_ERANGE);
    ASSERT_EQ_U64(strlen(small), sizeof small - 1); /* truncated, terminated */
    char *buf = malloc(len + 1);
    ASSERT_NOT_NULL(buf);
    size_t len2 = 0;
    ASSERT_OK(kvo_connector_stats_format(s.c, KVO_STATS_PROMETHEUS, buf, len + 1, &len2));
    ASSERT_EQ_U64(len2, strlen(buf));
    ASSERT_EQ_U64(len2, len);
    ASSERT_MEM_EQ(buf, small, sizeof small - 1);
    expo *e = calloc(1, sizeof *e);
    ASSERT_NOT_NULL(e);
    parse_expo(buf, e); /* an idle connector's text is well-formed too */
    double count;
    check_histogram(e, "kvoffload_load_duration_seconds", &count);
    ASSERT_EQ_DBL(count, 0);
    free(e);
    free(buf);
    /* bad arguments */
    text t = {NULL, 0, 0, -1};
    ASSERT_ERR(kvo_connector_stats_write(NULL, KVO_STATS_JSON, text_write, &t), KVO_EINVAL);
    ASSERT_ERR(kvo_connector_stats_write(s.c, KVO_STATS_JSON, NULL, &t), KVO_EINVAL);
    ASSERT_ERR(kvo_connector_stats_write(s.c, 0, text_write, &t), KVO_EINVAL);
    ASSERT_ERR(kvo_connector_stats_write(s.c, KVO_STATS_JSON | KVO_STATS_PROMETHEUS, text_write, &t), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "KVO_STATS_PROMETHEUS");
    ASSERT_ERR(kvo_connector_stats_format(s.c, KVO_STATS_JSON, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_EQ_U64(t.n, 0);
    /* a sink that refuses stops the write, in both formats */
    for (unsigned f = KVO_STATS_PROMETHEUS; f <= KVO_STATS_JSON; f++) {
        text r = {NULL, 0, 0, 3};
        ASSERT_ERR(kvo_connector_stats_write(s.c, f, text_write, &r), KVO_EIO);
        ASSERT_EQ_INT(r.fail_after, 0);
        free(r.p);
    }
    sim_destroy(&s);
}

/* A request of tok[0, n) under salt (NULL: none): added, looked up and,
 * on a hit, loaded; else computed and stored.  Aborted at the end.  Returns
 * the lookup's status. */
static int salted_request(sim *s, uint64_t id, const char *salt, const uint32_t *tok, size_t n) {
    sim_req r;
    sim_req_init(&r, id);
    sim_req_tokens(&r, tok, n);
    kvo_request_desc d = {.struct_size = sizeof d, .id = id, .tokens = tok, .n_tokens = n,
                          .cache_salt = salt, .cache_salt_len = salt ? strlen(salt) : 0};
    ASSERT_OK(kvo_connector_add_request(s->c, &d));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s->c, id, 0, &lr));
    if (lr.status == KVO_HIT) {
        sim_table_len(s, &r, 0, (size_t)((lr.tokens + 15) / 16));
        for (size_t i = 0; i < r.tn[0]; i++) r.tab[0][i] = sim_alloc(s, 0);
        kvo_block_table t[SIM_MAXG];
        sim_tables(s, &r, t);
        ASSERT_OK(kvo_connector_load(s->c, id, lr.tokens, t, s->ng));
        ASSERT_EQ_INT(sim_wait_completion(s, id, KVO_COMPLETION_LOAD).status, 0);
    } else {
        sim_compute(s, &r, n);
        do_update(s, &r);
        sim_drain(s);
    }
    ASSERT_OK(kvo_connector_abort(s->c, id));
    sim_req_free(s, &r);
    return lr.status;
}

/* Per-tenant counters: requests under two salts and none; each tenant's
 * second request loads its own first one's chunks, never another's; the
 * rows (labels, never salts) sum to the connector's totals; tenants beyond
 * KVO_CONNECTOR_TENANTS count under "other"; the metrics carry each row. */
KVO_TEST(tenants_split_the_counters) {
    sim s;
    sim_init(&s, one_group_plan(), NULL, 256);
    uint32_t tok[160];
    for (size_t i = 0; i < 160; i++) tok[i] = (uint32_t)(i * 7 + 3);
    ASSERT_EQ_INT(salted_request(&s, 1, "alice-secret", tok, 160), KVO_MISS);
    ASSERT_EQ_INT(salted_request(&s, 2, "bob-secret", tok, 160), KVO_MISS);   /* alice's chunks: not bob's */
    ASSERT_EQ_INT(salted_request(&s, 3, "alice-secret", tok, 160), KVO_HIT);
    ASSERT_EQ_INT(salted_request(&s, 4, NULL, tok, 160), KVO_MISS);
    ASSERT_EQ_INT(salted_request(&s, 5, "bob-secret", tok, 160), KVO_HIT);
    /* 40 more tenants: 29 get rows (32 in all), 11 count under "other" */
    for (uint64_t k = 0; k < 40; k++) {
        char salt[32];
        snprintf(salt, sizeof salt, "user-%llu", (unsigned long long)k);
        kvo_request_desc d = {.struct_size = sizeof d, .id = 100 + k, .tokens = tok, .n_tokens = 16,
                              .cache_salt = salt, .cache_salt_len = strlen(salt)};
        ASSERT_OK(kvo_connector_add_request(s.c, &d));
        ASSERT_OK(kvo_connector_abort(s.c, 100 + k));
    }
    size_t n = 0;
    ASSERT_OK(kvo_connector_tenant_stats(s.c, NULL, 0, &n));
    ASSERT_EQ_U64(n, KVO_CONNECTOR_TENANTS + 1);
    kvo_tenant_stats rows[KVO_CONNECTOR_TENANTS + 1];
    ASSERT_OK(kvo_connector_tenant_stats(s.c, rows, KVO_CONNECTOR_TENANTS + 1, &n));
    ASSERT_EQ_U64(n, KVO_CONNECTOR_TENANTS + 1);
    char alice[KVO_TENANT_LABEL_MAX], bob[KVO_TENANT_LABEL_MAX];
    ASSERT_OK(kvo_tenant_label("alice-secret", 12, alice, sizeof alice));
    ASSERT_OK(kvo_tenant_label("bob-secret", 10, bob, sizeof bob));
    ASSERT_EQ_STR(rows[0].label, alice);
    ASSERT_EQ_STR(rows[1].label, bob);
    ASSERT_EQ_STR(rows[2].label, "default");
    ASSERT_EQ_STR(rows[KVO_CONNECTOR_TENANTS].label, "other");
    ASSERT_EQ_U64(rows[KVO_CONNECTOR_TENANTS].requests, 11);
    for (int t = 0; t < 2; t++) {
        ASSERT_EQ_U64(rows[t].requests, 2);
        ASSERT_GT_U64(rows[t].stored_chunks, 0);
        ASSERT_GT_U64(rows[t].loaded_tokens, 0);
        ASSERT_EQ_U64(rows[t].loaded_tokens, rows[t].hit_tokens); /* the second request's load */
        ASSERT_EQ_U64(rows[t].lookup_tokens, 320);
    }
    ASSERT_EQ_U64(rows[2].requests, 1);
    ASSERT_EQ_U64(rows[2].hit_tokens, 0);
    kvo_connector_stats cs = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s.c, &cs));
    kvo_tenant_stats sum = {0};
    for (size_t i = 0; i < n; i++) {
        sum.requests += rows[i].requests;
        sum.lookup_tokens += rows[i].lookup_tokens;
        sum.hit_tokens += rows[i].hit_tokens;
        sum.loaded_tokens += rows[i].loaded_tokens;
        sum.stored_chunks += rows[i].stored_chunks;
        sum.load_failures += rows[i].load_failures;
    }
    ASSERT_EQ_U64(sum.requests, cs.requests_added);
    ASSERT_EQ_U64(sum.lookup_tokens, cs.lookup_tokens);
    ASSERT_EQ_U64(sum.hit_tokens, cs.hit_tokens);
    ASSERT_EQ_U64(sum.loaded_tokens, cs.tokens_loaded);
    ASSERT_EQ_U64(sum.stored_chunks, cs.chunks_stored);
    ASSERT_EQ_U64(sum.load_failures, cs.load_failures);
    /* a short out: the first rows */
    ASSERT_OK(kvo_connector_tenant_stats(s.c, rows, 2, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_ERR(kvo_connector_tenant_stats(s.c, NULL, 1, &n), KVO_EINVAL);
    /* the metrics: one sample per row and family, never a salt */
    text t = {NULL, 0, 0, -1};
    ASSERT_OK(kvo_connector_stats_write(s.c, KVO_STATS_PROMETHEUS, text_write, &t));
    ASSERT_NULL(strstr(t.p, "secret"));
    expo *e = calloc(1, sizeof *e);
    ASSERT_NOT_NULL(e);
    parse_expo(t.p, e);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_tenant_requests_total", alice), 2);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_tenant_requests_total", "other"), 11);
    ASSERT_EQ_DBL(value_of(e, "kvoffload_tenant_loaded_tokens_total", bob), (double)rows[1].loaded_tokens);
    family *f = find_family(e, "kvoffload_tenant_stored_chunks_total");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ_U64(f->samples, KVO_CONNECTOR_TENANTS + 1);
    free(e);
    free(t.p);
    sim_destroy(&s);
}

/* Tenant quotas through the connector (tenant_host_bytes from a config):
 * alice's part keeps her prompt's chunks while bob's traffic churns the
 * shared part; without the part (the control) bob's traffic evicts them. */
KVO_TEST(a_tenant_part_keeps_its_prefix_through_the_connector) {
    char alice[KVO_TENANT_LABEL_MAX];
    ASSERT_OK(kvo_tenant_label("alice-secret", 12, alice, sizeof alice));
    for (int with_part = 1; with_part >= 0; with_part--) {
        kvo_plan *plan = one_group_plan();
        uint64_t slot = kvo_plan_group(plan, 0)->slot_bytes;
        char json[160];
        snprintf(json, sizeof json, "{\"host_bytes\": %llu, \"tenant_host_bytes\": {\"%s\": %llu}}",
                 (unsigned long long)(16 * slot), alice, (unsigned long long)(8 * slot));
        kvo_config *cfg = NULL;
        ASSERT_OK(kvo_config_from_json(json, strlen(json), &cfg));
        kvo_connector_params cp = kvo_connector_default_params();
        ASSERT_OK(kvo_config_apply_connector(cfg, &cp));
        ASSERT_EQ_U64(cp.n_tenants, 1);
        if (!with_part) cp.n_tenants = 0;
        sim s;
        sim_init(&s, plan, &cp, 256);
        kvo_config_destroy(cfg);
        uint32_t tok[160];
        for (size_t i = 0; i < 160; i++) tok[i] = (uint32_t)(i * 7 + 3);
        ASSERT_EQ_INT(salted_request(&s, 1, "alice-secret", tok, 160), KVO_MISS);
        for (uint32_t k = 0; k < 4; k++) { /* 20 chunks of bob's through 8 shared slots */
            for (size_t i = 0; i < 160; i++) tok[i] = (uint32_t)(i * 11 + 1000 * (k + 1));
            ASSERT_EQ_INT(salted_request(&s, 10 + k, "bob-secret", tok, 160), KVO_MISS);
        }
        for (size_t i = 0; i < 160; i++) tok[i] = (uint32_t)(i * 7 + 3);
        ASSERT_EQ_INT(salted_request(&s, 2, "alice-secret", tok, 160), with_part ? KVO_HIT : KVO_MISS);
        kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
        ASSERT_OK(kvo_connector_get_stats(s.c, &st));
        ASSERT_EQ_U64(st.host.capacity_bytes, 16 * slot); /* every part counted */
        sim_destroy(&s);
    }
}

KVO_TEST(tenant_labels) {
    char a[KVO_TENANT_LABEL_MAX], b[KVO_TENANT_LABEL_MAX];
    ASSERT_OK(kvo_tenant_label(NULL, 0, a, sizeof a));
    ASSERT_EQ_STR(a, "default");
    ASSERT_OK(kvo_tenant_label("x", 1, a, sizeof a));
    ASSERT_OK(kvo_tenant_label("y", 1, b, sizeof b));
    ASSERT_EQ_U64(strlen(a), 14);
    ASSERT_TRUE(!strncmp(a, "t-", 2) && strcmp(a, b) != 0);
    for (size_t i = 2; i < 14; i++) ASSERT_TRUE(isxdigit((unsigned char)a[i]) && !isupper((unsigned char)a[i]));
    ASSERT_ERR(kvo_tenant_label("x", 1, a, 14), KVO_ERANGE);
    ASSERT_ERR(kvo_tenant_label(NULL, 1, a, sizeof a), KVO_EINVAL);
    ASSERT_ERR(kvo_tenant_label("x", 1, NULL, 16), KVO_EINVAL);
}

/* kvoffload demo --metrics FILE with a file tier: the text file parses, the
 * file tier's series are there, the histogram counts every completed load;
 * a *.json FILE is JSON with the same families. */
KVO_TEST(demo_writes_metrics_file) {
    char cmd[2048], txt[1024], js[1024];
    const char *tmp = kvo_test_tmpdir();
    snprintf(txt, sizeof txt, "%s/metrics.txt", tmp);
    snprintf(js, sizeof js, "%s/metrics.json", tmp);
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "'%s' demo --quiet --requests 8 --file-dir '%s/files' --metrics='%s' 2>&1",
                 KVO_CLI_PATH, tmp, k ? js : txt);
        char *out = NULL;
        int rc = kvo_test_run(cmd, &out);
        if (rc) FAILF("demo exited %d: %s", rc, out ? out : "");
        free(out);
    }
    char *text = kvo_test_read_file(txt, NULL);
    ASSERT_NOT_NULL(text);
    expo *e = calloc(1, sizeof *e);
    ASSERT_NOT_NULL(e);
    parse_expo(text, e);
    ASSERT_GT_U64((uint64_t)value_of(e, "kvoffload_tier_written_bytes_total", "file"), 0);
    ASSERT_GT_U64((uint64_t)value_of(e, "kvoffload_tier_entries", "file"), 0);
    ASSERT_NOT_NULL(find_family(e, "kvoffload_file_dropped_writes_total"));
    (void)value_of(e, "kvoffload_queue_depth", "file_writes");
    double count;
    check_histogram(e, "kvoffload_load_duration_seconds", &count);
    /* every load completed (a preempted one is never counted) */
    ASSERT_LE_U64((uint64_t)count, (uint64_t)value_of(e, "kvoffload_loads_total", NULL));
    ASSERT_GT_U64((uint64_t)count, 0);
    char *jt = kvo_test_read_file(js, NULL);
    ASSERT_NOT_NULL(jt);
    json_error_t jerr;
    json_t *j = json_loads(jt, 0, &jerr);
    if (!j) FAILF("%s is not JSON: %s", js, jerr.text);
    for (size_t i = 0; i < e->nf; i++)
        if (!json_object_get(j, e->f[i].name)) FAILF("%s lacks %s", js, e->f[i].name);
    json_decref(j);
    free(jt);
    free(e);
    free(text);
}
