/*
 * lookup: how many tokens of a request the tiers can serve above what the
 * engine holds locally.
 *
 * Phases (kvo__lookup_once): list the chunk keys above local_tokens and ask
 * the cascade where they are (one kvo_cascade_lookup: host, then the file
 * tier, then the cluster's presence answers within the request's budget,
 * never a wait), then the same for state snapshots off the block grid (only
 * for groups that ever had one stored: kvo_connector_store_snapshot); let
 * agree.c pick the longest boundary every group supports; list the chunks
 * that boundary needs (the hit; for a state group at a boundary off its
 * block grid, exactly the snapshot there); pin the host ones and have the
 * cascade promote the others into host slots (one batch per tier, each
 * tracked by a kvo__read whose id is the promotion's user data).  A pin
 * that races with an eviction retries the whole lookup (bounded); a
 * promotion that cannot start retries without that tier.  The hit stays
 * pinned until load (which takes the pins over), the next lookup, update,
 * preempt, abort or finish.
 *
 * Locks: the public call holds c->mu throughout; the cascade is only asked
 * to queue, never to wait.
 */
#include <stdlib.h>

#include "connector/connector_internal.h"

/* Token range [*lo, *hi) of chunk ch of group g needed to serve boundary b
 * above local L (see agree.c); empty when *lo >= *hi.  Block aligned. */
