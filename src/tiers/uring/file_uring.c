/*
 * io_uring backend of the file tier (built only when liburing is found; used
 * when it works at run time: kvo__file_uring_start probes the kernel and
 * fails cleanly so that the tier falls back to its thread pool).
 *
 * One thread owns the ring and serves the tier's reads (writes go to the
 * thread pool: they are bound by file creation, see file_workers.c).  It takes
 * queued reads, runs their begin phase (open, fstat) itself, submits the data
 * transfer as one readv per op (header + payload straight into the caller's
 * buffer), up to `depth` in flight, and runs the end phase (verify, close)
 * when the completion arrives: after the ring has been refilled with the
 * next queued reads, so that the device keeps `depth` transfers while the
 * thread verifies (before, each completion's checksum ran while the ring
 * held one read less: at 4-8 MiB chunks, ~0.5 ms of XXH3 per read on a busy
 * core, the reads ran at 0.6-0.8 of 4 threads doing plain preads in
 * `kvoffload bench file`).  New work wakes the thread through an eventfd
 * that the ring itself reads (an IORING_OP_READ re-armed after each wake), so
 * the thread sleeps in one place: io_uring_wait_cqe.  A short transfer (rare
 * on regular files) is finished synchronously.  At shutdown the thread waits
 * for everything in flight and exits.  The write path below (writev) is kept
 * so that the ring can serve writes too if that ever measures better.
 *
 * Why one thread: the transfers are asynchronous in the kernel, and the
 * per-op CPU work (a checksum at ~10-50 GB/s, open/fstat/close) is small next
 * to the transfer, as long as it overlaps the transfers in flight.
 *
 * Layering: started, woken (through t->ring_kick) and stopped by
 * file_workers.c; calls file_queue.c (next op, finish) and file_ops.c (the
 * phases), never back into file_workers.c or file_tier.c.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <liburing.h>

#include "tiers/file_internal.h"

#define KICK_TAG ((uint64_t)1)

typedef struct uring_done {
    kvo__fop *op;
    int64_t res;
} uring_done;

typedef struct uring_state {
    kvo_file_tier *t;
    struct io_uring ring;
    int kick_fd;
    uint64_t kick_buf;
    uint32_t depth;
    pthread_t thread;
    uring_done *done;             /* depth entries: completions to end after the refill */
} uring_state;

static void arm_kick(uring_state *u) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    io_uring_prep_read(sqe, u->kick_fd, &u->kick_buf, sizeof u->kick_buf, 0);
    io_uring_sqe_set_data64(sqe, KICK_TAG);
}

/* Take queued ops up to depth in flight: begin each (open, fstat) and
 * prepare its transfer; ops that fail to begin are finished at once. */
static void refill(uring_state *u, uint32_t *inflight) {
    kvo_file_tier *t = u->t;
    while (*inflight < u->depth) {
        kvo__fop *op = kvo__fop_next(t, false, KVO__FOP_READ);
        if (!op) break;
        int rc = kvo__fop_begin(t, op);
        if (rc != 0) {
            if (op->kind == KVO__FOP_READ) kvo__fop_read_verdict(t, op, rc);
            else kvo__fop_end(t, op, rc);
            kvo__fop_finish(t, op);
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) {
            io_uring_submit(&u->ring);
            sqe = io_uring_get_sqe(&u->ring);
        }
        if (!sqe) { /* cannot happen with depth + 2 entries; be safe */
            kvo__fop_end(t, op, kvo__fop_io_continue(op, 0));
            kvo__fop_finish(t, op);
            continue;
        }
        if (op->kind == KVO__FOP_WRITE) io_uring_prep_writev(sqe, op->fd, op->iov, (unsigned)op->iovcnt, 0);
        else io_uring_prep_readv(sqe, op->fd, op->iov, (unsigned)op->iovcnt, 0);
        io_uring_sqe_set_data(sqe, op);
        (*inflight)++;
    }
}

