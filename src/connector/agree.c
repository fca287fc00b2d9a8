/*
 * The lookup agreement rule: the longest prefix every KV-cache group can
 * serve (docs/lookup.md has the rule with worked examples).
 *
 * Terms.  L = local_tokens (already in the engine); N = prompt tokens.  A
 * boundary b means KV for [0, b) is present and token b is computed next.
 * Candidates are every token count b with L < b <= N - 1 (the last prompt
 * token is always computed: the engine needs its logits) that is a multiple
 * of boundary_align (1: any token count; see Alignment).
 * Group g has chunks of T_g tokens; chunk c covers [c*T_g, (c+1)*T_g).
 *
 * What group g needs to serve b > L (tokens below L are in the engine, so a
 * chunk is needed only for its part in [L, b)):
 *   full     tokens [L, b)                  -> chunks floor(L/T) .. ceil(b/T)-1
 *   sliding  tokens [max(L, b - window), b) -> the chunks covering them
 *   state    a snapshot exactly at b: b a multiple of tpb with the chunk of
 *            block b/tpb - 1 READY, or an extra snapshot (input.snapshots)
 *            at b that is READY
 *   scratch  (non-cacheable, declared scratch) b a multiple of its tpb
 * Full and sliding groups round the needed range UP to whole chunks: the
 * last chunk may be only partly needed.  The load writes whole blocks; the
 * engine recomputes from b and overwrites the tail of the last loaded block
 * with identical values.  A needed chunk must be READY (or LOCAL); PENDING
 * counts as MISS for the "now" answer and as READY for the "if pending"
 * answer.
 *
 * Per-group limit.  For a candidate b, kvo__group_limit returns lim <= b
 * such that g serves none of (lim, b], and lim == b exactly when g serves
 * b (lim itself is served for full, state and scratch groups):
 *   full     the lowest failing chunk f >= floor(L/T) gives lim = min(b, f*T)
 *            (b' <= f*T needs chunks up to f-1 only; b' > f*T needs f).
 *            Exact, computed once per pass.
 *   sliding  m = highest needed chunk not READY, m0 the lowest chunk of the
 *            failing run ending at m: lim = m0*T.  Every b' in (m*T, b]
 *            still needs m (b' - w <= b - w < (m+1)*T and b' > m*T), and
 *            every b' in (m0*T, m*T] needs chunk ceil(b'/T)-1, inside the run.
 *   state    the largest snapshot position <= b (block boundaries whose
 *            chunk is READY, extra snapshots that are READY).  Exact.
 *   scratch  align_down(b, tpb).  Exact.
 *
 * Alignment.  input.boundary_align A restricts candidates to multiples of
 * A (0 = the step, lcm of every tokens_per_block: every group's block at b
 * starts empty, for loaders that copy only whole blocks below b).  Each
 * lowering aligns the group's limit down to A; what it skips is either not
 * a candidate or not served, so the argument below is unchanged.
 *
 * Convergence.  Starting at b = align_down(N - 1, A) every group in turn
 * replaces b by its limit (aligned down to A, at least L), round after
 * round, until a round changes nothing.  Invariant: no
 * boundary above the current b is served by every group (each replacement
 * skips only boundaries one group cannot serve).  b only decreases and
 * b <= L stops the loop (nothing is needed), so it terminates; when a round
 * changes nothing every group serves b, the largest such b.
 *
 * Bounded work.  Each lowering passes a failing chunk or snapshot of the
 * group that lowers (full groups lower at most once, scratch groups only
 * right after another group lowered), so there are at most C + P + G + 1
 * rounds (C chunks, P extra snapshots, G groups), each O(G) plus scans; in
 * practice a handful.  Scans are amortised: a full group finds its first
 * failing chunk once; a sliding group remembers an interval of chunks known
 * READY and never rescans it; a state group keeps a cursor that only moves
 * down (its limit for a smaller b is found below the previous answer).  So a
 * call is O(C + P + G * rounds) with G <= KVO_MAX_GROUPS, no allocation.
 *
 * Draft groups (kvo_group_desc.draft: EAGLE / MTP drafters, full or
 * sliding).  A drafter's KV at position i is computed from the target's
 * hidden state at i and token i + 1, so the draft KV at b - 1 is right for
 * a new request only if token b is shared too: a draft group serves b when
 * it would serve b + 1 as a plain group with the same window start, i.e.
 * tokens [max(L, b - w), b + 1) (full: [L, b + 1)).  Its limit is the plain
 * limit at b + 1 (window w + 1) minus one, which keeps both properties
 * above (nothing in (lim, b] served; lim == b exactly when b is).  The load
 * still writes only the blocks below b (the chunk holding token b is proof
 * that the token is shared, not data to load).  vLLM drops the draft
 * group's whole last block instead; this is the exact condition.
 *
 * Non-cacheable groups: a group that is not offloaded holds KV the engine
 * cannot rebuild for tokens before the boundary without computing from token
 * 0 (its KV at a token depends on its own KV at earlier tokens through the
 * stack), so unless the engine declares it scratch (scratch_groups) the only
 * safe answer is no hit.
 */
