/*
 * Engine block pools: the paged KV memory of one group, with an engine-side
 * prefix cache.
 *
 * Layout.  num_blocks blocks; layer l's page of block b lives at
 * mem + (l * num_blocks + b) * page_bytes, so each layer is one kvo_segment
 * (stride = page) that the transfer engine can gather from and scatter to.
 * The memory is allocated once and touched at creation.
 *
 * Ownership.  ref[b] counts the requests holding block b.  A block with
 * ref 0 sits in the LRU list: blocks without a hash at the head (reused
 * first), cached blocks (full blocks with a prefix hash) at the tail in
 * release order, so reuse evicts the least recently released cached block.
 * A cached block can be found by hash (chained buckets) and taken back by a
 * new request whose prefix matches; taking it removes it from the LRU.
 *
 * Invariants: a block is in the LRU iff ref == 0; a block is in the hash
 * index iff hashed; at most one block per hash.  Every operation is O(1)
 * except the bucket walk (short: buckets >= 2 * num_blocks) and
 * drop_cached (a forced eviction, O(num_blocks)).
 */
#include "engine_internal.h"

#define NIL KVO_ENG_NULL_BLOCK

static uint64_t kvo__bucket_of(const kvo__eng_pool *p, uint64_t lo, uint64_t hi) {
    return kvo__eng_mix64(lo ^ (hi * 0x9e3779b97f4a7c15ULL)) & (p->n_buckets - 1);
}

static void kvo__lru_unlink(kvo__eng_pool *p, uint64_t b) {
    uint64_t pr = p->prev[b], nx = p->next[b];
    if (pr != NIL) p->next[pr] = nx; else p->lru_head = nx;
    if (nx != NIL) p->prev[nx] = pr; else p->lru_tail = pr;
    p->prev[b] = p->next[b] = NIL;
    p->n_free--;
}

static void kvo__lru_push_head(kvo__eng_pool *p, uint64_t b) {
    p->prev[b] = NIL;
    p->next[b] = p->lru_head;
    if (p->lru_head != NIL) p->prev[p->lru_head] = b; else p->lru_tail = b;
    p->lru_head = b;
    p->n_free++;
}

static void kvo__lru_push_tail(kvo__eng_pool *p, uint64_t b) {
    p->next[b] = NIL;
    p->prev[b] = p->lru_tail;
    if (p->lru_tail != NIL) p->next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->n_free++;
}

static void kvo__unhash(kvo__eng_pool *p, uint64_t b) {
    if (!p->hashed[b]) return;
    uint64_t *pp = &p->bucket[kvo__bucket_of(p, p->hlo[b], p->hhi[b])];
    while (*pp != b) {
        assert(*pp != NIL);
        pp = &p->chain[*pp];
    }
    *pp = p->chain[b];
    p->chain[b] = NIL;
    p->hashed[b] = false;
}

int kvo__eng_pool_init(kvo__eng_pool *p, uint32_t group, const kvo_eng_group_cfg *g, uint64_t page_bytes,
                       uint64_t num_blocks) {
    memset(p, 0, sizeof *p);
    p->group = group;
    p->kind = g->kind;
    p->tpb = g->tokens_per_block;
    p->layers = g->layers;
    p->window = g->window;
    p->page_bytes = page_bytes;
    p->num_blocks = num_blocks;
    p->n_buckets = 1;
    while (p->n_buckets < 2 * num_blocks) p->n_buckets <<= 1;
    uint64_t bytes = (uint64_t)g->layers * num_blocks * page_bytes;
    p->mem = aligned_alloc(4096, (bytes + 4095) & ~4095ull);
    p->ref = calloc(num_blocks, sizeof *p->ref);
    p->prev = malloc(num_blocks * sizeof *p->prev);
    p->next = malloc(num_blocks * sizeof *p->next);
    p->hashed = calloc(num_blocks, sizeof *p->hashed);
    p->hlo = calloc(num_blocks, sizeof *p->hlo);
    p->hhi = calloc(num_blocks, sizeof *p->hhi);
    p->chain = malloc(num_blocks * sizeof *p->chain);
    p->bucket = malloc(p->n_buckets * sizeof *p->bucket);
    if (!p->mem || !p->ref || !p->prev || !p->next || !p->hashed || !p->hlo || !p->hhi || !p->chain || !p->bucket) {
        kvo__eng_pool_free(p);
        return kvo__eng_error(KVO_ENOMEM, "engine group '%s': out of memory for %llu blocks (%llu bytes)", g->name,
                              (unsigned long long)num_blocks, (unsigned long long)bytes);
    }
    memset(p->mem, 0, (bytes + 4095) & ~4095ull);
    for (uint64_t i = 0; i < p->n_buckets; i++) p->bucket[i] = NIL;
    p->lru_head = p->lru_tail = NIL;
    for (uint64_t b = num_blocks; b-- > 0;) {
        p->chain[b] = NIL;
        kvo__lru_push_head(p, b);
    }
    return 0;
}

void kvo__eng_pool_free(kvo__eng_pool *p) {
    free(p->mem);
    free(p->ref);
    free(p->prev);
    free(p->next);
    free(p->hashed);
    free(p->hlo);
    free(p->hhi);
    free(p->chain);
    free(p->bucket);
    memset(p, 0, sizeof *p);
}

int kvo__eng_pool_alloc(kvo__eng_pool *p, uint64_t *block) {
    uint64_t b = p->lru_head;
    if (b == NIL) return kvo__eng_error(KVO_ENOSPC, "engine group %u: all %llu blocks are held", p->group,
                                        (unsigned long long)p->num_blocks);
    kvo__lru_unlink(p, b);
    if (p->hashed[b]) {
        kvo__unhash(p, b);
        p->evictions++;
    }
    p->ref[b] = 1;
    *block = b;
    return 0;
}

void kvo__eng_pool_release(kvo__eng_pool *p, uint64_t b) {
    assert(b < p->num_blocks && p->ref[b] > 0);
    if (--p->ref[b]) return;
    if (p->hashed[b]) kvo__lru_push_tail(p, b);
    else kvo__lru_push_head(p, b);
}

uint64_t kvo__eng_pool_find(const kvo__eng_pool *p, uint64_t lo, uint64_t hi) {
    for (uint64_t b = p->bucket[kvo__bucket_of(p, lo, hi)]; b != NIL; b = p->chain[b])
        if (p->hlo[b] == lo && p->hhi[b] == hi) return b;
    return NIL;
}

void kvo__eng_pool_take(kvo__eng_pool *p, uint64_t b) {
    assert(b < p->num_blocks && p->hashed[b]);
    if (p->ref[b] == 0) kvo__lru_unlink(p, b);
    p->ref[b]++;
}

void kvo__eng_pool_set_hash(kvo__eng_pool *p, uint64_t b, uint64_t lo, uint64_t hi) {
    assert(b < p->num_blocks && p->ref[b] > 0);
    if (p->hashed[b] || kvo__eng_pool_find(p, lo, hi) != NIL) return;
    p->hlo[b] = lo;
    p->hhi[b] = hi;
    p->hashed[b] = true;
    uint64_t *head = &p->bucket[kvo__bucket_of(p, lo, hi)];
    p->chain[b] = *head;
    *head = b;
}

void kvo__eng_pool_drop_cached(kvo__eng_pool *p) {
    for (uint64_t b = 0; b < p->num_blocks; b++)
        if (p->ref[b] == 0 && p->hashed[b]) {
            kvo__unhash(p, b);
            kvo__lru_unlink(p, b);
            kvo__lru_push_head(p, b);
        }
}