void kvo__conn_need_range(const kvo_group_plan *gp, uint64_t ch, uint64_t L, uint64_t b, uint64_t *lo,
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

/* Release the hit pinned by the last lookup (pinned host entries), and make
 * file reads still running for it orphans (their completion then only
 * finishes the host entry). */
void kvo__conn_unpin_hit(kvo_connector *c, kvo__req *r) {
    if (!r->hit_pinned) return;
    size_t n = 0;
    if (kvo__conn_scratch(c, r->n_hit) == 0) {
        for (size_t i = 0; i < r->n_hit; i++)
            if (r->hit[i].pinned) c->s_keys[n++] = r->hit[i].key;
        if (n) (void)kvo_cascade_complete_load(c->casc, c->s_keys, n);
    }
    r->hit_pinned = false;
    r->hit_stale = false;
    r->n_hit = 0;
    r->file_pending = 0;
    r->file_status = 0;
    r->gen++;
}

#define KVO__NOFILE 1   /* internal: retry the lookup without the file tier */
#define KVO__NOREMOTE 2 /* ... without the remote tier */
#define KVO__WAITLENT 3 /* no host slot for a lower tier's chunk while slots are lent to file
                           writes (file_zero_copy): answer PENDING, room comes when they end */

static int kvo__cmp_range(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Tokens of [L, b) covered by the need ranges of the hit's items whose
 * tier is in `tiers` (bit per kvo_tier_id). */
static uint64_t kvo__tier_tokens(kvo_connector *c, kvo__req *r, uint64_t L, uint64_t b, unsigned tiers) {
    size_t nf = 0;
    for (size_t i = 0; i < r->n_hit; i++) nf += (tiers >> r->hit[i].tier) & 1;
    if (!nf) return 0;
    uint64_t *rg = kvo__malloc(nf * 2 * sizeof *rg);
    if (!rg) return b - L; /* conservative */
    size_t k = 0;
    for (size_t i = 0; i < r->n_hit; i++) {
        if (!((tiers >> r->hit[i].tier) & 1)) continue;
        kvo__conn_need_range(kvo_plan_group(c->plan, r->hit[i].key.group), r->hit[i].chunk, L, b, &rg[2 * k],
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

/* Whether host slots are lent to file writes now (file_zero_copy). */
static bool kvo__lent_now(kvo_connector *c) {
    kvo_cascade_stats st = KVO_CASCADE_STATS_INIT;
    return kvo_cascade_get_stats(c->casc, &st) == 0 && st.lent_now > 0;
}

/* Promote the hit's items held by lower tiers into host slots (the
 * cascade reserves them PENDING and queues the reads, one batch per tier),
 * each tracked by a kvo__read.  0, KVO__NOFILE / KVO__NOREMOTE (one could
 * not start: retry without that tier; the promotions already queued finish
 * as orphans), KVO__WAITLENT, KVO_EAGAIN (one is in host memory now: look
 * again) or an error. */
static int kvo__start_reads(kvo_connector *c, kvo__req *r) {
    size_t nf = 0;
    for (size_t i = 0; i < r->n_hit; i++) nf += r->hit[i].tier != KVO_TIER_HOST;
    if (!nf) return 0;
    kvo_chunk_key *keys = kvo__malloc(nf * (sizeof *keys + sizeof(size_t) + sizeof(uint64_t) + sizeof(int) + 1));
    if (!keys) return kvo__error(KVO_ENOMEM, "connector: out of memory");
    size_t *item = (size_t *)(keys + nf);
    uint64_t *ud = (uint64_t *)(item + nf);
    int *res = (int *)(ud + nf);
    uint8_t *tier = (uint8_t *)(res + nf);
    size_t k = 0;
    for (size_t i = 0; i < r->n_hit; i++)
        if (r->hit[i].tier != KVO_TIER_HOST) {
            keys[k] = r->hit[i].key;
            tier[k] = r->hit[i].tier;
            item[k] = i;
            ud[k++] = ++c->next_read;
        }
    int rc = kvo__map_reserve(&c->reads, nf);
    if (!rc) rc = kvo_cascade_promote(c->casc, keys, nf, tier, ud, res);
    for (size_t i = 0; !rc && i < nf; i++) {
        if (res[i] == 0) {
            kvo__read *rd = kvo__malloc(sizeof *rd);
            kvo__map_entry *e = NULL;
            if (!rd || kvo__map_put(&c->reads, ud[i], &e) < 0) { /* cannot track: it finishes as an orphan */
                kvo__free(rd);
                rc = tier[i] == KVO_TIER_FILE ? KVO__NOFILE : KVO__NOREMOTE;
                continue;
            }
            rd->key = keys[i];
            rd->tier = tier[i];
            rd->req = r->id;
            rd->gen = r->gen;
            rd->lay_epoch = c->lay_epoch[rd->key.group];
            rd->epoch = c->epoch;
            rd->item = item[i];
            e->p = rd;
            r->file_pending++;
            continue;
        }
        if (tier[i] == KVO_TIER_FILE) c->st.file_read_failures++;
        else c->st.remote_read_failures++;
        if (res[i] == KVO_EEXIST) rc = KVO_EAGAIN; /* raced: it is in host memory now */
        else if (res[i] == KVO_EAGAIN && kvo__lent_now(c))
            rc = KVO__WAITLENT;
        else rc = tier[i] == KVO_TIER_FILE ? KVO__NOFILE : KVO__NOREMOTE;
    }
    kvo__free(keys);
    return rc;
}

/* Phase 1: the chunks of r above local L, per group g at c->s_u8 + off[g]
 * (ncs[g] chunks; LOCAL below L, with c->s_tier KVO_TIER_HOST); keys of the
 * non-local chunks in s_keys (their group and chunk in s_grp / s_chunk), *nk
 * of them. */
static int kvo__host_states(kvo_connector *c, kvo__req *r, uint64_t L, size_t *off, size_t *ncs, size_t *nk) {
    uint64_t bmax = kvo__conn_bmax(c, r, L);
    size_t total = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        off[g] = total;
        ncs[g] = 0;
        if (!gp->offloaded || bmax <= L) continue;
        uint64_t nc = r->n_units / gp->hashes_per_chunk;
        /* a draft group also needs the chunk holding token bmax */
        uint64_t need = kvo__div_ceil_u64(bmax + gp->draft, gp->tokens_per_chunk);
        ncs[g] = (size_t)(nc < need ? nc : need);
        total += ncs[g];
    }
    int rc = kvo__conn_scratch(c, total + 1);
    if (rc) return rc;
    /* keys of the non-local chunks, states LOCAL below L */
    *nk = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        uint8_t *st = c->s_u8 + off[g];
        for (size_t ch = 0; ch < ncs[g]; ch++) {
            c->s_tier[off[g] + ch] = KVO_TIER_HOST;
            if ((ch + 1) * gp->tokens_per_chunk <= L) {
                st[ch] = KVO_CHUNK_LOCAL;
                continue;
            }
            kvo__conn_chunk_key(r, gp, ch, &c->s_keys[*nk]);
            c->s_grp[*nk] = (uint32_t)g;
            c->s_chunk[*nk] = ch;
            (*nk)++;
        }
    }
    return 0;
}

/* Where the cascade finds n keys: their states and tiers into st / tier,
 * key i at off[s_grp[i]] + s_chunk[i] (the chunks of phase 1, off given) or
 * at i (the snapshots, off NULL); hs / ht: n bytes each of scratch.  A tier
 * the lookup is retried without (use_file / use_remote false) counts as a
 * miss.  *rpending: an answer of the cluster the request may wait for is
 * still out. */
static int kvo__ask(kvo_connector *c, kvo__req *r, const kvo_chunk_key *keys, size_t n, bool use_file,
                    bool use_remote, uint8_t *hs, uint8_t *ht, const size_t *off, uint8_t *st, uint8_t *tier,
                    bool *rpending) {
    kvo_cascade_lookup_result res;
    int rc = kvo_cascade_lookup(c->casc, keys, n, 0, use_remote ? &r->rwait : NULL, 0, hs, ht, &res);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        size_t at = off ? off[c->s_grp[i]] + c->s_chunk[i] : i;
        bool drop = (!use_file && ht[i] == KVO_TIER_FILE) || (!use_remote && ht[i] == KVO_TIER_REMOTE);
        st[at] = drop ? KVO_MISS : hs[i];
        tier[at] = ht[i];
    }
    *rpending |= use_remote && res.remote_pending;
    return 0;
}

/* Phase 2, snapshots: for every offloaded state group some snapshot was
 * ever stored for (c->snap_groups), the states of the snapshot keys at each
 * unit end p in (L, bmax] that is not a block boundary (block snapshots are
 * the chunks), ascending, into c->sn at soff[g] (nsn[g] of them), with the
 * tier that holds each in c->sn_tier.  Bounded by the request's units. */
static int kvo__snap_states(kvo_connector *c, kvo__req *r, uint64_t L, size_t *soff, size_t *nsn, bool use_file,
                            bool use_remote, bool *rpending) {
    uint64_t bmax = kvo__conn_bmax(c, r, L), tph = kvo_plan_tokens_per_hash(c->plan);
    uint64_t hi = bmax < r->n_units * tph ? bmax : r->n_units * tph;
    size_t total = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        soff[g] = total;
        nsn[g] = 0;
        if (!gp->offloaded || gp->kind != KVO_GROUP_STATE || !((c->snap_groups >> g) & 1) || hi <= L) continue;
        total += (size_t)(hi / tph - L / tph);
    }
    if (!total) return 0;
    const kvo__arr a[] = {{(void **)&c->sn_keys, sizeof *c->sn_keys}, {(void **)&c->sn_st, sizeof *c->sn_st},
                          {(void **)&c->sn_tier, sizeof *c->sn_tier}, {(void **)&c->sn, sizeof *c->sn},
                          {(void **)&c->sn_hs, 2}};
    int rc = kvo__grow_all(&c->sn_cap, total, a, sizeof a / sizeof a[0], 16, "connector: snapshots");
    if (rc) return rc;
    size_t n = 0;
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded || gp->kind != KVO_GROUP_STATE || !((c->snap_groups >> g) & 1) || hi <= L) continue;
        soff[g] = n;
        for (uint64_t p = (L / tph + 1) * tph; p <= hi; p += tph) {
            if (p % gp->tokens_per_block == 0) continue;
            kvo__conn_snap_key(r, (uint32_t)g, (size_t)(p / tph - 1), &c->sn_keys[n]);
            c->sn[n++].tokens = p;
        }
        nsn[g] = n - soff[g];
    }
    if (n && (rc = kvo__ask(c, r, c->sn_keys, n, use_file, use_remote, c->sn_hs, c->sn_hs + n, NULL, c->sn_st,
                            c->sn_tier, rpending)))
        return rc;
    for (size_t i = 0; i < n; i++) c->sn[i].state = c->sn_st[i];
    return 0;
}

