/* The file tier with file_secret (issue 50 item 3): chunks sealed with
 * XAES-256-GCM, bound to their header and namespace.
 *  - sealed chunks load back byte-exact (also a group with padding), the
 *    files hold format version 2 and not the chunk's bytes, and fsck's
 *    kvo_file_inspect still checks them without the secret;
 *  - a file written without a secret (anyone with write access can write
 *    such a consistent chunk: the defect) loads without a secret and fails
 *    authentication with one; so does a file sealed under another secret,
 *    a sealed file read without a secret, and a flipped payload byte: each
 *    a miss, removed, counted in auth_failed (not corrupt_removed);
 *  - a borrowed write on a sealed tier never encrypts the caller's memory;
 *  - a short secret is refused without being shown. */
#include "file_tier_fixture.h"

#include "tiers/seal.h"

#define FS1 "file-secret-one-0123456789abcdef"
#define FS2 "file-secret-two-fedcba9876543210"

static void need_seal(void) {
    if (!kvo__seal_available()) SKIP("built without OpenSSL");
}

static kvo_file_tier *open_tier(const char *root, const kvo_plan *plan, const char *secret) {
    kvo_file_tier_params p = ftf_params(root, plan);
    p.file_secret = secret;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    return t;
}

static bool file_exists_at(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static kvo_file_tier_stats fstats(kvo_file_tier *t) {
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    return s;
}

static void key_path(kvo_file_tier *t, const kvo_chunk_key *k, char *out) {
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), k, out, KVO__FILE_PATH_MAX));
}

KVO_TEST(sealed_chunks_load_back_and_hide_their_bytes) {
    need_seal();
    kvo_plan *plan = ftf_plan("seal-file", 16384, true);
    kvo_file_tier *t = open_tier(ftf_subdir("root"), plan, FS1);
    kvo_chunk_key keys[6];
    for (int i = 0; i < 6; i++) keys[i] = ftf_key((uint64_t)i, (uint32_t)(i % 2)); /* "full" and "swa" (padded) */
    ftf_write_keys(t, plan, keys, 6);
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[i], i % 3 != 0), 0);
    char path[KVO__FILE_PATH_MAX];
    key_path(t, &keys[0], path);
    size_t len = 0;
    unsigned char *f = (unsigned char *)kvo_test_read_file(path, &len);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    ASSERT_EQ_U64(len, KVO_FILE_HEADER_BYTES + g->slot_bytes);
    ASSERT_EQ_INT(f[8], KVO__FILE_VERSION_SEALED);
    unsigned char *plain = malloc(g->chunk_bytes);
    ftf_fill(plain, g->chunk_bytes, &keys[0]);
    size_t same = 0;
    for (uint64_t i = 0; i < g->chunk_bytes; i++) same += f[KVO_FILE_HEADER_BYTES + i] == plain[i];
    ASSERT_LT_U64(same, g->chunk_bytes / 64);
    kvo_file_chunk_info info;
    ASSERT_OK(kvo_file_inspect(path, plan, &info)); /* fsck: header, size, padding; no secret needed */
    ASSERT_EQ_INT(info.format_version, KVO__FILE_VERSION_SEALED);
    ASSERT_EQ_U64(fstats(t).auth_failed, 0);
    free(f);
    free(plain);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(unsealed_foreign_or_tampered_files_fail_authentication) {
    need_seal();
    kvo_plan *plan = ftf_plan("seal-file", 16384, false);
    const char *root = ftf_subdir("root");
    kvo_chunk_key keys[4];
    for (int i = 0; i < 4; i++) keys[i] = ftf_key((uint64_t)i, 0);
    /* the defect, without a secret: a file anyone with write access wrote
     * (here: an unsealed tier's) is a verified hit */
    kvo_file_tier *plain = open_tier(root, plan, NULL);
    ftf_write_keys(plain, plan, keys, 1);
    ASSERT_EQ_INT(ftf_read_key(plain, plan, &keys[0], true), 0);
    kvo_file_tier_destroy(plain);
    /* with the secret it is a miss, removed, counted */
    kvo_file_tier *t = open_tier(root, plan, FS1);
    char path[KVO__FILE_PATH_MAX];
    key_path(t, &keys[0], path);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[0], true), KVO_ECORRUPT);
    ASSERT_FALSE(file_exists_at(path));
    ASSERT_EQ_U64(fstats(t).auth_failed, 1);
    ASSERT_EQ_U64(fstats(t).corrupt_removed, 0);
    /* a flipped payload byte of a sealed file */
    ftf_write_keys(t, plan, keys + 1, 3);
    key_path(t, &keys[1], path);
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    unsigned char b;
    ASSERT_EQ_INT(pread(fd, &b, 1, KVO_FILE_HEADER_BYTES + 999), 1);
    b ^= 4;
    ASSERT_EQ_INT(pwrite(fd, &b, 1, KVO_FILE_HEADER_BYTES + 999), 1);
    close(fd);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), KVO_ECORRUPT);
    ASSERT_EQ_U64(fstats(t).auth_failed, 2);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[2], true), 0); /* the control: an untouched one loads */
    kvo_file_tier_destroy(t);
    /* sealed under another secret; a sealed file without a secret */
    kvo_file_tier *other = open_tier(root, plan, FS2);
    ASSERT_EQ_INT(ftf_read_key(other, plan, &keys[2], true), KVO_ECORRUPT);
    ASSERT_EQ_U64(fstats(other).auth_failed, 1);
    kvo_file_tier_destroy(other);
    plain = open_tier(root, plan, "");
    ASSERT_EQ_INT(ftf_read_key(plain, plan, &keys[3], true), KVO_ECORRUPT);
    ASSERT_EQ_U64(fstats(plain).auth_failed, 1);
    kvo_file_tier_destroy(plain);
    kvo_plan_destroy(plan);
}

