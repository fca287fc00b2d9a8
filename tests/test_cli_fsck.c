/* kvoffload fsck against chunk files whose size a header cannot vouch for
 * (issue 25, item 7): a header re-sealed to claim a 1 TiB payload over a
 * sparse file of that size.  Before the fix fsck read the terabyte of zeros
 * (minutes of kernel time) before the checksum failed; now the size is
 * compared with the manifest's geometry (or a sane maximum) before any read,
 * and the file is reported at once.  The CLI runs under timeout(1): a read
 * of the whole file ends as exit 124, a failure, not a stuck run. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvo_test.h"
#include "tiers/file_internal.h"

static int fsck(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' fsck %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

/* One chunk written through the file tier under root; its path in *path. */
static kvo_plan *one_chunk(const char *root, char *ns, char *path) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("fsck-size", 16, &m));
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "full");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = 4096;
    ASSERT_OK(kvo_model_add_group(m, &g));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    kvo_plan *plan = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &plan));
    kvo_model_destroy(m);
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = root;
    p.plan = plan;
    p.quota_bytes = 16ull << 20;
    p.log_interval_s = 3600;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    const kvo_group_plan *gp = kvo_plan_group(plan, 0);
    unsigned char *buf = malloc(gp->chunk_bytes);
    for (uint64_t i = 0; i < gp->chunk_bytes; i++) buf[i] = (unsigned char)(i * 131 + 7);
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = 0x1234567890abcdefull;
    k.hash.hi = 0x0fedcba987654321ull;
    const void *src = buf;
    int r = 1;
    ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    snprintf(ns, KVO__FILE_PATH_MAX, "%s", kvo_file_tier_dir(t));
    ASSERT_OK(kvo_file_chunk_path(ns, &k, path, KVO__FILE_PATH_MAX));
    kvo_file_tier_destroy(t);
    free(buf);
    return plan;
}

/* Re-seal the header to claim `slot` payload bytes and make the file that
 * long (sparse).  False when the file system refuses the size. */
static bool reseal(const char *path, uint64_t slot) {
    unsigned char hb[KVO_FILE_HEADER_BYTES];
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ_INT(pread(fd, hb, sizeof hb, 0), (int)sizeof hb);
    kvo__file_hdr h;
    ASSERT_OK(kvo__file_hdr_decode(hb, sizeof hb, &h));
    h.chunk_bytes = slot - 100; /* consistent: padding under KVO_SLOT_ALIGN */
    h.slot_bytes = slot;
    kvo__file_hdr_encode(&h, hb);
    ASSERT_EQ_INT(pwrite(fd, hb, sizeof hb, 0), (int)sizeof hb);
    bool ok = ftruncate(fd, (off_t)(KVO_FILE_HEADER_BYTES + slot)) == 0;
    close(fd);
    return ok;
}

KVO_TEST(fsck_sparse_terabyte_claim_reported_without_reading) {
    char root[1024], ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    snprintf(root, sizeof root, "%s/fsck-tib", kvo_test_tmpdir());
    kvo_plan *plan = one_chunk(root, ns, path);
    if (!reseal(path, 1ull << 40)) {
        kvo_plan_destroy(plan);
        SKIP("this file system refuses a 1 TiB sparse file");
    }
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "'%s'", ns);
    int ec = fsck(args, &out);
    ASSERT_NE_INT(ec, 124); /* timed out: it read the file */
    ASSERT_EQ_INT(ec, 1);
    ASSERT_CONTAINS(out, "not read");
    ASSERT_CONTAINS(out, "group 0");
    free(out);
    /* --repair removes it; a second pass is clean */
    snprintf(args, sizeof args, "'%s' --repair", ns);
    ASSERT_EQ_INT(fsck(args, &out), 3); /* every problem repaired */
    ASSERT_CONTAINS(out, "(removed)");
    free(out);
    struct stat st;
    ASSERT_TRUE(stat(path, &st) != 0);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsck_damaged_manifest_still_bounds_the_claim) {
    char root[1024], ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    snprintf(root, sizeof root, "%s/fsck-noman", kvo_test_tmpdir());
    kvo_plan *plan = one_chunk(root, ns, path);
    char man[KVO__FILE_PATH_MAX + 32];
    snprintf(man, sizeof man, "%s/manifest.json", ns);
    FILE *f = fopen(man, "w"); /* damaged: no geometry to compare with */
    ASSERT_NOT_NULL(f);
    fputs("garbage", f);
    ASSERT_EQ_INT(fclose(f), 0);
    if (!reseal(path, 1ull << 40)) {
        kvo_plan_destroy(plan);
        SKIP("this file system refuses a 1 TiB sparse file");
    }
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "'%s'", ns);
    int ec = fsck(args, &out);
    ASSERT_NE_INT(ec, 124);
    ASSERT_EQ_INT(ec, 1);
    ASSERT_CONTAINS(out, "more than any chunk file");
    free(out);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsck_intact_chunk_passes_the_size_check) {
    char root[1024], ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    snprintf(root, sizeof root, "%s/fsck-ok", kvo_test_tmpdir());
    kvo_plan *plan = one_chunk(root, ns, path);
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "'%s'", ns);
    ASSERT_EQ_INT(fsck(args, &out), 0);
    ASSERT_TRUE(strstr(out, "not read") == NULL);
    ASSERT_CONTAINS(out, "files 1");
    free(out);
    kvo_plan_destroy(plan);
}
