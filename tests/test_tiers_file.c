/* File tier: round trips, persistence, every corruption kind, crash safety,
 * ENOSPC, sharing between processes, quota eviction, back-pressure. */
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

#include "tiers/file_internal.h"

/* Two offloaded groups with chunk sizes that are not multiples of 4096 (so
 * the padding path runs) and one group that is not offloaded. */
static kvo_plan *make_plan(const char *name, uint64_t page_bytes) {
    kvo_model *m = NULL;
    if (kvo_model_create(name, 16, &m)) FAILF("model: %s", kvo_last_error());
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "full");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = page_bytes;
    if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    snprintf(g.name, sizeof g.name, "swa");
    g.kind = KVO_GROUP_SLIDING;
    g.window = 64;
    g.layers = 1;
    g.page_bytes = page_bytes / 2 + 8;
    if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    snprintf(g.name, sizeof g.name, "nocache");
    g.kind = KVO_GROUP_FULL;
    g.window = 0;
    g.cacheable = false;
    if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    kvo_plan *p = NULL;
    if (kvo_plan_create(m, &pp, &p)) FAILF("plan: %s", kvo_last_error());
    kvo_model_destroy(m);
    return p;
}

static kvo_chunk_key key_n(uint64_t i, uint32_t group) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 12345;
    k.hash.hi = ~i * 0xbf58476d1ce4e5b9ull;
    k.group = group;
    return k;
}

/* Deterministic content of a key (so other processes can check it). */
static void fill_key(unsigned char *buf, uint64_t n, const kvo_chunk_key *k) {
    uint64_t s = k->hash.lo ^ k->group;
    for (uint64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(s >> 56);
    }
}

static unsigned char *aligned_buf(uint64_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n)) FAILF("posix_memalign");
    memset(p, 0xee, n);
    return p;
}

static kvo_file_tier_params params(const char *root, const kvo_plan *plan) {
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = root;
    p.plan = plan;
    p.quota_bytes = 64ull << 20;
    p.max_staging_bytes = 16ull << 20;
    p.log_interval_s = 3600;
    return p;
}

/* A path under the test's temporary directory (a ring of 8 buffers). */
static char *subdir(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *buf = bufs[next++ % 8];
    snprintf(buf, 1024, "%s/%s", kvo_test_tmpdir(), name);
    return buf;
}

static void write_keys(kvo_file_tier *t, const kvo_plan *plan, const kvo_chunk_key *keys, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const kvo_group_plan *g = kvo_plan_group(plan, keys[i].group);
        unsigned char *buf = malloc(g->chunk_bytes);
        fill_key(buf, g->chunk_bytes, &keys[i]);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &keys[i], &src, 1, NULL, &r, NULL));
        if (r == KVO_EAGAIN) { /* back-pressure: let the queue drain */
            ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
            ASSERT_OK(kvo_file_tier_write(t, &keys[i], &src, 1, NULL, &r, NULL));
        }
        free(buf); /* the tier copied it */
        ASSERT_EQ_INT(r, 0);
    }
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
}

/* Read one key synchronously; returns the completion result and checks the
 * bytes when it succeeded. */
static int read_key(kvo_file_tier *t, const kvo_plan *plan, const kvo_chunk_key *k, bool aligned) {
    const kvo_group_plan *g = kvo_plan_group(plan, k->group);
    unsigned char *raw = aligned_buf(g->slot_bytes + 4096 + 64);
    unsigned char *dst = aligned ? raw : raw + 64;
    void *d = dst;
    int r = 1;
    uint64_t ud = 77;
    ASSERT_OK(kvo_file_tier_read(t, k, &d, 1, &ud, &r, NULL));
    if (r != 0) {
        free(raw);
        return r;
    }
    kvo_file_completion c;
    size_t got = 0;
    for (int spin = 0; spin < 2000 && !got; spin++) {
        int w = kvo_file_tier_wait(t, KVO_MS(5000));
        if (w && w != KVO_ETIMEDOUT) FAILF("wait: %s", kvo_last_error());
        ASSERT_OK(kvo_file_tier_poll(t, &c, 1, &got));
    }
    ASSERT_EQ_U64(got, 1);
    ASSERT_EQ_U64(c.user_data, 77);
    ASSERT_EQ_INT(c.op, KVO_FILE_OP_READ);
    ASSERT_TRUE(kvo_chunk_key_eq(&c.key, k));
    if (c.result == 0) {
        unsigned char *want = malloc(g->chunk_bytes);
        fill_key(want, g->chunk_bytes, k);
        ASSERT_MEM_EQ(dst, want, g->chunk_bytes);
        ASSERT_EQ_U64(c.bytes, g->chunk_bytes);
        free(want);
    }
    free(raw);
    return c.result;
}

