/*
 * Tenant quotas of the cascade's host tier (kvo_cascade_params.tenants):
 * a tenant's part is kept from every other tenant's traffic and bounds its
 * own; keys find their part by their tag (kvo_chunk_key.tenant); the tags
 * are checked; the lower tiers' paths (write-back, loans, promotion,
 * persist) reach every part.
 */
#include <stdlib.h>

#include "cascade_fixture.h"

typedef cfx fx;

/* The label of tenant "acme" (kvo_tenant_label). */
static const char *acme(void) {
    static char label[KVO_TENANT_LABEL_MAX];
    ASSERT_OK(kvo_tenant_label("acme", 4, label, sizeof label));
    return label;
}

/* A cascade of host_slots slots of which tenant "acme" owns part_slots (0:
 * no tenant part), over a file tier when with_file. */
static fx fx_open(uint64_t host_slots, uint64_t part_slots, bool with_file, kvo_file_mode mode, bool zero_copy) {
    fx f = cfx_plan("tenant-test");
    kvo_cascade_params p = kvo_cascade_default_params();
    p.host_bytes = host_slots * f.slot;
    p.file_mode = mode;
    p.file_zero_copy = zero_copy;
    p.verify_checksums = zero_copy;
    kvo_cascade_tenant t = {acme(), part_slots * f.slot, NULL};
    if (part_slots) {
        p.tenants = &t;
        p.n_tenants = 1;
    }
    kvo_file_tier_params fp = ftf_params(ftf_subdir("files"), f.plan);
    cfx_create(&f, &p, with_file ? &fp : NULL);
    return f;
}

static void fx_close(fx *f) { cfx_close(f); }

/* n keys from `first`, tagged with part. */
static void keys_of(kvo_chunk_key *keys, size_t n, uint64_t first, uint32_t part) {
    for (size_t i = 0; i < n; i++) {
        keys[i] = ftf_key(first + i, 0);
        keys[i].tenant = part;
    }
}

/* Store n keys (one part) in batches of two, as a request's steps do:
 * prepare, fill, complete (a batch's own slots are not evictable for it). */
static void store(fx *f, const kvo_chunk_key *keys, size_t n) {
    for (size_t at = 0; at < n; at += 2) {
        size_t b = n - at < 2 ? n - at : 2, nd = 0;
        uint8_t need[2];
        kvo_slot slots[2];
        kvo_chunk_key done[2];
        ASSERT_OK(kvo_cascade_prepare_store(f->c, keys + at, b, 0, need, slots));
        for (size_t i = 0; i < b; i++) {
            if (need[i] != KVO_CASCADE_HOST) continue;
            ftf_fill(kvo_cascade_slot_ptr(f->c, slots[i]), f->chunk, &keys[at + i]);
            done[nd++] = keys[at + i];
        }
        if (nd) ASSERT_OK(kvo_cascade_complete_store(f->c, done, nd, true));
    }
}

/* How many of the n keys the host tier holds READY with their own bytes
 * (a READY key with other bytes fails the test). */
static size_t held(fx *f, const kvo_chunk_key *keys, size_t n) {
    size_t k = 0;
    unsigned char *want = malloc(f->chunk);
    ASSERT_NOT_NULL(want);
    for (size_t i = 0; i < n; i++) {
        kvo_slot s;
        if (kvo_cascade_prepare_load(f->c, &keys[i], 1, &s) != 0) continue;
        ftf_fill(want, f->chunk, &keys[i]);
        ASSERT_MEM_EQ(kvo_cascade_slot_ptr(f->c, s), want, f->chunk);
        ASSERT_OK(kvo_cascade_complete_load(f->c, &keys[i], 1));
        k++;
    }
    free(want);
    return k;
}

static uint32_t part_of(fx *f, const char *salt) {
    uint32_t part = 99;
    ASSERT_OK(kvo_cascade_tenant_part(f->c, salt, salt ? strlen(salt) : 0, &part));
    return part;
}

/* The shared traffic of other tenants (60 chunks through 8 shared slots)
 * leaves the tenant's 4 chunks where they are; without a part (the
 * control) it evicts them. */
KVO_TEST(other_tenants_never_evict_a_tenants_part) {
    for (int with_part = 1; with_part >= 0; with_part--) {
        fx f = fx_open(12, with_part ? 4 : 0, false, KVO_FILE_WRITE_THROUGH, false);
        uint32_t acme = part_of(&f, "acme");
        ASSERT_EQ_U64(acme, with_part ? 1 : 0);
        kvo_chunk_key mine[4], theirs[60];
        keys_of(mine, 4, 1000, acme);
        keys_of(theirs, 60, 5000, part_of(&f, "other"));
        store(&f, mine, 4);
        store(&f, theirs, 60);
        ASSERT_EQ_U64(held(&f, mine, 4), with_part ? 4 : 0);
        ASSERT_EQ_U64(held(&f, theirs + 52, 8), 8); /* the newest shared chunks are there */
        fx_close(&f);
    }
}

