/*
 * Regression tests for connector faults found by adversarial testing
 * (issue 18, connector items 1-4), each written to fail on the code before
 * its fix:
 *  1. completions already queued in the ring must not survive preempt or
 *     abort (a small-cap poller, an id reused after abort, a newer load);
 *  2. a layout change with the same bytes per block but another segment
 *     split invalidates what was stored under the old layout, in the host
 *     tier and in the file tier (namespaced or not);
 *  3. in write-back mode, a lookup whose file hit makes the host evict (and
 *     write back) never evicts the files of that hit from the file tier;
 *  4. a load that waits for file reads rejects an engine block id beyond the
 *     layout's num_blocks at once with KVO_EINVAL.
 */
#include <unistd.h>

#include "connector/connector_internal.h"
#include "connector_sim.h"

/* ------------------------------------------------------------ helpers -- */

static kvo_plan *plan2(void) { return sim_two_group_plan("faults-two"); }

static void fill(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 11 + salt) % 30029;
}

/* Allocate the blocks a load of [0, b) writes (full: all; sliding: the
 * window before b). */
static void alloc_for_load(sim *s, sim_req *r, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        uint64_t tpb = gp->tokens_per_block;
        sim_table_len(s, r, g, (size_t)(b / tpb));
        uint64_t from = gp->kind == KVO_GROUP_SLIDING && b > gp->window ? (b - gp->window) / tpb * tpb : 0;
        for (uint64_t i = from / tpb; i < b / tpb; i++)
            if (r->tab[g][i] == KVO_NO_BLOCK) r->tab[g][i] = sim_alloc(s, g);
    }
}

/* Every allocated block below b holds the bytes the engine computed. */
static void check_loaded(sim *s, sim_req *r, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++) {
        uint64_t tpb = kvo_plan_group(s->plan, g)->tokens_per_block;
        for (uint64_t i = 0; i < b / tpb && i < r->tn[g]; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK && !sim_block_ok(s, r, g, i))
                FAILF("group %zu block index %llu differs after a load of %llu tokens", g, (unsigned long long)i,
                      (unsigned long long)b);
    }
}

/* Store n tokens through request id (compute, finish), wait for the stores;
 * with a tier, also for its writes. */
static void store_prompt(sim *s, kvo_file_tier *t, uint64_t id, const uint32_t *tok, size_t n) {
    sim_store_prompt(s, id, tok, n);
    if (t) ASSERT_OK(kvo_file_tier_flush(t, -1));
}

/* Add request id over tok and look it up from 0. */
static kvo_lookup_result add_lookup(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n}));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(s->c, id, 0, &lr));
    return lr;
}

/* Allocate and issue the load of the hit b of r. */
static void issue_load(sim *s, sim_req *r, uint64_t b) {
    alloc_for_load(s, r, b);
    kvo_block_table tb[SIM_MAXG];
    sim_tables(s, r, tb);
    ASSERT_OK(kvo_connector_load(s->c, r->id, b, tb, s->ng));
}

/* Every completion waiting now (after the copies in flight finished). */
static size_t drain_completions(sim *s, kvo_completion *out, size_t cap) {
    for (int spin = 0;; spin++) { /* every copy finished (sim_drain would consume completions) */
        kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
        ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s->c), &ts));
        if (ts.jobs_queued == 0) break;
        if (spin > 200000) FAILF("transfers never drained");
        usleep(100);
    }
    size_t n = 0;
    for (;;) {
        size_t k = 0;
        ASSERT_OK(kvo_connector_poll(s->c, out + n, cap - n > 4 ? 4 : cap - n, &k));
        n += k;
        if (k == 0 || n == cap) return n;
    }
}

static size_t count_loads(const kvo_completion *cp, size_t n, uint64_t id) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += cp[i].request == id && cp[i].type == KVO_COMPLETION_LOAD;
    return k;
}

/* The ring's accounting: room for what is queued and every completion owed. */
static void check_ring(sim *s) {
    kvo_connector *c = s->c;
    kvo__conn_lock(c);
    size_t owed = 0;
    for (size_t i = 0; i < c->reqs.cap; i++)
        if (c->reqs.e[i].used) owed += ((kvo__req *)c->reqs.e[i].p)->state != REQ_ACTIVE;
    size_t cq_owed = c->cq_owed, cq_n = c->cq.len, cq_cap = c->cq.cap;
    kvo__conn_unlock(c);
    ASSERT_EQ_U64(cq_owed, owed);
    ASSERT_LE_U64(cq_n + cq_owed, cq_cap);
}