static void round_trip(kvo_file_io_kind io, kvo_file_direct_mode direct) {
    kvo_plan *plan = make_plan("ft-rt", 5000);
    kvo_file_tier_params p = params(subdir("rt"), plan);
    p.io = io;
    p.direct = direct;
    kvo_file_tier *t = NULL;
    int rc = kvo_file_tier_create(&p, &t);
    if (rc == KVO_ENOTSUP) {
        kvo_plan_destroy(plan);
        SKIP("%s", kvo_last_error());
    }
    ASSERT_OK(rc);
    if (io == KVO_FILE_IO_URING) ASSERT_EQ_STR(kvo_file_tier_backend(t), "io_uring");
    if (io == KVO_FILE_IO_THREADS) ASSERT_EQ_STR(kvo_file_tier_backend(t), "threads");
    kvo_chunk_key keys[12];
    for (int i = 0; i < 12; i++) keys[i] = key_n((uint64_t)i, (uint32_t)(i % 2));
    uint8_t st[12];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 12, st));
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(st[i], KVO_MISS);
    write_keys(t, plan, keys, 12);
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 12, st));
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(st[i], KVO_READY);
    for (int i = 0; i < 12; i++) ASSERT_EQ_INT(read_key(t, plan, &keys[i], i % 3 != 0), 0);
    /* writing again is skipped */
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0);
    unsigned char *buf = calloc(1, g0->chunk_bytes);
    const void *src = buf;
    int r = 0;
    ASSERT_OK(kvo_file_tier_write(t, &keys[0], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, KVO_EEXIST);
    free(buf);
    /* a group that is not offloaded is rejected */
    kvo_chunk_key bad = key_n(1, 2);
    ASSERT_ERR(kvo_file_tier_lookup(t, &bad, 1, st), KVO_EINVAL);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.writes, 12);
    ASSERT_EQ_U64(s.reads, 12);
    ASSERT_EQ_U64(s.files, 12);
    ASSERT_EQ_U64(s.corrupt_removed, 0);
    /* every chunk file verifies with the public checker */
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[3], path, sizeof path));
    kvo_chunk_key vk;
    uint64_t vb = 0;
    ASSERT_OK(kvo_file_verify(path, plan, &vk, &vb));
    ASSERT_TRUE(kvo_chunk_key_eq(&vk, &keys[3]));
    ASSERT_EQ_U64(vb, kvo_plan_group(plan, 1)->chunk_bytes);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(round_trip_threads) { round_trip(KVO_FILE_IO_THREADS, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(round_trip_uring) { round_trip(KVO_FILE_IO_URING, KVO_FILE_DIRECT_AUTO); }
KVO_TEST(round_trip_buffered) { round_trip(KVO_FILE_IO_AUTO, KVO_FILE_DIRECT_OFF); }
KVO_TEST(round_trip_named_temps) {
    atomic_store(&kvo__file_test_no_tmpfile, 1);
    round_trip(KVO_FILE_IO_THREADS, KVO_FILE_DIRECT_AUTO);
    atomic_store(&kvo__file_test_no_tmpfile, 0);
}

KVO_TEST(restart_persistence) {
    kvo_plan *plan = make_plan("ft-restart", 3000);
    kvo_file_tier_params p = params(subdir("rs"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[20];
    for (int i = 0; i < 20; i++) keys[i] = key_n((uint64_t)i + 100, (uint32_t)(i % 2));
    write_keys(t, plan, keys, 20);
    kvo_file_tier_destroy(t);

    t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 20);
    ASSERT_EQ_U64(s.files, 20);
    uint8_t st[20];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 20, st));
    for (int i = 0; i < 20; i++) ASSERT_EQ_INT(st[i], KVO_READY);
    for (int i = 0; i < 20; i += 3) ASSERT_EQ_INT(read_key(t, plan, &keys[i], true), 0);
    kvo_file_tier_destroy(t);

    /* a different layout gets its own namespace: no hits, no interference */
    kvo_plan *other = make_plan("ft-restart", 3001);
    kvo_file_tier_params p2 = params(subdir("rs"), other);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.scanned_files, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(other);
    kvo_plan_destroy(plan);
}

enum { C_FLIP_PAYLOAD, C_FLIP_HEADER, C_TRUNCATE, C_MAGIC, C_GEOMETRY, C_ZERO, C_DIR, C_OTHER_KEY, C_VERSION,
       C_EXTEND, C_KINDS };
static const char *const c_names[C_KINDS] = {"flipped payload byte", "flipped header byte", "truncated",
                                             "wrong magic", "wrong geometry", "zero length", "directory",
                                             "another key's file", "future format version", "extended"};

static void patch_header(const char *path, void (*fn)(kvo__file_hdr *h)) {
    unsigned char hb[4096];
    int fd = open(path, O_RDWR);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ_INT(pread(fd, hb, 4096, 0), 4096);
    kvo__file_hdr h;
    ASSERT_OK(kvo__file_hdr_decode(hb, 4096, &h));
    fn(&h);
    kvo__file_hdr_encode(&h, hb);
    ASSERT_EQ_INT(pwrite(fd, hb, 4096, 0), 4096);
    close(fd);
}
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
    case C_GEOMETRY: patch_header(path, more_layers); break;
    case C_ZERO: ASSERT_EQ_INT(truncate(path, 0), 0); break;
    case C_DIR:
        ASSERT_EQ_INT(unlink(path), 0);
        ASSERT_EQ_INT(mkdir(path, 0755), 0);
        break;
    case C_OTHER_KEY: ASSERT_EQ_INT(rename(other_path, path), 0); break;
    }
}

