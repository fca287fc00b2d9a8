/*
 * The lookup agreement rule: the longest prefix every KV-cache group can
 * serve (docs/lookup.md has the rule with worked examples).
 *
 * Terms.  S (the step) = lcm of every group's tokens_per_block; candidate
 * boundaries b are multiples of S, so every group's block at b starts empty
 * and loads are whole blocks.  L = local_tokens (already in the engine);
 * N = prompt tokens.  b ranges over [L, align_down(N - 1, S)]: the last
 * prompt token is always computed.  Group g has chunks of T_g tokens; chunk c
 * covers [c*T_g, (c+1)*T_g).
 *
 * What group g needs to serve b > L (tokens below L are in the engine, so a
 * chunk is needed only for its part in [L, b)):
 *   full     tokens [L, b)                  -> chunks floor(L/T) .. ceil(b/T)-1
 *   sliding  tokens [max(L, b - window), b) -> the chunks covering them
 *   state    the snapshot after token b, held in block b/tpb - 1
 *            -> chunk (b/tpb - 1) / blocks_per_chunk
 * A needed chunk must be READY (or LOCAL); PENDING counts as MISS for the
 * "now" answer and as READY for the "if pending" answer.
 *
 * Lowering.  If group g cannot serve b, let m be the highest needed chunk
 * that is not READY, and m0 <= m the lowest chunk of the run of failing
 * chunks ending at m.  Every b' in (m*T_g, b] needs chunk m too (full: it needs
 * all chunks up to b'; sliding: b' - window < b - window < (m+1)*T_g, so
 * chunk m still meets the window; state: the snapshot of b' > m*T_g lies in
 * chunk m or a later one whose own failure would be found first), so the
 * next candidate is align_down(m*T_g, S); and every b' in (m0*T_g, m*T_g]
 * needs chunk ceil(b'/T_g) - 1, which lies in the failing run, so the jump
 * goes to align_down(m0*T_g, S).  For a full group m0 is simply the lowest
 * failing chunk (b' > m0*T needs m0).
 *
 * Convergence.  One round asks every group in turn; a group that cannot
 * serve the current b lowers it as above.  The invariant "no boundary above
 * the current b is served by every group" holds initially (b is the maximum
 * candidate) and is kept by each lowering (everything skipped fails for the
 * group that skipped it).  Each round either finds all groups agreeing
 * (then b is the maximum agreed boundary, by the invariant) or lowers b by at
 * least S; b = L is always agreed (nothing is needed).  So the loop ends
 * after at most (b_max - L) / S + 1 rounds, in practice a handful: each
 * lowering jumps below a missing chunk.
 *
 * Bounded work.  Per group we remember an interval of chunks known to be
 * READY; a scan of a needed range skips it and stops at the first failing
 * chunk from the top, then extends the interval.  Since b only decreases, a
 * group's scans together touch each of its chunks a bounded number of
 * times: O(chunks + rounds * groups) per call, no allocation.
 *
 * Non-cacheable groups: a group that is not offloaded holds KV the engine
 * cannot rebuild for tokens before the boundary without computing from token
 * 0 (its KV at a token depends on its own KV at earlier tokens through the
 * stack), so unless the engine declares it scratch (scratch_groups) the only
 * safe answer is no hit.  Scratch groups only contribute their block size to
 * the step.
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
    int64_t good_lo, good_hi; /* chunks known READY (empty when lo > hi) */
    int64_t first_bad;        /* full groups: lowest failing chunk at or above the
                                 first needed one, computed lazily; -2 unknown */
} kvo__agree_scan;