/* A tenant's own traffic evicts only its own chunks, oldest first, and
 * never holds more than its part. */
KVO_TEST(a_tenant_holds_at_most_its_part) {
    fx f = fx_open(12, 4, false, KVO_FILE_WRITE_THROUGH, false);
    kvo_chunk_key mine[10], shared[8];
    keys_of(mine, 10, 1000, part_of(&f, "acme"));
    keys_of(shared, 8, 5000, 0);
    store(&f, shared, 8);
    store(&f, mine, 10);
    ASSERT_EQ_U64(held(&f, shared, 8), 8);
    ASSERT_EQ_U64(held(&f, mine, 6), 0);
    ASSERT_EQ_U64(held(&f, mine + 6, 4), 4);
    kvo_store_stats ps = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(kvo_cascade_part_store(f.c, 1), &ps));
    ASSERT_EQ_U64(ps.capacity_bytes, 4 * f.slot);
    ASSERT_TRUE(ps.bytes_used <= 4 * f.slot);
    ASSERT_OK(kvo_store_get_stats(kvo_cascade_store(f.c), &ps));
    ASSERT_EQ_U64(ps.capacity_bytes, 8 * f.slot);
    ASSERT_NULL(kvo_cascade_part_store(f.c, 2));
    fx_close(&f);
}

/* A key looked for under another tag is a miss, never another part's bytes. */
KVO_TEST(a_key_under_another_tag_is_a_miss) {
    fx f = fx_open(12, 4, false, KVO_FILE_WRITE_THROUGH, false);
    kvo_chunk_key k;
    keys_of(&k, 1, 77, 1);
    store(&f, &k, 1);
    uint8_t st;
    ASSERT_OK(kvo_cascade_lookup(f.c, &k, 1, 0, NULL, 0, &st, NULL, NULL));
    ASSERT_EQ_INT(st, KVO_READY);
    k.tenant = 0;
    ASSERT_OK(kvo_cascade_lookup(f.c, &k, 1, 0, NULL, 0, &st, NULL, NULL));
    ASSERT_EQ_INT(st, KVO_MISS);
    kvo_slot s;
    ASSERT_ERR(kvo_cascade_prepare_load(f.c, &k, 1, &s), KVO_ENOTFOUND);
    fx_close(&f);
}

KVO_TEST(tenant_tags_and_params_are_checked) {
    fx f = fx_open(12, 4, false, KVO_FILE_WRITE_THROUGH, false);
    kvo_chunk_key k[2];
    keys_of(k, 2, 1, 0);
    k[1].tenant = 2; /* past the last part */
    uint8_t st[2], need[2];
    kvo_slot slots[2];
    ASSERT_ERR(kvo_cascade_lookup(f.c, k, 2, 0, NULL, 0, st, NULL, NULL), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "tenant part 2");
    ASSERT_ERR(kvo_cascade_touch(f.c, k, 2), KVO_EINVAL);
    k[1].tenant = 1; /* two parts in one reserving call */
    ASSERT_ERR(kvo_cascade_prepare_store(f.c, k, 2, 0, need, slots), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "one tenant part");
    ASSERT_ERR(kvo_cascade_prepare_load(f.c, k, 2, slots), KVO_EINVAL);
    ASSERT_OK(kvo_cascade_lookup(f.c, k, 2, 0, NULL, 0, st, NULL, NULL)); /* lookups may mix parts */
    ASSERT_EQ_U64(part_of(&f, NULL), 0);
    uint32_t part;
    ASSERT_ERR(kvo_cascade_tenant_part(f.c, NULL, 3, &part), KVO_EINVAL);
    kvo_cascade_params p = kvo_cascade_default_params();
    p.plan = f.plan;
    p.host_bytes = 12 * f.slot;
    kvo_cascade_tenant t[2] = {{"acme", 4 * f.slot}, {acme(), 4 * f.slot}};
    p.tenants = t;
    p.n_tenants = 2;
    kvo_cascade *c = NULL;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* a salt, not its label */
    ASSERT_CONTAINS(kvo_last_error(), "tenants[0].label");
    t[0].label = acme();
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "twice");
    t[0].label = "default";
    t[0].host_bytes = 4 * f.slot + 1;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "multiple of");
    t[0].host_bytes = 8 * f.slot; /* leaves the shared part nothing */
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "shared part");
    t[0].host_bytes = 4 * f.slot;
    ASSERT_OK(kvo_cascade_create(&p, &c));
    uint32_t dflt = 9;
    ASSERT_OK(kvo_cascade_tenant_part(c, NULL, 0, &dflt)); /* no salt: its own part when "default" has one */
    ASSERT_EQ_U64(dflt, 1);
    kvo_cascade_destroy(c);
    fx_close(&f);
}