KVO_TEST(corruption_kinds) {
    kvo_plan *plan = make_plan("ft-corrupt", 4000);
    kvo_file_tier_params p = params(subdir("cr"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[2 * C_KINDS];
    for (int i = 0; i < 2 * C_KINDS; i++) keys[i] = key_n((uint64_t)i + 500, 0);
    write_keys(t, plan, keys, 2 * C_KINDS);
    uint64_t corrupt_before = 0;
    for (int kind = 0; kind < C_KINDS; kind++) {
        char path[KVO__FILE_PATH_MAX], other[KVO__FILE_PATH_MAX];
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[kind], path, sizeof path));
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[C_KINDS + kind], other, sizeof other));
        corrupt(path, kind, other);
        ASSERT_ERR(kvo_file_verify(path, plan, NULL, NULL), KVO_ECORRUPT);
        int r = read_key(t, plan, &keys[kind], kind % 2 == 0);
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
    ASSERT_EQ_INT(read_key(t, plan, &keys[C_KINDS + 1], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* A read finds its file corrupt while another pin (a connector's lookup,
 * kvo_file_tier_pin) still holds the key: the key misses at once, not only
 * after the pin goes (the race behind a flaky connector test), and the pin
 * is released cleanly. */
KVO_TEST(corrupt_read_while_pinned_misses_at_once) {
    kvo_plan *plan = make_plan("ft-corrupt-pin", 4000);
    kvo_file_tier_params p = params(subdir("crp"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k[2] = {key_n(900, 0), key_n(901, 0)};
    write_keys(t, plan, k, 2);
    ASSERT_OK(kvo_file_tier_pin(t, k, 2));
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &k[0], path, sizeof path));
    corrupt(path, C_FLIP_PAYLOAD, NULL);
    ASSERT_EQ_INT(read_key(t, plan, &k[0], true), KVO_ECORRUPT);
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
    write_keys(t, plan, k, 1);
    ASSERT_EQ_INT(read_key(t, plan, &k[0], true), 0);
    ASSERT_EQ_INT(read_key(t, plan, &k[1], false), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(corruption_found_after_restart) {
    kvo_plan *plan = make_plan("ft-corrupt2", 4000);
    kvo_file_tier_params p = params(subdir("cr2"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[4];
    for (int i = 0; i < 4; i++) keys[i] = key_n((uint64_t)i + 900, 1);
    write_keys(t, plan, keys, 4);
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
    ASSERT_EQ_INT(read_key(t, plan, &keys[0], true), KVO_ECORRUPT);
    ASSERT_EQ_INT(read_key(t, plan, &keys[1], true), KVO_ENOTFOUND);
    ASSERT_EQ_INT(read_key(t, plan, &keys[2], true), KVO_ECORRUPT);
    ASSERT_EQ_INT(read_key(t, plan, &keys[3], true), 0);
    struct stat st;
    ASSERT_EQ_INT(stat(foreign, &st), 0); /* not ours: left alone */
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* A child process writes in a loop and is killed with SIGKILL; nothing that
 * it left may load with wrong bytes, and its temporary files are cleaned.
 * The child says it started once its first 41 writes are on disk, so that
 * the kill always leaves files to check (it used not to under heavy load). */
static void sigkill_during_writes(bool named_temps) {
    atomic_store(&kvo__file_test_no_tmpfile, named_temps);
    kvo_plan *plan = make_plan("ft-kill", 20000);
    char root[1024], started[1024];
    snprintf(root, sizeof root, "%s", subdir("kill"));
    snprintf(started, sizeof started, "%s", subdir("kill.started"));
    kvo_file_tier_params p = params(root, plan);
    p.max_staging_bytes = 4ull << 20;
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        kvo_file_tier *t = NULL;
        if (kvo_file_tier_create(&p, &t)) _exit(3);
        const kvo_group_plan *g = kvo_plan_group(plan, 0);
        unsigned char *buf = malloc(g->chunk_bytes);
        for (uint64_t i = 0;; i++) {
            kvo_chunk_key k = key_n(i, 0);
            fill_key(buf, g->chunk_bytes, &k);
            const void *src = buf;
            kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL);
            if (i == 40) { /* files on disk before the parent's kill, however slow the machine */
                if (kvo_file_tier_flush(t, KVO_MS(60000))) _exit(4);
                int fd = open(started, O_CREAT | O_WRONLY, 0644);
                close(fd);
            }
        }
    }
    struct stat st;
    for (int i = 0; i < 2000 && stat(started, &st) != 0; i++) usleep(5000);
    usleep(30000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));

    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GT_U64(s.scanned_files, 0);
    uint64_t ok = 0, bad = 0;
    for (uint64_t i = 0; i < 100000 && ok + bad < s.scanned_files; i++) {
        kvo_chunk_key k = key_n(i, 0);
        uint8_t stt;
        ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &stt));
        if (stt != KVO_READY) continue;
        int r = read_key(t, plan, &k, true); /* checks the bytes when r == 0 */
        if (r == 0) ok++;
        else if (r == KVO_ECORRUPT) bad++;
        else FAILF("read of key %llu: %s", (unsigned long long)i, kvo_error_name(r));
    }
    ASSERT_EQ_U64(ok + bad, s.scanned_files);
    ASSERT_EQ_U64(bad, 0); /* rename makes files appear whole */
    /* no temporary file of the dead writer is left */
    char dirp[KVO__FILE_PATH_MAX];
    int tmps = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(dirp, sizeof dirp, "%s/%02x", kvo_file_tier_dir(t), b);
        DIR *d = opendir(dirp);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) tmps += strncmp(e->d_name, ".tmp.", 5) == 0;
        closedir(d);
    }
    ASSERT_EQ_INT(tmps, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    atomic_store(&kvo__file_test_no_tmpfile, 0);
}

KVO_TEST(sigkill_during_writes) { sigkill_during_writes(false); }
KVO_TEST(sigkill_during_writes_named_temps) { sigkill_during_writes(true); }

static void check_nospace(kvo_file_tier *t, const kvo_plan *plan, int expect_some_ok) {
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_stats s0 = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s0));
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t i = 0; i < 40; i++) {
        kvo_chunk_key k = key_n(i + 7000, 0);
        fill_key(buf, g->chunk_bytes, &k);
        const void *src = buf;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL));
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    free(buf);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    uint64_t writes = s.writes - s0.writes, nospace = s.dropped_nospace - s0.dropped_nospace;
    ASSERT_GT_U64(nospace, 0);
    ASSERT_EQ_U64(writes + nospace + s.dropped_io - s0.dropped_io, 40);
    ASSERT_EQ_U64(s.files, s0.files + writes);
    if (expect_some_ok) ASSERT_GT_U64(writes, 0);
    /* what was written reads back; what was dropped is a miss */
    uint64_t ok = 0;
    for (uint64_t i = 0; i < 40; i++) {
        kvo_chunk_key k = key_n(i + 7000, 0);
        uint8_t st;
        ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
        if (st == KVO_READY) {
            ASSERT_EQ_INT(read_key(t, plan, &k, true), 0);
            ok++;
        }
    }
    ASSERT_EQ_U64(ok, writes);
}

KVO_TEST(enospc_injected) {
    kvo_plan *plan = make_plan("ft-nospc", 8000);
    kvo_file_tier_params p = params(subdir("ns"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo__file_tier_inject_write_error(ENOSPC, 5);
    check_nospace(t, plan, 1);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_nospace, 5);
    kvo__file_tier_inject_write_error(EIO, 2);
    const kvo_group_plan *g = kvo_plan_group(plan, 1);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    for (int i = 0; i < 3; i++) {
        kvo_chunk_key k = key_n(60000 + (uint64_t)i, 1);
        const void *src = buf;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL));
    }
    free(buf);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_io, 2);
    kvo__file_tier_inject_write_error(0, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(enospc_small_tmpfs) {
    if (geteuid() != 0) SKIP("needs root to mount a small tmpfs");
    kvo_plan *plan = make_plan("ft-tmpfs", 8000);
    const char *mnt = subdir("mnt");
    ASSERT_EQ_INT(mkdir(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0) {
        kvo_plan_destroy(plan);
        SKIP("cannot mount a tmpfs here: %s", strerror(errno));
    }
    kvo_file_tier_params p = params(mnt, plan);
    kvo_file_tier *t = NULL;
    int rc = kvo_file_tier_create(&p, &t);
    if (rc == 0) {
        /* O_DIRECT on tmpfs depends on the kernel (6.6+ has it): probed, whatever it is */
        /* a quota above what the file system holds is clamped: old files are
         * evicted instead of new writes failing */
        kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
        ASSERT_OK(kvo_file_tier_get_stats(t, &s));
        ASSERT_LT_U64(s.quota_bytes, 256 * 1024);
        const kvo_group_plan *g = kvo_plan_group(plan, 0);
        kvo_chunk_key keys[12];
        for (int i = 0; i < 12; i++) {
            keys[i] = key_n((uint64_t)i + 90000, 0);
            write_keys(t, plan, &keys[i], 1);
        }
        ASSERT_OK(kvo_file_tier_get_stats(t, &s));
        ASSERT_GT_U64(s.evictions, 0);
        ASSERT_EQ_U64(s.dropped_nospace, 0);
        ASSERT_EQ_INT(read_key(t, plan, &keys[11], true), 0);
        /* another writer fills the disk (after this tier emptied itself, so
         * that no eviction can make room): writes fail with ENOSPC, dropped */
        ASSERT_OK(kvo_file_tier_remove(t, keys, 12));
        char ballast[1100];
        snprintf(ballast, sizeof ballast, "%s/ballast", mnt);
        int fd = open(ballast, O_WRONLY | O_CREAT, 0644);
        ASSERT_TRUE(fd >= 0);
        char *junk = calloc(1, 4096);
        while (write(fd, junk, 4096) == 4096) {
        }
        close(fd);
        free(junk);
        (void)g;
        check_nospace(t, plan, 0);
        unlink(ballast);
        kvo_file_tier_destroy(t);
    }
    umount2(mnt, MNT_DETACH);
    ASSERT_OK(rc);
    kvo_plan_destroy(plan);
}

/* Two processes store and load the same keys (and each other's). */
static int share_child(const kvo_plan *plan, const char *root, uint64_t first, uint64_t count, uint64_t total) {
    kvo_file_tier_params p = params(root, plan);
    p.shared = true;
    kvo_file_tier *t = NULL;
    if (kvo_file_tier_create(&p, &t)) return 10;
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t i = first; i < first + count; i++) {
        kvo_chunk_key k = key_n(i, 0);
        fill_key(buf, g->chunk_bytes, &k);
        const void *src = buf;
        int r = 0;
        kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL);
        if (r != 0 && r != KVO_EEXIST) return 11;
    }
    free(buf);
    if (kvo_file_tier_flush(t, KVO_MS(20000))) return 12;
    /* read everything, waiting for the other writer */
    uint64_t found = 0;
    for (int round = 0; round < 500 && found < total; round++) {
        found = 0;
        for (uint64_t i = 0; i < total; i++) {
            kvo_chunk_key k = key_n(i, 0);
            uint8_t st;
            if (kvo_file_tier_lookup(t, &k, 1, &st)) return 13;
            if (st != KVO_READY) continue;
            int r = read_key(t, plan, &k, i % 2 == 0);
            if (r == 0) found++;
            else if (r != KVO_ENOTFOUND) return 14; /* never corrupt */
        }
        if (found < total) usleep(10000);
    }
    kvo_file_tier_destroy(t);
    return found == total ? 0 : 15;
}