/* ------------------------------------------- 1. queued completions -- */

/* A sim over plan2 whose host tier holds tok (400 tokens from salt), and
 * request 2 over tok with its 384-token hit pinned by lookup. */
static kvo_lookup_result sim_with_hit(sim *s, sim_req *r, uint32_t *tok, uint32_t salt) {
    sim_init(s, plan2(), NULL, 512);
    fill(tok, 400, salt);
    store_prompt(s, NULL, 1, tok, 400);
    kvo_lookup_result lr = add_lookup(s, r, 2, tok, 400);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    return lr;
}

/* Load request 2's hit, let it finish and its LOAD completion wait in the
 * ring (the engine polls with cap 0). */
static void load_and_queue(sim *s, sim_req *r, uint64_t b) {
    issue_load(s, r, b);
    ASSERT_OK(kvo_connector_wait_request(s->c, 2));
    {
        size_t np_ = 99;
        ASSERT_OK(kvo_connector_poll(s->c, NULL, 0, &np_));
        ASSERT_EQ_U64(np_, 0); /* results processed, completion queued */
    }
}

/* Nothing is left pinned or pending in the host tier. */
static void check_host_idle(sim *s) {
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s->c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
}

/* A load finishes and its completion waits in the ring (the engine polls
 * with cap 0); then the engine preempts.  No LOAD completion of the old load
 * may reach it: after a new lookup and load, exactly one LOAD arrives (the
 * new one), and when it arrives the blocks hold the right bytes. */
KVO_TEST(preempt_drops_queued_load_completion) {
    sim s;
    sim_req r;
    uint32_t tok[400];
    kvo_lookup_result lr = sim_with_hit(&s, &r, tok, 1);
    load_and_queue(&s, &r, lr.tokens);
    ASSERT_OK(kvo_connector_preempt(s.c, 2));
    check_ring(&s);
    sim_release(&s, &r); /* the engine frees the blocks */
    kvo_completion cp[64];
    size_t n = drain_completions(&s, cp, 64);
    ASSERT_EQ_U64(count_loads(cp, n, 2), 0);
    /* resumed: a newer load; the engine polls one completion at a time */
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    issue_load(&s, &r, lr.tokens);
    kvo_completion one = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(one.status, 0);
    ASSERT_EQ_U64(one.tokens_valid, lr.tokens);
    check_loaded(&s, &r, lr.tokens);
    n = drain_completions(&s, cp, 64);
    ASSERT_EQ_U64(count_loads(cp, n, 2), 0);
    check_ring(&s);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    sim_destroy(&s);
}

/* Preempt while the old completion waits and a newer load is already in
 * flight: the first LOAD the engine sees must be the newer one's. */
KVO_TEST(stale_completion_never_reports_a_newer_load) {
    sim s;
    sim_req r;
    uint32_t tok[400];
    kvo_lookup_result lr = sim_with_hit(&s, &r, tok, 2);
    load_and_queue(&s, &r, lr.tokens);
    ASSERT_OK(kvo_connector_preempt(s.c, 2));
    sim_release(&s, &r);
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    issue_load(&s, &r, lr.tokens);
    /* polling one completion at a time, the engine's first LOAD for 2 must
     * mean: the new blocks are written; and it is the only one */
    size_t loads = 0;
    for (int spin = 0; spin < 2000000; spin++) {
        kvo_completion one;
        size_t n = 0;
        ASSERT_OK(kvo_connector_poll(s.c, &one, 1, &n));
        if (n && one.request == 2 && one.type == KVO_COMPLETION_LOAD) {
            ASSERT_EQ_INT(one.status, 0);
            ASSERT_EQ_U64(one.tokens_valid, lr.tokens);
            if (loads++ == 0) check_loaded(&s, &r, lr.tokens);
        }
        kvo_transfer_stats ts = KVO_TRANSFER_STATS_INIT;
        ASSERT_OK(kvo_transfer_get_stats(kvo_connector_transfer(s.c), &ts));
        if (!n && loads && ts.jobs_queued == 0 && ts.results_pending == 0) break;
        if (!n) usleep(50);
    }
    ASSERT_EQ_U64(loads, 1);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    sim_destroy(&s);
}

/* Abort while the completion waits, then reuse the id for an unrelated
 * request: it must never be told tokens_valid of the aborted load.  A
 * RELEASED of a finished earlier request with that id is still delivered. */
