/* File tier: one namespace shared by several processes (params.shared;
 * issue 47 "one file root shared by several processes", issue 50 item 7).
 * Each test forks processes that open the same root: they share one quota
 * (the sum of their files stays within it, and one that holds nothing to
 * evict still gets room), a restart of all of them keeps everything, the
 * quota and its clamp to the file system are agreed once per namespace, a
 * file is counted once however many processes write or evict it, a process
 * killed mid-write leaves nothing counted for good, and a namespace where no
 * file can be created still opens and serves reads.
 *
 * Processes meet at barriers in a shared anonymous mapping (waits bounded,
 * on conditions); children report their statistics there and exit with
 * their test status. */
#include "kvo_test.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "file_tier_fixture.h"

enum { MAXP = 4 };

typedef struct box {
    atomic_int arrived[8];
    atomic_int go;
    kvo_file_tier_stats st[MAXP];
    uint64_t hits[MAXP], reads_ok[MAXP];
    uint64_t disk_bytes[MAXP], disk_files[MAXP];
    uint64_t acct_bytes[MAXP], acct_files[MAXP];
    int log_lines[MAXP];
    char log_last[MAXP][512];
    char ns[KVO__FILE_PATH_MAX];
} box;

static box *box_new(void) {
    box *b = mmap(NULL, sizeof(box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(b != MAP_FAILED);
    memset(b, 0, sizeof *b);
    return b;
}

/* Every one of n processes arrives at barrier i; waits (bounded) for all. */
static void barrier(box *b, int i, int n) {
    atomic_fetch_add(&b->arrived[i], 1);
    for (int spin = 0; atomic_load(&b->arrived[i]) < n; spin++) {
        if (spin > 120000) FAILF("barrier %d: %d of %d processes after 2 minutes", i, atomic_load(&b->arrived[i]), n);
        poll(NULL, 0, 1);
    }
}

/* Run fn(b, i, arg) in n forked processes (barriers start afresh); every
 * one must exit 0. */
static void run_procs(box *b, int n, void (*fn)(box *, int, void *), void *arg) {
    pid_t pids[MAXP];
    for (int i = 0; i < 8; i++) atomic_store(&b->arrived[i], 0);
    fflush(NULL);
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        ASSERT_TRUE(pids[i] >= 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed test ends its processes */
            fn(b, i, arg);
            _exit(0);
        }
    }
    for (int i = 0; i < n; i++) {
        int st = 0;
        ASSERT_EQ_INT(waitpid(pids[i], &st, 0), pids[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            FAILF("process %d ended with %s %d", i, WIFEXITED(st) ? "status" : "signal",
                  WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
}

/* Chunk files of a namespace on disk: their payload bytes (file size less
 * the header, what the quota counts) and count. */
typedef struct disk_count {
    uint64_t bytes, files;
} disk_count;

static int count_visit(const kvo_file_walk_entry *e, void *arg) {
    disk_count *d = arg;
    if (e->kind != KVO_FILE_WALK_CHUNK || !e->have_stat || !e->is_regular) return 0;
    d->bytes += e->file_bytes - KVO_FILE_HEADER_BYTES;
    d->files++;
    return 0;
}

static disk_count disk_usage(const char *ns) {
    disk_count d = {0, 0};
    ASSERT_OK(kvo_file_walk(ns, KVO_FILE_WALK_STAT, count_visit, &d));
    return d;
}

/* One process's tier on root (shared), quota in slots of group 0. */
typedef struct setup {
    const char *root;
    kvo_plan *plan;
    uint64_t quota_slots;
    uint64_t quota_bytes;  /* overrides quota_slots when set */
    uint64_t key_base[MAXP];
    uint64_t n_keys;
    bool then_together;    /* quota_child: then both write n_keys more at once */
} setup;

static kvo_file_tier *open_shared(const setup *s, box *b, int i) {
    kvo_file_tier_params p = ftf_params(s->root, s->plan);
    p.shared = true;
    p.quota_bytes = s->quota_bytes ? s->quota_bytes : s->quota_slots * kvo_plan_group(s->plan, 0)->slot_bytes;
    kvo_file_tier *t = NULL;
    ASSERT_OK(kvo_file_tier_create(&p, &t));
    if (i == 0) snprintf(b->ns, sizeof b->ns, "%s", kvo_file_tier_dir(t));
    return t;
}

/* Write keys base..base+n-1 of group 0, one at a time, flushed; results
 * other than 0 (queued), EEXIST (another process wrote it) and ENOSPC
 * (counted: no room) fail the test. */
static void write_range(kvo_file_tier *t, const kvo_plan *plan, uint64_t base, uint64_t n) {
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t i = 0; i < n; i++) {
        kvo_chunk_key k = ftf_key(base + i, 0);
        ftf_fill(buf, g->chunk_bytes, &k);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL));
        if (r == KVO_EAGAIN) {
            ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
            ASSERT_OK(kvo_file_tier_write(t, &k, &src, 1, NULL, &r, NULL));
        }
        if (r != 0 && r != KVO_EEXIST && r != KVO_ENOSPC) FAILF("write of key %llu: %d", (unsigned long long)i, r);
    }
    free(buf);
    ASSERT_OK(kvo_file_tier_flush(t, KVO_MS(20000)));
}

/* Look up and read keys base..base+n-1: *hits READY, *ok read back exactly. */
static void read_range(kvo_file_tier *t, const kvo_plan *plan, uint64_t base, uint64_t n, uint64_t *hits,
                       uint64_t *ok) {
    for (uint64_t i = 0; i < n; i++) {
        kvo_chunk_key k = ftf_key(base + i, 0);
        uint8_t st;
        ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &st));
        if (st != KVO_READY) continue;
        (*hits)++;
        int r = ftf_read_key(t, plan, &k, true);
        if (r == 0) (*ok)++;
        else if (r != KVO_ENOTFOUND) FAILF("read of key %llu: %d (never corrupt)", (unsigned long long)(base + i), r);
    }
}

