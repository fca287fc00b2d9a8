/*
 * The engine connector: request bookkeeping on top of the keys, the host
 * store, the transfer engine (and optionally the file tier).
 *
 * Layout
 *  - One mutex protects everything below; it is held for bookkeeping and for
 *    calls into the store, the transfer engine's submit/poll/cancel and the
 *    file tier's queueing calls (library code that never blocks for long and
 *    never calls back), and released around every wait for copies.
 *  - Requests live in a hash table by id.  Each keeps its chained unit
 *    hashes (16 bytes per tokens_per_hash tokens), the partial unit's tokens,
 *    how far each group has been considered for storing (next_chunk), the hit
 *    its last lookup pinned, and the ids of its copies in flight.
 *  - Jobs (one transfer job per load, one per update that stores something)
 *    live in a hash table by job id.  A job record owns the chunk keys it
 *    completes or unpins when its result is polled, so a request may be
 *    preempted or aborted while its copies are in flight: the results are
 *    still processed, only the engine notification is dropped (a generation
 *    number tells stale loads apart).
 *  - The block map counts, per (group, engine block), the store jobs in flight
 *    that read it and the newest such job id: wait_blocks waits for every
 *    in-flight store job up to that id, which covers every store reading the
 *    block (exact, and bounded by the in-flight job count).
 *  - File tier modes.  Write-through: a store job's chunks are handed to the
 *    file tier when its result is polled.  Write-back: every host
 *    prepare_store goes through kvo__prepare_store, which receives the
 *    evicted keys and their old slots and hands the READY chunks the file
 *    tier lacks (file lookup first) to kvo_file_tier_write before returning.
 *    That is safe because the evicted slots keep their bytes until the
 *    caller writes the new slots (a transfer job submitted, or a file read
 *    queued, only after kvo__prepare_store returns) and the tier copies the
 *    bytes into its own staging memory before kvo_file_tier_write returns.
 *    The evicted-key buffer grows when the store answers KVO_ERANGE (the
 *    count it needed) and is kept: no allocation per call once warm.
 *    READY host slots only change under mu (prepare_store, remove), so
 *    flush_to_file copies them under mu without pinning.  Writes the tier
 *    refuses are counted (file_writes_dropped), never an error.
 *
 * Invariants
 *  - A hit pinned by lookup is exactly the chunks that load will read; pins
 *    move into the load's job record and are released when its result is
 *    polled (or at preempt/abort/finish/next lookup if no load was issued).
 *  - A chunk is stored only from blocks that hold its complete tokens
 *    (computed >= chunk end) and whose keys are known (units >= chunk end).
 *  - Every completion owed to the engine has room in the ring: each request
 *    LOADING (owes its LOAD completion) or FINISHED (owes RELEASED) counts
 *    in cq_owed, and load / finish reserve cq_n + cq_owed + 1 entries before
 *    they accept, so a completion is never lost to a failed allocation.
 *  - A load completion reports tokens_valid = the hit only if the copy
 *    succeeded (and, with verify_checksums, every slot matched its stored
 *    checksum); otherwise local_tokens: nothing loaded is ever counted as
 *    computed.
 *
 * Why this shape: the engine already owns block allocation and scheduling;
 * the connector only needs ids and block tables at the moments data moves,
 * and must never block the scheduler except where the engine asks it to
 * (wait_blocks, wait_request, preempt, abort).
 */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "connector/connector_internal.h"

enum { REQ_ACTIVE = 0, REQ_LOADING = 1, REQ_FINISHED = 2 };
enum { TIER_HOST = 0, TIER_FILE = 1 };

typedef struct kvo__hit_item {
    kvo_chunk_key key;
    kvo_slot slot;
    uint64_t chunk;
    uint8_t tier;    /* where the data came from: TIER_HOST / TIER_FILE */
    uint8_t pinned;  /* pinned in the host store */
} kvo__hit_item;

/* A file-tier read into a host slot (PENDING in the host store until done). */
typedef struct kvo__read {
    kvo_chunk_key key;
    kvo_slot slot;
    uint64_t req;
    uint32_t gen;
    size_t item;
} kvo__read;

typedef struct kvo__job kvo__job;

typedef struct kvo__req {
    uint64_t id;
    int state;
    uint32_t gen;
    bool hash_mode;
    kvo_u128 ns;
    uint8_t *extra;
    size_t extra_len;
    kvo_u128 *units;
    size_t n_units, cap_units;
    uint32_t *tail;
    size_t n_tail;
    uint64_t prompt_tokens, n_tokens, computed;
    uint64_t ckpt[2];
    size_t n_ckpt;
    uint64_t next_chunk[KVO_MAX_GROUPS];
    /* the hit pinned by the last lookup */
    bool hit_pinned;
    uint64_t hit_tokens, hit_local, hit_host_tokens, hit_file_tokens;
    kvo__hit_item *hit;
    size_t n_hit, cap_hit;
    /* copies in flight */
    uint64_t *jobs;
    size_t n_jobs, cap_jobs;
    uint64_t load_job;
    /* file-tier reads of the pinned hit still running, their first error,
     * and a load waiting for them */
    size_t file_pending;
    int file_status;
    kvo__job *deferred;
    /* blocks written by the last failed load (room reserved by load) */
    kvo_block_ref *invalid;
    size_t n_invalid, cap_invalid;
    kvo_request_stats st;
} kvo__req;

struct kvo__job {
    uint64_t id;
    uint64_t req;
    uint32_t gen;
    uint8_t dir;
    size_t n_keys;
    kvo_chunk_key *keys;
    kvo_slot *slots;
    size_t n_blocks;
    kvo_block_ref *blocks;
    /* loads: the ops with their own copy of the engine block ids, so that a
     * load waiting for file reads can be submitted later */
    kvo_xfer_op *ops;
    uint64_t *eblk;
    uint64_t tokens, local, host_tokens, file_tokens;
};

struct kvo_connector {
    kvo_connector_params p;
    uint8_t *salt;
    const kvo_plan *plan;
    size_t ng;
    uint64_t step, min_hit;
    kvo_u128 fingerprint;
    kvo_arena *arena;
    uint8_t *arena_base;
    kvo_store *store;
    kvo_transfer *xfer;
    kvo_file_tier *file;
    pthread_mutex_t mu;
    bool layout_set;
    kvo__map reqs, jobs, blocks, reads;
    uint64_t next_read;
    /* completions for the engine (ring) */
    kvo_completion *cq;
    size_t cq_head, cq_n, cq_cap;
    size_t cq_owed; /* completions still to come: requests LOADING or FINISHED */
    /* scratch, guarded by mu */
    kvo_chunk_key *s_keys;
    uint8_t *s_u8;
    kvo_slot *s_slots;
    uint32_t *s_grp;
    uint64_t *s_chunk;
    size_t s_cap;
    kvo_xfer_op *s_ops;
    size_t s_ops_cap;
    uint8_t *ones;
    size_t ones_cap;
    uint8_t *s_tier, *s_fst;
    kvo_chunk_key *s_fkeys;
    size_t *s_fidx;
    size_t s_fcap;
    /* verify_checksums: XXH3-64 per 4 KiB slot start */
    uint64_t *sums;
    size_t n_sums;
    /* write-back: what prepare_store evicts (grown on KVO_ERANGE) */
    kvo_chunk_key *ev_keys;
    kvo_slot *ev_slots;
    size_t ev_cap;
    uint32_t inject_load_fail, inject_store_fail;
    kvo_connector_stats st;
};

/* ------------------------------------------------------------ helpers -- */

static void kvo__lock(kvo_connector *c) { pthread_mutex_lock(&c->mu); }
static void kvo__unlock(kvo_connector *c) { pthread_mutex_unlock(&c->mu); }

/* Scratch arrays for n chunk entries. */
static int kvo__scratch(kvo_connector *c, size_t n) {
    const kvo__arr a[] = {{(void **)&c->s_keys, sizeof *c->s_keys},   {(void **)&c->s_u8, sizeof *c->s_u8},
                          {(void **)&c->s_slots, sizeof *c->s_slots}, {(void **)&c->s_grp, sizeof *c->s_grp},
                          {(void **)&c->s_chunk, sizeof *c->s_chunk}, {(void **)&c->s_tier, sizeof *c->s_tier}};
    return kvo__grow_all(&c->s_cap, n, a, sizeof a / sizeof a[0], 64, "connector: chunk entries");
}

/* Scratch for n file-tier lookups. */
static int kvo__fscratch(kvo_connector *c, size_t n) {
    const kvo__arr a[] = {{(void **)&c->s_fkeys, sizeof *c->s_fkeys},
                          {(void **)&c->s_fst, sizeof *c->s_fst},
                          {(void **)&c->s_fidx, sizeof *c->s_fidx}};
    return kvo__grow_all(&c->s_fcap, n, a, sizeof a / sizeof a[0], 64, "connector: file lookups");
}

static kvo__req *kvo__req_get(kvo_connector *c, uint64_t id) {
    kvo__map_entry *e = kvo__map_get(&c->reqs, id);
    return e ? e->p : NULL;
}

static int kvo__req_missing(uint64_t id) {
    return kvo__error(KVO_ENOTFOUND, "connector: no live request with id %llu", (unsigned long long)id);
}

static void kvo__job_free(kvo__job *j) { kvo__free(j); }

static void kvo__req_free(kvo__req *r) {
    if (!r) return;
    kvo__job_free(r->deferred);
    kvo__free(r->extra);
    kvo__free(r->units);
    kvo__free(r->tail);
    kvo__free(r->hit);
    kvo__free(r->jobs);
    kvo__free(r->invalid);
    kvo__free(r);
}

/* Change r's state, keeping cq_owed = requests LOADING or FINISHED. */
static void kvo__req_set_state(kvo_connector *c, kvo__req *r, int state) {
    c->cq_owed -= r->state != REQ_ACTIVE;
    c->cq_owed += state != REQ_ACTIVE;
    r->state = state;
}

static void kvo__req_remove(kvo_connector *c, kvo__req *r) {
    kvo__req_set_state(c, r, REQ_ACTIVE); /* what it owed is emitted or dropped */
    kvo__map_entry *e = kvo__map_get(&c->reqs, r->id);
    if (e) kvo__map_del(&c->reqs, e);
    c->st.requests_live--;
    kvo__req_free(r);
}

static void kvo__req_drop_job(kvo__req *r, uint64_t job) {
    for (size_t i = 0; i < r->n_jobs; i++)
        if (r->jobs[i] == job) {
            r->jobs[i] = r->jobs[--r->n_jobs];
            return;
        }
}

