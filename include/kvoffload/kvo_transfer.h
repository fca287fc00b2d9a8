/*
 * kvoffload transfer layer: batched, asynchronous, byte-exact copies between
 * the engine's KV-cache blocks and chunk slots.
 *
 * Engine layout.  Each group's KV lives in one or more segments (tensors): a
 * base address, num_blocks blocks at block_stride bytes apart, of which the
 * first page_bytes belong to this segment.  The pages of a group's segments
 * add up to the group's bytes per block: sum(page_bytes) = layers *
 * group.page_bytes.  Every segment of a group has the same num_blocks; engine
 * block id b of the group is page b of each of its segments.  Common layouts:
 *   - per layer, K and V separate ([2, num_blocks, ...]): 2 * layers segments,
 *     V's base = K's base + num_blocks * block_stride;
 *   - per layer, K and V interleaved ([num_blocks, 2, ...]): layers segments
 *     with page = K+V bytes, or 2 * layers segments (K at +0, V at +page, both
 *     with stride 2 * page);
 *   - one cross-layer tensor: one segment with page = layers * page_bytes;
 *   - several groups packed in one tensor: segments at offsets of one base;
 *   - state tensors (recurrent groups): one segment per state tensor.
 * Segments of groups that are not offloaded are accepted (and checked for
 * overlap) but never copied.
 *
 * Slot format (docs/slot-format.md): segment-major.  For a chunk of B =
 * blocks_per_chunk blocks, the slot holds the group's first segment's pages of
 * chunk blocks 0..B-1 back to back, then the second segment's, ...; segment s
 * (in the order the segments of the group appear in the layout) starts at
 * B * sum(page_bytes of the group's segments before s).  The chunk occupies
 * exactly chunk_bytes; bytes beyond (up to slot_bytes) are never touched.
 * Every tier stores exactly these bytes.  The byte layout depends on the
 * segment list (order and page sizes) but not on addresses or strides:
 * kvo_transfer_layout_hash() identifies it.
 *
 * Thread rule: all functions may be called from any thread; copying and
 * completion happen on the engine's worker threads; no lock is held while
 * user code runs (there are no callbacks).
 */
#ifndef KVOFFLOAD_KVO_TRANSFER_H
#define KVOFFLOAD_KVO_TRANSFER_H

#include "kvo_geometry.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVO_TRANSFER_MAX_THREADS 64

/** One engine tensor holding part of a group's blocks. */
typedef struct kvo_segment {
    uint32_t group;         /* group id in the plan */
    void *base;             /* address of block 0's page */
    uint64_t num_blocks;    /* engine blocks in this segment (same for all of a group) */
    uint64_t block_stride;  /* bytes from one block's page to the next, >= page_bytes */
    uint64_t page_bytes;    /* bytes of one block in this segment, >= 1 */
} kvo_segment;

typedef enum kvo_xfer_dir {
    KVO_XFER_STORE = 0,   /* engine blocks -> slot */
    KVO_XFER_LOAD = 1     /* slot -> engine blocks */
} kvo_xfer_dir;

/** One chunk (or part of one) of one group.  Copies blocks
 *  [first_block, first_block + n_blocks) of the chunk (indices within the
 *  chunk, first_block + n_blocks <= blocks_per_chunk) between the slot and
 *  engine blocks engine_blocks[0..n_blocks-1] (engine_blocks[i] is chunk block
 *  first_block + i).  A partial chunk (a first chunk starting mid-chunk, a
 *  last one ending mid-chunk, a sliding-window subset) touches only those
 *  blocks' bytes of the slot.  n_blocks = 0 is a no-op.  The slot must hold
 *  the group's chunk_bytes. */
typedef struct kvo_xfer_op {
    uint32_t group;
    uint32_t first_block;
    uint32_t n_blocks;
    const uint64_t *engine_blocks;  /* copied at submit */
    void *slot;                     /* host address of the chunk's slot */
    uint64_t slot_bytes;            /* size of the slot buffer, >= chunk_bytes */
} kvo_xfer_op;

