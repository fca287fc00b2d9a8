/*
 * Miniature simulations for the prefix policy (policy_prefix.c): which
 * setting of its two knobs would have hit most on this workload, lately.
 *
 * The prefix policy keeps two LRU lists, P (keys used once) and M (keys used
 * again, or stored again after an eviction), and evicts P's oldest key unless
 * M's oldest key is older than that by more than a threshold A (in uses).
 * A = 0 is exactly LRU (the older of the two tails); A = infinity protects
 * every reused key against any once-used one.  Which is right depends on the
 * workload: chat traffic (a conversation's next turn reuses its last turn
 * soon) wants recency, shared-document traffic (a few long prefixes reused
 * by many requests, among many one-off ones) wants protection.  So the store
 * runs the same policy, keys only, at KVO__MINI_N settings of A and of the
 * ghost window W (how recently evicted a key stored again must be to join M)
 * side by side on a hashed sample of its keys, and follows the one with the
 * most hits.
 *
 * Layout: a key is sampled when the low `shift` bits of its 64-bit mix are
 * zero (the same keys every time, so each simulation sees every use of the
 * keys it tracks); shift is chosen at create so that max_entries >> shift <=
 * KVO__MINI_CAP.  Simulation i holds at most resident >> shift keys (the real
 * store's current size, scaled by the sample rate: Waldspurger et al.,
 * "Cache Modeling and Optimization using Miniature Simulations", USENIX ATC
 * '17) and remembers W_i times as many evicted keys (the setting's ghost
 * window, kvo__mini_ghostw: 4, the store's whole history, or 1).  Small
 * stores (max_entries <= KVO__MINI_CAP) simulate every key.
 * Nodes live in one fixed pool per simulation (free list), found through one
 * kvo__hmap keyed (mix, simulation); everything is allocated at create, so a
 * use never allocates.  Each simulation's score is its hits with exponential
 * decay (half-life ~11 fills of the simulated cache, KVO__MINI_HL), so the
 * choice follows phase changes.
 *
 * The choice: LRU (A = 0) unless another setting has a margin more hits
 * than the LRU simulation, then the best of those, whichever it is at the
 * moment (the settings share the store's lists and differ only in the
 * victim rule and the ghost window, so moving between them costs nothing).
 * The margin is anchored at LRU, so the store returns to LRU as soon as LRU
 * leads again.  The guard: the store scores its own hits on the sampled
 * keys like a simulation (kvo__mini_ref's `hit`), and when they fall below
 * the LRU simulation's by more than the sampling explains (KVO__MINI_TOL),
 * it goes back to LRU and doubles its margin.  Workloads where protection
 * really wins never trip the guard and keep the small margin; where it only
 * looks better in the simulations, the margin climbs after a trip or two and
 * the store stays LRU.
 *
 * Cost: one hash test per use; for the sampled 1/2^shift of uses, one map
 * lookup and O(1) list work per simulation.  Memory: about 4 MiB per store
 * whatever its size.  Not thread-safe: the store's lock covers it.
 */

#include "core/hmap.h"
#include "store/minisim.h"

#define KVO__MINI_CAP 1024u      /* most keys a simulation holds */
#define KVO__MINI_HL 16.0        /* score memory, in fills of the simulated cache */
/* Leaving LRU: a setting must beat the LRU simulation by 1 %, and by 5 %
 * while the sample holds half the keys or more (stores of up to 2,048
 * entries, where a switch costs most: with 1-3 % there, 12-17 of 20 seeded
 * chat traces fell below LRU somewhere, with 5 % 2 of 20).  The guard's
 * tolerance, 1.5 %: the store and the LRU simulation differ by up to 1.3 %
 * while the store is LRU (sampling noise).  The margin doubles at each trip,
 * up to 16 %. */
#define KVO__MINI_MARGIN 0.01
#define KVO__MINI_MARGIN_SMALL 0.05
#define KVO__MINI_MARGIN_MAX 0.16
#define KVO__MINI_TOL 0.015
#define MNIL UINT32_MAX