KVO_TEST(two_processes_share) {
    kvo_plan *plan = make_plan("ft-share", 6000);
    const char *root = subdir("share");
    fflush(NULL);
    pid_t a = fork();
    if (a == 0) _exit(share_child(plan, root, 0, 30, 45));
    pid_t b = fork();
    if (b == 0) _exit(share_child(plan, root, 15, 30, 45));
    int sa = 0, sb = 0;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    ASSERT_TRUE(WIFEXITED(sa));
    ASSERT_TRUE(WIFEXITED(sb));
    ASSERT_EQ_INT(WEXITSTATUS(sa), 0);
    ASSERT_EQ_INT(WEXITSTATUS(sb), 0);
    kvo_plan_destroy(plan);
}

KVO_TEST(quota_eviction) {
    kvo_plan *plan = make_plan("ft-quota", 10000);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("q"), plan);
    p.quota_bytes = 4 * g->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[12];
    for (int i = 0; i < 12; i++) {
        keys[i] = key_n((uint64_t)i + 3000, 0);
        write_keys(t, plan, &keys[i], 1);
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_GT_U64(s.files, 0);
    ASSERT_LE_U64(s.files, 4);
    ASSERT_EQ_U64(s.evictions, 12 - s.files);
    /* files on disk match the index; the newest key is there */
    uint64_t on_disk = 0;
    for (int i = 0; i < 12; i++) {
        char path[KVO__FILE_PATH_MAX];
        struct stat st;
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path, sizeof path));
        on_disk += stat(path, &st) == 0;
    }
    ASSERT_EQ_U64(on_disk, s.files);
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[11], 1, &st));
    ASSERT_EQ_INT(st, KVO_READY);
    ASSERT_OK(kvo_file_tier_lookup(t, &keys[0], 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    /* once full, writes overwrite evicted files in place; the bytes are
     * still exactly right */
    ASSERT_GT_U64(s.recycled_files, 0);
    for (int i = 0; i < 12; i++) {
        ASSERT_OK(kvo_file_tier_lookup(t, &keys[i], 1, &st));
        if (st == KVO_READY) ASSERT_EQ_INT(read_key(t, plan, &keys[i], i % 2 == 0), 0);
    }
    char ns[KVO__FILE_PATH_MAX];
    snprintf(ns, sizeof ns, "%s", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    /* files kept for recycling are gone with the tier */
    int tmps = 0;
    for (int b = 0; b < 256; b++) {
        char dirp[KVO__FILE_PATH_MAX + 8];
        snprintf(dirp, sizeof dirp, "%s/%02x", ns, b);
        DIR *d = opendir(dirp);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) tmps += strncmp(e->d_name, ".tmp.", 5) == 0;
        closedir(d);
    }
    ASSERT_EQ_INT(tmps, 0);

    /* a restart with a smaller quota evicts down to it */
    p.quota_bytes = 2 * g->slot_bytes;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.files, 2);
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* The 256 fan-out directories exist right after create; once the quota is
 * full, a burst of writes queued faster than the writers run still
 * overwrites evicted files (the pool is as large as the write queue), and
 * the bytes read back are exact. */
KVO_TEST(fanout_at_create_and_recycling_burst) {
    kvo_plan *plan = make_plan("ft-burst", 10000);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("burst"), plan);
    p.quota_bytes = 24 * g->slot_bytes;
    p.max_pending_writes = 32;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    int dirs = 0;
    for (int b = 0; b < 256; b++) {
        char dirp[KVO__FILE_PATH_MAX + 8];
        struct stat st;
        snprintf(dirp, sizeof dirp, "%s/%02x", kvo_file_tier_dir(t), b);
        dirs += stat(dirp, &st) == 0 && S_ISDIR(st.st_mode);
    }
    ASSERT_EQ_INT(dirs, 256);
    kvo_chunk_key keys[44];
    for (int i = 0; i < 24; i++) keys[i] = key_n((uint64_t)i + 7000, 0);
    write_keys(t, plan, keys, 24);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_stats a = KVO_FILE_TIER_STATS_INIT, b = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &a));
    /* 20 writes queued at once (under max_pending_writes, more than the
     * old 16-file pool): each evicts one of the 24 (at most 20 are pending,
     * so one is always ready to evict) */
    for (int i = 24; i < 44; i++) keys[i] = key_n((uint64_t)i + 7000, 0);
    write_keys(t, plan, keys + 24, 20);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    ASSERT_OK(kvo_file_tier_get_stats(t, &b));
    ASSERT_EQ_U64(b.writes - a.writes, 20);
    ASSERT_EQ_U64(b.recycled_files - a.recycled_files, 20);
    /* which keys survive depends on which writes were still pending when
     * later ones evicted (pending files are never evicted): every key the
     * index holds reads back exactly */
    uint64_t ready = 0;
    for (int i = 0; i < 44; i++) {
        uint8_t st;
        ASSERT_OK(kvo_file_tier_lookup(t, &keys[i], 1, &st));
        if (st != KVO_READY) continue;
        ready++;
        ASSERT_EQ_INT(read_key(t, plan, &keys[i], i % 2 == 0), 0);
    }
    ASSERT_EQ_U64(ready, b.files);
    ASSERT_GT_U64(ready, 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(backpressure_drops) {
    kvo_plan *plan = make_plan("ft-bp", 30000);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("bp"), plan);
    p.max_pending_writes = 2;
    p.io = KVO_FILE_IO_THREADS;
    p.io_threads = 1;
    p.fsync = KVO_FILE_FSYNC_DATA; /* slow writes */
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { N = 40 };
    kvo_chunk_key keys[N];
    const void *srcs[N];
    int res[N];
    unsigned char *buf = calloc(1, g->chunk_bytes);
    for (int i = 0; i < N; i++) {
        keys[i] = key_n((uint64_t)i + 40000, 0);
        srcs[i] = buf;
    }
    size_t queued = 0;
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, N, NULL, res, &queued));
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(30000)));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GE_U64(queued, 2);
    ASSERT_LT_U64(queued, N);
    ASSERT_EQ_U64(s.dropped_backpressure, N - queued);
    ASSERT_EQ_U64(s.writes, queued);
    int eagain = 0;
    for (int i = 0; i < N; i++) eagain += res[i] == KVO_EAGAIN;
    ASSERT_EQ_INT(eagain, (int)(N - queued));
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(write_completions_and_event_fd) {
    kvo_plan *plan = make_plan("ft-ev", 5000);
    kvo_file_tier_params p = params(subdir("ev"), plan);
    p.write_completions = true;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_ERR(kvo_file_tier_wait(t, 0), KVO_ENOTFOUND);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    kvo_chunk_key keys[3] = {key_n(1, 0), key_n(2, 0), key_n(3, 0)};
    const void *srcs[3] = {buf, buf, buf};
    uint64_t ud[3] = {11, 22, 33};
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, 3, ud, NULL, NULL));
    int fd = kvo_file_tier_event_fd(t);
    ASSERT_TRUE(fd >= 0);
    uint64_t sum = 0;
    int got = 0;
    for (int spin = 0; spin < 100 && got < 3; spin++) {
        struct pollfd pf = {fd, POLLIN, 0};
        poll(&pf, 1, 1000);
        kvo_file_completion c[3];
        size_t n = 0;
        ASSERT_OK(kvo_file_tier_poll(t, c, 3, &n));
        for (size_t i = 0; i < n; i++) {
            ASSERT_EQ_INT(c[i].op, KVO_FILE_OP_WRITE);
            ASSERT_EQ_INT(c[i].result, 0);
            sum += c[i].user_data;
        }
        got += (int)n;
    }
    ASSERT_EQ_INT(got, 3);
    ASSERT_EQ_U64(sum, 66);
    struct pollfd pf = {fd, POLLIN, 0};
    ASSERT_EQ_INT(poll(&pf, 1, 0), 0); /* drained */
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(create_errors) {
    kvo_plan *plan = make_plan("ft-err", 5000);
    kvo_file_tier *t = NULL;
    /* a root below a regular file cannot be created */
    const char *file = subdir("plainfile");
    FILE *f = fopen(file, "w");
    fclose(f);
    char root[1100];
    snprintf(root, sizeof root, "%s/sub", file);
    kvo_file_tier_params p = params(root, plan);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), "plainfile");
    /* quota below one chunk */
    p = params(subdir("ce"), plan);
    p.quota_bytes = 4096;
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "quota");
    /* no root, no plan */
    p = params(NULL, plan);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    p = params(subdir("ce"), NULL);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_EINVAL);
    /* a manifest of another format version */
    p = params(subdir("ce"), plan);
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char man[KVO__FILE_PATH_MAX + 32];
    snprintf(man, sizeof man, "%s/manifest.json", kvo_file_tier_dir(t));
    kvo_file_tier_destroy(t);
    char *text = kvo_test_read_file(man, NULL);
    ASSERT_NOT_NULL(text);
    ASSERT_CONTAINS(text, "\"format_version\": 1");
    ASSERT_CONTAINS(text, "ft-err");
    char *pos = strstr(text, "\"format_version\": 1");
    pos[strlen("\"format_version\": ")] = '7';
    f = fopen(man, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    ASSERT_ERR(kvo_file_tier_create(&p, &t), KVO_ESTATE);
    ASSERT_CONTAINS(kvo_last_error(), "version 7");
    kvo_plan_destroy(plan);
}