/* Phase 3: the boundary every group agrees on, into out.  *b: the boundary
 * to load, 0 when there is nothing to pin (no hit, or a pending one). */
static int kvo__agree_hit(kvo_connector *c, kvo__req *r, uint64_t L, const size_t *off, size_t *ncs,
                          const size_t *soff, const size_t *nsn, kvo_lookup_result *out, uint64_t *b) {
    const uint8_t *ptr[KVO_MAX_GROUPS];
    const kvo_agree_snapshot *sp[KVO_MAX_GROUPS];
    for (size_t g = 0; g < c->ng; g++) {
        ptr[g] = c->s_u8 + off[g];
        sp[g] = nsn[g] ? c->sn + soff[g] : NULL;
    }
    kvo_agree_input in;
    memset(&in, 0, sizeof in);
    uint64_t bmax = kvo__conn_bmax(c, r, L);
    in.plan = c->plan;
    in.n_tokens = bmax >= L ? bmax + 1 : L; /* the candidates: b <= bmax */
    in.local_tokens = L;
    in.min_hit_tokens = c->min_hit;
    /* a capped candidate range shorter than a chunk: the cap decides */
    if (bmax + 1 < r->n_tokens && bmax > L && bmax - L < c->min_hit) in.min_hit_tokens = bmax - L;
    in.scratch_groups = c->p.scratch_groups;
    in.chunk_states = ptr;
    in.n_chunks = ncs;
    in.boundary_align = 1; /* any token count: the load rounds the last block up */
    in.snapshots = sp;
    in.n_snapshots = nsn;
    kvo_agree_result ar;
    int rc = kvo_agree(&in, &ar);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->local_tokens = L;
    out->tokens = ar.tokens;
    out->tokens_if_pending = ar.tokens_if_pending;
    out->limiting_group = ar.limiting_group;
    out->reason = ar.reason;
    *b = 0;
    if (ar.tokens_if_pending > ar.tokens) out->status = KVO_HIT_PENDING;
    else if (ar.tokens <= L) out->status = KVO_HIT_NONE;
    else *b = ar.tokens;
    return 0;
}

