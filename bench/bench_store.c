/*
 * `kvoffload bench store [--json] [--keys N] [--ms MILLISECONDS] [--trace PATH]`
 *
 * Store index throughput on N keys (default 1 M), single thread:
 *   - lookup (READY keys, batches of 64, random order),
 *   - a full store cycle (prepare_store + complete_store of new keys into a
 *     full store, so every key evicts one),
 *   - touch;
 * each against a ceiling measured in the same run: per key one random read
 * of a table word and one dependent random read of a 64-byte entry, with the
 * same batch prefetching (the memory bound of a hash index with separate
 * entries of that size; no locking, no compares).  Goals (per core): lookup
 * >= 10 M keys/s, store cycle >= 2 M keys/s.
 *
 * Prefix hashing: kvo_hash_tokens ns per unit and GB/s of token bytes for
 * 16/32/64/256/100-token units, against raw XXH3-128 (inlined, same
 * compiler) over the same bytes (parent || tokens, one unit after another) in
 * the same run; goal >= 80 % of raw.  A second ratio compares with raw
 * XXH3-128 chained in place (each unit's parent field written from the
 * previous hash, then hashed where it lies): the chain makes each unit wait
 * for the last, which independent raw hashes do not.
 *
 * Space: the fraction of a full glm-5.3-flash-like store's bytes that hold
 * chunks under a mixed workload, against the capacity.
 *
 * Policies: prefix hit rates of LRU, ARC and S3-FIFO replaying the Mooncake
 * trace (shared/traces, 512-token blocks) at 10k and 30k blocks, against an
 * infinite cache on the same trace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "bench.h"
#include "cli.h"

static uint64_t bs_mix(uint64_t x) {
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

static kvo_chunk_key bs_key(uint64_t i) {
    kvo_chunk_key k;
    k.hash.lo = bs_mix(i);
    k.hash.hi = bs_mix(i ^ UINT64_C(0x5555));
    k.group = 0;
    k.reserved = 0;
    return k;
}

static volatile uint64_t bs_sink;

/* The memory bound of a hash index with separate entries: per key, one
 * random read of a table word (a table of 2 x keys words) and one dependent
 * random read of the 64-byte entry it points to, in batches of 64 with the
 * same two-stage prefetch as the store's lookup. */
static double bs_random_reads(uint64_t nkeys, double seconds) {
    uint64_t n = 1;
    while (n < nkeys * 2) n <<= 1;
    uint64_t *t = malloc(n * sizeof *t);
    uint64_t(*ent)[8] = malloc(nkeys * sizeof *ent);
    if (!t || !ent) {
        free(t);
        free(ent);
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) t[i] = bs_mix(i) % nkeys;
    for (uint64_t i = 0; i < nkeys; i++) ent[i][0] = i;
    uint64_t pos[64], sum = 0, done = 0, r = 1;
    double t0 = kvo_bench_now(), el;
    do {
        for (int b = 0; b < 64; b++) pos[b] = bs_mix(r++) & (n - 1);
        for (int b = 0; b < 64; b++) {
            if (b + 8 < 64) __builtin_prefetch(&t[pos[b + 8]]);
            if (b + 4 < 64) __builtin_prefetch(&ent[t[pos[b + 4]]]);
            sum += ent[t[pos[b]]][0];
        }
        done += 64;
        el = kvo_bench_now() - t0;
    } while (el < seconds);
    bs_sink = sum;
    free(t);
    free(ent);
    return (double)done / el;
}

static kvo_plan *bs_plan(void) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "kv");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = 4096;
    if (kvo_model_create("bench", 16, &m) || kvo_model_add_group(m, &g)) return NULL;
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    int rc = kvo_plan_create(m, &pp, &p);
    kvo_model_destroy(m);
    return rc ? NULL : p;
}

