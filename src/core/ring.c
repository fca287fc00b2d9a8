/*
 * The completion ring (ring.h says what it is and the rules its callers
 * follow).  Entries are copied in and out by value: a ring holds
 * completions, small structs, never pointers into it.
 *
 * Invariants: len + owed <= cap; head < cap when cap > 0; the eventfd (when
 * there is one) has a non-zero count exactly when len > 0, because the only
 * transitions are push (0 -> 1 writes it) and take (-> 0 drains it), both
 * under the owner's lock.
 */
#include <errno.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/ring.h"

int kvo__ring_init(kvo__ring *r, size_t elem, size_t cap, size_t max_cap, bool with_efd, const char *what) {
    memset(r, 0, sizeof *r);
    r->efd = -1;
    r->elem = elem;
    r->max_cap = max_cap;
    if (cap && !(r->buf = kvo__calloc(cap, elem)))
        return kvo__error(KVO_ENOMEM, "%s: out of memory for a ring of %zu completions", what, cap);
    r->cap = cap;
    if (with_efd && (r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        int e = errno;
        kvo__ring_free(r);
        return kvo__error(KVO_EIO, "%s: eventfd: %s", what, strerror(e));
    }
    return 0;
}

void kvo__ring_free(kvo__ring *r) {
    kvo__free(r->buf);
    if (r->efd >= 0) close(r->efd);
    r->buf = NULL;
    r->cap = r->len = r->head = r->owed = 0;
    r->efd = -1;
}

/* Reallocate to ncap entries, the queued ones first (head 0). */
static int regrow(kvo__ring *r, size_t ncap) {
    if (ncap > SIZE_MAX / (r->elem ? r->elem : 1)) return KVO_ENOMEM;
    unsigned char *nb = kvo__malloc(ncap * r->elem);
    if (!nb) return KVO_ENOMEM;
    for (size_t i = 0; i < r->len; i++)
        memcpy(nb + i * r->elem, r->buf + ((r->head + i) % r->cap) * r->elem, r->elem);
    kvo__free(r->buf);
    r->buf = nb;
    r->cap = ncap;
    r->head = 0;
    return 0;
}

int kvo__ring_grow(kvo__ring *r, size_t need) {
    if (need <= r->cap) return 0;
    size_t ncap = r->cap ? r->cap : 64;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2) return KVO_ENOMEM;
        ncap *= 2;
    }
    return regrow(r, ncap);
}

int kvo__ring_reserve(kvo__ring *r, size_t n) {
    size_t need = r->len + r->owed + n;
    if (need > r->cap) {
        if (r->max_cap && need > r->max_cap) return KVO_EAGAIN;
        size_t ncap = r->cap ? r->cap : 64;
        while (ncap < need) ncap *= 2;
        if (r->max_cap && ncap > r->max_cap) ncap = r->max_cap;
        if (regrow(r, ncap)) return KVO_ENOMEM;
    }
    r->owed += n;
    return 0;
}

void kvo__ring_unreserve(kvo__ring *r, size_t n) {
    assert(r->owed >= n);
    r->owed -= n;
}

void *kvo__ring_push_unowed(kvo__ring *r) {
    assert(r->len < r->cap); /* room was made before the work was accepted */
    void *slot = r->buf + ((r->head + r->len) % r->cap) * r->elem;
    if (r->len++ == 0 && r->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(r->efd, &one, sizeof one);
        (void)w;
    }
    return slot;
}

void *kvo__ring_push(kvo__ring *r) {
    assert(r->owed > 0);
    r->owed--;
    return kvo__ring_push_unowed(r);
}

size_t kvo__ring_take(kvo__ring *r, void *out, size_t max) {
    size_t n = 0;
    for (; n < max && r->len; n++) {
        memcpy((unsigned char *)out + n * r->elem, r->buf + r->head * r->elem, r->elem);
        r->head = (r->head + 1) % r->cap;
        r->len--;
    }
    if (n && r->len == 0 && r->efd >= 0) kvo__efd_drain(r->efd);
    return n;
}

size_t kvo__ring_filter(kvo__ring *r, bool (*drop)(const void *entry, void *arg), void *arg) {
    size_t k = 0, len = r->len;
    for (size_t i = 0; i < len; i++) {
        const unsigned char *e = r->buf + ((r->head + i) % r->cap) * r->elem;
        if (drop(e, arg)) continue;
        unsigned char *to = r->buf + ((r->head + k) % r->cap) * r->elem;
        if (to != e) memcpy(to, e, r->elem);
        k++;
    }
    r->len = k;
    if (len && k == 0 && r->efd >= 0) kvo__efd_drain(r->efd);
    return len - k;
}

int kvo__ring_wait(kvo__ring *r, pthread_mutex_t *mu, pthread_cond_t *cv, int64_t timeout_ns, bool idle_always) {
    int timeout_ms = kvo__timeout_ms(timeout_ns);
    struct timespec ts;
    if (timeout_ms >= 0) kvo__deadline_ts(timeout_ms, &ts);
    while (r->len == 0) {
        if (r->owed == 0 && (idle_always || timeout_ms < 0)) return KVO_ENOTFOUND;
        if (timeout_ms < 0) pthread_cond_wait(cv, mu);
        else if (pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT)
            return r->len ? 0 : KVO_ETIMEDOUT;
    }
    return 0;
}
