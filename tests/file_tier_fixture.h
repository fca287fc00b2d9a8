/* The fixture of the file- and remote-tier tests (test_tiers_file_*.c,
 * test_tiers_faults.c, remote_test.h): small plans, keys with known bytes,
 * the tier's parameters, paths under the test's temporary directory, and
 * synchronous write/read helpers that bound every wait and fail on wrong
 * bytes.  Everything is static inline: each test binary includes it once.
 *
 * Plans: ftf_plan(name, page_bytes, false) has one group "full" (16 tokens
 * a block, 2 layers, page_bytes, 2 blocks a chunk).  With more_groups it
 * adds "swa" (sliding, window 64, 1 layer, page_bytes / 2 + 8: chunk sizes
 * that are not multiples of 4096, so the padding path runs) and "nocache"
 * (not cacheable, so not offloaded: a key of group 2 is rejected). */
#ifndef KVO_FILE_TIER_FIXTURE_H
#define KVO_FILE_TIER_FIXTURE_H

#include "kvo_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/file_internal.h"

static inline kvo_plan *ftf_plan(const char *name, uint64_t page_bytes, bool more_groups) {
    kvo_model *m = NULL;
    if (kvo_model_create(name, 16, &m)) FAILF("model: %s", kvo_last_error());
    kvo_group_desc g = kvo_group_desc_default();
    snprintf(g.name, sizeof g.name, "full");
    g.tokens_per_block = 16;
    g.layers = 2;
    g.page_bytes = page_bytes;
    if (kvo_model_add_group(m, &g)) FAILF("group: %s", kvo_last_error());
    if (more_groups) {
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
    }
    kvo_plan_params pp = kvo_plan_default_params();
    pp.blocks_per_chunk = 2;
    kvo_plan *p = NULL;
    if (kvo_plan_create(m, &pp, &p)) FAILF("plan: %s", kvo_last_error());
    kvo_model_destroy(m);
    return p;
}

/* The i-th key of a group (distinct hashes spread over the fan-out). */
static inline kvo_chunk_key ftf_key(uint64_t i, uint32_t group) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i * 0x9e3779b97f4a7c15ull + 12345;
    k.hash.hi = ~i * 0xbf58476d1ce4e5b9ull;
    k.group = group;
    return k;
}

/* Deterministic content of a key (so other processes can check it). */
static inline void ftf_fill(unsigned char *buf, uint64_t n, const kvo_chunk_key *k) {
    uint64_t s = k->hash.lo ^ k->group;
    for (uint64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(s >> 56);
    }
}

/* n bytes, 4096-aligned, filled with 0xee (free()). */
static inline unsigned char *ftf_aligned_buf(uint64_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n)) FAILF("posix_memalign");
    memset(p, 0xee, n);
    return p;
}

/* The tests' tier: 64 MiB quota, 16 MiB staging, logs at most hourly. */
static inline kvo_file_tier_params ftf_params(const char *root, const kvo_plan *plan) {
    kvo_file_tier_params p = kvo_file_tier_default_params();
    p.root = root;
    p.plan = plan;
    p.quota_bytes = 64ull << 20;
    p.max_staging_bytes = 16ull << 20;
    p.log_interval_s = 3600;
    return p;
}

/* A path under the test's temporary directory (a ring of 8 buffers). */
static inline char *ftf_subdir(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *buf = bufs[next++ % 8];
    snprintf(buf, 1024, "%s/%s", kvo_test_tmpdir(), name);
    return buf;
}

/* A fresh tmpfs of the given size (a mount option value: "256k", "4m") at
 * ftf_subdir(name), for tests of a full disk.  Skips the test (destroying
 * plan) when not root or when mounting fails. */
