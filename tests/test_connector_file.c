/*
 * The connector with a file tier behind the host tier: write-through of
 * stored chunks, write-back on host eviction (only evicted chunks reach
 * files; explicit flush and persistence at destroy; back-pressure drops
 * counted), lookups that hit files when the host misses (file -> host ->
 * engine), mixed host/file hits, a restart that hits yesterday's files,
 * corrupt files that fail the load (never loaded), and preemption while file
 * reads run.
 */
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <unistd.h>

#include "connector/connector_internal.h"
#include "tiers/file_internal.h"
#include "tiers/file_testing.h"
#include "connector_sim.h"

static kvo_plan *plan2(void) { return sim_two_group_plan("file-two"); }

static kvo_file_tier *make_tier(const kvo_plan *p, const char *root, uint32_t max_pending_writes) {
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    fp.root = root;
    fp.plan = p;
    fp.quota_bytes = 32ull << 20;
    fp.max_staging_bytes = 8ull << 20;
    fp.log_interval_s = 3600;
    if (max_pending_writes) fp.max_pending_writes = max_pending_writes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&fp, &t));
    return t;
}

/* A connector in file_mode with host_bytes (0: the sim's default) and
 * file_persist_on_destroy = persist. */
static void make_sim_mode(sim *s, kvo_plan *p, kvo_file_tier *t, kvo_file_mode mode, uint64_t host_bytes,
                          bool persist) {
    kvo_connector_params cp = kvo_connector_default_params();
    cp.file_tier = t;
    cp.verify_checksums = true;
    cp.file_mode = mode;
    cp.host_bytes = host_bytes;
    cp.file_persist_on_destroy = persist;
    sim_init(s, p, &cp, 512);
    s->keep_plan = true;
}

static void fill(uint32_t *t, size_t n, uint32_t salt) {
    for (size_t i = 0; i < n; i++) t[i] = (uint32_t)(i * 13 + salt) % 40009;
}

/* Store n tokens through request id, finish it, wait until the files are
 * written. */
static void store_prompt(sim *s, kvo_file_tier *t, uint64_t id, const uint32_t *tok, size_t n) {
    sim_store_prompt(s, id, tok, n);
    ASSERT_OK(kvo_file_tier_flush(t, -1));
}

/* Look up, load, wait; returns the completion; *res the lookup. */
static kvo_completion load_prompt(sim *s, sim_req *r, uint64_t id, const uint32_t *tok, size_t n,
                                  kvo_lookup_result *res) {
    sim_req_init(r, id);
    sim_req_tokens(r, tok, n);
    ASSERT_OK(kvo_connector_add_request(s->c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = n}));
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

/* Slot bytes that the chunks of an n-token prompt take in the host tier. */
static uint64_t prompt_bytes(const kvo_plan *p, uint64_t n) {
    uint64_t b = 0;
    for (size_t g = 0; g < kvo_plan_num_groups(p); g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        if (gp->offloaded) b += n / gp->tokens_per_chunk * gp->slot_bytes;
    }
    return b;
}

/* One test setup: plan2, a tier under <tmp>/tier (max_pending_writes: 0 =
 * the default), a connector in mode with a host tier of host_prompts times
 * a 400-token prompt's chunks (0: the sim's default, 8 MiB). */
typedef struct fx {
    char root[1024];
    kvo_plan *p;
    kvo_file_tier *t;
    sim s;
} fx;

static void fx_open(fx *f, uint32_t max_pending_writes, kvo_file_mode mode, uint32_t host_prompts, bool persist) {
    snprintf(f->root, sizeof f->root, "%s/tier", kvo_test_tmpdir());
    f->p = plan2();
    f->t = make_tier(f->p, f->root, max_pending_writes);
    make_sim_mode(&f->s, f->p, f->t, mode, host_prompts * prompt_bytes(f->p, 400), persist);
}

static void fx_close(fx *f) {
    sim_destroy(&f->s);
    kvo_file_tier_destroy(f->t);
    kvo_plan_destroy(f->p);
}

