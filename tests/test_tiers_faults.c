/* File tier and fsck under hostile conditions (issue 18, items 5-13 and 15;
 * issue 12 for the error codes): non-regular files (FIFOs) where chunks or
 * the manifest belong, namespaces of a newer format, damaged manifests,
 * leftovers of a killed first create, a file size limit (SIGXFSZ), headers
 * claiming huge payloads, unopenable chunk files, restarts on a full disk,
 * damaged padding, sloppy manifest fields.  Every test here failed before
 * its fix.  A test that could hang on the unfixed code (an open() of a FIFO
 * blocks) arms alarm(): a hang ends as a failure, not as a stuck run. */
#include "kvo_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "file_tier_fixture.h"

static void key_path(kvo_file_tier *t, const kvo_chunk_key *k, char *out) {
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), k, out, KVO__FILE_PATH_MAX));
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(text, f);
    fclose(f);
}

static int cli(const char *args, char **out) {
    char cmd[8192];
    /* timeout: a hang of the unfixed code becomes exit 124, not a stuck test */
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A tier with `n` keys written, destroyed; its namespace path into ns. */
static kvo_plan *populate(const char *root, kvo_chunk_key *keys, size_t n, char *ns) {
    kvo_plan *plan = ftf_plan("ft-faults", 5000, false);
    kvo_file_tier_params p = ftf_params(root, plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    for (size_t i = 0; i < n; i++) keys[i] = ftf_key(i, 0);
    ftf_write_keys(t, plan, keys, n);
    snprintf(ns, KVO__FILE_PATH_MAX, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    return plan;
}

/* populate(), and the namespace's manifest path into man. */
static kvo_plan *populate_man(const char *root, kvo_chunk_key *keys, size_t n, char *ns, char *man, size_t cap) {
    kvo_plan *plan = populate(root, keys, n, ns);
    snprintf(man, cap, "%s/manifest.json", ns);
    return plan;
}

/* ---- item 5: non-regular files ---------------------------------------- */

KVO_TEST(fifo_chunk_not_adopted_by_scan) {
    alarm(120);
    kvo_chunk_key keys[3];
    char ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    kvo_plan *plan = populate(ftf_subdir("fifo-scan"), keys, 3, ns);
    ASSERT_OK(kvo_file_chunk_path(ns, &keys[0], path, sizeof path));
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(mkfifo(path, 0644), 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("fifo-scan"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    uint8_t st[3];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 3, st));
    ASSERT_EQ_INT(st[0], KVO_MISS); /* a FIFO is no chunk */
    ASSERT_EQ_INT(st[1], KVO_READY);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), 0);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 2);
    ASSERT_GE_U64(s.scan_removed, 1); /* reported (and removed: not a chunk) */
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    alarm(0);
}

static void fifo_read(kvo_file_io_kind io) {
    alarm(120);
    kvo_plan *plan = ftf_plan("ft-fifo-read", 5000, false);
    kvo_file_tier_params p = ftf_params(ftf_subdir(io == KVO_FILE_IO_URING ? "fifo-read-u" : "fifo-read-t"), plan);
    p.io = io;
    kvo_file_tier *t = ftf_create_or_skip(&p, plan);
    kvo_chunk_key keys[2] = {ftf_key(10, 0), ftf_key(11, 0)};
    ftf_write_keys(t, plan, keys, 2);
    char path[KVO__FILE_PATH_MAX];
    key_path(t, &keys[0], path);
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(mkfifo(path, 0644), 0);
    /* the read completes (a miss), it does not block in open() */
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[0], true), KVO_ECORRUPT);
    /* and later reads still work (the ring is not stalled) */
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), 0);
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[0], 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    alarm(0);
}
KVO_TEST(fifo_chunk_read_completes_threads) { fifo_read(KVO_FILE_IO_THREADS); }
KVO_TEST(fifo_chunk_read_completes_uring) { fifo_read(KVO_FILE_IO_URING); }