/* Room in the completion ring for `need` entries. */
static int kvo__cq_reserve(kvo_connector *c, size_t need) {
    if (need > c->cq_cap) {
        size_t ncap = c->cq_cap ? c->cq_cap : 64;
        while (ncap < need) ncap *= 2;
        kvo_completion *nq = kvo__malloc(ncap * sizeof *nq);
        if (!nq) return kvo__error(KVO_ENOMEM, "connector: out of memory for completions");
        for (size_t i = 0; i < c->cq_n; i++) nq[i] = c->cq[(c->cq_head + i) % c->cq_cap];
        kvo__free(c->cq);
        c->cq = nq;
        c->cq_cap = ncap;
        c->cq_head = 0;
    }
    return 0;
}

/* Room for every completion owed plus one more (call before accepting a
 * load or a finish). */
static int kvo__cq_reserve_owed(kvo_connector *c) { return kvo__cq_reserve(c, c->cq_n + c->cq_owed + 1); }

/* Queue a completion; room was reserved when it became owed. */
static void kvo__emit(kvo_connector *c, const kvo_completion *cp) {
    assert(c->cq_n < c->cq_cap);
    if (c->cq_n == c->cq_cap && kvo__cq_reserve(c, c->cq_n + 1)) return; /* not reached */
    c->cq[(c->cq_head + c->cq_n) % c->cq_cap] = *cp;
    c->cq_n++;
}

static uint64_t kvo__block_key(uint32_t group, uint64_t block) { return (block << 6) | group; }

static void *kvo__slot_ptr(kvo_connector *c, kvo_slot s) { return c->arena_base + s.offset; }

static uint64_t kvo__slot_sum(kvo_connector *c, const kvo_chunk_key *k, kvo_slot s) {
    const kvo_group_plan *gp = kvo_plan_group(c->plan, k->group);
    return XXH3_64bits(kvo__slot_ptr(c, s), gp->chunk_bytes);
}

/* Hand n host chunks (keys[i] READY in host slot slots[i]) to the file
 * tier, which copies them before returning.  lookup: ask the tier first and
 * skip the chunks it holds or is writing (not counted as drops).  verify
 * (with verify_checksums; false only where the checksums were just taken
 * from these bytes under mu): a chunk whose host bytes no longer match their
 * checksum is never written (a file would give it a valid checksum of its
 * own): counted in checksum_failures, res KVO_ECORRUPT.  res[i] (may be NULL): 0
 * queued, KVO_EEXIST held already, KVO_ECORRUPT, or why it was dropped
 * (KVO_EAGAIN back-pressure, KVO_ENOSPC quota, KVO_ECLOSED).  Counts
 * file_writes and file_writes_skipped; returns how many were dropped (the
 * caller counts them: a retry may still queue them).  Caller holds mu. */
static size_t kvo__file_put(kvo_connector *c, const kvo_chunk_key *keys, const kvo_slot *slots, size_t n,
                            bool lookup, bool verify, int *res) {
    enum { B = 64 };
    kvo_chunk_key wk[B];
    const void *srcs[B];
    uint8_t st[B];
    int wr[B];
    size_t idx[B], dropped = 0;
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B, m = 0, nq = 0;
        if (lookup && kvo_file_tier_lookup(c->file, keys + i, b, st) != 0) memset(st, KVO_MISS, b);
        for (size_t k = 0; k < b; k++) {
            if (lookup && st[k] != KVO_MISS) {
                c->st.file_writes_skipped++;
                if (res) res[i + k] = KVO_EEXIST;
                continue;
            }
            if (verify && c->sums &&
                c->sums[slots[i + k].offset / KVO_SLOT_ALIGN] != kvo__slot_sum(c, &keys[i + k], slots[i + k])) {
                c->st.checksum_failures++;
                if (res) res[i + k] = KVO_ECORRUPT;
                continue;
            }
            wk[m] = keys[i + k];
            srcs[m] = kvo__slot_ptr(c, slots[i + k]);
            wr[m] = KVO_EINVAL;
            idx[m++] = i + k;
        }
        if (m == 0) continue;
        int rc = kvo_file_tier_write(c->file, wk, srcs, m, NULL, wr, &nq);
        c->st.file_writes += nq;
        for (size_t k = 0; k < m; k++) {
            int r = rc ? rc : wr[k];
            if (r == KVO_EEXIST) c->st.file_writes_skipped++;
            else if (r != 0) dropped++;
            if (res) res[idx[k]] = r;
        }
    }
    return dropped;
}

/* kvo_store_prepare_store on the host store; in write-back mode the READY
 * chunks it evicts are handed to the file tier before this returns (their
 * slots still hold their bytes: the caller writes the new slots later).
 * Caller holds mu. */
static int kvo__prepare_store(kvo_connector *c, const kvo_chunk_key *keys, size_t n, uint8_t *need,
                              kvo_slot *slots) {
    if (!c->file || c->p.file_mode != KVO_FILE_WRITE_BACK)
        return kvo_store_prepare_store(c->store, keys, n, need, slots, NULL, NULL, 0, NULL);
    size_t want = 64; /* buffers must exist: with NULL ones the store evicts without reporting */
    for (;;) {
        const kvo__arr ev[] = {{(void **)&c->ev_keys, sizeof *c->ev_keys},
                               {(void **)&c->ev_slots, sizeof *c->ev_slots}};
        if (kvo__grow_all(&c->ev_cap, want, ev, 2, 64, "connector: evicted chunks")) return KVO_ENOMEM;
        size_t nev = 0;
        int rc = kvo_store_prepare_store(c->store, keys, n, need, slots, c->ev_keys, c->ev_slots, c->ev_cap, &nev);
        if (rc == KVO_ERANGE && nev > c->ev_cap) {
            want = nev;
            continue;
        }
        if (rc) return rc;
        assert(nev <= c->ev_cap);
        if (nev) {
            size_t q0 = c->st.file_writes;
            c->st.file_writes_dropped += kvo__file_put(c, c->ev_keys, c->ev_slots, nev, true, true, NULL);
            c->st.file_writebacks += c->st.file_writes - q0;
        }
        return 0;
    }
}

/* Token range [*lo, *hi) of chunk ch of group g needed to serve boundary b
 * above local L (see agree.c); empty when *lo >= *hi.  Block aligned. */
static void kvo__need_range(const kvo_group_plan *gp, uint64_t ch, uint64_t L, uint64_t b, uint64_t *lo,
                            uint64_t *hi) {
    uint64_t T = gp->tokens_per_chunk, cs = ch * T, ce = cs + T, from = L;
    *lo = *hi = 0;
    if (b <= L) return;
    if (gp->kind == KVO_GROUP_SLIDING) {
        uint64_t w = b > gp->window ? b - gp->window : 0;
        w = w / gp->tokens_per_block * gp->tokens_per_block;
        if (w > from) from = w;
    } else if (gp->kind == KVO_GROUP_STATE) {
        from = b - gp->tokens_per_block;
    }
    *lo = from > cs ? from : cs;
    *hi = b < ce ? b : ce;
}

/* ------------------------------------------------------------- create -- */

kvo_connector_params kvo_connector_default_params(void) {
    kvo_connector_params p;
    memset(&p, 0, sizeof p);
    p.policy = KVO_POLICY_LRU;
    p.event_capacity = 4096;
    p.prefault = true;
    p.transfer_threads = 2;
    p.max_queued_jobs = 4096;
    p.nontemporal = -1;
    p.sliding_store = KVO_SLIDING_STORE_ALL;
    p.max_requests = 4096;
    p.file_mode = KVO_FILE_WRITE_THROUGH;
    p.file_persist_on_destroy = true;
    return p;
}

