/* The store's slot -> segment division by multiplication (kvo__slot_seg)
 * against the hardware division, for divisors of every size and dividends
 * at and around each multiple, and at the top of the 32-bit range. */
#include "kvo_test.h"
#include "store/store_internal.h"

static uint32_t seg_of(uint32_t kmax, uint32_t slot) {
    kvo__slots sl;
    memset(&sl, 0, sizeof sl);
    sl.kmax = kmax;
    sl.kmax_m = kmax > 1 ? UINT64_MAX / kmax + 1 : 0;
    return kvo__slot_seg(&sl, slot);
}

KVO_TEST(matches_division) {
    static const uint32_t ds[] = {1, 2, 3, 7, 16, 17, 255, 256, 1000, 4095, 65537, 1u << 20, 3000000, UINT32_MAX / 3,
                                  UINT32_MAX - 1, UINT32_MAX};
    uint64_t x = 12345;
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) {
        uint32_t d = ds[i];
        for (uint32_t k = 0; k < 2000; k++) {
            /* around multiples of d, and random dividends */
            uint64_t m = (uint64_t)d * (k % 64);
            uint32_t cand[4];
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            cand[0] = (uint32_t)x;
            cand[1] = m <= UINT32_MAX ? (uint32_t)m : UINT32_MAX - k;
            cand[2] = m && m - 1 <= UINT32_MAX ? (uint32_t)(m - 1) : k;
            cand[3] = UINT32_MAX - k;
            for (int c = 0; c < 4; c++)
                if (seg_of(d, cand[c]) != cand[c] / d)
                    FAILF("slot %u / kmax %u: got %u, want %u", cand[c], d, seg_of(d, cand[c]), cand[c] / d);
        }
    }
}

/* The plan's segments-per-slots count (kvo__slots_segs, a ceiling) against
 * the division: dividends around each multiple, and past the 32-bit range
 * (the fallback). */
KVO_TEST(segments_for_slots_match_division) {
    static const uint32_t ks[] = {1, 2, 3, 7, 16, 17, 255, 256, 1000, 4095, 65537, 1u << 20};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        kvo__slots sl;
        memset(&sl, 0, sizeof sl);
        sl.cls_k[0] = ks[i];
        sl.cls_k_m[0] = ks[i] > 1 ? UINT64_MAX / ks[i] + 1 : 0;
        for (uint64_t j = 0; j < 3000; j++) {
            uint64_t cand[3] = {j, (uint64_t)ks[i] * (j % 97) + j % 3, (uint64_t)UINT32_MAX - j * 7 + (j % 5) * 4};
            for (int c = 0; c < 3; c++) {
                uint64_t want = kvo__div_ceil_u64(cand[c], ks[i]), got = kvo__slots_segs(&sl, 0, cand[c]);
                if (got != want)
                    FAILF("ceil(%llu / %u): got %llu, want %llu", (unsigned long long)cand[c], ks[i],
                          (unsigned long long)got, (unsigned long long)want);
            }
        }
    }
}
