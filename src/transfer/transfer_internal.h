/* Internal structures of the transfer layer. */
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

/* Validate segs against the plan (and the device's reachability check) and
 * build a layout with refs = 1.  Errors as kvo_transfer_set_layout. */
int kvo__xlayout_build(const kvo_plan *plan, const kvo__xfer_device_ops *dev, void *dev_state,
                       const kvo_segment *segs, size_t n, kvo__xlayout **out);
void kvo__xlayout_free(kvo__xlayout *l);
/* Bit g set when group g's segment list differs between a and b (a may be
 * NULL: every group present in b). */
uint64_t kvo__xlayout_changed(const kvo__xlayout *a, const kvo__xlayout *b);

/* Tests: while paused, workers start no new work unit (jobs stay unstarted,
 * so cancel and layout changes can be tested deterministically). */
void kvo__transfer_pause(kvo_transfer *t, bool paused);

#endif
