/*
 * The cascade (kvo_cascade.h): namespaces, lookup across tiers, promotion,
 * stores with write-through / write-back / staging / deferral, the direct
 * calls, invalidation, completions and the event fd.  The remote tier's
 * part runs against the loopback cluster of tools/test.sh (skipped
 * without one).
 */
#include <poll.h>
#include <stdlib.h>

#include "core/xxh.h"
#include "cascade_fixture.h"
#include "remote_test.h"

/* ---------------------------------------------------------------- helpers */

typedef cfx fx;

/* A cascade of host_slots slots (0: none) over a file tier (when with_file)
 * under the test's directory, with params changed by tweak. */
static fx fx_open(uint64_t host_slots, bool with_file, void (*tweak)(kvo_cascade_params *, kvo_file_tier_params *)) {
    fx f = cfx_plan("cascade-test");
    kvo_cascade_params p = kvo_cascade_default_params();
    kvo_file_tier_params fp = ftf_params(ftf_subdir("files"), f.plan);
    p.host_bytes = host_slots * f.slot;
    if (tweak) tweak(&p, &fp);
    cfx_create(&f, &p, with_file ? &fp : NULL);
    return f;
}

static void fx_close(fx *f) { cfx_close(f); }

/* A fixture over the shared cluster (the remote tier's test prefix `name`):
 * the plan, chunk and slot sizes and the tier; the caller adds a file tier
 * and creates the cascade from *p (prefilled: plan, remote tier). */
static fx fx_remote(const char *name, kvo_cascade_params *p) {
    int port = shared_port();
    fx f;
    memset(&f, 0, sizeof f);
    f.plan = make_plan();
    f.chunk = chunk_bytes(f.plan);
    f.slot = kvo_plan_group(f.plan, 0)->slot_bytes;
    f.remote = open_tier(port, f.plan, name, NULL);
    *p = kvo_cascade_default_params();
    p->plan = f.plan;
    p->remote_tier = f.remote;
    return f;
}

/* Store keys[0..n) through the host tier: prepare, fill the slots with
 * their ftf_fill bytes, complete.  Returns how many went to the host. */
static size_t store_keys(fx *f, const kvo_chunk_key *keys, size_t n) {
    uint8_t need[64];
    kvo_slot slots[64];
    ASSERT_TRUE(n <= 64);
    ASSERT_OK(kvo_cascade_prepare_store(f->c, keys, n, 0, need, slots));
    size_t host = 0;
    kvo_chunk_key done[64];
    size_t nd = 0;
    for (size_t i = 0; i < n; i++) {
        if (need[i] != KVO_CASCADE_HOST && need[i] != KVO_CASCADE_STAGED) continue;
        host += need[i] == KVO_CASCADE_HOST;
        void *p = kvo_cascade_slot_ptr(f->c, slots[i]);
        ASSERT_NOT_NULL(p);
        ftf_fill(p, f->chunk, &keys[i]);
        done[nd++] = keys[i];
    }
    kvo_slot pend[64];
    ASSERT_OK(kvo_cascade_pending_slots(f->c, keys, n, pend)); /* the slots given, until completed */
    for (size_t i = 0; i < n; i++) {
        bool reserved = need[i] == KVO_CASCADE_HOST || need[i] == KVO_CASCADE_STAGED;
        ASSERT_EQ_U64(pend[i].offset, reserved ? slots[i].offset : 0);
        ASSERT_EQ_U64(pend[i].bytes, reserved ? slots[i].bytes : 0);
    }
    if (nd) ASSERT_OK(kvo_cascade_complete_store(f->c, done, nd, true));
    return host;
}

/* The host tier holds k with its bytes. */
static void assert_host_bytes(fx *f, const kvo_chunk_key *k) {
    kvo_slot s;
    ASSERT_OK(kvo_cascade_prepare_load(f->c, k, 1, &s));
    unsigned char *want = malloc(f->chunk);
    ftf_fill(want, f->chunk, k);
    ASSERT_MEM_EQ(kvo_cascade_slot_ptr(f->c, s), want, f->chunk);
    free(want);
    ASSERT_OK(kvo_cascade_complete_load(f->c, k, 1));
}

static kvo_cascade_stats stats_of(kvo_cascade *c) {
    kvo_cascade_stats st = KVO_CASCADE_STATS_INIT;
    ASSERT_OK(kvo_cascade_get_stats(c, &st));
    return st;
}

/* ------------------------------------------------------------- namespaces */