/* Load the 400 tokens tok through request id: a 384-token hit, byte-exact,
 * from_file of its tokens from files (UINT64_MAX: any); then abort it. */
static kvo_lookup_result expect_hit(sim *s, uint64_t id, const uint32_t *tok, uint64_t from_file) {
    sim_req r;
    kvo_lookup_result lr;
    kvo_completion cp = load_prompt(s, &r, id, tok, 400, &lr);
    ASSERT_EQ_U64(lr.tokens, 384);
    if (from_file != UINT64_MAX) ASSERT_EQ_U64(lr.tokens_file, from_file);
    ASSERT_EQ_U64(lr.tokens_file + lr.tokens_host, 384);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    check_blocks(s, &r, 384);
    ASSERT_OK(kvo_connector_abort(s->c, id));
    sim_req_free(s, &r);
    return lr;
}

KVO_TEST(host_miss_hits_file_then_restart) {
    fx f;
    fx_open(&f, 0, KVO_FILE_WRITE_THROUGH, 0, true);
    uint32_t tok[400];
    fill(tok, 400, 1);
    store_prompt(&f.s, f.t, 1, tok, 400);
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_EQ_U64(st.file_writes, st.chunks_stored);
    /* the host forgets everything: the files serve the hit */
    kvo_store_clear(kvo_connector_store(f.s.c));
    sim_req r;
    kvo_lookup_result lr;
    kvo_completion cp = load_prompt(&f.s, &r, 2, tok, 400, &lr);
    ASSERT_EQ_U64(lr.tokens, 384);
    ASSERT_EQ_U64(lr.tokens_file, 384);
    ASSERT_EQ_U64(lr.tokens_host, 0);
    ASSERT_EQ_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 384);
    check_blocks(&f.s, &r, 384);
    kvo_request_stats rs = KVO_REQUEST_STATS_INIT;
    ASSERT_OK(kvo_connector_request_stats(f.s.c, 2, &rs));
    ASSERT_EQ_U64(rs.tokens_loaded_file, 384);
    ASSERT_OK(kvo_connector_abort(f.s.c, 2));
    sim_req_free(&f.s, &r);
    /* the chunks are in host memory again (promoted): a mixed hit after
     * dropping a few of them */
    kvo_store_entry ents[64];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(kvo_connector_store(f.s.c), &cur, ents, 64, &n));
    ASSERT_GT_U64(n, 4);
    kvo_store *hs = kvo_connector_store(f.s.c);
    for (size_t i = 0; i < n; i++)
        if (ents[i].key.group == 0 && i % 3 == 0) ASSERT_OK(kvo_store_remove(hs, &ents[i].key, 1));
    lr = expect_hit(&f.s, 3, tok, UINT64_MAX);
    ASSERT_GT_U64(lr.tokens_file, 0);
    ASSERT_GT_U64(lr.tokens_host, 0);
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    ASSERT_GT_U64(st.file_reads, 0);
    fx_close(&f);

    /* restart: a new process-like setup on the same directory */
    fx_open(&f, 0, KVO_FILE_WRITE_THROUGH, 0, true);
    expect_hit(&f.s, 4, tok, 384);
    fx_close(&f);
}

/* One full-attention group whose chunks are whole 4096-byte slots (2
 * layers x 2 blocks x 1 KiB): what a lent write can take in place. */
static kvo_plan *plan_slot_sized(void) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("file-zero-copy", 16, &m));
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "full");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = 1024;
    ASSERT_OK(kvo_model_add_group(m, &g));
    kvo_group_override ov = {"full", 2};
    kvo_plan_params pp = kvo_plan_default_params();
    pp.overrides = &ov;
    pp.n_overrides = 1;
    kvo_plan *p = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &p));
    kvo_model_destroy(m);
    ASSERT_EQ_U64(kvo_plan_group(p, 0)->chunk_bytes, kvo_plan_group(p, 0)->slot_bytes);
    return p;
}

