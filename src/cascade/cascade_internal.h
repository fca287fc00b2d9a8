/*
 * Internal declarations of the cascade layer (also used by its tests).
 *
 * The cascade is the one owner of the way through the tiers (kvo_cascade.h
 * says what it promises; docs/cascade.md tells one request's way).  Its
 * files, top to leaves; a file calls internal functions of lower layers
 * only (tools/check-layering.py fails on a cycle):
 *   1  cascade.c     create / destroy, accessors, tier groups, invalidate,
 *                    statistics
 *   2  poll.c        poll (the ring handed to the caller), the waits,
 *                    flush, persist
 *   3  lookup.c      lookup: where each key is, the prefix, promotion on
 *      store.c       prepare_store / complete_store, staging, checksums
 *      direct.c      read / write / remove against the caller's memory
 *   4  promote.c     reserving host slots and queueing lower-tier reads
 *      dispatch.c    every tier's completions (promotions and reads
 *                    landing, lent writes ending, presence answers) and
 *                    the deferred writes' retries; drain for destroy
 *   5  tierio.c      the lower tiers' writes (queue, lend, defer, count),
 *                    op records, host reservation with write-back
 *   6  presence.c    the cluster's EXISTS answers
 *      namespace.c   kvo_namespace_id / _keys, kvo_tier_name, tenant labels
 *                    and the keys' tenant tags (pure)
 * The completions for the caller are the library's one ring
 * (src/core/ring.c): a promise is reserved for each op when it is accepted
 * (kvo__casc_promise), so that its completion is never lost.
 * Functions shared between files are kvo__casc_*; unless a comment says
 * otherwise they expect the caller to hold c->mu.
 *
 * Layout of the state (all under c->mu):
 *  - ops: every lower-tier read in flight (a promotion into a host slot, or
 *    a direct read into caller memory), by the id given to the tier as its
 *    user data (ids from 1; 0 is a presence query, UINT64_MAX a lent file
 *    write).  A record says what to do when it lands: complete the host
 *    entry, or chain a failed file read to the remote tier, or copy a
 *    remote hit into the file tier.
 *  - pend: keys reserved by prepare_store and not yet completed, with their
 *    slot and whether it is a staging slot: complete_store needs both, and
 *    a key being staged counts as present to a later prepare_store.
 *  - defer: lower-tier writes refused for back-pressure, with the slot that
 *    still holds their bytes (a READY host slot, checked again before each
 *    retry, or a staging slot kept PENDING in the staging store until its
 *    writes are queued).  Retried at every poll, dropped after retry_polls.
 *  - gen[g]: bumped by invalidate; an op started under an older generation
 *    lands as KVO_ESTATE and leaves no host entry.
 *  - presence (presence.c): digest -> IN FLIGHT / PRESENT / ABSENT, time.
 *  - cq: completions for the caller; an entry is promised when its op is
 *    accepted (a promotion, a direct read, a lent write), so the ring never
 *    grows at completion time and no completion is lost.
 *
 * Invariants
 *  - A host entry is READY only after its bytes are in its slot: stores
 *    complete it when the engine says the copy is done, promotions when the
 *    tier's read verified.  A promotion that fails or is stale removes its
 *    PENDING entry.
 *  - A slot lent to a file write (zero copy) is pinned in the host store
 *    until the write's completion; a deferred write's slot is re-checked
 *    (still READY, same offset) before the retry reads it.
 *  - Every op queued in a tier has a record; destroy waits for all of them
 *    (and for the lent writes) before the arena or the caller's memory may
 *    go.
 */
#ifndef KVO_CASCADE_INTERNAL_H
#define KVO_CASCADE_INTERNAL_H

#include <pthread.h>

#include "core/hmap.h"
#include "core/ring.h"
#include "core/internal.h"
#include "kvoffload/kvo_cascade.h"
#include "kvoffload/kvo_remote_tier.h"

#define KVO__CASC_UD_EXISTS 0u
/* A lent file write's user data: KVO__CASC_UD_LENT less the host part of
 * its key (the file tier's completion carries no tenant tag). */
#define KVO__CASC_UD_LENT UINT64_MAX
#define KVO__CASC_IS_LENT(ud) ((ud) >= KVO__CASC_UD_LENT - KVO_CASCADE_TENANTS_MAX)
#define KVO__CASC_TIER_BIT(t) (1u << (t))

/* A lower-tier read in flight (an entry of c->ops: key (id, 0)). */
typedef struct kvo__cop {
    uint64_t k0, k1;
    uint32_t used;
    uint8_t op;         /* KVO_CASCADE_OP_PROMOTE / _READ */
    uint8_t tier;       /* the tier serving it now */
    uint8_t chain;      /* READ: a failed file read goes on to the remote tier */
    uint8_t fill_file;  /* READ: a remote hit is written to the file tier */
    uint32_t gen;       /* the group's generation when started */
    kvo_chunk_key key;
    kvo_slot slot;      /* PROMOTE: the host slot */
    void *dst;          /* READ: the caller's memory */
    uint64_t user_data;
    uint64_t t0;
} kvo__cop;