static int bs_index(const kvo_bench_out *o, uint64_t nkeys, double seconds) {
    kvo_plan *p = bs_plan();
    if (!p) return kvo_cli_fail("bench store", KVO_EINVAL);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = nkeys * 4096; /* address space only: the store owns no memory */
    kvo_store *s = NULL;
    int rc = kvo_store_create(&sp, &s);
    if (rc) {
        kvo_plan_destroy(p);
        return kvo_cli_fail("bench store", rc);
    }
    enum { B = 64 };
    kvo_chunk_key keys[B];
    uint8_t need[B], st[B];
    kvo_slot sl[B];
    /* fill */
    for (uint64_t i = 0; i < nkeys; i += B) {
        size_t n = nkeys - i < B ? (size_t)(nkeys - i) : B;
        for (size_t j = 0; j < n; j++) keys[j] = bs_key(i + j);
        if ((rc = kvo_store_prepare_store(s, keys, n, need, sl, NULL, NULL, 0, NULL)) ||
            (rc = kvo_store_complete_store(s, keys, n, true)))
            goto fail;
    }
    /* Alternate short rounds of the ceiling and each operation (the machine
     * is shared and noisy) and keep each one's best rate. */
    double ceiling = 0, lookup = 0, touch = 0, cycle = 0, slice = seconds / 5;
    uint64_t r = 7, next = nkeys;
    for (int round = 0; round < 5; round++) {
        double c = bs_random_reads(nkeys, slice);
        if (c > ceiling) ceiling = c;
        uint64_t done = 0;
        double t0 = kvo_bench_now(), el;
        do {
            /* live keys: the last nkeys stored */
            for (int j = 0; j < B; j++) keys[j] = bs_key(next - nkeys + bs_mix(r++) % nkeys);
            if ((rc = kvo_store_lookup(s, keys, B, st))) goto fail;
            done += B;
            el = kvo_bench_now() - t0;
        } while (el < slice);
        if ((double)done / el > lookup) lookup = (double)done / el;
        /* (after round 0, touches have reordered LRU: some old keys outlive new ones) */
        for (int j = 0; j < B && round == 0; j++)
            if (st[j] != KVO_READY) {
                fprintf(stderr, "bench store: a stored key was not READY\n");
                rc = KVO_ECORRUPT;
                goto fail;
            }
        done = 0;
        t0 = kvo_bench_now();
        do {
            for (int j = 0; j < B; j++) keys[j] = bs_key(next - nkeys + bs_mix(r++) % nkeys);
            if ((rc = kvo_store_touch(s, keys, B))) goto fail;
            done += B;
            el = kvo_bench_now() - t0;
        } while (el < slice);
        if ((double)done / el > touch) touch = (double)done / el;
        /* full store cycle: new keys into a full store, each evicting one */
        done = 0;
        t0 = kvo_bench_now();
        do {
            for (int j = 0; j < B; j++) keys[j] = bs_key(next++);
            if ((rc = kvo_store_prepare_store(s, keys, B, need, sl, NULL, NULL, 0, NULL)) ||
                (rc = kvo_store_complete_store(s, keys, B, true)))
                goto fail;
            done += B;
            el = kvo_bench_now() - t0;
        } while (el < slice);
        if ((double)done / el > cycle) cycle = (double)done / el;
    }
    kvo_store_stats ss;
    kvo_store_get_stats(s, &ss);
    char name[96];
    snprintf(name, sizeof name, "store.index_memory_ceiling_%llukeys", (unsigned long long)nkeys);
    kvo_bench_report(o, name, ceiling / 1e6, "Mkeys/s", NULL, 0);
    kvo_bench_report(o, "store.lookup", lookup / 1e6, "Mkeys/s", "index_memory_ceiling", ceiling / 1e6);
    kvo_bench_report(o, "store.store_cycle", cycle / 1e6, "Mkeys/s", "index_memory_ceiling", ceiling / 1e6);
    kvo_bench_report(o, "store.touch", touch / 1e6, "Mkeys/s", "index_memory_ceiling", ceiling / 1e6);
    if (!o->json) {
        printf("  goals per core: lookup >= 10 Mkeys/s (%s), store cycle >= 2 Mkeys/s (%s); %llu evictions\n",
               lookup >= 10e6 ? "met" : "not met", cycle >= 2e6 ? "met" : "not met",
               (unsigned long long)ss.evictions);
    }
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return 0;
fail:
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return kvo_cli_fail("bench store", rc);
}