/* Zero-copy write-through (file_zero_copy): the stored chunks' host slots
 * are lent to the tier (writes_borrowed; no staging memory), pinned until
 * the connector's poll sees their writes complete; the files then serve a
 * host miss and a restart byte-exact.  A host chunk changed after its
 * store (verify_checksums) never reaches a file: the tier checks the lent
 * bytes against the store's checksum. */
KVO_TEST(zero_copy_write_through) {
    fx f;
    snprintf(f.root, sizeof f.root, "%s/tier", kvo_test_tmpdir());
    f.p = plan_slot_sized();
    f.t = make_tier(f.p, f.root, 0);
    kvo_connector_params cp = kvo_connector_default_params();
    cp.file_tier = f.t;
    cp.verify_checksums = true;
    cp.file_zero_copy = true;
    sim_init(&f.s, f.p, &cp, 512);
    f.s.keep_plan = true;
    uint32_t tok[400];
    fill(tok, 400, 7);
    sim_store_prompt(&f.s, 1, tok, 400);
    ASSERT_OK(kvo_file_tier_flush(f.t, -1));
    (void)kvo_connector_poll(f.s.c, NULL, 0, &(size_t){0}); /* the completions end the loans */
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_EQ_U64(st.chunks_stored, 12); /* 400 tokens, 32 a chunk */
    ASSERT_EQ_U64(st.file_writes, st.chunks_stored);
    ASSERT_EQ_U64(st.file_writes_dropped, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.file_lent_now, 0);
    kvo_file_tier_stats ts = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(f.t, &ts));
    ASSERT_EQ_U64(ts.writes, 12);
    ASSERT_EQ_U64(ts.writes_borrowed, 12);
    kvo_store_clear(kvo_connector_store(f.s.c)); /* the host forgets: the files serve */
    expect_hit(&f.s, 2, tok, 384);

    fx_close(&f);

    /* a restart finds the files; then chunks changed in host memory after
     * their store (and their checksum) while their lent writes wait: the
     * tier refuses each (no file), counted as checksum failures */
    f.p = plan_slot_sized();
    f.t = make_tier(f.p, f.root, 0);
    cp.file_tier = f.t;
    sim_init(&f.s, f.p, &cp, 512);
    f.s.keep_plan = true;
    expect_hit(&f.s, 3, tok, 384);
    uint32_t tok2[400];
    fill(tok2, 400, 8);
    atomic_store(&kvo__file_test_write_delay_us, 300000); /* each write waits before it reads its source */
    sim_store_prompt(&f.s, 4, tok2, 400);
    kvo_store_entry ents[64];
    uint64_t cur = 0;
    size_t n = 0;
    ASSERT_OK(kvo_store_scan(kvo_connector_store(f.s.c), &cur, ents, 64, &n));
    unsigned char *base = kvo_arena_base(kvo_connector_arena(f.s.c));
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    size_t lent = st.file_lent_now;
    ASSERT_GT_U64(lent, 0);
    for (size_t i = 0; i < n; i++) base[ents[i].slot.offset + 100] ^= 0x5a; /* every host chunk */
    atomic_store(&kvo__file_test_write_delay_us, 0);
    ASSERT_OK(kvo_file_tier_flush(f.t, -1));
    (void)kvo_connector_poll(f.s.c, NULL, 0, &(size_t){0});
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_EQ_U64(st.checksum_failures, lent);
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_OK(kvo_file_tier_get_stats(f.t, &ts));
    ASSERT_EQ_U64(ts.writes, 0); /* this tier's: none of the changed chunks */
    kvo_store_clear(kvo_connector_store(f.s.c));
    sim_req r;
    sim_req_init(&r, 5);
    sim_req_tokens(&r, tok2, 400);
    ASSERT_OK(kvo_connector_add_request(f.s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 5, .tokens = tok2, .n_tokens = 400}));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(f.s.c, 5, 0, &lr));
    ASSERT_TRUE(lr.status != KVO_HIT || lr.tokens < 384);
    ASSERT_OK(kvo_connector_abort(f.s.c, 5));
    sim_req_free(&f.s, &r);
    fx_close(&f);

    /* a host tier of one prompt: prompt A in files only, prompt B's writes
     * lent (slow) hold every host slot; a lookup of A answers PENDING (no
     * slot to read A into while B's slots are lent), then hits once the
     * writes are done */
    snprintf(f.root, sizeof f.root, "%s/tier3", kvo_test_tmpdir());
    f.p = plan_slot_sized();
    f.t = make_tier(f.p, f.root, 0);
    cp.file_tier = f.t;
    cp.host_bytes = 12 * kvo_plan_group(f.p, 0)->slot_bytes;
    sim_init(&f.s, f.p, &cp, 512);
    f.s.keep_plan = true;
    sim_store_prompt(&f.s, 6, tok, 400); /* A */
    ASSERT_OK(kvo_file_tier_flush(f.t, -1));
    (void)kvo_connector_poll(f.s.c, NULL, 0, &(size_t){0});
    atomic_store(&kvo__file_test_write_delay_us, 200000);
    sim_store_prompt(&f.s, 7, tok2, 400); /* B: evicts A from the host tier, lent */
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_GT_U64(st.file_lent_now, 0);
    sim_req_init(&r, 8);
    sim_req_tokens(&r, tok, 400);
    ASSERT_OK(kvo_connector_add_request(f.s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 8, .tokens = tok, .n_tokens = 400}));
    ASSERT_OK(kvo_connector_lookup(f.s.c, 8, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_PENDING);
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_GT_U64(st.lookups_wait_lent, 0);
    ASSERT_OK(kvo_connector_abort(f.s.c, 8));
    sim_req_free(&f.s, &r);
    atomic_store(&kvo__file_test_write_delay_us, 0);
    ASSERT_OK(kvo_file_tier_flush(f.t, -1));
    (void)kvo_connector_poll(f.s.c, NULL, 0, &(size_t){0});
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_EQ_U64(st.file_lent_now, 0);
    expect_hit(&f.s, 9, tok, 384); /* read back from the files */
    fx_close(&f);
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
    fx f;
    fx_open(&f, 0, KVO_FILE_WRITE_THROUGH, 0, true);
    uint32_t tok[400];
    fill(tok, 400, 2);
    store_prompt(&f.s, f.t, 1, tok, 400);
    kvo_store_clear(kvo_connector_store(f.s.c));
    ASSERT_EQ_INT(nftw(f.root, corrupt_one, 16, FTW_PHYS), 0);
    sim_req r;
    kvo_lookup_result lr;
    kvo_completion cp = load_prompt(&f.s, &r, 2, tok, 400, &lr);
    ASSERT_NE_INT(cp.status, 0);
    ASSERT_EQ_U64(cp.tokens_valid, 0);
    ASSERT_EQ_U64(cp.n_invalid_blocks, 0); /* nothing was copied into the engine */
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(f.s.c, &st));
    ASSERT_GT_U64(st.file_read_failures, 0);
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    /* the bad files are gone: the next lookup misses */
    ASSERT_OK(kvo_connector_lookup(f.s.c, 2, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    ASSERT_OK(kvo_connector_abort(f.s.c, 2));
    sim_req_free(&f.s, &r);
    fx_close(&f);
}

KVO_TEST(preempt_while_file_reads_run) {
    fx f;
    fx_open(&f, 0, KVO_FILE_WRITE_THROUGH, 0, true);
    uint32_t tok[400];
    fill(tok, 400, 3);
    store_prompt(&f.s, f.t, 1, tok, 400);
    for (int round = 0; round < 5; round++) {
        kvo_store_clear(kvo_connector_store(f.s.c));
        uint64_t id = 10 + (uint64_t)round;
        ASSERT_OK(kvo_connector_add_request(f.s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = id, .tokens = tok, .n_tokens = 400}));
        kvo_lookup_result lr;
        ASSERT_OK(kvo_connector_lookup(f.s.c, id, 0, &lr));
        ASSERT_EQ_INT(lr.status, KVO_HIT);
        if (round % 2) {
            /* the load waits for the reads; preempt before they land */
            sim_req r;
            sim_req_init(&r, id);
            sim_req_tokens(&r, tok, 400);
            for (size_t g = 0; g < 2; g++) {
                sim_table_len(&f.s, &r, g, 24);
                for (int i = 0; i < 24; i++) r.tab[g][i] = sim_alloc(&f.s, g);
            }
            kvo_block_table tb[2];
            sim_tables(&f.s, &r, tb);
            ASSERT_OK(kvo_connector_load(f.s.c, id, lr.tokens, tb, 2));
            ASSERT_OK(kvo_connector_preempt(f.s.c, id));
            sim_req_free(&f.s, &r);
        } else {
            ASSERT_OK(kvo_connector_abort(f.s.c, id));
        }
        /* let the orphaned reads finish */
        for (int spin = 0; spin < 100000; spin++) {
            kvo_completion cps[8];
            size_t n = 0;
            ASSERT_OK(kvo_connector_poll(f.s.c, cps, 8, &n));
            for (size_t i = 0; i < n; i++) ASSERT_NE_U64(cps[i].request, id);
            kvo_store_stats hs = KVO_STORE_STATS_INIT;
            ASSERT_OK(kvo_store_get_stats(kvo_connector_store(f.s.c), &hs));
            if (hs.pending == 0) break;
            usleep(100);
        }
        kvo_store_stats hs = KVO_STORE_STATS_INIT;
        ASSERT_OK(kvo_store_get_stats(kvo_connector_store(f.s.c), &hs));
        ASSERT_EQ_U64(hs.pending, 0);
        ASSERT_EQ_U64(hs.pinned, 0);
        if (round % 2) ASSERT_OK(kvo_connector_abort(f.s.c, id));
    }
    fx_close(&f);
}

