/*
 * Choosing the host copy routine by measuring it.
 *
 * Why measure.  Which of streaming stores and memcpy copies KV pages faster
 * is a property of the CPU and its memory system, not of the instruction set.
 * On the reference machine (an Intel part, reference.md) streaming stores ran
 * 1.5-1.7x faster than glibc's memcpy for 16 KiB..2 MiB pages; on an AMD EPYC
 * machine of the same workplace the reverse held, memcpy 1.4-2.5x faster at
 * every page size from 4 MiB to 128 MiB of pages (glibc uses `rep movsb`
 * there, which the CPU executes without reading the destination first).  A
 * fixed choice was wrong on one of them by a third of the bandwidth, so
 * `nontemporal = -1` (auto) now measures both on the first work of the
 * process and keeps the faster.
 *
 * How.  While a direction (store, load) is undecided, every work unit of a
 * host transfer engine is copied with one of the two candidates (the best
 * streaming kind the CPU has, and memcpy), alternating per unit and per
 * worker, and timed on the wall clock from its first copy to after its fence.
 * Each unit of at least KVO__COPY_AUTO_MIN_BYTES adds its rate to that
 * candidate's sample array (process-wide, KVO__COPY_AUTO_SAMPLES entries,
 * claimed with an atomic counter and counted as filled once written).  When
 * both candidates of a direction have their samples, the first thread to see
 * it compares the medians and publishes the winner with one compare-and-swap;
 * from then on every unit of that direction, in every engine of the process,
 * uses the winner without timing.  The median, not the sum, so that a worker
 * descheduled in the middle of one unit or a page fault on first touch does
 * not decide; the alternation, so that both candidates see the same memory
 * traffic of other tenants.
 *
 * Invariants.  The bytes copied never depend on the choice (every kind copies
 * exactly [dst, dst + n), copy.c); a unit uses one kind from its first copy
 * to its fence; a decided direction never changes again (only
 * kvo__copy_auto_reset, for tests, forgets it).  Cost while measuring: two
 * clock reads per unit (some 50 ns against 50 us for 256 KiB) and half of the
 * first 2 x 16 MiB per direction copied with the slower routine.
 */
#include <stdatomic.h>
#include <time.h>

#include "core/internal.h"
#include "transfer/copy_auto.h"

#define KVO__COPY_AUTO_SAMPLES 64u
#define KVO__COPY_AUTO_MIN_BYTES (UINT64_C(64) << 10)

/* Process-wide state; zero is "undecided, no samples" so that it needs no
 * initialisation.  decided[dir] holds kind + 1 once decided. */
static struct {
    _Atomic int decided[2];
    _Atomic uint32_t next[2][2], filled[2][2];
    _Atomic uint64_t rate[2][2][KVO__COPY_AUTO_SAMPLES]; /* bytes per ms of one unit */
} kvo__ca;

uint64_t kvo__copy_auto_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

kvo__copy_kind kvo__copy_auto_candidate(uint32_t n) {
    return (n & 1u) ? KVO__COPY_MEMCPY : kvo__copy_best();
}

bool kvo__copy_auto_decided(int dir, kvo__copy_kind *kind) {
    if (kvo__copy_best() == KVO__COPY_MEMCPY) { /* nothing to choose from */
        *kind = KVO__COPY_MEMCPY;
        return true;
    }
    int d = atomic_load_explicit(&kvo__ca.decided[dir & 1], memory_order_acquire);
    if (!d) return false;
    *kind = (kvo__copy_kind)(d - 1);
    return true;
}

static uint64_t kvo__ca_median(int dir, int c) {
    uint64_t v[KVO__COPY_AUTO_SAMPLES];
    uint32_t n = KVO__COPY_AUTO_SAMPLES;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t x = atomic_load_explicit(&kvo__ca.rate[dir][c][i], memory_order_relaxed), j = i;
        for (; j > 0 && v[j - 1] > x; j--) v[j] = v[j - 1]; /* insertion sort: 64 entries, once */
        v[j] = x;
    }
    return (v[n / 2 - 1] + v[n / 2]) / 2;
}

void kvo__copy_auto_sample(int dir, kvo__copy_kind kind, uint64_t bytes, uint64_t ns) {
    dir &= 1;
    if (bytes < KVO__COPY_AUTO_MIN_BYTES || atomic_load_explicit(&kvo__ca.decided[dir], memory_order_relaxed))
        return;
    int c = kind == KVO__COPY_MEMCPY;
    uint32_t i = atomic_fetch_add_explicit(&kvo__ca.next[dir][c], 1, memory_order_relaxed);
    if (i >= KVO__COPY_AUTO_SAMPLES) return;
    atomic_store_explicit(&kvo__ca.rate[dir][c][i], bytes * UINT64_C(1000000) / (ns ? ns : 1), memory_order_relaxed);
    atomic_fetch_add_explicit(&kvo__ca.filled[dir][c], 1, memory_order_release);
    if (atomic_load_explicit(&kvo__ca.filled[dir][0], memory_order_acquire) < KVO__COPY_AUTO_SAMPLES ||
        atomic_load_explicit(&kvo__ca.filled[dir][1], memory_order_acquire) < KVO__COPY_AUTO_SAMPLES)
        return;
    uint64_t stream = kvo__ca_median(dir, 0), mem = kvo__ca_median(dir, 1);
    kvo__copy_kind best = kvo__copy_best(), win = mem > stream ? KVO__COPY_MEMCPY : best;
    int expect = 0;
    if (atomic_compare_exchange_strong_explicit(&kvo__ca.decided[dir], &expect, (int)win + 1, memory_order_acq_rel,
                                                memory_order_relaxed))
        kvo__log(KVO_LOG_INFO,
                 "transfer: host %s copies use %s (median %.2f GB/s per work unit against %.2f GB/s for %s, "
                 "measured on this process's first units); nontemporal = 0 or 1 fixes the choice",
                 dir ? "load" : "store", kvo__copy_kind_name(win), (double)(win == best ? stream : mem) / 1e6,
                 (double)(win == best ? mem : stream) / 1e6, kvo__copy_kind_name(win == best ? KVO__COPY_MEMCPY : best));
}

const char *kvo__copy_auto_name(void) {
    kvo__copy_kind s = KVO__COPY_MEMCPY, l = KVO__COPY_MEMCPY;
    bool ds = kvo__copy_auto_decided(0, &s), dl = kvo__copy_auto_decided(1, &l);
    if (!ds || !dl) return "auto (measuring)";
    if (s == l) return kvo__copy_kind_name(s);
    /* the two directions chose differently: static strings for stats */
    if (s == KVO__COPY_MEMCPY) return l == KVO__COPY_AVX2 ? "store memcpy, load avx2-stream" : "store memcpy, load sse2-stream";
    return s == KVO__COPY_AVX2 ? "store avx2-stream, load memcpy" : "store sse2-stream, load memcpy";
}

bool kvo__copy_auto_streams(void) {
    kvo__copy_kind s = KVO__COPY_MEMCPY, l = KVO__COPY_MEMCPY;
    bool ds = kvo__copy_auto_decided(0, &s), dl = kvo__copy_auto_decided(1, &l);
    return !ds || !dl || s != KVO__COPY_MEMCPY || l != KVO__COPY_MEMCPY;
}

void kvo__copy_auto_reset(void) {
    for (int d = 0; d < 2; d++) {
        atomic_store(&kvo__ca.decided[d], 0);
        for (int c = 0; c < 2; c++) {
            atomic_store(&kvo__ca.next[d][c], 0);
            atomic_store(&kvo__ca.filled[d][c], 0);
        }
    }
}