/* A key reserved by prepare_store (an entry of c->pend). */
typedef struct kvo__pend {
    uint64_t k0, k1;
    uint32_t used;
    uint32_t staged;
    kvo_slot slot;      /* staged: relative to the staging store */
} kvo__pend;

/* A lower-tier write refused for back-pressure, to retry. */
typedef struct kvo__defer {
    kvo_chunk_key key;
    kvo_slot slot;      /* host slot, or staging slot (relative) */
    const void *src;    /* lent caller memory (kvo_cascade_write_async), or NULL: the slot */
    uint64_t user_data; /* lent: the completion's user data */
    int best;           /* lent: the best outcome so far (for the completion) */
    uint8_t tiers;      /* KVO__CASC_TIER_BIT of the tiers still to write */
    uint8_t staged;
    uint32_t polls;
} kvo__defer;

/* A presence answer (an entry of c->presence: key digest (lo, hi)). */
typedef struct kvo__pres {
    uint64_t k0, k1;
    uint32_t used;
    uint32_t state;     /* KVO__PRES_* */
    uint64_t t;         /* when asked (in flight) or answered */
} kvo__pres;

enum { KVO__PRES_INFLIGHT = 1, KVO__PRES_PRESENT = 2, KVO__PRES_ABSENT = 3, KVO__PRES_INFLIGHT_PUT = 4 };

struct kvo_cascade {
    kvo_cascade_params p;
    const kvo_plan *plan;
    size_t ng;
    pthread_mutex_t mu;
    /* host tier */
    kvo_arena *arena;
    bool own_arena;
    uint8_t *base;
    kvo_store *store;   /* host slots of the shared part: arena offsets [0, shared bytes) */
    /* tenant parts (1 + n_tenants, also without a host tier), fixed at
     * create (read without the lock): parts[0] = store, parts[t] the store
     * of tenants[t - 1] over its own arena offsets, or store when it has no
     * host part; files[t] its file tier, or file; ftiers: the distinct file
     * tiers (file first), for what goes to every tier (poll, flush, wait) */
    kvo_store *parts[1 + KVO_CASCADE_TENANTS_MAX];
    kvo_file_tier *files[1 + KVO_CASCADE_TENANTS_MAX];
    kvo_file_tier *ftiers[1 + KVO_CASCADE_TENANTS_MAX];
    uint32_t nparts, nft;
    char labels[1 + KVO_CASCADE_TENANTS_MAX][KVO_TENANT_LABEL_MAX];
    kvo_store *stage;   /* staging slots: arena offsets host_bytes + slot */
    uint64_t *sums;     /* verify_checksums: XXH3-64 per KVO_SLOT_ALIGN of the host tier */
    size_t n_sums;
    /* lower tiers and the groups each is used for (by kvo_tier_id) */
    kvo_file_tier *file;
    kvo_remote_tier *remote;
    uint64_t groups[4];
    uint32_t gen[KVO_MAX_GROUPS];
    /* ops in flight, reservations, deferred writes */
    kvo__hmap ops, pend, presence;
    uint64_t next_id;
    size_t promoting, reading, file_reads, remote_gets, lent;
    kvo__defer *defer;
    size_t n_defer, cap_defer;
    /* completions for the caller: the core ring (src/core/ring.c), a promise
     * reserved when an op is accepted, its eventfd in the epoll set */
    kvo__ring cq;
    int epfd;
    /* write-back: what a host prepare_store evicts (grown on KVO_ERANGE) */
    kvo_chunk_key *ev_keys;
    kvo_slot *ev_slots;
    size_t ev_cap;
    /* scratch of one call (lookup, promote, store) */
    kvo_chunk_key *s_keys;
    kvo_slot *s_slots;
    uint8_t *s_u8, *s_u8b;
    size_t *s_idx;
    uint64_t *s_ud;
    void **s_ptr;
    int *s_res;
    size_t s_cap;
    kvo_log_level log_level_unused;
    kvo_cascade_stats st;
};

static inline void kvo__casc_lock(kvo_cascade *c) { pthread_mutex_lock(&c->mu); }
static inline void kvo__casc_unlock(kvo_cascade *c) { pthread_mutex_unlock(&c->mu); }

/* The hash-map key of a chunk key (group mixed into the high word). */
static inline uint64_t kvo__casc_k1(const kvo_chunk_key *k) {
    return k->hash.hi ^ ((uint64_t)k->group * UINT64_C(0x9E3779B97F4A7C15));
}
static inline bool kvo__casc_uses(const kvo_cascade *c, unsigned tier, uint32_t group) {
    return (c->groups[tier] >> group) & 1;
}
static inline void *kvo__casc_host_ptr(kvo_cascade *c, kvo_slot s) { return c->base + s.offset; }
/* The host store holding key k (its tenant part; checked < nparts by every
 * public call that takes keys). */