/* ----------------------------------------------------------- write-back -- */

static kvo_file_tier_stats tier_stats(kvo_file_tier *t) {
    kvo_file_tier_stats ts = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_flush(t, -1));
    ASSERT_OK(kvo_file_tier_get_stats(t, &ts));
    return ts;
}

static kvo_connector_stats conn_stats(sim *s) {
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    ASSERT_OK(kvo_connector_get_stats(s->c, &st));
    return st;
}

static uint8_t file_state(kvo_file_tier *t, const kvo_chunk_key *k) {
    uint8_t st = 0xff;
    ASSERT_OK(kvo_file_tier_lookup(t, k, 1, &st));
    return st;
}

/* The keys of every chunk in the host tier (READY). */
static size_t host_keys(sim *s, kvo_chunk_key *out, size_t cap) {
    kvo_store_entry ents[64];
    uint64_t cur = 0;
    size_t m = 0;
    do {
        size_t n = 0;
        ASSERT_OK(kvo_store_scan(kvo_connector_store(s->c), &cur, ents, 64, &n));
        for (size_t i = 0; i < n && m < cap; i++)
            if (ents[i].state == KVO_READY) out[m++] = ents[i].key;
    } while (cur);
    return m;
}

/* Write-back with a host tier of three prompts and no persistence; store
 * prompt tok[0] (tokens from salt) and put its keys (all in the host tier)
 * into a; returns their count. */
