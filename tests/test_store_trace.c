/* Replay of the Mooncake trace (shared/traces): the store's LRU reproduces the
 * prefix hit rates measured independently in shared/traces/README.md (10k
 * blocks: 42.3 %, 30k: 62.4 %, infinite: 64.0 %), and ARC and S3-FIFO stay
 * within a few points of it.  One group, one slot per 512-token block; a
 * request's prefix hits are its leading READY blocks, then all its blocks are
 * stored (present ones count as used; or, vLLM-like, left alone while the
 * hits are touched). */
#include "store_test_util.h"

static uint64_t *ids;
static size_t *starts, nreq, nids;

static void load_trace(void) {
    if (ids) return;
    size_t len = 0;
    char *text = kvo_test_read_file(kvo_test_shared_path("traces/mooncake_synthetic_trace.jsonl"), &len);
    if (!text) SKIP("trace not readable");
    size_t cap = 1 << 17, rcap = 1 << 12;
    ids = malloc(cap * sizeof *ids);
    starts = malloc((rcap + 1) * sizeof *starts);
    for (char *p = text; (p = strstr(p, "\"hash_ids\"")) != NULL;) {
        p = strchr(p, '[');
        if (!p) break;
        p++;
        if (nreq + 1 >= rcap) starts = realloc(starts, ((rcap *= 2) + 1) * sizeof *starts);
        starts[nreq++] = nids;
        for (;;) {
            while (*p == ' ' || *p == ',') p++;
            if (*p < '0' || *p > '9') break;
            if (nids == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
            ids[nids++] = strtoull(p, &p, 10);
        }
    }
    starts[nreq] = nids;
    free(text);
    ASSERT_GT_U64(nreq, 3000);
}

static double infinite(void) {
    uint64_t n = 1;
    while (n < nids * 2) n <<= 1;
    uint64_t *set = malloc(n * sizeof *set), hits = 0;
    memset(set, 0xFF, n * sizeof *set);
    for (size_t r = 0; r < nreq; r++) {
        bool prefix = true;
        for (size_t i = starts[r]; i < starts[r + 1]; i++) {
            uint64_t h = (ids[i] * UINT64_C(0x9E3779B97F4A7C15)) & (n - 1);
            bool found = false;
            while (set[h] != UINT64_MAX) {
                if (set[h] == ids[i]) { found = true; break; }
                h = (h + 1) & (n - 1);
            }
            if (!found) set[h] = ids[i];
            prefix = prefix && found;
            hits += prefix;
        }
    }
    free(set);
    return 100.0 * (double)hits / (double)nids;
}

/* vlm_like: the store leaves present keys alone (ignore_present) and the
 * replay touches each request's hit prefix, first block most recent, as
 * vLLM's scheduler does through its manager's touch. */
static double replay_ex(kvo_policy_kind pol, uint64_t blocks, bool vllm_like) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = blocks * 4096;
    sp.policy = pol;
    sp.ignore_present = vllm_like;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    size_t maxn = 0;
    for (size_t r = 0; r < nreq; r++) if (starts[r + 1] - starts[r] > maxn) maxn = starts[r + 1] - starts[r];
    kvo_chunk_key *keys = malloc(maxn * sizeof *keys), *todo = malloc(maxn * sizeof *todo);
    uint8_t *st = malloc(maxn), *need = malloc(maxn);
    kvo_slot *sl = malloc(maxn * sizeof *sl);
    uint64_t hits = 0;
    for (size_t r = 0; r < nreq; r++) {
        size_t n = starts[r + 1] - starts[r];
        if (!n) continue;
        for (size_t i = 0; i < n; i++) keys[i] = st_key(0, ids[starts[r] + i]);
        ASSERT_OK(kvo_store_lookup(s, keys, n, st));
        size_t h = 0;
        while (h < n && st[h] == KVO_READY) h++;
        hits += h;
        for (size_t i = h; vllm_like && i > 0; i--) ASSERT_OK(kvo_store_touch(s, &keys[i - 1], 1));
        ASSERT_OK(kvo_store_prepare_store(s, keys, n, need, sl, NULL, NULL, 0, NULL));
        size_t m = 0;
        for (size_t i = 0; i < n; i++) if (need[i]) todo[m++] = keys[i];
        if (m) ASSERT_OK(kvo_store_complete_store(s, todo, m, true));
    }
    st_check(s);
    free(keys); free(todo); free(st); free(need); free(sl);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return 100.0 * (double)hits / (double)nids;
}

static double replay(kvo_policy_kind pol, uint64_t blocks) { return replay_ex(pol, blocks, false); }

#define NEAR(v, ref, tol) do { double v_ = (v); if (v_ < (ref) - (tol) || v_ > (ref) + (tol)) \
    FAILF("%s = %.2f, expected %.1f +- %.1f", #v, v_, (double)(ref), (double)(tol)); } while (0)

KVO_TEST(lru_matches_reference_hit_rates) {
    load_trace();
    NEAR(infinite(), 64.0, 0.1);
    NEAR(replay(KVO_POLICY_LRU, 10000), 42.3, 0.3);
    NEAR(replay(KVO_POLICY_LRU, 30000), 62.4, 0.3);
}

/* ARC and S3-FIFO near LRU at 10k blocks (43.49 and 42.43 against 42.35):
 * a sanity bound, 3 points, well above the 0.5 points by which any of these
 * policies' gaps move between capacities 200 blocks apart (tests/test_replay.c,
 * NEIGHBOUR_NOISE); LRU's own figures are an exact algorithm's and checked
 * to 0.3 against the trace's README (and to the last digit in
 * tests/test_replay.c). */
KVO_TEST(arc_and_s3fifo_close_to_lru) {
    load_trace();
    double lru = replay(KVO_POLICY_LRU, 10000);
    double arc = replay(KVO_POLICY_ARC, 10000), s3 = replay(KVO_POLICY_S3FIFO, 10000);
    if (getenv("KVO_TEST_VERBOSE")) printf("10k blocks: lru %.2f arc %.2f s3fifo %.2f\n", lru, arc, s3);
    NEAR(arc, lru, 3.0);
    NEAR(s3, lru, 3.0);
}

/* vLLM's LRU offloading manager on the same trace: present keys untouched by
 * prepare_store, hits touched: 0.4239 of block references at 10k blocks
 * (measured with a transcription of its OrderedDict manager). */
KVO_TEST(lru_ignore_present_matches_vllm) {
    load_trace();
    double v = replay_ex(KVO_POLICY_LRU, 10000, true);
    if (getenv("KVO_TEST_VERBOSE")) printf("10k blocks, vLLM-like: %.3f\n", v);
    NEAR(v, 42.39, 0.01);
}
