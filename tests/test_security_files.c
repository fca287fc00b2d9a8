/* The file tier against other local users (issue 25 item 5): the KV cache is
 * derived from users' prompts, so the directories the tier creates are 0700
 * and its files 0600 whatever the umask; params.file_mode opens them to a
 * group on purpose (directories get the matching search bits); an existing
 * namespace directory that is a symbolic link is refused (lstat), so another
 * user cannot redirect the cache into a directory of theirs. */
#include "kvo_test.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_tier_fixture.h"

static unsigned mode_of(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) FAILF("lstat %s: %s", path, strerror(errno));
    return (unsigned)(st.st_mode & 07777);
}

/* Write one chunk and return its file's path (static buffer). */
static const char *write_one(kvo_file_tier *t, const kvo_plan *plan, uint64_t i) {
    static char path[4096];
    kvo_chunk_key k = ftf_key(i, 0);
    ftf_write_keys(t, plan, &k, 1);
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &k, path, sizeof path));
    return path;
}

/* Modes of everything the tier made under root (root itself made by it). */
static void check_modes(const char *root, const kvo_plan *plan, const kvo_file_tier_params *p, unsigned dmode,
                        unsigned fmode) {
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(p, &t));
    const char *ns = kvo_file_tier_dir(t);
    ASSERT_EQ_U64(mode_of(root), dmode);
    ASSERT_EQ_U64(mode_of(ns), dmode);
    char path[4096];
    snprintf(path, sizeof path, "%s/00", ns);
    ASSERT_EQ_U64(mode_of(path), dmode);
    snprintf(path, sizeof path, "%s/ff", ns);
    ASSERT_EQ_U64(mode_of(path), dmode);
    snprintf(path, sizeof path, "%s/manifest.json", ns);
    ASSERT_EQ_U64(mode_of(path), fmode);
    ASSERT_EQ_U64(mode_of(write_one(t, plan, 1)), fmode);
    /* the named-temporary-file path (file systems without O_TMPFILE) too */
    kvo_file_tier_destroy(t);
    atomic_store(&kvo__file_test_no_tmpfile, 1);
    ASSERT_OK(kvo_file_tier_create(p, &t));
    ASSERT_EQ_U64(mode_of(write_one(t, plan, 2)), fmode);
    kvo_file_tier_destroy(t);
    atomic_store(&kvo__file_test_no_tmpfile, 0);
}

KVO_TEST(created_directories_0700_files_0600) {
    kvo_plan *plan = ftf_plan("sec-files-private", 4096, false);
    char *root = ftf_subdir("private/cache"); /* two levels made by the tier */
    kvo_file_tier_params p = ftf_params(root, plan);
    umask(0); /* whatever the umask lets through: the tier's own modes */
    check_modes(root, plan, &p, 0700, 0600);
    ASSERT_EQ_U64(mode_of(ftf_subdir("private")), 0700);
    umask(022);
    kvo_plan_destroy(plan);
}

KVO_TEST(file_mode_shares_with_a_group) {
    kvo_plan *plan = ftf_plan("sec-files-group", 4096, false);
    char *root = ftf_subdir("group");
    kvo_file_tier_params p = ftf_params(root, plan);
    p.file_mode = 0640;
    umask(0);
    check_modes(root, plan, &p, 0750, 0640);
    umask(022);
    p.file_mode = 0660;
    char *root2 = ftf_subdir("group2");
    p.root = root2;
    umask(0);
    check_modes(root2, plan, &p, 0770, 0660);
    umask(022);
    kvo_plan_destroy(plan);
}

KVO_TEST(file_mode_out_of_range_is_refused) {
    kvo_plan *plan = ftf_plan("sec-files-badmode", 4096, false);
    kvo_file_tier_params p = ftf_params(ftf_subdir("badmode"), plan);
    kvo_file_tier *t = NULL;
    unsigned bad[] = {01000 | 0600, 0200, 0400, 0755};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.file_mode = bad[i];
        ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
        ASSERT_NULL(t);
        ASSERT_CONTAINS(kvo_last_error(), "file_mode");
    }
    kvo_plan_destroy(plan);
}

KVO_TEST(symlinked_namespace_directory_is_refused) {
    kvo_plan *plan = ftf_plan("sec-files-link", 4096, false);
    char *root = ftf_subdir("link");
    kvo_file_tier_params p = ftf_params(root, plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char ns[4096], elsewhere[4096];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    /* someone moves the namespace away and leaves a link to a directory of
     * theirs at its name */
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", kvo_test_tmpdir());
    ASSERT_EQ_INT(rename(ns, elsewhere), 0);
    ASSERT_EQ_INT(symlink(elsewhere, ns), 0);
    t = NULL;
    int rc = kvo_file_tier_create(&p, &t);
    if (rc == 0) {
        kvo_file_tier_destroy(t);
        FAILF("the file tier followed a symbolic link at its namespace directory %s", ns);
    }
    ASSERT_NULL(t);
    ASSERT_CONTAINS(kvo_last_error(), ns);
    ASSERT_CONTAINS(kvo_last_error(), "symbolic link");
    /* a link as the root itself is the operator's choice and works */
    char *root2 = ftf_subdir("link-root");
    ASSERT_EQ_INT(symlink(root, root2), 0);
    ASSERT_EQ_INT(unlink(ns), 0);
    ASSERT_EQ_INT(rename(elsewhere, ns), 0);
    p.root = root2;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}