static bool kvo__chunk_ok(const kvo_agree_input *in, size_t g, uint64_t c, bool pending_ok) {
    if (!in->chunk_states || c >= in->n_chunks[g]) return false;
    const uint8_t *st = in->chunk_states[g];
    uint8_t s = st[c];
    return s == KVO_READY || s == KVO_CHUNK_LOCAL || (pending_ok && s == KVO_PENDING);
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

/* The largest candidate <= b (multiple of S, >= L) that group g might serve:
 * returns b when g serves b, else a lower bound derived from the failing
 * chunk (the caller aligns and re-asks every group). */
static uint64_t kvo__group_limit(const kvo_agree_input *in, size_t g, kvo__agree_scan *sc, uint64_t b,
                                 uint64_t L, bool pending_ok) {
    const kvo_group_plan *gp = kvo_plan_group(in->plan, g);
    uint64_t T = gp->tokens_per_chunk;
    if (b <= L) return b;
    switch (gp->kind) {
    case KVO_GROUP_FULL: {
        int64_t lo = (int64_t)(L / T), hi = (int64_t)(kvo__div_ceil_u64(b, T) - 1);
        if (sc->first_bad == -2) {
            /* lowest failing chunk from lo on (or -1 none below the end) */
            int64_t c = lo;
            int64_t end = (int64_t)(in->n_chunks ? in->n_chunks[g] : 0);
            while (c < end && kvo__chunk_ok(in, g, (uint64_t)c, pending_ok)) c++;
            sc->first_bad = c; /* c == end: chunk `end` is a MISS */
        }
        if (sc->first_bad > hi) return b;
        return (uint64_t)sc->first_bad * T;
    }
    case KVO_GROUP_SLIDING: {
        uint64_t from = b > gp->window ? b - gp->window : 0;
        if (from < L) from = L;
        int64_t lo = (int64_t)(from / T), hi = (int64_t)(kvo__div_ceil_u64(b, T) - 1);
        int64_t bad = kvo__scan_down(in, g, sc, lo, hi, pending_ok);
        if (bad < 0) return b;
        return (uint64_t)bad * T;
    }
    case KVO_GROUP_STATE: {
        uint64_t blk = b / gp->tokens_per_block - 1;
        uint64_t c = blk / gp->blocks_per_chunk;
        if (kvo__chunk_ok(in, g, c, pending_ok)) return b;
        return c * T;
    }
    }
    return L;
}

/* One agreement pass from b_max down. */
static uint64_t kvo__agree_pass(const kvo_agree_input *in, uint64_t S, uint64_t bmax, bool pending_ok,
                                int32_t *limiting, uint32_t *rounds) {
    size_t ng = kvo_plan_num_groups(in->plan);
    kvo__agree_scan sc[KVO_MAX_GROUPS];
    for (size_t g = 0; g < ng; g++) {
        sc[g].good_lo = 1;
        sc[g].good_hi = 0;
        sc[g].first_bad = -2;
    }
    uint64_t L = in->local_tokens;
    uint64_t b = bmax;
    *limiting = -1;
    *rounds = 0;
    for (;;) {
        (*rounds)++;
        bool lowered = false;
        for (size_t g = 0; g < ng && b > L; g++) {
            if (!kvo_plan_group(in->plan, g)->offloaded) continue;
            uint64_t lim = kvo__group_limit(in, g, &sc[g], b, L, pending_ok);
            if (lim < b) {
                lim = lim / S * S;
                b = lim < L ? L : lim;
                *limiting = (int32_t)g;
                lowered = true;
            }
        }
        if (!lowered || b <= L) break;
    }
    return b;
}

int kvo_agree(const kvo_agree_input *in, kvo_agree_result *out) {
    if (!in || !out || !in->plan) return kvo__error(KVO_EINVAL, "kvo_agree: in, in->plan and out must not be NULL");
    const kvo_plan *plan = in->plan;
    size_t ng = kvo_plan_num_groups(plan);
    uint64_t S = kvo_agree_step(plan);
    if (S == 0) return kvo__error(KVO_ERANGE, "kvo_agree: the lcm of the groups' tokens_per_block overflows");
    if (in->local_tokens % S)
        return kvo__error(KVO_EINVAL,
                          "kvo_agree: local_tokens %llu is not a multiple of the hit step %llu (lcm of every "
                          "group's tokens_per_block); use %llu",
                          (unsigned long long)in->local_tokens, (unsigned long long)S,
                          (unsigned long long)(in->local_tokens / S * S));
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(plan, g);
        if (!gp->offloaded) continue;
        size_t n = in->n_chunks ? in->n_chunks[g] : 0;
        if (n > 0 && (!in->chunk_states || !in->chunk_states[g]))
            return kvo__error(KVO_EINVAL, "kvo_agree: group '%s' has %zu chunks but no chunk states", gp->name, n);
    }
    kvo_agree_result r;
    memset(&r, 0, sizeof r);
    r.limiting_group = -1;
    uint64_t L = in->local_tokens;
    r.tokens = r.tokens_if_pending = L;

    if (in->n_tokens == 0 || (in->n_tokens - 1) / S * S <= L) {
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
    uint64_t bmax = (in->n_tokens - 1) / S * S;
    int32_t lim_now, lim_pend;
    uint32_t rounds_now, rounds_pend;
    uint64_t now = kvo__agree_pass(in, S, bmax, false, &lim_now, &rounds_now);
    uint64_t pend = kvo__agree_pass(in, S, bmax, true, &lim_pend, &rounds_pend);
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