static void report(box *b, int i, kvo_file_tier *t) {
    b->st[i].struct_size = sizeof b->st[i];
    ASSERT_OK(kvo_file_tier_get_stats(t, &b->st[i]));
}

/* Quiet now (every process flushed): statistics and the disk into slot i,
 * then (n > 0: once all n processes looked, at barrier bar) close. */
static void report_and_close(box *b, int i, kvo_file_tier *t, int bar, int n) {
    report(b, i, t);
    disk_count d = disk_usage(kvo_file_tier_dir(t));
    b->disk_bytes[i] = d.bytes;
    b->disk_files[i] = d.files;
    if (n) barrier(b, bar, n);
    kvo_file_tier_destroy(t);
}

/* ------------------------------------------------------ one shared quota -- */

/* Both attach; the first writes n distinct keys, then the second (whose
 * index holds none of the first's files: it scanned an empty namespace), so
 * that together they write more than the quota; with then_together both
 * write n more at once.  Then, quiet, both compare the shared count with the
 * disk. */
static void quota_child(box *b, int i, void *arg) {
    setup *s = arg;
    kvo_file_tier *t = open_shared(s, b, i);
    barrier(b, 0, 2);
    if (i == 0) write_range(t, s->plan, s->key_base[i], s->n_keys);
    barrier(b, 1, 2);
    if (i == 1) write_range(t, s->plan, s->key_base[i], s->n_keys);
    barrier(b, 2, 2);
    if (s->then_together) write_range(t, s->plan, s->key_base[i] + 500, s->n_keys);
    barrier(b, 3, 2);
    report_and_close(b, i, t, 4, 2);
}

/* Two processes, 24 + 24 chunks each, a shared quota of 10: before the
 * shared accounting each kept 10 of its own (20 files, twice the quota). */
KVO_TEST(two_processes_share_one_quota) {
    box *b = box_new();
    setup s = {.root = ftf_subdir("q"), .plan = ftf_plan("ft-share-q", 8192, false), .quota_slots = 10,
               .key_base = {0, 1000}, .n_keys = 24, .then_together = true};
    const uint64_t slot = kvo_plan_group(s.plan, 0)->slot_bytes, quota = s.quota_slots * slot;
    run_procs(b, 2, quota_child, &s);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_U64(b->st[i].shared, 1);
        ASSERT_EQ_U64(b->st[i].quota_bytes, quota);
        /* on disk, within the one quota, and what the accounting says */
        ASSERT_LE_U64(b->disk_bytes[i], quota);
        ASSERT_EQ_U64(b->st[i].shared_bytes_used, b->disk_bytes[i]);
        ASSERT_EQ_U64(b->st[i].shared_files, b->disk_files[i]);
        /* both wrote: the one that came second made room from the other's
         * files, which its index never held */
        ASSERT_GT_U64(b->st[i].writes, 0);
        ASSERT_EQ_U64(b->st[i].dropped_nospace, 0);
    }
    ASSERT_GT_U64(b->disk_files[0], 0);
    /* the second made room from files its index never held */
    ASSERT_GT_U64(b->st[1].foreign_evictions, 0);
    kvo_plan_destroy(s.plan);
}

