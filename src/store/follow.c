/*
 * Shadows for the ensemble policy (policy_ensemble.c): which keys the
 * policies it listens to would no longer hold, and how much each is worth
 * listening to.
 *
 * A shadow is a kvo_store of its own with the real store's plan, capacity
 * and parameters (a store only accounts for slots; no bytes are written
 * anywhere), running one candidate: LRU, ARC, S3-FIFO, or the prefix
 * policy at one fixed setting of its knobs (policy_prefix.c; no
 * simulations).  The real store hands each shadow every call that changes
 * what a store holds, before doing its own work (store, touch, remove,
 * clear, through kvo__policy_ops.observe: kvo__follow_observe); a shadow
 * completes its stores at once.  The calls a store gets do not depend on what it holds (a
 * request's keys are looked up and stored whatever hits), so each shadow
 * holds exactly what its policy would hold had it run the store alone, and
 * hits as it would have.
 *
 * Layout: for each real entry a mask, bit i set when shadow i does not
 * hold the entry's key, and one pair of links: the entry is in list
 * `mask` (one list per non-zero mask, 2^KVO__FOLLOW_MAX at most, with a
 * bitmap of the non-empty ones).  A shadow's eviction sets its bit on the
 * real entry of the key (an index probe, kvo__follow_evicted, called from
 * the shadow's commit); an entry that joins the real store's queue (a use,
 * a store) gets its mask by probing every shadow (kvo__follow_join).
 * Invariant (kvo__follow_check): a queued entry's mask is exactly the set
 * of shadows without its key.
 *
 * Scores and the vote: each lookup is scored in every shadow as the caller
 * scores it, by its leading READY keys (the prefix hits), with exponential
 * decay over the keys looked up (half-life KVO__FOLLOW_HL fills of the
 * store).  A shadow's weight is 1 at the best score, falling
 * linearly to 0 at KVO__FOLLOW_DELTA below it; the victim is the oldest
 * entry of the non-empty list whose mask weighs most (ties: the lower
 * mask), or the real store's own LRU order when no shadow has evicted
 * anything it holds.  While the shadows agree the store evicts what they
 * all evict; when one shadow does clearly best the store follows it alone,
 * and once it holds what that shadow holds it evicts key for key what the
 * shadow evicts.
 *
 * Why a vote and not the leader (docs/replay.md has the sweeps): following
 * the best shadow alone loses each change of leader and the start before
 * one leads (Mooncake: 39 of 84 capacities below the best of LRU, ARC and
 * S3-FIFO), while entries that all the good shadows have evicted are safe
 * victims whichever of them would have won (5 of 84).  What a vote loses:
 * shadows that tie but hold different keys (LRU and two protecting settings
 * on chat traffic) are worse mixed than each alone, so the store falls up
 * to 0.25 points below LRU there, where the prefix policy never does.
 *
 * Cost: each call is made once more per shadow; the vote reads the weights
 * of the non-empty lists (at most 2^KVO__FOLLOW_MAX, O(1)); a use probes
 * each shadow's index once.  Memory: each shadow's entries and index (the
 * prefix settings keep 4 ghosts per entry); here 9 bytes per entry.  Not
 * thread-safe: the real store's lock covers the shadows (only its calls
 * reach them).
 */
#include <math.h>

#include "store/store_internal.h"

#define KVO__FOLLOW_HL 16.0     /* score memory, in fills of the store */
#define KVO__FOLLOW_DELTA 0.005 /* a shadow this far below the best score has no vote */
#define FNIL UINT32_MAX
#define NMASK (1u << KVO__FOLLOW_MAX)

/* The candidates: a policy, and for prefix its fixed setting (an index into
 * kvo__mini_knob8 / kvo__mini_ghostw: A = infinity and 2 cache sizes with
 * W = 4, A = infinity and 1 cache size with W = 1). */