KVO_TEST(borrowed_write_never_seals_the_callers_memory) {
    need_seal();
    kvo_plan *plan = ftf_plan("seal-file", 16384, false);
    kvo_file_tier *t = open_tier(ftf_subdir("root"), plan, FS1);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *src = ftf_aligned_buf(g->slot_bytes), *copy = malloc(g->chunk_bytes);
    kvo_chunk_key k = ftf_key(7, 0);
    ftf_fill(src, g->chunk_bytes, &k);
    memcpy(copy, src, g->chunk_bytes);
    const void *s = src;
    uint64_t ud = 5;
    int r = 1;
    ASSERT_OK(kvo_file_tier_write_borrowed(t, &k, &s, NULL, 1, &ud, &r, NULL));
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_completion c;
    size_t got = 0;
    ASSERT_OK(kvo_file_tier_poll(t, &c, 1, &got)); /* a borrowed write reports */
    ASSERT_EQ_U64(got, 1);
    ASSERT_EQ_INT(c.op, KVO_FILE_OP_WRITE);
    ASSERT_EQ_INT(c.result, 0);
    ASSERT_MEM_EQ(src, copy, g->chunk_bytes); /* untouched: sealed in staging */
    ASSERT_EQ_U64(fstats(t).writes_borrowed, 0);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k, true), 0);
    free(src);
    free(copy);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(short_file_secret_refused_without_showing_it) {
    kvo_plan *plan = ftf_plan("seal-file", 16384, false);
    kvo_file_tier_params p = ftf_params(ftf_subdir("root"), plan);
    p.file_secret = "Brief-Secret";
    kvo_file_tier *t = NULL;
    ASSERT_ERR(kvo_file_tier_create(&p, &t), kvo__seal_available() ? KVO_EINVAL : KVO_ENOTSUP);
    ASSERT_CONTAINS(kvo_last_error(), "file_secret");
    ASSERT_TRUE(strstr(kvo_last_error(), "Brief-Secret") == NULL);
    ASSERT_NULL(t);
    kvo_plan_destroy(plan);
}

/* The config keys reach the tiers' parameters (kvo_config_apply_*). */
KVO_TEST(config_keys_set_the_secrets) {
    const char *json = "{\"file_root\": \"/tmp/x\", \"file_secret\": \"file-secret-from-config-0123\","
                       " \"remote_url\": \"redis://127.0.0.1:1\", \"remote_secret\": \"remote-secret-from-config-01\","
                       " \"remote_secret_previous\": \"remote-secret-previous-01234\"}";
    kvo_config *c = NULL;
    ASSERT_OK(kvo_config_from_json(json, strlen(json), &c));
    kvo_file_tier_params fp = kvo_file_tier_default_params();
    ASSERT_OK(kvo_config_apply_file_tier(c, &fp));
    ASSERT_EQ_STR(fp.file_secret, "file-secret-from-config-0123");
    kvo_remote_tier_params rp = kvo_remote_tier_default_params();
    ASSERT_NULL(rp.secret); /* by default: the environment */
    ASSERT_OK(kvo_config_apply_remote_tier(c, &rp));
    ASSERT_EQ_STR(rp.secret, "remote-secret-from-config-01");
    ASSERT_EQ_STR(rp.secret_previous, "remote-secret-previous-01234");
    kvo_config_destroy(c);
    const char *none = "{\"remote_url\": \"redis://127.0.0.1:1\"}";
    ASSERT_OK(kvo_config_from_json(none, strlen(none), &c));
    rp = kvo_remote_tier_default_params();
    ASSERT_OK(kvo_config_apply_remote_tier(c, &rp));
    ASSERT_NULL(rp.secret);
    kvo_config_destroy(c);
}
