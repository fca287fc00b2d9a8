/* The replay engine of `kvoffload replay` (tools/kvoffload/replay*.c): a
 * Mooncake-format trace replayed through the real store, Belady's MIN and the
 * infinite cache on the same trace, and the hit-rate plot.  docs/replay.md. */
#ifndef KVO_REPLAY_H
#define KVO_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvoffload/kvo.h"

/* A trace: per request, its 512-token block ids remapped to dense 0..ndistinct-1. */
typedef struct rp_trace {
    uint32_t *ids;       /* nids block references, request after request */
    size_t *starts;      /* nreq + 1: request r is ids[starts[r] .. starts[r + 1]) */
    size_t nreq, nids, ndistinct, maxlen;
} rp_trace;

/* The result of one replay (blocks = references replayed). */
typedef struct rp_result {
    uint64_t hits, blocks, evictions;
} rp_result;

/* Load a JSON-lines trace ({"hash_ids": [...], ...} per line; blank lines
 * skipped).  Returns 0, or -1 with a message (file, line, what) in err. */
int rp_trace_load(const char *path, rp_trace *t, char *err, size_t errlen);
void rp_trace_free(rp_trace *t);
/* The chunk key the replays give dense block id `id` (group 0 of a one-group
 * plan); bench store times its own calls on the same keys. */
kvo_chunk_key rp_trace_key(uint32_t id);

/* Replay through a kvo_store of cap blocks with policy pol: per request, its
 * prefix hits are its leading READY blocks (lookup), then all its blocks are
 * stored (present ones count as used), in batches of at most cap blocks.
 * With ignore_present, vLLM's manager instead: the prefix hits are touched
 * (its load), and a store leaves present blocks alone
 * (kvo_store_params.ignore_present).  Returns 0 or a KVO_E* code (message in
 * kvo_last_error). */
int rp_replay_store(const rp_trace *t, kvo_policy_kind pol, uint64_t cap, bool ignore_present, rp_result *out);
/* Belady's MIN at cap blocks, same batches (replay_min.c). */
int rp_replay_min(const rp_trace *t, uint64_t cap, rp_result *out);
/* The infinite cache: a block hits when seen before and its prefix hit. */
void rp_replay_infinite(const rp_trace *t, rp_result *out);

/* One curve of the plot. */
typedef struct rp_curve {
    const char *name;
    const double *hit_rate;   /* per capacity */
} rp_curve;
/* Draw hit rate vs capacity as a PNG (replay_plot.c).  Returns 0, or -1 with
 * a message in err (no cairo in this build, cannot write). */
int rp_plot_png(const char *path, const char *title, const char *xlabel, const double *xs, size_t nx,
                const rp_curve *curves, size_t ncurves, char *err, size_t errlen);

#endif
