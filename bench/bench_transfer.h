/* Shared by the transfer benchmarks: bench_transfer.c (host device) and
 * bench_transfer_cuda.c (`--device cuda`). */
#ifndef KVO_BENCH_TRANSFER_H
#define KVO_BENCH_TRANSFER_H

#include "bench.h"
#include "kvoffload/kvo.h"

/* One group of one layer with page-byte pages in one tensor of total/page
 * blocks, shuffled so that no two pages of a chunk are adjacent; chunks of
 * about 2 MiB in `slots`; ops moves every chunk. */
typedef struct kvo__bsetup {
    kvo_plan *plan;
    kvo_xfer_op *ops;
    uint64_t *ids;
    size_t n_ops;
} kvo__bsetup;

int kvo__bsetup_make(kvo__bsetup *b, uint64_t page, uint64_t total, unsigned char *slots);
void kvo__bsetup_free(kvo__bsetup *b);
/* Best seconds of reps jobs in direction dir; bytes of one job in *bytes. */
int kvo__bjob_time(kvo_transfer *t, kvo__bsetup *b, kvo_xfer_dir dir, int reps, double *best, uint64_t *bytes);

/* `kvoffload bench transfer --device cuda ...` (argv as given to
 * kvo_bench_transfer). */
int kvo_bench_transfer_cuda(int argc, char **argv, const kvo_bench_out *o);

#endif