int kvo_connector_create(const kvo_connector_params *p, kvo_connector **out) {
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_connector_create: params and out must not be NULL");
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_connector_create: params.plan is required");
    const kvo_plan *plan = p->plan;
    size_t ng = kvo_plan_num_groups(plan);
    uint64_t step = kvo_agree_step(plan);
    if (step == 0)
        return kvo__error(KVO_ERANGE, "kvo_connector_create: the lcm of the groups' tokens_per_block overflows");
    uint64_t maxslot = kvo_plan_max_slot_bytes(plan);
    if (maxslot == 0) return kvo__error(KVO_EINVAL, "kvo_connector_create: the plan offloads no group");
    if (p->host_bytes < maxslot)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: host_bytes %llu is below the largest slot (%llu bytes); "
                          "use at least %llu (better many times that)",
                          (unsigned long long)p->host_bytes, (unsigned long long)maxslot,
                          (unsigned long long)maxslot);
    if (p->checkpoint_interval % step)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: checkpoint_interval %llu is not a multiple of the hit step "
                          "%llu; use %llu",
                          (unsigned long long)p->checkpoint_interval, (unsigned long long)step,
                          (unsigned long long)((p->checkpoint_interval / step + 1) * step));
    for (size_t g = 0; g < 64; g++) {
        if (!((p->scratch_groups >> g) & 1)) continue;
        if (g >= ng)
            return kvo__error(KVO_EINVAL, "kvo_connector_create: scratch_groups names group %zu; the plan has %zu",
                              g, ng);
        if (kvo_plan_group(plan, g)->offloaded)
            return kvo__error(KVO_EINVAL,
                              "kvo_connector_create: scratch_groups names group '%s', which is cacheable "
                              "(only non-cacheable groups can be scratch)",
                              kvo_plan_group(plan, g)->name);
    }
    if (p->sliding_store != KVO_SLIDING_STORE_ALL && p->sliding_store != KVO_SLIDING_STORE_CHECKPOINTS)
        return kvo__error(KVO_EINVAL, "kvo_connector_create: sliding_store %d is not ALL (0) or CHECKPOINTS (1)",
                          (int)p->sliding_store);
    if (p->file_mode != KVO_FILE_WRITE_THROUGH && p->file_mode != KVO_FILE_WRITE_BACK)
        return kvo__error(KVO_EINVAL,
                          "kvo_connector_create: file_mode %d is not WRITE_THROUGH (0) or WRITE_BACK (1)",
                          (int)p->file_mode);

    kvo_connector *c = kvo__calloc(1, sizeof *c);
    if (!c) return kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory");
    c->p = *p;
    c->plan = plan;
    c->ng = ng;
    c->step = step;
    c->min_hit = p->min_hit_tokens ? p->min_hit_tokens : kvo__agree_min_hit_default(plan);
    c->fingerprint = kvo_plan_fingerprint(plan);
    c->file = p->file_tier;
    if (c->p.max_requests == 0) c->p.max_requests = 4096;
    pthread_mutex_init(&c->mu, NULL);
    int rc;
    if (p->salt_len) {
        if (!p->salt) {
            rc = kvo__error(KVO_EINVAL, "kvo_connector_create: salt is NULL with salt_len %zu", p->salt_len);
            goto fail;
        }
        c->salt = kvo__malloc(p->salt_len);
        if (!c->salt) {
            rc = kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory");
            goto fail;
        }
        memcpy(c->salt, p->salt, p->salt_len);
    }
    c->p.salt = c->salt;
    c->p.shm_path = NULL; /* not kept */

    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = p->host_bytes;
    ap.huge_pages = p->huge_pages;
    ap.lock = p->lock_memory;
    ap.prefault = p->prefault;
    ap.shm_path = p->shm_path;
    if ((rc = kvo_arena_create(&ap, &c->arena))) goto fail;
    c->arena_base = kvo_arena_base(c->arena);

    kvo_store_params sp = kvo_store_default_params();
    sp.plan = plan;
    sp.capacity_bytes = kvo_arena_size(c->arena);
    sp.policy = p->policy;
    sp.admit_after = p->admit_after;
    sp.event_capacity = p->event_capacity;
    if ((rc = kvo_store_create(&sp, &c->store))) goto fail;

    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = plan;
    if (p->transfer_threads) tp.threads = p->transfer_threads;
    if (p->max_queued_jobs) tp.max_queued_jobs = p->max_queued_jobs;
    tp.nontemporal = p->nontemporal;
    if ((rc = kvo_transfer_create(&tp, &c->xfer))) goto fail;

    if ((rc = kvo__map_init(&c->reqs, 64)) || (rc = kvo__map_init(&c->jobs, 64)) ||
        (rc = kvo__map_init(&c->blocks, 256)) || (rc = kvo__map_init(&c->reads, 64)))
        goto fail;
    if (p->verify_checksums) {
        c->n_sums = (size_t)(kvo_arena_size(c->arena) / KVO_SLOT_ALIGN) + 1;
        c->sums = kvo__calloc(c->n_sums, sizeof *c->sums);
        if (!c->sums) {
            rc = kvo__error(KVO_ENOMEM, "kvo_connector_create: out of memory for %zu checksums", c->n_sums);
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    kvo_connector_destroy(c);
    return rc;
}

static void kvo__process_results(kvo_connector *c);

/* Wait until every file-tier read into the arena has completed (the tier
 * outlives the connector; its reads must not land in unmapped memory). */
static void kvo__drain_reads(kvo_connector *c) {
    while (c->file && c->reads.e && c->reads.n) {
        kvo_file_completion fc[32];
        size_t n = kvo_file_tier_poll(c->file, fc, 32);
        for (size_t i = 0; i < n; i++) {
            if (fc[i].op != KVO_FILE_OP_READ) continue;
            kvo__map_entry *e = kvo__map_get(&c->reads, fc[i].user_data);
            if (!e) continue;
            kvo__free(e->p);
            kvo__map_del(&c->reads, e);
        }
        if (n == 0 && kvo_file_tier_wait(c->file, 100) == KVO_ENOTFOUND) break;
    }
}

void kvo_connector_destroy(kvo_connector *c) {
    if (!c) return;
    if (c->xfer) {
        kvo_transfer_close(c->xfer); /* queued jobs cancel, running ones finish */
        if (c->file && c->store && c->jobs.e && c->p.file_mode == KVO_FILE_WRITE_BACK &&
            c->p.file_persist_on_destroy) {
            kvo__lock(c);
            kvo__process_results(c); /* finished stores become READY */
            kvo__unlock(c);
            (void)kvo_connector_flush_to_file(c, -1, NULL);
        }
        kvo_transfer_destroy(c->xfer);
    }
    kvo__drain_reads(c);
    if (c->reads.e)
        for (size_t i = 0; i < c->reads.cap; i++)
            if (c->reads.e[i].used) kvo__free(c->reads.e[i].p);
    kvo__map_free(&c->reads);
    if (c->jobs.e)
        for (size_t i = 0; i < c->jobs.cap; i++)
            if (c->jobs.e[i].used) kvo__job_free(c->jobs.e[i].p);
    if (c->reqs.e)
        for (size_t i = 0; i < c->reqs.cap; i++)
            if (c->reqs.e[i].used) kvo__req_free(c->reqs.e[i].p);
    kvo__map_free(&c->jobs);
    kvo__map_free(&c->reqs);
    kvo__map_free(&c->blocks);
    kvo_store_destroy(c->store);
    kvo_arena_destroy(c->arena);
    kvo__free(c->cq);
    kvo__free(c->s_keys);
    kvo__free(c->s_u8);
    kvo__free(c->s_slots);
    kvo__free(c->s_grp);
    kvo__free(c->s_chunk);
    kvo__free(c->s_ops);
    kvo__free(c->ones);
    kvo__free(c->s_tier);
    kvo__free(c->s_fst);
    kvo__free(c->s_fkeys);
    kvo__free(c->s_fidx);
    kvo__free(c->sums);
    kvo__free(c->ev_keys);
    kvo__free(c->ev_slots);
    kvo__free(c->salt);
    pthread_mutex_destroy(&c->mu);
    kvo__free(c);
}

int kvo_connector_set_layout(kvo_connector *c, const kvo_segment *segs, size_t n) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_set_layout: c must not be NULL");
    int rc = kvo_transfer_set_layout(c->xfer, segs, n);
    if (rc) return rc;
    kvo__lock(c);
    c->layout_set = true;
    kvo__unlock(c);
    return 0;
}

uint64_t kvo_connector_step(const kvo_connector *c) { return c ? c->step : 0; }
kvo_store *kvo_connector_store(kvo_connector *c) { return c ? c->store : NULL; }
kvo_transfer *kvo_connector_transfer(kvo_connector *c) { return c ? c->xfer : NULL; }
kvo_arena *kvo_connector_arena(kvo_connector *c) { return c ? c->arena : NULL; }

void kvo__connector_inject_failures(kvo_connector *c, uint32_t loads, uint32_t stores) {
    kvo__lock(c);
    c->inject_load_fail = loads;
    c->inject_store_fail = stores;
    kvo__unlock(c);
}

/* ------------------------------------------------------------- tokens -- */

static int kvo__push_units(kvo__req *r, size_t n) {
    return kvo__grow((void **)&r->units, &r->cap_units, r->n_units + n, sizeof *r->units, 16, "connector");
}

static int kvo__append_tokens_locked(kvo_connector *c, kvo__req *r, const uint32_t *tokens, size_t n) {
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    size_t i = 0;
    int rc = kvo__push_units(r, n / tph + 2);
    if (rc) return rc;
    while (r->n_tail > 0 && i < n) {
        r->tail[r->n_tail++] = tokens[i++];
        if (r->n_tail == tph) {
            kvo_u128 parent = r->n_units ? r->units[r->n_units - 1] : r->ns;
            r->units[r->n_units++] = kvo_hash_unit(parent, r->tail, tph, r->extra, r->extra_len);
            r->n_tail = 0;
        }
    }
    size_t full = (n - i) / tph * tph;
    if (full) {
        size_t got = 0;
        kvo_u128 parent = r->n_units ? r->units[r->n_units - 1] : r->ns;
        rc = kvo_hash_tokens(parent, tokens + i, full, tph, r->extra, r->extra_len, r->units + r->n_units,
                             r->cap_units - r->n_units, &got);
        if (rc) return rc;
        r->n_units += got;
        i += full;
    }
    while (i < n) r->tail[r->n_tail++] = tokens[i++];
    r->n_tokens += n;
    return 0;
}

/* Engine-given unit hash -> namespaced unit: XXH3-128(ns || h as 4 LE32 ||
 * extra) through the public unit hash. */
static kvo_u128 kvo__mix_unit(const kvo__req *r, kvo_u128 h) {
    uint32_t w[4] = {(uint32_t)h.lo, (uint32_t)(h.lo >> 32), (uint32_t)h.hi, (uint32_t)(h.hi >> 32)};
    return kvo_hash_unit(r->ns, w, 4, r->extra, r->extra_len);
}

/* The best boundary for a sequence whose chunks complete within x tokens are
 * all present (used for the checkpoint policy).  Boundary <= x. */
static uint64_t kvo__best_boundary(kvo_connector *c, uint64_t x) {
    size_t maxc = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (gp->offloaded && x / gp->tokens_per_chunk > maxc) maxc = x / gp->tokens_per_chunk;
    }
    if (kvo__grow((void **)&c->ones, &c->ones_cap, maxc + 1, 1, 16, "connector")) return 0;
    memset(c->ones, KVO_READY, c->ones_cap);
    const uint8_t *ptr[KVO_MAX_GROUPS];
    size_t n[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        ptr[g] = c->ones;
        n[g] = gp->offloaded ? x / gp->tokens_per_chunk : 0;
    }
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    in.plan = c->plan;
    in.n_tokens = x + 1;
    in.min_hit_tokens = 1;
    in.scratch_groups = ~UINT64_C(0);
    in.chunk_states = ptr;
    in.n_chunks = n;
    kvo_agree_result res;
    if (kvo_agree(&in, &res)) return 0;
    return res.tokens;
}

int kvo_connector_add_request(kvo_connector *c, const kvo_request_desc *d) {
    if (!c || !d) return kvo__error(KVO_EINVAL, "kvo_connector_add_request: c and d must not be NULL");
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    bool hash_mode = d->unit_hashes != NULL;
    if (hash_mode == (d->tokens != NULL))
        return kvo__error(KVO_EINVAL, "request %llu: give exactly one of tokens and unit_hashes",
                          (unsigned long long)d->id);
    uint64_t prompt = hash_mode ? d->prompt_tokens : d->n_tokens;
    if (prompt == 0) return kvo__error(KVO_EINVAL, "request %llu: empty prompt", (unsigned long long)d->id);
    if (hash_mode && (prompt / tph != d->n_units))
        return kvo__error(KVO_EINVAL,
                          "request %llu: %zu unit hashes do not match prompt_tokens %llu (tokens_per_hash %u: "
                          "expected %llu units)",
                          (unsigned long long)d->id, d->n_units, (unsigned long long)prompt, tph,
                          (unsigned long long)(prompt / tph));
    if ((d->cache_salt_len && !d->cache_salt) || (d->extra_len && !d->extra))
        return kvo__error(KVO_EINVAL, "request %llu: cache_salt / extra is NULL with a nonzero length",
                          (unsigned long long)d->id);
    kvo__req *r = kvo__calloc(1, sizeof *r);
    if (!r) return kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)d->id);
    r->id = d->id;
    r->hash_mode = hash_mode;
    r->tail = kvo__malloc((size_t)tph * sizeof *r->tail);
    int rc = 0;
    if (!r->tail) goto oom;
    /* namespace: fingerprint + connector salt + request salt */
    {
        size_t sl = c->p.salt_len + d->cache_salt_len;
        uint8_t *buf = kvo__malloc(sl ? sl : 1);
        if (!buf) goto oom;
        if (c->p.salt_len) memcpy(buf, c->salt, c->p.salt_len);
        if (d->cache_salt_len) memcpy(buf + c->p.salt_len, d->cache_salt, d->cache_salt_len);
        r->ns = kvo_keys_namespace(c->fingerprint, buf, sl);
        kvo__free(buf);
    }
    if (d->extra_len) {
        r->extra = kvo__malloc(d->extra_len);
        if (!r->extra) goto oom;
        memcpy(r->extra, d->extra, d->extra_len);
        r->extra_len = d->extra_len;
    }
    r->prompt_tokens = prompt;
    r->st.prompt_tokens = prompt;

    kvo__lock(c);
    if (kvo__req_get(c, d->id)) {
        kvo__unlock(c);
        kvo__req_free(r);
        return kvo__error(KVO_EEXIST, "request %llu: id already live", (unsigned long long)d->id);
    }
    if (c->st.requests_live >= c->p.max_requests) {
        kvo__unlock(c);
        kvo__req_free(r);
        return kvo__error(KVO_ENOSPC, "request %llu: %u requests live (max_requests); finish some first",
                          (unsigned long long)d->id, c->p.max_requests);
    }
    if (hash_mode) {
        rc = kvo__push_units(r, d->n_units);
        if (!rc) {
            for (size_t i = 0; i < d->n_units; i++) r->units[i] = kvo__mix_unit(r, d->unit_hashes[i]);
            r->n_units = d->n_units;
            r->n_tokens = prompt;
        }
    } else {
        rc = kvo__append_tokens_locked(c, r, d->tokens, d->n_tokens);
    }
    if (!rc && c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS) {
        uint64_t a = kvo__best_boundary(c, prompt), b = prompt > 1 ? kvo__best_boundary(c, prompt - 1) : 0;
        if (a) r->ckpt[r->n_ckpt++] = a;
        if (b && b != a) r->ckpt[r->n_ckpt++] = b;
    }
    kvo__map_entry *e = NULL;
    if (!rc) rc = kvo__map_put(&c->reqs, d->id, &e);
    if (rc < 0 || rc == 1) {
        kvo__unlock(c);
        kvo__req_free(r);
        return rc < 0 ? rc : KVO_EEXIST;
    }
    e->p = r;
    c->st.requests_added++;
    c->st.requests_live++;
    kvo__unlock(c);
    return 0;
