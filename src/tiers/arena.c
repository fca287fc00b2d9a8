/*
 * Host arena: the memory behind a store's slots.
 *
 * One mapping, made once at creation and never grown or moved, so slot
 * addresses stay valid for the arena's life and can be registered once with a
 * DMA engine.  First touch of fresh memory is slow on these machines
 * (0.4-0.9 GB/s against 11+ GB/s copies into resident pages), so the arena
 * pre-faults every page at creation (MADV_POPULATE_WRITE where the kernel has
 * it, else a write to each page) instead of paying it on the first stores.
 *
 * Options:
 *  - huge pages: MAP_HUGETLB first (needs reserved huge pages); when refused,
 *    normal pages with madvise(MADV_HUGEPAGE) before the pre-fault so that
 *    transparent huge pages back it where enabled (fewer TLB misses for 50 MB
 *    slots), unless require_huge_pages asks to fail instead;
 *  - lock: mlock, so the kernel never swaps KV data out (fails cleanly when
 *    RLIMIT_MEMLOCK is too low);
 *  - shm_path: a file (normally under /dev/shm) mapped MAP_SHARED, so several
 *    worker processes of one engine map the same bytes.  The first creator
 *    sizes it; later ones map it as is and must ask for the same size.
 *  - owned sharing (shm_path + share_processes): the processes of one engine
 *    (vLLM's scheduler and workers) map one file that starts with a 4096-byte
 *    header (magic, version, data bytes, plan fingerprint, a random instance
 *    id, processes expected / attached, their pids), read and written with
 *    pread/pwrite under flock.  The first process creates it with O_EXCL;
 *    the others wait for the header and check bytes and fingerprint, so an
 *    engine never attaches to another's arena by mistake.  The last expected
 *    process unlinks the name: from then on the memory lives exactly as long
 *    as the mappings, so a crash, however late, leaves nothing behind, and a
 *    later engine under the same name gets a fresh region.  A crash before
 *    everyone attached leaves a file whose recorded pids are all dead: the
 *    next creator under that name (or kvo_arena_sweep_stale) removes it;
 *    so does a file whose header says nobody attached yet while nobody holds
 *    its lock (the creator holds it from before writing the header until it
 *    attached: it died in between).
 *    Slot space starts after the header; base and slots never include it.
 *
 * Other local users (docs/security.md): a name under /dev/shm is guessable,
 * so another user could plant a file there (mode 0666, a forged header) or a
 * symbolic link to a file of theirs, and read or write the engine's KV
 * through it.  Every file is therefore opened with O_NOFOLLOW (a link at the
 * name is refused) and must be a regular file of this process's uid with no
 * group or other permission bits (fstat); anything else is refused with a
 * message naming the path, the owner and the mode, and left alone.
 *
 * The arena has no state that changes after creation, so every accessor is
 * thread-safe.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"

struct kvo_arena {
    void *base;        /* slot space: map, or map + header when owned */
    void *map;         /* the mapping */
    uint64_t bytes;    /* as requested */
    uint64_t map_len;  /* mapped length (page rounded) */
    bool huge, locked, unlink_at_end;
    bool owned, creator;  /* owned sharing; this process made the file */
    kvo_u128 instance;
    char *shm_path;
};

/* ------------------------------------------------------ owned sharing -- */

#define KVO__SHM_MAGIC "KVOSHM01"
#define KVO__SHM_VERSION 1u
#define KVO__SHM_HEADER 4096u
#define KVO__SHM_PIDS 16

/* The header as stored (little-endian machines only, like the rest of the
 * slot formats; packed fields in this order, 128 bytes). */
typedef struct kvo__shm_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t data_bytes;
    kvo_u128 fingerprint, instance;
    uint32_t expected, attached;
    int32_t pids[KVO__SHM_PIDS];
} kvo__shm_header;

