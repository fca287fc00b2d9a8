/* prepare_store never evicts a present key of its own batch (store_prepare.c,
 * kvo__ps_protect): whether the keys are protected by taking them out of the
 * policy's queues or, under LRU when they lead the list, where they are.
 * Every policy, one slot size and several; batches that need every other
 * entry evicted (the eviction walk goes to the end of what it may take), and
 * random batches with their present keys touched first (in place), or not
 * (at the victim end). */
#include "store_test_util.h"

static const kvo_policy_kind protect_pols[] = {KVO_POLICY_LRU, KVO_POLICY_ARC, KVO_POLICY_S3FIFO, KVO_POLICY_PREFIX};

static bool protect_same(kvo_chunk_key a, kvo_chunk_key b) { return kvo_chunk_key_eq(&a, &b); }

/* prepare_store + complete_store of keys[0..n); fails the test when an
 * evicted key is one of the batch's present keys, or one of them is not
 * READY after.  Returns prepare_store's result and the evictions in *nev. */
static int protect_store(kvo_store *s, const kvo_chunk_key *keys, size_t n, size_t *nev) {
    uint8_t present[256], need[256];
    kvo_slot sl[256], evs[1024];
    kvo_chunk_key ev[1024], todo[256];
    if (n > 256) FAILF("batch too big");
    for (size_t i = 0; i < n; i++) present[i] = st_state(s, keys[i]) == KVO_READY;
    *nev = 0;
    int rc = kvo_store_prepare_store(s, keys, n, need, sl, ev, evs, 1024, nev);
    if (rc) return rc;
    for (size_t v = 0; v < *nev; v++)
        for (size_t i = 0; i < n; i++)
            if (present[i] && protect_same(ev[v], keys[i]))
                FAILF("prepare_store evicted key %zu of its own batch (present, group %u)", i, keys[i].group);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (present[i] && (need[i] || st_state(s, keys[i]) != KVO_READY))
            FAILF("present key %zu of the batch is no longer READY", i);
        if (need[i]) todo[m++] = keys[i];
    }
    if (m && kvo_store_complete_store(s, todo, m, true)) FAILF("complete_store: %s", kvo_last_error());
    st_check(s);
    return 0;
}

/* One slot size, cap chunks: fill, then store all but k of the residents
 * with k new keys: exactly the k others must go. touch: the batch's
 * present keys touched in key order first (they lead an LRU list). */
static void protect_all_but_k(kvo_policy_kind pol, bool touch) {
    static const uint64_t pg[] = {4096};
    const size_t cap = 64, k = 5;
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, cap * 4096, pol);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    size_t fit = (size_t)((ss.capacity_bytes - ss.bytes_reserved) / 4096);
    if (fit > 200 || fit < 2 * k) FAILF("store holds %zu chunks", fit);
    kvo_chunk_key keys[256], b[256];
    for (size_t i = 0; i < fit; i++) keys[i] = st_key(0, i);
    for (size_t i = 0; i < fit; i += 8) st_put(s, keys + i, fit - i < 8 ? fit - i : 8);
    for (size_t round = 0; round < 6; round++) {
        /* the batch: residents but the k at positions round*k.., then k new */
        size_t n = 0, skip = (round * k) % (fit - k);
        for (size_t i = 0; i < fit; i++)
            if (i < skip || i >= skip + k) b[n++] = keys[i];
        for (size_t j = 0; j < k; j++) b[n++] = st_key(0, 1000 * (round + 1) + j);
        if (touch) ASSERT_OK(kvo_store_touch(s, b, n - k));
        size_t nev = 0;
        ASSERT_OK(protect_store(s, b, n, &nev));
        ASSERT_EQ_U64(nev, k);
        for (size_t i = 0; i < fit - k; i++) keys[i] = b[i];
        for (size_t j = 0; j < k; j++) keys[fit - k + j] = b[n - k + j];
    }
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(batch_needing_all_other_room_evicts_only_the_others) {
    for (size_t i = 0; i < sizeof protect_pols / sizeof protect_pols[0]; i++) {
        protect_all_but_k(protect_pols[i], true);
        protect_all_but_k(protect_pols[i], false);
    }
}

