/*
 * The transfer engine's dependency graph and queues (see transfer.c's essay,
 * "Ordering" and "States"): the table of resources and job ids (a kvo__hmap
 * of kvo__xent, grown with the lock dropped), linking a submitted job behind
 * the jobs it conflicts with, the ready lists (one per direction) and the
 * live list, posting results to the ring, and retiring finished jobs, which
 * releases their successors.  Everything here runs under t->mu and never
 * allocates; freed jobs and layouts go to a kvo__xgc freed after unlocking.
 *
 * Per-block cost.  Every engine block of a job is one table entry: linking
 * inserts it, retiring finds and erases it.  Both walk the job's resources
 * with the table slot of the resource KVO__XPF ahead prefetched (the table of
 * a large job does not fit in L2, so each probe would be a miss).  When the
 * retiring job is the last one holding entries (no live job, no zombie) and
 * the table is not much larger than the job, the table is cleared in one
 * pass instead of a find and an erase per block.  A job submitted while no
 * other is unfinished (no live job, no zombie: then the table holds no
 * resource, so it can have no predecessor) is not linked at all: it stays
 * "unlinked" (t->unlinked, at most one) until the next submit while it is
 * still live, which links its resources first (it gains no edge: it was
 * alone, and every job since was linked through that path) and then its
 * own; retiring an unlinked job releases nothing.  The common "one job at a
 * time" pattern thus does no table work per block, which, with one worker,
 * was serial with the copy (the worker cannot start before the submit
 * returns, nor the waiter wake before the retire).  A retired job's memory goes to a
 * short spare list that the next submit reuses (no allocation, no page
 * faults per job).
 */
#include <unistd.h>

#include "transfer/transfer_internal.h"

/* Make room for `extra` more entries.  Lock held on entry and exit; dropped
 * while allocating. */
int kvo__xtab_reserve(kvo_transfer *t, size_t extra) {
    for (;;) {
        size_t ncap = kvo__hmap_cap_for(&t->tab, extra, 1024);
        if (!ncap) return KVO_ENOMEM;
        if (ncap == t->tab.cap) return 0;
        size_t old_cap = t->tab.cap;
        pthread_mutex_unlock(&t->mu);
        void *nt = kvo__calloc(ncap, t->tab.esz);
        pthread_mutex_lock(&t->mu);
        if (!nt) return KVO_ENOMEM;
        if (t->tab.cap != old_cap) { /* grown meanwhile: start over */
            pthread_mutex_unlock(&t->mu);
            kvo__free(nt);
            pthread_mutex_lock(&t->mu);
            continue;
        }
        void *old = kvo__hmap_rehash(&t->tab, nt, ncap);
        pthread_mutex_unlock(&t->mu);
        kvo__free(old);
        pthread_mutex_lock(&t->mu);
    }
}

/* Resources ahead of the one handled whose table slots are prefetched. */
#define KVO__XPF 8

static inline void kvo__xtab_prefetch(const kvo_transfer *t, const kvo__xres *r) {
    size_t i = kvo__hmap_hash(r->a, r->b) & (t->tab.cap - 1);
    __builtin_prefetch(t->tab.e + i * t->tab.esz, 1);
}

kvo__xjob *kvo__xspare_take(kvo_transfer *t) {
    kvo__xjob *j = t->spare;
    if (j) {
        t->spare = j->work_next;
        t->n_spare--;
    }
    return j;
}

void kvo__xspare_free(kvo_transfer *t) {
    while (t->spare) kvo__free(kvo__xspare_take(t));
}

/* j's memory: kept for the next submit when there is room, else freed. */
static void kvo__xjob_release(kvo_transfer *t, kvo__xjob *j, kvo__xgc *gc) {
    if (t->n_spare < KVO__XSPARE && j->alloc_bytes <= KVO__XSPARE_BYTES && !t->closed) {
        j->work_next = t->spare;
        t->spare = j;
        t->n_spare++;
    } else {
        j->work_next = gc->jobs;
        gc->jobs = j;
    }
}

/* Release j's table entries (its id entry is gone since it was posted). */
static void kvo__xrelease_res(kvo_transfer *t, kvo__xjob *j) {
    if (j->unlinked) { /* nothing in the table (its id went at posting) */
        j->unlinked = false;
        t->unlinked = NULL;
        return;
    }
    if (t->tab.n == 0) return;
    if (t->n_live == 0 && t->n_zombies == 0 && t->tab.cap <= 8 * (j->n_res + 128)) {
        /* Every entry is j's: no other job is unfinished or ordered. */
        memset(t->tab.e, 0, t->tab.cap * t->tab.esz);
        t->tab.n = 0;
        return;
    }
    for (size_t r = 0; r < j->n_res; r++) {
        if (r + KVO__XPF < j->n_res) kvo__xtab_prefetch(t, &j->res[r + KVO__XPF]);
        kvo__xent *e = kvo__xtab_find(t, j->res[r].a, j->res[r].b);
        if (!e) continue; /* listed twice: released already */
        if (e->writer == j) e->writer = NULL;
        for (uint32_t k = 0; k < e->n_readers; k++) {
            if (e->readers[k] != j) continue;
            memmove(&e->readers[k], &e->readers[k + 1], (e->n_readers - k - 1) * sizeof e->readers[0]);
            e->n_readers--;
            break;
        }
        if (!e->writer && !e->n_readers) kvo__hmap_erase(&t->tab, e);
    }
}

