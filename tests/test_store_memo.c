/* The store's memo of the last batch's entries (store.c, "Memo"): a call
 * whose keys match the memo uses it without probing, so every way an entry
 * can change between calls (removed, evicted, reused for another key,
 * cleared, completed as failed) must still give the answer a probe gives. */
#include "store_test_util.h"

/* One 4096-byte group, capacity 4 chunks, LRU. */
static kvo_store *memo_store(kvo_plan **pp) {
    static const uint64_t pg[] = {4096};
    *pp = st_plan(1, pg);
    return st_store(*pp, 4 * 4096, KVO_POLICY_LRU);
}

KVO_TEST(removed_key_is_not_loaded_from_the_memo) {
    kvo_plan *p;
    kvo_store *s = memo_store(&p);
    kvo_chunk_key k[4];
    for (int i = 0; i < 4; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 4);
    uint8_t st[4];
    kvo_slot sl[4];
    ASSERT_OK(kvo_store_lookup(s, k, 4, st));
    for (int i = 0; i < 4; i++) ASSERT_EQ_U64(st[i], KVO_READY);
    ASSERT_OK(kvo_store_remove(s, &k[1], 1));
    ASSERT_EQ_INT(kvo_store_prepare_load(s, k, 4, sl), KVO_ENOTFOUND);
    ASSERT_OK(kvo_store_prepare_load(s, k, 1, sl)); /* the memo's prefix is still right */
    ASSERT_OK(kvo_store_complete_load(s, k, 1));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(entry_reused_for_another_key_is_not_taken) {
    kvo_plan *p;
    kvo_store *s = memo_store(&p);
    kvo_chunk_key k[6];
    for (int i = 0; i < 6; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 4);
    uint8_t st[4];
    kvo_slot sl[4];
    ASSERT_OK(kvo_store_lookup(s, k, 2, st)); /* memo: k0, k1 */
    /* k0 and k1 are the LRU tail: storing k4, k5 evicts them, and their
     * pool entries and slots go to the new keys */
    ASSERT_OK(kvo_store_touch(s, &k[2], 2));
    ASSERT_EQ_U64(st_put(s, &k[4], 2), 2);
    ASSERT_EQ_U64(st_state(s, k[0]), KVO_MISS);
    ASSERT_EQ_U64(st_state(s, k[1]), KVO_MISS);
    ASSERT_EQ_INT(kvo_store_prepare_load(s, k, 2, sl), KVO_ENOTFOUND);
    ASSERT_EQ_INT(kvo_store_complete_load(s, k, 2), KVO_ESTATE);
    ASSERT_OK(kvo_store_touch(s, k, 2)); /* absent keys: nothing to touch */
    ASSERT_OK(kvo_store_lookup(s, k, 2, st));
    ASSERT_EQ_U64(st[0], KVO_MISS);
    ASSERT_EQ_U64(st[1], KVO_MISS);
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(complete_store_after_prepare_in_any_order) {
    kvo_plan *p;
    kvo_store *s = memo_store(&p);
    kvo_chunk_key k[4], r[3];
    for (int i = 0; i < 4; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, &k[0], 1);
    uint8_t need[4];
    kvo_slot sl[4];
    ASSERT_OK(kvo_store_prepare_store(s, k, 4, need, sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_U64(need[0], 0);
    for (int i = 1; i < 4; i++) ASSERT_EQ_U64(need[i], 1);
    /* the memo holds k1, k2, k3 in order; complete them in reverse */
    r[0] = k[3], r[1] = k[2], r[2] = k[1];
    ASSERT_OK(kvo_store_complete_store(s, r, 1, true));
    ASSERT_EQ_U64(st_state(s, k[3]), KVO_READY);
    ASSERT_EQ_U64(st_state(s, k[2]), KVO_PENDING);
    ASSERT_OK(kvo_store_complete_store(s, &r[1], 2, false)); /* failed: k2, k1 removed */
    ASSERT_EQ_U64(st_state(s, k[2]), KVO_MISS);
    ASSERT_EQ_INT(kvo_store_complete_store(s, &k[1], 2, true), KVO_ESTATE);
    /* a repeated key is still refused when the memo matches the first */
    ASSERT_OK(kvo_store_prepare_store(s, &k[1], 1, need, sl, NULL, NULL, 0, NULL));
    kvo_chunk_key twice[2] = {k[1], k[1]};
    ASSERT_EQ_INT(kvo_store_complete_store(s, twice, 2, true), KVO_EINVAL);
    ASSERT_OK(kvo_store_complete_store(s, twice, 1, true));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

KVO_TEST(clear_empties_what_the_memo_names) {
    kvo_plan *p;
    kvo_store *s = memo_store(&p);
    kvo_chunk_key k[3];
    for (int i = 0; i < 3; i++) k[i] = st_key(0, (uint64_t)i);
    st_put(s, k, 3);
    uint8_t st[3];
    kvo_slot sl[3];
    ASSERT_OK(kvo_store_lookup(s, k, 3, st));
    ASSERT_EQ_U64(kvo_store_clear(s), 0); /* none pinned or pending remain */
    ASSERT_EQ_INT(kvo_store_prepare_load(s, k, 3, sl), KVO_ENOTFOUND);
    ASSERT_EQ_U64(st_put(s, k, 3), 0);
    ASSERT_OK(kvo_store_prepare_load(s, k, 3, sl));
    ASSERT_OK(kvo_store_complete_load(s, k, 3));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}

/* The memo remembers a lookup's misses too (the keys, until a key becomes
 * resident): prepare_store of the looked-up batch resolves without probing,
 * and still refuses a key given twice; a key stored between the lookup and
 * the prepare is found present; a key of a bad group is refused by every
 * call whether or not the memo holds the others. */
KVO_TEST(remembered_misses_hold_until_a_store) {
    kvo_plan *p;
    kvo_store *s = memo_store(&p);
    kvo_chunk_key k[3], twice[2];
    for (int i = 0; i < 3; i++) k[i] = st_key(0, (uint64_t)i);
    uint8_t st[3], need[3];
    kvo_slot sl[3];
    twice[0] = twice[1] = k[0];
    ASSERT_OK(kvo_store_lookup(s, twice, 2, st));
    ASSERT_EQ_INT(kvo_store_prepare_store(s, twice, 2, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_EQ_U64(st_state(s, k[0]), KVO_MISS);
    /* lookup misses k0..k2; another batch stores k1; the prepare of k0..k2
     * must not store k1 a second time */
    ASSERT_OK(kvo_store_lookup(s, k, 3, st));
    for (int i = 0; i < 3; i++) ASSERT_EQ_U64(st[i], KVO_MISS);
    ASSERT_OK(kvo_store_lookup(s, k, 3, st)); /* memo: three misses */
    ASSERT_OK(kvo_store_touch(s, k, 3));      /* confirmed misses: nothing to touch */
    ASSERT_OK(kvo_store_prepare_store(s, &k[1], 1, need, sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_U64(need[0], 1);
    ASSERT_OK(kvo_store_complete_store(s, &k[1], 1, true));
    ASSERT_OK(kvo_store_prepare_store(s, k, 3, need, sl, NULL, NULL, 0, NULL));
    ASSERT_EQ_U64(need[0], 1);
    ASSERT_EQ_U64(need[1], 0);
    ASSERT_EQ_U64(need[2], 1);
    kvo_chunk_key todo[2] = {k[0], k[2]};
    ASSERT_OK(kvo_store_complete_store(s, todo, 2, true));
    for (int i = 0; i < 3; i++) ASSERT_EQ_U64(st_state(s, k[i]), KVO_READY);
    /* the same key list with k2 in a group the plan lacks: refused, memo or not */
    ASSERT_OK(kvo_store_lookup(s, k, 3, st));
    kvo_chunk_key bad[3] = {k[0], k[1], st_key(7, 2)};
    ASSERT_EQ_INT(kvo_store_prepare_load(s, bad, 3, sl), KVO_EINVAL);
    ASSERT_EQ_INT(kvo_store_touch(s, bad, 3), KVO_EINVAL);
    ASSERT_EQ_INT(kvo_store_prepare_store(s, bad, 3, need, sl, NULL, NULL, 0, NULL), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_last_error(), "group 7");
    ASSERT_OK(kvo_store_prepare_load(s, k, 2, sl));
    ASSERT_OK(kvo_store_complete_load(s, k, 2));
    st_check(s);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
}
