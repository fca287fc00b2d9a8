/*
 * `kvoffload bench transfer [--json] [--total-mib N] [--reps N]`: store and
 * load bandwidth of the transfer engine for pages of 16 KiB to 2 MiB, with 1
 * and 2 worker threads, each against two limits measured in the same run
 * with the same number of threads over the same bytes:
 *   - the same work: a plain gather (store) or scatter (load) of the same
 *     shuffled pages between the same buffers, page by page, threads
 *     claiming 256 KiB units like the engine's workers (kvo__bgather_run),
 *     each page one kvo__copy (the engine's own copy routine: the same
 *     instructions) with streaming stores or plain memcpy (the engine
 *     measures both and keeps the faster, src/transfer/copy_auto.c); each
 *     of the two is timed once per round and the limit is the better of
 *     their two medians (in CPU time too) (before: the better of the two in every
 *     round, a minimum of two samples against the job's one, which put the
 *     limit ~5-10 % above the job on a noisy machine by itself);
 *   - the contiguous copy ceiling (`.vs_contiguous`): one large copy of the
 *     same total bytes with streaming stores (written here, independent of
 *     the library) and one plain memcpy; the better of the two.  A gather
 *     of small pages cannot reach it (each page is a new stream).
 *
 * Setup per page size P: one group of one layer with P-byte pages in one
 * tensor of total/P blocks, block ids shuffled so that no two pages of a
 * chunk are adjacent in the tensor (nothing merges: a true gather/scatter of
 * P-byte pages); chunks of about 2 MiB (blocks_per_chunk = 2 MiB / P) in one
 * slot arena; one job moves every chunk.  Buffers are allocated once and
 * pre-faulted before timing.  For each page size the limits and the jobs
 * run interleaved, --reps rounds (31; 11 until issue 26's fifth stop), and each figure is the median round (the
 * machine is shared and memory bandwidth is disturbed at random by other
 * work: a median moves little, and the limits and jobs of the same rounds
 * are disturbed alike; the limit is printed with each ratio).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_transfer.h"
#include "cli.h"
#include "kvoffload/kvo.h"
#include "transfer/copy.h" /* the engine's copy: the same-work limit uses it */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVO__BX86 1
#else
#define KVO__BX86 0
#endif

/* ---------------------------------------------------------- ceilings -- */

#if KVO__BX86
/* The best streaming copy known here: 16 KiB at a time as four interleaved
 * 4 KiB streams (like glibc's large-copy path), then 128-byte steps. */
__attribute__((target("avx2"))) static void kvo__b_stream_avx2(unsigned char *d, const unsigned char *s, size_t n) {
    size_t i = 0;
    for (; i + 16384 <= n; i += 16384)
        for (size_t o = 0; o < 4096; o += 64)
            for (size_t p = 0; p < 4; p++) {
                const unsigned char *ss = s + i + p * 4096 + o;
                unsigned char *dd = d + i + p * 4096 + o;
                _mm_prefetch((const char *)ss + 256, _MM_HINT_T0);
                __m256i a = _mm256_loadu_si256((const __m256i *)ss);
                __m256i b = _mm256_loadu_si256((const __m256i *)(ss + 32));
                _mm256_stream_si256((__m256i *)dd, a);
                _mm256_stream_si256((__m256i *)(dd + 32), b);
            }
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    _mm_sfence();
}

__attribute__((target("sse2"))) static void kvo__b_stream_sse2(unsigned char *d, const unsigned char *s, size_t n) {
    for (size_t i = 0; i + 64 <= n; i += 64) {
        _mm_stream_si128((__m128i *)(d + i), _mm_loadu_si128((const __m128i *)(s + i)));
        _mm_stream_si128((__m128i *)(d + i + 16), _mm_loadu_si128((const __m128i *)(s + i + 16)));
        _mm_stream_si128((__m128i *)(d + i + 32), _mm_loadu_si128((const __m128i *)(s + i + 32)));
        _mm_stream_si128((__m128i *)(d + i + 48), _mm_loadu_si128((const __m128i *)(s + i + 48)));
    }
    _mm_sfence();
}
#endif

/* A ceiling copy shared by `threads` threads that claim 1 MiB pieces from a
 * shared counter, the way the engine's workers claim units: on a shared
 * machine a static split would wait for its slowest (descheduled) thread
 * and understate the ceiling. */
#define KVO__BPIECE ((size_t)1 << 20)
typedef struct kvo__bcopy {
    unsigned char *d;
    const unsigned char *s;
    size_t n;
    int stream; /* 0 memcpy, 1 sse2, 2 avx2 */
    size_t next; /* next piece (atomic) */
} kvo__bcopy;

