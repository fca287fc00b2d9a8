/*
 * The file tier's shared accounting: one byte quota for every process that
 * opens a namespace with params.shared (the ranks of one engine, engines on
 * one host), kept in a small file of the namespace that each of them maps.
 *
 * Layout of <ns_dir>/shared-quota (KVO__FSHARE_BYTES bytes, host byte order,
 * mapped MAP_SHARED; every counter a lock-free 64-bit atomic):
 *
 *     0   magic "KVOSHARE", version, size, slot count
 *         quota            the quota in force (payload slot bytes)
 *         quota_configured what the process that recorded it was given
 *         used             bytes counted: files + writes in flight
 *         files            files counted
 *         unlinked         bytes un-counted by unlinks (monotonic: recount)
 *         epoch            sessions: +1 each time a process attaches alone
 *         recounts         recounts from the directory
 *         cursor           the next fan-out directory to sample (eviction of
 *                          files no live index holds, file_scan.c)
 *         committed        bytes committed (monotonic: recount)
 *         landed           bytes whose commit has landed: the file linked or
 *                          renamed under its name, or dropped (monotonic)
 *         unlinking        bytes of chunk files whose unlink began
 *                          (monotonic; `unlinked` counts those that ended,
 *                          removed or not)
 *   512   reserved[256]    bytes each slot's process reserved for its
 *                          writes in flight
 *
 * Locks: open file description locks (fcntl F_OFD_*) on this file, which the
 * kernel drops when the process holding them dies, whatever its pid (pid
 * namespaces, pid reuse):
 *   byte 0       the attach lock: held while a process attaches (agrees on
 *                the quota, walks and recounts, adopts); creates queue on it
 *   byte 1 + i   slot i: held for the life of the tier that owns it, so a
 *                slot whose lock is free belongs to nobody
 *
 * Counting rules (each keeps `used` at or above the truth when a process
 * dies between two of its steps; only a recount lowers it back):
 *   reserve   used += x (only while used + x <= quota: a CAS), then the slot
 *   commit    the write's bytes are on disk, before its link: slot -= x,
 *             files += 1, committed += x (the bytes stay in used, now as a
 *             file); landed += x once the link (or rename) is done
 *   release   a write that failed before commit: slot -= x, then used -= x
 *   drop      a committed write whose link did not create the name (another
 *             process linked the same key first): used -= x, files -= 1
 *   unlink    before a chunk file's unlink: unlinking += x; then, when it
 *             removed the file, uncount: used -= x, files -= 1, unlinked
 *             += x; when it did not (another process's unlink did), unlinked
 *             += x alone
 * So a file is counted by the one process whose link created its name and
 * un-counted by the one whose unlink removed it.  A dead process's slot still
 * holds what it reserved: the next process to attach (or to run short of
 * room, kvo__fshare_reap) takes the slot's lock, which succeeds only once its
 * owner is gone, and subtracts it.
 *
 * Recount: the process that attaches while no other is attached (no slot
 * lock held) sets used and files from its startup walk, exactly (nobody else
 * is writing), and records the quota.  A process that attaches beside others
 * walks too and may only lower used: to the walk + every slot's reservation
 * read before the walk + the bytes committed and not yet landed at any time
 * during it (committed after the walk less landed before it: a file between
 * its commit and its link is in no slot and maybe not in the walk) + the
 * unlinks begun and not yet ended at any time during it (unlinking after less
 * unlinked before: a file unlinked before the walk reached it whose uncount
 * comes after the recount would otherwise be taken off twice) (each term
 * rounds up; the snapshot reads the monotonic counters before used, and used
 * before the slots), so drift left by crashes is bounded by one crash's
 * in-flight operations between two attaches.
 *
 * Sharing happens through the page cache of one host: a namespace on a
 * network file system shared by several hosts gets one accounting per host
 * that maps it coherently, i.e. none across hosts (documented).
 *
 * A leaf: it calls nothing else of the tier.  Thread rules: the handle is
 * used by every thread of its tier; the counters are atomics, the attach and
 * detach calls run in create and destroy only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/file_internal.h"

#define FSHARE_MAGIC "KVOSHARE"
#define FSHARE_VERSION 2u
#define FSHARE_SLOTS 256u

#if ATOMIC_LLONG_LOCK_FREE != 2
#error "the shared accounting needs lock-free 64-bit atomics (they live in a file that several processes map)"
#endif

typedef struct fshare_map {
    char magic[8];
    uint32_t version;
    uint32_t bytes;
    uint32_t slots;
    uint32_t pad0;
    _Atomic uint64_t quota;
    _Atomic uint64_t quota_configured;
    _Atomic uint64_t used;
    _Atomic uint64_t files;
    _Atomic uint64_t unlinked;
    _Atomic uint64_t epoch;
    _Atomic uint64_t recounts;
    _Atomic uint64_t cursor;
    _Atomic uint64_t committed;
    _Atomic uint64_t landed;
    _Atomic uint64_t unlinking;
    unsigned char pad1[512 - 112];
    _Atomic uint64_t reserved[FSHARE_SLOTS];
} fshare_map;

_Static_assert(sizeof(fshare_map) <= KVO__FSHARE_BYTES, "shared accounting layout");
_Static_assert(offsetof(fshare_map, reserved) == 512, "shared accounting layout");

struct kvo__fshare {
    int fd;
    fshare_map *m;
    uint32_t slot;
    char path[KVO__FILE_PATH_MAX];
};

/* ------------------------------------------------------------- locks -- */

