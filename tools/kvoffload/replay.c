/*
 * Replay engine of `kvoffload replay`: load a Mooncake-format trace and play
 * it through the real store (the same kvo_store code as production, through
 * the public API only) and through the infinite cache.
 *
 * Layout: block ids are remapped to dense indices at load time (an open
 * addressing table, load factor <= 1/2), so that MIN and the infinite cache
 * work on flat arrays; the store sees each dense index as one chunk key of a
 * one-group plan (one 4096-byte slot per 512-token block: bytes are scaled by
 * the caller with the model's bytes per block).  Per request: lookup all its
 * blocks, the prefix hits are the leading READY ones; then prepare_store +
 * complete_store of all of them (present blocks count as used), in batches of
 * at most the capacity so that requests longer than the cache still replay.
 * `--ignore-present` plays vLLM's manager instead: hits touched, present
 * blocks left alone by the store.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "replay.h"

#define RP_SLOT 4096u

void rp_trace_free(rp_trace *t) {
    free(t->ids);
    free(t->starts);
    free(t->session);
    memset(t, 0, sizeof *t);
}

typedef struct rp_map {
    uint64_t *key;
    uint32_t *val;
    uint64_t mask;
    size_t n;
} rp_map;

uint64_t rp_mix(uint64_t x) {
    x ^= x >> 33;
    x *= UINT64_C(0xFF51AFD7ED558CCD);
    x ^= x >> 33;
    return x;
}

/* FNV-1a, then mixed: a session_id string as a 64-bit key. */
static uint64_t rp_hash_str(const char *s) {
    uint64_t h = UINT64_C(0xCBF29CE484222325);
    for (; *s; s++) h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001B3);
    return rp_mix(h);
}

