/* Helpers of the cascade tests (test_cascade*.c): a cascade over the
 * file-tier fixture's plan and tiers, waiting for completions, promoting a
 * batch.  Everything is static inline. */
#ifndef KVO_CASCADE_FIXTURE_H
#define KVO_CASCADE_FIXTURE_H

#include "file_tier_fixture.h"
#include "kvoffload/kvo_remote_tier.h"

typedef struct cfx {
    kvo_plan *plan;
    kvo_file_tier *file;
    kvo_remote_tier *remote;
    kvo_cascade *c;
    uint64_t chunk, slot;
} cfx;

/* The plan `name` (one group, 16 KiB pages) and its sizes; no tier yet. */
static inline cfx cfx_plan(const char *name) {
    cfx f;
    memset(&f, 0, sizeof f);
    f.plan = ftf_plan(name, 16384, false);
    f.chunk = kvo_plan_group(f.plan, 0)->chunk_bytes;
    f.slot = kvo_plan_group(f.plan, 0)->slot_bytes;
    return f;
}

/* Create the cascade from *p (plan set here), over a file tier made from
 * *fp when fp is not NULL (skips the test where the tier cannot be made). */
static inline void cfx_create(cfx *f, kvo_cascade_params *p, const kvo_file_tier_params *fp) {
    p->plan = f->plan;
    if (fp) {
        f->file = ftf_create_or_skip(fp, f->plan);
        p->file_tier = f->file;
    }
    ASSERT_OK(kvo_cascade_create(p, &f->c));
}

/* Destroy the cascade, then flush and destroy its tiers, then the plan. */
static inline void cfx_close(cfx *f) {
    kvo_cascade_destroy(f->c);
    if (f->file) {
        ASSERT_OK(kvo_file_tier_flush(f->file, KVO_MS(20000)));
        kvo_file_tier_destroy(f->file);
    }
    kvo_remote_tier_destroy(f->remote);
    kvo_plan_destroy(f->plan);
}

/* Poll until `want` completions came (bounded); returns them in out. */
static inline size_t cfx_poll_n(kvo_cascade *c, kvo_cascade_completion *out, size_t want) {
    size_t got = 0;
    for (int spin = 0; spin < 4000 && got < want; spin++) {
        size_t n = 0;
        ASSERT_OK(kvo_cascade_poll(c, out + got, want - got, &n));
        got += n;
        if (got < want) (void)kvo_cascade_wait_events(c, KVO_MS(5));
    }
    return got;
}

/* Look the n keys (n <= 64) up with KVO_CASCADE_PROMOTE; every one must be
 * promoted from a lower tier and land. */
static inline void cfx_promote_all(kvo_cascade *c, const kvo_chunk_key *keys, size_t n) {
    uint8_t st[64], tiers[64];
    kvo_cascade_completion cp[64];
    kvo_cascade_lookup_result r;
    ASSERT_TRUE(n <= 64);
    ASSERT_OK(kvo_cascade_lookup(c, keys, n, KVO_CASCADE_PROMOTE, NULL, 0, st, tiers, &r));
    ASSERT_EQ_U64(r.promoting, n);
    ASSERT_EQ_U64(cfx_poll_n(c, cp, n), n);
    for (size_t i = 0; i < n; i++) ASSERT_EQ_INT(cp[i].result, 0);
}

#endif
