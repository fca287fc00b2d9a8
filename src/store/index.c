/*
 * The store's index: chunk key -> entry.
 *
 * Layout: one preallocated power-of-two table of 64-bit slots, each
 * (tag << 32 | entry index) with tag = the low 32 bits of the key's mixed
 * hash, or ~0 when empty.  The tag holds the home position (tag & mask, as
 * long as the table has at most 2^32 slots), so moving slots during deletion
 * never reads an entry, and its bits above the mask filter candidates.  The
 * table has at least four times as many slots as the entry pool (resident
 * entries + ghosts; KVO__INDEX_SLOTS_PER_ITEM, key_mix.h says why), so the
 * load factor stays <= 0.25 and linear probing averages ~1.2 probes for a hit
 * and ~1.4 for a miss.
 * The tag filters almost every non-matching slot without touching the entry;
 * the full key is compared in the entry.
 *
 * Deletion is by backward shift (Knuth 6.4, algorithm R): the slots after the
 * removed one that would be closer to their home are moved back, so there are
 * no tombstones, probe lengths never degrade with churn, and each entry's
 * table position (entry.tpos) stays exact, which makes removal O(1) expected
 * without a search.
 *
 * Why not the general map (src/core/hmap.c): the key (128-bit hash plus
 * group) does not fit its two words, and keeping keys in the pool entries
 * makes a slot 8 bytes instead of 32; only the shift test is shared.
 *
 * Nothing here allocates after kvo__index_init.  kvo__key_mix fully mixes
 * the key (hash lo/hi and group), so structured keys (sequential unit hashes
 * handed in by an engine) probe as well as XXH3 outputs.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "core/hmap.h"
#include "store/store_internal.h"

#define KVO__IX_EMPTY UINT64_MAX

void *kvo__store_big_alloc(size_t n, void **base) {
    const size_t huge = (size_t)2 << 20;
    size_t align = n >= 2 * huge ? huge : 64;
    if (n > SIZE_MAX - align) return NULL;
    unsigned char *b = kvo__malloc(n + align);
    *base = b;
    if (!b) return NULL;
    unsigned char *p = b + (align - (uintptr_t)b % align) % align;
#ifdef MADV_HUGEPAGE
    /* advisory: an error (old kernel, memory from a custom allocator that
     * cannot take the advice) leaves 4 KiB pages, nothing worse */
    if (align == huge) (void)madvise(p, n / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

int kvo__index_init(kvo__index *ix, uint64_t max_items) {
    uint64_t n = 16;
    while (n < max_items * KVO__INDEX_SLOTS_PER_ITEM) {
        if (n >= (UINT64_C(1) << 32)) return kvo__error(KVO_ERANGE, "store index: %llu entries is too many",
                                                       (unsigned long long)max_items);
        n <<= 1;
    }
    ix->tab = kvo__store_big_alloc((size_t)n * sizeof *ix->tab, &ix->base);
    if (!ix->tab)
        return kvo__error(KVO_ENOMEM, "store index: cannot allocate %llu bytes", (unsigned long long)(n * 8));
    memset(ix->tab, 0xFF, (size_t)n * sizeof *ix->tab);
    ix->mask = n - 1;
    return 0;
}

void kvo__index_free(kvo__index *ix) {
    kvo__free(ix->base);
    ix->base = NULL;
    ix->tab = NULL;
}

uint32_t kvo__index_find(kvo_store *s, const kvo_chunk_key *k) { return kvo__index_find_h(s, k, kvo__key_mix(k)); }

uint32_t kvo__index_find_h(kvo_store *s, const kvo_chunk_key *k, uint64_t h) {
    const kvo__index *ix = &s->ix;
    uint64_t tag = h & 0xFFFFFFFFu;
    for (uint64_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        uint64_t v = ix->tab[i];
        if (v == KVO__IX_EMPTY) return KVO__NIL;
        if ((v >> 32) == tag) {
            uint32_t e = (uint32_t)v;
            if (kvo_chunk_key_eq(&s->ent[e].key, k)) return e;
        }
    }
}

void kvo__index_insert(kvo_store *s, uint32_t e, uint64_t h) {
    kvo__index *ix = &s->ix;
    assert(h == kvo__key_mix(&s->ent[e].key));
    uint64_t i = h & ix->mask;
    while (ix->tab[i] != KVO__IX_EMPTY) i = (i + 1) & ix->mask;
    ix->tab[i] = ((h & 0xFFFFFFFFu) << 32) | e;
    s->ent[e].tpos = (uint32_t)i;
}

void kvo__index_remove(kvo_store *s, uint32_t e) {
    kvo__index *ix = &s->ix;
    uint64_t i = s->ent[e].tpos;
    assert((uint32_t)ix->tab[i] == e);
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & ix->mask;
        uint64_t v = ix->tab[j];
        if (v == KVO__IX_EMPTY) break;
        uint32_t x = (uint32_t)v;
        uint64_t home = (v >> 32) & ix->mask;
        /* move x back to i if home is not cyclically in (i, j] */
        if (!kvo__hmap_stays(i, home, j)) {
            ix->tab[i] = v;
            s->ent[x].tpos = (uint32_t)i;
            i = j;
        }
    }
    ix->tab[i] = KVO__IX_EMPTY;
}