static int rp_map_grow(rp_map *m) {
    uint64_t ncap = m->mask ? (m->mask + 1) * 2 : 1024;
    uint64_t *nk = malloc(ncap * sizeof *nk);
    uint32_t *nv = malloc(ncap * sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    memset(nk, 0xFF, ncap * sizeof *nk);
    for (uint64_t i = 0; m->mask && i <= m->mask; i++) {
        if (m->key[i] == UINT64_MAX) continue;
        uint64_t h = rp_mix(m->key[i]) & (ncap - 1);
        while (nk[h] != UINT64_MAX) h = (h + 1) & (ncap - 1);
        nk[h] = m->key[i];
        nv[h] = m->val[i];
    }
    free(m->key);
    free(m->val);
    m->key = nk;
    m->val = nv;
    m->mask = ncap - 1;
    return 0;
}

/* Dense index of id (a new one when unseen); UINT32_MAX on allocation failure. */
static uint32_t rp_map_get(rp_map *m, uint64_t id) {
    if ((m->n + 1) * 2 > m->mask + 1 && rp_map_grow(m)) return UINT32_MAX;
    uint64_t h = rp_mix(id) & m->mask;
    while (m->key[h] != UINT64_MAX) {
        if (m->key[h] == id) return m->val[h];
        h = (h + 1) & m->mask;
    }
    m->key[h] = id;
    m->val[h] = (uint32_t)m->n;
    return (uint32_t)m->n++;
}

static int rp_push(rp_trace *t, size_t *cap, uint32_t v) {
    if (t->nids == *cap) {
        size_t nc = *cap ? *cap * 2 : 4096;
        uint32_t *p = realloc(t->ids, nc * sizeof *p);
        if (!p) return -1;
        t->ids = p;
        *cap = nc;
    }
    t->ids[t->nids++] = v;
    return 0;
}

int rp_trace_load(const char *path, rp_trace *t, char *err, size_t errlen) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open trace '%s': %s", path, strerror(errno));
        return -1;
    }
    rp_map m = {0};
    char *line = NULL;
    size_t linecap = 0, idcap = 0, rcap = 0, lineno = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\n' || line[k] == '\r')) k++;
        if (k == (size_t)len) continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *a = o ? json_object_get(o, "hash_ids") : NULL;
        if (!o || !json_is_array(a)) {
            snprintf(err, errlen, "%s:%zu: %s", path, lineno,
                     o ? "no \"hash_ids\" array (expected {\"hash_ids\": [..], ...} per line)" : je.text);
            json_decref(o);
            rc = -1;
            break;
        }
        if (t->nreq + 2 > rcap) {
            size_t nc = rcap ? rcap * 2 : 1024;
            size_t *p = realloc(t->starts, nc * sizeof *p);
            uint64_t *q = p ? realloc(t->session, nc * sizeof *q) : NULL;
            if (p) t->starts = p;
            if (q) t->session = q;
            if (!p || !q) { rc = -2; json_decref(o); break; }
            rcap = nc;
        }
        json_t *sid = json_object_get(o, "session_id"); /* optional: routing by session */
        uint64_t sv = RP_NO_SESSION;
        if (json_is_integer(sid) && json_integer_value(sid) >= 0) sv = rp_mix((uint64_t)json_integer_value(sid));
        else if (json_is_string(sid)) sv = rp_hash_str(json_string_value(sid));
        else if (sid) {
            snprintf(err, errlen, "%s:%zu: session_id is neither a non-negative integer nor a string", path, lineno);
            json_decref(o);
            rc = -1;
            break;
        }
        t->session[t->nreq] = sv == RP_NO_SESSION && sid ? sv - 1 : sv;
        t->starts[t->nreq++] = t->nids;
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                snprintf(err, errlen, "%s:%zu: hash_ids[%zu] is not a non-negative integer", path, lineno, i);
                rc = -1;
                break;
            }
            uint32_t d = rp_map_get(&m, (uint64_t)json_integer_value(v));
            if (d == UINT32_MAX || rp_push(t, &idcap, d)) { rc = -2; break; }
        }
        json_decref(o);
        if (rc) break;
        size_t n = t->nids - t->starts[t->nreq - 1];
        if (n > t->maxlen) t->maxlen = n;
    }
    free(line);
    fclose(f);
    t->ndistinct = m.n;
    free(m.key);
    free(m.val);
    if (rc == -2) snprintf(err, errlen, "out of memory reading '%s'", path);
    if (!rc && t->nreq == 0) {
        snprintf(err, errlen, "trace '%s' has no request", path);
        rc = -1;
    }
    if (rc) {
        rp_trace_free(t);
        return -1;
    }
    t->starts[t->nreq] = t->nids;
    return 0;
}

void rp_replay_infinite(const rp_trace *t, rp_result *out) {
    memset(out, 0, sizeof *out);
    uint8_t *seen = calloc(t->ndistinct ? t->ndistinct : 1, 1);
    if (!seen) return;
    for (size_t r = 0; r < t->nreq; r++) {
        int prefix = 1;
        for (size_t i = t->starts[r]; i < t->starts[r + 1]; i++) {
            prefix = prefix && seen[t->ids[i]];
            out->hits += (uint64_t)prefix;
            seen[t->ids[i]] = 1;
        }
    }
    out->blocks = t->nids;
    free(seen);
}

kvo_chunk_key rp_trace_key(uint32_t id) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    uint64_t h = ((uint64_t)id + 1) * UINT64_C(0x9E3779B97F4A7C15);
    k.hash.lo = rp_mix(h);
    k.hash.hi = id;
    return k;
}

static int rp_plan(kvo_plan **out) {
    kvo_model *m = NULL;
    int rc = kvo_model_create("replay", 512, &m);
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "blocks");
    g.tokens_per_block = 512;
    g.layers = 1;
    g.page_bytes = RP_SLOT;
    if (!rc) rc = kvo_model_add_group(m, &g);
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    if (!rc) rc = kvo_plan_create(m, &pp, out);
    kvo_model_destroy(m);
    return rc;
}

