/*
 * Presence: what the Redis Cluster tier said it holds, without waiting for
 * it.
 *
 * A lookup must know which keys the host and file tiers miss that the
 * cluster holds, and must not stall the engine for the answer.  The map
 * c->presence holds, per chunk key, IN FLIGHT (an EXISTS query is queued),
 * PRESENT or ABSENT, with the time it was asked or answered.  A lookup uses
 * an answer younger than remote_exists_ttl_ms; a key without one gets a
 * query (one kvo_remote_tier_exists batch per set of keys) and counts as
 * PENDING while the caller's budget lasts (a kvo_cascade_wait per request:
 * remote_lookup_budget_us from its first lookup that waited; it starts
 * again once every answer is in), as MISS after.  A node that is down
 * answers EIO at once, recorded ABSENT for the TTL: a dead cluster costs
 * one failed query per key per TTL and never a wait.
 *
 * A put by this cascade makes the key's answer PRESENT: a remembered
 * ABSENT at once, and a query still in flight when it lands (IN FLIGHT,
 * PUT): Redis read the key before the put, so its "absent" is stale.  An
 * engine may store a key while its query runs (a lookup that answered
 * without waiting, or vLLM computing a request once one group's key
 * missed); taken as it is, the next lookup after the host tier dropped the
 * chunk would miss until the answer expired.  A stale PRESENT only makes a
 * get fail (a miss, which records ABSENT): never wrong bytes, since the
 * tier verifies every value.
 *
 * The map is bounded (KVO__PRES_MAX entries): when full it is emptied (the
 * answers are a cache; completions of queries it forgot are ignored), and
 * a query older than KVO__PRES_STALE_NS is asked again.
 */
#include "cascade/cascade_internal.h"

#define KVO__PRES_MAX (1u << 16)
#define KVO__PRES_STALE_NS (10ull * 1000000000ull)

static kvo__pres *kvo__pres_find(kvo_cascade *c, const kvo_chunk_key *k) {
    return kvo__hmap_find(&c->presence, k->hash.lo, kvo__casc_k1(k));
}

/* Find or insert (NULL when the map is full or out of memory). */
static kvo__pres *kvo__pres_put(kvo_cascade *c, const kvo_chunk_key *k) {
    kvo__pres *e = kvo__pres_find(c, k);
    if (e) return e;
    if (c->presence.n >= KVO__PRES_MAX || kvo__hmap_reserve(&c->presence, 1, 256, "cascade: presence answers"))
        return NULL;
    bool existed;
    return kvo__hmap_insert(&c->presence, k->hash.lo, kvo__casc_k1(k), &existed);
}

static void kvo__pres_set(kvo_cascade *c, const kvo_chunk_key *k, uint32_t state, bool insert) {
    kvo__pres *e = insert ? kvo__pres_put(c, k) : kvo__pres_find(c, k);
    if (!e) return;
    e->state = state;
    e->t = kvo__now_ns();
}

void kvo__casc_pres_begin(kvo_cascade *c, kvo_cascade_wait *w, bool force_wait, kvo__casc_round *rr) {
    rr->now = kvo__now_ns();
    rr->ttl = (uint64_t)c->p.remote_exists_ttl_ms * 1000000u;
    uint64_t budget = (uint64_t)c->p.remote_lookup_budget_us * 1000u;
    rr->wait = force_wait || (w && (w->since_ns ? rr->now - w->since_ns < budget : budget > 0));
    rr->inflight = false;
    if (c->presence.n >= KVO__PRES_MAX) { /* a cache: start over */
        kvo__hmap_free(&c->presence);
        (void)kvo__hmap_init(&c->presence, sizeof(kvo__pres), 256, "cascade: presence answers");
    }
}

