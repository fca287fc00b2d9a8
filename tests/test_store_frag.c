/* Space efficiency: with the deepseek-v4-flash-like and glm-5.3-flash-like
 * plans (automatic and --block-size variants), a full store holds chunk data
 * in at least 95 % of its bytes under a realistic mixed workload: requests of
 * random length store every offloaded group's complete chunks (so all groups
 * store in proportion), some requests extend an earlier prefix (present
 * chunks are skipped and touched), loads pin and unpin, and eviction churns
 * through the store many times over.  Utilisation is sampled after every
 * request once the store is full; the minimum must be >= 95 %. */
#include "store_test_util.h"

typedef struct frag_result {
    double min_util, mean_util;
    uint64_t requests, evictions, reclaims;
} frag_result;

static uint64_t rnd(uint64_t n) { return kvo_test_rand() % n; }

/* skip_mask: groups (bit i) that do not store in this phase */
static void run_requests(kvo_store *s, const kvo_plan *p, int nreq, uint64_t skip_mask, bool measure,
                         frag_result *r) {
    size_t ng = kvo_plan_num_groups(p);
    uint64_t maxtpc = 0;
    for (size_t g = 0; g < ng; g++) {
        const kvo_group_plan *gp = kvo_plan_group(p, g);
        if (gp->offloaded && gp->tokens_per_chunk > maxtpc) maxtpc = gp->tokens_per_chunk;
    }
    uint32_t tph = kvo_plan_tokens_per_hash(p);
    static kvo_chunk_key keys[4096];
    static uint8_t need[4096];
    static kvo_slot slots[4096];
    static kvo_chunk_key todo[4096];
    static uint64_t recent[64];
    static int nrecent = 0;
    for (int q = 0; q < nreq; q++) {
        /* a request: 1..6 x the largest chunk span, plus a partial tail */
        uint64_t tokens = maxtpc * (1 + rnd(6)) + rnd(maxtpc);
        uint64_t units = tokens / tph;
        /* prefix identity: a fresh prefix, or one seen recently (shared) */
        uint64_t pid = (nrecent && rnd(4) == 0) ? recent[rnd((uint64_t)nrecent)] : kvo_test_rand();
        recent[nrecent < 64 ? nrecent++ : (int)rnd(64)] = pid;
        size_t n = 0;
        for (size_t g = 0; g < ng; g++) {
            const kvo_group_plan *gp = kvo_plan_group(p, g);
            if (!gp->offloaded || (skip_mask >> g & 1)) continue;
            uint64_t nc = units / gp->hashes_per_chunk;
            for (uint64_t c = 0; c < nc && n < 4096; c++) {
                kvo_chunk_key k;
                memset(&k, 0, sizeof k);
                /* unit hash at the chunk's end: depends on the prefix id and position */
                uint64_t u = (c + 1) * gp->hashes_per_chunk;
                k.hash.lo = (pid ^ (u * UINT64_C(0x9E3779B97F4A7C15))) * UINT64_C(0xBF58476D1CE4E5B9);
                k.hash.hi = pid + u;
                k.group = (uint32_t)g;
                keys[n++] = k;
            }
        }
        if (!n) continue;
        size_t nev = 0;
        int rc = kvo_store_prepare_store(s, keys, n, need, slots, NULL, NULL, 0, &nev);
        if (rc) FAILF("request %d (%zu chunks): %s", q, n, kvo_last_error());
        size_t m = 0;
        for (size_t i = 0; i < n; i++) if (need[i]) todo[m++] = keys[i];
        if (m) ASSERT_OK(kvo_store_complete_store(s, todo, m, true));
        /* a load of the request's first chunks, as a hit would do */
        size_t nl = n < 8 ? n : 8;
        ASSERT_OK(kvo_store_prepare_load(s, keys, nl, slots));
        ASSERT_OK(kvo_store_complete_load(s, keys, nl));
        kvo_store_stats st;
        ASSERT_OK(kvo_store_get_stats(s, &st));
        if (measure && st.evictions > 0) {
            double u = (double)st.bytes_used / (double)st.capacity_bytes;
            if (u < r->min_util) r->min_util = u;
            r->mean_util += u;
            r->requests++;
        }
        r->evictions = st.evictions;
    }
}

