/*
 * The connector with a file tier behind the host tier: write-through of
 * stored chunks, lookups that hit files when the host misses (file -> host ->
 * engine), mixed host/file hits, a restart that hits yesterday's files,
 * corrupt files that fail the load (never loaded), and preemption while file
 * reads run.
 */
#include <ftw.h>
#include <unistd.h>

#include "connector/connector_internal.h"
#include "connector_sim.h"

static kvo_plan *plan2(void) {
    sim_group gs[] = {{"full", KVO_GROUP_FULL, 16, 0, 2, true, false},
                      {"swa", KVO_GROUP_SLIDING, 16, 48, 1, true, false}};
    return sim_plan("file-two", 16, gs, 2);
}

static kvo_file_tier *make_tier(const kvo_plan *p, const char *root) {
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    fp.root = root;
    fp.plan = p;
    fp.quota_bytes = 32ull << 20;
    fp.max_staging_bytes = 8ull << 20;
    fp.log_interval_s = 3600;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&fp, &t));
    return t;
}

static void make_sim(sim *s, kvo_plan *p, kvo_file_tier *t) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.file_tier = t;
    cp.verify_checksums = true;
    sim_init(s, p, &cp, 512);
    s->keep_plan = true;
}

static void fill(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 13 + salt) % 40009;
}

/* Store n tokens through request id, finish it, wait until the files are
 * written. */
static void store_prompt(sim *s, kvo_file_tier *t, uint64_t id, const uint32_t *tok, size_t n) {
    sim_req r;
    sim_req_init(&r, id);
    sim_req_tokens(&r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.id = id, .tokens = tok, .n_tokens = n}));
    sim_compute(s, &r, n);
    kvo_block_table tb[SIM_MAXG];
    sim_tables(s, &r, tb);
    bool busy;
    ASSERT_OK(kvo_connector_finish(s->c, id, n, tb, s->ng, &busy));
    if (busy) (void)sim_wait_completion(s, id, KVO_COMPLETION_RELEASED);
    sim_req_free(s, &r);
    ASSERT_OK(kvo_file_tier_flush(t, -1));
}

/* Look up, load, wait; returns the completion; *res the lookup. */
static kvo_completion load_prompt(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n,
                                  kvo_lookup_result *res) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.id = id, .tokens = tok, .n_tokens = n}));
    ASSERT_OK(kvo_connector_lookup(s->c, id, 0, res));
    ASSERT_EQ_INT(res->status, KVO_HIT);
    uint64_t b = res->tokens;
    /* allocate what the load writes */
    for (size_t g = 0; g < s->ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(s->plan, g);
        sim_table_len(s, r, g, b / 16);
        uint64_t from = gp->kind == KVO_GROUP_SLIDING && b > gp->window ? (b - gp->window) / 16 * 16 : 0;
        for (uint64_t i = from / 16; i < b / 16; i++) r->tab[g][i] = sim_alloc(s, g);
    }
    kvo_block_table tb[SIM_MAXG];
    sim_tables(s, r, tb);
    ASSERT_OK(kvo_connector_load(s->c, id, b, tb, s->ng));
    return sim_wait_completion(s, id, KVO_COMPLETION_LOAD);
}

static void check_blocks(sim *s, sim_req *r, uint64_t b) {
    for (size_t g = 0; g < s->ng; g++)
        for (uint64_t i = 0; i < b / 16 && i < r->tn[g]; i++)
            if (r->tab[g][i] != KVO_NO_BLOCK && !sim_block_ok(s, r, g, i))
                FAILF("group %zu block index %llu differs", g, (unsigned long long)i);
}

KVO_TEST(host_miss_hits_file_then_restart) {
    char root[1024];
    snprintf(root, sizeof root, "%s/tier", kvo_test_tmpdir());
    kvo_plan *p = plan2();
    kvo_file_tier *t = make_tier(p, root);
    sim s;
    make_sim(&s, p, t);
    uint32_t tok[400];
    fill(tok, 400, 1);
    store_prompt(&s, t, 1, tok, 400);
    kvo_connector_stats st;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.file_writes, st.chunks_stored);
    /* the host forgets everything: the files serve the hit */
    kvo_store_clear(kvo_connector_store(s.c));
    sim_req r;
    kvo_lookup_result lr;
    kvo_completion cp = load_prompt(&s, &r, 2, tok, 400, &lr);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.tokens_file, 384);
    ASSERT_EQ_U64(lr.tokens_host, 0);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    check_blocks(&s, &r, 384);
    kvo_request_stats rs;
    ASSERT_OK(kvo_connector_request_stats(s.c, 2, &rs));
    ASSERT_EQ_U64(rs.tokens_loaded_file, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    /* the chunks are in host memory again (promoted): a mixed hit after
     * dropping a few of them */
    kvo_store_entry ents[64];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(kvo_connector_store(s.c), &cur, ents, 64, &n));
    ASSERT_GT_U64(n, 4);
    for (size_t i = 0; i < n; i++)
        if (ents[i].key.group == 0 && i % 3 == 0) ASSERT_OK(kvo_store_remove(kvo_connector_store(s.c), &ents[i].key, 1));
    cp = load_prompt(&s, &r, 3, tok, 400, &lr);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_GT_U64(lr.tokens_file, 0);
    ASSERT_GT_U64(lr.tokens_host, 0);
    ASSERT_EQ_U64(lr.tokens_file + lr.tokens_host, 384);
    ASSERT_EQ_INT(cp.status, 0);
    check_blocks(&s, &r, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 3));
    sim_req_free(&s, &r);
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    ASSERT_GT_U64(st.file_reads, 0);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);

    /* restart: a new process-like setup on the same directory */
    p = plan2();
    t = make_tier(p, root);
    make_sim(&s, p, t);
    cp = load_prompt(&s, &r, 4, tok, 400, &lr);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.tokens_file, 384);
    ASSERT_EQ_INT(cp.status, 0);
    check_blocks(&s, &r, 384);
    ASSERT_OK(kvo_connector_abort(s.c, 4));
    sim_req_free(&s, &r);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}