#include "connector/connector_internal.h"

uint64_t kvo_agree_step(const kvo_plan *plan) {
    if (!plan) return 0;
    uint64_t s = 1;
    for (size_t g = 0; g < kvo_plan_num_groups(plan); g++) {
        s = kvo__lcm_u64(s, kvo_plan_group(plan, g)->tokens_per_block);
        if (s == 0) return 0;
    }
    return s;
}

uint64_t kvo__agree_min_hit_default(const kvo_plan *plan) {
    uint64_t m = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(plan); g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (gp->offloaded && gp->tokens_per_chunk > m) m = gp->tokens_per_chunk;
    }
    return m;
}

/* Per-group scan state of one agreement pass. */
typedef struct kvo__agree_scan {
    int64_t good_lo, good_hi; /* sliding: chunks known READY (empty when lo > hi) */
    int64_t first_bad;        /* full: lowest failing chunk at or above the first
                                 needed one, computed lazily; -2 unknown */
    uint64_t cached;          /* state: the last limit found (valid when
                                 has_cached), the largest snapshot <= the b it
                                 was asked for */
    bool has_cached;
    size_t snap_hi;           /* state: extra snapshots [0, snap_hi) are not
                                 yet passed over */
} kvo__agree_scan;

static bool kvo__state_ok(uint8_t s, bool pending_ok) {
    return s == KVO_READY || s == KVO_CHUNK_LOCAL || (pending_ok && s == KVO_PENDING);
}

static bool kvo__chunk_ok(const kvo_agree_input *in, size_t g, uint64_t c, bool pending_ok) {
    if (!in->chunk_states || !in->n_chunks || c >= in->n_chunks[g]) return false;
    return kvo__state_ok(in->chunk_states[g][c], pending_ok);
}

/* Highest failing chunk in [lo, hi] (lo <= hi), or -1; uses and extends the
 * known-good interval. */
static int64_t kvo__scan_down(const kvo_agree_input *in, size_t g, kvo__agree_scan *sc, int64_t lo, int64_t hi,
                              bool pending_ok) {
    int64_t c = hi;
    int64_t bad = -1;
    while (c >= lo) {
        if (sc->good_lo <= sc->good_hi && c <= sc->good_hi && c >= sc->good_lo) {
            c = sc->good_lo - 1;
            continue;
        }
        if (!kvo__chunk_ok(in, g, (uint64_t)c, pending_ok)) {
            bad = c;
            /* every boundary whose window ends inside this run of failing
             * chunks fails too: report the run's lowest chunk */
            while (bad > 0 && !kvo__chunk_ok(in, g, (uint64_t)(bad - 1), pending_ok)) bad--;
            break;
        }
        c--;
    }
    /* [max(c+1, lo), hi] is now known good; merge when it touches the
     * known interval (it always does when the scan skipped through it). */
    int64_t nlo = bad >= 0 ? c + 1 : lo, nhi = hi;
    if (nlo <= nhi) {
        if (sc->good_lo > sc->good_hi || nhi + 1 < sc->good_lo || nlo > sc->good_hi + 1) {
            /* keep the larger of the two intervals */
            if (sc->good_lo > sc->good_hi || nhi - nlo > sc->good_hi - sc->good_lo) {
                sc->good_lo = nlo;
                sc->good_hi = nhi;
            }
        } else {
            if (nlo < sc->good_lo) sc->good_lo = nlo;
            if (nhi > sc->good_hi) sc->good_hi = nhi;
        }
    }
    return bad;
}

/* State group: the largest snapshot position <= b that is READY (0 if none).
 * Block snapshots sit at k*tpb (block k-1); extra snapshots come sorted.
 * Calls come with non-increasing b, so the previous answer is reused while it
 * is <= b and the scans resume below it. */
