/* File tier: every corruption kind is found on read, removed and reported
 * as a miss (also while another pin holds the key, and after a restart);
 * the fsck CLI reports and repairs.  The plans, keys and helpers are
 * tests/file_tier_fixture.h's. */
#include "kvo_test.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <dirent.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "file_tier_fixture.h"

enum { C_FLIP_PAYLOAD, C_FLIP_HEADER, C_TRUNCATE, C_MAGIC, C_GEOMETRY, C_ZERO, C_DIR, C_OTHER_KEY, C_VERSION,
       C_EXTEND, C_KINDS };
static const char *const c_names[C_KINDS] = {"flipped payload byte", "flipped header byte", "truncated",
                                             "wrong magic", "wrong geometry", "zero length", "directory",
                                             "another key's file", "future format version", "extended"};

static void more_layers(kvo__file_hdr *h) { h->layers += 1; h->page_bytes -= 8; }

static void corrupt(const char *path, int kind, const char *other_path) {
    int fd;
    unsigned char b;
    switch (kind) {
    case C_FLIP_PAYLOAD:
    case C_FLIP_HEADER:
    case C_MAGIC:
    case C_VERSION: {
        off_t off = kind == C_FLIP_PAYLOAD ? 4096 + 777 : kind == C_FLIP_HEADER ? 40 : kind == C_MAGIC ? 0 : 8;
        fd = open(path, O_RDWR);
        ASSERT_TRUE(fd >= 0);
        ASSERT_EQ_INT(pread(fd, &b, 1, off), 1);
        b ^= kind == C_VERSION ? 0x02 : 0x10;
        ASSERT_EQ_INT(pwrite(fd, &b, 1, off), 1);
        close(fd);
        break;
    }
    case C_TRUNCATE: ASSERT_EQ_INT(truncate(path, 4096 + 100), 0); break;
    case C_EXTEND: {
        struct stat st;
        ASSERT_EQ_INT(stat(path, &st), 0);
        ASSERT_EQ_INT(truncate(path, st.st_size + 4096), 0);
        break;
    }
    case C_GEOMETRY: ftf_patch_header(path, more_layers); break;
    case C_ZERO: ASSERT_EQ_INT(truncate(path, 0), 0); break;
    case C_DIR:
        ASSERT_EQ_INT(unlink(path), 0);
        ASSERT_EQ_INT(mkdir(path, 0755), 0);
        break;
    case C_OTHER_KEY: ASSERT_EQ_INT(rename(other_path, path), 0); break;
    }
}

KVO_TEST(corruption_kinds) {
    kvo_plan *plan = ftf_plan("ft-corrupt", 4000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("cr"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[2 * C_KINDS];
    for (int i = 0; i < 2 * C_KINDS; i++) keys[i] = ftf_key((uint64_t)i + 500, 0);
    ftf_write_keys(t, plan, keys, 2 * C_KINDS);
    uint64_t corrupt_before = 0;
    for (int kind = 0; kind < C_KINDS; kind++) {
        char path[KVO__FILE_PATH_MAX], other[KVO__FILE_PATH_MAX];
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[kind], path, sizeof path));
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[C_KINDS + kind], other, sizeof other));
        corrupt(path, kind, other);
        ASSERT_ERR(kvo_file_verify(path, plan, NULL, NULL), KVO_ECORRUPT);
        int r = ftf_read_key(t, plan, &keys[kind], kind % 2 == 0);
        if (r != KVO_ECORRUPT) FAILF("%s: read gave %s, expected KVO_ECORRUPT", c_names[kind], kvo_error_name(r));
        struct stat st;
        if (lstat(path, &st) == 0) FAILF("%s: bad file was not removed", c_names[kind]);
        uint8_t s;
        ASSERT_OK(kvo_file_tier_lookup(t, &keys[kind], 1, &s));
        ASSERT_EQ_INT(s, KVO_MISS);
        kvo_file_tier_stats fs = KVO_FILE_TIER_STATS_INIT;
        ASSERT_OK(kvo_file_tier_get_stats(t, &fs));
        ASSERT_EQ_U64(fs.corrupt_removed, corrupt_before + 1);
        corrupt_before = fs.corrupt_removed;
    }
    /* the untouched keys still read */
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[C_KINDS + 1], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* A read finds its file corrupt while another pin (a connector's lookup,
 * kvo_file_tier_pin) still holds the key: the key misses at once, not only
 * after the pin goes (the race behind a flaky connector test), and the pin
 * is released cleanly. */