KVO_TEST(abort_drops_queued_completion_before_id_reuse) {
    sim s;
    sim_req r;
    uint32_t tok[400], other[100];
    kvo_lookup_result lr = sim_with_hit(&s, &r, tok, 3);
    fill(other, 100, 77);
    load_and_queue(&s, &r, lr.tokens);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    check_ring(&s);
    sim_release(&s, &r);
    sim_req r2;
    lr = add_lookup(&s, &r2, 2, other, 100); /* the id again, another prompt */
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    kvo_completion cp[64];
    size_t n = drain_completions(&s, cp, 64);
    ASSERT_EQ_U64(count_loads(cp, n, 2), 0);
    /* a finished request's RELEASED stays queued across an abort of the
     * id's next user */
    sim_compute(&s, &r2, 100);
    kvo_block_table tb[SIM_MAXG];
    sim_tables(&s, &r2, tb);
    bool busy = false;
    ASSERT_OK(kvo_connector_finish(s.c, 2, 100, tb, s.ng, &busy));
    size_t released = 0;
    if (busy) {
        ASSERT_OK(kvo_connector_wait_request(s.c, 2));
        (void)kvo_connector_poll(s.c, NULL, 0, &(size_t){0}); /* RELEASED queued, request retired */
        sim_req r3;
        lr = add_lookup(&s, &r3, 2, other, 100);
        ASSERT_OK(kvo_connector_abort(s.c, 2));
        n = drain_completions(&s, cp, 64);
        for (size_t i = 0; i < n; i++) released += cp[i].request == 2 && cp[i].type == KVO_COMPLETION_RELEASED;
        ASSERT_EQ_U64(released, 1);
        sim_req_free(&s, &r3);
    }
    check_ring(&s);
    sim_req_free(&s, &r2);
    sim_req_free(&s, &r);
    sim_destroy(&s);
}

/* ------------------------------------------------ 2. layout changes -- */

static uint64_t layout_hash_of(sim *s, uint64_t split_mask) {
    uint64_t h = 0;
    sim_layout(s, split_mask);
    ASSERT_OK(kvo_transfer_layout_hash(kvo_connector_transfer(s->c), &h));
    return h;
}

/* Host entries of group g (any state). */
static size_t host_entries(sim *s, uint32_t g) {
    kvo_store_entry ents[64];
    uint64_t cur = 0;
    size_t m = 0;
    do {
        size_t n = 0;
        ASSERT_OK(kvo_store_scan(kvo_connector_store(s->c), &cur, ents, 64, &n));
        for (size_t i = 0; i < n; i++) m += ents[i].key.group == g;
    } while (cur);
    return m;
}

/* Look tok up as request id: no hit must ever load wrong bytes; returns the
 * lookup (the request is aborted). */
static kvo_lookup_result lookup_load_check(sim *s, uint64_t id, const uint32_t *tok) {
    sim_req r;
    kvo_lookup_result lr = add_lookup(s, &r, id, tok, 400);
    if (lr.status == KVO_HIT) {
        issue_load(s, &r, lr.tokens);
        kvo_completion cp = sim_wait_completion(s, id, KVO_COMPLETION_LOAD);
        if (cp.status == 0) check_loaded(s, &r, lr.tokens);
    }
    ASSERT_OK(kvo_connector_abort(s->c, id));
    sim_req_free(s, &r);
    return lr;
}

/* Same bytes per block, another segment split: the chunks stored under the
 * old layout are dropped from the host tier (only the changed group's), a
 * lookup misses instead of loading them in the wrong format, and chunks
 * stored under the new layout load byte-exact. */
KVO_TEST(layout_change_drops_host_chunks_of_changed_groups) {
    sim s;
    sim_init(&s, plan2(), NULL, 512);
    uint32_t tok[400];
    fill(tok, 400, 4);
    store_prompt(&s, NULL, 1, tok, 400);
    size_t full0 = host_entries(&s, 0), swa0 = host_entries(&s, 1);
    ASSERT_GT_U64(full0, 0);
    ASSERT_GT_U64(swa0, 0);
    sim_layout(&s, 0); /* the same layout again: nothing changes */
    ASSERT_EQ_U64(host_entries(&s, 0), full0);
    ASSERT_EQ_U64(host_entries(&s, 1), swa0);
    sim_layout(&s, 2); /* only the sliding group is split */
    ASSERT_EQ_U64(host_entries(&s, 0), full0);
    ASSERT_EQ_U64(host_entries(&s, 1), 0);
    kvo_lookup_result lr = lookup_load_check(&s, 2, tok);
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    sim_layout(&s, 3); /* both split */
    ASSERT_EQ_U64(host_entries(&s, 0), 0);
    lr = lookup_load_check(&s, 3, tok);
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    /* stored under the new layout: hits, byte-exact */
    store_prompt(&s, NULL, 4, tok, 400);
    lr = lookup_load_check(&s, 5, tok);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    /* and back: the split-format chunks go */
    sim_layout(&s, 0);
    lr = lookup_load_check(&s, 6, tok);
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    check_host_idle(&s);
    sim_destroy(&s);
}