static void *kvo__bcopy_run(void *arg) {
    kvo__bcopy *c = arg;
    for (;;) {
        size_t off = __atomic_fetch_add(&c->next, KVO__BPIECE, __ATOMIC_RELAXED);
        if (off >= c->n) break;
        size_t len = c->n - off < KVO__BPIECE ? c->n - off : KVO__BPIECE;
#if KVO__BX86
        if (c->stream == 2) kvo__b_stream_avx2(c->d + off, c->s + off, len);
        else if (c->stream == 1) kvo__b_stream_sse2(c->d + off, c->s + off, len);
        else
#endif
            memcpy(c->d + off, c->s + off, len);
    }
    return NULL;
}

/* Seconds for one copy of n bytes (a multiple of 128; buffers 64-byte
 * aligned) by `threads` threads. */
static double kvo__bcopy_time(unsigned char *d, const unsigned char *s, size_t n, int stream, uint32_t threads) {
    pthread_t th[2];
    kvo__bcopy c = {d, s, n, stream, 0};
    double t0 = kvo_bench_now();
    for (uint32_t i = 0; i + 1 < threads; i++) pthread_create(&th[i], NULL, kvo__bcopy_run, &c);
    kvo__bcopy_run(&c);
    for (uint32_t i = 0; i + 1 < threads; i++) pthread_join(th[i], NULL);
    return kvo_bench_now() - t0;
}

/* The same-work limit: the job's own gather (store) or scatter (load) of
 * the same pages between the same buffers, by the same number of threads
 * claiming units of the engine's size (256 KiB of pages, at least one page)
 * from a shared counter, each page one kvo__copy of the given kind (the
 * engine's kind, or memcpy; the caller takes the better median): the engine
 * minus its job queue, dependency tracking, unit bookkeeping and run merging
 * (there is nothing to merge: the pages are shuffled). */
typedef struct kvo__bgather {
    unsigned char *eng, *slots;
    const uint64_t *ids;
    uint64_t page, nblk, unit;
    kvo__copy_kind kind;
    int store;
    uint64_t next; /* next unit (atomic) */
} kvo__bgather;

static void *kvo__bgather_run(void *arg) {
    kvo__bgather *g = arg;
    for (;;) {
        uint64_t b0 = __atomic_fetch_add(&g->next, g->unit, __ATOMIC_RELAXED);
        if (b0 >= g->nblk) break;
        uint64_t b1 = b0 + g->unit < g->nblk ? b0 + g->unit : g->nblk;
        for (uint64_t b = b0; b < b1; b++) {
            unsigned char *e = g->eng + g->ids[b] * g->page, *sl = g->slots + b * g->page;
            kvo__copy(g->kind, g->store ? sl : e, g->store ? e : sl, g->page);
        }
        kvo__copy_fence(); /* once per unit, as the engine's workers */
    }
    return NULL;
}

/* Seconds for one gather (store) or scatter (load) of nblk pages. */
static double kvo__bgather_time(unsigned char *eng, unsigned char *slots, const uint64_t *ids, uint64_t page,
                                uint64_t nblk, int store, kvo__copy_kind kind, uint32_t threads) {
    pthread_t th[2];
    uint64_t unit = (UINT64_C(256) << 10) / page ? (UINT64_C(256) << 10) / page : 1;
    kvo__bgather g = {eng, slots, ids, page, nblk, unit, kind, store, 0};
    double t0 = kvo_bench_now();
    for (uint32_t i = 0; i + 1 < threads; i++) pthread_create(&th[i], NULL, kvo__bgather_run, &g);
    kvo__bgather_run(&g);
    for (uint32_t i = 0; i + 1 < threads; i++) pthread_join(th[i], NULL);
    return kvo_bench_now() - t0;
}

/* ------------------------------------------------------------ engine -- */