oom:
    kvo__req_free(r);
    return kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)d->id);
}

int kvo_connector_append_tokens(kvo_connector *c, uint64_t id, const uint32_t *tokens, size_t n) {
    if (!c || (!tokens && n)) return kvo__error(KVO_EINVAL, "kvo_connector_append_tokens: NULL argument");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc;
    if (!r) rc = kvo__req_missing(id);
    else if (r->hash_mode)
        rc = kvo__error(KVO_ESTATE, "request %llu: created with unit hashes; use append_unit_hashes",
                        (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    else
        rc = kvo__append_tokens_locked(c, r, tokens, n);
    kvo__unlock(c);
    return rc;
}

int kvo_connector_append_unit_hashes(kvo_connector *c, uint64_t id, const kvo_u128 *units, size_t n,
                                     uint64_t n_tokens_total) {
    if (!c || (!units && n)) return kvo__error(KVO_EINVAL, "kvo_connector_append_unit_hashes: NULL argument");
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else if (!r->hash_mode)
        rc = kvo__error(KVO_ESTATE, "request %llu: created with tokens; use append_tokens", (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    else if (n_tokens_total < r->n_tokens || n_tokens_total / tph != r->n_units + n)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: %llu tokens need %llu units; have %zu + %zu given",
                        (unsigned long long)id, (unsigned long long)n_tokens_total,
                        (unsigned long long)(n_tokens_total / tph), r->n_units, n);
    else if (!(rc = kvo__push_units(r, n))) {
        for (size_t i = 0; i < n; i++) r->units[r->n_units + i] = kvo__mix_unit(r, units[i]);
        r->n_units += n;
        r->n_tokens = n_tokens_total;
    }
    kvo__unlock(c);
    return rc;
}

/* ------------------------------------------------------------- lookup -- */

/* Release the hit pinned by the last lookup (pinned host entries), and make
 * file reads still running for it orphans (their completion then only
 * finishes the host entry). */
static void kvo__unpin_hit(kvo_connector *c, kvo__req *r) {
    if (!r->hit_pinned) return;
    size_t n = 0;
    if (kvo__scratch(c, r->n_hit) == 0) {
        for (size_t i = 0; i < r->n_hit; i++)
            if (r->hit[i].pinned) c->s_keys[n++] = r->hit[i].key;
        if (n) (void)kvo_store_complete_load(c->store, c->s_keys, n);
    }
    r->hit_pinned = false;
    r->n_hit = 0;
    r->file_pending = 0;
    r->file_status = 0;
    r->gen++;
}

#define KVO__NOFILE 1 /* internal: retry the lookup without the file tier */

static int kvo__cmp_range(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Tokens of [L, b) covered by the need ranges of the hit's file items. */
static uint64_t kvo__file_tokens(kvo_connector *c, kvo__req *r, uint64_t L, uint64_t b) {
    size_t nf = 0;
    for (size_t i = 0; i < r->n_hit; i++) nf += r->hit[i].tier == TIER_FILE;
    if (!nf) return 0;
    uint64_t *rg = kvo__malloc(nf * 2 * sizeof *rg);
    if (!rg) return b - L; /* conservative */
    size_t k = 0;
    for (size_t i = 0; i < r->n_hit; i++) {
        if (r->hit[i].tier != TIER_FILE) continue;
        kvo__need_range(kvo_plan_group(c->plan, r->hit[i].key.group), r->hit[i].chunk, L, b, &rg[2 * k],
                        &rg[2 * k + 1]);
        k++;
    }
    qsort(rg, nf, 2 * sizeof *rg, kvo__cmp_range);
    uint64_t tot = 0, cs = rg[0], ce = rg[1];
    for (size_t i = 1; i < nf; i++) {
        if (rg[2 * i] <= ce) {
            if (rg[2 * i + 1] > ce) ce = rg[2 * i + 1];
        } else {
            tot += ce - cs;
            cs = rg[2 * i];
            ce = rg[2 * i + 1];
        }
    }
    tot += ce - cs;
    kvo__free(rg);
    return tot;
}

/* Start reading the hit's file items into host slots (reserved PENDING in
 * the host store).  0, KVO__NOFILE (could not: everything undone), or an
 * error. */
static int kvo__start_file_reads(kvo_connector *c, kvo__req *r) {
    size_t nf = 0;
    for (size_t i = 0; i < r->n_hit; i++) nf += r->hit[i].tier == TIER_FILE;
    if (!nf) return 0;
    int rc = kvo__fscratch(c, nf);
    if (rc) return rc;
    size_t k = 0;
    for (size_t i = 0; i < r->n_hit; i++)
        if (r->hit[i].tier == TIER_FILE) {
            c->s_fkeys[k] = r->hit[i].key;
            c->s_fidx[k++] = i;
        }
    /* reserve host slots: every key must need writing (absent in host) */
    kvo_slot *slots = kvo__malloc(nf * (sizeof(kvo_slot) + sizeof(void *) + sizeof(uint64_t) + sizeof(int)));
    if (!slots) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    void **dsts = (void **)(slots + nf);
    uint64_t *ud = (uint64_t *)(dsts + nf);
    int *res = (int *)(ud + nf);
    rc = kvo__prepare_store(c, c->s_fkeys, nf, c->s_fst, slots);
    if (rc) {
        kvo__free(slots);
        return rc == KVO_ENOMEM ? rc : KVO__NOFILE;
    }
    bool all = true;
    for (size_t i = 0; i < nf; i++) all &= c->s_fst[i] == 1;
    if (!all) { /* raced: some key appeared in host meanwhile */
        for (size_t i = 0; i < nf; i++)
            if (c->s_fst[i]) (void)kvo_store_complete_store(c->store, &c->s_fkeys[i], 1, false);
        kvo__free(slots);
        return KVO__NOFILE;
    }
    for (size_t i = 0; i < nf; i++) {
        dsts[i] = kvo__slot_ptr(c, slots[i]);
        ud[i] = ++c->next_read;
        r->hit[c->s_fidx[i]].slot = slots[i];
    }
    size_t nq = 0;
    rc = kvo_file_tier_read(c->file, c->s_fkeys, dsts, nf, ud, res, &nq);
    if (rc) {
        (void)kvo_store_complete_store(c->store, c->s_fkeys, nf, false);
        kvo__free(slots);
        return KVO__NOFILE;
    }
    bool failed = false;
    for (size_t i = 0; i < nf; i++) {
        if (res[i] != 0) {
            (void)kvo_store_complete_store(c->store, &c->s_fkeys[i], 1, false);
            c->st.file_read_failures++;
            failed = true;
            continue;
        }
        kvo__read *rd = kvo__malloc(sizeof *rd);
        kvo__map_entry *e = NULL;
        if (!rd || kvo__map_put(&c->reads, ud[i], &e) < 0) {
            /* cannot track: the read still lands in the slot, so the slot
             * must stay reserved; it is lost until clear (counted) */
            kvo__free(rd);
            c->st.file_read_failures++;
            failed = true;
            continue;
        }
        rd->key = c->s_fkeys[i];
        rd->slot = slots[i];
        rd->req = r->id;
        rd->gen = r->gen;
        rd->item = c->s_fidx[i];
        e->p = rd;
        r->file_pending++;
    }
    kvo__free(slots);
    if (failed) {
        /* the queued reads finish as orphans (gen bumped by unpin) */
        return KVO__NOFILE;
    }
    return 0;
}

/* One lookup attempt; returns 0, KVO_EAGAIN (pin raced with an eviction:
 * retry), KVO__NOFILE (retry without the file tier) or an error. */
static int kvo__lookup_once(kvo_connector *c, kvo__req *r, uint64_t L, kvo_lookup_result *out, bool use_file) {
    uint64_t N = r->n_tokens;
    uint64_t S = c->step;
    uint64_t bmax = N ? (N - 1) / S * S : 0;
    size_t off[KVO_MAX_GROUPS], ncs[KVO_MAX_GROUPS], total = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        off[g] = total;
        ncs[g] = 0;
        if (!gp->offloaded || bmax <= L) continue;
        uint64_t nc = r->n_units / gp->hashes_per_chunk;
        uint64_t need = kvo__div_ceil_u64(bmax, gp->tokens_per_chunk);
        ncs[g] = (size_t)(nc < need ? nc : need);
        total += ncs[g];
    }
    int rc = kvo__scratch(c, total + 1);
    if (rc) return rc;
    /* keys of the non-local chunks, states LOCAL below L */
    size_t nk = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        uint8_t *st = c->s_u8 + off[g];
        for (size_t ch = 0; ch < ncs[g]; ch++) {
            c->s_tier[off[g] + ch] = TIER_HOST;
            if ((ch + 1) * gp->tokens_per_chunk <= L) {
                st[ch] = KVO_CHUNK_LOCAL;
                continue;
            }
            kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, &c->s_keys[nk], 1);
            c->s_grp[nk] = (uint32_t)g;
            c->s_chunk[nk] = ch;
            nk++;
        }
    }
    if (nk) {
        uint8_t *hs = (uint8_t *)c->s_slots; /* s_cap * 16 bytes >= nk */
        rc = kvo_store_lookup(c->store, c->s_keys, nk, hs);
        if (rc) return rc;
        size_t nmiss = 0;
        for (size_t i = 0; i < nk; i++) {
            c->s_u8[off[c->s_grp[i]] + c->s_chunk[i]] = hs[i];
            nmiss += hs[i] == KVO_MISS;
        }
        if (use_file && c->file && nmiss) {
            if ((rc = kvo__fscratch(c, nmiss))) return rc;
            size_t m = 0;
            for (size_t i = 0; i < nk; i++)
                if (hs[i] == KVO_MISS) {
                    c->s_fkeys[m] = c->s_keys[i];
                    c->s_fidx[m++] = off[c->s_grp[i]] + c->s_chunk[i];
                }
            if (kvo_file_tier_lookup(c->file, c->s_fkeys, m, c->s_fst) == 0)
                for (size_t i = 0; i < m; i++) {
                    if (c->s_fst[i] == KVO_MISS) continue;
                    c->s_u8[c->s_fidx[i]] = c->s_fst[i];
                    c->s_tier[c->s_fidx[i]] = TIER_FILE;
                }
        }
    }
    const uint8_t *ptr[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) ptr[g] = c->s_u8 + off[g];
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    in.plan = c->plan;
    in.n_tokens = N;
    in.local_tokens = L;
    in.min_hit_tokens = c->min_hit;
    in.scratch_groups = c->p.scratch_groups;
    in.chunk_states = ptr;
    in.n_chunks = ncs;
    kvo_agree_result ar;
    rc = kvo_agree(&in, &ar);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->local_tokens = L;
    out->tokens = ar.tokens;
    out->tokens_if_pending = ar.tokens_if_pending;
    out->limiting_group = ar.limiting_group;
    out->reason = ar.reason;
    if (ar.tokens_if_pending > ar.tokens) {
        out->status = KVO_HIT_PENDING;
        return 0;
    }
    if (ar.tokens <= L) {
        out->status = KVO_HIT_NONE;
        return 0;
    }
    /* the chunks the load will read */
    uint64_t b = ar.tokens;
    size_t nh = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        for (size_t ch = 0; ch < ncs[g]; ch++) {
            uint64_t lo, hi;
            kvo__need_range(gp, ch, L, b, &lo, &hi);
            if (lo >= hi) continue;
            if ((rc = kvo__grow((void **)&r->hit, &r->cap_hit, nh + 1, sizeof *r->hit, 16, "connector"))) return rc;
            kvo__hit_item *it = &r->hit[nh++];
            kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, &it->key, 1);
            it->chunk = ch;
            it->tier = c->s_tier[off[g] + ch];
            it->pinned = 0;
            memset(&it->slot, 0, sizeof it->slot);
        }
    }
    /* pin the host items */
    size_t nhost = 0;
    if ((rc = kvo__scratch(c, nh + 1))) return rc;
    for (size_t i = 0; i < nh; i++)
        if (r->hit[i].tier == TIER_HOST) {
            c->s_keys[nhost] = r->hit[i].key;
            c->s_chunk[nhost++] = i;
        }
    if (nhost) {
        rc = kvo_store_prepare_load(c->store, c->s_keys, nhost, c->s_slots);
        if (rc == KVO_ENOTFOUND || rc == KVO_EAGAIN) return KVO_EAGAIN;
        if (rc) return rc;
        for (size_t i = 0; i < nhost; i++) {
            kvo__hit_item *it = &r->hit[c->s_chunk[i]];
            it->slot = c->s_slots[i];
            it->pinned = 1;
        }
        (void)kvo_store_touch(c->store, c->s_keys, nhost);
    }
    r->n_hit = nh;
    r->hit_pinned = true;
    r->hit_tokens = b;
    r->hit_local = L;
    r->file_pending = 0;
    r->file_status = 0;
    if (nhost < nh) {
        rc = kvo__start_file_reads(c, r);
        if (rc) {
            kvo__unpin_hit(c, r);
            return rc;
        }
        (void)kvo_file_tier_touch(c->file, c->s_fkeys, nh - nhost); /* recency only */
    }
    r->hit_file_tokens = kvo__file_tokens(c, r, L, b);
    r->hit_host_tokens = b - L - r->hit_file_tokens;
    out->status = KVO_HIT;
    out->tokens_host = r->hit_host_tokens;
    out->tokens_file = r->hit_file_tokens;
    return 0;
}