/* Phase 4: list in r->hit the chunks the load of boundary b will read
 * (*nh of them), each with the tier phase 2 found it in. */
static int kvo__hit_build(kvo_connector *c, kvo__req *r, uint64_t L, uint64_t b, const size_t *off,
                          const size_t *ncs, const size_t *soff, const size_t *nsn, size_t *nh) {
    *nh = 0;
    uint32_t tph = kvo_plan_tokens_per_hash(c->plan);
    for (size_t g = 0; g < c->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(c->plan, g);
        if (!gp->offloaded) continue;
        if (gp->kind == KVO_GROUP_STATE && b % gp->tokens_per_block) {
            /* not a block boundary: agree took a READY snapshot at b */
            int rc = kvo__grow((void **)&r->hit, &r->cap_hit, *nh + 1, sizeof *r->hit, 16, "connector");
            if (rc) return rc;
            kvo__hit_item *it = &r->hit[(*nh)++];
            memset(it, 0, sizeof *it);
            kvo__conn_snap_key(r, (uint32_t)g, (size_t)(b / tph - 1), &it->key);
            it->chunk = (b - 1) / gp->tokens_per_block / gp->blocks_per_chunk;
            it->tier = KVO_TIER_HOST;
            for (size_t i = soff[g]; i < soff[g] + nsn[g]; i++) /* the snapshot at b: its tier */
                if (c->sn[i].tokens == b) it->tier = c->sn_tier[i];
            it->snap = 1;
            continue;
        }
        for (size_t ch = 0; ch < ncs[g]; ch++) {
            uint64_t lo, hi;
            kvo__conn_need_range(gp, ch, L, b, &lo, &hi);
            if (lo >= hi) continue;
            int rc = kvo__grow((void **)&r->hit, &r->cap_hit, *nh + 1, sizeof *r->hit, 16, "connector");
            if (rc) return rc;
            kvo__hit_item *it = &r->hit[(*nh)++];
            kvo__conn_chunk_key(r, gp, ch, &it->key);
            it->chunk = ch;
            it->tier = c->s_tier[off[g] + ch];
            it->pinned = 0;
            it->snap = 0;
            memset(&it->slot, 0, sizeof it->slot);
        }
    }
    return 0;
}

/* Phase 5: pin the hit's host items (*nhost of them); KVO_EAGAIN when one
 * was evicted since phase 2. */
static int kvo__hit_pin(kvo_connector *c, kvo__req *r, size_t nh, size_t *nhost) {
    int rc = kvo__conn_scratch(c, nh + 1);
    if (rc) return rc;
    *nhost = 0;
    for (size_t i = 0; i < nh; i++)
        if (r->hit[i].tier == KVO_TIER_HOST) {
            c->s_keys[*nhost] = r->hit[i].key;
            c->s_chunk[(*nhost)++] = i;
        }
    if (!*nhost) return 0;
    rc = kvo_cascade_prepare_load(c->casc, c->s_keys, *nhost, c->s_slots);
    if (rc == KVO_ENOTFOUND || rc == KVO_EAGAIN) return KVO_EAGAIN;
    if (rc) return rc;
    for (size_t i = 0; i < *nhost; i++) {
        kvo__hit_item *it = &r->hit[c->s_chunk[i]];
        it->slot = c->s_slots[i];
        it->pinned = 1;
    }
    (void)kvo_cascade_touch(c->casc, c->s_keys, *nhost);
    return 0;
}

/* One lookup attempt; returns 0, KVO_EAGAIN (pin raced with an eviction:
 * retry), KVO__NOFILE / KVO__NOREMOTE (retry without that tier),
 * KVO__WAITLENT or an error. */
