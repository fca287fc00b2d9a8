/*
 * The completions the cascade owes its caller: one ring, oldest first.
 *
 * A completion is queued only by the dispatcher (dispatch.c) while it
 * consumes the tiers' completions, and taken by kvo_cascade_poll.  The ring
 * grows by doubling (the queued entries unwrapped into the new array): the
 * number of completions owed is bounded by the ops in flight, which the
 * tiers' queue bounds (max_pending_reads, the file tier's queue) bound in
 * turn, so it settles at its high-water mark and a warm cascade allocates
 * nothing here.  If growth fails the completion is dropped and counted in
 * the lost counter of the statistics: the caller's op then never
 * completes, which only a failed allocation can cause.  While completions
 * wait, the cascade's own eventfd stays readable (so does the epoll set of
 * kvo_cascade_event_fd).
 */
#include <unistd.h>

#include "cascade/cascade_internal.h"

static void kvo__casc_signal(kvo_cascade *c) {
    if (c->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(c->efd, &one, sizeof one);
        (void)w;
    }
}

void kvo__casc_emit(kvo_cascade *c, const kvo_cascade_completion *cp) {
    if (c->cq_n == c->cq_cap) {
        size_t ncap = c->cq_cap ? 2 * c->cq_cap : 64;
        kvo_cascade_completion *q = kvo__malloc(ncap * sizeof *q);
        if (!q) {
            c->st.completions_lost++;
            return;
        }
        for (size_t i = 0; i < c->cq_n; i++) q[i] = c->cq[(c->cq_head + i) % c->cq_cap];
        kvo__free(c->cq);
        c->cq = q;
        c->cq_cap = ncap;
        c->cq_head = 0;
    }
    c->cq[(c->cq_head + c->cq_n) % c->cq_cap] = *cp;
    if (c->cq_n++ == 0) kvo__casc_signal(c);
}

size_t kvo__casc_take(kvo_cascade *c, kvo_cascade_completion *out, size_t cap) {
    size_t k = 0;
    while (k < cap && c->cq_n) {
        out[k++] = c->cq[c->cq_head];
        c->cq_head = (c->cq_head + 1) % c->cq_cap;
        c->cq_n--;
    }
    if (c->cq_n == 0 && c->efd >= 0) kvo__efd_drain(c->efd);
    return k;
}

void kvo__casc_ring_free(kvo_cascade *c) {
    kvo__free(c->cq);
    c->cq = NULL;
    c->cq_cap = c->cq_n = c->cq_head = 0;
}
