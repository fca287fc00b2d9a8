/*
 * Internal structures of the transfer layer.
 *
 * Layering (a file calls only the files below it; tools/check-layering.py
 * checks it in CI):
 *   transfer.c          create/destroy, poll, wait, cancel, stats (the facade)
 *   transfer_submit.c   kvo_transfer_submit's phases (public, called by none)
 *   transfer_worker.c   the worker threads: claim a unit, copy, finish
 *   transfer_queue.c    queues, dependencies, work units, results
 *   layout.c            layout registration, validation, the layout hash
 *   device.c            the device registry, the host device, and what a
 *                       device library may call (kvo__transfer_job_token)
 *   copy_auto.c         the host copy routine chosen by measurement (auto)
 *   copy.c              the host copy routines (memcpy, streaming stores)
 * The CUDA device (cuda/, its own folder and library) calls into device.h's
 * contract only; the core never calls it but through kvo__xfer_device_ops.
 */
#ifndef KVO_TRANSFER_INTERNAL_H
#define KVO_TRANSFER_INTERNAL_H

#include "core/internal.h"
#include "transfer/device.h"

/* One segment, grouped by group (segments of a group keep the order they had
 * in the caller's array). */
typedef struct kvo__xseg {
    uintptr_t base;
    uint64_t num_blocks;
    uint64_t stride;
    uint64_t page;
    uint64_t slot_prefix;  /* sum of pages of the group's earlier segments */
    uint32_t group;
    uint32_t user_index;   /* index in the caller's array (messages) */
} kvo__xseg;

typedef struct kvo__xgroup {
    uint32_t first_seg;    /* into kvo__xlayout.segs */
    uint32_t n_segs;       /* 0: group not in the layout */
    uint64_t num_blocks;   /* engine blocks (same for every segment) */
    uint64_t block_bytes;  /* sum of pages = layers * page_bytes */
    uint64_t blocks_per_chunk;
    uint64_t chunk_bytes;
    uint32_t unit_blocks;  /* blocks per work unit (per segment) */
    uint32_t unit_parts;   /* > 1: pages this large are split into this many
                              units each (unit_blocks is then 1) */
} kvo__xgroup;

/* An immutable, validated layout.  Jobs hold a reference; refs is protected
 * by the engine lock. */
typedef struct kvo__xlayout {
    uint32_t refs;
    size_t n_segs;
    kvo__xseg *segs;
    size_t n_groups;
    kvo__xgroup groups[KVO_MAX_GROUPS];
    uint64_t hash;
} kvo__xlayout;

/* Bytes of one work unit a worker claims at a time (per segment of an op);
 * large enough that claiming costs nothing next to copying, small enough that
 * two or more threads share a job of a few MiB. */
#define KVO__XUNIT_BYTES (UINT64_C(256) << 10)
/* Pages of at least KVO__XSPLIT_BYTES are split into parts of about
 * KVO__XPART_BYTES (multiples of 4096), so that one huge page (a cross-layer
 * segment holds every layer of a block) is still shared by the workers. */
#define KVO__XSPLIT_BYTES (UINT64_C(2) << 20)
#define KVO__XPART_BYTES (UINT64_C(1) << 20)

/* Work units of an op of n blocks of group G, per segment. */
static inline uint64_t kvo__xunits_per_seg(const kvo__xgroup *G, uint64_t n_blocks) {
    return G->unit_parts > 1 ? n_blocks * G->unit_parts : kvo__div_ceil_u64(n_blocks, G->unit_blocks);
}
/* Bytes of one part of a page (the last part may be shorter or empty). */
static inline uint64_t kvo__xpart_bytes(uint64_t page, uint32_t parts) {
    return kvo__align_up_u64(kvo__div_ceil_u64(page, parts), 4096);
}

/* Validate segs against the plan (and the device's reachability check) and
 * build a layout with refs = 1.  Errors as kvo_transfer_set_layout. */
uint64_t kvo__segments_hash(const kvo_plan *plan, const kvo_segment *segs, size_t n);
int kvo__xlayout_build(const kvo_plan *plan, const kvo__xfer_device_ops *dev, void *dev_state,
                       const kvo_segment *segs, size_t n, kvo__xlayout **out);
void kvo__xlayout_free(kvo__xlayout *l);
/* Bit g set when group g's segment list differs between a and b (a may be
 * NULL: every group present in b). */
uint64_t kvo__xlayout_changed(const kvo__xlayout *a, const kvo__xlayout *b);

/* Tests: while paused, workers start no new work unit (jobs stay unstarted,
 * so cancel and layout changes can be tested deterministically). */
