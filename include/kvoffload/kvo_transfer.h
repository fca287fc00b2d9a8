/*
 * kvoffload transfer layer: batched, asynchronous, byte-exact copies between
 * the engine's KV-cache blocks and chunk slots.
 *
 * Engine layout.  Each group's KV lives in one or more segments (tensors): a
 * base address, num_blocks blocks at block_stride bytes apart, of which the
 * first page_bytes belong to this segment.  The pages of a group's segments
 * add up to the group's bytes per block: sum(page_bytes) = layers *
 * group.page_bytes.  Common layouts:
 *   - per layer, K and V separate ([2, num_blocks, ...]): 2 * layers segments,
 *     V's base = K's base + num_blocks * block_stride;
 *   - per layer, K and V interleaved ([num_blocks, 2, ...]): layers segments;
 *   - one cross-layer tensor: one segment with page = layers * page_bytes;
 *   - several groups packed in one tensor: segments at offsets of one base.
 *
 * Slot format (docs/slot-format.md): segment-major.  For a chunk of B blocks,
 * the slot holds segment 0's pages of blocks 0..B-1 back to back, then segment
 * 1's, ...; segment s starts at B * sum(page_bytes of segments < s).  Every
 * tier stores exactly these bytes.
 *
 * Thread rule: all functions may be called from any thread; completion and
 * copying happen on the engine's worker threads; no lock is held while user
 * code runs (there are no callbacks).
 */
#ifndef KVOFFLOAD_KVO_TRANSFER_H
#define KVOFFLOAD_KVO_TRANSFER_H

#include "kvo_geometry.h"

#ifdef __cplusplus
extern "C" {
#endif

/** One engine tensor holding part of a group's blocks. */
typedef struct kvo_segment {
    uint32_t group;         /* group id in the plan */
    void *base;             /* address of block 0's page */
    uint64_t num_blocks;    /* engine blocks in this segment */
    uint64_t block_stride;  /* bytes from one block's page to the next */
    uint64_t page_bytes;    /* bytes of one block in this segment */
} kvo_segment;

typedef enum kvo_xfer_dir {
    KVO_XFER_STORE = 0,   /* engine blocks -> slot */
    KVO_XFER_LOAD = 1     /* slot -> engine blocks */
} kvo_xfer_dir;

/** One chunk (or part of one) of one group.  Copies blocks
 *  [first_block, first_block + n_blocks) of the chunk (indices within the
 *  chunk, < blocks_per_chunk) between the slot and engine blocks
 *  engine_blocks[0..n_blocks-1].  The slot must hold the group's chunk_bytes. */
typedef struct kvo_xfer_op {
    uint32_t group;
    uint32_t first_block;
    uint32_t n_blocks;
    const uint64_t *engine_blocks;  /* copied at submit */
    void *slot;                     /* host address of the chunk's slot */
    uint64_t slot_bytes;            /* size of the slot buffer, >= chunk_bytes */
} kvo_xfer_op;

typedef struct kvo_transfer_params {
    const kvo_plan *plan;     /* required; must outlive the engine */
    uint32_t threads;         /* worker threads; default 2 */
    uint32_t max_queued_jobs; /* submit returns KVO_EAGAIN beyond; default 4096 */
    int nontemporal;          /* -1 auto (default), 0 never, 1 always */
} kvo_transfer_params;

kvo_transfer_params kvo_transfer_default_params(void);

typedef struct kvo_transfer kvo_transfer;

/** Create a transfer engine on the host device (engine memory is host
 *  memory).  Errors: KVO_EINVAL, KVO_ENOMEM. */
int kvo_transfer_create(const kvo_transfer_params *p, kvo_transfer **out);
/** Cancel queued jobs, wait for running ones, free everything.  Results not
 *  polled are lost. */
void kvo_transfer_destroy(kvo_transfer *t);

/** Register (replace) the engine layout.  Validated against the plan: every
 *  offloaded group needs segments whose pages add up to layers * page_bytes;
 *  stride >= page; no two segments overlap; no address overflow.  Errors:
 *  KVO_ELAYOUT / KVO_EINVAL naming the group and segment.  Jobs queued before a
 *  layout change fail with KVO_ESTATE; running jobs finish on the old layout
 *  first (the call waits for them). */
int kvo_transfer_set_layout(kvo_transfer *t, const kvo_segment *segs, size_t n);

/** Submit one job of n ops in one direction.  Ops are validated now (group
 *  offloaded, block ids < num_blocks, blocks within the chunk, slot large
 *  enough): a bad op fails the submit with KVO_EINVAL and nothing queued.
 *  Ordering: a job never starts before earlier jobs touching the same slot
 *  or engine block have finished (loads never overtake stores).  *job_id
 *  receives a positive id.  Errors: KVO_EINVAL, KVO_EAGAIN (queue full),
 *  KVO_ECLOSED (engine shutting down), KVO_ESTATE (no layout). */
int kvo_transfer_submit(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n, uint64_t *job_id);

typedef struct kvo_xfer_result {
    uint64_t job_id;
    int status;          /* 0 or a KVO_E* code (KVO_ECANCELED when canceled) */
    uint64_t bytes;      /* bytes copied */
    uint64_t duration_ns;/* from start of execution to completion */
} kvo_xfer_result;

/** Move up to cap finished results to out; *n receives the count. */
int kvo_transfer_poll(kvo_transfer *t, kvo_xfer_result *out, size_t cap, size_t *n);
/** An eventfd that is readable while finished results are waiting to be
 *  polled.  Owned by the engine; do not close. */
int kvo_transfer_event_fd(const kvo_transfer *t);
/** Cancel a job still queued: 0 (its result reports KVO_ECANCELED),
 *  KVO_EBUSY (already running or done), KVO_ENOTFOUND. */
int kvo_transfer_cancel(kvo_transfer *t, uint64_t job_id);
/** Wait until the given jobs have finished (their results stay pollable).
 *  timeout_ns < 0: forever.  KVO_ETIMEDOUT. */
int kvo_transfer_wait(kvo_transfer *t, const uint64_t *job_ids, size_t n, int64_t timeout_ns);

/** Segment-major byte offset of (segment index within its group, block within
 *  chunk) in a slot; for tiers and tests.  KVO_EINVAL if out of range. */
int kvo_transfer_slot_offset(const kvo_transfer *t, uint32_t group, uint32_t seg_in_group, uint32_t block,
                             uint64_t *offset);

#ifdef __cplusplus
}
#endif
#endif