static inline kvo_store *kvo__casc_hs(const kvo_cascade *c, const kvo_chunk_key *k) {
    assert(k->tenant < c->nparts);
    return c->parts[k->tenant];
}
/* The file tier holding key k (its tenant part's; c->file must exist). */
static inline kvo_file_tier *kvo__casc_ft(const kvo_cascade *c, const kvo_chunk_key *k) {
    assert(k->tenant < c->nparts);
    return c->files[k->tenant];
}
/* Whether part t has a host store of its own (0: the shared one, when
 * there is a host tier): loops over every host entry visit each store once. */
static inline bool kvo__casc_own_store(const kvo_cascade *c, uint32_t t) {
    return c->parts[t] && (t == 0 || c->parts[t] != c->store);
}
/* The end of the run of keys from i on in keys[i]'s tenant part. */
static inline size_t kvo__casc_run(const kvo_cascade *c, const kvo_chunk_key *keys, size_t i, size_t n) {
    if (c->nparts <= 1) return n;
    uint32_t t = keys[i].tenant;
    while (++i < n && keys[i].tenant == t) {}
    return i;
}
/* Check the keys' tenant tags (< nparts; with one, all alike): 0 or
 * KVO_EINVAL naming fn, the key and the numbers.  Lock not needed. */
int kvo__casc_check_parts(const kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool one, const char *fn);
/* The same after checking that every key names an offloaded group. */
int kvo__casc_check_keys(const kvo_cascade *c, const kvo_chunk_key *keys, size_t n, bool one, const char *fn);
/* The lower tiers there are, as KVO__CASC_TIER_BIT bits. */
static inline unsigned kvo__casc_lower(const kvo_cascade *c) {
    return (c->file ? KVO__CASC_TIER_BIT(KVO_TIER_FILE) : 0) | (c->remote ? KVO__CASC_TIER_BIT(KVO_TIER_REMOTE) : 0);
}
static inline void *kvo__casc_stage_ptr(kvo_cascade *c, kvo_slot s) {
    return c->base + c->p.host_bytes + s.offset;
}
/* Whether key k is READY in the host tier at slot offset off. */
bool kvo__casc_host_ready_at(kvo_cascade *c, const kvo_chunk_key *k, uint64_t off);

/* ---- namespace.c: pure ---- */
/* Whether label is one kvo_tenant_label gives ("default", "t-" + 12 hex). */
bool kvo__tenant_label_ok(const char *label);

/* ---- the completions (the core ring) ---- */
/* Promise n completions before accepting the ops that owe them: 0 or
 * KVO_ENOMEM (with a message naming what). */
static inline int kvo__casc_promise(kvo_cascade *c, size_t n) {
    return kvo__ring_reserve(&c->cq, n) ? kvo__error(KVO_ENOMEM, "cascade: out of memory for completions") : 0;
}
/* Queue a promised completion. */
static inline void kvo__casc_emit(kvo_cascade *c, const kvo_cascade_completion *cp) {
    *(kvo_cascade_completion *)kvo__ring_push(&c->cq) = *cp;
}

/* ---- presence.c: the cluster's EXISTS answers ---- */
/* One lookup's questions to the cluster: begin (the request's budget),
 * ask for key sets, end (the budget's bookkeeping). */
typedef struct kvo__casc_round {
    uint64_t now, ttl;
    bool wait;     /* answers still out count as PENDING */
    bool inflight; /* some answer is still out */
} kvo__casc_round;
void kvo__casc_pres_begin(kvo_cascade *c, kvo_cascade_wait *w, bool force_wait, kvo__casc_round *rr);
/* For each of the n keys whose states[i] is KVO_MISS (and whose group the
 * remote tier holds): a live PRESENT answer -> READY (tier REMOTE); an
 * answer still out -> PENDING when rr->wait; none -> a query is queued
 * (one batch for the call).  idx (may be NULL): the position of key i in
 * states / tiers. */
void kvo__casc_pres_ask(kvo_cascade *c, kvo__casc_round *rr, const kvo_chunk_key *keys, size_t n,
                        const size_t *idx, uint8_t *states, uint8_t *tiers);
void kvo__casc_pres_end(kvo_cascade *c, kvo_cascade_wait *w, const kvo__casc_round *rr);
/* A presence query's completion landed. */
void kvo__casc_pres_answer(kvo_cascade *c, const kvo_chunk_key *k, int result);
/* This cascade put k (its answer is PRESENT now, or lands so), or a get of
 * it failed (ABSENT). */