static int ofd_lock(int fd, short type, off_t start, off_t len, bool wait) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    int rc;
    do rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    while (rc != 0 && errno == EINTR);
    return rc;
}

/* Does another open file description hold a lock on any slot? */
static bool others_attached(int fd) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 1;
    fl.l_len = FSHARE_SLOTS;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true; /* cannot tell: assume so (never reset counts) */
    return fl.l_type != F_UNLCK;
}

/* ---------------------------------------------------------- counters -- */

/* used -= x, never below zero (a counter off by a lost update stays sane). */
static void sub_sat(_Atomic uint64_t *v, uint64_t x) {
    uint64_t cur = atomic_load(v);
    while (!atomic_compare_exchange_weak(v, &cur, cur > x ? cur - x : 0)) {
    }
}

bool kvo__fshare_reserve(kvo__fshare *s, uint64_t x, uint64_t *over) {
    fshare_map *m = s->m;
    uint64_t q = atomic_load(&m->quota), cur = atomic_load(&m->used);
    do {
        if (cur + x > q) {
            if (over) *over = cur + x - q;
            return false;
        }
    } while (!atomic_compare_exchange_weak(&m->used, &cur, cur + x));
    atomic_fetch_add(&m->reserved[s->slot], x);
    return true;
}

void kvo__fshare_release(kvo__fshare *s, uint64_t x) {
    sub_sat(&s->m->reserved[s->slot], x);
    sub_sat(&s->m->used, x);
}

void kvo__fshare_commit(kvo__fshare *s, uint64_t x) {
    atomic_fetch_add(&s->m->committed, x); /* before the slot lets go: never in neither */
    sub_sat(&s->m->reserved[s->slot], x);
    atomic_fetch_add(&s->m->files, 1);
}

void kvo__fshare_landed(kvo__fshare *s, uint64_t x) { atomic_fetch_add(&s->m->landed, x); }

void kvo__fshare_drop(kvo__fshare *s, uint64_t x) {
    sub_sat(&s->m->used, x);
    sub_sat(&s->m->files, 1);
}

void kvo__fshare_unlink_begin(kvo__fshare *s, uint64_t x) { atomic_fetch_add(&s->m->unlinking, x); }

void kvo__fshare_unlink_end(kvo__fshare *s, uint64_t x, bool removed) {
    if (removed) {
        sub_sat(&s->m->used, x);
        sub_sat(&s->m->files, 1);
    }
    atomic_fetch_add(&s->m->unlinked, x);
}

uint64_t kvo__fshare_used(const kvo__fshare *s) { return atomic_load(&s->m->used); }
uint64_t kvo__fshare_files(const kvo__fshare *s) { return atomic_load(&s->m->files); }
uint64_t kvo__fshare_quota(const kvo__fshare *s) { return atomic_load(&s->m->quota); }
uint32_t kvo__fshare_next_dir(kvo__fshare *s) { return (uint32_t)(atomic_fetch_add(&s->m->cursor, 1) & 0xff); }

/* Take back what the slots of dead processes reserved: a slot's lock can be
 * taken only once its owner is gone.  Returns the bytes reclaimed. */
