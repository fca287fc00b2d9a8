/*
 * The transfer engine: jobs of block copies between engine KV tensors and
 * chunk slots, ordered by what they touch and run by a pool of workers.
 *
 * A job (one submit) is a list of ops; op k copies blocks [first, first+n) of
 * one chunk of one group.  It is split into work units: per op and per
 * segment of its group, runs of up to unit_blocks blocks (about
 * KVO__XUNIT_BYTES of pages; pages of 2 MiB and more are instead split into
 * parts of about 1 MiB, one unit each), numbered 0..n_units-1 through a prefix sum over
 * the ops.  Workers claim units one at a time from the job at the head of the
 * ready lists (one per direction; loads first, since a request waits for
 * them while stores are background work: dependencies, not queue order,
 * keep conflicting jobs in order), so a large job is copied by every worker
 * at once and a small one by one; a unit merges consecutive pages whose engine addresses are
 * adjacent into one copy (a slot side of a unit is always contiguous) and
 * asks the device to prefetch the next piece's source while it copies the
 * current one.  The device (device.h) does the copying; nothing is allocated
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
 * (open addressing, linear probing, backward-shift deletion) maps each
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
 * before anything is queued with a temporary hash set (O(blocks)).
 * The job ids live in the same table (tag KVO__XTAG_JOB), for cancel and
 * wait.
 *
 * States: WAITING (edges pending) -> READY (in the ready list) -> RUNNING
 * (some unit claimed) -> finished (result posted, resources released,
 * successors released, memory freed).  A job that fails before it starts
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
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "transfer/transfer_internal.h"

#define KVO__XREADERS 4
#define KVO__XTAG_SLOT UINT64_MAX
#define KVO__XTAG_JOB (UINT64_MAX - 1)

enum { KVO__XJ_WAITING = 0, KVO__XJ_READY, KVO__XJ_RUNNING, KVO__XJ_ZOMBIE };

typedef struct kvo__xjob kvo__xjob;

typedef struct kvo__xedge {
    kvo__xjob *to;
    struct kvo__xedge *next;
    bool raw;   /* predecessor writes something `to` reads */
} kvo__xedge;

typedef struct kvo__xop {
    uint32_t group, first_block, n_blocks;
    uint64_t units_per_seg;
    uint64_t unit_start;
    const uint64_t *blocks;
    unsigned char *slot;
} kvo__xop;

typedef struct kvo__xres {
    uint64_t a, b;   /* slot: (address, TAG_SLOT); engine block: (block id, group) */
    uint64_t write;
} kvo__xres;

struct kvo__xjob {
    uint64_t id;
    int dir;
    int state;
    int status;      /* first failure while running, or the unstarted failure */
    int dep_error;   /* a predecessor that wrote what we read failed */
    bool started;
    kvo__xlayout *layout;
    uint64_t group_mask;
    size_t n_ops;
    kvo__xop *ops;
    size_t n_res;
    kvo__xres *res;
    kvo__xedge *edges;         /* storage of incoming edges */
    size_t n_edges, cap_edges;
    kvo__xedge *succ;          /* outgoing edges (stored in the successors) */
    uint64_t stamp;            /* id of the last job that linked to us */
    kvo__xedge *stamp_edge;
    uint32_t n_deps;
    uint64_t n_units, next_unit, done_units;
    uint64_t bytes, copies;
    uint64_t t_start;
    kvo__xjob *rprev, *rnext;  /* ready list */
    kvo__xjob *lprev, *lnext;  /* live list (unfinished, not zombie) */
    kvo__xjob *work_next;      /* retire worklist, then free list */
    kvo__xjob *doom_next;      /* kvo__xfail_matching's list */
    bool posted;               /* result posted */
};

typedef struct kvo__xent {
    uint64_t a, b;
    kvo__xjob *writer;         /* TAG_JOB entries: the job */
    kvo__xjob *readers[KVO__XREADERS];
    uint32_t n_readers;
    uint32_t used;
} kvo__xent;