static kvo_u128 ns_of(const kvo_plan *plan, const char *model, const char *dtype, const char *tenant) {
    kvo_namespace_desc d = KVO_NAMESPACE_DESC_INIT;
    d.engine = "vllm";
    d.model = model;
    d.model_len = model ? strlen(model) : 0;
    d.dtype = dtype;
    d.tenant = tenant;
    d.tenant_len = tenant ? strlen(tenant) : 0;
    kvo_u128 id;
    ASSERT_OK(kvo_namespace_id(plan, &d, &id));
    return id;
}

static bool u128_eq(kvo_u128 a, kvo_u128 b) { return a.lo == b.lo && a.hi == b.hi; }

KVO_TEST(namespace_ids_keep_every_field_whole) {
    kvo_plan *plan = ftf_plan("ns", 16384, false);
    /* the model paths that folded or truncated names made collide */
    char long_a[300], long_b[300];
    memset(long_a, 'x', sizeof long_a - 1);
    long_a[sizeof long_a - 1] = 0;
    memcpy(long_b, long_a, sizeof long_b);
    long_a[0] = 'A';
    long_b[0] = 'B';
    const char *models[] = {"/models/\xe5\xae\xa2\xe6\x88\xb7\xe7\x94\xb2/llama", "/models/\xe5\xae\xa2\xe6\x88\xb7\xe4\xb9\x99/llama",
                            "acme/x", "acme:x", long_a, long_b, "a"};
    kvo_u128 ids[7];
    for (size_t i = 0; i < 7; i++) ids[i] = ns_of(plan, models[i], "bfloat16", NULL);
    for (size_t i = 0; i < 7; i++)
        for (size_t j = i + 1; j < 7; j++)
            if (u128_eq(ids[i], ids[j])) FAILF("models '%.20s' and '%.20s' share a namespace", models[i], models[j]);
    /* stable, and every field counts, boundaries included */
    ASSERT_TRUE(u128_eq(ns_of(plan, "acme/x", "bfloat16", NULL), ids[2]));
    ASSERT_FALSE(u128_eq(ns_of(plan, "acme/x", "float16", NULL), ids[2]));
    ASSERT_FALSE(u128_eq(ns_of(plan, "acme/x", "bfloat16", "tenant-a"), ids[2]));
    ASSERT_FALSE(u128_eq(ns_of(plan, "acme/x", "bfloat16", "tenant-a"), ns_of(plan, "acme/x", "bfloat16", "tenant-b")));
    ASSERT_FALSE(u128_eq(ns_of(plan, "ab", "c", NULL), ns_of(plan, "a", "bc", NULL)));
    ASSERT_FALSE(u128_eq(ns_of(plan, "a", NULL, NULL), ns_of(plan, "a", "", NULL))); /* absent is not empty */
    /* the plan's geometry counts too */
    kvo_plan *other = ftf_plan("ns", 8192, false);
    ASSERT_FALSE(u128_eq(ns_of(other, "acme/x", "bfloat16", NULL), ids[2]));
    /* keys under two namespaces never meet; one namespace is stable */
    uint8_t id[32];
    memset(id, 7, sizeof id);
    kvo_chunk_key k1, k2, k3;
    ASSERT_OK(kvo_namespace_keys(ids[0], id, sizeof id, sizeof id, 1, 0, &k1));
    ASSERT_OK(kvo_namespace_keys(ids[1], id, sizeof id, sizeof id, 1, 0, &k2));
    ASSERT_OK(kvo_namespace_keys(ids[0], id, sizeof id, sizeof id, 1, 0, &k3));
    ASSERT_FALSE(kvo_chunk_key_eq(&k1, &k2));
    ASSERT_TRUE(kvo_chunk_key_eq(&k1, &k3));
    /* the header's formula, for ids hashed from a copy and streamed (long) */
    static uint8_t longid[1000], cat[16 + sizeof longid];
    for (size_t i = 0; i < sizeof longid; i++) longid[i] = (uint8_t)(i * 31 + 7);
    for (int i = 0; i < 8; i++) {
        cat[i] = (uint8_t)(ids[0].lo >> (8 * i));
        cat[8 + i] = (uint8_t)(ids[0].hi >> (8 * i));
    }
    memcpy(cat + 16, longid, sizeof longid);
    const size_t lens[] = {0, 1, 32, 240, 241, 1000};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        XXH128_hash_t want = XXH3_128bits(cat, 16 + lens[i]);
        kvo_chunk_key got[2];
        ASSERT_OK(kvo_namespace_keys(ids[0], longid, lens[i], lens[i], 1, 3, &got[0]));
        if (got[0].hash.lo != want.low64 || got[0].hash.hi != want.high64 || got[0].group != 3)
            FAILF("id of %zu bytes: not XXH3-128(namespace || id)", lens[i]);
    }
    kvo_namespace_desc bad = KVO_NAMESPACE_DESC_INIT;
    bad.model_len = 3;
    kvo_u128 out;
    ASSERT_ERR(kvo_namespace_id(plan, &bad, &out), KVO_EINVAL);
    kvo_plan_destroy(other);
    kvo_plan_destroy(plan);
}

