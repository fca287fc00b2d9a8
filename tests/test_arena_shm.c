/* Owned sharing of a host arena between the processes of one engine
 * (kvo_arena_params.share_processes): one region for all, the name gone once
 * everyone attached, another configuration refused, a crashed start-up's
 * leftover removed. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvo_test.h"


static kvo_arena_params shared_params(const char *path, uint64_t bytes, uint32_t procs, uint64_t fp) {
    kvo_arena_params p = kvo_arena_default_params();
    p.bytes = bytes;
    p.shm_path = path;
    p.share_processes = procs;
    p.share_fingerprint.lo = fp;
    p.share_fingerprint.hi = ~fp;
    p.share_timeout_ms = 2000;
    return p;
}

static const char *arena_path(const char *name) {
    static char buf[4][512];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, 512, "%s/kvoffload-%s", kvo_test_tmpdir(), name);
    return b;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

KVO_TEST(two_mappings_one_region_name_gone_after_all_attach) {
    const char *path = arena_path("a");
    kvo_arena_params p = shared_params(path, 3 * 4096 + 100, 2, 42);
    kvo_arena *a = NULL, *b = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_TRUE(kvo_arena_creator(a));
    ASSERT_TRUE(exists(path));
    ASSERT_EQ_U64(kvo_arena_size(a), 3 * 4096 + 100);
    ASSERT_OK(kvo_arena_create(&p, &b));
    ASSERT_FALSE(kvo_arena_creator(b));
    ASSERT_FALSE(exists(path)); /* both attached: the name went */
    ASSERT_EQ_U64(kvo_arena_instance(a).lo, kvo_arena_instance(b).lo);
    ASSERT_TRUE(kvo_arena_instance(a).lo != 0 || kvo_arena_instance(a).hi != 0);
    kvo_slot s = {4096, 4096};
    memset(kvo_arena_slot(a, s), 0x5a, 4096);
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_slot(b, s))[4095], 0x5a);
    ASSERT_NULL(kvo_arena_slot(a, (kvo_slot){3 * 4096, 4096})); /* beyond bytes: the header is not slot space */
    kvo_arena_destroy(a);
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_slot(b, s))[0], 0x5a); /* memory lives with the last mapping */
    kvo_arena_destroy(b);
}

KVO_TEST(other_configuration_is_refused) {
    const char *path = arena_path("b");
    kvo_arena_params p = shared_params(path, 8192, 3, 7);
    kvo_arena *a = NULL, *x = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    kvo_arena_params q = shared_params(path, 8192, 3, 8); /* another plan */
    ASSERT_EQ_INT(kvo_arena_create(&q, &x), KVO_ESTATE);
    ASSERT_TRUE(strstr(kvo_last_error(), path) != NULL);
    ASSERT_TRUE(strstr(kvo_last_error(), "plan") != NULL);
    q = shared_params(path, 16384, 3, 7); /* another capacity */
    ASSERT_EQ_INT(kvo_arena_create(&q, &x), KVO_ESTATE);
    ASSERT_NULL(x);
    kvo_arena_destroy(a);
    ASSERT_FALSE(exists(path)); /* the creator removes a name nobody else took */
}

KVO_TEST(new_engine_after_full_attach_gets_a_fresh_region) {
    const char *path = arena_path("c");
    kvo_arena_params p = shared_params(path, 4096, 2, 1);
    kvo_arena *a = NULL, *b = NULL, *c = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_OK(kvo_arena_create(&p, &b));
    memset(kvo_arena_base(a), 0x11, 4096);
    kvo_arena_params q = shared_params(path, 4096, 1, 1);
    ASSERT_OK(kvo_arena_create(&q, &c));
    ASSERT_TRUE(kvo_arena_creator(c));
    ASSERT_TRUE(kvo_arena_instance(c).lo != kvo_arena_instance(a).lo);
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_base(c))[0], 0);
    ASSERT_EQ_INT(((unsigned char *)kvo_arena_base(b))[0], 0x11);
    kvo_arena_destroy(a);
    kvo_arena_destroy(b);
    kvo_arena_destroy(c);
    ASSERT_FALSE(exists(path));
}

/* A child that creates the arena and dies without destroying it, as a crash
 * during start-up would. */
static void crash_creator(const char *path) {
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        kvo_arena_params p = shared_params(path, 4096, 2, 9);
        kvo_arena *a = NULL;
        _exit(kvo_arena_create(&p, &a) == 0 ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ_INT(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

KVO_TEST(crashed_start_up_leftover_is_removed) {
    const char *path = arena_path("d");
    crash_creator(path);
    ASSERT_TRUE(exists(path));
    size_t n = 99;
    ASSERT_OK(kvo_arena_sweep_stale(kvo_test_tmpdir(), "kvoffload-", &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_FALSE(exists(path));
    /* the next start under that name replaces the leftover */
    crash_creator(path);
    kvo_arena_params p = shared_params(path, 4096, 1, 9);
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_TRUE(kvo_arena_creator(a));
    ASSERT_FALSE(exists(path));
    kvo_arena_destroy(a);
}

KVO_TEST(sweep_leaves_live_and_foreign_files) {
    const char *path = arena_path("e");
    kvo_arena_params p = shared_params(path, 4096, 2, 3);
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    const char *other = arena_path("other");
    int fd = open(other, O_CREAT | O_WRONLY, 0600);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ_INT(write(fd, "not an arena", 12), 12);
    close(fd);
    size_t n = 99;
    ASSERT_OK(kvo_arena_sweep_stale(kvo_test_tmpdir(), "kvoffload-", &n));
    ASSERT_EQ_U64(n, 0);
    ASSERT_TRUE(exists(path) && exists(other));
    ASSERT_EQ_INT(kvo_arena_sweep_stale(NULL, "x", NULL), KVO_EINVAL);
    kvo_arena_destroy(a);
    unlink(other);
}

KVO_TEST(non_creator_times_out_on_headerless_file) {
    const char *path = arena_path("f");
    int fd = open(path, O_CREAT | O_WRONLY, 0600); /* made a moment ago, no header yet */
    ASSERT_TRUE(fd >= 0);
    close(fd);
    kvo_arena_params p = shared_params(path, 4096, 2, 3);
    p.share_timeout_ms = 50;
    kvo_arena *a = NULL;
    ASSERT_EQ_INT(kvo_arena_create(&p, &a), KVO_ETIMEDOUT);
    ASSERT_TRUE(strstr(kvo_last_error(), "header") != NULL);
    unlink(path);
}
