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
 *
 * The arena has no state that changes after creation, so every accessor is
 * thread-safe.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"

struct kvo_arena {
    void *base;
    uint64_t bytes;    /* as requested */
    uint64_t map_len;  /* mapped length (page rounded) */
    bool huge, locked, unlink_at_end;
    char *shm_path;
};

kvo_arena_params kvo_arena_default_params(void) {
    kvo_arena_params p;
    memset(&p, 0, sizeof p);
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
    if (p->shm_path) {
        a->shm_path = kvo__strdup(p->shm_path);
        if (!a->shm_path) {
            rc = kvo__error(KVO_ENOMEM, "kvo_arena_create: out of memory");
            goto fail;
        }
        fd = open(p->shm_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            rc = kvo__error(KVO_EIO, "kvo_arena_create: cannot open '%s': %s", p->shm_path, strerror(errno));
            goto fail;
        }
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
    a->base = base;
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

void kvo_arena_destroy(kvo_arena *a) {
    if (!a) return;
    if (a->locked) munlock(a->base, (size_t)a->map_len);
    munmap(a->base, (size_t)a->map_len);
    if (a->unlink_at_end && a->shm_path) unlink(a->shm_path);
    kvo__free(a->shm_path);
    kvo__free(a);
}

void *kvo_arena_base(const kvo_arena *a) { return a ? a->base : NULL; }
uint64_t kvo_arena_size(const kvo_arena *a) { return a ? a->bytes : 0; }
bool kvo_arena_huge(const kvo_arena *a) { return a && a->huge; }
bool kvo_arena_locked(const kvo_arena *a) { return a && a->locked; }

void *kvo_arena_slot(const kvo_arena *a, kvo_slot slot) {
    uint64_t end;
    if (!a || kvo__add_u64(slot.offset, slot.bytes, &end) || end > a->bytes) return NULL;
    return (unsigned char *)a->base + slot.offset;
}