/* ------------------------------------------------------ host + file tiers */

KVO_TEST(write_through_then_promote_from_file) {
    fx f = fx_open(8, true, NULL);
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) keys[i] = ftf_key(100 + i, 0);
    ASSERT_EQ_U64(store_keys(&f, keys, 8), 8);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    kvo_cascade_stats st = stats_of(f.c);
    ASSERT_EQ_U64(st.file.writes, 8);
    ASSERT_EQ_U64(st.file.writes_dropped, 0);
    /* other chunks push the first ones out of the host tier */
    kvo_chunk_key other[8];
    for (int i = 0; i < 8; i++) other[i] = ftf_key(500 + i, 0);
    ASSERT_EQ_U64(store_keys(&f, other, 8), 8);
    uint8_t states[8], tiers[8];
    kvo_cascade_lookup_result r;
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.prefix, 8);
    ASSERT_EQ_U64(r.file, 8);
    for (int i = 0; i < 8; i++) ASSERT_EQ_INT(tiers[i], KVO_TIER_FILE);
    /* one lookup promotes them all */
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 4, KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.promoting, 4);
    ASSERT_EQ_U64(r.prefix, 0);
    ASSERT_EQ_U64(r.prefix_if_pending, 4);
    kvo_cascade_completion cp[4];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 4), 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ_INT(cp[i].result, 0);
        ASSERT_EQ_INT(cp[i].op, KVO_CASCADE_OP_PROMOTE);
        ASSERT_EQ_INT(cp[i].tier, KVO_TIER_FILE);
    }
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.prefix, 8);
    ASSERT_EQ_U64(r.host, 4);
    for (int i = 0; i < 4; i++) assert_host_bytes(&f, &keys[i]);
    st = stats_of(f.c);
    ASSERT_EQ_U64(st.file.promotions, 4);
    fx_close(&f);
}

KVO_TEST(lookup_prefix_ends_at_the_first_key_no_tier_holds) {
    fx f = fx_open(16, true, NULL);
    kvo_chunk_key keys[6];
    for (int i = 0; i < 6; i++) keys[i] = ftf_key(200 + i, 0);
    kvo_chunk_key some[4] = {keys[0], keys[1], keys[3], keys[4]};
    ASSERT_EQ_U64(store_keys(&f, some, 4), 4);
    uint8_t states[6], tiers[6];
    kvo_cascade_lookup_result r;
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 6, KVO_CASCADE_PREFIX, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.prefix, 2);
    ASSERT_EQ_INT(states[2], KVO_MISS);
    ASSERT_EQ_INT(tiers[2], KVO_TIER_NONE);
    ASSERT_EQ_INT(states[3], KVO_READY); /* the keys are asked; only the prefix stops */
    ASSERT_EQ_INT(tiers[0], KVO_TIER_HOST);
    /* a store in flight is PENDING: part of the prefix once it lands */
    uint8_t need[1];
    kvo_slot slot[1];
    ASSERT_OK(kvo_cascade_prepare_store(f.c, &keys[2], 1, 0, need, slot));
    ASSERT_EQ_INT(need[0], KVO_CASCADE_HOST);
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 6, KVO_CASCADE_PREFIX, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.prefix, 2);
    ASSERT_EQ_U64(r.prefix_if_pending, 5);
    ftf_fill(kvo_cascade_slot_ptr(f.c, slot[0]), f.chunk, &keys[2]);
    ASSERT_OK(kvo_cascade_complete_store(f.c, &keys[2], 1, true));
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 6, KVO_CASCADE_PREFIX, NULL, 0, states, tiers, &r));
    ASSERT_EQ_U64(r.prefix, 5);
    fx_close(&f);
}

static void tw_staging(kvo_cascade_params *p, kvo_file_tier_params *fp) {
    (void)fp;
    p->staging_bytes = 2 * p->host_bytes; /* 4 slots after 2 */
}