/* -------------------------------------------------- a restart keeps all -- */

static void restart_child(box *b, int i, void *arg) {
    setup *s = arg;
    barrier(b, 3, 2); /* both open at once */
    kvo_file_tier *t = open_shared(s, b, i);
    barrier(b, 4, 2);
    /* every file, whoever wrote it */
    read_range(t, s->plan, s->key_base[0], s->n_keys, &b->hits[i], &b->reads_ok[i]);
    read_range(t, s->plan, s->key_base[1], s->n_keys, &b->hits[i], &b->reads_ok[i]);
    report(b, i, t);
    barrier(b, 5, 2);
    kvo_file_tier_destroy(t);
}

/* One process opens (with the setup's quota), reports, closes. */
static void reopen_child(box *b, int i, void *arg) {
    kvo_file_tier *t = open_shared(arg, b, 1);
    report(b, i, t);
    kvo_file_tier_destroy(t);
}

/* Two ranks write 40 chunks each under a shared quota of 60, then both
 * restart at once: every file written survives the restart and each rank
 * hits all of them (before: 80 files on disk, then each rank's scan took in
 * the other's files and evicted down to its own 60, and reads raced the
 * other rank's evictions). */
KVO_TEST(restart_of_all_ranks_keeps_every_file) {
    box *b = box_new();
    setup s = {.root = ftf_subdir("r"), .plan = ftf_plan("ft-share-r", 8192, false), .quota_slots = 60,
               .key_base = {0, 5000}, .n_keys = 40};
    const uint64_t slot = kvo_plan_group(s.plan, 0)->slot_bytes;
    run_procs(b, 2, quota_child, &s);
    uint64_t before = b->disk_files[0];
    ASSERT_LE_U64(b->disk_bytes[0], s.quota_slots * slot);
    ASSERT_GT_U64(before, s.quota_slots / 2);
    run_procs(b, 2, restart_child, &s);
    disk_count after = disk_usage(b->ns);
    ASSERT_EQ_U64(after.files, before);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_U64(b->st[i].scan_removed, 0);
        ASSERT_EQ_U64(b->st[i].evictions, 0);
        ASSERT_EQ_U64(b->hits[i], before);
        ASSERT_EQ_U64(b->reads_ok[i], before);
    }
    /* a restart with a smaller quota: the scan evicts down to it, oldest
     * first, and the count follows */
    s.quota_slots = 20;
    run_procs(b, 1, reopen_child, &s);
    after = disk_usage(b->ns);
    ASSERT_EQ_U64(after.files, 20);
    ASSERT_EQ_U64(b->st[0].scan_removed, before - 20);
    ASSERT_EQ_U64(b->st[0].shared_bytes_used, after.bytes);
    ASSERT_EQ_U64(b->st[0].files, 20);
    kvo_plan_destroy(s.plan);
}

/* ------------------------------------------------------ agreed quota -- */

typedef struct log_sink {
    int lines;
    char last[512];
} log_sink;

static void sink_fn(kvo_log_level level, const char *msg, void *ctx) {
    (void)level;
    log_sink *s = ctx;
    s->lines++;
    snprintf(s->last, sizeof s->last, "%s", msg);
}

static void agree_child(box *b, int i, void *arg) {
    setup *s = arg;
    setup mine = *s;
    mine.quota_slots = i == 0 ? s->quota_slots : 2 * s->quota_slots; /* the second asks for twice as much */
    log_sink ls = {0};
    if (i == 1) barrier(b, 0, 2); /* after the first attached */
    ASSERT_OK(kvo_set_log(sink_fn, &ls, KVO_LOG_WARN));
    kvo_file_tier *t = open_shared(&mine, b, i);
    b->log_lines[i] = ls.lines;
    snprintf(b->log_last[i], sizeof b->log_last[i], "%s", ls.last);
    if (i == 0) barrier(b, 0, 2);
    write_range(t, s->plan, s->key_base[i], s->n_keys);
    barrier(b, 1, 2);
    report(b, i, t);
    barrier(b, 2, 2);
    kvo_file_tier_destroy(t);
    ASSERT_OK(kvo_set_log(NULL, NULL, KVO_LOG_WARN));
}

