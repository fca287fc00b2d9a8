/*
 * The phases of one file-tier operation, shared by both backends (the
 * thread pool in file_workers.c and the ring in uring/file_uring.c).
 *
 * What it owns
 *  - begin: a write opens its file (below), then encodes the header (the
 *    payload checksum taken as it was staged; a borrowed write's taken here
 *    from the caller's memory and, when the caller gave one, checked
 *    against theirs: a mismatch writes nothing, KVO_ECORRUPT).  The file:
 *    a recycled file of the same size (an evicted key's file, renamed
 *    here from its name to a temporary one, then overwritten
 *    in place, no O_TRUNC), else an unnamed O_TMPFILE file in the fan-out directory,
 *    else a named temporary (O_EXCL, .tmp.<host>.<pid>.<nonce>.<counter>).
 *    With file_secret (t->seal) the staged payload is sealed in place here
 *    (tiers/seal.h: XAES-256-GCM, bound to the header and the namespace).
 *    A read opens the key's file, checks its type and size.  Both set up
 *    one iov pair (4096-byte header + payload) so that one pwritev/preadv
 *    moves the whole file, with O_DIRECT when in use.
 *  - the synchronous I/O loop (io_sync), which also finishes a short ring
 *    transfer (kvo__fop_io_continue);
 *  - end: a write is fdatasync'ed when asked, linked in by name (linkat
 *    through /proc/self/fd; EEXIST: another writer placed the same key, same
 *    bytes) or renamed into place, and the directory fsync'ed with
 *    FSYNC_FULL; any failure removes the temporary and is logged.  A read
 *    checks header, key, fingerprint, geometry, layout and payload checksum
 *    (a sealed tier instead opens the payload in place and checks its tag:
 *    a file it cannot authenticate is removed like a corrupt one, counted
 *    in auth_failed).
 *  - the read verdict: a file that fails verification is removed only if
 *    the path still names the inode that was read (another process may have
 *    replaced it with a good one), logged, and reported as KVO_ECORRUPT.
 *
 * A leaf below both backends: end, the verdict and run_sync leave the
 * outcome in op->result with the descriptor closed and return; the backend
 * that ran the op then hands it back (kvo__fop_finish, file_queue.c).  It
 * calls file_quota.c (recycled files), file_format.c, file_common.c and
 * seal.c only.
 *
 * Lock rules: nothing here holds mu during I/O; the only locked steps are in
 * kvo__file_recycled_take and kvo__file_log, each short.
 *
 * Invariants: every op that begins ends exactly once (end or verdict, then
 * its backend's kvo__fop_finish) with its descriptor closed; a reader never
 * sees a partial file under a chunk name (the name appears only by link or
 * rename of a complete file).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/xxh.h"

#include "tiers/file_internal.h"
#include "tiers/seal.h"

static int open_retry_mkdir(kvo_file_tier *t, const kvo_chunk_key *k, const char *path, int flags) {
    int fd = open(path, flags, (mode_t)t->fmode);
    if (fd < 0 && errno == ENOENT) {
        char sub[3], dir[KVO__FILE_PATH_MAX];
        kvo__file_subdir(k, sub);
        snprintf(dir, sizeof dir, "%s/%s", t->ns_dir, sub);
        if (kvo__file_mkdir(dir, t->dmode) != 0 && errno != EEXIST) return -1;
        fd = open(path, flags, (mode_t)t->fmode);
    }
    kvo__file_set_mode(fd, t->fmode);
    return fd;
}

/* The whole file as one iov pair: the 4096-byte header, then the payload
 * slot (staging for a write, the caller's destination for a read). */
static void set_iov(kvo__fop *op, unsigned char *payload, const kvo_group_plan *g) {
    op->iov[0].iov_base = op->hdr;
    op->iov[0].iov_len = KVO_FILE_HEADER_BYTES;
    op->iov[1].iov_base = payload;
    op->iov[1].iov_len = g->slot_bytes;
    op->iovcnt = 2;
    op->io_bytes = kvo__file_stage_size(g);
}

/* The name a sealed chunk is bound to besides its header: the namespace
 * directory's (a file moved into another namespace fails). */
static const char *ns_name(const kvo_file_tier *t, size_t *len) {
    const char *b = strrchr(t->ns_dir, '/');
    b = b ? b + 1 : t->ns_dir;
    *len = strlen(b);
    return b;
}

/* Begin a write: header into op->hdr, the file opened (a recycled file, an
 * unnamed O_TMPFILE file, or a named temporary), iov = header + staging.
 * 0 or -errno. */