KVO_TEST(staging_takes_what_the_host_tier_cannot) {
    fx f = fx_open(2, true, tw_staging);
    kvo_chunk_key pinned[2] = {ftf_key(1, 0), ftf_key(2, 0)};
    ASSERT_EQ_U64(store_keys(&f, pinned, 2), 2);
    kvo_slot ps[2];
    ASSERT_OK(kvo_cascade_prepare_load(f.c, pinned, 2, ps)); /* the host tier is all pinned */
    kvo_chunk_key keys[6];
    for (int i = 0; i < 6; i++) keys[i] = ftf_key(300 + i, 0);
    uint8_t need[6];
    kvo_slot slots[6];
    ASSERT_ERR(kvo_cascade_prepare_store(f.c, keys, 6, KVO_CASCADE_ALL_OR_NOTHING, need, slots), KVO_ENOSPC);
    ASSERT_OK(kvo_cascade_prepare_store(f.c, keys, 6, 0, need, slots));
    int staged = 0, refused = 0;
    for (int i = 0; i < 6; i++) {
        staged += need[i] == KVO_CASCADE_STAGED;
        refused += need[i] == KVO_CASCADE_REFUSED;
    }
    ASSERT_EQ_INT(staged, 4);
    ASSERT_EQ_INT(refused, 2);
    /* a key on its way through staging counts as present */
    uint8_t n2[1];
    kvo_slot s2[1];
    ASSERT_OK(kvo_cascade_prepare_store(f.c, &keys[0], 1, 0, n2, s2));
    ASSERT_EQ_INT(n2[0], KVO_CASCADE_SKIP);
    /* pending_slots: the slots prepare_store gave, {0, 0} for the others */
    kvo_slot pend[6];
    ASSERT_OK(kvo_cascade_pending_slots(f.c, keys, 6, pend));
    for (int i = 0; i < 6; i++) {
        bool reserved = need[i] == KVO_CASCADE_STAGED;
        ASSERT_EQ_U64(pend[i].bytes, reserved ? slots[i].bytes : 0);
        ASSERT_EQ_U64(pend[i].offset, reserved ? slots[i].offset : 0);
    }
    ASSERT_ERR(kvo_cascade_pending_slots(f.c, keys, 0, pend), KVO_EINVAL);
    kvo_chunk_key done[6];
    size_t nd = 0;
    for (int i = 0; i < 6; i++)
        if (need[i] == KVO_CASCADE_STAGED) {
            ftf_fill(kvo_cascade_slot_ptr(f.c, slots[i]), f.chunk, &keys[i]);
            done[nd++] = keys[i];
        }
    ASSERT_OK(kvo_cascade_complete_store(f.c, done, nd, true));
    ASSERT_OK(kvo_cascade_pending_slots(f.c, done, nd, pend)); /* completed: no longer pending */
    for (size_t i = 0; i < nd; i++) ASSERT_EQ_U64(pend[i].bytes, 0);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    for (size_t i = 0; i < nd; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &done[i], true), 0);
    kvo_cascade_stats st = stats_of(f.c);
    ASSERT_EQ_U64(st.stores_staged, 4);
    ASSERT_EQ_U64(st.stores_refused, 2);
    ASSERT_EQ_U64(st.staged_now, 0);
    /* the staging slots are free again: four more fit */
    ASSERT_OK(kvo_cascade_prepare_store(f.c, keys + 4, 2, 0, need, slots));
    ASSERT_EQ_INT(need[0], KVO_CASCADE_STAGED);
    ASSERT_EQ_INT(need[1], KVO_CASCADE_STAGED);
    ASSERT_OK(kvo_cascade_complete_store(f.c, keys + 4, 2, false));
    ASSERT_OK(kvo_cascade_complete_load(f.c, pinned, 2));
    fx_close(&f);
}

static void tw_tiny_queue(kvo_cascade_params *p, kvo_file_tier_params *fp) {
    (void)p;
    fp->max_pending_writes = 1;
    fp->io_threads = 1;
}

KVO_TEST(writes_refused_for_backpressure_are_retried) {
    fx f = fx_open(64, true, tw_tiny_queue);
    kvo_chunk_key keys[48];
    for (int i = 0; i < 48; i++) keys[i] = ftf_key(700 + i, 0);
    ASSERT_EQ_U64(store_keys(&f, keys, 48), 48);
    kvo_cascade_stats st = stats_of(f.c);
    ASSERT_GT_U64(st.file.writes_deferred, 0); /* a queue of one cannot take 48 at once */
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(60000)));
    st = stats_of(f.c);
    ASSERT_EQ_U64(st.deferred_now, 0);
    ASSERT_EQ_U64(st.file.writes_dropped, 0);
    ASSERT_EQ_U64(st.file.writes, 48);
    for (int i = 0; i < 48; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[i], true), 0);
    fx_close(&f);
}