static const struct {
    kvo_policy_kind pol;
    int setting;
} kvo__follow_cand[] = {
    {KVO_POLICY_LRU, -1},   {KVO_POLICY_ARC, -1},   {KVO_POLICY_S3FIFO, -1}, {KVO_POLICY_PREFIX, 5},
    {KVO_POLICY_PREFIX, 3}, {KVO_POLICY_PREFIX, 9}, {KVO_POLICY_PREFIX, 7},
};
#define KVO__FOLLOW_N (sizeof kvo__follow_cand / sizeof kvo__follow_cand[0])
_Static_assert(KVO__FOLLOW_N <= KVO__FOLLOW_MAX, "a mask holds a bit per shadow");

struct kvo__follow {
    uint32_t n;
    kvo_store *sh[KVO__FOLLOW_MAX];
    double score[KVO__FOLLOW_MAX];
    double weight[NMASK]; /* by mask: the sum of its shadows' weights */
    double log_decay;     /* per key looked up */
    uint8_t *mask;        /* [e] */
    uint32_t *link;       /* [e][2]: prev, next in list mask[e] */
    uint32_t head[NMASK], tail[NMASK];
    uint64_t nonempty[NMASK / 64];
    /* scratch for the shadows' calls, grown together (kvo__grow_all) */
    uint8_t *need, *st;
    kvo_slot *slots;
    kvo_chunk_key *todo;
    size_t cap;
};

void kvo__follow_destroy(kvo__follow *f) {
    if (!f) return;
    for (uint32_t i = 0; i < f->n; i++) kvo_store_destroy(f->sh[i]);
    kvo__free(f->mask);
    kvo__free(f->link);
    kvo__free(f->need);
    kvo__free(f->st);
    kvo__free(f->slots);
    kvo__free(f->todo);
    kvo__free(f);
}

static void kvo__follow_weigh(kvo__follow *f) {
    double best = 0, w[KVO__FOLLOW_MAX];
    for (uint32_t i = 0; i < f->n; i++)
        if (f->score[i] > best) best = f->score[i];
    for (uint32_t i = 0; i < f->n; i++) {
        double gap = best > 0 ? (best - f->score[i]) / (best * KVO__FOLLOW_DELTA) : 0;
        w[i] = gap < 1 ? 1 - gap : 0;
    }
    f->weight[0] = 0;
    for (uint32_t m = 1; m < (1u << f->n); m++) f->weight[m] = f->weight[m & (m - 1)] + w[__builtin_ctz(m)];
}

static void kvo__follow_evicted(kvo_store *s, uint32_t i, const kvo_chunk_key *k);

int kvo__follow_create(kvo_store *s, kvo__follow **out) {
    static const char msg[] = "kvo_store_create: out of memory for the ensemble policy's shadows";
    *out = NULL;
    kvo__follow *f = kvo__calloc(1, sizeof *f);
    if (!f) return kvo__error(KVO_ENOMEM, msg);
    f->mask = kvo__calloc(s->pool_cap, 1);
    f->link = kvo__malloc((size_t)s->pool_cap * 2 * sizeof *f->link);
    int rc = f->mask && f->link ? 0 : kvo__error(KVO_ENOMEM, msg);
    for (uint32_t m = 0; m < NMASK; m++) f->head[m] = f->tail[m] = FNIL;
    f->log_decay = log1p(-1.0 / ((double)s->max_entries * KVO__FOLLOW_HL));
    for (uint32_t i = 0; !rc && i < KVO__FOLLOW_N; i++) {
        kvo_store_params p = s->params;
        p.policy = kvo__follow_cand[i].pol;
        p.event_capacity = 0;
        kvo__shadow_of sh = {s, i, kvo__follow_cand[i].setting, kvo__follow_evicted};
        rc = kvo__store_create_shadow(&p, &sh, &f->sh[i]);
        if (rc) rc = kvo__error_prefix(rc, "the ensemble policy's shadow %u (%s, as large as the store)", i,
                                       kvo_policy_name(p.policy));
        else f->n++;
    }
    if (rc) {
        kvo__follow_destroy(f);
        return rc;
    }
    kvo__follow_weigh(f);
    *out = f;
    return 0;
}

