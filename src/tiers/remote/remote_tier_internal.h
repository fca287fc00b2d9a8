/*
 * The remote tier object, shared by remote_tier.c (operations, workers,
 * create/destroy) and remote_completions.c (poll, wait, flush, stats).
 */
#ifndef KVO_TIERS_REMOTE_TIER_INTERNAL_H
#define KVO_TIERS_REMOTE_TIER_INTERNAL_H

#include "core/hmap.h"
#include "core/ring.h"
#include "tiers/remote/remote_internal.h"
#include "tiers/seal.h"

#define NAME_MAX_LEN 160u

typedef struct rop rop;
struct rop {
    rop *next;
    uint32_t kind;             /* KVO_REMOTE_OP_* */
    bool report;
    kvo_chunk_key key;
    uint64_t user_data;
    const kvo_group_plan *g;
    uint64_t t_queued;
    unsigned char *stage;      /* put: payload in staging memory */
    uint64_t sum;              /* put: XXH3-64 of the payload (kvo__file_copy_sum) */
    unsigned char *hdr;        /* put: header buffer (write ops only) */
    bool sealed;               /* put: stage holds the sealed payload (a
                                  worker sealed it in place) */
    unsigned char *dst;        /* get */
    rop *waiters;              /* put: gets/exists/removes of its key queued while it runs (chained by next) */
    bool auth_failed;          /* get: the value failed authentication */
    struct iovec iov[2];
    char name[NAME_MAX_LEN];
    size_t nlen;
    int result;
    uint64_t bytes;
};

typedef struct rworker {
    struct kvo_remote_tier *t;
    pthread_t th;
    rop **ops;                 /* batch_max */
    kvo__rc_cmd *cmds;         /* 2 x batch_max: the batch, then DELs */
    unsigned char *hdrs;       /* batch_max headers of GET replies */
    kvo__rc_ws *ws;            /* the cluster client's workspace */
    kvo__seal_op *so;          /* with a secret: its cipher context */
} rworker;

typedef struct rq {
    rop *head, *tail;
    size_t n;
} rq;

struct kvo_remote_tier {
    kvo_remote_tier_params p;
    const kvo_plan *plan;
    char ns[128];              /* "<prefix>:<fp>[-<lh>]:" */
    size_t ns_len;
    kvo__rc *rc;
    kvo__seal *seal;           /* the fleet secret's keys, or NULL */
    kvo_arena *stage_arena;
    kvo_store *stage_index;
    rop *ops;                  /* max_pending_writes write ops, then reads */
    unsigned char *hdrs;       /* one header per write op */
    rop *free_w, *free_r;
    rq reads, writes;
    kvo__hmap puts;            /* key -> its put op, from queueing to finish (put_ent) */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    rworker *workers;
    uint32_t n_workers;        /* started */
    bool closing;
    bool test_hold_puts;       /* kvo__remote_test_hold_puts (tests only): workers take no puts */
    uint64_t pending_writes, pending_reads;
    kvo__ring cq;              /* kvo_remote_completion, fixed: max_pending_reads
                                  + max_pending_writes; owed = ops that will
                                  report; its eventfd is the tier's */
    kvo_remote_tier_stats st;
};

#endif
