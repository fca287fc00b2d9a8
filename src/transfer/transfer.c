/*
 * The transfer engine: jobs of block copies between engine KV tensors and
 * chunk slots, ordered by what they touch and run by a pool of workers.
 *
 * A job (one submit) is a list of ops; op k copies blocks [first, first+n) of
 * one chunk of one group.  It is split into work units: per op and per
 * segment of its group, runs of up to unit_blocks blocks (about
 * KVO__XUNIT_BYTES of pages; pages of 2 MiB and more are instead split into
 * parts of about 1 MiB, one unit each), numbered 0..n_units-1 through a prefix sum over
 * the ops.  A device that waits for completion once per unit and can issue
 * any number of pieces as one operation (the CUDA device: one batched copy
 * or kernel launch) takes whole jobs instead (device.h, whole_jobs): a job
 * is then one unit holding every block of every op and segment.  Workers claim units one at a time from the job at the head of the
 * ready lists (one per direction; loads first, since a request waits for
 * them while stores are background work: dependencies, not queue order,
 * keep conflicting jobs in order), so a large job is copied by every worker
 * at once and a small one by one; a unit merges consecutive pages whose engine addresses are
 * adjacent into one copy (a slot side of a unit is always contiguous) and,
 * for a device that has a prefetch hint (the host device has none: the
 * copy streams), asks it to prefetch the next piece's source while it
 * copies the current one.  The device (device.h) does the copying; nothing is allocated
 * per block or page.
 *
 * Memory per job: one allocation holding the job, a copy of its ops and
 * engine block ids, its resource list and the storage for its incoming
 * dependency edges.  Results go to a ring of max_queued_jobs entries
 * allocated at creation; submit refuses (KVO_EAGAIN) when unfinished jobs
 * plus unpolled results would exceed it, so the ring never overflows.
 *
 * Ordering (dependency tracking).  Resources are slots (by address) and
 * engine blocks (by group and block id).  A store reads engine blocks and
 * writes slots; a load reads slots and writes engine blocks.  One hash table
 * (the library's kvo__hmap, src/core/hmap.c) maps each
 * resource touched by an unfinished job to its last writer and up to
 * KVO__XREADERS readers since that writer.  A new job depends on the last
 * writer of everything it touches and, for what it writes, on the readers
 * too.  When the reader slots are full, the new reader instead depends on the
 * newest reader and takes its place: it cannot finish before the one it
 * replaced, so a later writer that waits for the listed readers still waits
 * for all of them.  Bound: per resource a submit does one lookup and adds at
 * most 1 + KVO__XREADERS edges, completion does one lookup and scans
 * KVO__XREADERS entries; nothing ever scans the queue.  Edges are deduplicated
 * with a stamp (the predecessor remembers the last job that linked to it), so
 * a job has at most one edge per predecessor, and there are fewer
 * predecessors than max_queued_jobs (zombies, below, count against it): the
 * edge storage is sized at submit.  A resource listed twice in one job
 * (a store reading one engine block into two chunk positions, ops sharing a
 * slot) is linked once: linking is idempotent, so no sort or dedup pass is
 * needed; only a load writing one engine block twice is an error, found
 * before anything is queued with a hash set in the job's own memory
 * (O(blocks)).
 * The job ids live in the same table (tag KVO__XTAG_JOB), for cancel and
 * wait.  A job submitted while no other is unfinished links its resources
 * only when (and if) another job is submitted while it is still live
 * (transfer_queue.c): with nothing unfinished it can have no predecessor,
 * and one job at a time then pays no table work per block.
 *
 * States: WAITING (edges pending) -> READY (in the ready list) -> RUNNING
 * (some unit claimed) -> finished (result posted, resources released,
 * successors released, memory freed or kept on a short spare list for the
 * next submit: transfer_queue.c).  A job that fails before it starts
 * (cancel, layout change, close, or a failed predecessor that wrote what it
 * reads) posts its result at once; if it still waits for predecessors it
 * stays in the graph as a ZOMBIE that copies nothing until they finish, so
 * that jobs ordered after it stay ordered after them.  A successor whose
 * predecessor failed through a write-then-read edge fails with KVO_ECANCELED.
 *
 * Layout changes.  A layout is immutable and reference counted; a job holds
 * the layout it was validated against.  set_layout fails the unfinished jobs
 * of the groups whose segments changed (KVO_ESTATE): unstarted ones at once,
 * running ones by cutting n_units down to the units already claimed, then
 * waits for those units so that the caller may free old tensors once it
 * returns; jobs of other groups keep running on their (identical) segments.
 *
 * Locking.  One mutex protects everything above; it is never held while
 * copying, while calling the allocator (the table grows with the lock
 * dropped; freed jobs and layouts are collected and freed after unlocking),
 * or while calling anything of the caller's.
 *
 * Files: transfer.c (this essay; create, close, layouts, poll, cancel, wait),
 * transfer_submit.c (submit, one function per phase), transfer_queue.c (the
 * dependency table and graph, ready/live lists, results, retiring),
 * transfer_worker.c (workers and work units), layout.c (layout validation).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "transfer/transfer_internal.h"

/* ------------------------------------------------------- public API -- */