static int write_begin(kvo_file_tier *t, kvo__fop *op, const kvo_group_plan *g) {
    char sub[3];
    kvo__file_subdir(&op->key, sub);
    snprintf(op->tmp, sizeof op->tmp, "%s/%s/%s%08x.%ld.%08x.%u", t->ns_dir, sub, KVO__FILE_TMP_PREFIX,
             t->hostid, t->pid, t->nonce, atomic_fetch_add(&t->tmp_counter, 1));
    op->recycled = false;
    if (kvo__file_recycled_take(t, kvo__file_stage_size(g), op->tmp)) {
        /* an evicted file of the same size, renamed out of its name to
         * op->tmp: overwrite it in place (no O_TRUNC: its blocks stay
         * allocated), then rename it to the key's name */
        op->fd = open(op->tmp, O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0));
        if (op->fd >= 0) op->recycled = true;
        else unlink(op->tmp);
    }
    if (op->recycled) {
        /* nothing more to open */
    } else if (t->tmpfile) {
        /* an unnamed file in the fan-out directory, linked in when whole */
        snprintf(op->tmp, sizeof op->tmp, "%s/%s", t->ns_dir, sub);
        op->fd = open_retry_mkdir(t, &op->key, op->tmp, O_TMPFILE | O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0));
        op->tmp[0] = 0;
    } else {
        int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (t->direct ? O_DIRECT : 0);
        op->fd = open_retry_mkdir(t, &op->key, op->tmp, flags);
    }
    if (op->fd < 0) {
        op->tmp[0] = 0;
        return -errno;
    }
    int inj = kvo__file_take_injected();
    if (inj) return -inj;
    int delay = atomic_load(&kvo__file_test_write_delay_us);
    if (delay > 0) usleep((useconds_t)delay);
    if (op->borrowed) { /* the caller's bytes, read in place, as late as possible */
        uint64_t sum = XXH3_64bits(op->stage, g->chunk_bytes);
        if (op->expect && sum != op->sum) return -EBADMSG; /* changed since the caller's sum: no file */
        op->sum = sum;
    }
    kvo__file_hdr h;
    kvo__file_hdr_init(&h, t->plan, t->p.layout_hash, g, &op->key, t->seal ? 0 : op->sum);
    h.sealed = t->seal != NULL;
    kvo__file_hdr_encode(&h, op->hdr);
    if (t->seal) { /* in place: the stage is ours (a sealed tier lends nothing, see can_borrow) */
        size_t nl;
        const char *name = ns_name(t, &nl);
        kvo__seal_op *so = kvo__seal_op_take(t->seal);
        int rc = so ? kvo__seal_value(so, op->hdr, name, nl, op->stage, op->stage, g->chunk_bytes) : KVO_ENOMEM;
        kvo__seal_op_give(t->seal, so);
        if (rc) return rc == KVO_ENOMEM ? -ENOMEM : -EIO;
    }
    set_iov(op, op->stage, g);
    return 0;
}

/* Begin a read: open, check type and size, iov = header + destination.
 * 0 or a KVO_E* verdict. */
static int read_begin(kvo__fop *op, const kvo_group_plan *g) {
    /* O_NONBLOCK for the open (a FIFO under a chunk name would block it
     * forever, and with it the ring), then S_ISREG; a file that cannot be
     * opened for good (symbolic link loop, permission) is dropped from the
     * index like a corrupt one, but not removed. */
    struct stat st;
    int flags = O_RDONLY | O_CLOEXEC | (op->direct ? O_DIRECT : 0);
    op->fd = kvo__file_open_regular(op->path, flags, &st);
    if (op->fd == KVO_EIO && op->direct) { /* O_DIRECT refused (EINVAL): once more without */
        op->direct = false;
        op->fd = kvo__file_open_regular(op->path, O_RDONLY | O_CLOEXEC, &st);
    }
    if (op->fd < 0) {
        int rc = op->fd;
        op->fd = -1;
        if (rc == KVO_ECORRUPT) op->unreadable = true;
        return rc;
    }
    if ((uint64_t)st.st_size != kvo__file_stage_size(g)) {
        kvo__error(KVO_ECORRUPT, "%s: %s (%lld bytes, expected %llu)", op->path,
                   st.st_size == 0 ? "zero-length file" : "wrong size: truncated or foreign", (long long)st.st_size,
                   (unsigned long long)kvo__file_stage_size(g));
        return KVO_ECORRUPT;
    }
    set_iov(op, op->dst, g);
    return 0;
}

int kvo__fop_begin(kvo_file_tier *t, kvo__fop *op) {
    kvo__file_key_path(t, &op->key, op->path);
    return op->kind == KVO__FOP_WRITE ? write_begin(t, op, op->g) : read_begin(op, op->g);
}