static void *ring_main(void *arg) {
    uring_state *u = arg;
    kvo_file_tier *t = u->t;
    uint32_t inflight = 0;
    arm_kick(u);
    for (;;) {
        refill(u, &inflight);
        if (inflight == 0 && kvo__file_tier_closing(t)) break;
        io_uring_submit(&u->ring);
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(&u->ring, &cqe);
        if (w == -EINTR) continue;
        if (w < 0) {
            static kvo__log_limit lim;
            kvo__log_limited(&lim, 10, KVO_LOG_ERROR, "kvoffload file tier: io_uring_wait_cqe: %s", strerror(-w));
            usleep(1000);
            continue;
        }
        unsigned head, seen = 0, nd = 0;
        io_uring_for_each_cqe(&u->ring, head, cqe) {
            seen++;
            uint64_t tag = io_uring_cqe_get_data64(cqe);
            if (tag == KICK_TAG) {
                arm_kick(u);
                continue;
            }
            u->done[nd++] = (uring_done){(kvo__fop *)(uintptr_t)tag, cqe->res};
            inflight--;
        }
        io_uring_cq_advance(&u->ring, seen);
        /* the next reads go to the device before this thread verifies the
         * finished ones */
        if (nd) {
            refill(u, &inflight);
            io_uring_submit(&u->ring);
        }
        for (unsigned i = 0; i < nd; i++) {
            kvo__fop *op = u->done[i].op;
            int64_t res = u->done[i].res;
            if (res > 0 && (uint64_t)res < op->io_bytes) res = kvo__fop_io_continue(op, (uint64_t)res);
            kvo__fop_end(t, op, res);
            kvo__fop_finish(t, op);
        }
    }
    return NULL;
}

int kvo__file_uring_start(kvo_file_tier *t, uint32_t depth, void **state) {
    uring_state *u = kvo__calloc(1, sizeof *u);
    if (!u) return kvo__error(KVO_ENOMEM, "io_uring state");
    u->t = t;
    u->depth = depth;
    u->done = kvo__calloc(depth ? depth : 1, sizeof *u->done);
    if (!u->done) {
        kvo__free(u);
        return kvo__error(KVO_ENOMEM, "io_uring state");
    }
    int r = io_uring_queue_init(depth + 2, &u->ring, 0);
    if (r < 0) {
        kvo__free(u->done);
        kvo__free(u);
        return kvo__error(KVO_ENOTSUP, "io_uring_queue_init: %s", strerror(-r));
    }
    struct io_uring_probe *pr = io_uring_get_probe_ring(&u->ring);
    bool ok = pr && io_uring_opcode_supported(pr, IORING_OP_READV) && io_uring_opcode_supported(pr, IORING_OP_WRITEV) &&
              io_uring_opcode_supported(pr, IORING_OP_READ);
    if (pr) io_uring_free_probe(pr);
    if (!ok) {
        io_uring_queue_exit(&u->ring);
        kvo__free(u->done);
        kvo__free(u);
        return kvo__error(KVO_ENOTSUP, "io_uring: kernel lacks readv/writev/read operations");
    }
    /* A real round trip: a NOP must complete. */
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    io_uring_prep_nop(sqe);
    struct io_uring_cqe *cqe;
    r = io_uring_submit(&u->ring);
    if (r >= 0) r = io_uring_wait_cqe(&u->ring, &cqe);
    if (r < 0) {
        io_uring_queue_exit(&u->ring);
        kvo__free(u->done);
        kvo__free(u);
        return kvo__error(KVO_ENOTSUP, "io_uring does not work here: %s", strerror(-r));
    }
    io_uring_cqe_seen(&u->ring, cqe);
    u->kick_fd = eventfd(0, EFD_CLOEXEC);
    if (u->kick_fd < 0 || pthread_create(&u->thread, NULL, ring_main, u) != 0) {
        if (u->kick_fd >= 0) close(u->kick_fd);
        io_uring_queue_exit(&u->ring);
        kvo__free(u->done);
        kvo__free(u);
        return kvo__error(KVO_ENOMEM, "io_uring: cannot start the ring thread");
    }
    *state = u;
    return 0;
}

void kvo__file_uring_kick(void *state) {
    uring_state *u = state;
    uint64_t one = 1;
    ssize_t w = write(u->kick_fd, &one, sizeof one);
    (void)w;
}

void kvo__file_uring_stop(kvo_file_tier *t, void *state) {
    (void)t;
    uring_state *u = state;
    if (!u) return;
    kvo__file_uring_kick(u);
    pthread_join(u->thread, NULL);
    io_uring_queue_exit(&u->ring);
    close(u->kick_fd);
    kvo__free(u->done);
    kvo__free(u);
}
