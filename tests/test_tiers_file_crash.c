/* File tier: crash safety (a writer killed with SIGKILL leaves no partial
 * chunk under a chunk name, with O_TMPFILE and with named temporaries, and
 * with a full quota, where every write recycles an evicted file), two
 * processes sharing one root, and which temporaries count as stale.  The
 * plans, keys and helpers are tests/file_tier_fixture.h's. */
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

/* A child process writes in a loop and is killed with SIGKILL; nothing that
 * it left may load with wrong bytes, and its temporary files are cleaned.
 * The child says it started once its first 41 writes (with a full quota:
 * and a recycled file) are on disk, so that the kill always leaves files to
 * check (it used not to under heavy load). */
static void sigkill_during_writes(bool named_temps, uint64_t quota_chunks) {
    atomic_store(&kvo__file_test_no_tmpfile, named_temps);
    kvo_plan *plan = ftf_plan("ft-kill", 20000, true);
    char root[1024], started[1024];
    snprintf(root, sizeof root, "%s", ftf_subdir(quota_chunks ? "killq" : "kill"));
    snprintf(started, sizeof started, "%s", ftf_subdir(quota_chunks ? "killq.started" : "kill.started"));
    kvo_file_tier_params p = ftf_params(root, plan);
    p.max_staging_bytes = 4ull << 20;
    /* a full quota: every write evicts, and the evicted files are recycled
     * (pooled under their names, renamed away and overwritten by writers) */
    if (quota_chunks) p.quota_bytes = quota_chunks * kvo_plan_group(plan, 0)->slot_bytes;
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        kvo_file_tier *t = NULL;
        if (kvo_file_tier_create(&p, &t)) _exit(3);
        const kvo_group_plan *g = kvo_plan_group(plan, 0);
        unsigned char *buf = malloc(g->chunk_bytes);
        bool said = false;
        for (uint64_t i = 0;; i++) {
            kvo_chunk_key k = ftf_key(i, 0);
            ftf_fill(buf, g->chunk_bytes, &k);
            const void *src = buf;
            kvo_file_tier_write(t, &k, &src, 1, NULL, NULL, NULL);
            /* files on disk before the parent's kill, however slow the
             * machine, and with a full quota recycled files among them: a
             * write refused while every quota entry is still being written
             * evicts nothing, so under load the first 41 writes could all
             * miss the pool (the check was at write 40 only: exit 5) */
            if (!said && i >= 40 && i % 20 == 0) {
                if (kvo_file_tier_flush(t, KVO_MS(60000))) _exit(4);
                kvo_file_tier_stats cs = KVO_FILE_TIER_STATS_INIT;
                if (kvo_file_tier_get_stats(t, &cs)) _exit(5);
                if (quota_chunks && cs.recycled_files == 0) {
                    if (i > 20000) _exit(5);
                    continue;
                }
                int fd = open(started, O_CREAT | O_WRONLY, 0644);
                close(fd);
                said = true;
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
    /* with a full quota the scan keeps the newest files within it (and
     * the pooled, still valid files of evicted keys count as files) */
    if (!quota_chunks) ASSERT_EQ_U64(s.files, s.scanned_files);
    ASSERT_GT_U64(s.files, 0);
    uint64_t ok = 0, bad = 0;
    for (uint64_t i = 0; i < 100000 && ok + bad < s.files; i++) {
        kvo_chunk_key k = ftf_key(i, 0);
        uint8_t stt;
        ASSERT_OK(kvo_file_tier_lookup(t, &k, 1, &stt));
        if (stt != KVO_READY) continue;
        int r = ftf_read_key(t, plan, &k, true); /* checks the bytes when r == 0 */
        if (r == 0) ok++;
        else if (r == KVO_ECORRUPT) bad++;
        else FAILF("read of key %llu: %s", (unsigned long long)i, kvo_error_name(r));
    }
    ASSERT_EQ_U64(ok + bad, s.files);
    ASSERT_EQ_U64(bad, 0); /* rename makes files appear whole, recycled ones too */
    /* no temporary file of the dead writer is left */
    ASSERT_EQ_INT(ftf_count_temps(kvo_file_tier_dir(t)), 0);
    kvo_file_tier_destroy(t);
    kvo_plan_destroy(plan);
    atomic_store(&kvo__file_test_no_tmpfile, 0);
}

KVO_TEST(sigkill_during_writes) { sigkill_during_writes(false, 0); }
KVO_TEST(sigkill_during_writes_named_temps) { sigkill_during_writes(true, 0); }
KVO_TEST(sigkill_during_writes_full_quota) { sigkill_during_writes(false, 8); }
KVO_TEST(sigkill_during_writes_full_quota_named_temps) { sigkill_during_writes(true, 8); }

/* Two processes store and load the same keys (and each other's). */
static int share_child(const kvo_plan *plan, const char *root, uint64_t first, uint64_t count, uint64_t total) {
    kvo_file_tier_params p = ftf_params(root, plan);
    p.shared = true;
    kvo_file_tier *t = NULL;
    if (kvo_file_tier_create(&p, &t)) return 10;
    const kvo_group_plan *g = kvo_plan_group(plan, 0);
    unsigned char *buf = malloc(g->chunk_bytes);
    for (uint64_t i = first; i < first + count; i++) {
        kvo_chunk_key k = ftf_key(i, 0);
        ftf_fill(buf, g->chunk_bytes, &k);
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
            kvo_chunk_key k = ftf_key(i, 0);
            uint8_t st;
            if (kvo_file_tier_lookup(t, &k, 1, &st)) return 13;
            if (st != KVO_READY) continue;
            int r = ftf_read_key(t, plan, &k, i % 2 == 0);
            if (r == 0) found++;
            else if (r != KVO_ENOTFOUND) return 14; /* never corrupt */
        }
        if (found < total) usleep(10000);
    }
    kvo_file_tier_destroy(t);
    return found == total ? 0 : 15;
}

KVO_TEST(two_processes_share) {
    kvo_plan *plan = ftf_plan("ft-share", 6000, true);
    const char *root = ftf_subdir("share");
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

KVO_TEST(temp_stale_rule) {
    char old[1100], fresh[1100], other[1100];
    snprintf(old, sizeof old, "%s", ftf_subdir(".tmp.0badc0de.12345.00000001.1"));
    snprintf(fresh, sizeof fresh, "%s", ftf_subdir(".tmp.0badc0de.12345.00000001.2"));
    snprintf(other, sizeof other, "%s", ftf_subdir("notatemp"));
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