static int corrupt_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag != FTW_F || sb->st_size <= 4096 + 16 || strstr(path, "manifest")) return 0;
    FILE *f = fopen(path, "r+b");
    if (!f) return 0;
    fseek(f, 4096 + 3, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 4096 + 3, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
    return 0;
}

KVO_TEST(corrupt_files_fail_the_load) {
    char root[1024];
    snprintf(root, sizeof root, "%s/tier", kvo_test_tmpdir());
    kvo_plan *p = plan2();
    kvo_file_tier *t = make_tier(p, root);
    sim s;
    make_sim(&s, p, t);
    uint32_t tok[400];
    fill(tok, 400, 2);
    store_prompt(&s, t, 1, tok, 400);
    kvo_store_clear(kvo_connector_store(s.c));
    ASSERT_EQ_INT(nftw(root, corrupt_one, 16, FTW_PHYS), 0);
    sim_req r;
    kvo_lookup_result lr;
    kvo_completion cp = load_prompt(&s, &r, 2, tok, 400, &lr);
    ASSERT_NE_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 0);
    ASSERT_EQ_U64(cp.n_invalid_blocks, 0); /* nothing was copied into the engine */
    kvo_connector_stats st;
    ASSERT_OK(kvo_connector_get_stats(s.c, &st));
    ASSERT_GT_U64(st.file_read_failures, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    /* the bad files are gone: the next lookup misses */
    ASSERT_OK(kvo_connector_lookup(s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    ASSERT_OK(kvo_connector_abort(s.c, 2));
    sim_req_free(&s, &r);
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}

KVO_TEST(preempt_while_file_reads_run) {
    char root[1024];
    snprintf(root, sizeof root, "%s/tier", kvo_test_tmpdir());
    kvo_plan *p = plan2();
    kvo_file_tier *t = make_tier(p, root);
    sim s;
    make_sim(&s, p, t);
    uint32_t tok[400];
    fill(tok, 400, 3);
    store_prompt(&s, t, 1, tok, 400);
    for (int round = 0; round < 5; round++) {
        kvo_store_clear(kvo_connector_store(s.c));
        uint64_t id = 10 + (uint64_t)round;
        ASSERT_OK(kvo_connector_add_request(s.c, &(kvo_request_desc){.id = id, .tokens = tok, .n_tokens = 400}));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(s.c, id, 0, &lr));
        ASSERT_EQ_INT(lr.status, KVO_HIT);
        if (round % 2) {
            /* the load waits for the reads; preempt before they land */
            sim_req r;
            sim_req_init(&r, id);
            sim_req_tokens(&r, tok, 400);
            for (size_t g = 0; g < 2; g++) {
                sim_table_len(&s, &r, g, 24);
                for (int i = 0; i < 24; i++) r.tab[g][i] = sim_alloc(&s, g);
            }
            kvo_block_table tb[2];
            sim_tables(&s, &r, tb);
            ASSERT_OK(kvo_connector_load(s.c, id, lr.tokens, tb, 2));
            ASSERT_OK(kvo_connector_preempt(s.c, id));
            sim_req_free(&s, &r);
        } else {
            ASSERT_OK(kvo_connector_abort(s.c, id));
        }
        /* let the orphaned reads finish */
        for (int spin = 0; spin < 100000; spin++) {
            kvo_completion cps[8];
            size_t n = kvo_connector_poll(s.c, cps, 8);
            for (size_t i = 0; i < n; i++) ASSERT_NE_U64(cps[i].request, id);
            kvo_store_stats hs;
            ASSERT_OK(kvo_store_get_stats(kvo_connector_store(s.c), &hs));
            if (hs.pending == 0) break;
            usleep(100);
        }
        kvo_store_stats hs;
        ASSERT_OK(kvo_store_get_stats(kvo_connector_store(s.c), &hs));
        ASSERT_EQ_U64(hs.pending, 0);
        ASSERT_EQ_U64(hs.pinned, 0);
        if (round % 2) ASSERT_OK(kvo_connector_abort(s.c, id));
    }
    sim_destroy(&s);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(p);
}