static kvo__xent *kvo__xtab_get(kvo_transfer *t, uint64_t a, uint64_t b) {
    bool existed;
    return kvo__hmap_insert(&t->tab, a, b, &existed);
}

void kvo__xgc_layout_unref(kvo__xgc *gc, kvo__xlayout *l) {
    if (!l) return;
    assert(l->refs > 0);
    if (--l->refs) return;
    if (gc->n_layouts < sizeof gc->layouts / sizeof gc->layouts[0]) gc->layouts[gc->n_layouts++] = l;
    else kvo__xlayout_free(l); /* not reached in practice: at most 2 layouts die per call */
}

void kvo__xgc_run(kvo__xgc *gc) {
    while (gc->jobs) {
        kvo__xjob *j = gc->jobs;
        gc->jobs = j->work_next;
        kvo__free(j);
    }
    for (size_t i = 0; i < gc->n_layouts; i++) kvo__xlayout_free(gc->layouts[i]);
    gc->n_layouts = 0;
}

void kvo__xready_push(kvo_transfer *t, kvo__xjob *j) {
    j->rnext = NULL;
    j->rprev = t->ready_tail[j->dir];
    if (t->ready_tail[j->dir]) t->ready_tail[j->dir]->rnext = j;
    else t->ready_head[j->dir] = j;
    t->ready_tail[j->dir] = j;
}

void kvo__xready_remove(kvo_transfer *t, kvo__xjob *j) {
    if (j->rprev) j->rprev->rnext = j->rnext;
    else t->ready_head[j->dir] = j->rnext;
    if (j->rnext) j->rnext->rprev = j->rprev;
    else t->ready_tail[j->dir] = j->rprev;
    j->rprev = j->rnext = NULL;
}

static void kvo__xlive_push(kvo_transfer *t, kvo__xjob *j) {
    j->lprev = NULL;
    j->lnext = t->live_head;
    if (t->live_head) t->live_head->lprev = j;
    t->live_head = j;
    t->n_live++;
}

static void kvo__xlive_remove(kvo_transfer *t, kvo__xjob *j) {
    if (j->lprev) j->lprev->lnext = j->lnext;
    else t->live_head = j->lnext;
    if (j->lnext) j->lnext->lprev = j->lprev;
    j->lprev = j->lnext = NULL;
    t->n_live--;
}

void kvo__xpost(kvo_transfer *t, kvo__xjob *j, int status) {
    kvo__xent *e = kvo__xtab_find(t, j->id, KVO__XTAG_JOB);
    assert(e && e->writer == j && !j->posted);
    j->posted = true;
    if (j->dev_token) {
        t->dev->job_done(t->dev_state, j->dev_token);
        j->dev_token = NULL;
    }
    kvo__hmap_erase(&t->tab, e);
    kvo__xlive_remove(t, j);
    assert(t->ring_count < t->max_queued);
    kvo_xfer_result *r = &t->ring[(t->ring_head + t->ring_count) % t->max_queued];
    r->job_id = j->id;
    r->status = status;
    r->dir = (uint32_t)j->dir;
    r->bytes = status ? 0 : j->bytes;
    r->duration_ns = j->started ? kvo__now_ns() - j->t_start : 0;
    if (t->ring_count++ == 0) {
        uint64_t one = 1;
        ssize_t w = write(t->efd, &one, sizeof one);
        (void)w; /* cannot fail short of a counter overflow, which reading prevents */
    }
    if (status == 0) {
        t->st.jobs_ok++;
        if (j->dir == KVO_XFER_STORE) t->st.bytes_stored += j->bytes;
        else t->st.bytes_loaded += j->bytes;
    } else if (status == KVO_ECANCELED) t->st.jobs_canceled++;
    else t->st.jobs_failed++;
    t->st.copies += j->copies;
    pthread_cond_broadcast(&t->done_cv);
}

/* Release everything j holds in the graph and free it (deferred).  status:
 * j's outcome, propagated to successors along write->read edges.  Iterative:
 * successors that become free of dependencies are handled here too. */