int kvo_connector_lookup(kvo_connector *c, uint64_t id, uint64_t local_tokens, kvo_lookup_result *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_lookup: c and out must not be NULL");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else if (r->state != REQ_ACTIVE)
        rc = kvo__error(KVO_ESTATE, "request %llu: lookup while %s", (unsigned long long)id,
                        r->state == REQ_LOADING ? "a load is in flight" : "finished");
    else if (local_tokens % c->step || local_tokens > r->n_tokens)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: local_tokens %llu must be a multiple of the hit step %llu and at most "
                        "the %llu tokens of the request",
                        (unsigned long long)id, (unsigned long long)local_tokens, (unsigned long long)c->step,
                        (unsigned long long)r->n_tokens);
    if (rc) {
        kvo__unlock(c);
        return rc;
    }
    kvo__unpin_hit(c, r);
    bool use_file = true;
    for (int attempt = 0; attempt < 6; attempt++) {
        rc = kvo__lookup_once(c, r, local_tokens, out, use_file);
        if (rc == KVO__NOFILE) {
            use_file = false;
            continue;
        }
        if (rc != KVO_EAGAIN) break;
    }
    if (rc == KVO_EAGAIN || rc == KVO__NOFILE) { /* kept racing with evictions: report no hit */
        memset(out, 0, sizeof *out);
        out->local_tokens = out->tokens = out->tokens_if_pending = local_tokens;
        out->limiting_group = -1;
        rc = 0;
    }
    if (!rc) {
        r->st.lookups++;
        c->st.lookups++;
        c->st.lookup_tokens += r->n_tokens;
        if (out->status == KVO_HIT_PENDING) {
            r->st.pending_lookups++;
            c->st.lookup_pending++;
        } else if (out->status == KVO_HIT) {
            c->st.lookup_hits++;
            c->st.hit_tokens += out->tokens - local_tokens;
        }
    }
    kvo__unlock(c);
    return rc;
}

/* --------------------------------------------------------------- load -- */

static int kvo__check_tables(kvo_connector *c, uint64_t id, const kvo_block_table *tables, size_t n_tables,
                             uint64_t tokens) {
    if (!tables || n_tables != c->ng)
        return kvo__error(KVO_EINVAL, "request %llu: %zu block tables given; the plan has %zu groups",
                          (unsigned long long)id, tables ? n_tables : 0, c->ng);
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        uint64_t need = tokens / gp->tokens_per_block;
        if (tables[g].n < need || (tables[g].n && !tables[g].blocks))
            return kvo__error(KVO_EINVAL,
                              "request %llu: group '%s': block table has %zu entries; %llu tokens need %llu "
                              "blocks of %u tokens",
                              (unsigned long long)id, gp->name, tables[g].n, (unsigned long long)tokens,
                              (unsigned long long)need, gp->tokens_per_block);
    }
    return 0;
}

static int kvo__ops_cap(kvo_connector *c, size_t n) {
    return kvo__grow((void **)&c->s_ops, &c->s_ops_cap, n, sizeof *c->s_ops, 16, "connector");
}

/* Make room, before a submit, for tracking one more job of r reading or
 * writing n_blocks engine blocks, so that registering it cannot fail. */
static int kvo__job_reserve(kvo_connector *c, kvo__req *r, size_t n_blocks) {
    int rc = kvo__map_reserve(&c->jobs, 1);
    if (!rc) rc = kvo__map_reserve(&c->blocks, n_blocks);
    if (!rc) rc = kvo__grow((void **)&r->jobs, &r->cap_jobs, r->n_jobs + 1, sizeof *r->jobs, 16, "connector");
    return rc;
}

/* Track a submitted job (room reserved by kvo__job_reserve: cannot fail). */
static void kvo__job_register(kvo_connector *c, kvo__req *r, kvo__job *j) {
    kvo__map_entry *e = NULL;
    int rc = kvo__map_put(&c->jobs, j->id, &e);
    assert(rc == 0);
    (void)rc;
    e->p = j;
    assert(r->n_jobs < r->cap_jobs);
    r->jobs[r->n_jobs++] = j->id;
}

/* A LOAD completion for a load that never reached the transfer engine
 * (file reads failed, submit failed): nothing was written. */
static void kvo__fail_load_now(kvo_connector *c, kvo__req *r, int status) {
    kvo_completion cp;
    memset(&cp, 0, sizeof cp);
    cp.request = r->id;
    cp.type = KVO_COMPLETION_LOAD;
    cp.status = status;
    cp.tokens_valid = r->hit_local;
    r->n_invalid = 0;
    r->st.load_failures++;
    c->st.load_failures++;
    kvo__unpin_hit(c, r);
    kvo__req_set_state(c, r, REQ_ACTIVE);
    kvo__emit(c, &cp);
}

/* Submit a prepared load job (every item pinned). */
static int kvo__submit_load(kvo_connector *c, kvo__req *r, kvo__job *j) {
    int rc = kvo__job_reserve(c, r, 0);
    if (!rc) rc = kvo_transfer_submit(c->xfer, KVO_XFER_LOAD, j->ops, j->n_keys, &j->id);
    if (rc) return rc;
    kvo__job_register(c, r, j);
    r->load_job = j->id;
    kvo__req_set_state(c, r, REQ_LOADING);
    r->hit_pinned = false; /* the job owns the pins now */
    r->n_hit = 0;
    return 0;
}