static size_t writeback_first(fx *f, uint32_t (*tok)[400], uint32_t salt, kvo_chunk_key *a, size_t cap) {
    fx_open(f, 0, KVO_FILE_WRITE_BACK, 3, false);
    fill(tok[0], 400, salt);
    store_prompt(&f->s, f->t, 1, tok[0], 400);
    return host_keys(&f->s, a, cap);
}

/* Store prompts tok[k] (k = 1, 2, ...; tokens from salt) until none of the
 * na keys a is in the host tier any more, and one more (which evicts other
 * chunks too); returns the number of prompts stored. */
static size_t evict_keys(fx *f, uint32_t (*tok)[400], uint32_t salt, const kvo_chunk_key *a, size_t na) {
    size_t left = na, k = 1;
    for (bool more = true; k < 8 && more; k++) {
        more = left > 0; /* the round after the last key left is the extra one */
        fill(tok[k], 400, salt + (uint32_t)k * 7);
        store_prompt(&f->s, f->t, 1 + k, tok[k], 400);
        left = 0;
        for (size_t i = 0; i < na; i++) {
            kvo_store_entry e;
            left += kvo_store_peek(kvo_connector_store(f->s.c), &a[i], &e) == 0;
        }
    }
    ASSERT_EQ_U64(left, 0);
    return k;
}