void kvo__xretire(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc) {
    kvo__xjob *work = NULL;
    for (;;) {
        assert(j->n_deps == 0);
        kvo__xrelease_res(t, j);
        for (kvo__xedge *ed = j->succ; ed; ed = ed->next) {
            kvo__xjob *s = ed->to;
            if (status && ed->raw && !s->dep_error) s->dep_error = status;
            assert(s->n_deps > 0);
            if (--s->n_deps == 0) {
                s->work_next = work;
                work = s;
            }
        }
        j->succ = NULL;
        kvo__xgc_layout_unref(gc, j->layout);
        j->layout = NULL;
        kvo__xjob_release(t, j, gc);

        /* Next successor that is now free of dependencies. */
        for (;;) {
            if (!work) return;
            kvo__xjob *s = work;
            work = s->work_next;
            if (s->state == KVO__XJ_ZOMBIE) {
                t->n_zombies--;
                pthread_cond_broadcast(&t->done_cv);
                j = s;
                status = s->status;
                break;
            }
            assert(s->state == KVO__XJ_WAITING);
            if (s->dep_error || t->closed) {
                /* Posts and, with no dependencies left, retires: handled by
                 * looping here rather than recursing. */
                s->state = KVO__XJ_ZOMBIE;
                s->status = KVO_ECANCELED;
                kvo__xpost(t, s, KVO_ECANCELED);
                j = s;
                status = KVO_ECANCELED;
                break;
            }
            if (s->n_units == 0) {
                kvo__xpost(t, s, 0);
                j = s;
                status = 0;
                break;
            }
            s->state = KVO__XJ_READY;
            kvo__xready_push(t, s);
            pthread_cond_signal(&t->work_cv);
        }
    }
}

/* j has not started (WAITING or READY with no unit claimed). */
void kvo__xfail_unstarted(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc) {
    assert(!j->started);
    if (j->state == KVO__XJ_READY) kvo__xready_remove(t, j);
    kvo__xpost(t, j, status);
    j->status = status;
    if (j->n_deps == 0) {
        kvo__xretire(t, j, status, gc);
    } else {
        j->state = KVO__XJ_ZOMBIE;
        t->n_zombies++;
    }
}

/* Fail every unstarted live job (mask 0) or those touching a group in mask.
 * Failing one may fail others (its successors): the victims are listed
 * first, then handled, skipping those already posted. */
void kvo__xfail_matching(kvo_transfer *t, uint64_t mask, int status, kvo__xgc *gc) {
    kvo__xjob *doomed = NULL;
    for (kvo__xjob *j = t->live_head; j; j = j->lnext) {
        if (j->started || (mask && !(j->group_mask & mask))) continue;
        j->doom_next = doomed;
        doomed = j;
    }
    while (doomed) {
        kvo__xjob *d = doomed;
        doomed = d->doom_next;
        if (!d->posted) kvo__xfail_unstarted(t, d, status, gc);
    }
}

static void kvo__xadd_dep(kvo__xjob *pred, kvo__xjob *j, bool raw) {
    if (pred->stamp == j->id) {
        pred->stamp_edge->raw |= raw;
        return;
    }
    assert(j->n_edges < j->cap_edges);
    kvo__xedge *e = &j->edges[j->n_edges++];
    e->to = j;
    e->raw = raw;
    e->next = pred->succ;
    pred->succ = e;
    pred->stamp = j->id;
    pred->stamp_edge = e;
    j->n_deps++;
}

/* j's resources into the table: edges from the last writers (and, for
 * writes, the readers since) of what j touches. */
static void kvo__xlink_res(kvo_transfer *t, kvo__xjob *j) {
    for (size_t r = 0; r < j->n_res; r++) {
        if (r + KVO__XPF < j->n_res) kvo__xtab_prefetch(t, &j->res[r + KVO__XPF]);
        kvo__xent *e = kvo__xtab_get(t, j->res[r].a, j->res[r].b);
        if (j->res[r].write) {
            if (e->writer == j) continue; /* listed twice */
            if (e->writer) kvo__xadd_dep(e->writer, j, false);
            for (uint32_t k = 0; k < e->n_readers; k++) kvo__xadd_dep(e->readers[k], j, false);
            e->writer = j;
            e->n_readers = 0;
        } else {
            bool listed = false;
            for (uint32_t k = 0; k < e->n_readers; k++) listed |= e->readers[k] == j;
            if (listed) continue;
            if (e->writer) kvo__xadd_dep(e->writer, j, true);
            if (e->n_readers < KVO__XREADERS) e->readers[e->n_readers++] = j;
            else {
                kvo__xadd_dep(e->readers[KVO__XREADERS - 1], j, false);
                e->readers[KVO__XREADERS - 1] = j;
            }
        }
    }
}

void kvo__xlink(kvo_transfer *t, kvo__xjob *j) {
    kvo__xtab_get(t, j->id, KVO__XTAG_JOB)->writer = j;
    if (t->n_live == 0 && t->n_zombies == 0) {
        /* Nothing unfinished: the table holds no resource (every job
         * releases its entries in the same lock hold that takes it out of
         * the live list or the zombie count), so j has no predecessor. */
        assert(!t->unlinked);
        j->unlinked = true;
        t->unlinked = j;
    } else {
        if (t->unlinked) {
            /* Its entries first, as at its submit: it was alone then, and
             * every job since was linked here, so it still has no
             * predecessor and gains no edge. */
            kvo__xjob *u = t->unlinked;
            u->unlinked = false;
            t->unlinked = NULL;
            kvo__xlink_res(t, u);
            assert(u->n_deps == 0);
        }
        kvo__xlink_res(t, j);
    }
    kvo__xlive_push(t, j);
}