typedef struct kvo_transfer_params {
    size_t struct_size;   /* sizeof(kvo_transfer_params): kvo_transfer_default_params() sets it */
    const kvo_plan *plan;     /* required; must outlive the engine */
    uint32_t threads;         /* worker threads, 1..KVO_TRANSFER_MAX_THREADS; default 2 */
    uint32_t max_queued_jobs; /* unfinished jobs (canceled ones still waiting
                                 for earlier jobs included) plus finished
                                 results not yet polled; submit returns
                                 KVO_EAGAIN beyond (poll to make room);
                                 default 4096 */
    int nontemporal;          /* streaming stores for large pieces: -1 auto (default:
                                 the host device measures streaming stores and
                                 memcpy on the process's first work units, per
                                 direction, and keeps the faster for the
                                 process; logged at KVO_LOG_INFO), 0 never
                                 (memcpy), 1 always (when the CPU has
                                 SSE2/AVX2) */
    const char *device;       /* engine-memory device: NULL or "host" (default);
                                 other devices exist only when built in
                                 (KVO_ENOTSUP otherwise) */
    int device_index;         /* which device of that kind; default 0 */
} kvo_transfer_params;

KVO_API kvo_transfer_params kvo_transfer_default_params(void);

typedef struct kvo_transfer kvo_transfer;

/** Create a transfer engine (host device by default: engine memory is host
 *  memory) and start its worker threads.  *out is owned by the caller
 *  (kvo_transfer_destroy).  Errors: KVO_EINVAL (no plan, threads out of
 *  range), KVO_ENOTSUP (device not built in), KVO_ENOMEM, KVO_EIO (eventfd or
 *  thread creation failed). */
KVO_API int kvo_transfer_create(const kvo_transfer_params *p, kvo_transfer **out);

/** Shut down: later submits fail with KVO_ECLOSED; queued jobs finish with
 *  KVO_ECANCELED; waits for running jobs.  Results stay pollable; poll, wait,
 *  cancel and the event fd keep working.  Idempotent.  Must not race with
 *  kvo_transfer_destroy. */
KVO_API void kvo_transfer_close(kvo_transfer *t);

/** Close, join the workers, free everything (results not polled are lost,
 *  the event fd is closed).  The caller guarantees no other call on t is in
 *  progress or follows.  NULL is a no-op. */
KVO_API void kvo_transfer_destroy(kvo_transfer *t);

/** Register (replace) the engine layout; the segments are copied.  Validated
 *  against the plan: every offloaded group needs segments whose pages add up
 *  to layers * page_bytes, all with the same num_blocks; page >= 1; stride >=
 *  page; no two segments share a byte (strided footprints that interleave
 *  without sharing bytes are fine); no address overflow.  Errors: KVO_ELAYOUT
 *  (geometry, stride, overlap), KVO_EINVAL (NULL, unknown group id),
 *  KVO_ERANGE (address overflow), KVO_ECLOSED, KVO_ENOMEM, each naming the
 *  group and segment index; on error the old layout stays.  A group is
 *  "changed" when its segment list differs from the old one in any field.
 *  Unfinished jobs touching a changed group fail with KVO_ESTATE: queued
 *  ones at once, running ones after the pieces already in flight (copied on
 *  the old layout; the call waits for them, so the caller may free old
 *  tensors when it returns).  Jobs of unchanged groups are unaffected. */
KVO_API int kvo_transfer_set_layout(kvo_transfer *t, const kvo_segment *segs, size_t n);

/** Submit one job of n ops in one direction.  Ops are validated now (group
 *  offloaded and in the layout, block ids < num_blocks, blocks within the
 *  chunk, slot non-NULL and large enough, a load not writing one engine block
 *  twice, ops sharing a slot all of one group and, in a store, covering
 *  disjoint blocks): a bad op fails the submit with KVO_EINVAL naming the op
 *  and nothing is queued.  Slots of different chunks must not overlap (not
 *  checked: the caller's store hands them out).  The engine blocks and slots
 *  must stay valid until the job's result is posted.
 *  Ordering: a job never starts before earlier unfinished jobs it conflicts
 *  with have finished.  Two jobs conflict when one writes what the other reads
 *  or writes: a store reads engine blocks and writes its slots, a load reads
 *  its slots and writes engine blocks (so a load never overtakes an earlier
 *  store to its slot, and a store never overtakes an earlier load into its
 *  engine blocks).  Slots are identified by their address, engine blocks by
 *  (group, block id).  If a job that wrote something a later job reads fails
 *  or is canceled, the later job fails with KVO_ECANCELED.  Among jobs free
 *  to run, loads go first (a request waits for them), then stores, each in
 *  submission order.
 *  *job_id receives a positive id (increasing).  Errors: KVO_EINVAL,
 *  KVO_EAGAIN (max_queued_jobs unfinished or unpolled), KVO_ECLOSED
 *  (closed), KVO_ESTATE (no layout), KVO_ENOMEM. */