/* Write-back: nothing reaches the files until the host evicts; then exactly
 * the evicted chunks do, and a lookup that misses the host loads them from
 * the files byte-exact.  Destroy without persistence writes nothing more. */
KVO_TEST(writeback_only_on_host_eviction) {
    fx f;
    uint32_t tok[8][400];
    kvo_chunk_key a[256];
    size_t na = writeback_first(&f, tok, 100, a, 256);
    kvo_connector_stats st = conn_stats(&f.s);
    ASSERT_GT_U64(st.chunks_stored, 0);
    ASSERT_EQ_U64(na, st.chunks_stored);
    ASSERT_EQ_U64(st.host.evictions, 0);
    ASSERT_EQ_U64(st.file_writes, 0);
    ASSERT_EQ_U64(tier_stats(f.t).writes, 0);
    evict_keys(&f, tok, 100, a, na); /* every chunk of the first left the host */
    st = conn_stats(&f.s);
    kvo_file_tier_stats ts = tier_stats(f.t);
    ASSERT_GT_U64(st.host.evictions, 0);
    ASSERT_EQ_U64(st.file_writes, st.file_writebacks);
    ASSERT_EQ_U64(st.file_writes, st.host.evictions); /* every eviction written once */
    ASSERT_EQ_U64(st.file_writes_dropped, 0);
    ASSERT_EQ_U64(ts.writes, st.file_writes);
    for (size_t i = 0; i < na; i++) ASSERT_EQ_INT(file_state(f.t, &a[i]), KVO_READY);
    /* chunks never evicted were never written */
    kvo_chunk_key h[512];
    size_t nh = host_keys(&f.s, h, 512);
    ASSERT_GT_U64(nh, 0);
    for (size_t i = 0; i < nh; i++) ASSERT_EQ_INT(file_state(f.t, &h[i]), KVO_MISS);
    /* the first prompt comes back from the files, byte-exact; reading it
     * evicts other chunks, written back too */
    expect_hit(&f.s, 50, tok[0], 384);
    uint64_t before = tier_stats(f.t).writes;
    ASSERT_EQ_U64(before, conn_stats(&f.s).file_writes);
    sim_destroy(&f.s); /* no persistence asked: nothing more is written */
    ASSERT_EQ_U64(tier_stats(f.t).writes, before);
    kvo_file_tier_destroy(f.t);
    kvo_plan_destroy(f.p);
}

/* Explicit flush and persistence at destroy, never rewriting what the files
 * hold; a restart hits what the host tier held. */
KVO_TEST(writeback_flush_persist_restart) {
    fx f;
    fx_open(&f, 0, KVO_FILE_WRITE_BACK, 0, true);
    uint32_t ta[400], tb[400];
    fill(ta, 400, 200);
    fill(tb, 400, 300);
    store_prompt(&f.s, f.t, 1, ta, 400);
    kvo_connector_stats st = conn_stats(&f.s);
    uint64_t na = st.chunks_stored;
    ASSERT_EQ_U64(st.file_writes, 0);
    uint64_t nq = 99;
    ASSERT_OK(kvo_connector_flush_to_file(f.s.c, -1, &nq));
    ASSERT_EQ_U64(nq, na);
    ASSERT_EQ_U64(tier_stats(f.t).writes, na);
    ASSERT_OK(kvo_connector_flush_to_file(f.s.c, KVO_MS(10000), &nq)); /* all held: nothing rewritten */
    ASSERT_EQ_U64(nq, 0);
    st = conn_stats(&f.s);
    ASSERT_GE_U64(st.file_writes_skipped, na);
    ASSERT_EQ_U64(st.file_writebacks, 0);
    store_prompt(&f.s, f.t, 2, tb, 400);
    uint64_t nb = conn_stats(&f.s).chunks_stored - na;
    ASSERT_EQ_U64(tier_stats(f.t).writes, na);
    sim_destroy(&f.s); /* persists the second prompt's chunks only */
    ASSERT_EQ_U64(tier_stats(f.t).writes, na + nb);
    kvo_file_tier_destroy(f.t);
    kvo_plan_destroy(f.p);

    fx_open(&f, 0, KVO_FILE_WRITE_BACK, 0, true);
    expect_hit(&f.s, 3, tb, 384);
    sim_destroy(&f.s); /* what it holds came from the files: nothing written */
    ASSERT_EQ_U64(tier_stats(f.t).writes, 0);
    kvo_file_tier_destroy(f.t);
    kvo_plan_destroy(f.p);
}

