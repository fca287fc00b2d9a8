/*
 * The store's index (index.c): chunk key -> pool entry.  Open addressing,
 * linear probing, backward-shift deletion (no tombstones).  The table is a
 * leaf; the lookups that compare keys read the store's entries and are
 * declared in store_internal.h.
 */
#ifndef KVO_STORE_INDEX_H
#define KVO_STORE_INDEX_H

#include "core/internal.h"

/* Slots hold tag (32 bits of the key hash) << 32 | entry index; empty = ~0. */
typedef struct kvo__index {
    uint64_t *tab;
    uint64_t mask;
    void *base; /* the allocation holding tab (kvo__store_big_alloc) */
} kvo__index;

int kvo__index_init(kvo__index *ix, uint64_t max_items);
/* The store's large arrays (index table, entry pool): n bytes, 64-byte
 * aligned (a 64-byte entry then spans one cache line, not two); from 4 MiB
 * up 2 MiB aligned and advised to use transparent huge pages (at 1e6 keys
 * and more every probe is a TLB miss with 4 KiB pages).  Not zeroed.  Free
 * *base with kvo__free.  NULL when out of memory. */
void *kvo__store_big_alloc(size_t n, void **base);
void kvo__index_free(kvo__index *ix);
#endif