int kvo_connector_load(kvo_connector *c, uint64_t id, uint64_t tokens, const kvo_block_table *tables,
                       size_t n_tables) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_load: c must not be NULL");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else if (r->state != REQ_ACTIVE || !r->hit_pinned)
        rc = kvo__error(KVO_ESTATE, "request %llu: load without a hit from lookup%s", (unsigned long long)id,
                        r->state == REQ_LOADING ? " (a load is in flight)" : "");
    else if (tokens == r->hit_local) {
        kvo__unpin_hit(c, r);
        kvo__unlock(c);
        return 0;
    } else if (tokens != r->hit_tokens)
        rc = kvo__error(KVO_EINVAL,
                        "request %llu: load of %llu tokens; the lookup's hit is %llu (or %llu to decline)",
                        (unsigned long long)id, (unsigned long long)tokens, (unsigned long long)r->hit_tokens,
                        (unsigned long long)r->hit_local);
    else if (!c->layout_set)
        rc = kvo__error(KVO_ESTATE, "request %llu: no engine layout registered (kvo_connector_set_layout)",
                        (unsigned long long)id);
    else
        rc = kvo__check_tables(c, id, tables, n_tables, tokens);
    if (!rc) rc = kvo__cq_reserve_owed(c); /* room for its completion */
    if (rc) {
        kvo__unlock(c);
        return rc;
    }
    uint64_t L = r->hit_local, b = r->hit_tokens;
    size_t nh = r->n_hit, nblocks = 0;
    for (size_t i = 0; i < nh; i++) {
        kvo__hit_item *it = &r->hit[i];
        const kvo_group_plan *gp = kvo_plan_group(c->plan, it->key.group);
        uint64_t lo, hi;
        kvo__need_range(gp, it->chunk, L, b, &lo, &hi);
        uint64_t tpb = gp->tokens_per_block, first = lo / tpb, nb = (hi - lo) / tpb;
        const uint64_t *blk = tables[it->key.group].blocks + first;
        for (uint64_t k = 0; k < nb; k++)
            if (blk[k] == KVO_NO_BLOCK) {
                rc = kvo__error(KVO_EINVAL,
                                "request %llu: group '%s': block %llu (tokens %llu..%llu) is KVO_NO_BLOCK but "
                                "must be loaded",
                                (unsigned long long)id, gp->name, (unsigned long long)(first + k),
                                (unsigned long long)((first + k) * tpb),
                                (unsigned long long)((first + k + 1) * tpb));
                goto out;
            }
        nblocks += nb;
    }
    /* room to list the blocks as invalid should the load fail */
    if ((rc = kvo__grow((void **)&r->invalid, &r->cap_invalid, nblocks, sizeof *r->invalid, 16, "connector"))) goto out;
    kvo__job *j = kvo__calloc(1, sizeof *j + nh * (sizeof(kvo_chunk_key) + sizeof(kvo_slot) + sizeof(kvo_xfer_op)) +
                                     nblocks * (sizeof(kvo_block_ref) + sizeof(uint64_t)));
    if (!j) {
        rc = kvo__error(KVO_ENOMEM, "request %llu: out of memory", (unsigned long long)id);
        goto out;
    }
    j->ops = (kvo_xfer_op *)(j + 1);
    j->keys = (kvo_chunk_key *)(j->ops + nh);
    j->slots = (kvo_slot *)(j->keys + nh);
    j->eblk = (uint64_t *)(j->slots + nh);
    j->blocks = (kvo_block_ref *)(j->eblk + nblocks);
    j->n_keys = nh;
    size_t bi = 0;
    for (size_t i = 0; i < nh; i++) {
        kvo__hit_item *it = &r->hit[i];
        const kvo_group_plan *gp = kvo_plan_group(c->plan, it->key.group);
        uint64_t lo, hi;
        kvo__need_range(gp, it->chunk, L, b, &lo, &hi);
        uint64_t tpb = gp->tokens_per_block, first = lo / tpb, nb = (hi - lo) / tpb;
        kvo_xfer_op *op = &j->ops[i];
        op->group = it->key.group;
        op->first_block = (uint32_t)(first - it->chunk * gp->blocks_per_chunk);
        op->n_blocks = (uint32_t)nb;
        op->engine_blocks = &j->eblk[bi];
        op->slot = kvo__slot_ptr(c, it->slot); /* file items: slot reserved at lookup */
        op->slot_bytes = it->slot.bytes;
        for (uint64_t k = 0; k < nb; k++) {
            j->eblk[bi] = tables[it->key.group].blocks[first + k];
            j->blocks[bi] = (kvo_block_ref){it->key.group, j->eblk[bi]};
            bi++;
        }
        j->keys[i] = it->key;
        j->slots[i] = it->slot;
    }
    j->n_blocks = bi;
    j->req = id;
    j->gen = r->gen;
    j->dir = KVO_XFER_LOAD;
    j->tokens = b;
    j->local = L;
    j->host_tokens = r->hit_host_tokens;
    j->file_tokens = r->hit_file_tokens;
    r->st.local_tokens = L;
    c->st.loads++;
    if (r->file_pending) { /* wait for the file reads; poll submits */
        r->deferred = j;
        kvo__req_set_state(c, r, REQ_LOADING);
    } else if (r->file_status) {
        kvo__job_free(j);
        kvo__fail_load_now(c, r, r->file_status);
    } else if ((rc = kvo__submit_load(c, r, j))) {
        kvo__job_free(j);
        c->st.loads--;
    }
out:
    kvo__unlock(c);
    return rc;
}

/* -------------------------------------------------------------- store -- */

static bool kvo__ckpt_wants(const kvo_connector *c, const kvo__req *r, const kvo_group_plan *gp, uint64_t ch) {
    uint64_t T = gp->tokens_per_chunk, cs = ch * T, lim = cs + T + gp->window; /* q in (cs, lim) */
    uint64_t I = c->p.checkpoint_interval;
    if (I) {
        uint64_t q = (lim - 1) / I * I;
        if (q > cs && q >= I) return true;
    }
    for (size_t i = 0; i < r->n_ckpt; i++)
        if (r->ckpt[i] > cs && r->ckpt[i] < lim) return true;
    return false;
}

/* Add chunk ch of group g to the store batch at index *n if its blocks are
 * all held by the table. */
static void kvo__batch_add(kvo_connector *c, kvo__req *r, size_t g, uint64_t ch, const kvo_block_table *t,
                           size_t *n) {
    const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
    uint64_t first = ch * gp->blocks_per_chunk;
    if (first + gp->blocks_per_chunk > t->n) return;
    for (uint64_t k = 0; k < gp->blocks_per_chunk; k++)
        if (t->blocks[first + k] == KVO_NO_BLOCK) return;
    kvo_chunk_keys(gp, r->units + ch * gp->hashes_per_chunk, gp->hashes_per_chunk, &c->s_keys[*n], 1);
    c->s_grp[*n] = (uint32_t)g;
    c->s_chunk[*n] = ch;
    (*n)++;
}

/* Reserve, copy and track a batch of n candidate chunks in the scratch
 * arrays.  Best effort: chunks that cannot be stored are counted. */
static void kvo__store_batch(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, size_t n) {
    if (n == 0) return;
    int rc = kvo__prepare_store(c, c->s_keys, n, c->s_u8, c->s_slots);
    if (rc == KVO_ENOSPC && n > 1) {
        /* all-or-nothing failed: try one by one, skipping those that do not fit */
        for (size_t i = 0; i < n; i++) {
            int r1 = kvo__prepare_store(c, &c->s_keys[i], 1, &c->s_u8[i], &c->s_slots[i]);
            if (r1) {
                c->s_u8[i] = 0;
                c->st.stores_skipped_nospace++;
                r->st.stores_skipped++;
            }
        }
        rc = 0;
    } else if (rc) {
        c->st.stores_skipped_nospace += n;
        r->st.stores_skipped += n;
        return;
    }
    size_t m = 0, nblocks = 0;
    if (kvo__ops_cap(c, n)) {
        /* cannot build ops: undo the reservations */
        for (size_t i = 0; i < n; i++)
            if (c->s_u8[i]) (void)kvo_store_complete_store(c->store, &c->s_keys[i], 1, false);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!c->s_u8[i]) continue;
        const kvo_group_plan *gp = kvo_plan_group(c->plan, c->s_grp[i]);
        kvo_xfer_op *op = &c->s_ops[m];
        op->group = c->s_grp[i];
        op->first_block = 0;
        op->n_blocks = (uint32_t)gp->blocks_per_chunk;
        op->engine_blocks = tables[c->s_grp[i]].blocks + c->s_chunk[i] * gp->blocks_per_chunk;
        op->slot = kvo__slot_ptr(c, c->s_slots[i]);
        op->slot_bytes = c->s_slots[i].bytes;
        c->s_keys[m] = c->s_keys[i];
        c->s_slots[m] = c->s_slots[i];
        nblocks += gp->blocks_per_chunk;
        m++;
    }
    if (m == 0) return;
    kvo__job *j = kvo__calloc(1, sizeof *j + m * (sizeof(kvo_chunk_key) + sizeof(kvo_slot)) +
                                     nblocks * sizeof(kvo_block_ref));
    if (j) {
        j->keys = (kvo_chunk_key *)(j + 1);
        j->slots = (kvo_slot *)(j->keys + m);
        j->blocks = (kvo_block_ref *)(j->slots + m);
        j->n_keys = m;
        size_t bi = 0;
        for (size_t i = 0; i < m; i++) {
            j->keys[i] = c->s_keys[i];
            j->slots[i] = c->s_slots[i];
            for (uint32_t k = 0; k < c->s_ops[i].n_blocks; k++)
                j->blocks[bi++] = (kvo_block_ref){c->s_ops[i].group, c->s_ops[i].engine_blocks[k]};
        }
        j->n_blocks = bi;
        j->req = r->id;
        j->gen = r->gen;
        j->dir = KVO_XFER_STORE;
        rc = kvo__job_reserve(c, r, bi);
        if (!rc) rc = kvo_transfer_submit(c->xfer, KVO_XFER_STORE, c->s_ops, m, &j->id);
    } else {
        rc = KVO_ENOMEM;
    }
    if (rc) {
        (void)kvo_store_complete_store(c->store, c->s_keys, m, false);
        c->st.stores_skipped_queue += m;
        r->st.stores_skipped += m;
        kvo__job_free(j);
        return;
    }
    kvo__job_register(c, r, j);
    for (size_t i = 0; i < j->n_blocks; i++) {
        kvo__map_entry *e = NULL;
        int prc = kvo__map_put(&c->blocks, kvo__block_key(j->blocks[i].group, j->blocks[i].block), &e);
        assert(prc >= 0); /* room reserved */
        (void)prc;
        e->a++;
        e->b = j->id;
    }
}

/* Store every newly complete chunk (up to computed tokens). */
static void kvo__issue_stores(kvo_connector *c, kvo__req *r, const kvo_block_table *tables, uint64_t computed) {
    size_t total = 0;
    uint64_t end[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        end[g] = 0;
        if (!gp->offloaded) continue;
        uint64_t a = computed / gp->tokens_per_chunk, b = r->n_units / gp->hashes_per_chunk;
        end[g] = a < b ? a : b;
        if (end[g] > r->next_chunk[g]) total += end[g] - r->next_chunk[g];
    }
    if (total == 0 || kvo__scratch(c, total)) return;
    size_t n = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        bool ckpt = gp->kind == KVO_GROUP_SLIDING && c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS;
        for (uint64_t ch = r->next_chunk[g]; ch < end[g]; ch++) {
            if (ckpt && !kvo__ckpt_wants(c, r, gp, ch)) continue;
            kvo__batch_add(c, r, g, ch, &tables[g], &n);
        }
        if (end[g] > r->next_chunk[g]) r->next_chunk[g] = end[g];
    }
    kvo__store_batch(c, r, tables, n);
}