/* The first process records its quota; a second one configured with twice
 * as much uses the recorded one (and says so once); once both are gone, the
 * next process records its own. */
KVO_TEST(quota_recorded_by_first_process) {
    box *b = box_new();
    setup s = {.root = ftf_subdir("a"), .plan = ftf_plan("ft-share-a", 8192, false), .quota_slots = 8,
               .key_base = {0, 7000}, .n_keys = 12};
    const uint64_t slot = kvo_plan_group(s.plan, 0)->slot_bytes;
    run_procs(b, 2, agree_child, &s);
    ASSERT_EQ_U64(b->st[0].quota_bytes, 8 * slot);
    ASSERT_EQ_U64(b->st[1].quota_bytes, 8 * slot);
    ASSERT_EQ_INT(b->log_lines[0], 0);
    ASSERT_EQ_INT(b->log_lines[1], 1);
    ASSERT_CONTAINS(b->log_last[1], "differs from the shared quota");
    ASSERT_LE_U64(disk_usage(b->ns).bytes, 8 * slot);
    s.quota_slots = 16;
    run_procs(b, 1, reopen_child, &s);
    ASSERT_EQ_U64(b->st[0].quota_bytes, 16 * slot);
    kvo_plan_destroy(s.plan);
}

/* ---------------------------------------- the clamp, once per namespace -- */

static void disk_child(box *b, int i, void *arg) {
    setup *s = arg;
    if (i == 1) barrier(b, 0, 2);
    kvo_file_tier *t = open_shared(s, b, i);
    if (i == 0) {
        write_range(t, s->plan, s->key_base[i], 4); /* some files before the second opens */
        barrier(b, 0, 2);
    }
    /* both write three times what the disk holds, interleaved */
    for (int round = 0; round < 12; round++)
        write_range(t, s->plan, s->key_base[i] + 100 + (uint64_t)round * s->n_keys, s->n_keys);
    barrier(b, 2, 2);
    report(b, i, t);
    barrier(b, 3, 2);
    kvo_file_tier_destroy(t);
}

/* A 2 MiB tmpfs and two processes each configured with 1 GiB: the quota is
 * clamped to the disk once, for both (before, each clamped to the whole free
 * disk on its own, and once the disk was full every write failed with
 * ENOSPC and nothing was evicted). */
KVO_TEST(clamp_to_disk_shared_by_processes) {
    kvo_plan *plan = ftf_plan("ft-share-d", 8192, false);
    const char *mnt = ftf_small_tmpfs("mnt", "2m", plan);
    box *b = box_new();
    setup s = {.root = mnt, .plan = plan, .quota_bytes = 1ull << 30, .key_base = {0, 100000}, .n_keys = 8};
    run_procs(b, 2, disk_child, &s);
    umount2(mnt, MNT_DETACH);
    ASSERT_LT_U64(b->st[0].quota_bytes, 2u << 20);
    ASSERT_EQ_U64(b->st[1].quota_bytes, b->st[0].quota_bytes);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_U64(b->st[i].dropped_nospace, 0);
        ASSERT_GT_U64(b->st[i].evictions, 0);
        ASSERT_GT_U64(b->st[i].writes, 12 * s.n_keys / 2);
    }
    kvo_plan_destroy(plan);
}

/* ------------------------------------------ counted once, by whom made it -- */

static void same_keys_child(box *b, int i, void *arg) {
    setup *s = arg;
    kvo_file_tier *t = open_shared(s, b, i);
    barrier(b, 0, 3);
    /* the same keys from all three at once, three passes, more than the quota */
    for (int pass = 0; pass < 3; pass++) write_range(t, s->plan, s->key_base[0] + (uint64_t)pass * 7, s->n_keys);
    barrier(b, 1, 3);
    report_and_close(b, i, t, 2, 3);
}

/* Three processes write and evict the same keys at once: each file is
 * counted by the one link that made its name and un-counted by the one
 * unlink that removed it, so the shared count equals the disk exactly. */
