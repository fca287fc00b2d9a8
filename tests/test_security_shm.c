/* The shared host arena against other local users (issue 25 item 3): a file
 * planted at the arena's name by another uid (mode 0666, a forged header), a
 * symbolic link at the name, a file of ours with group/other permissions --
 * each refused with a message naming the path, the owner and the mode, so
 * nobody else reads or writes the engine's KV; and a creator that died
 * between writing the header and attaching leaves a file the sweep removes.
 * The tests run as root in CI (the planted file is chowned to 65534); as
 * another user the chown is skipped. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvo_test.h"

#define OTHER_UID 65534u

/* The owned-sharing header as arena.c stores it (docs: kvo_arena_params). */
typedef struct forged_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t data_bytes;
    kvo_u128 fingerprint, instance;
    uint32_t expected, attached;
    int32_t pids[16];
} forged_header;

static kvo_arena_params params(const char *path, uint64_t bytes, uint32_t procs) {
    kvo_arena_params p = kvo_arena_default_params();
    p.bytes = bytes;
    p.shm_path = path;
    p.share_processes = procs;
    p.share_fingerprint.lo = 77;
    p.share_fingerprint.hi = ~77ull;
    p.share_timeout_ms = 200;
    return p;
}

static const char *path_of(const char *name) {
    static char buf[4][512];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, 512, "%s/kvosec-%s", kvo_test_tmpdir(), name);
    return b;
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A file at path of `size` bytes; with a header when hdr is not NULL. */
static void plant(const char *path, uint64_t size, const forged_header *hdr, mode_t mode, bool other_uid) {
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) FAILF("create %s: %s", path, strerror(errno));
    ASSERT_EQ_INT(ftruncate(fd, (off_t)size), 0);
    if (hdr) ASSERT_EQ_INT(pwrite(fd, hdr, sizeof *hdr, 0), (long long)sizeof *hdr);
    ASSERT_EQ_INT(fchmod(fd, mode), 0); /* not subject to the umask */
    if (other_uid) {
        if (geteuid() != 0) SKIP("not root: cannot plant a file of another uid");
        ASSERT_EQ_INT(fchown(fd, OTHER_UID, OTHER_UID), 0);
    }
    close(fd);
}

/* A header that a live engine waiting for a second process would have. */
static forged_header live_header(const kvo_arena_params *p, uint32_t attached) {
    forged_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "KVOSHM01", 8);
    h.version = 1;
    h.header_bytes = 4096;
    h.data_bytes = p->bytes;
    h.fingerprint = p->share_fingerprint;
    h.instance.lo = 0x1234;
    h.expected = p->share_processes;
    h.attached = attached;
    if (attached) h.pids[0] = 1; /* init: always alive */
    return h;
}

/* create must fail, name the path, and leave the file alone. */
static void assert_refused(const kvo_arena_params *p, const char *must_contain) {
    kvo_arena *a = NULL;
    int rc = kvo_arena_create(p, &a);
    if (rc == 0) {
        kvo_arena_destroy(a);
        FAILF("kvo_arena_create attached to a file it must refuse (%s)", p->shm_path);
    }
    ASSERT_NULL(a);
    ASSERT_CONTAINS(kvo_last_error(), p->shm_path);
    if (must_contain) ASSERT_CONTAINS(kvo_last_error(), must_contain);
    ASSERT_TRUE(exists(p->shm_path)); /* not ours to remove */
}

KVO_TEST(planted_file_of_other_uid_is_refused_owned) {
    const char *path = path_of("planted-owned");
    kvo_arena_params p = params(path, 8192, 2);
    forged_header h = live_header(&p, 1);
    plant(path, 4096 + 8192, &h, 0666, true);
    assert_refused(&p, "65534");
    ASSERT_CONTAINS(kvo_last_error(), "0666");
    unlink(path);
}