uint64_t kvo__fshare_reap(kvo__fshare *s) {
    uint64_t got = 0;
    for (uint32_t i = 0; i < FSHARE_SLOTS; i++) {
        if (i == s->slot || atomic_load(&s->m->reserved[i]) == 0) continue;
        if (ofd_lock(s->fd, F_WRLCK, 1 + (off_t)i, 1, false) != 0) continue; /* alive */
        uint64_t r = atomic_exchange(&s->m->reserved[i], 0);
        sub_sat(&s->m->used, r);
        got += r;
        ofd_lock(s->fd, F_UNLCK, 1 + (off_t)i, 1, false);
    }
    return got;
}

/* ------------------------------------------------------ attach/detach -- */

static void map_init(fshare_map *m) {
    memset(m, 0, sizeof *m);
    memcpy(m->magic, FSHARE_MAGIC, 8);
    m->version = FSHARE_VERSION;
    m->bytes = KVO__FSHARE_BYTES;
    m->slots = FSHARE_SLOTS;
}

/* Make the file if it is missing: a complete, initialised file under a
 * temporary name, linked in (EEXIST: another process made it first). */
static int create_file(const char *ns_dir, const char *path, unsigned fmode) {
    char tmp[KVO__FILE_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/%s%08x.%ld.%08x.0.share", ns_dir, KVO__FILE_TMP_PREFIX, kvo__file_host_id(),
             (long)getpid(), kvo__file_process_nonce());
    unlink(tmp);
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)fmode);
    if (fd < 0) return -errno;
    kvo__file_set_mode(fd, fmode);
    unsigned char *buf = kvo__calloc(1, KVO__FSHARE_BYTES);
    int e = buf ? 0 : ENOMEM;
    if (buf) {
        map_init((fshare_map *)buf);
        ssize_t w = pwrite(fd, buf, KVO__FSHARE_BYTES, 0);
        if (w != (ssize_t)KVO__FSHARE_BYTES) e = w < 0 ? errno : ENOSPC;
    }
    kvo__free(buf);
    close(fd);
    if (!e && link(tmp, path) != 0 && errno != EEXIST) e = errno;
    unlink(tmp);
    return -e;
}

static bool map_valid(const fshare_map *m) {
    return !memcmp(m->magic, FSHARE_MAGIC, 8) && m->version == FSHARE_VERSION && m->bytes == KVO__FSHARE_BYTES &&
           m->slots == FSHARE_SLOTS;
}