static uint64_t protect_rng(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Random batches over a small universe (mostly present keys), groups of
 * the given chunk sizes, on a store of cap bytes. */
static void protect_random(kvo_policy_kind pol, size_t ngroups, const uint64_t *pg, uint64_t cap, uint64_t seed) {
    kvo_plan *p = st_plan(ngroups, pg);
    kvo_store *s = st_store(p, cap, pol);
    kvo_chunk_key b[64];
    size_t ok = 0, evicting = 0;
    for (int it = 0; it < 1500; it++) {
        size_t n = 1 + protect_rng(&seed) % 40, m = 0;
        uint64_t base = (uint64_t)it; /* a sliding window: earlier batches' keys come back */
        while (m < n) {
            uint64_t id = base + protect_rng(&seed) % 120;
            kvo_chunk_key k = st_key((uint32_t)(id % ngroups), id);
            bool dup = false;
            for (size_t j = 0; j < m && !dup; j++) dup = protect_same(b[j], k);
            if (!dup) b[m++] = k;
        }
        uint64_t how = protect_rng(&seed) % 4;
        if (how >= 1) ASSERT_OK(kvo_store_touch(s, b, n)); /* present keys in key order: in place */
        if (how == 3) {                                     /* then others after them: not in place */
            kvo_chunk_key o = st_key((uint32_t)((base + 200) % ngroups), base + 200);
            ASSERT_OK(kvo_store_touch(s, &o, 1));
        }
        size_t nev = 0;
        int rc = protect_store(s, b, n, &nev);
        if (rc && rc != KVO_ENOSPC) FAILF("prepare_store: %s", kvo_last_error());
        ok += rc == 0;
        evicting += nev > 0;
    }
    if (ok < 1000 || evicting < 500) FAILF("only %zu stores succeeded, %zu evicted", ok, evicting);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(random_batches_one_slot_size) {
    static const uint64_t pg[] = {4096};
    for (size_t i = 0; i < sizeof protect_pols / sizeof protect_pols[0]; i++)
        protect_random(protect_pols[i], 1, pg, 64 * 4096, 0x9E3779B97F4A7C15u + i);
}

KVO_TEST(random_batches_several_slot_sizes) {
    static const uint64_t pg[] = {4096, 12288, 32768};
    for (size_t i = 0; i < sizeof protect_pols / sizeof protect_pols[0]; i++)
        protect_random(protect_pols[i], 3, pg, 2u << 20, 0xD1B54A32D192ED03u + i);
}

/* The duplicate check (present keys by entry, absent ones by key): a
 * repeated present key and a repeated absent key are refused, changing
 * nothing; a batch of distinct present and absent keys is not. */
KVO_TEST(repeated_keys_refused_present_or_absent) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, 256 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[120], b[121];
    for (int i = 0; i < 120; i++) k[i] = st_key(0, (uint64_t)i);
    for (int i = 0; i < 60; i += 10) st_put(s, k + i, 10); /* k0..k59 present */
    uint8_t need[121];
    kvo_slot sl[121];
    for (int pos = 0; pos < 2; pos++) {
        int rep = pos ? 100 : 30; /* an absent key, then a present one */
        memcpy(b, k, sizeof k);
        b[120] = k[rep];
        for (int i = 0; i < 120; i++) {
            uint64_t seed = (uint64_t)i + 1;
            int j = (int)(protect_rng(&seed) % 121);
            kvo_chunk_key x = b[i];
            b[i] = b[j];
            b[j] = x;
        }
        ASSERT_EQ_INT(kvo_store_prepare_store(s, b, 121, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
        ASSERT_EQ_U64(st_state(s, k[100]), KVO_MISS);
        ASSERT_EQ_U64(st_state(s, k[30]), KVO_READY);
    }
    ASSERT_OK(kvo_store_lookup(s, k, 120, need)); /* resolved by the memo, then stored */
    size_t nev = 0;
    ASSERT_OK(protect_store(s, k, 120, &nev));
    for (int i = 0; i < 120; i++) ASSERT_EQ_U64(st_state(s, k[i]), KVO_READY);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* Keys st_key(0, base + i) whose mixes share the top 11 bits (the bit of
 * prepare_store's duplicate filter, store_prepare.c) pairwise: out[0..n),
 * consecutive pairs colliding, distinct keys throughout. */
static size_t protect_colliding_pairs(uint64_t base, kvo_chunk_key *out, size_t pairs) {
    static uint64_t first[2048];
    memset(first, 0, sizeof first);
    size_t n = 0;
    for (uint64_t i = base; n < 2 * pairs; i++) {
        kvo_chunk_key k = st_key(0, i);
        uint64_t bucket = kvo__key_mix(&k) >> 53;
        if (!first[bucket]) {
            first[bucket] = i + 1;
            continue;
        }
        out[n++] = st_key(0, first[bucket] - 1);
        out[n++] = k;
        first[bucket] = UINT64_MAX; /* each bucket gives one pair */
    }
    return n;
}

/* Every path of the absent keys' duplicate check: distinct keys whose filter
 * bits collide (candidates compared and passed; past the candidate bound, the
 * set) are stored; a repeat is refused when it is a candidate among false
 * ones and when the candidates overflow into the set, changing nothing. */
KVO_TEST(duplicate_check_filter_candidates_and_set) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, 1024 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[64], b[65];
    uint8_t need[65];
    kvo_slot sl[65];
    for (size_t pairs = 1; pairs <= 30; pairs += 29) { /* 1: candidates; 30: over the bound, the set */
        size_t n = protect_colliding_pairs(1000 * pairs, k, pairs);
        /* a repeat at the end: refused, nothing stored */
        memcpy(b, k, n * sizeof *k);
        b[n] = k[n / 2];
        ASSERT_EQ_INT(kvo_store_prepare_store(s, b, n + 1, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
        ASSERT_CONTAINS(kvo_last_error(), "repeats");
        for (size_t i = 0; i < n; i++) ASSERT_EQ_U64(st_state(s, k[i]), KVO_MISS);
        /* distinct, colliding: stored */
        size_t nev = 0;
        ASSERT_OK(protect_store(s, k, n, &nev));
        for (size_t i = 0; i < n; i++) ASSERT_EQ_U64(st_state(s, k[i]), KVO_READY);
    }
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}