kvo_transfer_params kvo_transfer_default_params(void) {
    kvo_transfer_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.threads = 2;
    p.max_queued_jobs = 4096;
    p.nontemporal = -1;
    p.device = NULL;
    p.device_index = 0;
    return p;
}

static void kvo__xstop_workers(kvo_transfer *t) {
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t i = 0; i < t->n_started; i++) pthread_join(t->threads[i], NULL);
    t->n_started = 0;
}

static void kvo__xfree_engine(kvo_transfer *t) {
    for (uint32_t i = 0; i < t->n_threads; i++)
        if (t->wctx[i]) t->dev->worker_fini(t->dev_state, t->wctx[i]);
    if (t->dev_state) t->dev->close(t->dev_state);
    if (t->efd >= 0) close(t->efd);
    if (t->layout) kvo__xlayout_free(t->layout);
    kvo__hmap_free(&t->tab);
    kvo__xspare_free(t);
    kvo__free(t->ring);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    pthread_mutex_destroy(&t->mu);
    kvo__free(t);
}

int kvo_transfer_create(const kvo_transfer_params *p, kvo_transfer **out) {
    kvo_transfer_params p_in_;
    KVO__PARAMS_IN(p, kvo_transfer_params, p_in_, kvo_transfer_default_params, device_index, "kvo_transfer_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_transfer_create: params and out must not be NULL");
    if (!p->plan) return kvo__error(KVO_EINVAL, "kvo_transfer_create: params.plan is required");
    if (p->threads < 1 || p->threads > KVO_TRANSFER_MAX_THREADS)
        return kvo__error(KVO_EINVAL, "kvo_transfer_create: threads = %u, must be 1..%d (default 2)", p->threads,
                          KVO_TRANSFER_MAX_THREADS);
    if (p->max_queued_jobs < 1 || p->max_queued_jobs > (1u << 24))
        return kvo__error(KVO_EINVAL, "kvo_transfer_create: max_queued_jobs = %u, must be 1..%u (default 4096)",
                          p->max_queued_jobs, 1u << 24);
    if (p->nontemporal < -1 || p->nontemporal > 1)
        return kvo__error(KVO_EINVAL, "kvo_transfer_create: nontemporal = %d, must be -1 (auto), 0 or 1",
                          p->nontemporal);
    const kvo__xfer_device_ops *dev = kvo__xfer_device_find(p->device);
    if (!dev)
        return kvo__error(KVO_ENOTSUP, "kvo_transfer_create: transfer device '%s' is not built in (available: %s)",
                          p->device, kvo__xfer_device_names());
    kvo_transfer *t = kvo__calloc(1, sizeof *t);
    if (!t) return kvo__error(KVO_ENOMEM, "kvo_transfer_create: out of memory");
    t->efd = -1;
    t->plan = p->plan;
    t->dev = dev;
    t->max_queued = p->max_queued_jobs;
    t->n_threads = p->threads;
    t->next_id = 1;
    t->claim_budget = -1;
    kvo__hmap_init(&t->tab, sizeof(kvo__xent), 0, "transfer table"); /* no table yet: cannot fail */
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = 0;
    t->ring = kvo__calloc(t->max_queued, sizeof *t->ring);
    if (!t->ring) {
        kvo__xfree_engine(t);
        return kvo__error(KVO_ENOMEM, "kvo_transfer_create: out of memory for %u results", p->max_queued_jobs);
    }
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        int e = errno;
        kvo__xfree_engine(t);
        return kvo__error(KVO_EIO, "kvo_transfer_create: eventfd failed: %s", strerror(e));
    }
    kvo__xfer_device_config cfg = {p->nontemporal, p->device_index};
    if ((rc = dev->open(&cfg, &t->dev_state)) != 0) {
        t->dev_state = NULL;
        kvo__xfree_engine(t);
        return rc;
    }
    t->st.device = dev->name;
    t->st.copy_kind = dev->copy_kind(t->dev_state);
    t->st.nontemporal = dev->nontemporal(t->dev_state);
    for (uint32_t i = 0; i < t->n_threads; i++) {
        if ((rc = dev->worker_init(t->dev_state, i, &t->wctx[i])) != 0) {
            t->wctx[i] = NULL;
            kvo__xfree_engine(t);
            return rc;
        }
    }
    for (uint32_t i = 0; i < t->n_threads; i++) {
        kvo__xworker_arg *a = kvo__malloc(sizeof *a);
        if (a) {
            a->t = t;
            a->index = i;
        }
        int e = a ? pthread_create(&t->threads[i], NULL, kvo__xworker, a) : ENOMEM;
        if (e) {
            kvo__free(a);
            kvo__xstop_workers(t);
            kvo__xfree_engine(t);
            return kvo__error(e == ENOMEM ? KVO_ENOMEM : KVO_EIO, "kvo_transfer_create: starting worker %u: %s", i,
                              strerror(e));
        }
        t->n_started++;
    }
    *out = t;
    return 0;
}