/* A hit pinned by lookup before the layout changes is released: the load is
 * refused (look up again), never copied in the old format. */
KVO_TEST(layout_change_releases_pinned_hits) {
    sim s;
    sim_req r;
    uint32_t tok[400];
    kvo_lookup_result lr = sim_with_hit(&s, &r, tok, 5);
    sim_layout(&s, 1);
    alloc_for_load(&s, &r, lr.tokens);
    kvo_block_table tb[SIM_MAXG];
    sim_tables(&s, &r, tb);
    ASSERT_ERR(kvo_connector_load(s.c, 2, lr.tokens, tb, s.ng), KVO_ESTATE);
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    check_host_idle(&s);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    sim_destroy(&s);
}

static kvo_file_tier *make_tier(const kvo_plan *p, const char *root, uint64_t quota, uint64_t layout_hash) {
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    fp.root = root;
    fp.plan = p;
    fp.quota_bytes = quota;
    fp.max_staging_bytes = 8ull << 20;
    fp.log_interval_s = 3600;
    fp.layout_hash = layout_hash;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&fp, &t));
    return t;
}

static void sim_with_tier(sim *s, kvo_plan *p, kvo_file_tier *t, kvo_file_mode mode, uint64_t host_bytes) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.file_tier = t;
    cp.verify_checksums = true;
    cp.file_mode = mode;
    cp.host_bytes = host_bytes;
    cp.file_persist_on_destroy = false;
    sim_init(s, p, &cp, 512);
    s->keep_plan = true;
}

static uint64_t tier_writes(kvo_file_tier *t) {
    kvo_file_tier_stats ts = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_flush(t, -1));
    ASSERT_OK(kvo_file_tier_get_stats(t, &ts));
    return ts.writes;
}

/* The file tier too: an unnamespaced tier holds the first layout's bytes,
 * so while the layout differs the connector neither reads nor writes its
 * files; back on the first layout, they hit again, byte-exact.  A tier
 * namespaced by a layout hash is used only while the layout has that hash. */
KVO_TEST(layout_change_stops_using_files_of_the_old_layout) {
    for (int namespaced = 0; namespaced < 2; namespaced++) {
        char root[1024];
        snprintf(root, sizeof root, "%s/tier%d", kvo_test_tmpdir(), namespaced);
        kvo_plan *p = plan2();
        sim s;
        kvo_file_tier *t = NULL;
        if (namespaced) { /* the hash of the sim's own layout, computed first */
            sim_with_tier(&s, p, NULL, KVO_FILE_WRITE_THROUGH, 0);
            uint64_t h = layout_hash_of(&s, 0);
            sim_destroy(&s);
            t = make_tier(p, root, 32ull << 20, h);
        } else {
            t = make_tier(p, root, 32ull << 20, 0);
        }
        sim_with_tier(&s, p, t, KVO_FILE_WRITE_THROUGH, 0);
        uint32_t tok[400], tok2[400];
        fill(tok, 400, 6);
        fill(tok2, 400, 60);
        store_prompt(&s, t, 1, tok, 400);
        uint64_t w0 = tier_writes(t);
        ASSERT_GT_U64(w0, 0);
        sim_layout(&s, 1); /* the full group split: its host chunks go */
        kvo_store_clear(kvo_connector_store(s.c));
        kvo_lookup_result lr = lookup_load_check(&s, 2, tok);
        ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
        store_prompt(&s, t, 3, tok2, 400); /* not written under the wrong namespace */
        if (namespaced) ASSERT_EQ_U64(tier_writes(t), w0);
        lr = lookup_load_check(&s, 4, tok2); /* host hit under the new layout */
        ASSERT_EQ_INT(lr.status, KVO_HIT);
        ASSERT_EQ_U64(lr.tokens_file, 0);
        sim_layout(&s, 0); /* back: the files serve again */
        kvo_store_clear(kvo_connector_store(s.c));
        lr = lookup_load_check(&s, 5, tok);
        ASSERT_EQ_INT(lr.status, KVO_HIT);
        ASSERT_EQ_U64(lr.tokens, 384);
        ASSERT_EQ_U64(lr.tokens_file, 384);
        /* tok2's full-group chunks never reached the files (stored split) */
        lr = lookup_load_check(&s, 6, tok2);
        ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
        sim_destroy(&s);
        kvo_file_tier_destroy(t);
        kvo_plan_destroy(p);
    }
}

