/* kvo_file_walk: classification, stat data, stopping, errors. */
#include "kvo_test.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct seen {
    int chunks, temps, others, dirs, stat_ok;
    kvo_chunk_key key;
    uint32_t key_subdir;
    uint64_t key_bytes;
    int stop_after;
    int calls;
} seen;

static int visit(const kvo_file_walk_entry *e, void *ctx) {
    seen *s = ctx;
    s->calls++;
    ASSERT_TRUE(e->dir_fd >= 0);
    ASSERT_TRUE(strstr(e->path, e->name) != NULL);
    if (e->kind == KVO_FILE_WALK_CHUNK) {
        s->chunks++;
        s->key = e->key;
        s->key_subdir = e->subdir;
        s->key_bytes = e->file_bytes;
    } else if (e->kind == KVO_FILE_WALK_TEMP) {
        s->temps++;
    } else {
        ASSERT_EQ_INT(e->kind, KVO_FILE_WALK_OTHER);
        s->others++;
    }
    s->dirs += e->is_dir;
    s->stat_ok += e->have_stat;
    return s->stop_after && s->calls >= s->stop_after ? 42 : 0;
}

static void touch(const char *path, size_t bytes) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) FAILF("open %s", path);
    char buf[100] = {0};
    if (bytes && write(fd, buf, bytes) != (ssize_t)bytes) FAILF("write %s", path);
    close(fd);
}

KVO_TEST(classify_and_stat) {
    char ns[1024], p[2048];
    snprintf(ns, sizeof ns, "%s/walk-ns.%ld", kvo_test_tmpdir(), (long)getpid());
    ASSERT_EQ_INT(mkdir(ns, 0755), 0);
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.hi = 0x0123456789abcdefull;
    k.hash.lo = 0xfedcba98765432a7ull;
    k.group = 3;
    snprintf(p, sizeof p, "%s/a7", ns); /* the key's fan-out directory */
    ASSERT_EQ_INT(mkdir(p, 0755), 0);
    ASSERT_OK(kvo_file_chunk_path(ns, &k, p, sizeof p));
    touch(p, 77);
    snprintf(p, sizeof p, "%s/a7/.tmp.00000000.1.00000000.0", ns);
    touch(p, 0);
    snprintf(p, sizeof p, "%s/a7/notes.txt", ns);
    touch(p, 1);
    snprintf(p, sizeof p, "%s/00", ns);
    ASSERT_EQ_INT(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/00/sub", ns);
    ASSERT_EQ_INT(mkdir(p, 0755), 0);

    seen s = {0};
    ASSERT_OK(kvo_file_walk(ns, KVO_FILE_WALK_STAT, visit, &s));
    ASSERT_EQ_INT(s.calls, 4); /* "." and ".." left out */
    ASSERT_EQ_INT(s.chunks, 1);
    ASSERT_EQ_INT(s.temps, 1);
    ASSERT_EQ_INT(s.others, 2);
    ASSERT_EQ_INT(s.dirs, 1);
    ASSERT_EQ_INT(s.stat_ok, 4);
    ASSERT_EQ_U64(s.key.hash.hi, k.hash.hi);
    ASSERT_EQ_U64(s.key.hash.lo, k.hash.lo);
    ASSERT_EQ_INT(s.key.group, 3);
    ASSERT_EQ_INT(s.key_subdir, 0xa7);
    ASSERT_EQ_U64(s.key_bytes, 77);

    seen n = {0}; /* without the flag: no stat data */
    ASSERT_OK(kvo_file_walk(ns, 0, visit, &n));
    ASSERT_EQ_INT(n.calls, 4);
    ASSERT_EQ_INT(n.stat_ok, 0);
    ASSERT_EQ_U64(n.key_bytes, 0);

    seen st = {.stop_after = 2}; /* a nonzero return stops the walk */
    ASSERT_EQ_INT(kvo_file_walk(ns, 0, visit, &st), 42);
    ASSERT_EQ_INT(st.calls, 2);
}

KVO_TEST(errors) {
    seen s = {0};
    ASSERT_ERR(kvo_file_walk(NULL, 0, visit, &s), KVO_EINVAL);
    ASSERT_ERR(kvo_file_walk("/", 0, NULL, &s), KVO_EINVAL);
    ASSERT_ERR(kvo_file_walk("/", 0x80, visit, &s), KVO_EINVAL);
    char missing[1024];
    snprintf(missing, sizeof missing, "%s/walk-missing.%ld", kvo_test_tmpdir(), (long)getpid());
    ASSERT_ERR(kvo_file_walk(missing, 0, visit, &s), KVO_EIO);
    ASSERT_CONTAINS(kvo_last_error(), missing);
    ASSERT_EQ_INT(s.calls, 0);
}