int rp_cache_open(rp_cache *c, kvo_policy_kind pol, uint64_t cap, bool ignore_present, size_t maxlen) {
    memset(c, 0, sizeof *c);
    c->cap = cap;
    c->ignore_present = ignore_present;
    int rc = rp_plan(&c->plan);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = c->plan;
    sp.capacity_bytes = cap * RP_SLOT;
    sp.policy = pol;
    sp.ignore_present = ignore_present;
    if (!rc) rc = kvo_store_create(&sp, &c->s);
    size_t n = maxlen ? maxlen : 1;
    c->todo = malloc(n * sizeof *c->todo);
    c->st = malloc(n);
    c->need = malloc(n);
    c->sl = malloc(n * sizeof *c->sl);
    if (!rc && (!c->todo || !c->st || !c->need || !c->sl)) rc = KVO_ENOMEM;
    if (rc) rp_cache_close(c);
    return rc;
}

void rp_cache_close(rp_cache *c) {
    kvo_store_destroy(c->s);
    kvo_plan_destroy(c->plan);
    free(c->todo); free(c->st); free(c->need); free(c->sl);
    memset(c, 0, sizeof *c);
}

int rp_cache_hits(rp_cache *c, const kvo_chunk_key *keys, size_t from, size_t len, size_t *hits) {
    *hits = 0;
    if (from >= len) return 0;
    int rc = kvo_store_lookup(c->s, keys + from, len - from, c->st);
    size_t h = 0;
    while (!rc && from + h < len && c->st[h] == KVO_READY) h++;
    *hits = h;
    return rc;
}

int rp_cache_store(rp_cache *c, const kvo_chunk_key *keys, size_t len, uint8_t *need) {
    int rc = 0;
    for (size_t b = 0; !rc && b < len; b += c->cap) {
        size_t nb = len - b < c->cap ? len - b : (size_t)c->cap, m = 0;
        uint8_t *nd = need ? need + b : c->need;
        rc = kvo_store_prepare_store(c->s, keys + b, nb, nd, c->sl, NULL, NULL, 0, NULL);
        for (size_t i = 0; !rc && i < nb; i++)
            if (nd[i]) c->todo[m++] = keys[b + i];
        if (!rc && m) rc = kvo_store_complete_store(c->s, c->todo, m, true);
    }
    return rc;
}

int rp_cache_request(rp_cache *c, const kvo_chunk_key *keys, size_t len, size_t *hits) {
    int rc = rp_cache_hits(c, keys, 0, len, hits);
    /* vLLM touches a load's blocks deepest first: the root ends most recent */
    for (size_t i = *hits; !rc && c->ignore_present && i > 0; i--) rc = kvo_store_touch(c->s, &keys[i - 1], 1);
    return rc ? rc : rp_cache_store(c, keys, len, c->need);
}

uint64_t rp_cache_evictions(const rp_cache *c) {
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    return kvo_store_get_stats(c->s, &ss) ? 0 : ss.evictions;
}

int rp_replay_store(const rp_trace *t, kvo_policy_kind pol, uint64_t cap, bool ignore_present, rp_result *out) {
    memset(out, 0, sizeof *out);
    rp_cache c;
    int rc = rp_cache_open(&c, pol, cap, ignore_present, t->maxlen);
    kvo_chunk_key *keys = rc ? NULL : malloc((t->maxlen ? t->maxlen : 1) * sizeof *keys);
    if (!rc && !keys) rc = KVO_ENOMEM;
    for (size_t r = 0; !rc && r < t->nreq; r++) {
        size_t len = t->starts[r + 1] - t->starts[r], h = 0;
        if (!len) continue;
        for (size_t i = 0; i < len; i++) keys[i] = rp_trace_key(t->ids[t->starts[r] + i]);
        rc = rp_cache_request(&c, keys, len, &h);
        out->hits += h;
    }
    if (!rc) out->evictions = rp_cache_evictions(&c);
    out->blocks = t->nids;
    free(keys);
    if (c.s) rp_cache_close(&c);
    return rc;
}
