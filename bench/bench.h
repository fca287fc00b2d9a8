/*
 * Benchmarks, run as `kvoffload bench <name> [--json]`.  Each figure is one
 * line: a JSON object {"name","value","unit"[,"limit","limit_name","ratio"]}
 * with --json, a readable line otherwise.  A ratio always compares against a
 * limit measured in the same run on the same machine.
 */
#ifndef KVO_BENCH_H
#define KVO_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kvoffload/kvo_geometry.h"

typedef struct kvo_bench_out {
    bool json;
    bool quiet;        /* --quiet: no progress lines on stderr */
    const char *name;  /* the benchmark's name, for its progress lines */
    double t0;         /* kvo_bench_now() at its start */
} kvo_bench_out;

/* Print one figure.  limit_name NULL = no limit (ratio omitted).  A value
 * that is NAN has no meaning in this run (e.g. a bandwidth from a negative
 * time difference): printed as n/a (JSON null), never as 0. */
void kvo_bench_report(const kvo_bench_out *o, const char *name, double value, const char *unit,
                      const char *limit_name, double limit);
/* One line of progress on stderr, before a figure (or a group of figures
 * measured together) is measured: "kvoffload bench NAME [12.3 s]: MSG";
 * nothing with --quiet.  Every benchmark calls it, so that none is silent
 * for long. */
void kvo_bench_progress(const kvo_bench_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Library log lines that a benchmark expects (e.g. the file tier's "dropping
 * stores" notes under a deliberate saturation, which the benchmark counts in
 * its figures from the tier's statistics): kvo_bench_log_expect(needle)
 * routes the library's log through kvo_set_log, counting the lines that
 * contain needle instead of printing them (others still go to stderr, as by
 * default); kvo_bench_log_expect(NULL) restores the default and returns the
 * number of lines counted. */
uint64_t kvo_bench_log_expect(const char *needle);
double kvo_bench_now(void); /* seconds, monotonic */
/* The median of v[0..n) (n >= 1; sorts v in place). */
double kvo_bench_median(double *v, size_t n);
/* This thread's CPU seconds: for single-threaded figures on a shared
 * machine, time this thread was descheduled is not counted. */
double kvo_bench_thread_cpu(void);

/* A plan of one full-attention group "kv" (16-token blocks, one layer of
 * page_bytes) with blocks_per_chunk blocks per chunk; NULL on failure (the
 * library's message in kvo_last_error()).  The caller destroys it. */
kvo_plan *kvo_bench_plan_one(const char *name, uint64_t page_bytes, uint32_t blocks_per_chunk);

/* Each benchmark: argv[0] is its name. */
int kvo_bench_store(int argc, char **argv, const kvo_bench_out *o);
int kvo_bench_transfer(int argc, char **argv, const kvo_bench_out *o);
int kvo_bench_file(int argc, char **argv, const kvo_bench_out *o);
int kvo_bench_ttft(int argc, char **argv, const kvo_bench_out *o);
int kvo_bench_remote(int argc, char **argv, const kvo_bench_out *o);
int kvo_bench_cascade(int argc, char **argv, const kvo_bench_out *o);

#endif