/* Things to free once the lock is dropped. */
typedef struct kvo__xgc {
    kvo__xjob *jobs;
    kvo__xlayout *layouts[8];
    size_t n_layouts;
} kvo__xgc;

struct kvo_transfer {
    const kvo_plan *plan;
    const kvo__xfer_device_ops *dev;
    void *dev_state;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    uint32_t n_threads, n_started;
    pthread_t threads[KVO_TRANSFER_MAX_THREADS];
    void *wctx[KVO_TRANSFER_MAX_THREADS];
    int efd;
    bool closed, stop;
    int64_t claim_budget;   /* tests: units workers may still claim; -1 = no limit */
    uint32_t max_queued;
    kvo__xlayout *layout;
    uint64_t next_id;
    kvo__xjob *ready_head[2], *ready_tail[2]; /* per direction: [KVO_XFER_LOAD] first */
    kvo__xjob *live_head;
    size_t n_live, n_zombies;
    kvo__xent *tab;
    size_t tab_cap, tab_count;
    kvo_xfer_result *ring;
    size_t ring_head, ring_count;
    kvo_transfer_stats st;
};

/* ------------------------------------------------------------ hashing -- */

static inline uint64_t kvo__xhash(uint64_t a, uint64_t b) {
    uint64_t x = a * UINT64_C(0x9E3779B97F4A7C15) ^ (b + UINT64_C(0x632BE59BD9B4E019)) * UINT64_C(0xC2B2AE3D27D4EB4F);
    x ^= x >> 29;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 32;
    return x;
}

static kvo__xent *kvo__xtab_find(kvo_transfer *t, uint64_t a, uint64_t b) {
    if (!t->tab_cap) return NULL;
    size_t mask = t->tab_cap - 1, i = kvo__xhash(a, b) & mask;
    while (t->tab[i].used) {
        if (t->tab[i].a == a && t->tab[i].b == b) return &t->tab[i];
        i = (i + 1) & mask;
    }
    return NULL;
}

/* Capacity was reserved: never fails. */
static kvo__xent *kvo__xtab_get(kvo_transfer *t, uint64_t a, uint64_t b) {
    size_t mask = t->tab_cap - 1, i = kvo__xhash(a, b) & mask;
    while (t->tab[i].used) {
        if (t->tab[i].a == a && t->tab[i].b == b) return &t->tab[i];
        i = (i + 1) & mask;
    }
    assert((t->tab_count + 1) * 2 <= t->tab_cap);
    memset(&t->tab[i], 0, sizeof t->tab[i]);
    t->tab[i].used = 1;
    t->tab[i].a = a;
    t->tab[i].b = b;
    t->tab_count++;
    return &t->tab[i];
}

static void kvo__xtab_erase(kvo_transfer *t, kvo__xent *e) {
    size_t mask = t->tab_cap - 1, i = (size_t)(e - t->tab), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->tab[j].used) break;
        size_t k = kvo__xhash(t->tab[j].a, t->tab[j].b) & mask;
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        t->tab[i] = t->tab[j];
        i = j;
    }
    t->tab[i].used = 0;
    t->tab_count--;
}

/* Make room for `extra` more entries.  Lock held on entry and exit; dropped
 * while allocating. */