static int kvo__check_update(kvo_connector *c, kvo__req *r, uint64_t id, uint64_t computed,
                             const kvo_block_table *tables, size_t n_tables) {
    if (!r) return kvo__req_missing(id);
    if (r->state == REQ_LOADING)
        return kvo__error(KVO_ESTATE, "request %llu: update while its load is in flight (poll the completion first)",
                          (unsigned long long)id);
    if (r->state == REQ_FINISHED) return kvo__error(KVO_ESTATE, "request %llu: finished", (unsigned long long)id);
    if (!c->layout_set)
        return kvo__error(KVO_ESTATE, "request %llu: no engine layout registered (kvo_connector_set_layout)",
                          (unsigned long long)id);
    if (computed > r->n_tokens)
        return kvo__error(KVO_EINVAL, "request %llu: computed_tokens %llu beyond the %llu tokens appended",
                          (unsigned long long)id, (unsigned long long)computed, (unsigned long long)r->n_tokens);
    return kvo__check_tables(c, id, tables, n_tables, computed);
}

int kvo_connector_update(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_update: c must not be NULL");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = kvo__check_update(c, r, id, computed_tokens, tables, n_tables);
    if (!rc) {
        kvo__unpin_hit(c, r); /* computing instead of loading: the hit is not needed */
        if (computed_tokens > r->computed) r->computed = computed_tokens;
        kvo__issue_stores(c, r, tables, computed_tokens);
    }
    kvo__unlock(c);
    return rc;
}

/* ---------------------------------------------------- waits & lifecycle -- */

/* Collect in-flight store job ids <= max_id (or the request's jobs). */
static int kvo__collect(kvo_connector *c, uint64_t max_id, uint64_t **ids, size_t *n) {
    size_t cnt = 0;
    for (size_t i = 0; i < c->jobs.cap; i++)
        if (c->jobs.e[i].used) cnt++;
    uint64_t *v = kvo__malloc((cnt + 1) * sizeof *v);
    if (!v) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < c->jobs.cap; i++) {
        if (!c->jobs.e[i].used) continue;
        kvo__job *j = c->jobs.e[i].p;
        if (j->dir == KVO_XFER_STORE && j->id <= max_id) v[k++] = j->id;
    }
    *ids = v;
    *n = k;
    return 0;
}

int kvo_connector_wait_blocks(kvo_connector *c, const kvo_block_ref *blocks, size_t n) {
    if (!c || (!blocks && n)) return kvo__error(KVO_EINVAL, "kvo_connector_wait_blocks: NULL argument");
    kvo__lock(c);
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (blocks[i].group >= c->ng) {
            kvo__unlock(c);
            return kvo__error(KVO_EINVAL, "kvo_connector_wait_blocks: group %u out of range (%zu groups)",
                              blocks[i].group, c->ng);
        }
        kvo__map_entry *e = kvo__map_get(&c->blocks, kvo__block_key(blocks[i].group, blocks[i].block));
        if (e && e->b > m) m = e->b;
    }
    uint64_t *ids = NULL;
    size_t k = 0;
    int rc = m ? kvo__collect(c, m, &ids, &k) : 0;
    kvo__unlock(c);
    if (!rc && k) rc = kvo_transfer_wait(c->xfer, ids, k, -1);
    kvo__free(ids);
    return rc;
}

/* Copy a request's in-flight job ids (caller frees). */
static int kvo__req_job_ids(kvo__req *r, uint64_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!r->n_jobs) return 0;
    *ids = kvo__malloc(r->n_jobs * sizeof **ids);
    if (!*ids) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    memcpy(*ids, r->jobs, r->n_jobs * sizeof **ids);
    *n = r->n_jobs;
    return 0;
}

int kvo_connector_wait_request(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_wait_request: c must not be NULL");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    uint64_t *ids = NULL;
    size_t n = 0;
    int rc = r ? kvo__req_job_ids(r, &ids, &n) : kvo__req_missing(id);
    kvo__unlock(c);
    if (!rc && n) rc = kvo_transfer_wait(c->xfer, ids, n, -1);
    kvo__free(ids);
    return rc;
}

/* Preempt: cancel or wait for copies, unpin, reset.  remove: then delete. */
static int kvo__preempt(kvo_connector *c, uint64_t id, bool remove) {
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    if (!r) {
        kvo__unlock(c);
        return kvo__req_missing(id);
    }
    /* The copies to wait for (the load's too, should cancel find it
     * running); taken first so that running out of memory changes nothing. */
    uint64_t *ids = NULL;
    size_t n = 0;
    int rc = kvo__req_job_ids(r, &ids, &n);
    if (rc) {
        kvo__unlock(c);
        return rc;
    }
    if (r->deferred) { /* a load still waiting for file reads: never submitted */
        kvo__job_free(r->deferred);
        r->deferred = NULL;
        c->st.loads--;
    }
    kvo__unpin_hit(c, r);
    if (r->load_job) {
        (void)kvo_transfer_cancel(c->xfer, r->load_job); /* 0 or already running */
        r->load_job = 0;
    }
    r->gen++; /* results of older copies no longer reach the engine */
    if (r->state == REQ_LOADING) kvo__req_set_state(c, r, REQ_ACTIVE);
    kvo__unlock(c);
    if (n) rc = kvo_transfer_wait(c->xfer, ids, n, -1);
    kvo__free(ids);
    kvo__lock(c);
    r = kvo__req_get(c, id);
    if (r) {
        if (remove) {
            kvo__req_remove(c, r);
        } else {
            r->computed = 0;
            for (size_t g = 0; g < c->ng; g++) r->next_chunk[g] = 0;
        }
    }
    kvo__unlock(c);
    return rc;
}

int kvo_connector_preempt(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_preempt: c must not be NULL");
    return kvo__preempt(c, id, false);
}

int kvo_connector_abort(kvo_connector *c, uint64_t id) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_abort: c must not be NULL");
    return kvo__preempt(c, id, true);
}

int kvo_connector_finish(kvo_connector *c, uint64_t id, uint64_t computed_tokens, const kvo_block_table *tables,
                         size_t n_tables, bool *busy) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_finish: c must not be NULL");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else if (r->state == REQ_LOADING)
        rc = kvo__error(KVO_ESTATE, "request %llu: finish while its load is in flight (poll it, or abort)",
                        (unsigned long long)id);
    else if (r->state == REQ_FINISHED)
        rc = kvo__error(KVO_ESTATE, "request %llu: already finished", (unsigned long long)id);
    else if (tables)
        rc = kvo__check_update(c, r, id, computed_tokens, tables, n_tables);
    if (!rc) rc = kvo__cq_reserve_owed(c); /* room for RELEASED */
    if (rc) {
        kvo__unlock(c);
        return rc;
    }
    kvo__unpin_hit(c, r);
    if (tables) {
        if (computed_tokens > r->computed) r->computed = computed_tokens;
        kvo__issue_stores(c, r, tables, computed_tokens);
        if (c->p.sliding_store == KVO_SLIDING_STORE_CHECKPOINTS) {
            /* the end-of-request checkpoint: the window before the best
             * boundary of the tokens computed so far */
            uint64_t q = kvo__best_boundary(c, computed_tokens);
            size_t total = 0;
            for (size_t g = 0; g < c->ng && q; g++) {
                const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
                if (gp->offloaded && gp->kind == KVO_GROUP_SLIDING)
                    total += gp->window / gp->tokens_per_chunk + 2;
            }
            if (total && kvo__scratch(c, total) == 0) {
                size_t n = 0;
                for (size_t g = 0; g < c->ng; g++) {
                    const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
                    if (!gp->offloaded || gp->kind != KVO_GROUP_SLIDING) continue;
                    uint64_t T = gp->tokens_per_chunk;
                    uint64_t lo = (q > gp->window ? q - gp->window : 0) / T, hi = kvo__div_ceil_u64(q, T);
                    uint64_t lim = r->n_units / gp->hashes_per_chunk;
                    for (uint64_t ch = lo; ch < hi && ch < lim && (ch + 1) * T <= computed_tokens; ch++)
                        kvo__batch_add(c, r, g, ch, &tables[g], &n);
                }
                kvo__store_batch(c, r, tables, n);
            }
        }
    }
    kvo__req_set_state(c, r, REQ_FINISHED);
    c->st.requests_finished++;
    bool b = r->n_jobs > 0;
    if (!b) kvo__req_remove(c, r);
    if (busy) *busy = b;
    kvo__unlock(c);
    return 0;
}

/* --------------------------------------------------------------- poll -- */

static void kvo__finish_store_job(kvo_connector *c, kvo__job *j, const kvo_xfer_result *res, kvo__req *r) {
    bool ok = res->status == 0;
    if (ok && c->inject_store_fail) {
        c->inject_store_fail--;
        ok = false;
    }
    /* Checksums are taken while the slots are still PENDING, at the first
     * poll after the copy: nothing can pin, evict or rewrite them yet. */
    if (ok && c->sums)
        for (size_t i = 0; i < j->n_keys; i++)
            c->sums[j->slots[i].offset / KVO_SLOT_ALIGN] = kvo__slot_sum(c, &j->keys[i], j->slots[i]);
    (void)kvo_store_complete_store(c->store, j->keys, j->n_keys, ok);
    if (ok) {
        c->st.chunks_stored += j->n_keys;
        c->st.bytes_stored += res->bytes;
        /* the tier copies before returning; no second checksum pass: the
         * sums were taken from these bytes just above */
        if (c->file && c->p.file_mode == KVO_FILE_WRITE_THROUGH)
            c->st.file_writes_dropped += kvo__file_put(c, j->keys, j->slots, j->n_keys, false, false, NULL);
        if (r) {
            r->st.chunks_stored += j->n_keys;
            r->st.bytes_stored += res->bytes;
        }
    } else {
        c->st.stores_failed += j->n_keys;
    }
    for (size_t i = 0; i < j->n_blocks; i++) {
        kvo__map_entry *e = kvo__map_get(&c->blocks, kvo__block_key(j->blocks[i].group, j->blocks[i].block));
        if (e && --e->a == 0) kvo__map_del(&c->blocks, e);
    }
}