static int kvo__follow_scratch(kvo__follow *f, size_t n) {
    if (n <= f->cap) return 0;
    const kvo__arr a[] = {{(void **)&f->need, sizeof *f->need},   {(void **)&f->st, sizeof *f->st},
                          {(void **)&f->slots, sizeof *f->slots}, {(void **)&f->todo, sizeof *f->todo}};
    return kvo__grow_all(&f->cap, n, a, sizeof a / sizeof a[0], 64, "the ensemble policy's shadows");
}

/* ------------------------------------------------------ the mask lists -- */

static void kvo__follow_unlink(kvo__follow *f, uint32_t e) {
    uint32_t m = f->mask[e], *l = &f->link[(size_t)e * 2];
    if (!m) return;
    if (l[0] != FNIL) f->link[(size_t)l[0] * 2 + 1] = l[1]; else f->head[m] = l[1];
    if (l[1] != FNIL) f->link[(size_t)l[1] * 2] = l[0]; else f->tail[m] = l[0];
    if (f->head[m] == FNIL) f->nonempty[m / 64] &= ~(UINT64_C(1) << (m % 64));
    f->mask[e] = 0;
}

static void kvo__follow_link(kvo__follow *f, uint32_t e, uint32_t m) {
    f->mask[e] = (uint8_t)m;
    if (!m) return;
    uint32_t *l = &f->link[(size_t)e * 2];
    l[0] = FNIL;
    l[1] = f->head[m];
    if (f->head[m] != FNIL) f->link[(size_t)f->head[m] * 2] = e; else f->tail[m] = e;
    f->head[m] = e;
    f->nonempty[m / 64] |= UINT64_C(1) << (m % 64);
}

/* Whether shadow h holds key k (READY). */
static bool kvo__follow_holds(kvo_store *h, const kvo_chunk_key *k) {
    return kvo__entry_ready(h, kvo__index_find(h, k));
}

static uint32_t kvo__follow_mask_of(kvo__follow *f, const kvo_chunk_key *k) {
    uint32_t m = 0;
    for (uint32_t i = 0; i < f->n; i++)
        if (!kvo__follow_holds(f->sh[i], k)) m |= 1u << i;
    return m;
}

void kvo__follow_join(kvo_store *s, uint32_t e) {
    kvo__follow *f = s->follow;
    kvo__follow_link(f, e, kvo__follow_mask_of(f, &s->ent[e].key));
}

void kvo__follow_leave(kvo__follow *f, uint32_t e) { kvo__follow_unlink(f, e); }

/* A shadow's eviction (kvo__shadow_of.evicted). */
static void kvo__follow_evicted(kvo_store *s, uint32_t i, const kvo_chunk_key *k) {
    kvo__follow *f = s->follow;
    uint32_t e = kvo__index_find(s, k);
    if (e == KVO__NIL || s->ent[e].q == KVO__Q_NONE) return; /* not held, or not evictable now */
    uint32_t m = f->mask[e];
    if (m >> i & 1) return;
    kvo__follow_unlink(f, e);
    kvo__follow_link(f, e, m | 1u << i);
}

uint32_t kvo__follow_victim(const kvo__follow *f) {
    uint32_t best = 0;
    for (uint32_t w = 0; w < NMASK / 64; w++)
        for (uint64_t b = f->nonempty[w]; b; b &= b - 1) {
            uint32_t m = w * 64 + (uint32_t)__builtin_ctzll(b);
            if (!best || f->weight[m] > f->weight[best]) best = m;
        }
    return best ? f->tail[best] : KVO__NIL;
}

/* -------------------------------------------------- the calls, handed on -- */

static void kvo__follow_store(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    kvo__follow *f = s->follow;
    if (kvo__follow_scratch(f, n)) return; /* out of memory: the shadows miss one call */
    for (uint32_t i = 0; i < f->n; i++) {
        kvo_store *h = f->sh[i];
        if (kvo_store_prepare_store(h, keys, n, f->need, f->slots, NULL, NULL, 0, NULL)) continue;
        size_t m = 0;
        for (size_t j = 0; j < n; j++)
            if (f->need[j]) f->todo[m++] = keys[j];
        if (m) (void)kvo_store_complete_store(h, f->todo, m, true);
    }
    /* a shadow may have stored again a key the real store holds and then
     * leaves alone: a batch the real store turns away (ENOSPC: its pinned
     * and pending keys leave no room, and the shadows pin nothing; ERANGE:
     * the caller's evicted[] too small; the model test meets both), or
     * params.ignore_present */
    for (size_t j = 0; j < n; j++) {
        uint32_t e = kvo__index_find(s, &keys[j]);
        if (e == KVO__NIL || s->ent[e].q == KVO__Q_NONE || !f->mask[e]) continue;
        kvo__follow_unlink(f, e);
        kvo__follow_link(f, e, kvo__follow_mask_of(f, &keys[j]));
    }
}