KVO_TEST(remove_and_read_errors) {
    kvo_plan *plan = make_plan("ft-rm", 5000);
    kvo_file_tier_params p = params(subdir("rm"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key k = key_n(5, 1);
    write_keys(t, plan, &k, 1);
    ASSERT_OK(kvo_file_tier_remove(t, &k, 1));
    uint8_t st;
    ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    ASSERT_EQ_INT(read_key(t, plan, &k, true), KVO_ENOTFOUND);
    /* a file removed behind the tier's back: a miss, and the index forgets it */
    kvo_chunk_key k2 = key_n(6, 1);
    write_keys(t, plan, &k2, 1);
    char path[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &k2, path, sizeof path));
    ASSERT_EQ_INT(unlink(path), 0);
    ASSERT_EQ_INT(read_key(t, plan, &k2, true), KVO_ENOTFOUND);
    ASSERT_OK(kvo_file_tier_lookup(t, &k2, 1, &st));
    ASSERT_EQ_INT(st, KVO_MISS);
    /* NULL arguments */
    ASSERT_ERR(kvo_file_tier_write(t, &k, NULL, 1, NULL, NULL, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_file_tier_read(t, NULL, NULL, 1, NULL, NULL, NULL), KVO_EINVAL);
    kvo_file_tier_destroy(t);
    kvo_file_tier_destroy(NULL);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsck_cli) {
    kvo_plan *plan = make_plan("ft-fsck", 5000);
    char root[1024];
    snprintf(root, sizeof root, "%s", subdir("fsck"));
    kvo_file_tier_params p = params(root, plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[6];
    for (int i = 0; i < 6; i++) keys[i] = key_n((uint64_t)i + 70, (uint32_t)(i % 2));
    write_keys(t, plan, keys, 6);
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

/* One large chunk evicts many small ones (more than fit one eviction list). */
KVO_TEST(quota_mixed_sizes) {
    kvo_model *m = NULL;
    ASSERT_OK(kvo_model_create("ft-mixed", 16, &m));
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "big");
    g.tokens_per_block = 16;
    g.layers = 1;
    g.page_bytes = 200 * 4096;
    ASSERT_OK(kvo_model_add_group(m, &g));
    snprintf(g.name, sizeof g.name, "small");
    g.page_bytes = 2048;
    ASSERT_OK(kvo_model_add_group(m, &g));
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 1;
    kvo_plan *plan = NULL;
    ASSERT_OK(kvo_plan_create(m, &pp, &plan));
    kvo_model_destroy(m);
    const kvo_group_plan *big = kvo_plan_group(plan, 0), *small = kvo_plan_group(plan, 1);
    kvo_file_tier_params p = params(subdir("mixed"), plan);
    p.quota_bytes = 2 * big->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    uint64_t n_small = p.quota_bytes / small->slot_bytes;
    kvo_chunk_key *ks = malloc(n_small * sizeof *ks);
    for (uint64_t i = 0; i < n_small; i++) ks[i] = key_n(i + 123456, 1);
    write_keys(t, plan, ks, n_small);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_GT_U64(s.files, 64);
    kvo_chunk_key kb[2] = {key_n(1, 0), key_n(2, 0)};
    write_keys(t, plan, kb, 2);
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_quota, 0);
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_GT_U64(s.evictions, 64);
    ASSERT_EQ_INT(read_key(t, plan, &kb[1], true), 0);
    /* the evicted small files are gone from the disk */
    uint64_t present = 0;
    for (uint64_t i = 0; i < n_small; i++) {
        char path[KVO__FILE_PATH_MAX];
        struct stat st;
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &ks[i], path, sizeof path));
        present += stat(path, &st) == 0;
    }
    ASSERT_EQ_U64(present + s.evictions, n_small);
    free(ks);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Staging memory is shared by the groups: idle buffers of one group are given
 * back when another group needs room. */
KVO_TEST(staging_shared_between_groups) {
    kvo_plan *plan = make_plan("ft-stage", 20000);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0), *g1 = kvo_plan_group(plan, 1);
    kvo_file_tier_params p = params(subdir("stage"), plan);
    p.max_staging_bytes = 2 * (g0->slot_bytes + KVO_FILE_HEADER_BYTES);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key a[2] = {key_n(1, 0), key_n(2, 0)};
    write_keys(t, plan, a, 2);
    kvo_chunk_key b[3] = {key_n(3, 1), key_n(4, 1), key_n(5, 1)};
    for (int i = 0; i < 3; i++) {
        unsigned char *buf = malloc(g1->chunk_bytes);
        fill_key(buf, g1->chunk_bytes, &b[i]);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &b[i], &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        free(buf);
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_backpressure, 0);
    ASSERT_LE_U64(s.staging_bytes, p.max_staging_bytes);
    ASSERT_EQ_INT(read_key(t, plan, &b[2], true), 0);
    write_keys(t, plan, (kvo_chunk_key[]){key_n(6, 0)}, 1);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* While recent writes took longer than write_latency_limit_ms, new writes
 * are dropped (as long as one is still queued) instead of piling up. */
KVO_TEST(backpressure_latency) {
    kvo_plan *plan = make_plan("ft-lat", 5000);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("lat"), plan);
    p.write_latency_limit_ms = 2;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    atomic_store(&kvo__file_test_write_delay_us, 20000);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    const void *src = buf;
    kvo_chunk_key k[4] = {key_n(1, 0), key_n(2, 0), key_n(3, 0), key_n(4, 0)};
    int r = 1;
    ASSERT_OK(kvo_file_tier_write(t, &k[0], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000))); /* latency now ~20 ms */
    /* k[1] takes 300 ms, so it is surely still queued when k[2] arrives,
     * however slow this machine (sanitizers, parallel tests) is. */
    atomic_store(&kvo__file_test_write_delay_us, 300000);
    ASSERT_OK(kvo_file_tier_write(t, &k[1], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, 0); /* nothing queued: admitted */
    ASSERT_OK(kvo_file_tier_write(t, &k[2], &src, 1, NULL, &r, NULL));
    ASSERT_EQ_INT(r, KVO_EAGAIN); /* k[1] still queued and writes are slow */
    atomic_store(&kvo__file_test_write_delay_us, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_EQ_U64(s.dropped_backpressure, 1);
    ASSERT_GT_U64(s.write_latency_ns, 2000000);
    ASSERT_EQ_U64(s.writes, 2);
    free(buf);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Several threads write, read, look up, touch and remove on one tier with a
 * quota small enough to evict all the time (and ThreadSanitizer watching):
 * every successful read has exactly the key's bytes, nothing is corrupt, the
 * quota holds. */
typedef struct conc_ctx {
    kvo_file_tier *t;
    const kvo_plan *plan;
    int id;
    int failures;
    uint64_t reads_ok;
} conc_ctx;

static uint64_t conc_rand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void *conc_writer(void *arg) {
    conc_ctx *c = arg;
    uint64_t seed = (uint64_t)c->id * 977 + 1;
    const kvo_group_plan *g0 = kvo_plan_group(c->plan, 0);
    unsigned char *buf = malloc(g0->chunk_bytes);
    for (int i = 0; i < 150; i++) {
        kvo_chunk_key k = key_n(conc_rand(&seed) % 40, (uint32_t)(conc_rand(&seed) % 2));
        const kvo_group_plan *g = kvo_plan_group(c->plan, k.group);
        fill_key(buf, g->chunk_bytes, &k);
        const void *src = buf;
        int r = 0;
        if (kvo_file_tier_write(c->t, &k, &src, 1, NULL, &r, NULL)) c->failures++;
        if (r != 0 && r != KVO_EEXIST && r != KVO_EAGAIN && r != KVO_ENOSPC) c->failures++;
        if (i % 10 == 0) {
            uint8_t st;
            kvo_file_tier_lookup(c->t, &k, 1, &st);
            kvo_file_tier_touch(c->t, &k, 1);
        }
        if (i % 37 == 0) kvo_file_tier_remove(c->t, &k, 1); /* may be busy: fine */
    }
    free(buf);
    return NULL;
}

static void *conc_reader(void *arg) {
    conc_ctx *c = arg;
    uint64_t seed = 4242;
    const kvo_group_plan *g0 = kvo_plan_group(c->plan, 0);
    unsigned char *dst = aligned_buf(g0->slot_bytes);
    unsigned char *want = malloc(g0->chunk_bytes);
    for (int i = 0; i < 200; i++) {
        kvo_chunk_key k = key_n(conc_rand(&seed) % 40, (uint32_t)(conc_rand(&seed) % 2));
        void *d = dst;
        int r = 0;
        if (kvo_file_tier_read(c->t, &k, &d, 1, NULL, &r, NULL)) c->failures++;
        if (r != 0) continue; /* miss or pending */
        kvo_file_completion comp;
        size_t got = 0;
        while (!got) {
            kvo_file_tier_wait(c->t, KVO_MS(1000));
            ASSERT_OK(kvo_file_tier_poll(c->t, &comp, 1, &got));
        }
        if (comp.result == 0) {
            const kvo_group_plan *g = kvo_plan_group(c->plan, k.group);
            fill_key(want, g->chunk_bytes, &k);
            if (memcmp(dst, want, g->chunk_bytes) != 0) c->failures++;
            c->reads_ok++;
        } else if (comp.result != KVO_ENOTFOUND) {
            c->failures++; /* never corrupt, never an I/O error */
        }
    }
    free(want);
    free(dst);
    return NULL;
}

KVO_TEST(concurrent_threads) {
    kvo_plan *plan = make_plan("ft-conc", 6000);
    const kvo_group_plan *g0 = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("conc"), plan);
    p.quota_bytes = 12 * g0->slot_bytes;
    p.io_threads = 3;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { NW = 3 };
    pthread_t th[NW + 1];
    conc_ctx ctx[NW + 1];
    for (int i = 0; i <= NW; i++) {
        ctx[i] = (conc_ctx){t, plan, i, 0, 0};
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, i < NW ? conc_writer : conc_reader, &ctx[i]), 0);
    }
    for (int i = 0; i <= NW; i++) pthread_join(th[i], NULL);
    for (int i = 0; i <= NW; i++) ASSERT_EQ_INT(ctx[i].failures, 0);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    /* The writers may outrun the disk so far that every write found the
     * quota full of pending writes (dropped with ENOSPC, no eviction): write
     * more keys one at a time so the quota surely turns over. */
    unsigned char *buf = malloc(g0->chunk_bytes);
    for (uint64_t i = 100; i < 100 + 16; i++) {
        kvo_chunk_key k = key_n(i, 0);
        fill_key(buf, g0->chunk_bytes, &k);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
        ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    }
    free(buf);
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.bytes_used, p.quota_bytes);
    ASSERT_EQ_U64(s.corrupt_removed, 0);
    ASSERT_GT_U64(s.writes, 0);
    ASSERT_GT_U64(s.evictions, 0);
    /* every indexed key reads back right after all that churn */
    for (uint64_t i = 0; i < 40; i++)
        for (uint32_t gi = 0; gi < 2; gi++) {
            kvo_chunk_key k = key_n(i, gi);
            uint8_t st;
            ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
            if (st == KVO_READY) ASSERT_EQ_INT(read_key(t, plan, &k, true), 0);
        }
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* Engine blocks -> transfer -> host slot -> file; restart; file -> host slot
 * -> transfer -> other engine blocks: byte-exact, nothing else touched.  The
 * tier is namespaced by the engine's slot layout hash too. */