static int bs_hash(const kvo_bench_out *o, double seconds) {
    static const uint32_t tphs[] = {16, 32, 64, 256, 100};
    const size_t units = 4096;
    for (size_t k = 0; k < sizeof tphs / sizeof tphs[0]; k++) {
        uint32_t tph = tphs[k];
        size_t ntok = units * tph;
        uint32_t *tok = malloc(ntok * sizeof *tok);
        kvo_u128 *out = malloc(units * sizeof *out);
        size_t ulen = 16 + (size_t)tph * 4;
        unsigned char *raw = malloc(units * ulen);
        if (!tok || !out || !raw) {
            free(tok); free(out); free(raw);
            return kvo_cli_fail("bench store", KVO_ENOMEM);
        }
        for (size_t i = 0; i < ntok; i++) tok[i] = (uint32_t)bs_mix(i);
        for (size_t u = 0; u < units; u++) {
            memset(raw + u * ulen, (int)u, 16);
            memcpy(raw + u * ulen + 16, tok + u * tph, (size_t)tph * 4);
        }
        kvo_u128 ns = kvo_keys_namespace((kvo_u128){1, 2}, NULL, 0);
        /* alternate short rounds of raw and kvo (the machine is shared and
         * noisy) and keep each one's best */
        double raw_ns = 1e30, kvo_ns = 1e30, chain_ns = 1e30;
        double t_end = kvo_bench_now() + seconds;
        for (int round = 0; round < 200 && (round < 6 || kvo_bench_now() < t_end); round++) {
            uint64_t acc = 0;
            double t0 = kvo_bench_now();
            for (size_t u = 0; u < units; u++) {
                XXH128_hash_t h = XXH3_128bits(raw + u * ulen, ulen);
                acc += h.low64;
            }
            double el = kvo_bench_now() - t0;
            bs_sink = acc;
            if (el * 1e9 / (double)units < raw_ns) raw_ns = el * 1e9 / (double)units;
            /* raw, chained in place: each unit's first 16 bytes are the
             * previous hash (the format's dependency, no copying) */
            XXH128_hash_t ch = {1, 2};
            t0 = kvo_bench_now();
            for (size_t u = 0; u < units; u++) {
                memcpy(raw + u * ulen, &ch.low64, 8);
                memcpy(raw + u * ulen + 8, &ch.high64, 8);
                ch = XXH3_128bits(raw + u * ulen, ulen);
            }
            el = kvo_bench_now() - t0;
            bs_sink = ch.low64;
            if (el * 1e9 / (double)units < chain_ns) chain_ns = el * 1e9 / (double)units;
            size_t n_out = 0;
            t0 = kvo_bench_now();
            if (kvo_hash_tokens(ns, tok, ntok, tph, NULL, 0, out, units, &n_out)) break;
            el = kvo_bench_now() - t0;
            if (el * 1e9 / (double)units < kvo_ns) kvo_ns = el * 1e9 / (double)units;
        }
        double tok_bytes = (double)tph * 4;
        char name[96];
        snprintf(name, sizeof name, "keys.hash_ns_per_unit_%utok", tph);
        /* ns: lower is better, so the limit is given as raw's ns (ratio > 1 = slower) */
        kvo_bench_report(o, name, kvo_ns, "ns", "raw_xxh3_128_ns_same_bytes", raw_ns);
        snprintf(name, sizeof name, "keys.hash_gbps_%utok", tph);
        kvo_bench_report(o, name, tok_bytes / kvo_ns, "GB/s", "raw_xxh3_128_same_bytes", tok_bytes / raw_ns);
        /* the same against raw XXH3-128 with the chain's dependency (each unit
         * waits for the previous hash), which no implementation can avoid */
        snprintf(name, sizeof name, "keys.hash_gbps_vs_chained_raw_%utok", tph);
        kvo_bench_report(o, name, tok_bytes / kvo_ns, "GB/s", "raw_xxh3_128_chained_in_place", tok_bytes / chain_ns);
        
        free(tok);
        free(out);
        free(raw);
    }
    return 0;
}

/* Space: GLM-like plan, 64 GiB store (address space only), mixed workload. */
static int bs_space(const kvo_bench_out *o) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    int rc = kvo_model_preset("glm-5.3-flash-like", &m);
    if (!rc) rc = kvo_plan_create(m, NULL, &p);
    kvo_model_destroy(m);
    if (rc) return kvo_cli_fail("bench store", rc);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = UINT64_C(64) << 30;
    kvo_store *s = NULL;
    if ((rc = kvo_store_create(&sp, &s))) {
        kvo_plan_destroy(p);
        return kvo_cli_fail("bench store", rc);
    }
    static kvo_chunk_key keys[1024];
    static uint8_t need[1024];
    static kvo_slot sl[1024];
    size_t ng = kvo_plan_num_groups(p);
    double min_u = 1.0, sum_u = 0;
    uint64_t samples = 0;
    for (uint64_t q = 0; q < 2000; q++) {
        uint64_t units = (3584 / 64) * (1 + bs_mix(q) % 6) + bs_mix(q + 99) % 56;
        size_t n = 0;
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded) continue;
            for (uint64_t c = 0; c < units / gp->hashes_per_chunk && n < 1024; c++) {
                keys[n].hash.lo = bs_mix(q * 1000003 + c * 131 + g);
                keys[n].hash.hi = q;
                keys[n].group = (uint32_t)g;
                keys[n].reserved = 0;
                n++;
            }
        }
        if ((rc = kvo_store_prepare_store(s, keys, n, need, sl, NULL, NULL, 0, NULL)) ||
            (rc = kvo_store_complete_store(s, keys, n, true)))
            break;
        kvo_store_stats ss;
        kvo_store_get_stats(s, &ss);
        if (q >= 1000) {
            double u = (double)ss.bytes_used / (double)ss.capacity_bytes;
            if (u < min_u) min_u = u;
            sum_u += u;
            samples++;
        }
    }
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    if (rc) return kvo_cli_fail("bench store", rc);
    kvo_bench_report(o, "store.glm_full_bytes_holding_chunks_min", min_u * 64, "GiB", "capacity", 64);
    kvo_bench_report(o, "store.glm_full_bytes_holding_chunks_mean", sum_u / (double)samples * 64, "GiB",
                     "capacity", 64);
    return 0;
}