static int kvo__xtab_reserve(kvo_transfer *t, size_t extra) {
    while ((t->tab_count + extra) * 2 > t->tab_cap) {
        size_t ncap = t->tab_cap ? t->tab_cap : 1024;
        while ((t->tab_count + extra) * 2 > ncap) {
            if (ncap > (SIZE_MAX / sizeof(kvo__xent)) / 4) return KVO_ENOMEM;
            ncap *= 2;
        }
        size_t old_cap = t->tab_cap;
        pthread_mutex_unlock(&t->mu);
        kvo__xent *nt = kvo__calloc(ncap, sizeof *nt);
        pthread_mutex_lock(&t->mu);
        if (!nt) return KVO_ENOMEM;
        if (t->tab_cap != old_cap) { /* grown meanwhile: start over */
            pthread_mutex_unlock(&t->mu);
            kvo__free(nt);
            pthread_mutex_lock(&t->mu);
            continue;
        }
        kvo__xent *old = t->tab;
        size_t mask = ncap - 1;
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i].used) continue;
            size_t k = kvo__xhash(old[i].a, old[i].b) & mask;
            while (nt[k].used) k = (k + 1) & mask;
            nt[k] = old[i];
        }
        t->tab = nt;
        t->tab_cap = ncap;
        pthread_mutex_unlock(&t->mu);
        kvo__free(old);
        pthread_mutex_lock(&t->mu);
    }
    return 0;
}

/* ------------------------------------------------------ small helpers -- */

static void kvo__xgc_layout_unref(kvo__xgc *gc, kvo__xlayout *l, kvo_transfer *t) {
    (void)t;
    if (!l) return;
    assert(l->refs > 0);
    if (--l->refs) return;
    if (gc->n_layouts < sizeof gc->layouts / sizeof gc->layouts[0]) gc->layouts[gc->n_layouts++] = l;
    else kvo__xlayout_free(l); /* not reached in practice: at most 2 layouts die per call */
}

static void kvo__xgc_run(kvo__xgc *gc) {
    while (gc->jobs) {
        kvo__xjob *j = gc->jobs;
        gc->jobs = j->work_next;
        kvo__free(j);
    }
    for (size_t i = 0; i < gc->n_layouts; i++) kvo__xlayout_free(gc->layouts[i]);
    gc->n_layouts = 0;
}

static void kvo__xready_push(kvo_transfer *t, kvo__xjob *j) {
    j->rnext = NULL;
    j->rprev = t->ready_tail[j->dir];
    if (t->ready_tail[j->dir]) t->ready_tail[j->dir]->rnext = j;
    else t->ready_head[j->dir] = j;
    t->ready_tail[j->dir] = j;
}

