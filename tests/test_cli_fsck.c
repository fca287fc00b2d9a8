/* kvoffload fsck against chunk files whose size a header cannot vouch for
 * (issue 25, item 7): a header re-sealed to claim a 1 TiB payload over a
 * sparse file of that size.  Before the fix fsck read the terabyte of zeros
 * (minutes of kernel time) before the checksum failed; now the size is
 * compared with the manifest's geometry (or a sane maximum) before any read,
 * and the file is reported at once.  The CLI runs under timeout(1): a read
 * of the whole file ends as exit 124, a failure, not a stuck run. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_tier_fixture.h"

static int fsck(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' fsck %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

/* One chunk written through the file tier under root; its namespace in ns,
 * its path in path. */
static kvo_plan *one_chunk(const char *root, char *ns, char *path) {
    kvo_plan *plan = ftf_plan("fsck-size", 4096, false);
    kvo_file_tier_params p = ftf_params(root, plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k = ftf_key(0, 0);
    ftf_write_keys(t, plan, &k, 1);
    snprintf(ns, KVO__FILE_PATH_MAX, "%s", kvo_file_tier_dir(t));
    ASSERT_OK(kvo_file_chunk_path(ns, &k, path, KVO__FILE_PATH_MAX));
    kvo_file_tier_destroy(t);
    return plan;
}

/* A header claiming a 1 TiB payload, consistent (padding under KVO_SLOT_ALIGN). */
static void claim_terabyte(kvo__file_hdr *h) {
    h->slot_bytes = 1ull << 40;
    h->chunk_bytes = h->slot_bytes - 100;
}

/* Re-seal the header to claim 1 TiB and make the file that long (sparse).
 * False when the file system refuses the size. */
static bool reseal_terabyte(const char *path) {
    ftf_patch_header(path, claim_terabyte);
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    bool ok = ftruncate(fd, (off_t)(KVO_FILE_HEADER_BYTES + (1ull << 40))) == 0;
    close(fd);
    return ok;
}

KVO_TEST(fsck_sparse_terabyte_claim_reported_without_reading) {
    char root[1024], ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    snprintf(root, sizeof root, "%s/fsck-tib", kvo_test_tmpdir());
    kvo_plan *plan = one_chunk(root, ns, path);
    if (!reseal_terabyte(path)) {
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
    if (!reseal_terabyte(path)) {
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