static int kvo__lookup_once(kvo_connector *c, kvo__req *r, uint64_t L, kvo_lookup_result *out, bool use_file,
                            bool use_remote) {
    size_t off[KVO_MAX_GROUPS], ncs[KVO_MAX_GROUPS], soff[KVO_MAX_GROUPS], nsn[KVO_MAX_GROUPS];
    size_t nk = 0, nh = 0, nhost = 0;
    uint64_t b = 0;
    bool rpending = false;
    int rc = kvo__host_states(c, r, L, off, ncs, &nk);
    /* s_slots (16 bytes per entry) is free in phases 1-2: the cascade's answers */
    if (!rc && nk)
        rc = kvo__ask(c, r, c->s_keys, nk, use_file, use_remote, (uint8_t *)c->s_slots, (uint8_t *)c->s_slots + nk,
                      off, c->s_u8, c->s_tier, &rpending);
    if (!rc) rc = kvo__snap_states(c, r, L, soff, nsn, use_file, use_remote, &rpending);
    if (!rc) rc = kvo__agree_hit(c, r, L, off, ncs, soff, nsn, out, &b);
    if (!rc && out->status == KVO_HIT_PENDING) out->remote_pending = rpending;
    if (rc || !b) return rc;
    if ((rc = kvo__hit_build(c, r, L, b, off, ncs, soff, nsn, &nh))) return rc;
    if ((rc = kvo__hit_pin(c, r, nh, &nhost))) return rc;
    r->n_hit = nh;
    r->hit_pinned = true;
    r->hit_tokens = b;
    r->hit_local = L;
    r->file_pending = 0;
    r->file_status = 0;
    if (nhost < nh && (rc = kvo__start_reads(c, r))) {
        kvo__conn_unpin_hit(c, r);
        return rc;
    }
    unsigned fr = (1u << KVO_TIER_FILE) | (1u << KVO_TIER_REMOTE);
    r->hit_remote_tokens = kvo__tier_tokens(c, r, L, b, 1u << KVO_TIER_REMOTE);
    r->hit_file_tokens = kvo__tier_tokens(c, r, L, b, fr) - r->hit_remote_tokens;
    r->hit_host_tokens = b - L - r->hit_file_tokens - r->hit_remote_tokens;
    out->status = KVO_HIT;
    out->tokens_host = r->hit_host_tokens;
    out->tokens_file = r->hit_file_tokens;
    out->tokens_remote = r->hit_remote_tokens;
    return 0;
}

int kvo_connector_lookup(kvo_connector *c, uint64_t id, uint64_t local_tokens, kvo_lookup_result *out) {
    if (!c || !out) return kvo__error(KVO_EINVAL, "kvo_connector_lookup: c and out must not be NULL");
    kvo__conn_lock(c);
    kvo__req *r = kvo__conn_req_get(c, id);
    int rc = 0;
    if (!r) rc = kvo__conn_req_missing(id);
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
        kvo__conn_unlock(c);
        return rc;
    }
    kvo__conn_unpin_hit(c, r);
    bool use_file = true, use_remote = true;
    for (int attempt = 0; attempt < 6; attempt++) {
        rc = kvo__lookup_once(c, r, local_tokens, out, use_file, use_remote);
        if (rc == KVO__NOFILE || rc == KVO__NOREMOTE) {
            if (rc == KVO__NOFILE) use_file = false;
            else use_remote = false;
            continue;
        }
        if (rc != KVO_EAGAIN) break;
    }
    if (rc == KVO__WAITLENT || rc == KVO_EAGAIN || rc == KVO__NOFILE || rc == KVO__NOREMOTE) {
        /* no hit now: kept racing with evictions, or (WAITLENT) ask again
         * once the lent writes are done (poll ends the loans) */
        memset(out, 0, sizeof *out);
        out->local_tokens = out->tokens = out->tokens_if_pending = local_tokens;
        out->limiting_group = -1;
        if (rc == KVO__WAITLENT) {
            out->status = KVO_HIT_PENDING;
            c->st.lookups_wait_lent++;
        }
        rc = 0;
    }
    if (!rc) {
        r->st.lookups++;
        c->st.lookups++;
        c->st.lookup_tokens += r->n_tokens;
        kvo__conn_tenant(c, r->tenant)->lookup_tokens += r->n_tokens;
        if (out->status == KVO_HIT_PENDING) {
            r->st.pending_lookups++;
            c->st.lookup_pending++;
            c->st.remote_lookups_pending += out->remote_pending;
        } else if (out->status == KVO_HIT) {
            c->st.lookup_hits++;
            c->st.hit_tokens += out->tokens - local_tokens;
            kvo__conn_tenant(c, r->tenant)->hit_tokens += out->tokens - local_tokens;
        }
    }
    kvo__conn_unlock(c);
    return rc;
}
