/*
 * Fleets for `kvoffload replay --engines N`: a trace routed over N engines,
 * each with its own host tier, and optionally one remote tier (a Redis
 * Cluster) that all of them share.  docs/replay.md, "Fleets".
 *
 * Model, per request, on the engine routing picks:
 *  1. its prefix hits in the engine's host tier (lookup, as the single-engine
 *     replay: rp_cache_request);
 *  2. the prefix continued from the shared tier: the blocks after the host
 *     hits that the shared tier holds, up to its first miss (the connector's
 *     lookup order host -> remote); they are read over the network, a GET
 *     each, and a GET is a use (Redis's allkeys-lru);
 *  3. the store of all its blocks into the host tier (loaded ones included,
 *     as the connector reads remote chunks into host slots), then the
 *     write-through of the blocks stored anew there and not just read from
 *     the shared tier: one SET each, a use of a present key.
 * The host tiers see the same calls whatever the shared tier holds, so one
 * pass replays every shared capacity at once (one kvo_store per capacity,
 * none for 0): the fleet's hit count can only grow with a shared tier, per
 * engine, and the host-only figures are the 0 entry.
 *
 * Routing: round-robin (request r on engine r mod N); session (a hash of the
 * session: the line's "session_id", else inferred, see rp_sessions); and
 * prefix-hash (a hash of the id of block prefix_blocks - 1, which, the ids
 * being prefix-chained, names the whole first prefix_blocks blocks).
 * Memory: the index of each store (no slot bytes), an id -> last request
 * table for the session inference; O(1) store calls per block.
 */
#include <stdlib.h>
#include <string.h>

#include "replay.h"

const char *const rp_routing_names[RP_ROUTE_COUNT] = {"round-robin", "session", "prefix-hash"};

/* Sessions of a trace without session ids: a request continues the
 * conversation of the latest request q that shares its longest prefix when
 * that prefix covers q but at most max(1, len(q) / 8) of its last blocks (a
 * turn repeats the previous prompt, whose last block may be partial, and
 * some chats trim their history); otherwise it starts one.  A request that
 * shares only a system prompt starts its own.  Given session_ids win. */
static int rp_sessions(const rp_trace *t, uint64_t *sess) {
    uint32_t *last = malloc((t->ndistinct ? t->ndistinct : 1) * sizeof *last);
    if (!last) return KVO_ENOMEM;
    memset(last, 0xFF, (t->ndistinct ? t->ndistinct : 1) * sizeof *last);
    for (size_t r = 0; r < t->nreq; r++) {
        const uint32_t *ids = t->ids + t->starts[r];
        size_t len = t->starts[r + 1] - t->starts[r], p = 0;
        while (p < len && last[ids[p]] != UINT32_MAX) p++;
        sess[r] = rp_mix(((uint64_t)r << 1) | 1); /* a new one */
        if (p) {
            uint32_t q = last[ids[p - 1]];
            size_t lq = t->starts[q + 1] - t->starts[q], slack = lq / 8 ? lq / 8 : 1;
            if (p + slack >= lq) sess[r] = sess[q];
        }
        if (t->session[r] != RP_NO_SESSION) sess[r] = t->session[r];
        for (size_t i = 0; i < len; i++) last[ids[i]] = (uint32_t)r;
    }
    free(last);
    return 0;
}

static size_t rp_route(const rp_trace *t, const rp_fleet_params *p, const uint64_t *sess, size_t r) {
    size_t len = t->starts[r + 1] - t->starts[r];
    uint64_t h;
    if (p->routing == RP_ROUTE_SESSION) h = rp_mix(sess[r] ^ UINT64_C(0x5E55));
    else if (p->routing == RP_ROUTE_PREFIX && len) {
        size_t k = len < p->prefix_blocks ? len : p->prefix_blocks;
        h = rp_mix((uint64_t)t->ids[t->starts[r] + k - 1] + 1);
    } else return r % p->engines;
    return (size_t)(h % p->engines);
}

int rp_replay_fleet(const rp_trace *t, const rp_fleet_params *p, rp_fleet_cell *cells, uint64_t *shared_evictions) {
    size_t N = p->engines, S = p->nshared, n = t->maxlen ? t->maxlen : 1;
    memset(cells, 0, S * N * sizeof *cells);
    if (shared_evictions) memset(shared_evictions, 0, S * sizeof *shared_evictions);
    rp_cache *host = calloc(N, sizeof *host), *shared = calloc(S, sizeof *shared);
    kvo_chunk_key *keys = malloc(n * sizeof *keys), *put = malloc(n * sizeof *put);
    uint64_t *sess = p->routing == RP_ROUTE_SESSION ? malloc((t->nreq ? t->nreq : 1) * sizeof *sess) : NULL;
    int rc = host && shared && keys && put && (sess || p->routing != RP_ROUTE_SESSION) ? 0 : KVO_ENOMEM;
    if (!rc && sess) rc = rp_sessions(t, sess);
    for (size_t e = 0; !rc && e < N; e++) rc = rp_cache_open(&host[e], p->pol, p->cap, p->ignore_present, n);
    for (size_t s = 0; !rc && s < S; s++)
        if (p->shared_caps[s]) rc = rp_cache_open(&shared[s], p->shared_pol, p->shared_caps[s], false, n);
    for (size_t r = 0; !rc && r < t->nreq; r++) {
        size_t len = t->starts[r + 1] - t->starts[r], e = rp_route(t, p, sess, r), hl = 0;
        for (size_t s = 0; s < S; s++) cells[s * N + e].requests++, cells[s * N + e].blocks += len;
        if (!len) continue;
        for (size_t i = 0; i < len; i++) keys[i] = rp_trace_key(t->ids[t->starts[r] + i]);
        rc = rp_cache_request(&host[e], keys, len, &hl);
        for (size_t s = 0; !rc && s < S; s++) {
            rp_fleet_cell *cell = &cells[s * N + e];
            cell->local_hits += hl;
            if (!p->shared_caps[s]) continue;
            size_t sh = 0, m = 0;
            rc = rp_cache_hits(&shared[s], keys, hl, len, &sh);
            if (!rc && sh) rc = kvo_store_touch(shared[s].s, keys + hl, sh); /* the GETs */
            for (size_t i = 0; i < len; i++)
                if (host[e].need[i] && (i < hl || i >= hl + sh)) put[m++] = keys[i];
            if (!rc && m) rc = rp_cache_store(&shared[s], put, m, NULL);
            cell->shared_hits += sh;
            cell->shared_puts += m;
        }
    }
    for (size_t s = 0; !rc && shared_evictions && s < S; s++)
        shared_evictions[s] = p->shared_caps[s] ? rp_cache_evictions(&shared[s]) : 0;
    for (size_t e = 0; host && e < N; e++) rp_cache_close(&host[e]);
    for (size_t s = 0; shared && s < S; s++) rp_cache_close(&shared[s]);
    free(host); free(shared); free(keys); free(put); free(sess);
    return rc;
}