KVO_TEST(same_keys_from_three_processes_counted_once) {
    box *b = box_new();
    setup s = {.root = ftf_subdir("same"), .plan = ftf_plan("ft-share-s", 8192, false), .quota_slots = 16,
               .key_base = {0}, .n_keys = 30};
    const uint64_t slot = kvo_plan_group(s.plan, 0)->slot_bytes;
    run_procs(b, 3, same_keys_child, &s);
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ_U64(b->st[i].shared_bytes_used, b->disk_bytes[i]);
        ASSERT_EQ_U64(b->st[i].shared_files, b->disk_files[i]);
        ASSERT_LE_U64(b->disk_bytes[i], s.quota_slots * slot);
    }
    ASSERT_GT_U64(b->st[0].write_skipped + b->st[1].write_skipped + b->st[2].write_skipped, 0);
    kvo_plan_destroy(s.plan);
}

/* ----------------------------------------------- a process killed mid-write -- */

static void crash_writer(box *b, int i, void *arg) {
    setup *s = arg;
    (void)i;
    kvo_file_tier *t = open_shared(s, b, 0);
    atomic_store(&kvo__file_test_write_delay_us, 2000000); /* its writes stay in flight */
    const kvo_group_plan *g = kvo_plan_group(s->plan, 0);
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t k = 0; k < 6; k++) {
        kvo_chunk_key key = ftf_key(90000 + k, 0);
        ftf_fill(buf, g->chunk_bytes, &key);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &key, &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, 0);
    }
    report(b, 2, t);
    atomic_store(&b->go, 1);
    for (;;) pause(); /* killed here, writes in flight */
}

static void crash_bystander(box *b, int i, void *arg) {
    setup *s = arg;
    (void)i;
    kvo_file_tier *t = open_shared(s, b, 1);
    write_range(t, s->plan, 0, 4);
    atomic_store(&b->arrived[6], 1); /* attached, idle */
    for (int spin = 0; !atomic_load(&b->arrived[7]); spin++) {
        if (spin > 120000) FAILF("bystander: never released");
        poll(NULL, 0, 1);
    }
    report_and_close(b, 1, t, 0, 0);
}

static void late_child(box *b, int i, void *arg) {
    setup *s = arg;
    (void)i;
    report_and_close(b, 3, open_shared(s, b, 3), 0, 0);
}

static pid_t fork_fn(box *b, void (*fn)(box *, int, void *), void *arg) {
    fflush(NULL);
    pid_t p = fork();
    ASSERT_TRUE(p >= 0);
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        fn(b, 0, arg);
        _exit(0);
    }
    return p;
}

/* A process is killed with writes reserved in the shared quota while
 * another stays attached (so nobody recounts from scratch): the next
 * process to attach takes the dead one's reservations back, and the count
 * is the disk's again. */
KVO_TEST(killed_writer_reservations_taken_back) {
    box *b = box_new();
    setup s = {.root = ftf_subdir("k"), .plan = ftf_plan("ft-share-k", 8192, false), .quota_slots = 32};
    pid_t by = fork_fn(b, crash_bystander, &s);
    for (int spin = 0; !atomic_load(&b->arrived[6]); spin++) {
        ASSERT_LT_INT(spin, 120000);
        poll(NULL, 0, 1);
    }
    pid_t w = fork_fn(b, crash_writer, &s);
    for (int spin = 0; !atomic_load(&b->go); spin++) {
        ASSERT_LT_INT(spin, 120000);
        poll(NULL, 0, 1);
    }
    ASSERT_GT_U64(b->st[2].shared_bytes_used, 4 * kvo_plan_group(s.plan, 0)->slot_bytes); /* reserved */
    kill(w, SIGKILL);
    int st = 0;
    ASSERT_EQ_INT(waitpid(w, &st, 0), w);
    run_procs(b, 1, late_child, &s);
    ASSERT_EQ_U64(b->st[3].shared_bytes_used, b->disk_bytes[3]);
    atomic_store(&b->arrived[7], 1);
    ASSERT_EQ_INT(waitpid(by, &st, 0), by);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_EQ_U64(b->st[1].shared_bytes_used, b->disk_bytes[1]);
    kvo_plan_destroy(s.plan);
}

/* --------------------------------------------------- no inodes left -- */