/* The knob settings, in units of the cache's size in keys (eighths): 0 = LRU,
 * ..., UINT32_MAX = never prefer a reused key's eviction; with their ghost
 * windows (cache sizes).  The W = 1 settings gained ~2 points over the
 * W = 4 ones on the generated document traces, where a document seen twice
 * in a long while would otherwise crowd the popular ones out of M; LRU
 * ignores W. */
const uint32_t kvo__mini_knob8[KVO__MINI_N] = {0, 4, 8, 16, 32, UINT32_MAX, 4, 8, 16, UINT32_MAX};
const uint8_t kvo__mini_ghostw[KVO__MINI_N] = {4, 4, 4, 4, 4, 4, 1, 1, 1, 1};

enum { MQ_P = 0, MQ_M = 1, MQ_G = 2 };

typedef struct mnode {
    uint64_t key;
    uint32_t prev, next, stamp;
    uint8_t q;
} mnode;

typedef struct msim {
    mnode *node;
    uint32_t free;              /* free list through next */
    uint32_t head[3], tail[3];  /* per queue: head = most recent */
    uint32_t n[3];
    uint32_t clock;
    double score;
} msim;

struct kvo__mini {
    unsigned shift;
    uint64_t mask;
    uint32_t nodes;             /* per simulation */
    uint32_t best;
    double decay;               /* recomputed when the simulated size changes */
    double real;                /* the store's own hits on the sampled keys, decayed alike */
    double margin, tol;         /* for leaving LRU, for going back (KVO__MINI_MARGIN) */
    uint32_t decay_cap;
    kvo__hmap map;              /* (mix, sim) -> node index */
    msim sim[KVO__MINI_N];
};

typedef struct mref {
    uint64_t k0, k1;
    uint32_t used;
    uint32_t node;
} mref;