static void tw_writeback(kvo_cascade_params *p, kvo_file_tier_params *fp) {
    (void)fp;
    p->file_mode = KVO_FILE_WRITE_BACK;
}

KVO_TEST(write_back_writes_only_what_the_host_tier_evicts) {
    fx f = fx_open(4, true, tw_writeback);
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) keys[i] = ftf_key(800 + i, 0);
    ASSERT_EQ_U64(store_keys(&f, keys, 4), 4);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    ASSERT_EQ_U64(stats_of(f.c).file.writes, 0);
    ASSERT_EQ_U64(store_keys(&f, keys + 4, 4), 4); /* evicts the first four */
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    kvo_cascade_stats st = stats_of(f.c);
    ASSERT_EQ_U64(st.file.writes, 4);
    ASSERT_EQ_U64(st.file.writebacks, 4);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[i], true), 0);
    uint64_t n = 0;
    ASSERT_OK(kvo_cascade_persist(f.c, KVO_MS(20000), &n)); /* the four still in host memory */
    ASSERT_EQ_U64(n, 4);
    for (int i = 4; i < 8; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[i], true), 0);
    fx_close(&f);
}

static void tw_zero_copy(kvo_cascade_params *p, kvo_file_tier_params *fp) {
    (void)fp;
    p->file_zero_copy = true;
    p->verify_checksums = true;
}

KVO_TEST(zero_copy_lends_host_slots_until_written) {
    fx f = fx_open(8, true, tw_zero_copy);
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) keys[i] = ftf_key(900 + i, 0);
    ASSERT_EQ_U64(store_keys(&f, keys, 8), 8);
    ASSERT_GT_U64(stats_of(f.c).file.lent, 0);
    ASSERT_OK(kvo_file_tier_flush(f.file, KVO_MS(20000)));
    size_t n = 0;
    for (int spin = 0; spin < 1000 && stats_of(f.c).lent_now; spin++) ASSERT_OK(kvo_cascade_poll(f.c, NULL, 0, &n));
    ASSERT_EQ_U64(stats_of(f.c).lent_now, 0);
    for (int i = 0; i < 8; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[i], true), 0);
    /* the loans are over: every slot can be evicted again */
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(kvo_cascade_store(f.c), &ss));
    ASSERT_EQ_U64(ss.pinned, 0);
    fx_close(&f);
}

/* A corrupt file is a miss: the promotion fails and leaves no host entry. */
KVO_TEST(a_corrupt_file_fails_its_promotion) {
    fx f = fx_open(8, true, NULL);
    kvo_chunk_key keys[2] = {ftf_key(31, 0), ftf_key(32, 0)};
    kvo_file_tier *ft = f.file;
    ftf_write_keys(ft, f.plan, keys, 2);
    char path[2048];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(ft), &keys[0], path, sizeof path));
    FILE *fp = fopen(path, "r+b");
    ASSERT_NOT_NULL(fp);
    ASSERT_EQ_INT(fseek(fp, 4096 + 100, SEEK_SET), 0);
    ASSERT_EQ_INT(fputc(0x5a ^ fgetc(fp), fp) != EOF, 1);
    fclose(fp);
    int res[2];
    uint64_t ud[2] = {11, 12};
    ASSERT_OK(kvo_cascade_promote(f.c, keys, 2, NULL, ud, res));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(res[1], 0);
    kvo_cascade_completion cp[2];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 2), 2);
    for (int i = 0; i < 2; i++) {
        int which = cp[i].user_data == 11 ? 0 : 1;
        ASSERT_EQ_INT(cp[i].result, which == 0 ? KVO_ECORRUPT : 0);
    }
    uint8_t st[2];
    kvo_cascade_lookup_result r;
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 2, 0, NULL, 0, st, NULL, &r));
    ASSERT_EQ_INT(st[0], KVO_MISS); /* removed by the file tier, no host entry */
    ASSERT_EQ_INT(st[1], KVO_READY);
    assert_host_bytes(&f, &keys[1]);
    ASSERT_EQ_U64(stats_of(f.c).file.promotion_failures, 1);
    fx_close(&f);
}

