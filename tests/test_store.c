/* The store contract, point by point. */
#include "store_test_util.h"

static const uint64_t PAGES2[] = {4096, 8192, 0};

KVO_TEST(lifecycle_miss_pending_ready_pin) {
    kvo_plan *p = st_plan(3, PAGES2);
    kvo_store *s = st_store(p, 64 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[2] = {st_key(0, 1), st_key(1, 1)};
    uint8_t st[2], need[2];
    kvo_slot sl[2], ld[2];
    size_t nev = 9;
    ASSERT_OK(kvo_store_lookup(s, k, 2, st));
    ASSERT_EQ_INT(st[0], KVO_MISS);
    ASSERT_EQ_INT(st[1], KVO_MISS);
    ASSERT_OK(kvo_store_prepare_store(s, k, 2, need, sl, NULL, NULL, 0, &nev));
    ASSERT_EQ_U64(nev, 0);
    ASSERT_EQ_INT(need[0], 1);
    ASSERT_EQ_INT(need[1], 1);
    ASSERT_EQ_U64(sl[0].bytes, 4096);
    ASSERT_EQ_U64(sl[1].bytes, 8192);
    ASSERT_OK(kvo_store_lookup(s, k, 2, st));
    ASSERT_EQ_INT(st[0], KVO_PENDING);
    /* PENDING is not loadable */
    ASSERT_ERR(kvo_store_prepare_load(s, k, 2, ld), KVO_EAGAIN);
    ASSERT_CONTAINS(kvo_last_error(), "being written");
    /* nor removable */
    ASSERT_ERR(kvo_store_remove(s, k, 1), KVO_EBUSY);
    ASSERT_OK(kvo_store_complete_store(s, k, 2, true));
    ASSERT_OK(kvo_store_lookup(s, k, 2, st));
    ASSERT_EQ_INT(st[0], KVO_READY);
    ASSERT_EQ_INT(st[1], KVO_READY);
    ASSERT_OK(kvo_store_prepare_load(s, k, 2, ld));
    ASSERT_EQ_U64(ld[0].offset, sl[0].offset);
    ASSERT_EQ_U64(ld[1].offset, sl[1].offset);
    ASSERT_EQ_U64(ld[1].bytes, 8192);
    kvo_store_entry e;
    ASSERT_OK(kvo_store_peek(s, &k[0], &e));
    ASSERT_EQ_U64(e.pins, 1);
    ASSERT_ERR(kvo_store_remove(s, k, 1), KVO_EBUSY);
    st_check(s);
    ASSERT_OK(kvo_store_complete_load(s, k, 2));
    ASSERT_ERR(kvo_store_complete_load(s, k, 1), KVO_ESTATE);
    ASSERT_OK(kvo_store_peek(s, &k[0], &e));
    ASSERT_EQ_U64(e.pins, 0);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.hits, 2);
    ASSERT_EQ_U64(ss.misses, 2);
    ASSERT_EQ_U64(ss.pending_hits, 2);
    ASSERT_EQ_U64(ss.stores, 2);
    ASSERT_EQ_U64(ss.bytes_used, 4096 + 8192);
    ASSERT_EQ_U64(ss.groups[0].chunks, 1);
    ASSERT_EQ_U64(ss.groups[1].bytes_used, 8192);
    ASSERT_EQ_U64(ss.groups[2].slot_bytes, 0);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(slots_follow_key_order_and_skip_present) {
    kvo_plan *p = st_plan(3, PAGES2);
    kvo_store *s = st_store(p, 64 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[6];
    for (int i = 0; i < 6; i++) k[i] = st_key((uint32_t)(i % 2), (uint64_t)i);
    st_put(s, &k[2], 1); /* k2 already stored */
    kvo_slot before;
    kvo_store_entry e;
    ASSERT_OK(kvo_store_peek(s, &k[2], &e));
    before = e.slot;
    uint8_t need[6];
    kvo_slot sl[6];
    ASSERT_OK(kvo_store_prepare_store(s, k, 6, need, sl, NULL, NULL, 0, NULL));
    for (int i = 0; i < 6; i++) {
        if (i == 2) {
            ASSERT_EQ_INT(need[i], 0);
            ASSERT_EQ_U64(sl[i].bytes, 0);
            continue;
        }
        ASSERT_EQ_INT(need[i], 1);
        ASSERT_OK(kvo_store_peek(s, &k[i], &e));
        ASSERT_EQ_U64(e.slot.offset, sl[i].offset); /* slot i belongs to key i */
        ASSERT_EQ_U64(sl[i].bytes, i % 2 ? 8192 : 4096);
    }
    ASSERT_OK(kvo_store_peek(s, &k[2], &e));
    ASSERT_EQ_U64(e.slot.offset, before.offset);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.store_skipped_present, 1);
    /* preparing again: everything present (PENDING or READY) is skipped */
    ASSERT_OK(kvo_store_prepare_store(s, k, 6, need, sl, NULL, NULL, 0, NULL));
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(need[i], 0);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* One 4096-byte group; capacity for exactly 4 chunks. */
static kvo_store *small4(kvo_plan **pp, kvo_policy_kind pol) {
    static const uint64_t pg[] = {4096};
    *pp = st_plan(1, pg);
    kvo_store *s = st_store(*pp, 4 * 4096, pol);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.groups[0].capacity_chunks, 4);
    return s;
}

KVO_TEST(per_group_capacity_exact) {
    kvo_plan *p;
    kvo_store *s = small4(&p, KVO_POLICY_LRU);
    kvo_chunk_key k[5];
    for (int i = 0; i < 5; i++) k[i] = st_key(0, (uint64_t)i);
    ASSERT_EQ_U64(st_put(s, k, 4), 0); /* exactly 4 fit without eviction */
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.bytes_used, ss.capacity_bytes);
    ASSERT_EQ_U64(st_put(s, &k[4], 1), 1); /* the fifth evicts one */
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);

    /* a mixed plan: each group's capacity is counted in its own slots, none
     * reserves room for another group */
    static const uint64_t pg[] = {4096, 3 * 4096, 0};
    p = st_plan(3, pg);
    s = st_store(p, 48 * 4096, KVO_POLICY_LRU);
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    uint64_t c0 = ss.groups[0].capacity_chunks, c1 = ss.groups[1].capacity_chunks;
    ASSERT_EQ_U64(c0 * 4096 + (ss.capacity_bytes - ss.segments * ss.segment_bytes) +
                      ss.segments * (ss.segment_bytes % 4096), ss.capacity_bytes);
    ASSERT_GE_U64(c1 * 3 * 4096, ss.capacity_bytes * 9 / 10);
    ASSERT_EQ_U64(ss.groups[2].capacity_chunks, 0);
    /* fill with group 1 only: capacity_chunks of them fit without eviction */
    for (uint64_t i = 0; i < c1; i++) {
        kvo_chunk_key kk = st_key(1, 1000 + i);
        ASSERT_EQ_U64(st_put(s, &kk, 1), 0);
    }
    kvo_chunk_key kk = st_key(1, 5000);
    ASSERT_EQ_U64(st_put(s, &kk, 1), 1);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(pinned_and_pending_never_evicted) {
    kvo_plan *p;
    kvo_store *s = small4(&p, KVO_POLICY_LRU);
    kvo_chunk_key k[8];
    for (int i = 0; i < 8; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 3); /* k0 is the LRU victim */
    kvo_slot ld;
    ASSERT_OK(kvo_store_prepare_load(s, &k[0], 1, &ld)); /* pinned */
    uint8_t need[2];
    kvo_slot sl[2];
    ASSERT_OK(kvo_store_prepare_store(s, &k[3], 1, need, sl, NULL, NULL, 0, NULL)); /* k3 pending, fills */
    /* k4: the only evictable ones are k1, k2 */
    kvo_chunk_key ev[4];
    kvo_slot evs[4];
    size_t nev = 0;
    ASSERT_OK(kvo_store_prepare_store(s, &k[4], 1, need, sl, ev, evs, 4, &nev));
    ASSERT_EQ_U64(nev, 1);
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[0], &k[1]));
    ASSERT_EQ_U64(evs[0].offset, sl[0].offset); /* the freed slot is reused */
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_READY);
    ASSERT_EQ_INT(st_state(s, k[3]), KVO_PENDING);
    ASSERT_OK(kvo_store_complete_store(s, &k[4], 1, true));
    /* k5 + k6 need two slots; only k2 and k4 are evictable */
    kvo_chunk_key two[2] = {k[5], k[6]};
    ASSERT_OK(kvo_store_prepare_store(s, two, 2, need, sl, ev, evs, 4, &nev));
    ASSERT_EQ_U64(nev, 2);
    /* now nothing is evictable: k0 pinned, k3 k5 k6 pending */
    kvo_store_stats before = KVO_STORE_STATS_INIT, after = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &before));
    ASSERT_ERR(kvo_store_prepare_store(s, &k[7], 1, need, sl, ev, evs, 4, &nev), KVO_ENOSPC);
    ASSERT_CONTAINS(kvo_last_error(), "pinned");
    ASSERT_OK(kvo_store_get_stats(s, &after));
    ASSERT_EQ_U64(after.entries, before.entries);
    ASSERT_EQ_U64(after.rejected_stores, before.rejected_stores + 1);
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_READY);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(eviction_all_or_nothing) {
    kvo_plan *p;
    kvo_store *s = small4(&p, KVO_POLICY_LRU);
    kvo_chunk_key k[8];
    for (int i = 0; i < 8; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 4);
    kvo_slot ld[2];
    ASSERT_OK(kvo_store_prepare_load(s, k, 2, ld)); /* k0, k1 pinned: 2 evictable */
    kvo_store_stats b = KVO_STORE_STATS_INIT, a = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &b));
    uint8_t need[3] = {7, 7, 7};
    kvo_slot sl[3];
    kvo_chunk_key ev[8];
    kvo_slot evs[8];
    size_t nev = 99;
    /* three new keys need three evictions: impossible -> nothing changes */
    ASSERT_ERR(kvo_store_prepare_store(s, &k[4], 3, need, sl, ev, evs, 8, &nev), KVO_ENOSPC);
    ASSERT_EQ_U64(nev, 99);
    ASSERT_EQ_INT(need[0], 7);
    ASSERT_OK(kvo_store_get_stats(s, &a));
    ASSERT_EQ_U64(a.entries, 4);
    ASSERT_EQ_U64(a.evictions, b.evictions);
    ASSERT_EQ_U64(a.stores, b.stores);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(st_state(s, k[i]), KVO_READY);
    for (int i = 4; i < 7; i++) ASSERT_EQ_INT(st_state(s, k[i]), KVO_MISS);
    /* ERANGE: the evicted buffer is too small -> nothing changes, count given */
    ASSERT_ERR(kvo_store_prepare_store(s, &k[4], 2, need, sl, ev, evs, 1, &nev), KVO_ERANGE);
    ASSERT_EQ_U64(nev, 2);
    for (int i = 0; i < 4; i++) ASSERT_EQ_INT(st_state(s, k[i]), KVO_READY);
    ASSERT_EQ_INT(st_state(s, k[4]), KVO_MISS);
    st_check(s);
    /* the same batch with room to report succeeds, evicting k2 then k3 */
    ASSERT_OK(kvo_store_prepare_store(s, &k[4], 2, need, sl, ev, evs, 8, &nev));
    ASSERT_EQ_U64(nev, 2);
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[0], &k[2]));
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[1], &k[3]));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(same_batch_never_evicted) {
    kvo_plan *p;
    kvo_store *s = small4(&p, KVO_POLICY_LRU);
    kvo_chunk_key k[6];
    for (int i = 0; i < 6; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 4); /* LRU order: k0 oldest */
    kvo_chunk_key batch[2] = {k[0], k[4]};
    uint8_t need[2];
    kvo_slot sl[2];
    kvo_chunk_key ev[4];
    kvo_slot evs[4];
    size_t nev;
    ASSERT_OK(kvo_store_prepare_store(s, batch, 2, need, sl, ev, evs, 4, &nev));
    ASSERT_EQ_INT(need[0], 0);
    ASSERT_EQ_INT(need[1], 1);
    ASSERT_EQ_U64(nev, 1);
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[0], &k[1])); /* not k0, which is in the batch */
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_READY);
    ASSERT_OK(kvo_store_complete_store(s, &k[4], 1, true));
    /* the batch's present key counted as used: k2 goes next, then k3, then k0 */
    ASSERT_EQ_U64(st_put(s, &k[5], 1), 1);
    ASSERT_EQ_INT(st_state(s, k[2]), KVO_MISS);
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_READY);
    /* a batch whose other members are everything evictable: ENOSPC */
    kvo_chunk_key all[5] = {k[0], k[3], k[4], k[5], st_key(0, 99)};
    kvo_chunk_key nk = st_key(0, 99);
    ASSERT_ERR(kvo_store_prepare_store(s, all, 5, need, sl, ev, evs, 4, &nev), KVO_ENOSPC);
    ASSERT_EQ_INT(st_state(s, nk), KVO_MISS);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(failed_store_removes_only_its_keys) {
    kvo_plan *p = st_plan(3, PAGES2);
    kvo_store *s = st_store(p, 64 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key a[3] = {st_key(0, 1), st_key(1, 2), st_key(0, 3)};
    kvo_chunk_key b[2] = {st_key(0, 4), st_key(1, 5)};
    st_put(s, &a[0], 1);
    uint8_t need[3];
    kvo_slot sl[3];
    ASSERT_OK(kvo_store_prepare_store(s, &a[1], 2, need, sl, NULL, NULL, 0, NULL));
    ASSERT_OK(kvo_store_prepare_store(s, b, 2, need, sl, NULL, NULL, 0, NULL));
    kvo_store_event evs[16];
    kvo_store_drain_events(s, evs, 16, NULL);
    ASSERT_OK(kvo_store_complete_store(s, &a[1], 2, false));
    ASSERT_EQ_INT(st_state(s, a[0]), KVO_READY);
    ASSERT_EQ_INT(st_state(s, a[1]), KVO_MISS);
    ASSERT_EQ_INT(st_state(s, a[2]), KVO_MISS);
    ASSERT_EQ_INT(st_state(s, b[0]), KVO_PENDING);
    ASSERT_EQ_INT(st_state(s, b[1]), KVO_PENDING);
    size_t ne = kvo_store_drain_events(s, evs, 16, NULL);
    ASSERT_EQ_U64(ne, 2);
    ASSERT_EQ_U64(evs[0].type, KVO_EVENT_REMOVED);
    /* completing an absent key: ESTATE, nothing changed (a READY one is a
     * no-op: test_connector_store_rules.c) */
    kvo_chunk_key mix[2] = {b[0], a[1]};
    ASSERT_ERR(kvo_store_complete_store(s, mix, 2, true), KVO_ESTATE);
    ASSERT_EQ_INT(st_state(s, b[0]), KVO_PENDING);
    ASSERT_OK(kvo_store_complete_store(s, b, 2, true));
    ne = kvo_store_drain_events(s, evs, 16, NULL);
    ASSERT_EQ_U64(ne, 2);
    ASSERT_EQ_U64(evs[0].type, KVO_EVENT_STORED);
    ASSERT_TRUE(kvo_chunk_key_eq(&evs[1].key, &b[1]));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(bad_input_changes_nothing) {
    kvo_plan *p = st_plan(3, PAGES2);
    kvo_store *s = st_store(p, 64 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[3] = {st_key(0, 1), st_key(1, 2), st_key(0, 3)};
    st_put(s, k, 1);
    uint8_t st[3], need[3];
    kvo_slot sl[3];
    kvo_store_stats b = KVO_STORE_STATS_INIT, a = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &b));
    ASSERT_ERR(kvo_store_lookup(NULL, k, 1, st), KVO_EINVAL);
    ASSERT_ERR(kvo_store_lookup(s, NULL, 1, st), KVO_EINVAL);
    ASSERT_ERR(kvo_store_lookup(s, k, 1, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_store_lookup(s, k, 0, st), KVO_EINVAL);
    kvo_chunk_key badg[2] = {k[1], st_key(7, 1)};
    ASSERT_ERR(kvo_store_lookup(s, badg, 2, st), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "group 7");
    kvo_chunk_key nonoff[2] = {k[1], st_key(2, 1)};
    ASSERT_ERR(kvo_store_prepare_store(s, nonoff, 2, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "not offloaded");
    kvo_chunk_key dup[3] = {k[1], k[2], k[1]};
    ASSERT_ERR(kvo_store_prepare_store(s, dup, 3, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "repeats");
    ASSERT_ERR(kvo_store_prepare_store(s, k, 1, NULL, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_store_prepare_store(s, k, 1, need, NULL, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_store_prepare_store(s, k, 1, need, sl, NULL, NULL, 5, NULL), KVO_EINVAL);
    ASSERT_ERR(kvo_store_prepare_load(s, &k[1], 1, sl), KVO_ENOTFOUND);
    kvo_chunk_key ld2[2] = {k[0], k[2]};
    ASSERT_ERR(kvo_store_prepare_load(s, ld2, 2, sl), KVO_ENOTFOUND); /* k0 not pinned either */
    kvo_store_entry e;
    ASSERT_OK(kvo_store_peek(s, &k[0], &e));
    ASSERT_EQ_U64(e.pins, 0);
    ASSERT_ERR(kvo_store_complete_load(s, k, 1), KVO_ESTATE);
    ASSERT_ERR(kvo_store_touch(s, badg, 2), KVO_EINVAL);
    ASSERT_ERR(kvo_store_remove(s, badg, 2), KVO_EINVAL);
    ASSERT_ERR(kvo_store_complete_store(s, k, 0, true), KVO_EINVAL);
    ASSERT_ERR(kvo_store_get_stats(s, NULL), KVO_EINVAL);
    ASSERT_OK(kvo_store_get_stats(s, &a));
    ASSERT_EQ_U64(a.entries, b.entries);
    ASSERT_EQ_U64(a.hits, b.hits);
    ASSERT_EQ_U64(a.misses, b.misses);
    ASSERT_EQ_U64(a.stores, b.stores);
    /* a duplicate in complete_store: EINVAL, the key stays PENDING */
    ASSERT_OK(kvo_store_prepare_store(s, &k[2], 1, need, sl, NULL, NULL, 0, NULL));
    kvo_chunk_key dup2[2] = {k[2], k[2]};
    ASSERT_ERR(kvo_store_complete_store(s, dup2, 2, true), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "repeats");
    ASSERT_EQ_INT(st_state(s, k[2]), KVO_PENDING);
    st_check(s);
    ASSERT_OK(kvo_store_complete_store(s, &k[2], 1, false));
    /* create errors */
    kvo_store_params sp = kvo_store_default_params();
    kvo_store *s2 = NULL;
    ASSERT_ERR(kvo_store_create(&sp, &s2), KVO_EINVAL);
    sp.plan = p;
    sp.capacity_bytes = 4096; /* below group 1's 8192 slot */
    ASSERT_ERR(kvo_store_create(&sp, &s2), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "g1");
    ASSERT_NULL(s2);
    kvo_policy_kind pk;
    ASSERT_ERR(kvo_policy_parse("fifo", &pk), KVO_EINVAL);
    ASSERT_OK(kvo_policy_parse("arc", &pk));
    ASSERT_EQ_INT(pk, KVO_POLICY_ARC);
    ASSERT_EQ_STR(kvo_policy_name(KVO_POLICY_S3FIFO), "s3fifo");
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* A refused complete_load (a key given more times than it is pinned, or a
 * key not pinned after pinned ones) undoes its tentative unpins. */
KVO_TEST(refused_complete_load_keeps_pins) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, 16 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[3] = {st_key(0, 1), st_key(0, 2), st_key(0, 3)};
    st_put(s, k, 3);
    kvo_slot sl[2];
    kvo_chunk_key ld[2] = {k[0], k[1]};
    ASSERT_OK(kvo_store_prepare_load(s, ld, 2, sl));
    kvo_chunk_key twice[3] = {k[1], k[0], k[0]};
    ASSERT_ERR(kvo_store_complete_load(s, twice, 3), KVO_ESTATE);
    kvo_chunk_key unpinned[3] = {k[0], k[1], k[2]};
    ASSERT_ERR(kvo_store_complete_load(s, unpinned, 3), KVO_ESTATE);
    kvo_store_entry e;
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(kvo_store_peek(s, &k[i], &e));
        ASSERT_EQ_U64(e.pins, 1);
    }
    kvo_store_stats st = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &st));
    ASSERT_EQ_U64(st.pinned, 2);
    st_check(s);
    ASSERT_OK(kvo_store_complete_load(s, ld, 2));
    ASSERT_OK(kvo_store_peek(s, &k[0], &e));
    ASSERT_EQ_U64(e.pins, 0);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* retire: an unpinned key goes at once; a pinned one is hidden from every
 * reader at once and goes with its last pin (a key pinned twice by two
 * readers: the first unpin keeps it, the second drops it). */
KVO_TEST(retire_hides_pinned_keys_until_the_last_unpin) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, 16 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[4] = {st_key(0, 1), st_key(0, 2), st_key(0, 3), st_key(0, 4)};
    st_put(s, k, 3);
    kvo_slot sl[2];
    kvo_chunk_key two[2] = {k[1], k[1]};
    ASSERT_OK(kvo_store_prepare_load(s, two, 2, sl)); /* k1 pinned twice */
    ASSERT_OK(kvo_store_remove(s, &k[3], 1));          /* absent: fine */
    kvo_chunk_key rt[3] = {k[0], k[1], k[3]};          /* unpinned, pinned, absent */
    ASSERT_OK(kvo_store_retire(s, rt, 3));
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_MISS);
    ASSERT_EQ_INT(st_state(s, k[1]), KVO_MISS); /* hidden while pinned */
    ASSERT_EQ_INT(st_state(s, k[2]), KVO_READY);
    kvo_store_entry e;
    ASSERT_ERR(kvo_store_peek(s, &k[1], &e), KVO_ENOTFOUND);
    ASSERT_ERR(kvo_store_prepare_load(s, &k[1], 1, sl), KVO_ENOTFOUND);
    ASSERT_OK(kvo_store_remove(s, &k[1], 1)); /* gone for callers: not EBUSY */
    uint64_t cur = 0;
    size_t n = 0;
    kvo_store_entry all[8];
    ASSERT_OK(kvo_store_scan(s, &cur, all, 8, &n));
    ASSERT_EQ_U64(n, 2); /* k1's slot is still held: listed, as MISS */
    for (size_t i = 0; i < n; i++)
        ASSERT_EQ_INT(all[i].state, kvo_chunk_key_eq(&all[i].key, &k[1]) ? KVO_MISS : KVO_READY);
    /* a store of the retired key is skipped (its slot is still read) */
    uint8_t need = 9;
    kvo_slot ns;
    ASSERT_OK(kvo_store_prepare_store(s, &k[1], 1, &need, &ns, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 0);
    st_check(s);
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.pinned, 1);
    ASSERT_OK(kvo_store_complete_load(s, &k[1], 1)); /* one reader left */
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.pinned, 1);
    ASSERT_EQ_U64(ss.bytes_used, 2 * 4096);
    st_check(s);
    ASSERT_OK(kvo_store_complete_load(s, &k[1], 1)); /* the last: dropped */
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.pinned, 0);
    ASSERT_EQ_U64(ss.bytes_used, 4096);
    ASSERT_ERR(kvo_store_complete_load(s, &k[1], 1), KVO_ESTATE);
    /* events: 3 stored, 2 removed (k0 at once, k1 at its last unpin) */
    kvo_store_event ev[16];
    size_t ne = kvo_store_drain_events(s, ev, 16, NULL);
    int cnt[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < ne; i++) cnt[ev[i].type]++;
    ASSERT_EQ_INT(cnt[KVO_EVENT_STORED], 3);
    ASSERT_EQ_INT(cnt[KVO_EVENT_REMOVED], 2);
    /* it can be stored again, fresh */
    ASSERT_EQ_U64(st_put(s, &k[1], 1), 0);
    ASSERT_EQ_INT(st_state(s, k[1]), KVO_READY);
    ASSERT_OK(kvo_store_prepare_load(s, &k[1], 1, sl));
    ASSERT_OK(kvo_store_complete_load(s, &k[1], 1));
    ASSERT_ERR(kvo_store_retire(s, NULL, 1), KVO_EINVAL);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(touch_remove_clear_scan_events) {
    kvo_plan *p;
    kvo_store *s = small4(&p, KVO_POLICY_LRU);
    kvo_chunk_key k[6];
    for (int i = 0; i < 6; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 4);
    ASSERT_OK(kvo_store_touch(s, k, 1)); /* k0 now most recent: k1 is the victim */
    kvo_chunk_key absent = st_key(0, 77);
    ASSERT_OK(kvo_store_touch(s, &absent, 1));
    ASSERT_EQ_U64(st_put(s, &k[4], 1), 1);
    ASSERT_EQ_INT(st_state(s, k[1]), KVO_MISS);
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_READY);
    kvo_chunk_key rm[2] = {k[2], absent};
    ASSERT_OK(kvo_store_remove(s, rm, 2));
    ASSERT_EQ_INT(st_state(s, k[2]), KVO_MISS);
    kvo_store_entry all[8];
    size_t n;
    uint64_t cur = 0;
    ASSERT_OK(kvo_store_scan(s, &cur, all, 2, &n));
    ASSERT_EQ_U64(n, 2);
    ASSERT_NE_U64(cur, 0);
    size_t tot = n;
    ASSERT_OK(kvo_store_scan(s, &cur, all + tot, 8 - tot, &n));
    tot += n;
    ASSERT_EQ_U64(cur, 0);
    ASSERT_EQ_U64(tot, 3);
    kvo_slot ld;
    ASSERT_OK(kvo_store_prepare_load(s, &k[3], 1, &ld));
    ASSERT_EQ_U64(kvo_store_clear(s), 1); /* pinned k3 stays */
    ASSERT_EQ_INT(st_state(s, k[3]), KVO_READY);
    ASSERT_EQ_INT(st_state(s, k[0]), KVO_MISS);
    kvo_store_event ev[32];
    uint64_t dropped = 9;
    size_t ne = kvo_store_drain_events(s, ev, 32, &dropped);
    ASSERT_EQ_U64(dropped, 0);
    /* 5 stored, 1 evicted, 1 removed, 2 cleared */
    int cnt[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < ne; i++) cnt[ev[i].type]++;
    ASSERT_EQ_INT(cnt[KVO_EVENT_STORED], 5);
    ASSERT_EQ_INT(cnt[KVO_EVENT_EVICTED], 1);
    ASSERT_EQ_INT(cnt[KVO_EVENT_REMOVED], 3);
    ASSERT_EQ_U64(kvo_store_drain_events(s, ev, 32, NULL), 0);
    ASSERT_OK(kvo_store_complete_load(s, &k[3], 1));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(event_ring_drops_oldest) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 64 * 4096;
    sp.event_capacity = 4;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    kvo_chunk_key k[10];
    for (int i = 0; i < 10; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 10);
    kvo_store_event ev[8];
    uint64_t dropped = 0;
    ASSERT_EQ_U64(kvo_store_drain_events(s, ev, 8, &dropped), 4);
    ASSERT_EQ_U64(dropped, 6);
    ASSERT_TRUE(kvo_chunk_key_eq(&ev[0].key, &k[6]));
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(admission_after_n_lookups) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 64 * 4096;
    sp.admit_after = 2;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    kvo_chunk_key k = st_key(0, 5);
    uint8_t need, st;
    kvo_slot sl;
    ASSERT_OK(kvo_store_prepare_store(s, &k, 1, &need, &sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 0); /* never looked up */
    ASSERT_OK(kvo_store_lookup(s, &k, 1, &st));
    ASSERT_OK(kvo_store_prepare_store(s, &k, 1, &need, &sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 0); /* once */
    ASSERT_OK(kvo_store_lookup(s, &k, 1, &st));
    ASSERT_OK(kvo_store_prepare_store(s, &k, 1, &need, &sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_INT(need, 1); /* twice: admitted */
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.store_not_admitted, 2);
    ASSERT_EQ_U64(ss.stores, 1);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(max_entries_bounds_the_index) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 64 * 4096;
    sp.max_entries = 5;
    kvo_store *s = NULL;
    ASSERT_OK(kvo_store_create(&sp, &s));
    kvo_chunk_key k[8];
    for (int i = 0; i < 8; i++) k[i] = st_key(0, (uint64_t)i);
    ASSERT_EQ_U64(st_put(s, k, 5), 0);
    ASSERT_EQ_U64(st_put(s, &k[5], 3), 3); /* bytes are free, entries are not */
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    ASSERT_OK(kvo_store_get_stats(s, &ss));
    ASSERT_EQ_U64(ss.entries, 5);
    ASSERT_EQ_U64(ss.groups[0].capacity_chunks, 5);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* One slot size: prepare_store hands each victim's slot straight to a new
 * key (store_prepare.c, step 5).  Full store: the new keys get exactly the
 * evicted slots.  Partly full: the victims' slots first, then free ones,
 * never one slot twice (st_check: no overlap, ownership, counters). */
static void handoff_case(size_t held, size_t fresh) {
    static const uint64_t pg[] = {4096};
    kvo_plan *p = st_plan(1, pg);
    kvo_store *s = st_store(p, 8 * 4096, KVO_POLICY_LRU);
    kvo_chunk_key k[16];
    for (int i = 0; i < 16; i++) k[i] = st_key(0, (uint64_t)i);
    ASSERT_EQ_U64(st_put(s, k, held), 0);
    uint8_t need[8];
    kvo_slot sl[8], evs[8];
    kvo_chunk_key ev[8];
    size_t nev = 0;
    ASSERT_OK(kvo_store_prepare_store(s, &k[held], fresh, need, sl, ev, evs, 8, &nev));
    ASSERT_EQ_U64(nev, held + fresh > 8 ? held + fresh - 8 : 0);
    size_t reused = 0;
    for (size_t i = 0; i < fresh; i++) {
        ASSERT_TRUE(need[i]);
        for (size_t j = 0; j < i; j++) ASSERT_TRUE(sl[j].offset != sl[i].offset);
        for (size_t j = 0; j < nev; j++) reused += sl[i].offset == evs[j].offset;
    }
    ASSERT_EQ_U64(reused, nev); /* every evicted slot went to a new key */
    st_check(s);
    ASSERT_OK(kvo_store_complete_store(s, &k[held], fresh, true));
    for (size_t i = 0; i < nev; i++) ASSERT_EQ_U64(st_state(s, ev[i]), KVO_MISS);
    for (size_t i = 0; i < fresh; i++) ASSERT_EQ_U64(st_state(s, k[held + i]), KVO_READY);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(victim_slots_go_to_new_keys_full_store) { handoff_case(8, 3); }
KVO_TEST(victim_slots_go_to_new_keys_then_free_ones) { handoff_case(6, 4); }