int kvo__fshare_attach(const char *ns_dir, unsigned fmode, kvo__fshare **out, bool *first) {
    *out = NULL;
    *first = false;
    kvo__fshare *s = kvo__calloc(1, sizeof *s);
    if (!s) return kvo__error(KVO_ENOMEM, "file tier: shared accounting");
    s->fd = -1;
    snprintf(s->path, sizeof s->path, "%s/%s", ns_dir, KVO__FSHARE_NAME);
    int rc = 0;
    struct stat st;
    for (int tries = 0; tries < 3; tries++) {
        s->fd = open(s->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (s->fd >= 0 || errno != ENOENT) break;
        int e = -create_file(ns_dir, s->path, fmode);
        if (e) {
            rc = kvo__error(e == ENOSPC || e == EDQUOT ? KVO_ENOSPC : KVO_EIO, "%s: cannot create: %s", s->path,
                            strerror(e));
            goto fail;
        }
    }
    if (s->fd < 0) {
        rc = kvo__error(KVO_EIO, "%s: cannot open: %s", s->path, strerror(errno));
        goto fail;
    }
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = kvo__error(KVO_EIO, "%s: not a regular file", s->path);
        goto fail;
    }
    /* the attach lock: one process attaches at a time */
    if (ofd_lock(s->fd, F_WRLCK, 0, 1, true) != 0) {
        rc = kvo__error(KVO_ENOTSUP, "%s: no open file description locks here (%s)", s->path, strerror(errno));
        goto fail;
    }
    *first = !others_attached(s->fd);
    if ((uint64_t)st.st_size < KVO__FSHARE_BYTES) {
        /* damaged (cut short): only a process alone may rebuild it */
        if (!*first || ftruncate(s->fd, KVO__FSHARE_BYTES) != 0) {
            rc = kvo__error(KVO_EIO, "%s: %lld bytes, expected %u: damaged%s", s->path, (long long)st.st_size,
                            KVO__FSHARE_BYTES, *first ? "" : " while other processes use it");
            goto fail;
        }
    }
    void *mem = mmap(NULL, KVO__FSHARE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (mem == MAP_FAILED) {
        rc = kvo__error(KVO_EIO, "%s: mmap: %s", s->path, strerror(errno));
        goto fail;
    }
    s->m = mem;
    if (!map_valid(s->m)) {
        if (!*first) {
            rc = kvo__error(KVO_ESTATE, "%s: not a shared accounting file of this version, and other processes "
                            "use it", s->path);
            goto fail;
        }
        map_init(s->m); /* alone: rebuilt (the recount sets the counts) */
    }
    /* a slot: the first whose lock is free */
    s->slot = FSHARE_SLOTS;
    for (uint32_t i = 0; i < FSHARE_SLOTS && s->slot == FSHARE_SLOTS; i++)
        if (ofd_lock(s->fd, F_WRLCK, 1 + (off_t)i, 1, false) == 0) s->slot = i;
    if (s->slot == FSHARE_SLOTS) {
        rc = kvo__error(KVO_EBUSY, "%s: all %u slots in use", s->path, FSHARE_SLOTS);
        goto fail;
    }
    /* what a dead owner of this slot (or of any other) left reserved */
    uint64_t left = atomic_exchange(&s->m->reserved[s->slot], 0);
    sub_sat(&s->m->used, left);
    kvo__fshare_reap(s);
    *out = s;
    return 0;
fail:
    kvo__fshare_detach(s);
    return rc;
}

void kvo__fshare_attached(kvo__fshare *s) {
    if (s) ofd_lock(s->fd, F_UNLCK, 0, 1, false);
}

void kvo__fshare_detach(kvo__fshare *s) {
    if (!s) return;
    if (s->m) {
        if (s->slot < FSHARE_SLOTS) {
            uint64_t left = atomic_exchange(&s->m->reserved[s->slot], 0);
            sub_sat(&s->m->used, left);
        }
        munmap(s->m, KVO__FSHARE_BYTES);
    }
    if (s->fd >= 0) close(s->fd); /* drops this description's locks */
    kvo__free(s);
}

/* ---------------------------------------------- agreement and recount -- */

uint64_t kvo__fshare_agree(kvo__fshare *s, bool first, uint64_t configured, uint64_t clamped,
                           uint64_t *recorded_configured) {
    fshare_map *m = s->m;
    if (first || atomic_load(&m->quota) == 0) {
        atomic_store(&m->quota, clamped);
        atomic_store(&m->quota_configured, configured);
        atomic_fetch_add(&m->epoch, 1);
    }
    if (recorded_configured) *recorded_configured = atomic_load(&m->quota_configured);
    return atomic_load(&m->quota);
}

void kvo__fshare_snapshot(kvo__fshare *s, kvo__fshare_snap *snap) {
    fshare_map *m = s->m;
    /* the monotonic counters first (what lands or ends later is counted by
     * their deltas), used next, the slots last (a reservation between the
     * two is counted twice, never missed) */
    snap->landed = atomic_load(&m->landed);
    snap->unlinked = atomic_load(&m->unlinked);
    snap->used = atomic_load(&m->used);
    snap->reserved = 0;
    for (uint32_t i = 0; i < FSHARE_SLOTS; i++) snap->reserved += atomic_load(&m->reserved[i]);
}

void kvo__fshare_recount(kvo__fshare *s, bool first, const kvo__fshare_snap *before, uint64_t walked_bytes,
                         uint64_t walked_files) {
    fshare_map *m = s->m;
    if (first) {
        /* alone: nobody else writes; dead slots' reservations go */
        for (uint32_t i = 0; i < FSHARE_SLOTS; i++) atomic_store(&m->reserved[i], 0);
        atomic_store(&m->landed, atomic_load(&m->committed)); /* nothing in flight: the gaps close */
        atomic_store(&m->unlinked, atomic_load(&m->unlinking));
        atomic_store(&m->used, walked_bytes);
        atomic_store(&m->files, walked_files);
        atomic_fetch_add(&m->recounts, 1);
        return;
    }
    uint64_t target = walked_bytes + before->reserved + (atomic_load(&m->committed) - before->landed) +
                      (atomic_load(&m->unlinking) - before->unlinked);
    if (target < before->used) {
        sub_sat(&m->used, before->used - target);
        atomic_fetch_add(&m->recounts, 1);
    }
}