/* A tier that can take one write at a time: evictions it refuses are
 * counted as dropped, never an error; injected ENOSPC neither.  Every chunk
 * handed over is accounted for (queued, dropped). */
KVO_TEST(writeback_backpressure_counted) {
    fx f;
    fx_open(&f, 1, KVO_FILE_WRITE_BACK, 2, false);
    uint32_t tok[400];
    kvo_connector_stats st = KVO_CONNECTOR_STATS_INIT;
    uint32_t k = 0;
    for (; k < 40; k++) {
        fill(tok, 400, 500 + k * 11);
        store_prompt(&f.s, f.t, 1 + k, tok, 400);
        st = conn_stats(&f.s);
        if (st.file_writes_dropped > 0 && st.file_writes >= 4) break;
    }
    ASSERT_LT_U64(k, 40);
    kvo_file_tier_stats ts = tier_stats(f.t);
    ASSERT_EQ_U64(st.file_writes_dropped, ts.dropped_backpressure + ts.dropped_quota);
    ASSERT_EQ_U64(st.file_writes, ts.writes + ts.dropped_nospace + ts.dropped_io);
    ASSERT_EQ_U64(st.file_writes + st.file_writes_dropped + st.file_writes_skipped, st.host.evictions);
    /* a full disk: the writes fail in the tier, counted there */
    kvo__file_tier_inject_write_error(ENOSPC, 2);
    uint64_t q0 = st.file_writes;
    for (; k < 80 && st.file_writes < q0 + 2; k++) {
        fill(tok, 400, 500 + k * 11);
        store_prompt(&f.s, f.t, 1 + k, tok, 400);
        st = conn_stats(&f.s);
    }
    kvo__file_tier_inject_write_error(0, 0);
    ASSERT_GE_U64(st.file_writes, q0 + 2);
    ts = tier_stats(f.t);
    ASSERT_EQ_U64(ts.dropped_nospace, 2);
    ASSERT_EQ_U64(st.file_writes, ts.writes + ts.dropped_nospace + ts.dropped_io);
    /* the connector still works: the last prompt hits the host */
    expect_hit(&f.s, 1000, tok, UINT64_MAX);
    /* an explicit flush paces itself through the one-write queue */
    uint64_t nq = 0;
    ASSERT_OK(kvo_connector_flush_to_file(f.s.c, -1, &nq));
    ASSERT_GT_U64(nq, 0);
    kvo_chunk_key h[512];
    size_t nh = host_keys(&f.s, h, 512);
    for (size_t i = 0; i < nh; i++) ASSERT_EQ_INT(file_state(f.t, &h[i]), KVO_READY);
    fx_close(&f);
}

/* With verify_checksums, a host chunk whose bytes changed after it was
 * stored is never written back (a file would checksum the wrong bytes as
 * valid): counted, and the prompt misses instead of loading garbage. */