static bool kvo__pid_alive(int32_t pid) {
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

static bool kvo__shm_read(int fd, kvo__shm_header *h) {
    return pread(fd, h, sizeof *h, 0) == (ssize_t)sizeof *h && memcmp(h->magic, KVO__SHM_MAGIC, 8) == 0;
}

/* A file nobody can still be using (the caller holds its flock): a header
 * whose processes are all dead, a header nobody attached to (its creator
 * holds the lock until it attached, so it died in between), or no header
 * 10 s after the file was made (its creator died at once). */
static bool kvo__shm_stale(int fd) {
    kvo__shm_header h;
    if (!kvo__shm_read(fd, &h)) {
        struct stat st;
        return fstat(fd, &st) == 0 && time(NULL) - st.st_mtime > 10;
    }
    if (h.attached == 0) return true;
    for (uint32_t i = 0; i < KVO__SHM_PIDS; i++)
        if (kvo__pid_alive(h.pids[i])) return false;
    return true;
}

/* An arena file must be private to this uid: a regular file it owns with no
 * group or other permission bits.  0, or KVO_ESTATE naming path, owner and
 * mode (the file is not ours to remove). */
static int kvo__shm_check_private(const char *path, int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return kvo__error(KVO_EIO, "kvo_arena_create: fstat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0)
        return kvo__error(KVO_ESTATE,
                          "kvo_arena_create: '%s' is %s owned by uid %u with mode %04o; an arena file must be a "
                          "regular file of this user (uid %u) with mode 0600, or another local user could read or "
                          "write the KV cache: remove it (or use another name)",
                          path, S_ISREG(st.st_mode) ? "a file" : "not a regular file", (unsigned)st.st_uid,
                          (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
    return 0;
}

/* open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600) and the private check.
 * -1 with *rc set (a symbolic link at the name is refused), or -1 with *rc
 * 0 when the file vanished (without O_CREAT). */
static int kvo__shm_open_private(const char *path, int flags, int *rc) {
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC, 0600);
    *rc = 0;
    if (fd < 0 && errno == ENOENT && !(flags & O_CREAT)) return -1; /* gone meanwhile: *rc 0, try again */
    if (fd < 0) {
        *rc = errno == ELOOP ? kvo__error(KVO_ESTATE, "kvo_arena_create: '%s' is a symbolic link: refused (an "
                                          "arena file must be a regular file of this user; remove the link or use "
                                          "another name)", path)
                             : kvo__error(KVO_EIO, "kvo_arena_create: cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    if ((*rc = kvo__shm_check_private(path, fd)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void kvo__sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Open or create the owned file of p->shm_path, locked (flock) with a valid
 * header; *creator tells which.  Errors name the path. */
static int kvo__shm_open_owned(const kvo_arena_params *p, uint64_t total, int *fd_out, bool *creator,
                               kvo_u128 *instance) {
    long waited = 0, limit = p->share_timeout_ms ? (long)p->share_timeout_ms : 60000;
    for (;;) {
        int fd = open(p->shm_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            kvo__shm_header h;
            memset(&h, 0, sizeof h);
            memcpy(h.magic, KVO__SHM_MAGIC, 8);
            h.version = KVO__SHM_VERSION;
            h.header_bytes = KVO__SHM_HEADER;
            h.data_bytes = p->bytes;
            h.fingerprint = p->share_fingerprint;
            h.expected = p->share_processes;
            if (flock(fd, LOCK_EX) != 0 || getrandom(&h.instance, sizeof h.instance, 0) != (ssize_t)sizeof h.instance ||
                ftruncate(fd, (off_t)total) != 0 || pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
                int e = errno;
                unlink(p->shm_path);
                close(fd);
                return kvo__error(KVO_EIO, "kvo_arena_create: cannot create '%s' of %llu bytes: %s", p->shm_path,
                                  (unsigned long long)total, strerror(e));
            }
            *fd_out = fd;
            *creator = true;
            *instance = h.instance;
            return 0;
        }
        if (errno != EEXIST)
            return kvo__error(KVO_EIO, "kvo_arena_create: cannot create '%s': %s", p->shm_path, strerror(errno));
        int rc = 0;
        fd = kvo__shm_open_private(p->shm_path, O_RDWR, &rc);
        if (fd < 0 && rc != 0) return rc; /* planted, a link: refused at once */
        if (fd >= 0 && flock(fd, LOCK_EX) == 0) {
            kvo__shm_header h;
            struct stat st;
            bool valid = kvo__shm_read(fd, &h);
            if (valid && h.attached < h.expected && !kvo__shm_stale(fd)) {
                if (h.version != KVO__SHM_VERSION || h.data_bytes != p->bytes ||
                    h.fingerprint.lo != p->share_fingerprint.lo || h.fingerprint.hi != p->share_fingerprint.hi) {
                    close(fd);
                    return kvo__error(KVO_ESTATE,
                                      "kvo_arena_create: '%s' belongs to another configuration: %llu bytes, plan "
                                      "%016llx%016llx; this process has %llu bytes, plan %016llx%016llx (same "
                                      "model, plan and capacity needed, or another arena name)",
                                      p->shm_path, (unsigned long long)h.data_bytes,
                                      (unsigned long long)h.fingerprint.hi, (unsigned long long)h.fingerprint.lo,
                                      (unsigned long long)p->bytes, (unsigned long long)p->share_fingerprint.hi,
                                      (unsigned long long)p->share_fingerprint.lo);
                }
                if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == total) {
                    *fd_out = fd;
                    *creator = false;
                    *instance = h.instance;
                    return 0;
                }
            } else if (valid ? (h.attached >= h.expected || kvo__shm_stale(fd)) : kvo__shm_stale(fd)) {
                unlink(p->shm_path);  /* a crashed start-up's leftover */
            }
        }
        if (fd >= 0) close(fd);
        if (waited >= limit)
            return kvo__error(KVO_ETIMEDOUT,
                              "kvo_arena_create: '%s' has no valid header after %ld ms (its creator died while "
                              "starting? remove the file)",
                              p->shm_path, waited);
        kvo__sleep_ms(5);
        waited += 5;
    }
}

/* Record this process in the header (fd locked); the last expected process
 * unlinks the name.  Unlocks. */
static int kvo__shm_attach(const char *path, int fd) {
    kvo__shm_header h;
    int rc = 0;
    if (!kvo__shm_read(fd, &h)) {
        rc = kvo__error(KVO_EIO, "kvo_arena_create: header of '%s' unreadable", path);
    } else {
        h.pids[h.attached % KVO__SHM_PIDS] = (int32_t)getpid();
        h.attached++;
        if (pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
            rc = kvo__error(KVO_EIO, "kvo_arena_create: cannot update '%s': %s", path, strerror(errno));
        else if (h.attached >= h.expected)
            unlink(path);  /* everyone mapped it: the name goes, the memory stays */
    }
    flock(fd, LOCK_UN);
    return rc;
}

static int kvo__arena_create_owned(const kvo_arena_params *p, kvo_arena *a) {
    uint64_t total;
    if (kvo__add_u64(p->bytes, KVO__SHM_HEADER, &total) || total > (uint64_t)SIZE_MAX / 2)
        return kvo__error(KVO_ERANGE, "kvo_arena_create: %llu bytes is too large", (unsigned long long)p->bytes);
    int fd = -1, rc;
    if ((rc = kvo__shm_open_owned(p, total, &fd, &a->creator, &a->instance))) return rc;
    uint64_t len = kvo__align_up_u64(total, 4096);
    void *map = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: mmap of %llu bytes of '%s' failed: %s",
                        (unsigned long long)len, p->shm_path, strerror(errno));
    } else if ((rc = kvo__shm_attach(p->shm_path, fd))) {
        munmap(map, (size_t)len);
    }
    if (rc && a->creator) unlink(p->shm_path);
    close(fd);
    if (rc) return rc;
    a->owned = true;
    a->map = map;
    a->map_len = len;
    a->base = (unsigned char *)map + KVO__SHM_HEADER;
    if (p->huge_pages) (void)madvise(map, (size_t)len, MADV_HUGEPAGE);
    return 0;
}

int kvo_arena_sweep_stale(const char *dir, const char *prefix, size_t *n_removed) {
    if (!dir || !prefix) return kvo__error(KVO_EINVAL, "kvo_arena_sweep_stale: NULL %s", !dir ? "dir" : "prefix");
    DIR *d = opendir(dir);
    if (!d) return kvo__error(KVO_EIO, "kvo_arena_sweep_stale: cannot read '%s': %s", dir, strerror(errno));
    size_t n = 0, plen = strlen(prefix);
    char path[4096];
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_uid != geteuid()) { /* another user's: not ours to judge */
            close(fd);
            continue;
        }
        kvo__shm_header h;
        bool ours = kvo__shm_read(fd, &h) || pread(fd, &h, 1, 0) == 0;  /* a header, or still empty */
        if (ours && flock(fd, LOCK_EX | LOCK_NB) == 0 && kvo__shm_stale(fd) && unlink(path) == 0) n++;
        close(fd);
    }
    closedir(d);
    if (n_removed) *n_removed = n;
    return 0;
}

kvo_arena_params kvo_arena_default_params(void) {
    kvo_arena_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.prefault = true;
    return p;
}

/* Fault every page in.  MADV_POPULATE_WRITE (Linux 5.14) never changes the
 * contents.  The fallback writes to private anonymous memory, which nobody
 * else can see yet; a shared file may already be in use by another process,
 * so there it only reads (a read fault allocates shmem pages too), never
 * rewriting a byte another process may be writing. */
static void kvo__prefault(void *base, uint64_t len, bool shared) {
#ifdef MADV_POPULATE_WRITE
    if (madvise(base, len, MADV_POPULATE_WRITE) == 0) return;
#endif
    volatile unsigned char *p = base;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    unsigned sum = 0;
    for (uint64_t off = 0; off < len; off += (uint64_t)pg) {
        if (shared) sum += p[off];
        else p[off] = 0;
    }
    (void)sum;
}

int kvo_arena_create(const kvo_arena_params *p, kvo_arena **out) {
    kvo_arena_params p_in_;
    KVO__PARAMS_IN(p, kvo_arena_params, p_in_, kvo_arena_default_params, require_huge_pages, "kvo_arena_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_arena_create: NULL %s", !p ? "params" : "out");
    if (p->bytes == 0) return kvo__error(KVO_EINVAL, "kvo_arena_create: bytes is 0");
    uint64_t len = kvo__align_up_u64(p->bytes, 4096);
    if (len == 0 || len > (uint64_t)SIZE_MAX / 2)
        return kvo__error(KVO_ERANGE, "kvo_arena_create: %llu bytes is too large", (unsigned long long)p->bytes);
    kvo_arena *a = kvo__calloc(1, sizeof *a);
    if (!a) return kvo__error(KVO_ENOMEM, "kvo_arena_create: out of memory");
    a->bytes = p->bytes;
    int rc = 0, fd = -1;
    void *base = MAP_FAILED;
    if (p->shm_path && p->share_processes > 0) {
        a->shm_path = kvo__strdup(p->shm_path);
        if (!a->shm_path) {
            rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: out of memory");
        } else if ((rc = kvo__arena_create_owned(p, a)) == 0) {
            if (p->prefault) kvo__prefault(a->map, a->map_len, true);
            if (p->lock && mlock(a->map, (size_t)a->map_len) != 0) {
                rc = kvo__error(KVO_ENOTSUP, "kvo_arena_create: mlock of %llu bytes of '%s' failed (%s); raise "
                                "RLIMIT_MEMLOCK (ulimit -l) or create the arena without lock",
                                (unsigned long long)a->map_len, p->shm_path, strerror(errno));
                kvo_arena_destroy(a);
                return rc;
            }
            a->locked = p->lock;
            *out = a;
            return 0;
        }
        kvo__free(a->shm_path);
        kvo__free(a);
        return rc;
    }
    if (p->shm_path) {
        a->shm_path = kvo__strdup(p->shm_path);
        if (!a->shm_path) {
            rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: out of memory");
            goto fail;
        }
        fd = kvo__shm_open_private(p->shm_path, O_RDWR | O_CREAT, &rc);
        if (fd < 0) goto fail;
        struct stat st;
        if (fstat(fd, &st) != 0) {
            rc = kvo__error(KVO_EIO, "kvo_arena_create: fstat '%s': %s", p->shm_path, strerror(errno));
            goto fail;
        }
        if (st.st_size == 0) {
            if (ftruncate(fd, (off_t)p->bytes) != 0) {
                rc = kvo__error(KVO_EIO, "kvo_arena_create: cannot size '%s' to %llu bytes: %s", p->shm_path,
                                (unsigned long long)p->bytes, strerror(errno));
                goto fail;
            }
        } else if ((uint64_t)st.st_size != p->bytes) {
            rc = kvo__error(KVO_EINVAL,
                            "kvo_arena_create: '%s' holds %llu bytes, asked for %llu; every process of one arena "
                            "must ask for the same size (or remove the file)",
                            p->shm_path, (unsigned long long)st.st_size, (unsigned long long)p->bytes);
            goto fail;
        }
        base = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED) {
            rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: mmap of %llu bytes of '%s' failed: %s",
                            (unsigned long long)len, p->shm_path, strerror(errno));
            goto fail;
        }
        a->unlink_at_end = p->shm_unlink;
        if (p->huge_pages) {
            if (madvise(base, (size_t)len, MADV_HUGEPAGE) != 0 && p->require_huge_pages) {
                rc = kvo__error(KVO_ENOTSUP, "kvo_arena_create: huge pages refused for '%s': %s", p->shm_path,
                                strerror(errno));
                goto fail;
            }
        }
    } else {
        if (p->huge_pages) {
            uint64_t hlen = kvo__align_up_u64(p->bytes, UINT64_C(2) << 20);
            base = mmap(NULL, (size_t)hlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1,
                        0);
            if (base != MAP_FAILED) {
                len = hlen;
                a->huge = true;
            } else if (p->require_huge_pages) {
                rc = kvo__error(KVO_ENOTSUP,
                                "kvo_arena_create: MAP_HUGETLB refused for %llu bytes (%s); reserve huge pages "
                                "(vm.nr_hugepages) or drop require_huge_pages",
                                (unsigned long long)hlen, strerror(errno));
                goto fail;
            }
        }
        if (base == MAP_FAILED) {
            base = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (base == MAP_FAILED) {
                rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: mmap of %llu bytes failed: %s",
                                (unsigned long long)len, strerror(errno));
                goto fail;
            }
            if (p->huge_pages) (void)madvise(base, (size_t)len, MADV_HUGEPAGE);
        }
    }
    a->base = a->map = base;
    a->map_len = len;
    if (p->prefault) kvo__prefault(base, len, p->shm_path != NULL);
    if (p->lock) {
        if (mlock(base, (size_t)len) != 0) {
            rc = kvo__error(KVO_ENOTSUP,
                            "kvo_arena_create: mlock of %llu bytes failed (%s); raise RLIMIT_MEMLOCK (ulimit -l) "
                            "or create the arena without lock",
                            (unsigned long long)len, strerror(errno));
            goto fail;
        }
        a->locked = true;
    }
    if (fd >= 0) close(fd);
    *out = a;
    return 0;