int kvo__bsetup_make(kvo__bsetup *b, uint64_t page, uint64_t total, unsigned char *slots) {
    memset(b, 0, sizeof *b);
    uint64_t per = (UINT64_C(2) << 20) / page; /* 2 MiB chunks */
    b->plan = kvo_bench_plan_one("bench-transfer", page, per ? (uint32_t)per : 1);
    if (!b->plan) return KVO_EINVAL;
    const kvo_group_plan *gp = kvo_plan_group(b->plan, 0);
    uint64_t nblk = total / page, bpc = gp->blocks_per_chunk;
    b->n_ops = (size_t)(nblk / bpc);
    b->ops = calloc(b->n_ops, sizeof *b->ops);
    b->ids = malloc(sizeof *b->ids * nblk);
    if (!b->ops || !b->ids) return KVO_ENOMEM;
    for (uint64_t i = 0; i < nblk; i++) b->ids[i] = i;
    /* Shuffle (deterministic), then make sure no two consecutive ids follow
     * each other (that would merge into one larger copy). */
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (uint64_t i = nblk - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t k = x % (i + 1), t = b->ids[i];
        b->ids[i] = b->ids[k];
        b->ids[k] = t;
    }
    for (uint64_t i = 1; i < nblk; i++)
        if (b->ids[i] == b->ids[i - 1] + 1 && i + 1 < nblk) {
            uint64_t t = b->ids[i];
            b->ids[i] = b->ids[i + 1];
            b->ids[i + 1] = t;
        }
    for (size_t c = 0; c < b->n_ops; c++)
        b->ops[c] = (kvo_xfer_op){0, 0, (uint32_t)bpc, b->ids + c * bpc, slots + c * gp->slot_bytes, gp->slot_bytes};
    return 0;
}

void kvo__bsetup_free(kvo__bsetup *b) {
    free(b->ops);
    free(b->ids);
    kvo_plan_destroy(b->plan);
}

int kvo__bjob_time(kvo_transfer *t, kvo__bsetup *b, kvo_xfer_dir dir, int reps, double *best, uint64_t *bytes) {
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t id;
        double t0 = kvo_bench_now();
        int rc = kvo_transfer_submit(t, dir, b->ops, b->n_ops, &id);
        if (!rc) rc = kvo_transfer_wait(t, &id, 1, -1);
        double dt = kvo_bench_now() - t0;
        if (rc) return rc;
        kvo_xfer_result res;
        size_t n;
        kvo_transfer_poll(t, &res, 1, &n);
        if (n != 1 || res.status) return n == 1 ? res.status : KVO_ESTATE;
        *bytes = res.bytes;
        if (dt < *best) *best = dt;
    }
    return 0;
}

/* One page size: `reps` rounds, each running every limit and both jobs back
 * to back, in an order that alternates between rounds (so that each ratio
 * compares runs made under the same conditions on this shared machine, and
 * neither side always runs first); med[] gets each one's median seconds over
 * the rounds (a disturbed round moves a median little, and the limits and
 * jobs are disturbed alike), bytes[] the jobs' bytes.  Every figure is one
 * sample per round: med[] = stream copy, memcpy, store job, load job, gather
 * and scatter with the engine's copy kind, gather and scatter with memcpy. */
enum { KVO__BMED = 8 };

/* CPU seconds of the whole process (every thread: the engine's workers, the
 * limit's helper thread; a thread that waits uses none). */
static double kvo__bproc_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


/* med[] as above in wall seconds; cpu[] the same figures in process CPU
 * seconds (what the work cost, whatever the other tenants of the machine
 * did to the wall clock; memory bandwidth they take still shows). */
static int kvo__bmeasure(kvo_transfer *t, kvo__bsetup *b, unsigned char *eng, unsigned char *slots, uint64_t total,
                         uint64_t page, int stream, uint32_t threads, uint64_t reps, double med[KVO__BMED],
                         double cpu[KVO__BMED], uint64_t bytes[2]) {
    double *tm = malloc(sizeof *tm * 2 * KVO__BMED * reps);
    if (!tm) return KVO_ENOMEM;
    double *tc = tm + KVO__BMED * reps;
    kvo__copy_kind kind = kvo__copy_best();
    int rc = 0;
    for (uint64_t r = 0; r < reps && !rc; r++) {
        double *x = tm + r, *c = tc + r, c0;
        for (int half = 0; half < 2 && !rc; half++) {
            if ((half == 0) == (r % 2 == 0)) { /* the limits */
                for (int dir = 0; dir < 2; dir++)
                    for (int k = 0; k < 2; k++) {
                        c0 = kvo__bproc_cpu();
                        x[(4 + 2 * k + dir) * reps] = kvo__bgather_time(eng, slots, b->ids, page, total / page,
                                                                        dir == 0, k ? KVO__COPY_MEMCPY : kind, threads);
                        c[(4 + 2 * k + dir) * reps] = kvo__bproc_cpu() - c0;
                    }
                x[0] = kvo__bcopy_time(r % 2 ? eng : slots, r % 2 ? slots : eng, total, stream, threads);
                x[reps] = kvo__bcopy_time(r % 2 ? eng : slots, r % 2 ? slots : eng, total, 0, threads);
                c[0] = c[reps] = 0;
            } else { /* the jobs */
                for (int dir = 0; dir < 2 && !rc; dir++) {
                    c0 = kvo__bproc_cpu();
                    rc = kvo__bjob_time(t, b, (kvo_xfer_dir)dir, 1, &x[(2 + dir) * reps], &bytes[dir]);
                    c[(2 + dir) * reps] = kvo__bproc_cpu() - c0;
                }
            }
        }
    }
    for (int k = 0; k < KVO__BMED && !rc; k++) {
        med[k] = kvo_bench_median(tm + (size_t)k * reps, reps);
        cpu[k] = kvo_bench_median(tc + (size_t)k * reps, reps);
    }
    free(tm);
    return rc;
}