static void kvo__finish_load_job(kvo_connector *c, kvo__job *j, const kvo_xfer_result *res, kvo__req *r) {
    int status = res->status;
    if (status == 0 && c->inject_load_fail) {
        c->inject_load_fail--;
        status = KVO_EIO;
    }
    (void)kvo_store_complete_load(c->store, j->keys, j->n_keys);
    if (status == 0 && c->sums)
        for (size_t i = 0; i < j->n_keys; i++)
            if (c->sums[j->slots[i].offset / KVO_SLOT_ALIGN] != kvo__slot_sum(c, &j->keys[i], j->slots[i])) {
                /* a corrupt chunk must not be hit again: drop its entry
                 * (fails with KVO_EBUSY if another load pinned it; that
                 * load's own check catches it) */
                status = KVO_ECORRUPT;
                c->st.checksum_failures++;
                (void)kvo_store_remove(c->store, &j->keys[i], 1);
            }
    if (!r || r->gen != j->gen || r->load_job != j->id) return; /* preempted or aborted */
    r->load_job = 0;
    kvo__req_set_state(c, r, REQ_ACTIVE);
    kvo_completion cp;
    memset(&cp, 0, sizeof cp);
    cp.request = r->id;
    cp.type = KVO_COMPLETION_LOAD;
    cp.status = status;
    r->n_invalid = 0;
    if (status == 0) {
        uint64_t t = j->tokens - j->local;
        cp.tokens_valid = j->tokens;
        if (j->tokens > r->computed) r->computed = j->tokens;
        r->st.tokens_loaded += t;
        r->st.tokens_loaded_host += j->host_tokens;
        r->st.tokens_loaded_file += j->file_tokens;
        r->st.bytes_loaded += res->bytes;
        r->st.chunks_loaded += j->n_keys;
        c->st.tokens_loaded += t;
        c->st.tokens_loaded_host += j->host_tokens;
        c->st.tokens_loaded_file += j->file_tokens;
        c->st.bytes_loaded += res->bytes;
        c->st.chunks_loaded += j->n_keys;
    } else {
        cp.tokens_valid = j->local;
        r->st.load_failures++;
        c->st.load_failures++;
        assert(j->n_blocks <= r->cap_invalid);
        if (j->n_blocks) memcpy(r->invalid, j->blocks, j->n_blocks * sizeof *r->invalid);
        r->n_invalid = j->n_blocks;
        cp.n_invalid_blocks = j->n_blocks;
    }
    kvo__emit(c, &cp);
}

static void kvo__process_results(kvo_connector *c) {
    kvo_xfer_result res[64];
    for (;;) {
        size_t n = 0;
        if (kvo_transfer_poll(c->xfer, res, 64, &n) || n == 0) break;
        for (size_t i = 0; i < n; i++) {
            kvo__map_entry *e = kvo__map_get(&c->jobs, res[i].job_id);
            if (!e) continue;
            kvo__job *j = e->p;
            kvo__map_del(&c->jobs, e);
            kvo__req *r = kvo__req_get(c, j->req);
            if (r) kvo__req_drop_job(r, j->id);
            if (j->dir == KVO_XFER_STORE)
                kvo__finish_store_job(c, j, &res[i], r);
            else
                kvo__finish_load_job(c, j, &res[i], r);
            if (r && r->state == REQ_FINISHED && r->n_jobs == 0) {
                kvo_completion cp;
                memset(&cp, 0, sizeof cp);
                cp.request = r->id;
                cp.type = KVO_COMPLETION_RELEASED;
                kvo__emit(c, &cp);
                kvo__req_remove(c, r);
            }
            kvo__job_free(j);
        }
    }
}

/* A file read into a host slot finished. */
static void kvo__finish_read(kvo_connector *c, const kvo_file_completion *fc) {
    kvo__map_entry *e = kvo__map_get(&c->reads, fc->user_data);
    if (!e) return;
    kvo__read *rd = e->p;
    kvo__map_del(&c->reads, e);
    bool ok = fc->result == 0;
    if (ok && c->sums) /* still PENDING, as for stores */
        c->sums[rd->slot.offset / KVO_SLOT_ALIGN] = kvo__slot_sum(c, &rd->key, rd->slot);
    (void)kvo_store_complete_store(c->store, &rd->key, 1, ok);
    if (ok) c->st.file_reads++;
    else c->st.file_read_failures++;
    kvo__req *r = kvo__req_get(c, rd->req);
    if (r && r->gen == rd->gen && r->hit_pinned && rd->item < r->n_hit &&
        kvo_chunk_key_eq(&r->hit[rd->item].key, &rd->key)) {
        kvo__hit_item *it = &r->hit[rd->item];
        if (ok) {
            kvo_slot sl;
            if (kvo_store_prepare_load(c->store, &rd->key, 1, &sl) == 0 && sl.offset == rd->slot.offset)
                it->pinned = 1;
            else
                ok = false;
        }
        if (!ok && !r->file_status) r->file_status = fc->result ? fc->result : KVO_EIO;
        if (r->file_pending) r->file_pending--;
        if (r->file_pending == 0 && r->deferred) {
            kvo__job *j = r->deferred;
            r->deferred = NULL;
            if (r->file_status) {
                kvo__job_free(j);
                kvo__fail_load_now(c, r, r->file_status);
            } else if (kvo__submit_load(c, r, j)) {
                kvo__job_free(j);
                kvo__fail_load_now(c, r, KVO_EAGAIN);
            }
        }
    }
    kvo__free(rd);
}

size_t kvo_connector_poll(kvo_connector *c, kvo_completion *out, size_t cap) {
    if (!c) return 0;
    kvo__lock(c);
    if (c->file) { /* the connector consumes the tier's completions */
        kvo_file_completion fc[32];
        size_t n;
        while ((n = kvo_file_tier_poll(c->file, fc, 32)) > 0)
            for (size_t i = 0; i < n; i++)
                if (fc[i].op == KVO_FILE_OP_READ) kvo__finish_read(c, &fc[i]);
    }
    kvo__process_results(c);
    size_t n = 0;
    while (out && n < cap && c->cq_n) {
        out[n++] = c->cq[c->cq_head];
        c->cq_head = (c->cq_head + 1) % c->cq_cap;
        c->cq_n--;
    }
    kvo__unlock(c);
    return n;
}

int kvo_connector_event_fd(const kvo_connector *c) { return c ? kvo_transfer_event_fd(c->xfer) : -1; }

int kvo_connector_invalid_blocks(kvo_connector *c, uint64_t id, uint32_t group, uint64_t *out, size_t cap,
                                 size_t *n) {
    if (!c || !n || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_connector_invalid_blocks: NULL argument");
    if (group >= c->ng)
        return kvo__error(KVO_EINVAL, "kvo_connector_invalid_blocks: group %u out of range (%zu groups)", group,
                          c->ng);
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else {
        size_t k = 0;
        for (size_t i = 0; i < r->n_invalid; i++)
            if (r->invalid[i].group == group) {
                if (k < cap) out[k] = r->invalid[i].block;
                k++;
            }
        *n = k;
    }
    kvo__unlock(c);
    return rc;
}

/* ---------------------------------------------------------- reporting -- */

int kvo_connector_request_stats(kvo_connector *c, uint64_t id, kvo_request_stats *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_request_stats: NULL argument");
    kvo__lock(c);
    kvo__req *r = kvo__req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__req_missing(id);
    else {
        *out = r->st;
        out->tokens = r->n_tokens;
        uint64_t have = r->st.local_tokens + r->st.tokens_loaded;
        out->tokens_computed = r->prompt_tokens > have ? r->prompt_tokens - have : 0;
    }
    kvo__unlock(c);
    return rc;
}

int kvo_connector_get_stats(kvo_connector *c, kvo_connector_stats *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_get_stats: NULL argument");
    kvo__lock(c);
    *out = c->st;
    kvo__unlock(c);
    return kvo_store_get_stats(c->store, &out->host);
}

/* ------------------------------------------------------ file persistence -- */

/* Milliseconds left until deadline (ns, 0 = none: -1). */
static int kvo__ms_left(uint64_t deadline) {
    if (!deadline) return -1;
    uint64_t now = kvo__now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

int kvo_connector_flush_to_file(kvo_connector *c, int timeout_ms, uint64_t *n_queued) {
    if (n_queued) *n_queued = 0;
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_flush_to_file: c must not be NULL");
    if (!c->file)
        return kvo__error(KVO_ESTATE, "kvo_connector_flush_to_file: no file tier attached (params.file_tier)");
    enum { B = 64 };
    uint64_t deadline = timeout_ms < 0 ? 0 : kvo__now_ns() + (uint64_t)timeout_ms * 1000000u + 1;
    kvo_store_entry ents[B];
    kvo_chunk_key keys[B];
    kvo_slot slots[B];
    int res[B];
    uint64_t cursor = 0, queued = 0;
    int rc = 0;
    do {
        size_t n = 0, m = 0;
        if (queued) { /* pace: one batch in the tier's queue at a time, so that
                         the tier's back-pressure does not refuse the next */
            rc = kvo_file_tier_flush(c->file, kvo__ms_left(deadline));
            if (rc) break;
        }
        kvo__lock(c);
        rc = kvo_store_scan(c->store, &cursor, ents, B, &n);
        for (size_t i = 0; i < n && !rc; i++)
            if (ents[i].state == KVO_READY) {
                keys[m] = ents[i].key;
                slots[m++] = ents[i].slot;
            }
        for (int attempt = 0; !rc && m; attempt++) {
            uint64_t q0 = c->st.file_writes;
            size_t dropped = kvo__file_put(c, keys, slots, m, true, true, res), k = 0;
            uint64_t progress = c->st.file_writes - q0;
            queued += progress;
            for (size_t i = 0; i < m; i++) {
                if (res[i] == KVO_ECLOSED) rc = KVO_ECLOSED;
                if (res[i] != KVO_EAGAIN) continue;
                keys[k] = keys[i];
                slots[k++] = slots[i];
            }
            /* after a drained queue, an attempt that queues nothing is a
             * real refusal (staging, quota): give up on those chunks */
            if (rc || k == 0 || (attempt > 0 && progress == 0)) {
                c->st.file_writes_dropped += dropped;
                break;
            }
            /* back-pressure: let the tier's queue drain, then retry what it
             * refused if it is still in host memory at the same slot */
            c->st.file_writes_dropped += dropped - k;
            kvo__unlock(c);
            int w = kvo_file_tier_flush(c->file, kvo__ms_left(deadline));
            kvo__lock(c);
            if (w) {
                c->st.file_writes_dropped += k;
                rc = w;
                break;
            }
            m = 0;
            for (size_t i = 0; i < k; i++) {
                kvo_store_entry e;
                if (kvo_store_peek(c->store, &keys[i], &e) == 0 && e.state == KVO_READY &&
                    e.slot.offset == slots[i].offset) {
                    keys[m] = keys[i];
                    slots[m++] = e.slot;
                }
            }
        }
        kvo__unlock(c);
    } while (!rc && cursor);
    if (!rc) rc = kvo_file_tier_flush(c->file, kvo__ms_left(deadline));
    if (n_queued) *n_queued = queued;
    if (rc == KVO_ETIMEDOUT)
        return kvo__error(KVO_ETIMEDOUT,
                          "kvo_connector_flush_to_file: file writes not finished after %d ms (%llu chunks queued "
                          "by this call; they continue)",
                          timeout_ms, (unsigned long long)queued);
    if (rc == KVO_ECLOSED) return kvo__error(KVO_ECLOSED, "kvo_connector_flush_to_file: the file tier is closing");
    return rc;
}

size_t kvo_connector_drain_events(kvo_connector *c, kvo_store_event *out, size_t cap, uint64_t *dropped) {
    if (!c) return 0;
    return kvo_store_drain_events(c->store, out, cap, dropped);
}