fail:
    if (base != MAP_FAILED) munmap(base, (size_t)len);
    if (fd >= 0) close(fd);
    kvo__free(a->shm_path);
    kvo__free(a);
    return rc;
}

/* The creator removes the name at the end if nobody else took it (the file
 * under the name is still its own: same instance id). */
static void kvo__shm_unlink_own(const kvo_arena *a) {
    int fd = open(a->shm_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    kvo__shm_header h;
    if (kvo__shm_read(fd, &h) && h.instance.lo == a->instance.lo && h.instance.hi == a->instance.hi)
        unlink(a->shm_path);
    close(fd);
}

void kvo_arena_destroy(kvo_arena *a) {
    if (!a) return;
    if (a->locked) munlock(a->map, (size_t)a->map_len);
    munmap(a->map, (size_t)a->map_len);
    if (a->owned && a->creator) kvo__shm_unlink_own(a);
    else if (a->unlink_at_end && a->shm_path) unlink(a->shm_path);
    kvo__free(a->shm_path);
    kvo__free(a);
}

void *kvo_arena_base(const kvo_arena *a) { return a ? a->base : NULL; }
uint64_t kvo_arena_size(const kvo_arena *a) { return a ? a->bytes : 0; }
bool kvo_arena_huge(const kvo_arena *a) { return a && a->huge; }
bool kvo_arena_locked(const kvo_arena *a) { return a && a->locked; }
bool kvo_arena_creator(const kvo_arena *a) { return a && a->creator; }

kvo_u128 kvo_arena_instance(const kvo_arena *a) {
    kvo_u128 z = {0, 0};
    return a ? a->instance : z;
}

void *kvo_arena_slot(const kvo_arena *a, kvo_slot slot) {
    uint64_t end;
    if (!a || kvo__add_u64(slot.offset, slot.bytes, &end) || end > a->bytes) return NULL;
    return (unsigned char *)a->base + slot.offset;
}