static uint64_t kvo__state_limit(const kvo_agree_input *in, size_t g, kvo__agree_scan *sc, uint64_t b,
                                 bool pending_ok) {
    if (sc->has_cached && sc->cached <= b) return sc->cached;
    const kvo_group_plan *gp = kvo_plan_group(in->plan, g);
    uint64_t tpb = gp->tokens_per_block, bpc = gp->blocks_per_chunk;
    /* block snapshots: walk down one chunk per failing chunk */
    uint64_t best = 0;
    uint64_t k = b / tpb;
    uint64_t n = in->n_chunks && in->chunk_states ? in->n_chunks[g] : 0;
    while (k >= 1) {
        uint64_t c = (k - 1) / bpc;
        if (c >= n) { /* past the known chunks: all MISS */
            k = n * bpc;
            continue;
        }
        if (kvo__chunk_ok(in, g, c, pending_ok)) {
            best = k * tpb;
            break;
        }
        k = c * bpc; /* the last block of chunk c - 1 */
    }
    /* extra snapshots at any position */
    if (in->snapshots && in->n_snapshots && in->snapshots[g]) {
        const kvo_agree_snapshot *sp = in->snapshots[g];
        size_t i = sc->snap_hi;
        while (i > 0 && sp[i - 1].tokens > b) i--;
        sc->snap_hi = i; /* later calls ask for b' < b */
        while (i > 0 && sp[i - 1].tokens > best) {
            if (kvo__state_ok(sp[i - 1].state, pending_ok)) {
                best = sp[i - 1].tokens;
                break;
            }
            i--;
        }
    }
    sc->cached = best;
    sc->has_cached = true;
    return best;
}

/* The group's limit for candidate b (see the essay): b when g serves b,
 * else a lower value such that g serves nothing in (value, b]. */
static uint64_t kvo__group_limit(const kvo_agree_input *in, size_t g, kvo__agree_scan *sc, uint64_t b,
                                 uint64_t L, bool pending_ok) {
    const kvo_group_plan *gp = kvo_plan_group(in->plan, g);
    if (b <= L) return b;
    if (!gp->offloaded) return b / gp->tokens_per_block * gp->tokens_per_block; /* scratch */
    uint64_t T = gp->tokens_per_chunk;
    /* draft: tokens [.., b + 1) (see Draft groups); limits shift by one */
    uint64_t d = gp->draft && gp->kind != KVO_GROUP_STATE;
    switch (gp->kind) {
    case KVO_GROUP_FULL: {
        if (sc->first_bad == -2) {
            /* lowest failing chunk from floor(L/T) on; chunk n_chunks is a MISS */
            int64_t c = (int64_t)(L / T);
            int64_t end = (int64_t)(in->n_chunks ? in->n_chunks[g] : 0);
            while (c < end && kvo__chunk_ok(in, g, (uint64_t)c, pending_ok)) c++;
            sc->first_bad = c;
        }
        uint64_t lim = (uint64_t)sc->first_bad * T;
        lim = lim >= d ? lim - d : 0;
        return lim < b ? lim : b;
    }
    case KVO_GROUP_SLIDING: {
        uint64_t from = b > gp->window ? b - gp->window : 0;
        if (from < L) from = L;
        int64_t lo = (int64_t)(from / T), hi = (int64_t)(kvo__div_ceil_u64(b + d, T) - 1);
        int64_t bad = kvo__scan_down(in, g, sc, lo, hi, pending_ok);
        if (bad < 0) return b;
        return (uint64_t)bad * T >= d ? (uint64_t)bad * T - d : 0;
    }
    case KVO_GROUP_STATE:
        return kvo__state_limit(in, g, sc, b, pending_ok);
    }
    return L;
}

/* One agreement pass from bmax down. */
static uint64_t kvo__agree_pass(const kvo_agree_input *in, uint64_t A, uint64_t bmax, bool pending_ok,
                                int32_t *limiting, uint32_t *rounds) {
    size_t ng = kvo_plan_num_groups(in->plan);
    kvo__agree_scan sc[KVO_MAX_GROUPS];
    for (size_t g = 0; g < ng; g++) {
        sc[g].good_lo = 1;
        sc[g].good_hi = 0;
        sc[g].first_bad = -2;
        sc[g].cached = 0;
        sc[g].has_cached = false;
        sc[g].snap_hi = in->snapshots && in->n_snapshots && in->snapshots[g] ? in->n_snapshots[g] : 0;
    }
    uint64_t L = in->local_tokens;
    uint64_t b = bmax / A * A;
    *limiting = -1;
    *rounds = 0;
    for (;;) {
        (*rounds)++;
        bool lowered = false;
        for (size_t g = 0; g < ng && b > L; g++) {
            uint64_t lim = kvo__group_limit(in, g, &sc[g], b, L, pending_ok);
            if (lim < b) {
                lim = lim / A * A;
                b = lim < L ? L : lim;
                *limiting = (int32_t)g;
                lowered = true;
            }
        }
        if (!lowered || b <= L) break;
    }
    return b;
}