static void noinode_child(box *b, int i, void *arg) {
    setup *s = arg;
    (void)i;
    log_sink ls = {0};
    ASSERT_OK(kvo_set_log(sink_fn, &ls, KVO_LOG_WARN));
    kvo_file_tier *t = open_shared(s, b, 0);
    b->log_lines[0] = ls.lines;
    snprintf(b->log_last[0], sizeof b->log_last[0], "%s", ls.last);
    read_range(t, s->plan, 0, s->n_keys, &b->hits[0], &b->reads_ok[0]);
    /* writes are dropped and counted, with no further log line */
    const kvo_group_plan *g = kvo_plan_group(s->plan, 0);
    unsigned char *buf = calloc(1, g->chunk_bytes);
    for (int k = 0; k < 3; k++) {
        kvo_chunk_key key = ftf_key(40000 + (uint64_t)k, 0);
        const void *src = buf;
        int r = 1;
        ASSERT_OK(kvo_file_tier_write(t, &key, &src, 1, NULL, &r, NULL));
        ASSERT_EQ_INT(r, KVO_ENOSPC);
    }
    b->log_lines[1] = ls.lines;
    report(b, 0, t);
    /* inodes free again: the next write (probing at once here) goes through */
    barrier(b, 0, 2);
    barrier(b, 1, 2);
    atomic_store(&kvo__file_ro_retry_ms, 0);
    kvo_chunk_key key = ftf_key(40000, 0);
    ftf_fill(buf, g->chunk_bytes, &key);
    ftf_write_keys(t, s->plan, &key, 1);
    ASSERT_EQ_INT(ftf_read_key(t, s->plan, &key, true), 0);
    report(b, 1, t);
    free(buf);
    kvo_file_tier_destroy(t);
    ASSERT_OK(kvo_set_log(NULL, NULL, KVO_LOG_WARN));
}

static void fill_child(box *b, int i, void *arg) {
    (void)b;
    (void)i;
    setup *s = arg;
    kvo_file_tier *t = open_shared(s, b, 0);
    write_range(t, s->plan, 0, s->n_keys);
    kvo_file_tier_destroy(t);
}

/* A tmpfs whose inodes are all used: the tier still opens (read-only,
 * logged once), serves the chunks already there and drops writes, counted;
 * once an inode is free again a write goes through (before: create failed
 * with "not writable"). */
KVO_TEST(no_inodes_left_opens_read_only) {
    kvo_plan *plan = ftf_plan("ft-share-i", 8192, false);
    if (geteuid() != 0) {
        kvo_plan_destroy(plan);
        SKIP("needs root to mount a small tmpfs");
    }
    const char *mnt = ftf_subdir("imnt");
    ASSERT_EQ_INT(mkdir(mnt, 0755), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=8m,nr_inodes=400") != 0) {
        kvo_plan_destroy(plan);
        SKIP("cannot mount a tmpfs here: %s", strerror(errno));
    }
    box *b = box_new();
    setup s = {.root = mnt, .plan = plan, .quota_slots = 64, .n_keys = 6};
    run_procs(b, 1, fill_child, &s);
    /* another writer takes every inode left */
    char fill[1200];
    int made = 0;
    for (;; made++) {
        snprintf(fill, sizeof fill, "%s/fill.%d", mnt, made);
        int fd = open(fill, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) break;
        close(fd);
    }
    ASSERT_EQ_INT(errno, ENOSPC);
    pid_t p = fork_fn(b, noinode_child, &s);
    barrier(b, 0, 2);
    for (int k = 0; k < 8 && k < made; k++) { /* free some inodes */
        snprintf(fill, sizeof fill, "%s/fill.%d", mnt, k);
        unlink(fill);
    }
    barrier(b, 1, 2);
    int st = 0;
    ASSERT_EQ_INT(waitpid(p, &st, 0), p);
    umount2(mnt, MNT_DETACH);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_EQ_U64(b->st[0].read_only, 1);
    ASSERT_EQ_U64(b->st[0].dropped_readonly, 3);
    ASSERT_EQ_U64(b->hits[0], s.n_keys);
    ASSERT_EQ_U64(b->reads_ok[0], s.n_keys);
    ASSERT_EQ_INT(b->log_lines[0], 1);
    ASSERT_CONTAINS(b->log_last[0], "read-only");
    ASSERT_EQ_INT(b->log_lines[1], 1);
    ASSERT_EQ_U64(b->st[1].read_only, 0);
    ASSERT_EQ_U64(b->st[1].writes, 1);
    kvo_plan_destroy(plan);
}
