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

#endif