/* ------------------------------------------------------------ trace -- */

/* The Mooncake trace (shared/traces): per request, the prefix-chained ids of
 * its 512-token blocks.  Replayed through a store of one group with one slot
 * per block: a request's prefix hits are its leading READY blocks; then every
 * block of the request is stored (present ones count as used).  The limit is
 * an infinite cache's prefix hit rate over the same trace in the same run. */
typedef struct bs_trace {
    uint64_t *ids;
    size_t *start; /* request r: ids[start[r] .. start[r+1]) */
    size_t nreq, nids;
} bs_trace;

static int bs_trace_load(const char *path, bs_trace *t) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t cap_ids = 1 << 17, cap_req = 1 << 12;
    t->ids = malloc(cap_ids * sizeof *t->ids);
    t->start = malloc((cap_req + 1) * sizeof *t->start);
    t->nreq = t->nids = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (t->ids && t->start && getline(&line, &lcap, f) > 0) {
        char *p = strstr(line, "\"hash_ids\"");
        if (!p || !(p = strchr(p, '['))) continue;
        if (t->nreq + 1 >= cap_req) {
            cap_req *= 2;
            size_t *ns = realloc(t->start, (cap_req + 1) * sizeof *ns);
            if (!ns) break;
            t->start = ns;
        }
        t->start[t->nreq] = t->nids;
        p++;
        for (;;) {
            while (*p == ' ' || *p == ',') p++;
            if (*p < '0' || *p > '9') break;
            if (t->nids == cap_ids) {
                cap_ids *= 2;
                uint64_t *ni = realloc(t->ids, cap_ids * sizeof *ni);
                if (!ni) break;
                t->ids = ni;
            }
            t->ids[t->nids++] = strtoull(p, &p, 10);
        }
        t->nreq++;
    }
    free(line);
    fclose(f);
    if (!t->ids || !t->start || t->nreq == 0) return -1;
    t->start[t->nreq] = t->nids;
    return 0;
}

/* Prefix hit rate of an infinite cache: a block hits when it was seen before
 * and every block before it in the request hit. */
static double bs_trace_infinite(const bs_trace *t) {
    uint64_t n = 1;
    while (n < t->nids * 2) n <<= 1;
    uint64_t *set = malloc(n * sizeof *set);
    if (!set) return 0;
    memset(set, 0xFF, n * sizeof *set);
    uint64_t hits = 0;
    for (size_t r = 0; r < t->nreq; r++) {
        bool prefix = true;
        for (size_t i = t->start[r]; i < t->start[r + 1]; i++) {
            uint64_t id = t->ids[i], h = bs_mix(id) & (n - 1);
            bool found = false;
            while (set[h] != UINT64_MAX) {
                if (set[h] == id) { found = true; break; }
                h = (h + 1) & (n - 1);
            }
            if (!found) set[h] = id;
            prefix = prefix && found;
            hits += prefix;
        }
    }
    free(set);
    return (double)hits / (double)t->nids;
}