static void kvo__follow_touch(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    kvo__follow *f = s->follow;
    for (uint32_t i = 0; i < f->n; i++) (void)kvo_store_touch(f->sh[i], keys, n);
}

static void kvo__follow_remove(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    kvo__follow *f = s->follow;
    for (uint32_t i = 0; i < f->n; i++) (void)kvo_store_remove(f->sh[i], keys, n);
}

static void kvo__follow_clear(kvo_store *s) {
    kvo__follow *f = s->follow;
    for (uint32_t i = 0; i < f->n; i++) (void)kvo_store_clear(f->sh[i]);
}

static void kvo__follow_lookup(kvo_store *s, const kvo_chunk_key *keys, size_t n) {
    kvo__follow *f = s->follow;
    if (!n || kvo__follow_scratch(f, n)) return;
    double d = exp(f->log_decay * (double)n);
    for (uint32_t i = 0; i < f->n; i++) {
        size_t h = 0;
        if (!kvo_store_lookup(f->sh[i], keys, n, f->st))
            while (h < n && f->st[h] == KVO_READY) h++;
        f->score[i] = f->score[i] * d + (double)h;
    }
    kvo__follow_weigh(f);
}

void kvo__follow_observe(kvo_store *s, int call, const kvo_chunk_key *keys, size_t n) {
    switch (call) {
    case KVO__CALL_LOOKUP: kvo__follow_lookup(s, keys, n); break;
    case KVO__CALL_STORE: kvo__follow_store(s, keys, n); break;
    case KVO__CALL_TOUCH: kvo__follow_touch(s, keys, n); break;
    case KVO__CALL_REMOVE: kvo__follow_remove(s, keys, n); break;
    default: kvo__follow_clear(s); break;
    }
}

uint32_t kvo__follow_shadows(kvo_store *s) { return s->follow ? s->follow->n : 0; }

kvo_store *kvo__follow_shadow(kvo_store *s, uint32_t i) { return s->follow && i < s->follow->n ? s->follow->sh[i] : NULL; }

int kvo__follow_check(kvo_store *s) {
    kvo__follow *f = s->follow;
    if (!f) return 0;
    size_t listed = 0;
    for (uint32_t m = 1; m < NMASK; m++) {
        bool ne = f->nonempty[m / 64] >> (m % 64) & 1;
        if (ne != (f->head[m] != FNIL))
            return kvo__error(KVO_ECORRUPT, "ensemble: mask list %u is %s but marked otherwise", m,
                              f->head[m] != FNIL ? "non-empty" : "empty");
        for (uint32_t e = f->head[m]; e != FNIL; e = f->link[(size_t)e * 2 + 1]) {
            if (f->mask[e] != m) return kvo__error(KVO_ECORRUPT, "ensemble: entry %u in list %u has mask %u", e, m, f->mask[e]);
            listed++;
        }
    }
    for (uint32_t e = 0; e < s->pool_cap; e++) {
        const kvo__entry *x = &s->ent[e];
        bool queued = x->q != KVO__Q_NONE && x->state == KVO__E_READY;
        uint32_t want = queued ? kvo__follow_mask_of(f, &x->key) : 0;
        if (f->mask[e] != want)
            return kvo__error(KVO_ECORRUPT, "ensemble: entry %u (%s) has mask %u, the shadows say %u", e,
                              queued ? "queued" : "not queued", f->mask[e], want);
        if (f->mask[e]) listed--;
    }
    if (listed) return kvo__error(KVO_ECORRUPT, "ensemble: %zu list entries are not marked", listed);
    return 0;
}
