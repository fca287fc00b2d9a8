/*
 * The file tier's create-time probes: what the directory and the file system
 * can do, decided once in kvo_file_tier_create.
 *
 * What it owns
 *  - mkdir -p of the namespace directory (0700 or params.file_mode's; an
 *    existing one must not be a symbolic link), and its 256 fan-out
 *    directories
 *    made up front (not on a write's path);
 *  - the O_DIRECT probe (a real 4 KiB write and read in the namespace: some
 *    file systems accept the flag at open and fail at I/O), which is also the
 *    writability check;
 *  - the O_TMPFILE + linkat probe (with the real flags, in the namespace):
 *    when it works, a killed writer leaves nothing behind and a write needs
 *    one directory operation less; otherwise named temporaries and rename;
 *  - the quota clamp to what the file system can hold (with params.shared
 *    only the first process of a namespace computes it, for all:
 *    file_tier.c);
 *  - the probes of a read-only tier (no file could be created at create):
 *    O_DIRECT reads, and whether files can be created again;
 *  - the host id and the per-process nonce written into temporary names
 *    (file_scan.c tells a dead writer's temporaries by them);
 *  - the test hooks that change what the probes decide.
 *
 * Lock rules: none; everything here runs before the tier's workers start
 * (the nonce is a process-wide atomic, set once), except the writability
 * probe of a read-only tier, which a writer runs (file_tier.c rate-limits
 * it under mu).
 *
 * Invariants: a probe leaves no file behind (its files carry the temporary
 * prefix with this host and pid, so even a crash mid-probe leaves only what
 * the scan removes as stale).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "core/xxh.h"

#include "tiers/file_internal.h"

/* A per-process random number in temporary names (file_scan.c tells stale temporaries by it). */
uint32_t kvo__file_process_nonce(void) {
    static atomic_uint nonce;
    unsigned v = atomic_load(&nonce);
    if (v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed[3] = {(uint64_t)ts.tv_nsec, (uint64_t)ts.tv_sec, (uint64_t)getpid()};
    unsigned n = (unsigned)XXH3_64bits(seed, sizeof seed) | 1u;
    unsigned expect = 0;
    atomic_compare_exchange_strong(&nonce, &expect, n);
    return atomic_load(&nonce);
}

static int mkdir_error(const char *path, int e) {
    return kvo__error(e == ENOSPC || e == EDQUOT ? KVO_ENOSPC : KVO_EIO,
                      "file tier: cannot create directory '%s': %s (is the root writable?)", path, strerror(e));
}

int kvo__file_mkdir(const char *path, unsigned dmode) {
    if (mkdir(path, (mode_t)dmode) != 0) return -1;
    if (dmode & 077) (void)chmod(path, (mode_t)dmode);
    return 0;
}

void kvo__file_set_mode(int fd, unsigned fmode) {
    if (fd >= 0 && (fmode & 077)) (void)fchmod(fd, (mode_t)fmode);
}

/* mkdir -p with dmode for what it makes; the last component (the namespace
 * directory) must then be a real directory: lstat, not stat, so a symbolic
 * link someone put at its name is refused, not followed. */
int kvo__file_mkdir_p(const char *path, unsigned dmode) {
    char buf[KVO__FILE_PATH_MAX];
    if (kvo__strlcpy(buf, path, sizeof buf)) return kvo__error(KVO_ERANGE, "file tier: path too long: '%.64s...'", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (kvo__file_mkdir(buf, dmode) != 0 && errno != EEXIST) return mkdir_error(buf, errno);
        *p = '/';
    }
    if (kvo__file_mkdir(buf, dmode) != 0 && errno != EEXIST) return mkdir_error(buf, errno);
    struct stat st;
    if (lstat(buf, &st) != 0) return mkdir_error(buf, errno);
    if (S_ISLNK(st.st_mode))
        return kvo__error(KVO_EIO, "file tier: namespace directory '%s' is a symbolic link: refused (it must be a "
                          "directory of this tier; another local user may have moved the cache away: remove the "
                          "link)", buf);
    if (!S_ISDIR(st.st_mode)) return mkdir_error(buf, ENOTDIR);
    return 0;
}

/* The 256 fan-out directories, made at create (an existing one is fine):
 * made lazily, the first write into each paid a mkdir on the write path,
 * measured as 30 % of a fresh tier's write CPU (ext4 inode allocation).
 * 0 or KVO_EIO / KVO_ENOSPC with a message. */
int kvo__file_make_fanout(const char *ns_dir, unsigned dmode) {
    int dfd = open(ns_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (dfd < 0) return mkdir_error(ns_dir, errno);
    static const char digits[] = "0123456789abcdef";
    int rc = 0;
    for (unsigned b = 0; b < 256 && rc == 0; b++) {
        char sub[3] = {digits[b >> 4], digits[b & 15], 0};
        if (mkdirat(dfd, sub, (mode_t)dmode) == 0) {
            if (dmode & 077) (void)fchmodat(dfd, sub, (mode_t)dmode, 0);
        } else if (errno != EEXIST) {
            char path[KVO__FILE_PATH_MAX];
            int e = errno;
            snprintf(path, sizeof path, "%s/%s", ns_dir, sub);
            rc = mkdir_error(path, e);
        }
    }
    close(dfd);
    return rc;
}

/* Probe O_DIRECT with a real write and read in the namespace directory.  Also
 * the writability check.  Returns 0 and sets *ok, or KVO_EIO with *werr = the
 * errno of creating the probe file (ENOSPC: no free inode or block, EROFS:
 * the caller may open read-only). */
int kvo__file_probe_direct(kvo_file_tier *t, bool *ok, int *werr) {
    char path[KVO__FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s%08x.%ld.probe", t->ns_dir, KVO__FILE_TMP_PREFIX, t->hostid, t->pid);
    *ok = false;
    *werr = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        *werr = errno;
        return kvo__error(KVO_EIO, "file tier directory '%s' is not writable: %s", t->ns_dir, strerror(errno));
    }
    close(fd);
    if (t->p.direct == KVO_FILE_DIRECT_OFF) {
        unlink(path);
        return 0;
    }
    void *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        unlink(path);
        return kvo__error(KVO_ENOMEM, "probe buffer");
    }
    memset(buf, 0x5a, 4096);
    fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (fd >= 0) {
        if (pwrite(fd, buf, 4096, 0) == 4096 && pread(fd, buf, 4096, 0) == 4096 &&
            ((unsigned char *)buf)[4095] == 0x5a)
            *ok = true;
        close(fd);
    }
    munmap(buf, 4096);
    unlink(path);
    return 0;
}

/* Read-only tier: does an O_DIRECT read work here?  Probed on the manifest
 * (an aligned 4096-byte read of a shorter file returns what there is). */
bool kvo__file_probe_direct_read(kvo_file_tier *t) {
    char path[KVO__FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", t->ns_dir, KVO__FILE_MANIFEST);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT | O_NONBLOCK);
    if (fd < 0) return false;
    void *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool ok = buf != MAP_FAILED && pread(fd, buf, 4096, 0) >= 0;
    if (buf != MAP_FAILED) munmap(buf, 4096);
    close(fd);
    return ok;
}

/* Read-only tier: can a file be created (and every fan-out directory
 * exist) now?  The same probe name as at create. */
atomic_int kvo__file_ro_retry_ms = 10000;

bool kvo__file_probe_writable(kvo_file_tier *t) {
    char path[KVO__FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s%08x.%ld.probe", t->ns_dir, KVO__FILE_TMP_PREFIX, t->hostid, t->pid);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    close(fd);
    unlink(path);
    return kvo__file_make_fanout(t->ns_dir, t->dmode) == 0;
}

/* Can files be written unnamed (O_TMPFILE) and linked in by name (linkat
 * through /proc)?  Then a killed writer leaves nothing behind at all and a
 * write needs one directory operation less.  Otherwise: named temporary files
 * and rename.  Probed with the real flags, in the namespace directory. */
atomic_int kvo__file_test_no_tmpfile;
atomic_int kvo__file_test_write_delay_us;

bool kvo__file_probe_tmpfile(kvo_file_tier *t) {
    if (atomic_load(&kvo__file_test_no_tmpfile)) return false;
    int fd = open(t->ns_dir, O_TMPFILE | O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0), 0600);
    if (fd < 0) return false;
    char proc[64], path[KVO__FILE_PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    snprintf(path, sizeof path, "%s/%s%08x.%ld.link", t->ns_dir, KVO__FILE_TMP_PREFIX, t->hostid, t->pid);
    unlink(path);
    bool ok = linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0;
    if (ok) unlink(path);
    close(fd);
    return ok;
}

uint32_t kvo__file_host_id(void) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return (uint32_t)XXH3_64bits(host, strlen(host));
}

/* The quota the file system can actually hold: the payload of this
 * namespace's files (`ours`: they are on the disk already and stay) plus
 * what the free space can take, less the 4 KiB header per file and a 5 %
 * margin of the free space.  A quota above it would, once the disk is full,
 * drop every new write with ENOSPC instead of evicting old files.  The
 * margin applies to free space only: on a full disk a restart keeps every
 * file that fits the configured quota (it used to take 5 % of the files
 * each time). */
uint64_t kvo__file_clamp_quota(kvo_file_tier *t, uint64_t quota, uint64_t ours, uint64_t max_slot) {
    struct statvfs vfs;
    if (ours >= quota || statvfs(t->ns_dir, &vfs) != 0 || vfs.f_frsize == 0) return quota;
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail / 2 > UINT64_MAX / 64) return quota;
    uint64_t room = (uint64_t)((double)avail * 0.95 * (double)max_slot / (double)(max_slot + KVO_FILE_HEADER_BYTES));
    uint64_t fit = ours + room;
    if (fit >= quota) return quota;
    uint64_t q = fit < max_slot ? max_slot : fit;
    kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s: quota %llu bytes is more than the file system can hold (%llu free + "
             "%llu in this namespace); using %llu", t->ns_dir, (unsigned long long)quota,
            (unsigned long long)avail, (unsigned long long)ours, (unsigned long long)q);
    return q;
}