/* Write-back from a tenant's part, promotion back into it, loans unpinned
 * in it, persist over every part. */
KVO_TEST(lower_tiers_reach_every_part) {
    fx f = fx_open(12, 4, true, KVO_FILE_WRITE_BACK, false);
    kvo_chunk_key mine[8], shared[2];
    keys_of(mine, 8, 1000, 1);
    keys_of(shared, 2, 5000, 0);
    store(&f, mine, 8); /* the first four written back as the last four evict them */
    store(&f, shared, 2);
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &mine[i], true), 0);
    cfx_promote_all(f.c, mine, 2);
    ASSERT_EQ_U64(held(&f, mine, 2), 2); /* promoted into the tenant's part */
    ASSERT_EQ_U64(held(&f, shared, 2), 2); /* which evicted none of the shared part */
    uint64_t q = 0;
    ASSERT_OK(kvo_cascade_persist(f.c, KVO_MS(20000), &q));
    ASSERT_EQ_U64(q, 4); /* mine[6..8) left in the part, and the two shared */
    for (int i = 0; i < 2; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &shared[i], true), 0);
    fx_close(&f);

    f = fx_open(12, 4, true, KVO_FILE_WRITE_THROUGH, true); /* zero copy: loans from the part */
    keys_of(mine, 4, 2000, 1);
    store(&f, mine, 4);
    ASSERT_OK(kvo_file_tier_flush(f.file, KVO_MS(20000)));
    size_t n = 0;
    kvo_cascade_stats cs = KVO_CASCADE_STATS_INIT;
    for (int spin = 0; spin < 1000; spin++) {
        ASSERT_OK(kvo_cascade_poll(f.c, NULL, 0, &n));
        ASSERT_OK(kvo_cascade_get_stats(f.c, &cs));
        if (!cs.lent_now) break;
        (void)kvo_cascade_wait_events(f.c, KVO_MS(5));
    }
    ASSERT_EQ_U64(cs.lent_now, 0);
    ASSERT_EQ_U64(cs.file.lent, 4);
    kvo_store_stats ps = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(kvo_cascade_part_store(f.c, 1), &ps));
    ASSERT_EQ_U64(ps.pinned, 0); /* every loan unpinned in the part that lent it */
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(ftf_read_key(f.file, f.plan, &mine[i], true), 0);
    fx_close(&f);
}

/* ------------------------------------------------------- file-tier parts -- */

/* A tier under the test's directory with room for `files` chunk files. */
static kvo_file_tier *file_tier_of(fx *f, const char *dir, uint64_t files) {
    kvo_file_tier_params fp = ftf_params(ftf_subdir(dir), f->plan);
    fp.quota_bytes = files * (f->slot + 4096);
    return ftf_create_or_skip(&fp, f->plan);
}

static size_t files_held(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n) {
    uint8_t st[64];
    ASSERT_TRUE(n <= 64);
    ASSERT_OK(kvo_file_tier_lookup(t, keys, n, st));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += st[i] == KVO_READY;
    return k;
}

/* acme's chunks go to a file tier of its own (its quota, its disk share):
 * 64 chunks of other tenants through the shared tier (room for 16) leave
 * them; without its own tier (the control) they are evicted there.  Its
 * chunks come back by promotion into its host part, byte-exact. */
KVO_TEST(a_tenants_file_part_keeps_its_files) {
    for (int with_part = 1; with_part >= 0; with_part--) {
        fx f = cfx_plan("tenant-file");
        f.file = file_tier_of(&f, with_part ? "shared-p" : "shared-c", 16);
        kvo_file_tier *mine_ft = with_part ? file_tier_of(&f, "acme", 16) : NULL;
        kvo_cascade_params p = kvo_cascade_default_params();
        p.plan = f.plan;
        p.host_bytes = 12 * f.slot;
        p.file_tier = f.file;
        kvo_cascade_tenant t = {acme(), 4 * f.slot, mine_ft};
        p.tenants = &t;
        p.n_tenants = 1;
        ASSERT_OK(kvo_cascade_create(&p, &f.c));
        kvo_chunk_key mine[4], theirs[64];
        keys_of(mine, 4, 1000, 1);
        keys_of(theirs, 64, 5000, 0);
        store(&f, mine, 4);
        ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
        for (size_t at = 0; at < 64; at += 8) {
            store(&f, theirs + at, 8);
            ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
        }
        ASSERT_EQ_U64(files_held(with_part ? mine_ft : f.file, mine, 4), with_part ? 4 : 0);
        if (with_part) {
            ASSERT_EQ_U64(files_held(f.file, mine, 4), 0); /* never in the shared tier */
            kvo_chunk_key more[4]; /* acme's own traffic evicts its host chunks: they come back from its files */
            keys_of(more, 4, 2000, 1);
            store(&f, more, 4);
            ASSERT_EQ_U64(held(&f, mine, 4), 0);
            cfx_promote_all(f.c, mine, 4);
            ASSERT_EQ_U64(held(&f, mine, 4), 4);
        }
        kvo_cascade_destroy(f.c);
        f.c = NULL;
        if (mine_ft) {
            ASSERT_OK(kvo_file_tier_flush(mine_ft, KVO_MS(20000)));
            kvo_file_tier_destroy(mine_ft);
        }
        fx_close(&f);
    }
}