KVO_API int kvo_transfer_submit(kvo_transfer *t, kvo_xfer_dir dir, const kvo_xfer_op *ops, size_t n, uint64_t *job_id);

typedef struct kvo_xfer_result {
    uint64_t job_id;
    int status;          /* 0 or a KVO_E* code (KVO_ECANCELED when canceled) */
    uint32_t dir;        /* kvo_xfer_dir of the job */
    uint64_t bytes;      /* bytes copied (0 unless status is 0) */
    uint64_t duration_ns;/* from start of execution to completion (0 if never started) */
} kvo_xfer_result;

/** Move up to cap finished results to out, oldest first; *n receives the
 *  count (0 when none).  Errors: KVO_EINVAL (NULL). */
KVO_API int kvo_transfer_poll(kvo_transfer *t, kvo_xfer_result *out, size_t cap, size_t *n);
/** An eventfd (non-blocking) that is readable while finished results are
 *  waiting to be polled; polling them all makes it unreadable again.  Owned by
 *  the engine; do not close or read it. */
KVO_API int kvo_transfer_event_fd(const kvo_transfer *t);
/** Cancel a job that has not started (queued or waiting for earlier jobs):
 *  0 (its result reports KVO_ECANCELED), KVO_EBUSY (running or finished),
 *  KVO_ENOTFOUND (no such id). */
KVO_API int kvo_transfer_cancel(kvo_transfer *t, uint64_t job_id);
/** Wait until the given jobs have finished (their results stay pollable;
 *  jobs whose results were already polled count as finished).
 *  timeout_ns < 0: forever.  Errors: KVO_ETIMEDOUT, KVO_ENOTFOUND (an id never
 *  returned by submit). */
KVO_API int kvo_transfer_wait(kvo_transfer *t, const uint64_t *job_ids, size_t n, int64_t timeout_ns);

/** Segment-major byte offset of (segment index within its group, block within
 *  chunk) in a slot; for tiers and tests.  KVO_EINVAL if out of range,
 *  KVO_ESTATE without a layout. */
KVO_API int kvo_transfer_slot_offset(const kvo_transfer *t, uint32_t group, uint32_t seg_in_group, uint32_t block,
                             uint64_t *offset);

/** A 64-bit hash of what decides slot bytes in the current layout: per
 *  offloaded group, its segments' page_bytes in order (not addresses, strides
 *  or block counts).  Tiers shared by engines with different layouts should
 *  namespace by it next to the plan fingerprint.  KVO_ESTATE without a
 *  layout. */
KVO_API int kvo_transfer_layout_hash(const kvo_transfer *t, uint64_t *out);

/** The same hash computed from a segment list without a transfer engine (no
 *  validation beyond group ids), e.g. to namespace a file tier created before
 *  the layout is registered.  Pure; any thread.  Errors: KVO_EINVAL. */
KVO_API int kvo_layout_hash(const kvo_plan *plan, const kvo_segment *segs, size_t n, uint64_t *out);

typedef struct kvo_transfer_stats {
    size_t struct_size;   /* sizeof(kvo_transfer_stats): KVO_TRANSFER_STATS_INIT sets it */
    uint64_t jobs_submitted, jobs_ok, jobs_failed, jobs_canceled;
    uint64_t jobs_queued;       /* unfinished now (waiting, ready or running) */
    uint64_t results_pending;   /* finished, not yet polled */
    uint64_t bytes_stored, bytes_loaded;
    uint64_t copies;            /* copy calls after merging adjacent pieces */
    uint64_t dep_waits;         /* jobs that had to wait for an earlier one */
    bool nontemporal;           /* streaming stores in use (or being measured) */
    const char *copy_kind;      /* "avx2-stream", "sse2-stream", "memcpy", "auto
                                   (measuring)", or per direction ("store memcpy,
                                   load avx2-stream"); static */
    const char *device;         /* "host", ... (static) */
} kvo_transfer_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT; */
#define KVO_TRANSFER_STATS_INIT {sizeof(kvo_transfer_stats)}

KVO_API int kvo_transfer_get_stats(kvo_transfer *t, kvo_transfer_stats *out);

#ifdef __cplusplus
}
#endif
#endif