static inline const char *ftf_small_tmpfs(const char *name, const char *size, kvo_plan *plan) {
    if (geteuid() != 0) {
        kvo_plan_destroy(plan);
        SKIP("needs root to mount a small tmpfs");
    }
    const char *mnt = ftf_subdir(name);
    ASSERT_EQ_INT(mkdir(mnt, 0755), 0);
    char opt[64];
    snprintf(opt, sizeof opt, "size=%s", size);
    if (mount("tmpfs", mnt, "tmpfs", 0, opt) != 0) {
        kvo_plan_destroy(plan);
        SKIP("cannot mount a tmpfs here: %s", strerror(errno));
    }
    return mnt;
}

/* Fill the file system under dir to the last block with a file "ballast"
 * (another writer filling the disk); its path (valid until the next call). */
static inline const char *ftf_fill_disk(const char *dir) {
    static char ballast[1100];
    snprintf(ballast, sizeof ballast, "%s/ballast", dir);
    int fd = open(ballast, O_WRONLY | O_CREAT, 0644);
    ASSERT_TRUE(fd >= 0);
    char *junk = calloc(1, 4096);
    while (write(fd, junk, 4096) == 4096) {
    }
    close(fd);
    free(junk);
    return ballast;
}

/* Decode a chunk file's header, let fn change it, encode it back (a valid
 * header checksum over changed fields). */
static inline void ftf_patch_header(const char *path, void (*fn)(kvo__file_hdr *h)) {
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

/* Create a tier; skips the test (destroying plan) when what p asks for
 * (io_uring, O_DIRECT) is not supported here (KVO_ENOTSUP). */
static inline kvo_file_tier *ftf_create_or_skip(const kvo_file_tier_params *p, kvo_plan *plan) {
    kvo_file_tier *t = NULL;
    int rc = kvo_file_tier_create(p, &t);
    if (rc == KVO_ENOTSUP) {
        kvo_plan_destroy(plan);
        SKIP("%s", kvo_last_error());
    }
    ASSERT_OK(rc);
    return t;
}

/* Temporary files (".tmp." names) in a namespace's 256 fan-out directories. */
static inline int ftf_count_temps(const char *ns) {
    int tmps = 0;
    for (int b = 0; b < 256; b++) {
        char dirp[KVO__FILE_PATH_MAX + 8];
        snprintf(dirp, sizeof dirp, "%s/%02x", ns, b);
        DIR *d = opendir(dirp);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d))) tmps += strncmp(e->d_name, KVO__FILE_TMP_PREFIX, sizeof KVO__FILE_TMP_PREFIX - 1) == 0;
        closedir(d);
    }
    return tmps;
}

/* Write n keys (their ftf_fill bytes), waiting out back-pressure; flushed. */
static inline void ftf_write_keys(kvo_file_tier *t, const kvo_plan *plan, const kvo_chunk_key *keys, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const kvo_group_plan *g = kvo_plan_group(plan, keys[i].group);
        unsigned char *buf = malloc(g->chunk_bytes);
        ftf_fill(buf, g->chunk_bytes, &keys[i]);
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

/* Read one key synchronously into a 4096-aligned buffer (or one 64 bytes
 * off); returns the completion's result, and when it is 0 checks the
 * completion, the bytes and that the padding up to slot_bytes is zero. */
static inline int ftf_read_key(kvo_file_tier *t, const kvo_plan *plan, const kvo_chunk_key *k, bool aligned) {
    const kvo_group_plan *g = kvo_plan_group(plan, k->group);
    unsigned char *raw = ftf_aligned_buf(g->slot_bytes + 4096 + 64);
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
        ftf_fill(want, g->chunk_bytes, k);
        ASSERT_MEM_EQ(dst, want, g->chunk_bytes);
        ASSERT_EQ_U64(c.bytes, g->chunk_bytes);
        free(want);
        for (uint64_t i = g->chunk_bytes; i < g->slot_bytes; i++)
            if (dst[i]) FAILF("padding byte %llu is 0x%02x: a read returned non-zero padding",
                              (unsigned long long)(i - g->chunk_bytes), dst[i]);
    }
    free(raw);
    return c.result;
}

#endif