KVO_TEST(corrupt_read_while_pinned_misses_at_once) {
    kvo_plan *plan = ftf_plan("ft-corrupt-pin", 4000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("crp"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k[2] = {ftf_key(900, 0), ftf_key(901, 0)};
    ftf_write_keys(t, plan, k, 2);
    ASSERT_OK(kvo_file_tier_pin(t, k, 2));
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &k[0], path, sizeof path));
    corrupt(path, C_FLIP_PAYLOAD, NULL);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k[0], true), KVO_ECORRUPT);
    uint8_t s[2];
    ASSERT_OK(kvo_file_tier_lookup(t, k, 2, s));
    ASSERT_EQ_INT(s[0], KVO_MISS); /* still pinned, already gone */
    ASSERT_EQ_INT(s[1], KVO_READY);
    ASSERT_OK(kvo_file_tier_unpin(t, k, 2));
    kvo_file_tier_stats fs = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &fs));
    ASSERT_EQ_U64(fs.files, 1);
    ASSERT_EQ_U64(fs.corrupt_removed, 1);
    /* the key can be written and read again */
    ftf_write_keys(t, plan, k, 1);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k[0], true), 0);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k[1], false), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(corruption_found_after_restart) {
    kvo_plan *plan = ftf_plan("ft-corrupt2", 4000, true);
    kvo_file_tier_params p = ftf_params(ftf_subdir("cr2"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[4];
    for (int i = 0; i < 4; i++) keys[i] = ftf_key((uint64_t)i + 900, 1);
    ftf_write_keys(t, plan, keys, 4);
    char path[4][KVO__FILE_PATH_MAX];
    for (int i = 0; i < 4; i++) ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path[i], KVO__FILE_PATH_MAX));
    kvo_file_tier_destroy(t);
    corrupt(path[0], C_FLIP_PAYLOAD, NULL);
    corrupt(path[1], C_DIR, NULL);       /* removed by the scan */
    corrupt(path[2], C_ZERO, NULL);
    /* a stray temporary file of a dead writer and a foreign file */
    char tmp[KVO__FILE_PATH_MAX + 64], foreign[KVO__FILE_PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s", path[3]);
    snprintf(strrchr(tmp, '/'), 64, "/.tmp.0badc0de.1.1");
    FILE *tf = fopen(tmp, "w");
    fputs("half", tf);
    fclose(tf);
    struct timespec old[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    ASSERT_EQ_INT(utimensat(AT_FDCWD, tmp, old, 0), 0);
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    snprintf(foreign, sizeof foreign, "%s/README.txt", kvo_file_tier_dir(t));
    FILE *f = fopen(foreign, "w");
    fputs("not a chunk\n", f);
    fclose(f);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 3); /* the directory was removed at scan */
    ASSERT_EQ_U64(s.scan_removed, 2);   /* ... and the old temporary file */
    struct stat tst;
    ASSERT_TRUE(stat(tmp, &tst) != 0);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[0], true), KVO_ECORRUPT);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), KVO_ENOTFOUND);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[2], true), KVO_ECORRUPT);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[3], true), 0);
    struct stat st;
    ASSERT_EQ_INT(stat(foreign, &st), 0); /* not ours: left alone */
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsck_cli) {
    kvo_plan *plan = ftf_plan("ft-fsck", 5000, true);
    char root[1024];
    snprintf(root, sizeof root, "%s", ftf_subdir("fsck"));
    kvo_file_tier_params p = ftf_params(root, plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[6];
    for (int i = 0; i < 6; i++) keys[i] = ftf_key((uint64_t)i + 70, (uint32_t)(i % 2));
    ftf_write_keys(t, plan, keys, 6);
    char path[2][KVO__FILE_PATH_MAX];
    for (int i = 0; i < 2; i++) ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path[i], KVO__FILE_PATH_MAX));
    char ns[KVO__FILE_PATH_MAX];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);

    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s fsck %s --json", KVO_CLI_PATH, root);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "\"files\": 6");
    ASSERT_CONTAINS(out, "\"problems\": 0");
    ASSERT_CONTAINS(out, "ft-fsck");
    free(out);

    corrupt(path[0], C_FLIP_PAYLOAD, NULL);
    corrupt(path[1], C_TRUNCATE, NULL);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 1);
    ASSERT_CONTAINS(out, "\"problems\": 2");
    ASSERT_CONTAINS(out, "checksum");
    ASSERT_CONTAINS(out, "truncated");
    free(out);
    struct stat st;
    ASSERT_EQ_INT(stat(path[0], &st), 0); /* not removed without --repair */

    snprintf(cmd, sizeof cmd, "%s fsck %s --repair", KVO_CLI_PATH, root);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 3); /* every problem repaired */
    ASSERT_CONTAINS(out, "removed");
    free(out);
    ASSERT_TRUE(stat(path[0], &st) != 0);
    ASSERT_TRUE(stat(path[1], &st) != 0);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 0);
    ASSERT_CONTAINS(out, "files 4");
    free(out);

    /* a namespace directory whose name is not its manifest's: a problem,
     * listed in the JSON output too, and the manifest is kept by --repair */
    char moved[KVO__FILE_PATH_MAX + 64];
    snprintf(moved, sizeof moved, "%s/0123456789abcdef0123456789abcdef", root);
    ASSERT_EQ_INT(rename(ns, moved), 0);
    snprintf(cmd, sizeof cmd, "%s fsck %s --json --repair", KVO_CLI_PATH, root);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 1);
    ASSERT_CONTAINS(out, "\"problems\": 1");
    ASSERT_CONTAINS(out, "not the directory's name");
    free(out);
    char man[KVO__FILE_PATH_MAX + 96];
    snprintf(man, sizeof man, "%s/manifest.json", moved);
    ASSERT_EQ_INT(stat(man, &st), 0);

    snprintf(cmd, sizeof cmd, "%s fsck 2>/dev/null", KVO_CLI_PATH);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "%s fsck %s/nope 2>/dev/null", KVO_CLI_PATH, root);
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 2);
    free(out);
    kvo_plan_destroy(plan);
}
