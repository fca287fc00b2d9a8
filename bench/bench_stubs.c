/* Weak fallbacks for benchmarks not built yet: a real definition in
 * bench/bench_<name>.c replaces one at link time; no edit here is needed. */
#include <stdio.h>

#include "bench.h"
#include "cli.h"

#define KVO__BSTUB(fn, name)                                                             \
    __attribute__((weak)) int fn(int argc, char **argv, const kvo_bench_out *o) {                              \
        (void)argc; (void)argv; (void)o;                                                 \
        fprintf(stderr, "kvoffload bench " name ": not available in this build yet\n");  \
        return KVO_EXIT_FAIL;                                                            \
    }

KVO__BSTUB(kvo_bench_store, "store")
KVO__BSTUB(kvo_bench_transfer, "transfer")
KVO__BSTUB(kvo_bench_file, "file")
KVO__BSTUB(kvo_bench_ttft, "ttft")