/* --------------------------------------- 3. write-back keeps its hit -- */

/* Slot bytes of the chunks of an n-token prompt. */
static uint64_t prompt_bytes(const kvo_plan *p, uint64_t n) {
    uint64_t b = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(p); g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        if (gp->offloaded) b += n / gp->tokens_per_chunk * gp->slot_bytes;
    }
    return b;
}

/* Write-back, a host tier and a file quota of one prompt each: A reaches
 * the files when B evicts it from the host; looking A up then reserves host
 * slots, which evicts B, whose write-back needs file quota.  The files of
 * A's hit must not be what makes room: the hit stays a hit, byte-exact. */
KVO_TEST(writeback_lookup_keeps_the_files_it_hits) {
    char root[1024];
    snprintf(root, sizeof root, "%s/wbtier", kvo_test_tmpdir());
    kvo_plan *p = plan2();
    uint64_t one = prompt_bytes(p, 400);
    kvo_file_tier *t = make_tier(p, root, one, 0);
    sim s;
    sim_with_tier(&s, p, t, KVO_FILE_WRITE_BACK, one);
    uint32_t a[400], b[400];
    fill(a, 400, 7);
    fill(b, 400, 70);
    store_prompt(&s, t, 1, a, 400);
    store_prompt(&s, t, 2, b, 400); /* evicts A: written back */
    ASSERT_GT_U64(tier_writes(t), 0);
    sim_req r;
    kvo_lookup_result lr = add_lookup(&s, &r, 3, a, 400);
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_GT_U64(lr.tokens_file, 0);
    issue_load(&s, &r, lr.tokens);
    kvo_completion cp = sim_wait_completion(&s, 3, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    check_loaded(&s, &r, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &r);
    check_host_idle(&s);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}

/* ------------------------------- 4. block ids of a deferred load -- */

/* A load that must wait for file reads checks its engine block ids at once:
 * an id beyond num_blocks is KVO_EINVAL (nothing issued, the hit stays
 * pinned), and the corrected load then succeeds. */
KVO_TEST(deferred_load_rejects_block_id_out_of_range) {
    char root[1024];
    snprintf(root, sizeof root, "%s/dtier", kvo_test_tmpdir());
    kvo_plan *p = plan2();
    kvo_file_tier *t = make_tier(p, root, 32ull << 20, 0);
    sim s;
    sim_with_tier(&s, p, t, KVO_FILE_WRITE_THROUGH, 0);
    uint32_t tok[400];
    fill(tok, 400, 8);
    store_prompt(&s, t, 1, tok, 400);
    kvo_store_clear(kvo_connector_store(s.c));
    sim_req r;
    kvo_lookup_result lr = add_lookup(&s, &r, 2, tok, 400); /* file reads queued, not polled */
    ASSERT_EQ_INT(lr.status, KVO_HIT);
    ASSERT_EQ_U64(lr.tokens_file, 384);
    alloc_for_load(&s, &r, lr.tokens);
    uint64_t keep = r.tab[0][3];
    r.tab[0][3] = s.nblocks; /* one past the layout's blocks */
    kvo_block_table tb[SIM_MAXG];
    sim_tables(&s, &r, tb);
    ASSERT_ERR(kvo_connector_load(s.c, 2, lr.tokens, tb, s.ng), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "num_blocks");
    r.tab[0][3] = keep;
    sim_tables(&s, &r, tb);
    ASSERT_OK(kvo_connector_load(s.c, 2, lr.tokens, tb, s.ng));
    kvo_completion cp = sim_wait_completion(&s, 2, KVO_COMPLETION_LOAD);
    ASSERT_EQ_INT(cp.status, 0);
    check_loaded(&s, &r, lr.tokens);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}
