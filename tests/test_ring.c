/* The completion ring of src/core/ring.h (the file tier's, the Redis
 * tier's; the connector's may use it): promises before pushes, FIFO order
 * across wrap-around and growth, a fixed ring refusing a promise it has no
 * room for, the eventfd readable exactly while entries are queued, filter
 * keeping order, and wait's three outcomes (an entry pushed by another
 * thread, a timeout while something is owed, nothing owed). */
#include "kvo_test.h"

#include <poll.h>
#include <pthread.h>

#include "core/ring.h"

typedef struct ent {
    uint64_t v;
    uint32_t tag, pad;
} ent;

static bool readable(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

static void push(kvo__ring *r, uint64_t v, uint32_t tag) {
    ent *e = kvo__ring_push(r);
    e->v = v;
    e->tag = tag;
}

KVO_TEST(fixed_ring_refuses_beyond_cap_and_keeps_order_across_wrap) {
    kvo__ring r;
    ASSERT_OK(kvo__ring_init(&r, sizeof(ent), 4, 4, true, "test ring"));
    ASSERT_TRUE(r.efd >= 0);
    ASSERT_FALSE(readable(r.efd));
    ASSERT_OK(kvo__ring_reserve(&r, 3));
    ASSERT_OK(kvo__ring_reserve(&r, 1));
    ASSERT_ERR(kvo__ring_reserve(&r, 1), KVO_EAGAIN); /* 4 promised: full */
    uint64_t next_in = 0, next_out = 0;
    for (int round = 0; round < 10; round++) { /* 3 in, 3 out: head wraps */
        for (int i = 0; i < 3; i++) push(&r, next_in++, 0);
        ASSERT_TRUE(readable(r.efd));
        ASSERT_ERR(kvo__ring_reserve(&r, 1), KVO_EAGAIN); /* 3 queued + 1 owed */
        ent out[8];
        size_t n = kvo__ring_take(&r, out, 2);
        ASSERT_EQ_U64(n, 2);
        ASSERT_TRUE(readable(r.efd)); /* one left */
        n += kvo__ring_take(&r, out + 2, 8);
        ASSERT_EQ_U64(n, 3);
        for (int i = 0; i < 3; i++) ASSERT_EQ_U64(out[i].v, next_out++);
        ASSERT_FALSE(readable(r.efd)); /* drained with the last one */
        ASSERT_OK(kvo__ring_reserve(&r, 3));
    }
    ASSERT_EQ_U64(r.owed, 4);
    kvo__ring_unreserve(&r, 4);
    ASSERT_EQ_U64(r.owed, 0);
    ASSERT_EQ_U64(r.cap, 4); /* never grew */
    kvo__ring_free(&r);
    kvo__ring_free(&r); /* twice: a no-op */
}

KVO_TEST(growable_ring_keeps_order_while_it_grows) {
    kvo__ring r;
    ASSERT_OK(kvo__ring_init(&r, sizeof(ent), 0, 0, false, "test ring"));
    ASSERT_EQ_INT(r.efd, -1);
    uint64_t in = 0, out = 0;
    for (int step = 0; step < 200; step++) {
        size_t k = (size_t)(kvo_test_rand() % 40);
        ASSERT_OK(kvo__ring_reserve(&r, k)); /* grows by doubling when needed */
        for (size_t i = 0; i < k; i++) push(&r, in++, 0);
        ASSERT_LE_U64(r.len + r.owed, r.cap);
        ent buf[64];
        size_t n = kvo__ring_take(&r, buf, (size_t)(kvo_test_rand() % 50));
        for (size_t i = 0; i < n; i++) ASSERT_EQ_U64(buf[i].v, out++);
    }
    ent buf[64];
    for (size_t n; (n = kvo__ring_take(&r, buf, 64)) != 0;)
        for (size_t i = 0; i < n; i++) ASSERT_EQ_U64(buf[i].v, out++);
    ASSERT_EQ_U64(out, in);
    /* a caller counting its own promises: grow, then push unowed */
    ASSERT_OK(kvo__ring_grow(&r, r.cap * 4));
    size_t cap = r.cap;
    for (size_t i = 0; i < cap; i++) {
        ent *e = kvo__ring_push_unowed(&r);
        e->v = i;
    }
    ASSERT_EQ_U64(r.owed, 0);
    ASSERT_EQ_U64(r.len, cap);
    kvo__ring_free(&r);
}

static bool drop_odd_tags(const void *e, void *arg) {
    (*(int *)arg)++;
    return ((const ent *)e)->tag & 1;
}

static bool drop_all(const void *e, void *arg) {
    (void)e;
    (void)arg;
    return true;
}

KVO_TEST(filter_keeps_the_others_in_order) {
    kvo__ring r;
    ASSERT_OK(kvo__ring_init(&r, sizeof(ent), 8, 8, true, "test ring"));
    ASSERT_OK(kvo__ring_reserve(&r, 5));
    ent buf[8];
    for (int i = 0; i < 5; i++) push(&r, (uint64_t)i, 0);
    ASSERT_EQ_U64(kvo__ring_take(&r, buf, 5), 5); /* head moves to 5: what follows wraps */
    ASSERT_OK(kvo__ring_reserve(&r, 7));
    for (uint32_t i = 0; i < 6; i++) push(&r, 100 + i, i);
    int seen = 0;
    ASSERT_EQ_U64(kvo__ring_filter(&r, drop_odd_tags, &seen), 3);
    ASSERT_EQ_INT(seen, 6);
    ASSERT_EQ_U64(r.owed, 1); /* promises are not entries */
    ASSERT_EQ_U64(kvo__ring_take(&r, buf, 8), 3);
    ASSERT_EQ_U64(buf[0].v, 100);
    ASSERT_EQ_U64(buf[1].v, 102);
    ASSERT_EQ_U64(buf[2].v, 104);
    push(&r, 7, 0);
    ASSERT_TRUE(readable(r.efd));
    ASSERT_EQ_U64(kvo__ring_filter(&r, drop_all, NULL), 1);
    ASSERT_FALSE(readable(r.efd)); /* emptied by the filter: drained */
    kvo__ring_free(&r);
}

typedef struct waiter_ctx {
    kvo__ring r;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool go;
} waiter_ctx;

static void *producer(void *arg) {
    waiter_ctx *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->go) pthread_cond_wait(&w->cv, &w->mu);
    push(&w->r, 42, 0);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

KVO_TEST(wait_sees_a_push_times_out_or_finds_nothing_owed) {
    waiter_ctx w;
    memset(&w, 0, sizeof w);
    ASSERT_OK(kvo__ring_init(&w.r, sizeof(ent), 2, 2, false, "test ring"));
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_mutex_lock(&w.mu);
    /* nothing queued nor owed: nothing can come */
    ASSERT_ERR(kvo__ring_wait(&w.r, &w.mu, &w.cv, KVO_MS(1), true), KVO_ENOTFOUND);
    ASSERT_ERR(kvo__ring_wait(&w.r, &w.mu, &w.cv, -1, false), KVO_ENOTFOUND);
    ASSERT_ERR(kvo__ring_wait(&w.r, &w.mu, &w.cv, KVO_MS(1), false), KVO_ETIMEDOUT); /* finite: times out */
    /* owed and never pushed: a finite wait times out */
    ASSERT_OK(kvo__ring_reserve(&w.r, 1));
    ASSERT_ERR(kvo__ring_wait(&w.r, &w.mu, &w.cv, KVO_MS(1), true), KVO_ETIMEDOUT);
    /* pushed by another thread while we wait without a deadline */
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, producer, &w), 0);
    w.go = true;
    pthread_cond_broadcast(&w.cv);
    ASSERT_OK(kvo__ring_wait(&w.r, &w.mu, &w.cv, -1, true));
    ent e;
    ASSERT_EQ_U64(kvo__ring_take(&w.r, &e, 1), 1);
    ASSERT_EQ_U64(e.v, 42);
    pthread_mutex_unlock(&w.mu);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    kvo__ring_free(&w.r);
}