void kvo__transfer_pause(kvo_transfer *t, bool paused);
/* Tests: workers may claim `units` more work units, then stop (-1: no
 * limit), so a job can be left started but unfinished. */
void kvo__transfer_allow_units(kvo_transfer *t, int64_t units);
/* Tests: what is left of that allowance (0: all claimed). */
int64_t kvo__transfer_units_allowed(kvo_transfer *t);

/* ------------------------------------------------- engine internals -- */
/* Shared by transfer.c (public API), transfer_queue.c (dependency graph,
 * ready and live lists, results), transfer_worker.c (workers) and
 * transfer_submit.c (submit); transfer.c's essay describes the design. */
#include <pthread.h>

#include "core/hmap.h"

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
    void *dev_token; /* the device's job_submit token, released by kvo__xpost */
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
    size_t alloc_bytes;        /* size of the job's one allocation */
    bool posted;               /* result posted */
    bool unlinked;             /* resources not in the table yet (t->unlinked) */
};

/* An entry of the dependency table (a kvo__hmap entry: key, then used). */
typedef struct kvo__xent {
    uint64_t a, b;             /* kvo__xres's (a, b), or (job id, TAG_JOB) */
    uint32_t used;
    uint32_t n_readers;
    kvo__xjob *writer;         /* TAG_JOB entries: the job */
    kvo__xjob *readers[KVO__XREADERS];
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
    kvo__hmap tab;             /* kvo__xent: resources and job ids */
    kvo__xjob *unlinked;       /* the one live job whose resources are not linked yet, or NULL */
    kvo__xjob *spare;          /* retired jobs' memory kept for reuse (work_next list) */
    uint32_t n_spare;
    kvo_xfer_result *ring;
    size_t ring_head, ring_count;
    kvo_transfer_stats st;
};

/* transfer_queue.c; every function expects t->mu held. */
/* Make room for `extra` more table entries; drops the lock while allocating.
 * 0 or KVO_ENOMEM (no message). */
int kvo__xtab_reserve(kvo_transfer *t, size_t extra);
static inline kvo__xent *kvo__xtab_find(kvo_transfer *t, uint64_t a, uint64_t b) {
    return kvo__hmap_find(&t->tab, a, b);
}
void kvo__xgc_layout_unref(kvo__xgc *gc, kvo__xlayout *l);
/* Free what gc collected (lock not held). */
void kvo__xgc_run(kvo__xgc *gc);
/* Jobs' memory kept for reuse: at most KVO__XSPARE retired jobs, each at most
 * KVO__XSPARE_BYTES (a submit takes the last one, so a steady stream of jobs
 * allocates nothing).  kvo__xspare_take: lock held; the caller owns the
 * result (or NULL).  kvo__xspare_free: at engine teardown. */
#define KVO__XSPARE 4
#define KVO__XSPARE_BYTES (UINT64_C(8) << 20)
kvo__xjob *kvo__xspare_take(kvo_transfer *t);
void kvo__xspare_free(kvo_transfer *t);
void kvo__xready_push(kvo_transfer *t, kvo__xjob *j);
void kvo__xready_remove(kvo_transfer *t, kvo__xjob *j);
/* Table entries a submit of j must reserve: j's resources and id, plus the
 * resources of the unlinked job that linking j links first. */
static inline size_t kvo__xlink_need(const kvo_transfer *t, const kvo__xjob *j) {
    return j->n_res + 1 + (t->unlinked ? t->unlinked->n_res : 0);
}
/* Link j into the graph: it depends on the last writer of what it touches
 * and, for what it writes, on the readers since (kvo__xlink_need entries
 * must have been reserved in the table).  Then it joins the live list.  When
 * no job is live or a zombie, j can have no predecessor and its resources
 * are not inserted at all (j->unlinked): the next job linked while j is
 * still live links them first, so it is ordered after j as if they had been
 * linked at j's submit; one job at a time thus pays no table work. */
void kvo__xlink(kvo_transfer *t, kvo__xjob *j);
/* Post j's result, take it out of the live list and the id map. */
void kvo__xpost(kvo_transfer *t, kvo__xjob *j, int status);
/* Release j's resources and successors and free it (deferred into gc). */
void kvo__xretire(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc);
void kvo__xfail_unstarted(kvo_transfer *t, kvo__xjob *j, int status, kvo__xgc *gc);
void kvo__xfail_matching(kvo_transfer *t, uint64_t mask, int status, kvo__xgc *gc);

/* transfer_worker.c: a worker thread's loop; arg is a kvo__xworker_arg the
 * worker frees. */
typedef struct kvo__xworker_arg {
    kvo_transfer *t;
    uint32_t index;
} kvo__xworker_arg;
void *kvo__xworker(void *arg);

#endif