static frag_result run_frag(const char *preset, uint64_t block_size, uint64_t capacity, kvo_policy_kind pol,
                            uint64_t first_phase_skip) {
    kvo_plan *p = st_preset_plan(preset, block_size);
    kvo_store *s = st_store(p, capacity, pol);
    frag_result r = {1.0, 0, 0, 0, 0};
    kvo_store_stats st;
    /* phase 1 (optional): only some groups store; phase 2: all of them */
    if (first_phase_skip) run_requests(s, p, 400, first_phase_skip, false, &r);
    /* warm up until the store has turned over about once */
    ASSERT_OK(kvo_store_get_stats(s, &st));
    uint64_t ev0 = st.evictions;
    for (int i = 0; i < 100 && !getenv("KVO_FRAG_NOWARM"); i++) {
        run_requests(s, p, 20, 0, false, &r);
        ASSERT_OK(kvo_store_get_stats(s, &st));
        if ((st.evictions - ev0) * 2 > st.entries * 3) break;
    }
    run_requests(s, p, 600, 0, true, &r);
    ASSERT_OK(kvo_store_get_stats(s, &st));
    r.mean_util /= (double)(r.requests ? r.requests : 1);
    r.reclaims = kvo__store_reclaims(s);
    if (getenv("KVO_TEST_VERBOSE"))
        printf("%-24s bs %4llu cap %6.1f GiB %s: segment %.1f MiB x %llu, min %.4f mean %.4f over %llu requests, "
               "%llu evictions, %llu reclaims, reserved %.4f\n",
               preset, (unsigned long long)block_size, (double)capacity / (1 << 30), kvo_policy_name(pol),
               (double)st.segment_bytes / (1 << 20), (unsigned long long)st.segments, r.min_util, r.mean_util,
               (unsigned long long)r.requests, (unsigned long long)st.evictions, (unsigned long long)r.reclaims,
               (double)st.bytes_reserved / (double)capacity);
    ASSERT_GT_U64(r.requests, 100);
    ASSERT_GT_U64(st.evictions, st.entries);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return r;
}

#define GiB (UINT64_C(1) << 30)
#define CHECK95(r) do { frag_result r_ = (r); if (r_.min_util < 0.95) \
    FAILF("utilisation fell to %.4f (mean %.4f)", r_.min_util, r_.mean_util); } while (0)

KVO_TEST(deepseek_auto) { CHECK95(run_frag("deepseek-v4-flash-like", 0, 8 * GiB, KVO_POLICY_LRU, 0)); }
KVO_TEST(deepseek_block256) { CHECK95(run_frag("deepseek-v4-flash-like", 256, 8 * GiB, KVO_POLICY_LRU, 0)); }
KVO_TEST(deepseek_auto_small) { CHECK95(run_frag("deepseek-v4-flash-like", 0, 2 * GiB, KVO_POLICY_S3FIFO, 0)); }
KVO_TEST(glm_auto) { CHECK95(run_frag("glm-5.3-flash-like", 0, 64 * GiB, KVO_POLICY_LRU, 0)); }
KVO_TEST(glm_auto_arc) { CHECK95(run_frag("glm-5.3-flash-like", 0, 64 * GiB, KVO_POLICY_ARC, 0)); }
KVO_TEST(glm_block3584) { CHECK95(run_frag("glm-5.3-flash-like", 3584, 32 * GiB, KVO_POLICY_LRU, 0)); }
/* the mix changes: first only the small-slot groups (tail, draft) store, then
 * all; segments must move to the 51.7 MB and 14 MB classes */
KVO_TEST(glm_mix_shift) { CHECK95(run_frag("glm-5.3-flash-like", 0, 64 * GiB, KVO_POLICY_LRU, 0x3D)); }
