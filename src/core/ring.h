/*
 * The completion ring: one FIFO of fixed-size entries with room promised in
 * advance, used by every part of the library that hands completions to a
 * caller who polls (the file tier, the Redis tier; the connector's
 * completions can use it the same way: see "Owed entries").
 *
 * Layout: entries of `elem` bytes in one heap array of `cap` entries, the
 * oldest at `head`, `len` queued.  Growth (doubling, up to max_cap) happens
 * only in kvo__ring_reserve / kvo__ring_grow, never in kvo__ring_push.
 *
 * Owed entries.  A producer promises an entry before it accepts the work
 * that will produce it (kvo__ring_reserve: `owed` counts promises not yet
 * pushed); len + owed <= cap always holds, so kvo__ring_push never needs
 * memory and an accepted operation never loses its completion.  A promise
 * that will not be kept (an operation canceled before it reported) is given
 * back with kvo__ring_unreserve.  A fixed ring (max_cap == cap) refuses a
 * promise it has no room for (KVO_EAGAIN: the caller refuses the work); a
 * growable one doubles.  A caller that counts its promises itself (the
 * connector's cq_owed, kept exact by its request states) grows the ring to
 * len + its count + 1 with kvo__ring_grow before accepting, and pushes with
 * kvo__ring_push_unowed.
 *
 * Signalling: with an eventfd (kvo__ring_init's with_efd), the fd is
 * readable exactly while entries are queued: push writes it when the ring
 * goes from empty to not empty, take drains it when it empties the ring.
 * kvo__ring_wait sleeps on the caller's condition variable (broadcast by the
 * caller whenever it pushes or gives back a promise).
 *
 * Locking: none of its own.  Every call is made under the owner's mutex
 * (the same one kvo__ring_wait is given), which is what makes "the fd is
 * readable while len > 0" hold for any thread that looks under that lock.
 *
 * A leaf of src/core: it calls only the core's allocation and error helpers.
 */
#ifndef KVO_CORE_RING_H
#define KVO_CORE_RING_H

#include <pthread.h>
#include <stdbool.h>

#include "core/internal.h"

typedef struct kvo__ring {
    unsigned char *buf;
    size_t elem;     /* bytes per entry */
    size_t cap;      /* entries allocated */
    size_t max_cap;  /* growth bound; == cap at init: a fixed ring */
    size_t head;     /* oldest queued entry */
    size_t len;      /* entries queued */
    size_t owed;     /* entries promised (reserved), not yet pushed */
    int efd;         /* readable while len > 0; -1 without one */
} kvo__ring;

/* An empty ring of cap entries of elem bytes (cap 0: allocated at the first
 * reserve), growing by doubling up to max_cap (0: without bound; cap: fixed),
 * with an eventfd (EFD_NONBLOCK | EFD_CLOEXEC) when with_efd.  0, KVO_ENOMEM
 * or KVO_EIO (eventfd), with a message naming `what`.  On failure *r holds
 * nothing to free. */
int kvo__ring_init(kvo__ring *r, size_t elem, size_t cap, size_t max_cap, bool with_efd, const char *what);
/* Free the entries and close the eventfd.  A zeroed ring, or one already
 * freed, is a no-op. */
void kvo__ring_free(kvo__ring *r);

/* Promise n more entries: len + owed + n <= cap afterwards (growing when
 * allowed), owed += n.  0, KVO_EAGAIN (fixed ring full) or KVO_ENOMEM, with
 * no message (callers say what they refused). */
int kvo__ring_reserve(kvo__ring *r, size_t n);
/* Give back n promises that will not be pushed. */
void kvo__ring_unreserve(kvo__ring *r, size_t n);
/* Room for `need` entries in all (cap >= need), for callers that count
 * their own promises.  0 or KVO_ENOMEM (no message); ignores max_cap. */
int kvo__ring_grow(kvo__ring *r, size_t need);

/* The slot of a new newest entry for a promise made earlier (owed--,
 * len++): the caller fills its elem bytes before releasing its lock.  The
 * eventfd is written when the ring was empty. */
void *kvo__ring_push(kvo__ring *r);
/* The same for a caller that counts its own promises (owed unchanged);
 * room must have been made with kvo__ring_grow. */
void *kvo__ring_push_unowed(kvo__ring *r);

/* Move up to max entries, oldest first, into out (elem bytes each; out may
 * be NULL when max is 0); the count.  The eventfd is drained when the ring
 * is left empty. */
size_t kvo__ring_take(kvo__ring *r, void *out, size_t max);
/* Remove the queued entries for which drop(entry, arg) is true, keeping the
 * others in order (a connector's completions of a preempted request).  owed
 * is unchanged.  The count removed.  O(len). */
size_t kvo__ring_filter(kvo__ring *r, bool (*drop)(const void *entry, void *arg), void *arg);

/* Under mu (held by the caller; cv is broadcast whenever an entry is pushed
 * or a promise given back): wait until an entry is queued.  timeout_ns < 0
 * waits without a deadline.  0, KVO_ETIMEDOUT, or KVO_ENOTFOUND when nothing
 * is queued nor owed (nothing could come): at once when idle_always, else
 * only when waiting without a deadline (a finite wait then times out).  No
 * message: the caller writes its own. */
int kvo__ring_wait(kvo__ring *r, pthread_mutex_t *mu, pthread_cond_t *cv, int64_t timeout_ns, bool idle_always);

#endif
