/*
 * The file tier's I/O backends: the pool of io_threads worker threads and,
 * when it works, the io_uring ring for reads (uring/file_uring.c).
 *
 * What it owns
 *  - Writes always run on the pool of io_threads threads (a write is bound
 *    by creating a file: open, block allocation, link, which io_uring would
 *    only hand to its own workers; measured best with 2-4 in parallel);
 *    reads run on io_uring when it works, else on the same pool.
 *  - A worker takes the next op of its kinds (file_queue.c), runs its
 *    phases synchronously (file_ops.c) and hands it back (kvo__fop_finish).
 *  - Starting and stopping the backends (ring first, then threads; stop
 *    cancels queued reads, lets queued writes finish).
 *  - With the shared accounting (file_share.c), a write's phases run one by
 *    one, so that its bytes are committed (a file now, no longer a
 *    reservation) between the I/O and the link, and afterwards the name is
 *    checked: when it does not name the inode this write made (another
 *    process linked the same key first), the write did not create a file and
 *    its bytes are dropped from the count; a failed write releases its
 *    reservation.
 *
 * Layering: called by file_tier.c only; calls uring/file_uring.c,
 * file_ops.c and file_queue.c, none of which calls back into it (the ring
 * is woken through t->ring_kick, set here).
 *
 * Lock rules: mu is taken only to set closing; workers sleep on work_cv
 * inside kvo__fop_next.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/file_internal.h"

/* A write with the shared accounting: begin, I/O, commit, link, end, then
 * who made the name.  With O_TMPFILE this worker links the file itself
 * right after the commit (after fdatasync when the policy asks for it, as
 * end would): linkat succeeds only for the one writer that creates the
 * name, EEXIST for every other, which is exactly who counts the file; end's
 * own link then finds the name taken (EEXIST, a success for it).  Only if
 * the name vanished between the two links does end's link make it: then
 * the name holds this write's inode.  With named temporaries end renames
 * over whatever is there: a file that existed before was counted by its own
 * writer, so the bytes of this one are dropped (a rename racing an unlink
 * of that file may leave one file miscounted until the next recount). */
static void write_shared(kvo_file_tier *t, kvo__fop *op) {
    uint64_t x = op->g->slot_bytes;
    int rc = kvo__fop_begin(t, op);
    int64_t io = rc < 0 ? rc : kvo__fop_io_continue(op, 0);
    struct stat mine, pre, post;
    bool have = io == (int64_t)op->io_bytes && op->fd >= 0 && fstat(op->fd, &mine) == 0;
    bool linking = t->tmpfile && !op->recycled, made = false, existed = false;
    if (have) {
        kvo__fshare_commit(t->share, x);
        if (linking && (t->p.fsync == KVO_FILE_FSYNC_NONE || fdatasync(op->fd) == 0)) {
            char proc[64];
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", op->fd);
            made = linkat(AT_FDCWD, proc, AT_FDCWD, op->path, AT_SYMLINK_FOLLOW) == 0;
        } else if (!linking) {
            existed = lstat(op->path, &pre) == 0;
        }
    }
    kvo__fop_end(t, op, io);
    if (!have) {
        kvo__fshare_release(t->share, x);
        return;
    }
    kvo__fshare_landed(t->share, x); /* linked or renamed (or not at all): a walk sees it from now on */
    if (made) return; /* on disk under its name, even if end failed after the link */
    bool ours = op->result == 0 && !existed && lstat(op->path, &post) == 0 && post.st_ino == mine.st_ino &&
                post.st_dev == mine.st_dev;
    if (!ours) kvo__fshare_drop(t->share, x);
}

static void *worker_main(void *arg) {
    kvo_file_tier *t = arg;
    /* A file size limit (ulimit -f) below a chunk file would kill the whole
     * process with SIGXFSZ; blocked here, the write fails with EFBIG and is
     * dropped and counted (dropped_nospace) like a full disk. */
    sigset_t xfsz;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    pthread_sigmask(SIG_BLOCK, &xfsz, NULL);
    kvo__fop *op;
    unsigned kinds = t->uring ? KVO__FOP_WRITE : KVO__FOP_READ | KVO__FOP_WRITE;
    while ((op = kvo__fop_next(t, true, kinds)) != NULL) {
        if (t->share && op->kind == KVO__FOP_WRITE) write_shared(t, op);
        else kvo__fop_run_sync(t, op);
        kvo__fop_finish(t, op);
    }
    return NULL;
}

int kvo__file_workers_start(kvo_file_tier *t) {
    t->threads = kvo__calloc(t->p.io_threads, sizeof(pthread_t));
    if (!t->threads) return kvo__error(KVO_ENOMEM, "file tier: threads");
    if (t->p.io != KVO_FILE_IO_THREADS) {
#if KVO_HAVE_URING
        int rc = kvo__file_uring_start(t, t->p.queue_depth, &t->uring_state);
        if (rc == 0) {
            t->uring = true;
            t->ring_kick = kvo__file_uring_kick;
        }
        else if (t->p.io == KVO_FILE_IO_URING) return rc;
#else
        if (t->p.io == KVO_FILE_IO_URING)
            return kvo__error(KVO_ENOTSUP, "file tier: this build has no io_uring support (liburing not found)");
#endif
    }
    for (uint32_t i = 0; i < t->p.io_threads; i++) {
        if (pthread_create(&t->threads[i], NULL, worker_main, t) != 0) {
            pthread_mutex_lock(&t->mu);
            t->closing = true;
            pthread_cond_broadcast(&t->work_cv);
            pthread_mutex_unlock(&t->mu);
            for (uint32_t j = 0; j < i; j++) pthread_join(t->threads[j], NULL);
#if KVO_HAVE_URING
            if (t->uring) kvo__file_uring_stop(t, t->uring_state);
#endif
            return kvo__error(KVO_ENOMEM, "file tier: cannot start I/O thread %u", i);
        }
        t->n_threads++;
    }
    return 0;
}

void kvo__file_workers_stop(kvo_file_tier *t) {
    pthread_mutex_lock(&t->mu);
    t->closing = true;
    kvo__fop *reads = t->rq_head;
    t->rq_head = t->rq_tail = NULL;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (kvo__fop *op = reads, *n; op; op = n) {
        n = op->next;
        op->result = KVO_ECANCELED;
        kvo__fop_finish(t, op);
    }
#if KVO_HAVE_URING
    if (t->uring) kvo__file_uring_stop(t, t->uring_state);
#endif
    for (uint32_t i = 0; i < t->n_threads; i++) pthread_join(t->threads[i], NULL);
}