/* Move the remaining bytes of op's iov with pwritev/preadv starting from
 * `done` bytes already moved.  Returns total moved or -errno; a read that
 * hits end of file returns the short count. */
static int64_t io_sync(kvo__fop *op, uint64_t done) {
    while (done < op->io_bytes) {
        struct iovec iov[2];
        int cnt = 0;
        uint64_t skip = done;
        for (int i = 0; i < op->iovcnt; i++) {
            if (skip >= op->iov[i].iov_len) { skip -= op->iov[i].iov_len; continue; }
            iov[cnt].iov_base = (unsigned char *)op->iov[i].iov_base + skip;
            iov[cnt].iov_len = op->iov[i].iov_len - skip;
            skip = 0;
            cnt++;
        }
        ssize_t r = op->kind == KVO__FOP_WRITE ? pwritev(op->fd, iov, cnt, (off_t)done)
                                               : preadv(op->fd, iov, cnt, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) {
            if (op->kind == KVO__FOP_WRITE) return -ENOSPC;
            break;
        }
        done += (uint64_t)r;
    }
    return (int64_t)done;
}

int64_t kvo__fop_io_continue(kvo__fop *op, uint64_t done) { return io_sync(op, done); }

static void fsync_dir(const char *file_path) {
    char dir[KVO__FILE_PATH_MAX];
    kvo__strlcpy(dir, file_path, sizeof dir);
    char *s = strrchr(dir, '/');
    if (!s) return;
    *s = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static int errno_to_result(int e) {
    if (e == EBADMSG) return KVO_ECORRUPT; /* a lent source that no longer matched its sum */
    return (e == ENOSPC || e == EDQUOT || e == EFBIG) ? KVO_ENOSPC : KVO_EIO;
}

/* A read's verdict: remove a bad file, close, set the result. */
void kvo__fop_read_verdict(kvo_file_tier *t, kvo__fop *op, int rc) {
    if (rc == KVO_ECORRUPT && op->unreadable) {
        /* not a regular file (FIFO, directory, symbolic link: the tier
         * never makes those under a chunk name): removed; an unopenable
         * regular file (permission) is only dropped from the index */
        char why[512];
        kvo__strlcpy(why, kvo_last_error(), sizeof why);
        struct stat b;
        bool rm = lstat(op->path, &b) == 0 && !S_ISREG(b.st_mode) && kvo__file_remove_any(op->path) == 0;
        kvo__file_log(t, KVO__FLOG_CORRUPT, "%s: dropped from the index%s", why, rm ? ", removed" : "");
    } else if (rc == KVO_ECORRUPT) {
        char why[512];
        kvo__strlcpy(why, kvo_last_error(), sizeof why);
        /* Remove it only if the path still names the file we read. */
        struct stat a, b;
        if (op->fd >= 0 && fstat(op->fd, &a) == 0 && lstat(op->path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            kvo__file_remove_any(op->path);
        kvo__file_log(t, KVO__FLOG_CORRUPT, "%s: failed verification, removed: %s", op->path, why);
    } else if (rc == KVO_EIO) {
        kvo__file_log(t, KVO__FLOG_IO, "read failed: %s", kvo_last_error());
    }
    if (op->fd >= 0) close(op->fd);
    op->fd = -1;
    op->result = rc;
}

/* End a write: the I/O outcome, optional fdatasync, link or rename into
 * place, optional directory fsync; a failure removes the temporary file and
 * is logged.  Sets op->result. */
static void write_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res) {
    int e = 0;
    if (io_res < 0) e = (int)-io_res;
    else if ((uint64_t)io_res < op->io_bytes) e = ENOSPC;
    if (!e && t->p.fsync != KVO_FILE_FSYNC_NONE && fdatasync(op->fd) != 0) e = errno;
    bool linked = t->tmpfile && !op->recycled;
    if (!e && linked) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", op->fd);
        /* EEXIST: another writer linked the same key first (same bytes) */
        if (linkat(AT_FDCWD, proc, AT_FDCWD, op->path, AT_SYMLINK_FOLLOW) != 0 && errno != EEXIST) e = errno;
    }
    if (op->fd >= 0 && close(op->fd) != 0 && !e) e = errno;
    op->fd = -1;
    if (!e && !linked && rename(op->tmp, op->path) != 0) {
        e = errno;
        if (e == ENOENT && op->recycled) { /* the key's directory does not exist yet */
            char sub[3], dir[KVO__FILE_PATH_MAX];
            kvo__file_subdir(&op->key, sub);
            snprintf(dir, sizeof dir, "%s/%s", t->ns_dir, sub);
            if ((kvo__file_mkdir(dir, t->dmode) == 0 || errno == EEXIST) && rename(op->tmp, op->path) == 0) e = 0;
        }
    }
    if (!e && t->p.fsync == KVO_FILE_FSYNC_FULL) fsync_dir(op->path);
    if (e) {
        if (op->tmp[0]) unlink(op->tmp);
        op->result = errno_to_result(e);
        if (op->result == KVO_ENOSPC)
            kvo__file_log(t, KVO__FLOG_NOSPC, "%s: no space (%s): chunk write dropped", t->ns_dir, strerror(e));
        else if (op->result == KVO_ECORRUPT)
            kvo__file_log(t, KVO__FLOG_IO, "%s: the lent chunk changed after the caller's checksum: not written",
                          op->path);
        else
            kvo__file_log(t, KVO__FLOG_IO, "%s: write failed (%s): chunk write dropped", op->path, strerror(e));
    } else {
        op->result = 0;
    }
}

/* A read of a sealed tier, or of a sealed file: open the payload in place
 * (the tag authenticates it; the payload checksum is 0).  A file this tier
 * cannot authenticate fails with op->auth_failed set (counted apart from
 * corrupt files; removed like them). */
static int read_open(kvo_file_tier *t, kvo__fop *op, const kvo__file_hdr *h, const kvo_group_plan *g) {
    int rc;
    if (!t->seal)
        rc = kvo__error(KVO_ECORRUPT, "a sealed chunk (format version %u), and this tier has no file_secret",
                        KVO__FILE_VERSION_SEALED);
    else if (!h->sealed)
        rc = kvo__error(KVO_ECORRUPT, "not sealed, and this tier seals its chunks (file_secret): written without "
                        "the secret, or forged");
    else {
        size_t nl;
        const char *name = ns_name(t, &nl);
        kvo__seal_op *so = kvo__seal_op_take(t->seal);
        if (!so) return KVO_EIO; /* out of memory: a read error, the file stays */
        rc = kvo__seal_open(so, op->hdr, name, nl, op->dst, op->dst, g->chunk_bytes);
        kvo__seal_op_give(t->seal, so);
        if (rc == KVO_EIO) return rc;
    }
    op->auth_failed = rc != 0;
    return rc;
}

/* End a read: the I/O outcome, then header, key, fingerprint, geometry,
 * layout and payload checksum; then the verdict. */
static void read_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res, const kvo_group_plan *g) {
    int rc = 0;
    if (io_res < 0) {
        rc = io_res == -EISDIR ? KVO_ECORRUPT : KVO_EIO;
        if (rc == KVO_EIO) kvo__error(rc, "%s: read: %s", op->path, strerror((int)-io_res));
    } else if ((uint64_t)io_res < op->io_bytes) {
        rc = kvo__error(KVO_ECORRUPT, "%s: truncated while reading (%lld of %llu bytes)", op->path,
                        (long long)io_res, (unsigned long long)op->io_bytes);
    } else {
        kvo__file_hdr h;
        rc = kvo__file_hdr_decode(op->hdr, KVO_FILE_HEADER_BYTES, &h);
        if (!rc) rc = kvo__file_hdr_check(&h, t->plan, &op->key);
        if (!rc) rc = kvo__file_hdr_check_layout(&h, t->p.layout_hash);
        if (!rc && (h.sealed || t->seal)) rc = read_open(t, op, &h, g);
        else if (!rc) {
            uint64_t sum = XXH3_64bits(op->dst, g->chunk_bytes);
            if (sum != h.payload_xxh3)
                rc = kvo__error(KVO_ECORRUPT, "payload checksum mismatch (stored %016llx, computed %016llx)",
                                (unsigned long long)h.payload_xxh3, (unsigned long long)sum);
        }
        /* the padding (under 4 KiB) is not in the checksum: it must be zero,
         * so that a read never returns bytes the writer did not write */
        for (uint64_t i = g->chunk_bytes; !rc && i < g->slot_bytes; i++)
            if (op->dst[i])
                rc = kvo__error(KVO_ECORRUPT, "non-zero padding at payload offset %llu", (unsigned long long)i);
    }
    kvo__fop_read_verdict(t, op, rc);
}

void kvo__fop_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res) {
    if (op->kind == KVO__FOP_WRITE) write_end(t, op, io_res);
    else read_end(t, op, io_res, op->g);
}

void kvo__fop_run_sync(kvo_file_tier *t, kvo__fop *op) {
    int rc = kvo__fop_begin(t, op);
    if (rc != 0 && op->kind == KVO__FOP_READ) {
        kvo__fop_read_verdict(t, op, rc);
        return;
    }
    kvo__fop_end(t, op, rc < 0 ? rc : io_sync(op, 0));
}