KVO_TEST(invalidate_fails_promotions_in_flight) {
    fx f = fx_open(8, true, NULL);
    kvo_chunk_key keys[4];
    for (int i = 0; i < 4; i++) keys[i] = ftf_key(40 + i, 0);
    ftf_write_keys(f.file, f.plan, keys, 4);
    int res[4];
    ASSERT_OK(kvo_cascade_promote(f.c, keys, 4, NULL, NULL, res));
    uint64_t removed = 0;
    ASSERT_OK(kvo_cascade_invalidate(f.c, 1, &removed));
    kvo_cascade_completion cp[4];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 4), 4);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(cp[i].result, KVO_ESTATE);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(kvo_cascade_store(f.c), &ss));
    ASSERT_EQ_U64(ss.entries, 0);
    /* READY host entries of the group go at once */
    ASSERT_EQ_U64(store_keys(&f, keys, 2), 2);
    ASSERT_OK(kvo_cascade_invalidate(f.c, 1, &removed));
    ASSERT_EQ_U64(removed, 2);
    fx_close(&f);
}

KVO_TEST(tier_groups_keep_a_tier_out_of_a_group) {
    fx f = fx_open(8, true, NULL);
    kvo_chunk_key keys[2] = {ftf_key(61, 0), ftf_key(62, 0)};
    ASSERT_OK(kvo_cascade_set_tier_groups(f.c, KVO_TIER_FILE, 0));
    ASSERT_EQ_U64(store_keys(&f, keys, 2), 2);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    ASSERT_EQ_U64(stats_of(f.c).file.writes, 0);
    ftf_write_keys(f.file, f.plan, keys, 2); /* in the tier, another format: never read */
    ASSERT_OK(kvo_cascade_invalidate(f.c, 1, NULL));
    uint8_t st[2], tiers[2];
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 2, 0, NULL, 0, st, tiers, NULL));
    ASSERT_EQ_INT(st[0], KVO_MISS);
    ASSERT_ERR(kvo_cascade_set_tier_groups(f.c, KVO_TIER_HOST, 1), KVO_EINVAL);
    fx_close(&f);
}

/* ------------------------------------------------------- the direct calls */

KVO_TEST(direct_read_and_write_without_a_host_tier) {
    fx f = fx_open(0, true, NULL);
    ASSERT_NULL(kvo_cascade_store(f.c));
    kvo_chunk_key keys[8];
    unsigned char *src = malloc(8 * f.chunk);
    const void *srcs[8];
    for (int i = 0; i < 8; i++) {
        keys[i] = ftf_key(1000 + i, 0);
        ftf_fill(src + i * f.chunk, f.chunk, &keys[i]);
        srcs[i] = src + i * f.chunk;
    }
    int res[8];
    ASSERT_OK(kvo_cascade_write(f.c, keys, srcs, 6, KVO_MS(20000), res));
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(res[i], 0);
    free(src);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    uint8_t st[8];
    kvo_cascade_lookup_result r;
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX, NULL, 0, st, NULL, &r));
    ASSERT_EQ_U64(r.prefix, 6);
    unsigned char *dst = ftf_aligned_buf(8 * f.slot);
    void *dsts[8];
    uint64_t ud[8];
    for (int i = 0; i < 8; i++) {
        dsts[i] = dst + i * f.slot;
        ud[i] = 50 + i;
    }
    ASSERT_OK(kvo_cascade_read(f.c, keys, dsts, 8, ud, res));
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(res[i], 0);
    ASSERT_EQ_INT(res[6], KVO_ENOTFOUND);
    kvo_cascade_completion cp[6];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 6), 6);
    unsigned char *want = malloc(f.chunk);
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ_INT(cp[i].result, 0);
        ASSERT_EQ_INT(cp[i].op, KVO_CASCADE_OP_READ);
        int k = (int)(cp[i].user_data - 50);
        ftf_fill(want, f.chunk, &keys[k]);
        ASSERT_MEM_EQ(dsts[k], want, f.chunk);
    }
    free(want);
    free(dst);
    int rr[3];
    kvo_chunk_key gone[3] = {keys[0], keys[1], keys[7]};
    ASSERT_OK(kvo_cascade_remove(f.c, gone, 3, NULL, rr));
    ASSERT_EQ_INT(rr[0], 0);
    ASSERT_EQ_INT(rr[2], KVO_ENOTFOUND); /* never stored */
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX, NULL, 0, st, NULL, &r));
    ASSERT_EQ_U64(r.prefix, 0);
    ASSERT_EQ_INT(st[2], KVO_READY);
    fx_close(&f);
}