int kvo__mini_create(kvo__mini **out, uint64_t max_entries) {
    *out = NULL;
    kvo__mini *m = kvo__calloc(1, sizeof *m);
    if (!m) return kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory for the prefix policy's simulations");
    while ((max_entries >> m->shift) > KVO__MINI_CAP) m->shift++;
    m->mask = (UINT64_C(1) << m->shift) - 1;
    m->margin = m->shift <= 1 ? KVO__MINI_MARGIN_SMALL : KVO__MINI_MARGIN;
    m->tol = KVO__MINI_TOL;
    uint64_t cap = max_entries >> m->shift;
    if (cap < 8) cap = 8;
    m->nodes = (uint32_t)(cap * (1 + KVO__PREFIX_GHOSTS) + 1);
    int rc = kvo__hmap_init(&m->map, sizeof(mref), (size_t)m->nodes * KVO__MINI_N, "the prefix policy's simulations");
    for (int i = 0; !rc && i < KVO__MINI_N; i++) {
        msim *s = &m->sim[i];
        s->node = kvo__malloc((size_t)m->nodes * sizeof *s->node);
        if (!s->node) {
            rc = kvo__error(KVO_ENOMEM, "kvo_store_create: out of memory for the prefix policy's simulations");
            break;
        }
        for (uint32_t j = 0; j < m->nodes; j++) s->node[j].next = j + 1 < m->nodes ? j + 1 : MNIL;
        s->free = 0;
        for (int q = 0; q < 3; q++) s->head[q] = s->tail[q] = MNIL;
    }
    if (rc) {
        kvo__mini_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

void kvo__mini_destroy(kvo__mini *m) {
    if (!m) return;
    for (int i = 0; i < KVO__MINI_N; i++) kvo__free(m->sim[i].node);
    kvo__hmap_free(&m->map);
    kvo__free(m);
}

static void m_unlink(msim *s, uint32_t x) {
    mnode *n = &s->node[x];
    if (n->prev != MNIL) s->node[n->prev].next = n->next; else s->head[n->q] = n->next;
    if (n->next != MNIL) s->node[n->next].prev = n->prev; else s->tail[n->q] = n->prev;
    s->n[n->q]--;
}

static void m_push(msim *s, uint32_t x, uint8_t q) {
    mnode *n = &s->node[x];
    n->q = q;
    n->prev = MNIL;
    n->next = s->head[q];
    if (s->head[q] != MNIL) s->node[s->head[q]].prev = x; else s->tail[q] = x;
    s->head[q] = x;
    s->n[q]++;
}

/* Forget node x entirely (a ghost falling off the history). */
static void m_drop(kvo__mini *m, msim *s, int i, uint32_t x) {
    m_unlink(s, x);
    mref *r = kvo__hmap_find(&m->map, s->node[x].key, (uint64_t)i);
    if (r) kvo__hmap_erase(&m->map, r);
    s->node[x].next = s->free;
    s->free = x;
}

/* Evict one key of simulation i (knob a, in uses) into its ghost history. */
static void m_evict(kvo__mini *m, msim *s, int i, uint64_t a, uint32_t cap) {
    uint32_t tp = s->tail[MQ_P], tm = s->tail[MQ_M], v;
    if (tp == MNIL) v = tm;
    else if (tm == MNIL) v = tp;
    else v = kvo__prefix_take_m(s->node[tp].stamp, s->node[tm].stamp, a) ? tm : tp;
    m_unlink(s, v);
    m_push(s, v, MQ_G);
    while (s->n[MQ_G] > (uint64_t)cap * kvo__mini_ghostw[i]) m_drop(m, s, i, s->tail[MQ_G]);
}

/* One use of key `mix` in simulation i holding at most cap keys; 1 on a hit. */
static int m_ref(kvo__mini *m, int i, uint64_t mix, uint32_t cap) {
    msim *s = &m->sim[i];
    uint64_t a = kvo__prefix_gap(kvo__mini_knob8[i], cap);
    s->clock++;
    bool existed;
    mref *r = kvo__hmap_insert(&m->map, mix, (uint64_t)i, &existed);
    uint32_t x;
    int hit = 0;
    uint8_t q = MQ_P;
    if (existed) {
        x = r->node;
        hit = s->node[x].q != MQ_G;
        q = MQ_M; /* used again, or back from the history */
        m_unlink(s, x);
    } else {
        /* the pool holds 5 * cap + 1 nodes: cap held, 4 * cap remembered, this one */
        assert(s->free != MNIL);
        x = s->free;
        s->free = s->node[x].next;
        s->node[x].key = mix;
        r->node = x;
    }
    if (!hit)
        while (s->n[MQ_P] + s->n[MQ_M] >= cap) m_evict(m, s, i, a, cap);
    s->node[x].stamp = s->clock;
    m_push(s, x, q);
    return hit;
}

void kvo__mini_ref(kvo__mini *m, uint64_t mix, uint64_t resident, bool hit) {
    if (mix & m->mask) return;
    uint64_t c = resident >> m->shift;
    uint64_t most = m->nodes / (1 + KVO__PREFIX_GHOSTS);
    uint32_t cap = (uint32_t)(c < 8 ? 8 : c > most ? most : c);
    if (cap != m->decay_cap) {
        m->decay_cap = cap;
        m->decay = 1.0 - 1.0 / ((double)cap * KVO__MINI_HL);
    }
    uint32_t best = 0;
    for (int i = 0; i < KVO__MINI_N; i++) {
        msim *s = &m->sim[i];
        s->score = s->score * m->decay + m_ref(m, i, mix, cap);
        if (s->score > m->sim[best].score) best = (uint32_t)i;
    }
    /* The guard: the store itself below the LRU simulation -> back to LRU,
     * and a higher bar for leaving it again (the comparison restarts). */
    m->real = m->real * m->decay + hit;
    if (m->best != 0 && m->real < m->sim[0].score * (1 - m->tol)) {
        m->best = 0;
        m->margin = m->margin * 2 > KVO__MINI_MARGIN_MAX ? KVO__MINI_MARGIN_MAX : m->margin * 2;
        m->real = m->sim[0].score;
        return;
    }
    /* LRU unless a setting beats it by the margin; then the best one */
    m->best = m->sim[best].score <= m->sim[0].score * (1 + m->margin) ? 0 : best;
}

uint32_t kvo__mini_best(const kvo__mini *m) { return m->best; }
