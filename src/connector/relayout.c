/*
 * set_layout: registering the engine's KV layout, and what a change of it
 * invalidates.
 *
 * Every tier stores chunks in the slot format (docs/slot-format.md), which
 * depends on each group's segment list (the order and page_bytes of its
 * segments), not on addresses.  Two layouts with the same bytes per block
 * but another split (one tensor per layer, or K and V apart) store
 * different bytes for one chunk key, so chunks stored under one layout must
 * never be loaded under the other.  Per offloaded group the connector keeps
 * a hash of its segments' page_bytes (lay_hash); a group whose hash changes
 * is "changed", and then, under c->mu:
 *  - the transfer engine's set_layout has already failed every unfinished
 *    copy of the group (KVO_ESTATE); their results are processed first, with
 *    the old file-tier rules, so finished old-format stores land where they
 *    belong and failed loads report to the engine;
 *  - hits pinned by lookup that include the group are released (a load then
 *    fails with KVO_ESTATE: look up again); a load waiting for file reads of
 *    such a hit completes at once as failed (KVO_ESTATE, nothing written);
 *  - the group's READY host chunks are removed and its promotions still
 *    running complete as failures (kvo_cascade_invalidate; the group's
 *    epoch changed too);
 *  - the file tier is used for a group only while it holds that group's
 *    current format (file_groups): a tier namespaced by a layout hash
 *    (kvo_file_tier_layout_hash) holds exactly the layout with that hash,
 *    for every group; an unnamespaced tier is taken to hold the layout of
 *    the first set_layout, so a group is read from and written to it only
 *    while its hash equals its first one (kvo_cascade_set_tier_groups).
 *    Going back to that layout makes the files usable again.  The remote
 *    tier follows the same rule (remote_groups,
 *    kvo_remote_tier_layout_hash).
 * Groups whose format is unchanged keep everything.
 *
 * Locks: set_layout holds c->mu across kvo_transfer_set_layout, which waits
 * for copy pieces of changed groups already in flight: the one exception to
 * "mu is never held across a wait for copies", so that no lookup or load can
 * slip in between the new layout and the invalidation.  It is a
 * reconfiguration call, not a per-step one.
 */
#include "core/xxh.h"

#include "connector/connector_internal.h"
#include "kvoffload/kvo_remote_tier.h"

/* Per group: the format hash and the block count of a segment list
 * (validated by the transfer engine: one num_blocks per group). */
static void kvo__group_layouts(const kvo_connector *c, const kvo_segment *segs, size_t n, uint64_t *hash,
                               uint64_t *blocks) {
    for (size_t g = 0; g < c->ng; g++) {
        XXH64_state_t st;
        XXH64_reset(&st, 0x6b766f2d67726f75ULL + g);
        uint64_t cnt = 0;
        blocks[g] = 0;
        for (size_t i = 0; i < n; i++) {
            if (segs[i].group != g) continue;
            XXH64_update(&st, &segs[i].page_bytes, sizeof segs[i].page_bytes);
            blocks[g] = segs[i].num_blocks;
            cnt++;
        }
        XXH64_update(&st, &cnt, sizeof cnt);
        hash[g] = XXH64_digest(&st);
    }
}

/* Which groups a tier (file or remote) namespaced by layout hash `tier`
 * (0: not namespaced) holds in the current format (see above). */
static uint64_t kvo__tier_groups(kvo_connector *c, uint64_t tier) {
    uint64_t all = 0, mask = 0, mine = 0;
    for (size_t g = 0; g < c->ng; g++) {
        all |= UINT64_C(1) << g;
        if (c->lay_hash[g] == c->lay_first[g]) mask |= UINT64_C(1) << g;
    }
    if (!tier) return mask;
    return kvo_transfer_layout_hash(c->xfer, &mine) == 0 && mine == tier ? all : 0;
}

/* Does r's pinned hit read a chunk of a group in mask? */
static bool kvo__hit_touches(const kvo__req *r, uint64_t mask) {
    if (!r->hit_pinned) return false;
    for (size_t i = 0; i < r->n_hit; i++)
        if ((mask >> r->hit[i].key.group) & 1) return true;
    return false;
}

/* The layout changed the slot format of the groups in mask. */
static void kvo__invalidate(kvo_connector *c, uint64_t mask) {
    for (size_t i = 0; i < c->reqs.cap; i++) {
        if (!c->reqs.e[i].used) continue;
        kvo__req *r = c->reqs.e[i].p;
        if (!kvo__hit_touches(r, mask)) continue;
        if (r->deferred) { /* accepted, waiting for file reads: owes its LOAD */
            kvo__conn_job_free(r->deferred);
            r->deferred = NULL;
            kvo__conn_fail_load_now(c, r, KVO_ESTATE);
        } else {
            kvo__conn_unpin_hit(c, r);
        }
    }
    for (size_t g = 0; g < c->ng; g++)
        if ((mask >> g) & 1) c->lay_epoch[g]++;
    /* the cascade drops the groups' READY host chunks (a key pinned by a
     * load of the old format is retired: hidden now, gone when that load
     * ends) and fails their promotions still in flight */
    (void)kvo_cascade_invalidate(c->casc, mask, NULL);
}

int kvo_connector_set_layout(kvo_connector *c, const kvo_segment *segs, size_t n) {
    if (!c) return kvo__error(KVO_EINVAL, "kvo_connector_set_layout: c must not be NULL");
    kvo__conn_lock(c);
    int rc = kvo_transfer_set_layout(c->xfer, segs, n);
    if (rc) {
        kvo__conn_unlock(c);
        return rc;
    }
    uint64_t hash[KVO_MAX_GROUPS], blocks[KVO_MAX_GROUPS], changed = 0;
    kvo__group_layouts(c, segs, n, hash, blocks);
    if (c->layout_set) {
        /* finish what ran on the old layout under the old file rules */
        kvo__conn_process_results(c);
        for (size_t g = 0; g < c->ng; g++)
            if (kvo_plan_group(c->plan, g)->offloaded && hash[g] != c->lay_hash[g]) changed |= UINT64_C(1) << g;
    } else {
        memcpy(c->lay_first, hash, c->ng * sizeof *hash);
    }
    memcpy(c->lay_hash, hash, c->ng * sizeof *hash);
    memcpy(c->lay_blocks, blocks, c->ng * sizeof *blocks);
    c->layout_set = true;
    c->file_groups = c->file ? kvo__tier_groups(c, kvo_file_tier_layout_hash(c->file)) : 0;
    c->remote_groups = c->remote ? kvo__tier_groups(c, kvo_remote_tier_layout_hash(c->remote)) : 0;
    if (c->file) (void)kvo_cascade_set_tier_groups(c->casc, KVO_TIER_FILE, c->file_groups);
    if (c->remote) (void)kvo_cascade_set_tier_groups(c->casc, KVO_TIER_REMOTE, c->remote_groups);
    if (changed) kvo__invalidate(c, changed);
    kvo__conn_unlock(c);
    return 0;
}