static void xfer_wait(kvo_transfer *x, uint64_t job) {
    ASSERT_OK(kvo_transfer_wait(x, &job, 1, -1));
    kvo_xfer_result r;
    size_t n = 0;
    ASSERT_OK(kvo_transfer_poll(x, &r, 1, &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_EQ_INT(r.status, 0);
}

static int wait_read(kvo_file_tier *t) {
    kvo_file_completion c;
    size_t got = 0;
    while (!got) {
        kvo_file_tier_wait(t, KVO_MS(5000));
        ASSERT_OK(kvo_file_tier_poll(t, &c, 1, &got));
    }
    return c.result;
}

KVO_TEST(round_trip_engine_transfer_file) {
    kvo_plan *plan = make_plan("ft-xfer", 5000);
    const kvo_group_plan *gf = kvo_plan_group(plan, 0), *gs = kvo_plan_group(plan, 1);
    enum { NB = 8 };
    /* engine memory: group 0 as two per-layer tensors, group 1 as one */
    uint64_t bytes0 = NB * gf->page_bytes, bytes1 = NB * gs->page_bytes;
    unsigned char *src = malloc(2 * bytes0 + bytes1), *dst = malloc(2 * bytes0 + bytes1);
    for (uint64_t i = 0; i < 2 * bytes0 + bytes1; i++) src[i] = (unsigned char)(kvo_test_rand() >> 56);
    memset(dst, 0xab, 2 * bytes0 + bytes1);
    kvo_segment seg_src[3] = {{0, src, NB, gf->page_bytes, gf->page_bytes},
                              {0, src + bytes0, NB, gf->page_bytes, gf->page_bytes},
                              {1, src + 2 * bytes0, NB, gs->page_bytes, gs->page_bytes}};
    kvo_segment seg_dst[3] = {{0, dst, NB, gf->page_bytes, gf->page_bytes},
                              {0, dst + bytes0, NB, gf->page_bytes, gf->page_bytes},
                              {1, dst + 2 * bytes0, NB, gs->page_bytes, gs->page_bytes}};
    kvo_transfer_params xp = kvo_transfer_default_params();
    xp.plan = plan;
    kvo_transfer *x1 = NULL, *x2 = NULL;
    ASSERT_OK(kvo_transfer_create(&xp, &x1));
    ASSERT_OK(kvo_transfer_create(&xp, &x2));
    ASSERT_OK(kvo_transfer_set_layout(x1, seg_src, 3));
    ASSERT_OK(kvo_transfer_set_layout(x2, seg_dst, 3));
    uint64_t lh = 0;
    ASSERT_OK(kvo_transfer_layout_hash(x1, &lh));

    /* store: group 0 blocks {1,2}, group 1 blocks {6,7} into host slots */
    unsigned char *slot0 = aligned_buf(gf->slot_bytes), *slot1 = aligned_buf(gs->slot_bytes);
    uint64_t b0[2] = {1, 2}, b1[2] = {6, 7};
    kvo_xfer_op ops[2] = {{0, 0, 2, b0, slot0, gf->slot_bytes}, {1, 0, 2, b1, slot1, gs->slot_bytes}};
    uint64_t job = 0;
    ASSERT_OK(kvo_transfer_submit(x1, KVO_XFER_STORE, ops, 2, &job));
    xfer_wait(x1, job);

    kvo_file_tier_params p = params(subdir("xfer"), plan);
    p.layout_hash = lh;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    char lhx[17];
    snprintf(lhx, sizeof lhx, "%016llx", (unsigned long long)lh);
    ASSERT_CONTAINS(kvo_file_tier_dir(t), lhx);
    kvo_chunk_key keys[2] = {key_n(77, 0), key_n(78, 1)};
    const void *srcs[2] = {slot0, slot1};
    int res[2];
    ASSERT_OK(kvo_file_tier_write(t, keys, srcs, 2, NULL, res, NULL));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(res[1], 0);
    memset(slot0, 0x11, gf->slot_bytes); /* the tier copied: reuse at once */
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
    kvo_file_tier_destroy(t);

    /* another slot layout sees nothing of it */
    kvo_file_tier_params p2 = p;
    p2.layout_hash = lh ^ 1;
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    uint8_t st[2];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 2, st));
    ASSERT_EQ_INT(st[0], KVO_MISS);
    kvo_file_tier_destroy(t);

    /* restart; file -> fresh host slots -> the other engine's blocks */
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    ASSERT_OK(kvo_file_tier_lookup(t, keys, 2, st));
    ASSERT_EQ_INT(st[0], KVO_READY);
    ASSERT_EQ_INT(st[1], KVO_READY);
    unsigned char *in0 = aligned_buf(gf->slot_bytes), *in1 = aligned_buf(gs->slot_bytes);
    void *dsts[2] = {in0, in1};
    ASSERT_OK(kvo_file_tier_read(t, keys, dsts, 2, NULL, res, NULL));
    ASSERT_EQ_INT(res[0], 0);
    ASSERT_EQ_INT(wait_read(t), 0);
    ASSERT_EQ_INT(wait_read(t), 0);
    uint64_t d0[2] = {5, 3}, d1[2] = {0, 4};
    kvo_xfer_op lops[2] = {{0, 0, 2, d0, in0, gf->slot_bytes}, {1, 0, 2, d1, in1, gs->slot_bytes}};
    ASSERT_OK(kvo_transfer_submit(x2, KVO_XFER_LOAD, lops, 2, &job));
    xfer_wait(x2, job);
    /* every target page equals its source page; every other byte untouched */
    for (int s = 0; s < 3; s++) {
        const kvo_segment *a = &seg_src[s], *b = &seg_dst[s];
        const uint64_t *from = s < 2 ? b0 : b1, *to = s < 2 ? d0 : d1;
        for (uint64_t blk = 0; blk < NB; blk++) {
            const unsigned char *got = (const unsigned char *)b->base + blk * b->block_stride;
            int k = blk == to[0] ? 0 : blk == to[1] ? 1 : -1;
            if (k >= 0) {
                ASSERT_MEM_EQ(got, (const unsigned char *)a->base + from[k] * a->block_stride, a->page_bytes);
            } else {
                for (uint64_t i = 0; i < b->page_bytes; i++)
                    if (got[i] != 0xab) FAILF("segment %d block %llu byte %llu was touched", s,
                                              (unsigned long long)blk, (unsigned long long)i);
            }
        }
    }
    /* a file copied into another slot layout's namespace does not load there */
    char from[KVO__FILE_PATH_MAX], to[KVO__FILE_PATH_MAX];
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[1], from, sizeof from));
    kvo_file_tier_destroy(t);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[1], to, sizeof to));
    kvo_file_tier_destroy(t);
    char cmd[3 * KVO__FILE_PATH_MAX];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\" && cp '%s' '%s'", to, from, to);
    ASSERT_EQ_INT(kvo_test_run(cmd, NULL), 0);
    ASSERT_OK(kvo_file_tier_create(&p2, &t));
    ASSERT_EQ_INT(read_key(t, plan, &keys[1], true), KVO_ECORRUPT);
    kvo_file_tier_stats fs = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &fs));
    ASSERT_EQ_U64(fs.corrupt_removed, 1);
    kvo_file_tier_destroy(t);
    kvo_transfer_destroy(x1);
    kvo_transfer_destroy(x2);
    free(in0);
    free(in1);
    free(slot0);
    free(slot1);
    free(src);
    free(dst);
    kvo_plan_destroy(plan);
}