KVO_TEST(event_fd_is_readable_while_completions_wait) {
    fx f = fx_open(8, true, NULL);
    int fd = kvo_cascade_event_fd(f.c);
    ASSERT_TRUE(fd >= 0);
    struct pollfd pf = {fd, POLLIN, 0};
    ASSERT_EQ_INT(poll(&pf, 1, 0), 0);
    kvo_chunk_key k = ftf_key(77, 0);
    ftf_write_keys(f.file, f.plan, &k, 1);
    int res;
    ASSERT_OK(kvo_cascade_promote(f.c, &k, 1, NULL, NULL, &res));
    ASSERT_EQ_INT(res, 0);
    ASSERT_EQ_INT(poll(&pf, 1, 20000), 1); /* the file tier's read landed */
    kvo_cascade_completion cp;
    size_t n = 0;
    ASSERT_OK(kvo_cascade_poll(f.c, &cp, 0, &n)); /* driven, not taken */
    ASSERT_EQ_U64(n, 0);
    ASSERT_EQ_INT(poll(&pf, 1, 0), 1); /* still owed: readable */
    ASSERT_OK(kvo_cascade_poll(f.c, &cp, 1, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(poll(&pf, 1, 0), 0);
    fx_close(&f);
}

KVO_TEST(bad_arguments_are_refused) {
    kvo_plan *plan = ftf_plan("bad", 16384, false);
    kvo_cascade_params p = kvo_cascade_default_params();
    kvo_cascade *c = NULL;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL);
    p.plan = plan;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* no tier */
    ASSERT_CONTAINS(kvo_last_error(), "no tier");
    p.host_bytes = 100;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "largest slot");
    p.host_bytes = 1 << 20;
    p.staging_bytes = 1 << 20;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* staging without a lower tier */
    p.staging_bytes = 0;
    ASSERT_OK(kvo_cascade_create(&p, &c));
    kvo_chunk_key k = ftf_key(1, 5);
    uint8_t st;
    ASSERT_ERR(kvo_cascade_lookup(c, &k, 1, 0, NULL, 0, &st, NULL, NULL), KVO_EINVAL);
    k.group = 0;
    ASSERT_ERR(kvo_cascade_lookup(c, &k, 1, 0x80, NULL, 0, &st, NULL, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_cascade_complete_store(c, &k, 1, true), KVO_ESTATE);
    void *d = &st;
    ASSERT_ERR(kvo_cascade_write(c, &k, (const void *const *)&d, 1, 0, NULL), KVO_EINVAL); /* no lower tier */
    ASSERT_ERR(kvo_cascade_set_tier_groups(c, KVO_TIER_NONE, 0), KVO_EINVAL);
    kvo_cascade_destroy(c);
    kvo_plan_destroy(plan);
}

/* ---------------------------------------------------------- remote tier */

KVO_TEST(remote_presence_promotion_and_file_fill) {
    kvo_cascade_params p;
    fx f = fx_remote("cascade-presence", &p);
    kvo_file_tier_params fp = ftf_params(ftf_subdir("files"), f.plan);
    f.file = ftf_create_or_skip(&fp, f.plan);
    uint64_t base = kvo_test_rand() % 1000000000;
    ASSERT_EQ_U64(put_range(f.remote, f.plan, base, 6), 6);
    p.host_bytes = 16 * f.slot;
    p.file_tier = f.file;
    p.remote_lookup_budget_us = 60u * 1000 * 1000;
    ASSERT_OK(kvo_cascade_create(&p, &f.c));
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) keys[i] = ftf_key(base + i, 0);
    uint8_t st[8], tiers[8];
    kvo_cascade_lookup_result r;
    kvo_cascade_wait w = {0};
    /* the first lookup asks; its answers are out: PENDING within the budget */
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX, &w, 0, st, tiers, &r));
    ASSERT_TRUE(r.remote_pending);
    ASSERT_EQ_U64(r.prefix, 0);
    /* a lookup that waits gets them, and promotes the present ones */
    ASSERT_OK(kvo_cascade_lookup(f.c, keys, 8, KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE, &w, KVO_MS(20000), st, tiers,
                                 &r));
    ASSERT_FALSE(r.remote_pending);
    ASSERT_EQ_U64(r.promoting, 6);
    ASSERT_EQ_INT(st[6], KVO_MISS);
    kvo_cascade_completion cp[6];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 6), 6);
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ_INT(cp[i].result, 0);
        ASSERT_EQ_INT(cp[i].tier, KVO_TIER_REMOTE);
    }
    for (int i = 0; i < 6; i++) {
        kvo_slot s;
        ASSERT_OK(kvo_cascade_prepare_load(f.c, &keys[i], 1, &s));
        unsigned char *want = malloc(f.chunk);
        ftf_fill(want, f.chunk, &keys[i]);
        ASSERT_MEM_EQ(kvo_cascade_slot_ptr(f.c, s), want, f.chunk);
        free(want);
        ASSERT_OK(kvo_cascade_complete_load(f.c, &keys[i], 1));
    }
    /* a direct read the remote tier serves also lands in the file tier */
    unsigned char *dst = ftf_aligned_buf(f.slot);
    void *d = dst;
    int res;
    ASSERT_OK(kvo_cascade_read(f.c, &keys[0], &d, 1, NULL, &res));
    ASSERT_EQ_INT(res, 0);
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 1), 1);
    ASSERT_EQ_INT(cp[0].result, 0);
    ASSERT_EQ_INT(cp[0].tier, KVO_TIER_REMOTE);
    free(dst);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[0], true), 0);
    fx_close(&f);
}