void kvo__casc_pres_put(kvo_cascade *c, const kvo_chunk_key *k);
void kvo__casc_pres_absent(kvo_cascade *c, const kvo_chunk_key *k);
/* A live PRESENT answer for k. */
bool kvo__casc_pres_present(kvo_cascade *c, const kvo_chunk_key *k);

/* ---- tierio.c: lower-tier writes and reads ---- */
/* Scratch arrays for n keys. */
int kvo__casc_scratch(kvo_cascade *c, size_t n);
/* A new op record (id in *id), zeroed but for what the caller sets, with
 * its completion promised; NULL on ENOMEM. */
kvo__cop *kvo__casc_op_new(kvo_cascade *c, uint64_t *id);
kvo__cop *kvo__casc_op_get(kvo_cascade *c, uint64_t id);
/* Forget an op whose completion was queued. */
void kvo__casc_op_del(kvo_cascade *c, kvo__cop *o);
/* Forget an op a tier refused (its promise given back). */
void kvo__casc_op_refused(kvo_cascade *c, kvo__cop *o);
/* Write n chunks (srcs in memory that stays valid only during the call,
 * or a host / staging slot) to the tiers in `tiers` (bits), copying.
 * Refusals for back-pressure go to the deferred list when `slots` is not
 * NULL (the bytes stay in those slots; staged says whether they are
 * staging slots), else are counted as dropped.  res[i] (may be NULL): the
 * best outcome over the tiers (0 queued somewhere, KVO_EEXIST held, else
 * the refusal; KVO_ESTATE when no tier holds the group's format).  how:
 * KVO__CASC_W_WRITEBACK counts the queued ones in writebacks,
 * KVO__CASC_W_RETRY (a deferred entry's retry) does not count a refusal as
 * a new deferral, KVO__CASC_W_CALLER below.  notify (may be NULL): the
 * srcs are the caller's, lent until each key's completion (op WRITE, user
 * data notify[i]), queued once every tier took the key or dropped it;
 * refusals for back-pressure are deferred with the lent memory.  Returns
 * how many keys some tier still has to take (deferred). */
#define KVO__CASC_W_WRITEBACK 1u
#define KVO__CASC_W_RETRY 2u
#define KVO__CASC_W_CALLER 4u /* without slots: a key every tier refused for back-pressure is
                                 not counted (the caller retries it and counts the end) */
size_t kvo__casc_write(kvo_cascade *c, unsigned tiers, const kvo_chunk_key *keys, const void *const *srcs,
                       const kvo_slot *slots, bool staged, size_t n, unsigned how, const uint64_t *notify, int *res);
/* Zero-copy write-through: lend n READY host chunks to the file tier. */
void kvo__casc_lend(kvo_cascade *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n);
/* A lent write ended. */
void kvo__casc_lent_done(kvo_cascade *c, const kvo_file_completion *fc);
/* Retry the deferred writes (every poll); drops those past retry_polls or
 * whose slot no longer holds them. */
void kvo__casc_retry(kvo_cascade *c);
/* kvo_store_prepare_store on the host store; in write-back mode the READY
 * chunks it evicts that the file tier lacks are queued to it first. */
int kvo__casc_host_prepare(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots);
/* The file tier's batch calls for keys that may span tenant parts: each run
 * of one part to its part's tier (c->file must exist).  lookup: a run whose
 * call fails reads MISS.  read / write / write_borrowed: results[i] per
 * key, a run's failure given to each of its keys; *nq the keys queued. */
void kvo__casc_file_lookup(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, uint8_t *states);
void kvo__casc_file_read(kvo_cascade *c, const kvo_chunk_key *keys, void *const *dsts, size_t n, const uint64_t *ud,
                         int *results);
void kvo__casc_file_write(kvo_cascade *c, const kvo_chunk_key *keys, const void *const *srcs, const uint64_t *sums,
                          size_t n, const uint64_t *ud, int *results, bool borrowed);
/* XXH3-64 of host slot s holding k (verify_checksums). */
uint64_t kvo__casc_sum(kvo_cascade *c, const kvo_chunk_key *k, kvo_slot s);

/* ---- promote.c ---- */
/* kvo_cascade_promote under mu (tiers[i] a kvo_tier_id or NONE: look), the
 * keys checked by the caller (kvo__casc_check_keys, or lookup's own check). */
int kvo__casc_promote(kvo_cascade *c, const kvo_chunk_key *keys, size_t n, const uint8_t *tiers,
                      const uint64_t *user_data, int *results);

/* ---- dispatch.c ---- */
/* Consume every tier's completions and retry deferred writes. */
void kvo__casc_drive(kvo_cascade *c);
/* Drive until no op is in flight and no write is lent (destroy); takes
 * and releases mu itself. */
void kvo__casc_drain(kvo_cascade *c);

#endif