KVO_TEST(writeback_skips_corrupt_host_chunks) {
    fx f;
    uint32_t tok[8][400];
    kvo_chunk_key a[256];
    size_t na = writeback_first(&f, tok, 900, a, 256);
    ASSERT_GT_U64(na, 0);
    unsigned char *base = kvo_arena_base(kvo_connector_arena(f.s.c));
    for (size_t i = 0; i < na; i++) {
        kvo_store_entry e;
        ASSERT_OK(kvo_store_peek(kvo_connector_store(f.s.c), &a[i], &e));
        base[e.slot.offset + 5] ^= 0x41;
    }
    evict_keys(&f, tok, 900, a, na);
    kvo_connector_stats st = conn_stats(&f.s);
    ASSERT_EQ_U64(st.checksum_failures, na);
    ASSERT_GT_U64(st.file_writebacks, 0);
    for (size_t i = 0; i < na; i++) ASSERT_EQ_INT(file_state(f.t, &a[i]), KVO_MISS);
    ASSERT_OK(kvo_connector_add_request(f.s.c, &(kvo_request_desc){.struct_size = sizeof(kvo_request_desc), .id = 99, .tokens = tok[0], .n_tokens = 400}));
    kvo_lookup_result lr;
    ASSERT_OK(kvo_connector_lookup(f.s.c, 99, 0, &lr));
    ASSERT_EQ_INT(lr.status, KVO_HIT_NONE);
    ASSERT_OK(kvo_connector_abort(f.s.c, 99));
    fx_close(&f);
}

typedef struct flusher {
    kvo_connector *c;
    int stop; /* atomic */
    int rc;
    uint64_t rounds;
} flusher;

static void *flush_loop(void *arg) {
    flusher *x = arg;
    while (!__atomic_load_n(&x->stop, __ATOMIC_SEQ_CST) && x->rc == 0) {
        x->rc = kvo_connector_flush_to_file(x->c, KVO_MS(10000), NULL);
        x->rounds++;
    }
    return NULL;
}

/* flush_to_file releases the connector lock while the tier drains: stores,
 * evictions and loads run meanwhile (ThreadSanitizer checks the locking),
 * and every chunk still ends up byte-exact. */
KVO_TEST(writeback_flush_concurrent_with_stores) {
    fx f;
    fx_open(&f, 0, KVO_FILE_WRITE_BACK, 2, true);
    flusher x = {.c = f.s.c};
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, flush_loop, &x), 0);
    uint32_t tok[6][400];
    for (uint32_t k = 0; k < 6; k++) {
        fill(tok[k], 400, 700 + k * 5);
        store_prompt(&f.s, f.t, 1 + k, tok[k], 400);
    }
    __atomic_store_n(&x.stop, 1, __ATOMIC_SEQ_CST);
    ASSERT_EQ_INT(pthread_join(th, NULL), 0);
    ASSERT_OK(x.rc);
    ASSERT_GT_U64(x.rounds, 0);
    ASSERT_OK(kvo_connector_flush_to_file(f.s.c, -1, NULL));
    /* evictions refused by back-pressure are lost (counted): only prompts
     * none of whose chunks was dropped must hit; the last one is in host
     * memory */
    kvo_connector_stats st = conn_stats(&f.s);
    for (uint32_t k = st.file_writes_dropped ? 5 : 0; k < 6; k++) expect_hit(&f.s, 100 + k, tok[k], UINT64_MAX);
    st = conn_stats(&f.s);
    ASSERT_EQ_U64(st.host.pinned, 0);
    ASSERT_EQ_U64(st.host.pending, 0);
    fx_close(&f);
}

KVO_TEST(file_mode_rejects_bad_value) {
    kvo_plan *p = plan2();
    kvo_connector_params cp = kvo_connector_default_params();
    cp.plan = p;
    cp.host_bytes = 1u << 20;
    cp.file_mode = (kvo_file_mode)7;
    kvo_connector *c = NULL;
    ASSERT_ERR(kvo_connector_create(&cp, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "file_mode");
    cp.file_mode = KVO_FILE_WRITE_BACK;
    ASSERT_OK(kvo_connector_create(&cp, &c)); /* no tier: the mode is unused */
    ASSERT_ERR(kvo_connector_flush_to_file(c, 0, NULL), KVO_ESTATE);
    kvo_connector_destroy(c);
    kvo_plan_destroy(p);
}