KVO_TEST(remote_puts_are_write_through_and_answer_present) {
    kvo_cascade_params p;
    fx f = fx_remote("cascade-puts", &p);
    p.host_bytes = 4 * f.slot;
    ASSERT_OK(kvo_cascade_create(&p, &f.c));
    uint64_t base = kvo_test_rand() % 1000000000;
    kvo_chunk_key keys[4];
    for (int i = 0; i < 4; i++) keys[i] = ftf_key(base + i, 0);
    ASSERT_EQ_U64(store_keys(&f, keys, 4), 4);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    ASSERT_EQ_U64(stats_of(f.c).remote.writes, 4);
    int res[4];
    ASSERT_EQ_U64(get_range(f.remote, f.plan, base, 4, res), 4);
    fx_close(&f);
}

static void tw_one_write(kvo_cascade_params *p, kvo_file_tier_params *fp) {
    (void)p;
    fp->max_pending_writes = 1;
    fp->io_threads = 1;
}

/* Lent writes: a completion per key once every tier took it (retried from
 * the lent memory while the tier refuses for back-pressure). */
KVO_TEST(write_async_completes_each_key_once) {
    fx f = fx_open(0, true, tw_one_write);
    enum { N = 24 };
    kvo_chunk_key keys[N];
    unsigned char *src = malloc((size_t)N * f.chunk);
    const void *srcs[N];
    uint64_t ud[N];
    for (int i = 0; i < N; i++) {
        keys[i] = ftf_key(3000 + i, 0);
        ftf_fill(src + (size_t)i * f.chunk, f.chunk, &keys[i]);
        srcs[i] = src + (size_t)i * f.chunk;
        ud[i] = 900 + i;
    }
    ASSERT_OK(kvo_cascade_write_async(f.c, keys, srcs, N, ud, NULL));
    ASSERT_GT_U64(stats_of(f.c).deferred_now, 0); /* a queue of one: most wait for a retry */
    kvo_cascade_completion cp[N];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, N), N);
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        ASSERT_EQ_INT(cp[i].op, KVO_CASCADE_OP_WRITE);
        ASSERT_EQ_INT(cp[i].result, 0);
        seen[cp[i].user_data - 900]++;
    }
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(seen[i], 1);
    free(src); /* every loan is over */
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    for (int i = 0; i < N; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &keys[i], true), 0);
    ASSERT_EQ_U64(stats_of(f.c).file.writes_dropped, 0);
    fx_close(&f);
}

/* Remove through every tier: the remote DEL's completion says whether the
 * value was gone; the cluster no longer holds it. */
KVO_TEST(remove_deletes_from_the_cluster) {
    kvo_cascade_params p;
    fx f = fx_remote("cascade-remove", &p);
    ASSERT_OK(kvo_cascade_create(&p, &f.c));
    uint64_t base = kvo_test_rand() % 1000000000;
    ASSERT_EQ_U64(put_range(f.remote, f.plan, base, 2), 2);
    kvo_chunk_key keys[3] = {ftf_key(base, 0), ftf_key(base + 1, 0), ftf_key(base + 2, 0)};
    uint64_t ud[3] = {1, 2, 3};
    int res[3];
    ASSERT_OK(kvo_cascade_remove(f.c, keys, 3, ud, res));
    for (int i = 0; i < 3; i++) ASSERT_EQ_INT(res[i], 0);
    kvo_cascade_completion cp[3];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 3), 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ_INT(cp[i].op, KVO_CASCADE_OP_REMOVE);
        ASSERT_EQ_INT(cp[i].result, cp[i].user_data == 3 ? KVO_ENOTFOUND : 0); /* the third was never put */
    }
    ASSERT_EQ_INT(exists_one(f.remote, &keys[0]), KVO_ENOTFOUND);
    ASSERT_EQ_INT(exists_one(f.remote, &keys[1]), KVO_ENOTFOUND);
    fx_close(&f);
}