void kvo_transfer_close(kvo_transfer *t) {
    if (!t) return;
    kvo__xgc gc = {0};
    pthread_mutex_lock(&t->mu);
    t->closed = true;
    t->claim_budget = -1; /* running jobs must be able to finish */
    pthread_cond_broadcast(&t->work_cv);
    kvo__xfail_matching(t, 0, KVO_ECANCELED, &gc);
    /* Left: running jobs, and waiting ones that depend on them (released
     * later, they fail at once because closed is set) and zombies. */
    while (t->n_live || t->n_zombies) pthread_cond_wait(&t->done_cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    kvo__xgc_run(&gc);
}

void kvo_transfer_destroy(kvo_transfer *t) {
    if (!t) return;
    kvo_transfer_close(t);
    kvo__xstop_workers(t);
    kvo__xfree_engine(t);
}

int kvo_transfer_set_layout(kvo_transfer *t, const kvo_segment *segs, size_t n) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_transfer_set_layout: t is NULL");
    kvo__xlayout *l = NULL;
    int rc = kvo__xlayout_build(t->plan, t->dev, t->dev_state, segs, n, &l);
    if (rc) return rc;
    kvo__xgc gc = {0};
    pthread_mutex_lock(&t->mu);
    if (t->closed) {
        pthread_mutex_unlock(&t->mu);
        kvo__xlayout_free(l);
        return kvo__error(KVO_ECLOSED, "kvo_transfer_set_layout: the transfer engine is closed");
    }
    uint64_t changed = kvo__xlayout_changed(t->layout, l);
    /* Unstarted jobs of changed groups fail. */
    if (changed) kvo__xfail_matching(t, changed, KVO_ESTATE, &gc);
    kvo__xlayout *old = t->layout;
    t->layout = l;
    if (old) kvo__xgc_layout_unref(&gc, old);
    /* Running jobs of changed groups stop after the units in flight and fail
     * with KVO_ESTATE (listed first: finishing one may retire others). */
    kvo__xjob *doomed = NULL;
    for (kvo__xjob *j = t->live_head; j; j = j->lnext) {
        if (!j->started || j->layout == l || !(j->group_mask & changed)) continue;
        j->doom_next = doomed;
        doomed = j;
    }
    while (doomed) {
        kvo__xjob *j = doomed;
        doomed = j->doom_next;
        if (j->posted) continue;
        if (!j->status) j->status = KVO_ESTATE;
        if (j->next_unit < j->n_units) { /* still in the ready list */
            kvo__xready_remove(t, j);
            j->n_units = j->next_unit;
        }
        if (j->done_units == j->n_units) { /* nothing in flight */
            kvo__xpost(t, j, j->status);
            kvo__xretire(t, j, j->status, &gc);
        }
    }
    /* Wait for the units in flight (they copy on the old layout). */
    for (;;) {
        bool busy = false;
        for (kvo__xjob *j = t->live_head; j && !busy; j = j->lnext)
            if (j->started && j->layout != l && (j->group_mask & changed)) busy = true;
        if (!busy) break;
        pthread_cond_wait(&t->done_cv, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    kvo__xgc_run(&gc);
    return 0;
}

int kvo_transfer_poll(kvo_transfer *t, kvo_xfer_result *out, size_t cap, size_t *n) {
    if (!t || !n || (cap && !out)) return kvo__error(KVO_EINVAL, "kvo_transfer_poll: t, out and n must not be NULL");
    pthread_mutex_lock(&t->mu);
    size_t k = 0;
    while (k < cap && t->ring_count) {
        out[k++] = t->ring[t->ring_head];
        t->ring_head = (t->ring_head + 1) % t->max_queued;
        t->ring_count--;
    }
    if (k && t->ring_count == 0) kvo__efd_drain(t->efd);
    pthread_mutex_unlock(&t->mu);
    *n = k;
    return 0;
}

int kvo_transfer_event_fd(const kvo_transfer *t) { return t ? t->efd : -1; }

int kvo_transfer_cancel(kvo_transfer *t, uint64_t job_id) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_transfer_cancel: t is NULL");
    kvo__xgc gc = {0};
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    kvo__xent *e = kvo__xtab_find(t, job_id, KVO__XTAG_JOB);
    if (!e) {
        if (job_id >= 1 && job_id < t->next_id)
            rc = kvo__error(KVO_EBUSY, "kvo_transfer_cancel: job %llu has already finished",
                            (unsigned long long)job_id);
        else
            rc = kvo__error(KVO_ENOTFOUND, "kvo_transfer_cancel: no job %llu (ids so far: 1..%llu)",
                            (unsigned long long)job_id, (unsigned long long)t->next_id - 1);
    } else if (e->writer->started) {
        rc = kvo__error(KVO_EBUSY, "kvo_transfer_cancel: job %llu is running", (unsigned long long)job_id);
    } else {
        kvo__xfail_unstarted(t, e->writer, KVO_ECANCELED, &gc);
    }
    pthread_mutex_unlock(&t->mu);
    kvo__xgc_run(&gc);
    return rc;
}

int kvo_transfer_wait(kvo_transfer *t, const uint64_t *job_ids, size_t n, int64_t timeout_ns) {
    if (!t || (n && !job_ids)) return kvo__error(KVO_EINVAL, "kvo_transfer_wait: t and job_ids must not be NULL");
    struct timespec dl;
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)timeout_ns % 1000000000u;
        dl.tv_sec += (time_t)(timeout_ns / 1000000000) + (time_t)(ns / 1000000000u);
        dl.tv_nsec = (long)(ns % 1000000000u);
    }
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n && !rc; i++) {
        if (job_ids[i] < 1 || job_ids[i] >= t->next_id) {
            rc = kvo__error(KVO_ENOTFOUND, "kvo_transfer_wait: no job %llu (ids so far: 1..%llu)",
                            (unsigned long long)job_ids[i], (unsigned long long)t->next_id - 1);
            break;
        }
        while (kvo__xtab_find(t, job_ids[i], KVO__XTAG_JOB)) {
            if (timeout_ns < 0) pthread_cond_wait(&t->done_cv, &t->mu);
            else if (pthread_cond_timedwait(&t->done_cv, &t->mu, &dl) == ETIMEDOUT &&
                     kvo__xtab_find(t, job_ids[i], KVO__XTAG_JOB)) {
                rc = kvo__error(KVO_ETIMEDOUT, "kvo_transfer_wait: job %llu did not finish within %lld ns",
                                (unsigned long long)job_ids[i], (long long)timeout_ns);
                break;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int kvo_transfer_slot_offset(const kvo_transfer *t, uint32_t group, uint32_t seg_in_group, uint32_t block,
                             uint64_t *offset) {
    if (!t || !offset) return kvo__error(KVO_EINVAL, "kvo_transfer_slot_offset: t and offset must not be NULL");
    kvo_transfer *m = (kvo_transfer *)t; /* the lock only */
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    const kvo__xlayout *L = m->layout;
    if (!L) rc = kvo__error(KVO_ESTATE, "kvo_transfer_slot_offset: no layout registered");
    else if (group >= L->n_groups || !kvo_plan_group(t->plan, group)->offloaded)
        rc = kvo__error(KVO_EINVAL, "kvo_transfer_slot_offset: group %u is not an offloaded group of the plan", group);
    else {
        const kvo__xgroup *G = &L->groups[group];
        if (seg_in_group >= G->n_segs || block >= G->blocks_per_chunk)
            rc = kvo__error(KVO_EINVAL,
                            "kvo_transfer_slot_offset: group %u has %u segments and %llu blocks per chunk; asked "
                            "for segment %u block %u",
                            group, G->n_segs, (unsigned long long)G->blocks_per_chunk, seg_in_group, block);
        else {
            const kvo__xseg *s = &L->segs[G->first_seg + seg_in_group];
            *offset = G->blocks_per_chunk * s->slot_prefix + (uint64_t)block * s->page;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int kvo_transfer_layout_hash(const kvo_transfer *t, uint64_t *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_transfer_layout_hash: t and out must not be NULL");
    kvo_transfer *m = (kvo_transfer *)t;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    if (!m->layout) rc = kvo__error(KVO_ESTATE, "kvo_transfer_layout_hash: no layout registered");
    else *out = m->layout->hash;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void kvo__transfer_pause(kvo_transfer *t, bool paused) { kvo__transfer_allow_units(t, paused ? 0 : -1); }

int64_t kvo__transfer_units_allowed(kvo_transfer *t) {
    pthread_mutex_lock(&t->mu);
    int64_t b = t->claim_budget;
    pthread_mutex_unlock(&t->mu);
    return b;
}

void kvo__transfer_allow_units(kvo_transfer *t, int64_t units) {
    pthread_mutex_lock(&t->mu);
    t->claim_budget = units;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
}

static int kvo__transfer_get_stats_fill(kvo_transfer *t, kvo_transfer_stats *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_transfer_get_stats: t and out must not be NULL");
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->jobs_queued = t->n_live;
    out->results_pending = t->ring_count;
    pthread_mutex_unlock(&t->mu);
    /* the host device's measured choice can change after create */
    out->copy_kind = t->dev->copy_kind(t->dev_state);
    out->nontemporal = t->dev->nontemporal(t->dev_state);
    return 0;
}

int kvo_transfer_get_stats(kvo_transfer *t, kvo_transfer_stats *out) {
    kvo_transfer_stats full = KVO_TRANSFER_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_transfer_get_stats", kvo_transfer_stats, device, "KVO_TRANSFER_STATS_INIT", out, full,
                   kvo__transfer_get_stats_fill(t, &full));
}