int kvo_bench_transfer(int argc, char **argv, const kvo_bench_out *o) {
    /* 31 rounds: with 11, the 16 KiB medians of runs a minute apart spread
     * 0.83-1.16 of the limit on a quiet 2-core VM (issue 26's fifth stop),
     * with 31 0.93-1.07 */
    uint64_t total_mib = 128, reps = 31;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvoffload bench transfer [--json] [--total-mib N (128)] [--reps N (31)] [--device host|cuda]\n"
                   "Store and load bandwidth for pages of 16 KiB..2 MiB with 1 and 2 threads, as ratios\n"
                   "of the copy ceiling (streaming-store copy or memcpy of the same bytes) measured now.\n"
                   "--device cuda: engine shapes (--layout LxP[,...], default 64x32KiB,160x8KiB,61x18KiB,1x2MiB)\n"
                   "against one contiguous copy and vLLM's batched copy of the same bytes (docs/gpu.md).\n");
            return KVO_EXIT_OK;
        } else if (!strcmp(argv[i], "--total-mib") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--total-mib", argv[++i], 4, 1 << 16, &total_mib)) return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (kvo_cli_parse_u64("--reps", argv[++i], 1, 1000, &reps)) return KVO_EXIT_USAGE;
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            if (!strcmp(argv[i + 1], "cuda")) return kvo_bench_transfer_cuda(argc, argv, o); /* bench_transfer_cuda.c */
            if (strcmp(argv[++i], "host")) {
                fprintf(stderr, "kvoffload bench transfer: unknown --device '%s' (host, cuda)\n", argv[i]);
                return KVO_EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "kvoffload bench transfer: unknown argument '%s' (see --help)\n", argv[i]);
            return KVO_EXIT_USAGE;
        }
    }
    uint64_t total = total_mib << 20;
    /* Engine tensor and slot arena, 2 MiB aligned, pre-faulted. */
    unsigned char *eng = NULL, *slots = NULL;
    if (posix_memalign((void **)&eng, 2 << 20, total) || posix_memalign((void **)&slots, 2 << 20, total)) {
        fprintf(stderr, "kvoffload bench transfer: cannot allocate 2 x %llu MiB\n", (unsigned long long)total_mib);
        free(eng);
        return KVO_EXIT_FAIL;
    }
    for (uint64_t i = 0; i < total; i += 8) {
        uint64_t v = i * 0x9E3779B97F4A7C15u;
        memcpy(eng + i, &v, 8);
    }
    memset(slots, 0, total);

    int stream = 0;
#if KVO__BX86
    __builtin_cpu_init();
    stream = __builtin_cpu_supports("avx2") ? 2 : 1;