static double bs_trace_replay(const bs_trace *t, kvo_policy_kind pol, uint64_t blocks, int *rc_out) {
    kvo_plan *p = bs_plan();
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = blocks * 4096;
    sp.policy = pol;
    kvo_store *s = NULL;
    int rc = p ? kvo_store_create(&sp, &s) : KVO_EINVAL;
    size_t maxn = 0;
    for (size_t r = 0; r < t->nreq; r++)
        if (t->start[r + 1] - t->start[r] > maxn) maxn = t->start[r + 1] - t->start[r];
    kvo_chunk_key *keys = malloc((maxn + 1) * sizeof *keys);
    kvo_chunk_key *todo = malloc((maxn + 1) * sizeof *todo);
    uint8_t *st = malloc(maxn + 1), *need = malloc(maxn + 1);
    kvo_slot *sl = malloc((maxn + 1) * sizeof *sl);
    uint64_t hits = 0;
    if (!keys || !todo || !st || !need || !sl) rc = rc ? rc : KVO_ENOMEM;
    for (size_t r = 0; !rc && r < t->nreq; r++) {
        size_t n = t->start[r + 1] - t->start[r];
        if (!n) continue;
        for (size_t i = 0; i < n; i++) {
            uint64_t id = t->ids[t->start[r] + i];
            keys[i].hash.lo = bs_mix(id);
            keys[i].hash.hi = id;
            keys[i].group = 0;
            keys[i].reserved = 0;
        }
        if ((rc = kvo_store_lookup(s, keys, n, st))) break;
        size_t h = 0;
        while (h < n && st[h] == KVO_READY) h++;
        hits += h;
        if ((rc = kvo_store_prepare_store(s, keys, n, need, sl, NULL, NULL, 0, NULL))) break;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) if (need[i]) todo[m++] = keys[i];
        if (m && (rc = kvo_store_complete_store(s, todo, m, true))) break;
    }
    free(keys);
    free(todo);
    free(st);
    free(need);
    free(sl);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    *rc_out = rc;
    return (double)hits / (double)t->nids;
}

static int bs_trace_bench(const kvo_bench_out *o, const char *path) {
    static const char *const tries[] = {"../shared/traces/mooncake_synthetic_trace.jsonl",
                                        "shared/traces/mooncake_synthetic_trace.jsonl",
                                        "../../shared/traces/mooncake_synthetic_trace.jsonl"};
    bs_trace t;
    memset(&t, 0, sizeof t);
    int loaded = -1;
    if (path) loaded = bs_trace_load(path, &t);
    for (size_t i = 0; !path && loaded && i < sizeof tries / sizeof tries[0]; i++) loaded = bs_trace_load(tries[i], &t);
    if (loaded) {
        free(t.ids);
        free(t.start);
        if (path) {
            fprintf(stderr, "kvoffload bench store: cannot read the trace '%s'\n", path);
            return KVO_EXIT_FAIL;
        }
        if (!o->json) printf("  (Mooncake trace not found: pass --trace PATH for the policy hit rates)\n");
        return 0;
    }
    double inf = bs_trace_infinite(&t);
    static const uint64_t caps[] = {10000, 30000};
    static const kvo_policy_kind pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO};
    int rc = 0;
    for (size_t c = 0; c < 2 && !rc; c++)
        for (size_t k = 0; k < 3 && !rc; k++) {
            double hr = bs_trace_replay(&t, pols[k], caps[c], &rc);
            if (rc) break;
            char name[96];
            snprintf(name, sizeof name, "store.trace_prefix_hit_rate_%s_%llublocks", kvo_policy_name(pols[k]),
                     (unsigned long long)caps[c]);
            kvo_bench_report(o, name, 100 * hr, "%", "infinite_cache", 100 * inf);
        }
    free(t.ids);
    free(t.start);
    return rc ? kvo_cli_fail("bench store", rc) : 0;
}

int kvo_bench_store(int argc, char **argv, const kvo_bench_out *o) {
    uint64_t nkeys = 1000000, ms = 300;
    const char *trace = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvoffload bench store [--json] [--keys N] [--ms MILLISECONDS] [--trace PATH]\n"
                   "  index lookup/store/touch throughput on N keys (default 1000000) vs the index memory\n"
                   "  ceiling, prefix hashing vs raw XXH3-128, space use of a full GLM-like store, and the\n"
                   "  policies' prefix hit rates on the Mooncake trace (default ../shared/traces/...).\n");
            return KVO_EXIT_OK;
        } else if (!strcmp(argv[i], "--keys") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--keys", argv[++i], 1024, UINT64_C(1) << 28, &nkeys)) return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            trace = argv[++i];
        } else if (!strcmp(argv[i], "--ms") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--ms", argv[++i], 10, 60000, &ms)) return KVO_EXIT_USAGE;
        } else {
            fprintf(stderr, "kvoffload bench store: unknown option '%s' (--help)\n", argv[i]);
            return KVO_EXIT_USAGE;
        }
    }
    if (trace && kvo_cli_input_file("bench store", "--trace", trace)) return KVO_EXIT_USAGE;
    double sec = (double)ms / 1000.0;
    int rc = bs_index(o, nkeys, sec);
    if (rc) return rc;
    rc = bs_hash(o, sec);
    if (rc) return rc;
    rc = bs_space(o);
    if (rc) return rc;
    return bs_trace_bench(o, trace);
}