static int kvo__agree_check(const kvo_agree_input *in, uint64_t A) {
    const kvo_plan *plan = in->plan;
    if (A == 0) return kvo__error(KVO_ERANGE, "kvo_agree: the lcm of the groups' tokens_per_block overflows");
    if (in->local_tokens % A)
        return kvo__error(KVO_EINVAL,
                          "kvo_agree: local_tokens %llu is not a multiple of the boundary alignment %llu%s; use %llu",
                          (unsigned long long)in->local_tokens, (unsigned long long)A,
                          in->boundary_align ? "" : " (the step: lcm of every group's tokens_per_block)",
                          (unsigned long long)(in->local_tokens / A * A));
    if (in->local_tokens > in->n_tokens)
        return kvo__error(KVO_EINVAL, "kvo_agree: local_tokens %llu exceeds the %llu prompt tokens; use at most %llu",
                          (unsigned long long)in->local_tokens, (unsigned long long)in->n_tokens,
                          (unsigned long long)in->n_tokens);
    for (size_t g = 0; g < kvo_plan_num_groups(plan); g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded) continue;
        size_t n = in->n_chunks ? in->n_chunks[g] : 0;
        if (n > 0 && (!in->chunk_states || !in->chunk_states[g]))
            return kvo__error(KVO_EINVAL, "kvo_agree: group '%s' has %zu chunks but no chunk states", gp->name, n);
        if (!in->snapshots || !in->n_snapshots || !in->snapshots[g]) continue;
        const kvo_agree_snapshot *sp = in->snapshots[g];
        if (gp->kind != KVO_GROUP_STATE && in->n_snapshots[g])
            return kvo__error(KVO_EINVAL, "kvo_agree: group '%s' is not a state group but has %zu snapshots; pass 0",
                              gp->name, in->n_snapshots[g]);
        for (size_t i = 1; i < in->n_snapshots[g]; i++)
            if (sp[i].tokens <= sp[i - 1].tokens)
                return kvo__error(KVO_EINVAL,
                                  "kvo_agree: group '%s': snapshot %zu at %llu tokens is not above snapshot %zu at "
                                  "%llu; sort them ascending without duplicates",
                                  gp->name, i, (unsigned long long)sp[i].tokens, i - 1,
                                  (unsigned long long)sp[i - 1].tokens);
    }
    return 0;
}

int kvo_agree(const kvo_agree_input *in, kvo_agree_result *out) {
    if (!in || !out || !in->plan) return kvo__error(KVO_EINVAL, "kvo_agree: in, in->plan and out must not be NULL");
    const kvo_plan *plan = in->plan;
    size_t ng = kvo_plan_num_groups(plan);
    uint64_t A = in->boundary_align ? in->boundary_align : kvo_agree_step(plan);
    int rc = kvo__agree_check(in, A);
    if (rc) return rc;
    kvo_agree_result r;
    memset(&r, 0, sizeof r);
    r.limiting_group = -1;
    uint64_t L = in->local_tokens;
    r.tokens = r.tokens_if_pending = L;

    if (in->n_tokens == 0 || (in->n_tokens - 1) / A * A <= L) {
        r.reason = KVO_AGREE_NO_PROMPT;
        *out = r;
        return 0;
    }
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded && !(g < 64 && (in->scratch_groups >> g) & 1)) {
            r.reason = KVO_AGREE_NONCACHEABLE;
            r.limiting_group = (int32_t)g;
            *out = r;
            return 0;
        }
    }
    uint64_t bmax = in->n_tokens - 1;
    int32_t lim_now, lim_pend;
    uint32_t rounds_now, rounds_pend;
    uint64_t now = kvo__agree_pass(in, A, bmax, false, &lim_now, &rounds_now);
    uint64_t pend = kvo__agree_pass(in, A, bmax, true, &lim_pend, &rounds_pend);
    bmax = bmax / A * A;
    uint64_t min_hit = in->min_hit_tokens ? in->min_hit_tokens : kvo__agree_min_hit_default(plan);
    r.reason = now < bmax ? KVO_AGREE_LOWERED : KVO_AGREE_OK;
    r.limiting_group = lim_now;
    r.rounds = rounds_now;
    if (now - L < min_hit) {
        if (now > L) r.reason = KVO_AGREE_TOO_SHORT;
        now = L;
    }
    if (pend - L < min_hit) pend = L;
    if (pend < now) pend = now;
    r.tokens = now;
    r.tokens_if_pending = pend;
    *out = r;
    return 0;
}