static void kvo__xready_remove(kvo_transfer *t, kvo__xjob *j) {
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

/* Post j's result, take it out of the live list and the id map. */
static void kvo__xpost(kvo_transfer *t, kvo__xjob *j, int status) {
    kvo__xent *e = kvo__xtab_find(t, j->id, KVO__XTAG_JOB);
    assert(e && e->writer == j && !j->posted);
    j->posted = true;
    kvo__xtab_erase(t, e);
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

static void kvo__xfail_unstarted(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc);

/* Release everything j holds in the graph and free it (deferred).  status:
 * j's outcome, propagated to successors along write->read edges.  Iterative:
 * successors that become free of dependencies are handled here too. */
static void kvo__xretire(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc) {
    kvo__xjob *work = NULL;
    for (;;) {
        assert(j->n_deps == 0);
        for (size_t r = 0; r < j->n_res; r++) {
            kvo__xent *e = kvo__xtab_find(t, j->res[r].a, j->res[r].b);
            if (!e) continue; /* listed twice: released already */
            if (e->writer == j) e->writer = NULL;
            for (uint32_t k = 0; k < e->n_readers; k++) {
                if (e->readers[k] != j) continue;
                memmove(&e->readers[k], &e->readers[k + 1], (e->n_readers - k - 1) * sizeof e->readers[0]);
                e->n_readers--;
                break;
            }
            if (!e->writer && !e->n_readers) kvo__xtab_erase(t, e);
        }
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
        kvo__xgc_layout_unref(gc, j->layout, t);
        j->layout = NULL;
        j->work_next = gc->jobs;
        gc->jobs = j;

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
static void kvo__xfail_unstarted(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc) {
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
static void kvo__xfail_matching(kvo_transfer *t, uint64_t mask, int status, kvo__xgc *gc) {
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

/* ----------------------------------------------------------- workers -- */

/* Copy len bytes between a slot and engine memory in j's direction. */
static inline void kvo__xcopy(kvo_transfer *t, const kvo__xjob *j, void *wctx, unsigned char *slot, uintptr_t eng,
                              uint64_t len) {
    if (j->dir == KVO_XFER_STORE) t->dev->copy(wctx, j->dir, slot, (const void *)eng, len);
    else t->dev->copy(wctx, j->dir, (void *)eng, slot, len);
}

static int kvo__xrun_unit(kvo_transfer *t, kvo__xjob *j, uint64_t u, void *wctx, uint64_t *bytes,
                          uint64_t *copies) {
    size_t lo = 0, hi = j->n_ops;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->ops[mid].unit_start <= u) lo = mid;
        else hi = mid;
    }
    const kvo__xop *op = &j->ops[lo];
    assert(u >= op->unit_start && op->units_per_seg > 0);
    const kvo__xgroup *G = &j->layout->groups[op->group];
    uint64_t r = u - op->unit_start;
    uint64_t s = r / op->units_per_seg, part = r % op->units_per_seg;
    assert(s < G->n_segs);
    const kvo__xseg *seg = &j->layout->segs[G->first_seg + s];
    if (G->unit_parts > 1) {
        /* One part of one huge page. */
        uint64_t b = part / G->unit_parts, plen = kvo__xpart_bytes(seg->page, G->unit_parts);
        uint64_t off = (part % G->unit_parts) * plen, len = 0;
        if (off < seg->page) {
            len = seg->page - off < plen ? seg->page - off : plen;
            unsigned char *sl = op->slot + G->blocks_per_chunk * seg->slot_prefix +
                                (op->first_block + b) * seg->page + off;
            kvo__xcopy(t, j, wctx, sl, seg->base + (uintptr_t)(op->blocks[b] * seg->stride) + off, len);
        }
        *bytes = len;
        *copies = len != 0;
        return t->dev->unit_end(wctx);
    }
    uint64_t b0 = part * G->unit_blocks, b1 = b0 + G->unit_blocks;
    if (b1 > op->n_blocks) b1 = op->n_blocks;
    unsigned char *slot = op->slot + G->blocks_per_chunk * seg->slot_prefix + (op->first_block + b0) * seg->page;
    uintptr_t run_eng = 0;
    unsigned char *run_slot = slot;
    uint64_t run_len = 0, n = 0, total = 0;
    for (uint64_t i = b0; i < b1; i++) {
        uintptr_t eng = seg->base + (uintptr_t)(op->blocks[i] * seg->stride);
        if (run_len && eng == run_eng + run_len) {
            run_len += seg->page;
            continue;
        }
        if (run_len) {
            /* Start fetching the next run's source while this one copies. */
            if (t->dev->prefetch)
                t->dev->prefetch(wctx, j->dir == KVO_XFER_STORE ? (const void *)eng
                                                                 : (const void *)(slot + (i - b0) * seg->page),
                                 seg->page);
            kvo__xcopy(t, j, wctx, run_slot, run_eng, run_len);
            n++;
            total += run_len;
        }
        run_eng = eng;
        run_slot = slot + (i - b0) * seg->page;
        run_len = seg->page;
    }
    if (run_len) {
        kvo__xcopy(t, j, wctx, run_slot, run_eng, run_len);
        n++;
        total += run_len;
    }
    *bytes = total;
    *copies = n;
    return t->dev->unit_end(wctx);
}

typedef struct kvo__xworker_arg {
    kvo_transfer *t;
    uint32_t index;
} kvo__xworker_arg;

static void *kvo__xworker(void *arg) {
    kvo_transfer *t = ((kvo__xworker_arg *)arg)->t;
    uint32_t w = ((kvo__xworker_arg *)arg)->index;
    kvo__free(arg);
    void *wctx = t->wctx[w];
    kvo__xgc gc = {0};
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        /* Loads first: a request waits for them; stores are background. */
        kvo__xjob *j = t->ready_head[KVO_XFER_LOAD] ? t->ready_head[KVO_XFER_LOAD] : t->ready_head[KVO_XFER_STORE];
        if (!j || t->claim_budget == 0) {
            pthread_cond_wait(&t->work_cv, &t->mu);
            continue;
        }
        if (t->claim_budget > 0) t->claim_budget--;
        uint64_t u = j->next_unit++;
        if (j->next_unit == j->n_units) kvo__xready_remove(t, j);
        if (!j->started) {
            j->started = true;
            j->state = KVO__XJ_RUNNING;
            j->t_start = kvo__now_ns();
        }
        /* Another worker may take the job's next unit meanwhile. */
        if (j->next_unit < j->n_units && t->n_threads > 1) pthread_cond_signal(&t->work_cv);
        pthread_mutex_unlock(&t->mu);
        uint64_t bytes = 0, copies = 0;
        int rc = kvo__xrun_unit(t, j, u, wctx, &bytes, &copies);
        pthread_mutex_lock(&t->mu);
        j->bytes += bytes;
        j->copies += copies;
        if (rc && !j->status) j->status = rc;
        if (++j->done_units == j->n_units) {
            kvo__xpost(t, j, j->status);
            kvo__xretire(t, j, j->status, &gc);
            if (gc.jobs || gc.n_layouts) {
                pthread_mutex_unlock(&t->mu);
                kvo__xgc_run(&gc);
                pthread_mutex_lock(&t->mu);
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ------------------------------------------------------- public API -- */

kvo_transfer_params kvo_transfer_default_params(void) {
    kvo_transfer_params p;
    memset(&p, 0, sizeof p);
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
    kvo__free(t->tab);
    kvo__free(t->ring);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    pthread_mutex_destroy(&t->mu);
    kvo__free(t);
}

int kvo_transfer_create(const kvo_transfer_params *p, kvo_transfer **out) {
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
    if (old) kvo__xgc_layout_unref(&gc, old, t);
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

typedef struct kvo__xslotuse {
    uintptr_t slot;
    uint32_t group, first, end;
    size_t op;
} kvo__xslotuse;

static int kvo__xslotuse_cmp(const void *x, const void *y) {
    const kvo__xslotuse *a = x, *b = y;
    if (a->slot != b->slot) return a->slot < b->slot ? -1 : 1;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    return a->op < b->op ? -1 : (a->op > b->op);
}

/* Ops sharing a slot must be of one group, and in a store cover disjoint
 * blocks (two workers would race on the same bytes).  O(n log n) in ops. */
static int kvo__xcheck_slots(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n) {
    if (n < 2) return 0;
    kvo__xslotuse *u = kvo__malloc(sizeof *u * n);
    if (!u) return kvo__error(KVO_ENOMEM, "kvo_transfer_submit: out of memory checking %zu ops", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ops[i].n_blocks)
            u[m++] = (kvo__xslotuse){(uintptr_t)ops[i].slot, ops[i].group, ops[i].first_block,
                                     ops[i].first_block + ops[i].n_blocks, i};
    qsort(u, m, sizeof *u, kvo__xslotuse_cmp);
    int rc = 0;
    for (size_t i = 1; i < m && !rc; i++) {
        if (u[i].slot != u[i - 1].slot) continue;
        if (u[i].group != u[i - 1].group)
            rc = kvo__error(KVO_EINVAL, "%s ops %zu and %zu: one slot %p for groups '%s' and '%s'",
                            dir == KVO_XFER_STORE ? "store" : "load", u[i - 1].op, u[i].op, (void *)u[i].slot,
                            kvo_plan_group(t->plan, u[i - 1].group)->name, kvo_plan_group(t->plan, u[i].group)->name);
        else if (dir == KVO_XFER_STORE && u[i].first < u[i - 1].end)
            rc = kvo__error(KVO_EINVAL,
                            "store ops %zu and %zu write chunk blocks [%u, %u) and [%u, %u) of the same slot %p: "
                            "the ranges overlap",
                            u[i - 1].op, u[i].op, u[i - 1].first, u[i - 1].end, u[i].first, u[i].end,
                            (void *)u[i].slot);
    }
    kvo__free(u);
    return rc;
}

/* Any engine block written twice in res?  A temporary open-addressing set
 * of (block, group) pairs: O(n), one allocation per load job, no lock. */
static int kvo__xcheck_dup_writes(kvo_transfer *t, const kvo__xres *res, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    uint64_t *set = kvo__malloc(sizeof(uint64_t) * 2 * cap);
    if (!set) return kvo__error(KVO_ENOMEM, "kvo_transfer_submit: out of memory checking %zu blocks", n);
    for (size_t i = 0; i < cap; i++) set[2 * i + 1] = UINT64_MAX; /* empty */
    int rc = 0;
    for (size_t r = 0; r < n && !rc; r++) {
        if (!res[r].write) continue;
        size_t i = kvo__xhash(res[r].a, res[r].b) & (cap - 1);
        for (;;) {
            if (set[2 * i + 1] == UINT64_MAX) {
                set[2 * i] = res[r].a;
                set[2 * i + 1] = res[r].b;
                break;
            }
            if (set[2 * i] == res[r].a && set[2 * i + 1] == res[r].b) {
                rc = kvo__error(KVO_EINVAL,
                                "load: engine block %llu of group '%s' is written twice in one job (two chunk "
                                "blocks cannot load into the same engine block)",
                                (unsigned long long)res[r].a, kvo_plan_group(t->plan, (size_t)res[r].b)->name);
                break;
            }
            i = (i + 1) & (cap - 1);
        }
    }
    kvo__free(set);
    return rc;
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

int kvo_transfer_submit(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n, uint64_t *job_id) {
    if (!t || !job_id || (n && !ops))
        return kvo__error(KVO_EINVAL, "kvo_transfer_submit: t, job_id and ops (when n > 0) must not be NULL");
    if (dir != KVO_XFER_STORE && dir != KVO_XFER_LOAD)
        return kvo__error(KVO_EINVAL, "kvo_transfer_submit: dir %d is neither KVO_XFER_STORE nor KVO_XFER_LOAD",
                          (int)dir);
    const char *dname = dir == KVO_XFER_STORE ? "store" : "load";
    kvo__xgc gc = {0};

    /* The layout to validate against. */
    pthread_mutex_lock(&t->mu);
    if (t->closed) {
        pthread_mutex_unlock(&t->mu);
        return kvo__error(KVO_ECLOSED, "kvo_transfer_submit: the transfer engine is closed");
    }
    kvo__xlayout *L = t->layout;
    if (!L) {
        pthread_mutex_unlock(&t->mu);
        return kvo__error(KVO_ESTATE, "kvo_transfer_submit: no layout registered (call kvo_transfer_set_layout)");
    }
    L->refs++;
    pthread_mutex_unlock(&t->mu);

    /* Validate every op; count blocks, units, resources. */
    int rc = 0;
    uint64_t total_blocks = 0, n_units = 0, group_mask = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const kvo_xfer_op *op = &ops[i];
        const kvo_group_plan *gp = op->group < kvo_plan_num_groups(t->plan) ? kvo_plan_group(t->plan, op->group)
                                                                           : NULL;
        if (!gp) {
            rc = kvo__error(KVO_EINVAL, "%s op %zu: group id %u does not exist (the plan has %zu groups)", dname, i,
                            op->group, kvo_plan_num_groups(t->plan));
            break;
        }
        if (!gp->offloaded) {
            rc = kvo__error(KVO_EINVAL, "%s op %zu: group '%s' (id %u) is not offloaded", dname, i, gp->name,
                            op->group);
            break;
        }
        const kvo__xgroup *G = &L->groups[op->group];
        if ((uint64_t)op->first_block + op->n_blocks > gp->blocks_per_chunk) {
            rc = kvo__error(KVO_EINVAL,
                            "%s op %zu, group '%s': blocks [%u, %llu) are not within the chunk of %llu blocks",
                            dname, i, gp->name, op->first_block,
                            (unsigned long long)op->first_block + op->n_blocks,
                            (unsigned long long)gp->blocks_per_chunk);
            break;
        }
        if (op->n_blocks == 0) continue;
        group_mask |= UINT64_C(1) << op->group;
        if (!op->engine_blocks) {
            rc = kvo__error(KVO_EINVAL, "%s op %zu, group '%s': engine_blocks is NULL for %u blocks", dname, i,
                            gp->name, op->n_blocks);
            break;
        }
        uintptr_t slot_end;
        if (!op->slot || op->slot_bytes < gp->chunk_bytes ||
            __builtin_add_overflow((uintptr_t)op->slot, (uintptr_t)gp->chunk_bytes, &slot_end)) {
            rc = kvo__error(KVO_EINVAL,
                            "%s op %zu, group '%s': slot %p of %llu bytes cannot hold the chunk of %llu bytes "
                            "(the group's slot_bytes is %llu)",
                            dname, i, gp->name, op->slot, (unsigned long long)op->slot_bytes,
                            (unsigned long long)gp->chunk_bytes, (unsigned long long)gp->slot_bytes);
            break;
        }
        for (uint32_t b = 0; b < op->n_blocks; b++) {
            if (op->engine_blocks[b] >= G->num_blocks) {
                rc = kvo__error(KVO_EINVAL,
                                "%s op %zu, group '%s': engine block %llu (entry %u) is out of range: the layout "
                                "has %llu blocks (ids 0..%llu)",
                                dname, i, gp->name, (unsigned long long)op->engine_blocks[b], b,
                                (unsigned long long)G->num_blocks, (unsigned long long)G->num_blocks - 1);
                break;
            }
        }
        total_blocks += op->n_blocks;
        n_units += kvo__xunits_per_seg(G, op->n_blocks) * G->n_segs;
    }
    if (!rc) rc = kvo__xcheck_slots(t, dir, ops, n);
    kvo__xjob *j = NULL;
    size_t n_res = 0;
    if (!rc) {
        size_t max_res = n + (size_t)total_blocks;
        uint64_t cap_edges = (uint64_t)max_res * (1 + KVO__XREADERS);
        if (cap_edges > t->max_queued) cap_edges = t->max_queued;
        size_t sz = sizeof *j + sizeof(kvo__xop) * n + sizeof(uint64_t) * total_blocks + sizeof(kvo__xres) * max_res +
                    sizeof(kvo__xedge) * cap_edges;
        j = kvo__calloc(1, sz);
        if (!j) rc = kvo__error(KVO_ENOMEM, "kvo_transfer_submit: out of memory for a job of %zu ops, %llu blocks",
                                n, (unsigned long long)total_blocks);
        else {
            j->ops = (kvo__xop *)(j + 1);
            uint64_t *blocks = (uint64_t *)(j->ops + n);
            j->res = (kvo__xres *)(blocks + total_blocks);
            j->edges = (kvo__xedge *)(j->res + max_res);
            j->cap_edges = (size_t)cap_edges;
            j->dir = dir;
            j->layout = L;
            j->group_mask = group_mask;
            j->n_ops = n;
            j->n_units = n_units;
            uint64_t unit = 0, bpos = 0;
            for (size_t i = 0; i < n; i++) {
                const kvo_xfer_op *op = &ops[i];
                kvo__xop *x = &j->ops[i];
                const kvo__xgroup *G = &L->groups[op->group];
                x->group = op->group;
                x->first_block = op->first_block;
                x->n_blocks = op->n_blocks;
                x->slot = op->slot;
                x->blocks = blocks + bpos;
                x->unit_start = unit;
                if (op->n_blocks == 0) continue;
                memcpy(blocks + bpos, op->engine_blocks, sizeof(uint64_t) * op->n_blocks);
                bpos += op->n_blocks;
                x->units_per_seg = kvo__xunits_per_seg(G, op->n_blocks);
                unit += x->units_per_seg * G->n_segs;
                j->res[n_res++] = (kvo__xres){(uint64_t)(uintptr_t)op->slot, KVO__XTAG_SLOT, dir == KVO_XFER_STORE};
                for (uint32_t b = 0; b < op->n_blocks; b++)
                    j->res[n_res++] = (kvo__xres){op->engine_blocks[b], op->group, dir == KVO_XFER_LOAD};
            }
            assert(unit == n_units);
            /* A load must not write one engine block twice (two workers would
             * race).  Other repeats (a store reading a block into two chunk
             * positions, ops sharing a slot) are fine: linking is idempotent. */
            if (dir == KVO_XFER_LOAD) rc = kvo__xcheck_dup_writes(t, j->res, n_res);
            j->n_res = n_res;
        }
    }
    if (rc) {
        pthread_mutex_lock(&t->mu);
        kvo__xgc_layout_unref(&gc, L, t);
        pthread_mutex_unlock(&t->mu);
        kvo__free(j);
        kvo__xgc_run(&gc);
        return rc;
    }

    /* Enqueue. */
    pthread_mutex_lock(&t->mu);
    if (kvo__xtab_reserve(t, n_res + 1)) rc = kvo__error(KVO_ENOMEM, "kvo_transfer_submit: out of memory for the "
                                                                     "dependency table (%zu entries)", t->tab_count + n_res + 1);
    else if (t->closed) rc = kvo__error(KVO_ECLOSED, "kvo_transfer_submit: the transfer engine is closed");
    else if (t->n_live + t->n_zombies + t->ring_count >= t->max_queued)
        /* Zombies count too: every possible predecessor of this job is live
         * or a zombie, so fewer than max_queued edges are ever needed. */
        rc = kvo__error(KVO_EAGAIN,
                        "kvo_transfer_submit: %zu jobs unfinished (%zu of them canceled but still ordered) and %zu "
                        "results unpolled reach max_queued_jobs %u: poll results or wait, then retry",
                        t->n_live + t->n_zombies, t->n_zombies, t->ring_count, t->max_queued);
    else if (t->layout != L && (kvo__xlayout_changed(L, t->layout) & group_mask))
        rc = kvo__error(KVO_ESTATE, "kvo_transfer_submit: the layout of a group in this job changed during the "
                                    "submit; submit again");
    if (rc) {
        kvo__xgc_layout_unref(&gc, L, t);
        pthread_mutex_unlock(&t->mu);
        kvo__free(j);
        kvo__xgc_run(&gc);
        return rc;
    }
    j->id = t->next_id++;
    kvo__xtab_get(t, j->id, KVO__XTAG_JOB)->writer = j;
    for (size_t r = 0; r < n_res; r++) {
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
    kvo__xlive_push(t, j);
    t->st.jobs_submitted++;
    *job_id = j->id;
    if (j->n_deps) {
        j->state = KVO__XJ_WAITING;
        t->st.dep_waits++;
    } else if (j->n_units == 0) {
        kvo__xpost(t, j, 0);
        kvo__xretire(t, j, 0, &gc);
    } else {
        j->state = KVO__XJ_READY;
        kvo__xready_push(t, j);
        pthread_cond_signal(&t->work_cv);
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
    if (k && t->ring_count == 0) {
        uint64_t v;
        ssize_t r = read(t->efd, &v, sizeof v);
        (void)r; /* EAGAIN when already zero: fine */
    }
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

int kvo_transfer_get_stats(kvo_transfer *t, kvo_transfer_stats *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_transfer_get_stats: t and out must not be NULL");
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->jobs_queued = t->n_live;
    out->results_pending = t->ring_count;
    pthread_mutex_unlock(&t->mu);
    return 0;
}