KVO_TEST(planted_file_of_other_uid_is_refused_plain) {
    const char *path = path_of("planted-plain");
    kvo_arena_params p = params(path, 8192, 0);
    plant(path, 8192, NULL, 0666, true);
    assert_refused(&p, "65534");
    ASSERT_CONTAINS(kvo_last_error(), "0666");
    unlink(path);
}

KVO_TEST(own_file_readable_by_others_is_refused) {
    const char *path = path_of("wide-mode");
    kvo_arena_params p = params(path, 8192, 0);
    plant(path, 8192, NULL, 0644, false);
    assert_refused(&p, "0644");
    unlink(path);
    const char *opath = path_of("wide-mode-owned");
    kvo_arena_params q = params(opath, 8192, 2);
    forged_header h = live_header(&q, 1);
    plant(opath, 4096 + 8192, &h, 0660, false);
    assert_refused(&q, "0660");
    unlink(opath);
}

KVO_TEST(symlink_at_the_name_is_refused) {
    /* the link points at a file of ours with the right size and a live
     * header: only the link itself is wrong */
    const char *target = path_of("link-target"), *link_plain = path_of("link-plain");
    kvo_arena_params p = params(link_plain, 8192, 0);
    plant(target, 8192, NULL, 0600, false);
    ASSERT_EQ_INT(symlink(target, link_plain), 0);
    assert_refused(&p, "symbolic link");
    const char *otarget = path_of("link-target-owned"), *link_owned = path_of("link-owned");
    kvo_arena_params q = params(link_owned, 8192, 2);
    forged_header h = live_header(&q, 1);
    plant(otarget, 4096 + 8192, &h, 0600, false);
    ASSERT_EQ_INT(symlink(otarget, link_owned), 0);
    assert_refused(&q, "symbolic link");
    /* the targets were not written through the links */
    forged_header back;
    int fd = open(otarget, O_RDONLY);
    ASSERT_TRUE(fd >= 0);
    ASSERT_EQ_INT(pread(fd, &back, sizeof back, 0), (long long)sizeof back);
    close(fd);
    ASSERT_EQ_U64(back.attached, 1);
    unlink(link_plain);
    unlink(link_owned);
    unlink(target);
    unlink(otarget);
}

KVO_TEST(a_fresh_arena_file_is_private) {
    const char *path = path_of("fresh");
    kvo_arena_params p = params(path, 8192, 0);
    umask(0); /* the library's mode, not the umask's */
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    umask(022);
    struct stat st;
    ASSERT_EQ_INT(stat(path, &st), 0);
    ASSERT_EQ_U64(st.st_mode & 0777, 0600);
    ASSERT_EQ_U64(st.st_uid, geteuid());
    kvo_arena_destroy(a);
    /* attaching again to our own private file works */
    ASSERT_OK(kvo_arena_create(&p, &a));
    kvo_arena_destroy(a);
    unlink(path);
}

KVO_TEST(creator_died_between_header_and_attach_is_swept) {
    /* the header is written (attached 0, no pid recorded) but nobody holds
     * the lock any more: the creator died before attaching */
    const char *path = path_of("died-creator");
    kvo_arena_params p = params(path, 8192, 2);
    forged_header h = live_header(&p, 0);
    plant(path, 4096 + 8192, &h, 0600, false);
    size_t n = 99;
    ASSERT_OK(kvo_arena_sweep_stale(kvo_test_tmpdir(), "kvosec-died", &n));
    ASSERT_EQ_U64(n, 1);
    ASSERT_FALSE(exists(path));
    /* a live one waiting for its second process is left alone */
    kvo_arena *a = NULL;
    ASSERT_OK(kvo_arena_create(&p, &a));
    ASSERT_OK(kvo_arena_sweep_stale(kvo_test_tmpdir(), "kvosec-died", &n));
    ASSERT_EQ_U64(n, 0);
    ASSERT_TRUE(exists(path));
    kvo_arena_destroy(a);
    ASSERT_FALSE(exists(path));
}