/* Without a host tier (engines with host memory of their own): a
 * tenant's direct writes, reads and removes go to its own file tier. */
KVO_TEST(direct_calls_reach_a_tenants_file_part) {
    fx f = cfx_plan("tenant-direct");
    f.file = file_tier_of(&f, "d-shared", 64);
    kvo_file_tier *mine_ft = file_tier_of(&f, "d-acme", 64);
    kvo_cascade_params p = kvo_cascade_default_params();
    p.plan = f.plan;
    p.file_tier = f.file;
    kvo_cascade_tenant t = {acme(), 0, mine_ft};
    p.tenants = &t;
    p.n_tenants = 1;
    ASSERT_OK(kvo_cascade_create(&p, &f.c));
    ASSERT_EQ_U64(part_of(&f, "acme"), 1);
    kvo_chunk_key k[2];
    keys_of(k, 2, 300, 1);
    unsigned char *src = malloc(2 * f.chunk), *dst = ftf_aligned_buf(2 * f.slot);
    ASSERT_NOT_NULL(src);
    const void *srcs[2] = {src, src + f.chunk};
    for (int i = 0; i < 2; i++) ftf_fill(src + i * f.chunk, f.chunk, &k[i]);
    int res[2];
    ASSERT_OK(kvo_cascade_write(f.c, k, srcs, 2, KVO_MS(5000), res));
    ASSERT_OK(kvo_cascade_flush(f.c, KVO_MS(20000)));
    ASSERT_EQ_U64(files_held(mine_ft, k, 2), 2);
    ASSERT_EQ_U64(files_held(f.file, k, 2), 0);
    void *dsts[2] = {dst, dst + f.slot};
    uint64_t ud[2] = {1, 2};
    ASSERT_OK(kvo_cascade_read(f.c, k, dsts, 2, ud, res));
    kvo_cascade_completion cp[2];
    ASSERT_EQ_U64(cfx_poll_n(f.c, cp, 2), 2);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_INT(cp[i].result, 0);
        ASSERT_MEM_EQ(dsts[cp[i].user_data - 1], src + (cp[i].user_data - 1) * f.chunk, f.chunk);
    }
    k[0].tenant = 0; /* under the shared part's tag: not there */
    ASSERT_OK(kvo_cascade_remove(f.c, k, 1, NULL, res));
    ASSERT_EQ_INT(res[0], KVO_ENOTFOUND);
    k[0].tenant = 1;
    ASSERT_OK(kvo_cascade_remove(f.c, k, 1, NULL, res));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_U64(files_held(mine_ft, k, 2), 1);
    free(src);
    free(dst);
    kvo_cascade_destroy(f.c);
    f.c = NULL;
    ASSERT_OK(kvo_file_tier_flush(mine_ft, KVO_MS(20000)));
    kvo_file_tier_destroy(mine_ft);
    fx_close(&f);
}

KVO_TEST(file_parts_are_checked) {
    fx f = fx_open(12, 0, true, KVO_FILE_WRITE_THROUGH, false);
    kvo_file_tier *other = file_tier_of(&f, "chk-other", 8);
    kvo_cascade_params p = kvo_cascade_default_params();
    p.plan = f.plan;
    p.host_bytes = 12 * f.slot;
    p.file_tier = f.file;
    kvo_cascade_tenant t = {acme(), 0, other};
    p.tenants = &t;
    p.n_tenants = 1;
    kvo_cascade *c = NULL;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* no host part beside its file tier */
    ASSERT_CONTAINS(kvo_last_error(), "host part of its own");
    t.host_bytes = 4 * f.slot;
    t.file_tier = f.file;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* the shared tier is not its own */
    t.file_tier = NULL;
    t.host_bytes = 0;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* nothing of its own */
    ASSERT_CONTAINS(kvo_last_error(), "neither");
    t.file_tier = other;
    t.host_bytes = 4 * f.slot;
    p.file_tier = NULL;
    ASSERT_ERR(kvo_cascade_create(&p, &c), KVO_EINVAL); /* a file part needs the shared file tier */
    p.file_tier = f.file;
    ASSERT_OK(kvo_cascade_create(&p, &c));
    kvo_cascade_destroy(c);
    kvo_file_tier_destroy(other);
    fx_close(&f);
}