#endif
    static const uint64_t pages[] = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20};
    int ret = KVO_EXIT_OK;
    char name[128], lim[64];
    for (uint32_t threads = 1; threads <= 2 && ret == KVO_EXIT_OK; threads++) {
        double s_all = 0, m_all = 0; /* the best pages' ceilings */
        for (size_t pi = 0; pi < sizeof pages / sizeof pages[0] && ret == KVO_EXIT_OK; pi++) {
            kvo__bsetup b;
            kvo_bench_progress(o, "%llu KiB pages, %u thread%s", (unsigned long long)(pages[pi] >> 10), threads, threads > 1 ? "s" : "");
            int rc = kvo__bsetup_make(&b, pages[pi], total, slots);
            kvo_transfer *t = NULL;
            if (!rc) {
                kvo_transfer_params tp = kvo_transfer_default_params();
                tp.plan = b.plan;
                tp.threads = threads;
                rc = kvo_transfer_create(&tp, &t);
            }
            kvo_segment seg = {0, eng, total / pages[pi], pages[pi], pages[pi]};
            if (!rc) rc = kvo_transfer_set_layout(t, &seg, 1);
            double med[KVO__BMED], cpu[KVO__BMED]; /* seconds, see kvo__bmeasure */
            uint64_t bytes[2] = {0, 0};
            if (!rc) rc = kvo__bmeasure(t, &b, eng, slots, total, pages[pi], stream, threads, reps, med, cpu, bytes);
            if (!rc) {
                double s_gbs = (double)total / med[0] / 1e9, m_gbs = (double)total / med[1] / 1e9;
                double ceiling = s_gbs > m_gbs ? s_gbs : m_gbs;
                if (s_gbs > s_all) s_all = s_gbs;
                if (m_gbs > m_all) m_all = m_gbs;
                snprintf(lim, sizeof lim, "copy_ceiling_threads_%u", threads);
                for (int dir = 0; dir < 2; dir++) {
                    char glim[64];
                    snprintf(glim, sizeof glim, "same_work_%s_threads_%u", dir ? "scatter" : "gather", threads);
                    snprintf(name, sizeof name, "transfer.%s.page_%lluKiB.threads_%u", dir ? "load" : "store",
                             (unsigned long long)(pages[pi] >> 10), threads);
                    double gbs = (double)bytes[dir] / med[2 + dir] / 1e9;
                    double lim_s = med[4 + dir] < med[6 + dir] ? med[4 + dir] : med[6 + dir];
                    kvo_bench_report(o, name, gbs, "GB/s", glim, (double)total / lim_s / 1e9);
                    /* the same in CPU time: GB moved per CPU second, against
                     * the same-work copy, the cheaper of its two kinds */
                    snprintf(name, sizeof name, "transfer.%s.page_%lluKiB.threads_%u.per_cpu_s",
                             dir ? "load" : "store", (unsigned long long)(pages[pi] >> 10), threads);
                    snprintf(glim, sizeof glim, "same_work_%s_per_cpu_s", dir ? "scatter" : "gather");
                    double lim_c = cpu[4 + dir] < cpu[6 + dir] ? cpu[4 + dir] : cpu[6 + dir];
                    kvo_bench_report(o, name, (double)bytes[dir] / cpu[2 + dir] / 1e9, "GB/cpu-s", glim,
                                     (double)total / lim_c / 1e9);
                    snprintf(name, sizeof name, "transfer.%s.page_%lluKiB.threads_%u.vs_contiguous",
                             dir ? "load" : "store", (unsigned long long)(pages[pi] >> 10), threads);
                    kvo_bench_report(o, name, gbs, "GB/s", lim, ceiling);
                    /* which copy the same work favours here: memcpy's rate as
                     * a share of the streaming kind's (above 100 %: memcpy is
                     * the faster here, which the engine's measured choice
                     * should have found: transfer.engine_copy_kind) */
                    snprintf(name, sizeof name, "transfer.same_work_%s.page_%lluKiB.threads_%u.memcpy",
                             dir ? "scatter" : "gather", (unsigned long long)(pages[pi] >> 10), threads);
                    snprintf(glim, sizeof glim, "%s", kvo__copy_kind_name(kvo__copy_best()));
                    kvo_bench_report(o, name, (double)total / med[6 + dir] / 1e9, "GB/s", glim,
                                     (double)total / med[4 + dir] / 1e9);
                }
            } else {
                fprintf(stderr, "kvoffload bench transfer: page %llu: %s\n", (unsigned long long)pages[pi],
                        kvo_last_error());
                ret = KVO_EXIT_FAIL;
            }
            if (t && !o->json && pi + 1 == sizeof pages / sizeof pages[0]) {
                /* the copy routine the engine settled on (nontemporal auto) */
                kvo_transfer_stats st = KVO_TRANSFER_STATS_INIT;
                if (!kvo_transfer_get_stats(t, &st)) printf("transfer.engine_copy_kind.threads_%u  %s\n", threads, st.copy_kind);
            }
            kvo_transfer_destroy(t);
            kvo__bsetup_free(&b);
        }
        snprintf(name, sizeof name, "transfer.ceiling.stream_copy.threads_%u", threads);
        kvo_bench_report(o, name, s_all, "GB/s", NULL, 0);
        snprintf(name, sizeof name, "transfer.ceiling.memcpy.threads_%u", threads);
        snprintf(lim, sizeof lim, "stream_copy_threads_%u", threads);
        kvo_bench_report(o, name, m_all, "GB/s", lim, s_all);
    }
    free(eng);
    free(slots);
    return ret;
}