void kvo__casc_pres_ask(kvo_cascade *c, kvo__casc_round *rr, const kvo_chunk_key *keys, size_t n,
                        const size_t *idx, uint8_t *states, uint8_t *tiers) {
    if (!c->remote || !n) return;
    enum { B = 64 };
    kvo_chunk_key q[B];
    size_t qat[B], nq = 0;
    int res[B];
    for (size_t i = 0; i <= n; i++) {
        if (i < n) {
            size_t at = idx ? idx[i] : i;
            if (states[at] != KVO_MISS || !kvo__casc_uses(c, KVO_TIER_REMOTE, keys[i].group)) continue;
            kvo__pres *e = kvo__pres_find(c, &keys[i]);
            bool out = e && (e->state == KVO__PRES_INFLIGHT || e->state == KVO__PRES_INFLIGHT_PUT);
            if (e && !out && rr->now - e->t < rr->ttl) {
                if (e->state == KVO__PRES_PRESENT) {
                    states[at] = KVO_READY;
                    if (tiers) tiers[at] = KVO_TIER_REMOTE;
                }
                continue;
            }
            if (out && rr->now - e->t < KVO__PRES_STALE_NS) {
                rr->inflight = true;
                if (rr->wait) {
                    states[at] = KVO_PENDING;
                    if (tiers) tiers[at] = KVO_TIER_REMOTE;
                }
                continue;
            }
            if (!(e = kvo__pres_put(c, &keys[i]))) continue; /* full: no answer this time */
            e->state = KVO__PRES_INFLIGHT;
            e->t = rr->now;
            q[nq] = keys[i];
            qat[nq++] = at;
            if (nq < B) continue;
        }
        if (!nq) continue;
        size_t queued = 0;
        int rc = kvo_remote_tier_exists(c->remote, q, nq, NULL, res, &queued);
        for (size_t k = 0; k < nq; k++) {
            if (rc == 0 && res[k] == 0) {
                rr->inflight = true;
                if (rr->wait) {
                    states[qat[k]] = KVO_PENDING;
                    if (tiers) tiers[qat[k]] = KVO_TIER_REMOTE;
                }
                continue;
            }
            kvo__pres *e = kvo__pres_find(c, &q[k]); /* refused: still unknown */
            if (e) kvo__hmap_erase(&c->presence, e);
            c->st.remote_exists_refused++;
        }
        c->st.remote_exists += queued;
        nq = 0;
    }
}

void kvo__casc_pres_end(kvo_cascade *c, kvo_cascade_wait *w, const kvo__casc_round *rr) {
    if (!rr->inflight) {
        if (w) w->since_ns = 0; /* every answer is in: the next wait gets a fresh budget */
        return;
    }
    if (w && !w->since_ns) w->since_ns = rr->now;
    if (!rr->wait) c->st.remote_budget_expired++;
}

void kvo__casc_pres_answer(kvo_cascade *c, const kvo_chunk_key *k, int result) {
    kvo__pres *e = kvo__pres_find(c, k);
    if (!e) return;
    /* EIO (a node down) counts as absent for the TTL: no query storm against
     * a dead node, no wait */
    if (e->state == KVO__PRES_INFLIGHT) kvo__pres_set(c, k, result == 0 ? KVO__PRES_PRESENT : KVO__PRES_ABSENT, false);
    else if (e->state == KVO__PRES_INFLIGHT_PUT) kvo__pres_set(c, k, KVO__PRES_PRESENT, false);
}

void kvo__casc_pres_put(kvo_cascade *c, const kvo_chunk_key *k) {
    kvo__pres *e = kvo__pres_find(c, k);
    if (e) kvo__pres_set(c, k, e->state == KVO__PRES_INFLIGHT ? KVO__PRES_INFLIGHT_PUT : KVO__PRES_PRESENT, false);
}

void kvo__casc_pres_absent(kvo_cascade *c, const kvo_chunk_key *k) { kvo__pres_set(c, k, KVO__PRES_ABSENT, true); }

bool kvo__casc_pres_present(kvo_cascade *c, const kvo_chunk_key *k) {
    kvo__pres *e = kvo__pres_find(c, k);
    return e && e->state == KVO__PRES_PRESENT &&
           kvo__now_ns() - e->t < (uint64_t)c->p.remote_exists_ttl_ms * 1000000u;
}