KVO_TEST(fifo_manifest_create_completes) {
    alarm(120);
    kvo_chunk_key keys[2];
    char ns[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    kvo_plan *plan = populate_man(ftf_subdir("fifo-man"), keys, 2, ns, man, sizeof man);
    ASSERT_EQ_INT(unlink(man), 0);
    ASSERT_EQ_INT(mkfifo(man, 0644), 0);
    kvo_file_tier_params p = ftf_params(ftf_subdir("fifo-man"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t)); /* rebuilt from the plan (item 7) */
    struct stat st;
    ASSERT_EQ_INT(stat(man, &st), 0);
    ASSERT_TRUE(S_ISREG(st.st_mode));
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    alarm(0);
}

KVO_TEST(fsck_fifo_completes) {
    kvo_chunk_key keys[3];
    char ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    kvo_plan *plan = populate_man(ftf_subdir("fsck-fifo"), keys, 3, ns, man, sizeof man);
    ASSERT_OK(kvo_file_chunk_path(ns, &keys[0], path, sizeof path));
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(mkfifo(path, 0644), 0);
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "fsck '%s'", ns);
    ASSERT_EQ_INT(cli(args, &out), 1);
    ASSERT_CONTAINS(out, "not a regular file");
    ASSERT_CONTAINS(out, "files 2");
    free(out);
    ASSERT_EQ_INT(unlink(man), 0);
    ASSERT_EQ_INT(mkfifo(man, 0644), 0);
    ASSERT_EQ_INT(cli(args, &out), 1);
    ASSERT_CONTAINS(out, "manifest");
    ASSERT_CONTAINS(out, "not a regular file");
    free(out);
    kvo_plan_destroy(plan);
}

/* ---- item 6: a newer format version is left alone ----------------------- */

KVO_TEST(fsck_repair_leaves_newer_version_alone) {
    kvo_chunk_key keys[3];
    char ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    kvo_plan *plan = populate_man(ftf_subdir("fsck-newer"), keys, 3, ns, man, sizeof man);
    size_t len = 0;
    char *text = kvo_test_read_file(man, &len);
    ASSERT_NOT_NULL(text);
    char *v = strstr(text, "\"format_version\": 1");
    ASSERT_NOT_NULL(v);
    v[strlen("\"format_version\": ")] = '2';
    write_text(man, text);
    free(text);
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "fsck '%s' --repair", ns);
    int ec = cli(args, &out);
    ASSERT_CONTAINS(out, "newer");
    ASSERT_TRUE(strstr(out, "(removed)") == NULL);
    free(out);
    ASSERT_NE_INT(ec, 124);
    ASSERT_TRUE(exists(man));
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(kvo_file_chunk_path(ns, &keys[i], path, sizeof path));
        ASSERT_TRUE(exists(path));
    }
    kvo_plan_destroy(plan);
}

/* ---- item 7: damaged manifest ------------------------------------------- */