KVO_TEST(quota_max_files) {
    kvo_plan *plan = make_plan("ft-maxf", 3000);
    kvo_file_tier_params p = params(subdir("maxf"), plan);
    p.max_files = 3;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    kvo_chunk_key keys[8];
    for (int i = 0; i < 8; i++) {
        keys[i] = key_n((uint64_t)i + 800, (uint32_t)(i % 2));
        write_keys(t, plan, &keys[i], 1);
    }
    kvo_file_tier_stats s = KVO_FILE_TIER_STATS_INIT;
    ASSERT_OK(kvo_file_tier_get_stats(t, &s));
    ASSERT_LE_U64(s.files, 3);
    ASSERT_EQ_U64(s.evictions, 8 - s.files);
    ASSERT_EQ_INT(read_key(t, plan, &keys[7], true), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

/* After a restart the eviction order follows the files' age, not directory
 * order: with room for three, the three most recently used files stay. */
KVO_TEST(restart_keeps_newest) {
    kvo_plan *plan = make_plan("ft-age", 4000);
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    kvo_file_tier_params p = params(subdir("age"), plan);
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    enum { N = 8 };
    kvo_chunk_key keys[N];
    for (int i = 0; i < N; i++) keys[i] = key_n((uint64_t)i * 31 + 5, 0);
    write_keys(t, plan, keys, N);
    /* ages: a permutation, so that directory order cannot give the answer */
    static const int age_rank[N] = {5, 0, 7, 2, 6, 1, 4, 3}; /* higher = newer */
    time_t now = time(NULL);
    for (int i = 0; i < N; i++) {
        char path[KVO__FILE_PATH_MAX];
        ASSERT_OK(kvo_file_chunk_path(kvo_file_tier_dir(t), &keys[i], path, sizeof path));
        struct timespec ts[2] = {{now - 1000 + age_rank[i] * 10, 0}, {now - 1000 + age_rank[i] * 10, 0}};
        ASSERT_EQ_INT(utimensat(AT_FDCWD, path, ts, 0), 0);
    }
    kvo_file_tier_destroy(t);
    p.quota_bytes = 3 * g->slot_bytes;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    uint8_t st[N];
    ASSERT_OK(kvo_file_tier_lookup(t, keys, N, st));
    for (int i = 0; i < N; i++)
        if ((st[i] == KVO_READY) != (age_rank[i] >= N - 3))
            FAILF("key %d (age rank %d): state %d", i, age_rank[i], st[i]);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
}

KVO_TEST(fsync_policies) {
    kvo_plan *plan = make_plan("ft-fsync", 5000);
    for (int pol = KVO_FILE_FSYNC_NONE; pol <= KVO_FILE_FSYNC_FULL; pol++) {
        char name[32];
        snprintf(name, sizeof name, "fsync%d", pol);
        kvo_file_tier_params p = params(subdir(name), plan);
        p.fsync = (kvo_file_fsync_policy)pol;
        kvo_file_tier *t = NULL;
        ASSERT_OK(kvo_file_tier_create(&p, &t));
        kvo_chunk_key k[2] = {key_n(1, 0), key_n(2, 1)};
        write_keys(t, plan, k, 2);
        ASSERT_EQ_INT(read_key(t, plan, &k[0], true), 0);
        ASSERT_EQ_INT(read_key(t, plan, &k[1], false), 0);
        kvo_file_tier_destroy(t);
    }
    ASSERT_EQ_STR(kvo_file_fsync_name(KVO_FILE_FSYNC_FULL), "full");
    ASSERT_EQ_STR(kvo_file_io_name(KVO_FILE_IO_THREADS), "threads");
    kvo_file_tier_params bad = params(subdir("badp"), plan);
    bad.fsync = (kvo_file_fsync_policy)7;
    kvo_file_tier *t = NULL;
    ASSERT_ERR(kvo_file_tier_create(&bad, &t), KVO_EINVAL);
    kvo_plan_destroy(plan);
}

KVO_TEST(temp_stale_rule) {
    char old[1100], fresh[1100], other[1100];
    snprintf(old, sizeof old, "%s", subdir(".tmp.0badc0de.12345.00000001.1"));
    snprintf(fresh, sizeof fresh, "%s", subdir(".tmp.0badc0de.12345.00000001.2"));
    snprintf(other, sizeof other, "%s", subdir("notatemp"));
    const char *paths[3] = {old, fresh, other};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(paths[i], "w");
        ASSERT_NOT_NULL(f);
        fclose(f);
    }
    struct timespec ts[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    ASSERT_EQ_INT(utimensat(AT_FDCWD, old, ts, 0), 0);
    /* another host's writer (host id 0badc0de): judged by age */
    ASSERT_EQ_INT(kvo_file_temp_stale(old), 1);
    ASSERT_EQ_INT(kvo_file_temp_stale(fresh), 0);
    ASSERT_ERR(kvo_file_temp_stale(other), KVO_EINVAL);
    ASSERT_ERR(kvo_file_temp_stale(NULL), KVO_EINVAL);
}