KVO_TEST(damaged_manifest_rebuilt_by_tier) {
    kvo_chunk_key keys[3];
    char ns[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    kvo_plan *plan = populate_man(ftf_subdir("man-dmg"), keys, 3, ns, man, sizeof man);
    write_text(man, "{\"format\": \"kvoffload-file\", \"format_vers");
    kvo_file_tier_params p = ftf_params(ftf_subdir("man-dmg"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[2], true), 0); /* the data survived */
    kvo_file_tier_destroy(t);
    kvo_u128 fp;
    ASSERT_OK(kvo__file_manifest_read(ns, &fp, NULL, NULL, NULL));
    ASSERT_EQ_U64(fp.lo, kvo_plan_fingerprint(plan).lo);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsck_damaged_manifest_reported_truthfully) {
    kvo_chunk_key keys[2];
    char ns[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    kvo_plan *plan = populate_man(ftf_subdir("fsck-dmg"), keys, 2, ns, man, sizeof man);
    write_text(man, "garbage");
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "fsck '%s' --repair", ns);
    ASSERT_EQ_INT(cli(args, &out), 1);
    /* not repaired, and the summary does not claim it was */
    ASSERT_TRUE(strstr(out, "(bad files removed)") == NULL);
    ASSERT_CONTAINS(out, "not repaired");
    free(out);
    ASSERT_TRUE(exists(man));
    /* told to: the namespace goes */
    snprintf(args, sizeof args, "fsck '%s' --repair --remove-damaged", ns);
    ASSERT_EQ_INT(cli(args, &out), 3); /* the one problem repaired */
    ASSERT_CONTAINS(out, "namespace removed");
    free(out);
    ASSERT_FALSE(exists(ns));
    kvo_plan_destroy(plan);
}

/* ---- item 8: leftovers of a killed first create --------------------------- */

static long dead_pid(void) {
    pid_t c = fork();
    if (c == 0) _exit(0);
    ASSERT_TRUE(c > 0);
    int st;
    waitpid(c, &st, 0);
    return (long)c;
}

KVO_TEST(stale_manifest_temp_removed) {
    kvo_chunk_key keys[1];
    char ns[KVO__FILE_PATH_MAX], old_tmp[KVO__FILE_PATH_MAX + 64], new_tmp[KVO__FILE_PATH_MAX + 96];
    kvo_plan *plan = populate(ftf_subdir("man-tmp"), keys, 1, ns);
    /* the name older builds used (no host id: removed by the age rule) */
    snprintf(old_tmp, sizeof old_tmp, "%s/.tmp.manifest.%ld.0", ns, dead_pid());
    write_text(old_tmp, "{");
    struct timeval tv[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    ASSERT_EQ_INT(utimes(old_tmp, tv), 0);
    /* the name this build uses: this host, a dead process */
    snprintf(new_tmp, sizeof new_tmp, "%s/.tmp.%08x.%ld.%08x.0.manifest", ns, kvo__file_host_id(), dead_pid(), 7u);
    write_text(new_tmp, "{");
    char args[KVO__FILE_PATH_MAX + 64], *out = NULL;
    snprintf(args, sizeof args, "fsck '%s'", ns);
    ASSERT_EQ_INT(cli(args, &out), 1);
    ASSERT_CONTAINS(out, "stale temporary");
    free(out);
    kvo_file_tier_params p = ftf_params(ftf_subdir("man-tmp"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_destroy(t);
    ASSERT_FALSE(exists(old_tmp));
    ASSERT_FALSE(exists(new_tmp));
    kvo_plan_destroy(plan);
}

/* ---- item 9: SIGXFSZ ------------------------------------------------------ */

KVO_TEST(file_size_limit_drops_write) {
    kvo_plan *plan = ftf_plan("ft-xfsz", 5000, false);
    const char *root = ftf_subdir("xfsz");
    pid_t c = fork();
    ASSERT_TRUE(c >= 0);
    if (c == 0) {
        kvo_file_tier_params p = ftf_params(root, plan);
        p.io = KVO_FILE_IO_THREADS;
        kvo_file_tier *t = NULL;
        if (kvo_file_tier_create(&p, &t)) _exit(10);
        struct rlimit rl = {4096, 4096}; /* below one chunk file */
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(11);
        const kvo_group_plan *g = kvo_plan_group(plan, 0);
        unsigned char *buf = calloc(1, g->chunk_bytes);
        const void *src = buf;
        kvo_chunk_key k = ftf_key(5, 0);
        int r = 1;
        if (kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL) || r) _exit(12);
        if (kvo_file_tier_flush(t, KVO_MS(20000))) _exit(13);
        kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
        if (kvo_file_tier_get_stats(t, &s) || s.writes != 0 || s.dropped_nospace + s.dropped_io != 1) _exit(14);
        kvo_file_tier_destroy(t);
        free(buf);
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ_INT(waitpid(c, &st, 0), c);
    if (WIFSIGNALED(st)) FAILF("the process was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    ASSERT_EQ_INT(WEXITSTATUS(st), 0);
    kvo_plan_destroy(plan);
}

/* ---- item 10: a header claiming a huge payload ---------------------------- */

static void *cap_malloc(size_t n, void *ctx) { (void)ctx; return n > (64u << 20) ? NULL : malloc(n); }
static void *cap_calloc(size_t n, size_t s, void *ctx) { (void)ctx; return n * s > (64u << 20) ? NULL : calloc(n, s); }
static void *cap_realloc(void *p, size_t n, void *ctx) { (void)ctx; return n > (64u << 20) ? NULL : realloc(p, n); }
static void cap_free(void *p, void *ctx) { (void)ctx; free(p); }

static void claim_512mib(kvo__file_hdr *h) {
    h->chunk_bytes = (512ull << 20) - 100;
    h->slot_bytes = 512ull << 20;
}

KVO_TEST(inspect_huge_payload_claim_bounded) {
    kvo_chunk_key keys[1];
    char ns[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    kvo_plan *plan = populate(ftf_subdir("huge"), keys, 1, ns);
    ASSERT_OK(kvo_file_chunk_path(ns, &keys[0], path, sizeof path));
    /* a valid header claiming 512 MiB, and a sparse file of that size */
    ftf_patch_header(path, claim_512mib);
    ASSERT_EQ_INT(truncate(path, 4096 + (off_t)(512ull << 20)), 0);
    kvo_allocator a = KVO_ALLOCATOR_INIT(cap_malloc, cap_calloc, cap_realloc, cap_free, NULL);
    ASSERT_OK(kvo_set_allocator(&a));
    kvo_file_chunk_info info;
    int rc = kvo_file_inspect(path, NULL, &info); /* no plan: fsck's case */
    char why[512];
    snprintf(why, sizeof why, "%s", kvo_last_error());
    ASSERT_OK(kvo_set_allocator(NULL));
    if (rc != KVO_ECORRUPT) FAILF("inspect returned %s: %s", kvo_error_name(rc), why);
    ASSERT_CONTAINS(why, "checksum");
    /* with the plan, the geometry check rejects it before any payload read */
    ASSERT_ERR(kvo_file_inspect(path, plan, &info), KVO_ECORRUPT);
    kvo_plan_destroy(plan);
}

/* ---- item 11: a chunk file that cannot be opened -------------------------- */

KVO_TEST(unopenable_chunk_dropped_from_index) {
    alarm(120);
    kvo_plan *plan = ftf_plan("ft-loop", 5000, false);
    kvo_file_tier_params p = ftf_params(ftf_subdir("loop"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[2] = {ftf_key(20, 0), ftf_key(21, 0)};
    ftf_write_keys(t, plan, keys, 2);
    char path[KVO__FILE_PATH_MAX];
    key_path(t, &keys[0], path);
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(symlink(path, path), 0); /* ELOOP for everyone, root too */
    ASSERT_NE_INT(ftf_read_key(t, plan, &keys[0], true), 0);
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[0], 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &keys[1], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    alarm(0);
}

/* ---- item 12: restarts on a full disk ------------------------------------ */

static int count_visit(const kvo_file_walk_entry *e, void *ctx) {
    if (e->kind == KVO_FILE_WALK_CHUNK) ++*(size_t *)ctx;
    return 0;
}

KVO_TEST(restart_on_full_disk_keeps_files) {
    kvo_plan *plan = ftf_plan("ft-full", 5000, false);
    const char *mnt = ftf_small_tmpfs("full-mnt", "4m", plan);
    kvo_file_tier_params p = ftf_params(mnt, plan);
    p.direct = KVO_FILE_DIRECT_OFF;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char ns[KVO__FILE_PATH_MAX];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    /* fill the quota the tier clamped to, then the rest of the disk */
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    size_t n = (size_t)(s.quota_bytes / g->slot_bytes);
    kvo_chunk_key *keys = calloc(n, sizeof *keys);
    for (size_t i = 0; i < n; i++) keys[i] = ftf_key(1000 + i, 0);
    ftf_write_keys(t, plan, keys, n);
    kvo_file_tier_destroy(t);
    ftf_fill_disk(mnt);
    size_t before = 0, after = 0;
    ASSERT_OK(kvo_file_walk(ns, 0, count_visit, &before));
    ASSERT_GT_U64(before, 20);
    for (int round = 0; round < 3; round++) {
        ASSERT_OK(kvo_file_tier_create(&p, &t));
        kvo_file_tier_destroy(t);
    }
    ASSERT_OK(kvo_file_walk(ns, 0, count_visit, &after));
    umount2(mnt, MNT_DETACH);
    free(keys);
    kvo_plan_destroy(plan);
    ASSERT_EQ_U64(after, before);
}

/* ---- item 13: padding ----------------------------------------------------- */

KVO_TEST(padding_flip_not_returned) {
    kvo_plan *plan = ftf_plan("ft-pad", 5000, false);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    ASSERT_GT_U64(g->slot_bytes, g->chunk_bytes); /* the plan has padding */
    kvo_file_tier_params p = ftf_params(ftf_subdir("pad"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k = ftf_key(30, 0);
    ftf_write_keys(t, plan, &k, 1);
    char path[KVO__FILE_PATH_MAX];
    key_path(t, &k, path);
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    unsigned char b = 0x40;
    ASSERT_EQ_INT(pwrite(fd, &b, 1, (off_t)(4096 + g->chunk_bytes + 3)), 1);
    close(fd);
    ASSERT_ERR(kvo_file_verify(path, plan, NULL, NULL), KVO_ECORRUPT);
    ASSERT_EQ_INT(ftf_read_key(t, plan, &k, true), KVO_ECORRUPT);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* ---- item 15: strict manifest parsing ------------------------------------- */

static void replace_field(const char *man, const char *field, const char *value) {
    size_t len = 0;
    char *text = kvo_test_read_file(man, &len);
    ASSERT_NOT_NULL(text);
    json_error_t e;
    json_t *root = json_loads(text, 0, &e);
    free(text);
    ASSERT_NOT_NULL(root);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &e);
    ASSERT_NOT_NULL(v);
    json_object_set_new(root, field, v);
    ASSERT_EQ_INT(json_dump_file(root, man, JSON_INDENT(2)), 0);
    json_decref(root);
}

KVO_TEST(manifest_parse_strict) {
    kvo_plan *plan = ftf_plan("ft-strict", 5000, false);
    kvo_file_tier_params p = ftf_params(ftf_subdir("strict"), plan);
    p.layout_hash = 0x1234abcd5678ef00ull;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char ns[KVO__FILE_PATH_MAX], man[KVO__FILE_PATH_MAX + 32];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    snprintf(man, sizeof man, "%s/manifest.json", ns);
    uint64_t lh = 0;
    ASSERT_OK(kvo__file_manifest_read(ns, NULL, &lh, NULL, NULL));
    ASSERT_EQ_U64(lh, p.layout_hash);
    static const char *bad_lh[] = {"\"0x1234abcd5678ef00\"", "\"1234abcd5678ef00zz\"", "\"1234abcd5678ef0\"",
                                   "\" 1234abcd5678ef00\"", "\"-234abcd5678ef00\"", "12"};
    for (size_t i = 0; i < sizeof bad_lh / sizeof bad_lh[0]; i++) {
        replace_field(man, "layout_hash", bad_lh[i]);
        int rc = kvo__file_manifest_read(ns, NULL, &lh, NULL, NULL);
        if (rc != KVO_EPARSE) FAILF("layout_hash %s accepted (rc %d, value %016llx)", bad_lh[i], rc,
                                    (unsigned long long)lh);
    }
    replace_field(man, "layout_hash", "\"1234abcd5678ef00\"");
    /* 2^32 + 1 is not version 1: the tier refuses the namespace */
    replace_field(man, "format_version", "4294967297");
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_ESTATE);
    ASSERT_CONTAINS(kvo_last_error(), "4294967297");
    replace_field(man, "format_version", "-1");
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_ESTATE);
    replace_field(man, "format_version", "1");
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* ---- issue 12: no -errno across the API ----------------------------------- */

/* file_ops.c is left out on purpose: its I/O phases pass the outcome of a
 * transfer as bytes-or-(-errno) to kvo__fop_end, the convention of
 * io_uring's cqe->res, and kvo__fop_end turns it into a KVO_E* result; it
 * never leaves the tier. */
KVO_TEST(no_negative_errno_returns_in_tiers) {
    static const char *files[] = {"file_tier.c", "file_workers.c", "file_quota.c", "file_probe.c",
                                  "file_scan.c", "file_format.c", "arena.c"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/src/tiers/%s", KVO_SOURCE_DIR, files[i]);
        size_t len = 0;
        char *text = kvo_test_read_file(path, &len);
        ASSERT_NOT_NULL(text);
        if (strstr(text, "return -errno") || strstr(text, "return -e;"))
            FAILF("%s returns -errno: use a KVO_E* code with the errno text in the message", files[i]);
        free(text);
    }
}
