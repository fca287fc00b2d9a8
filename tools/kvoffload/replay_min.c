/*
 * Belady's MIN for `kvoffload replay`: the offline optimal hit count at a
 * capacity, computed exactly from the future of the trace.
 *
 * Model (the store's): per request, the prefix hits are its leading cached
 * blocks; then all its blocks are stored, in batches of at most the
 * capacity, and the blocks of the batch cannot be evicted to make room for
 * it.  MIN evicts, among the other cached blocks, the one whose next
 * reference is furthest in the future (never = furthest of all).
 *
 * Time is the position of a reference in the flattened trace, not the
 * request number: key k+1 of a request is referenced just after key k, so a
 * child's next use is always later than its parent's and MIN cuts prefixes
 * from their leaves.  (With request numbers, parent and child tie, and a
 * tie-break that drops the parent first wastes the child: that variant gives
 * 0.6157 at 10k blocks on the Mooncake synthetic trace, the exact one 0.6174.)
 * With that order every cached block's prefix is cached too, so a prefix hit
 * is a plain hit and the classic exchange argument makes MIN optimal; the
 * tests check it against a brute-force search on small traces.
 *
 * Layout: next[i] (next reference of the same block after position i) is
 * computed backwards in one pass; a binary max-heap of (next use, block)
 * with lazy deletion (an entry is current when it matches key[block]) gives
 * the victim.  O(N log N) time, O(N) memory.
 */
#include <stdlib.h>
#include <string.h>

#include "replay.h"

#define RP_NEVER UINT64_MAX

typedef struct rp_heap {
    uint64_t *v; /* (next use << 0) and block packed in two arrays */
    uint32_t *b;
    size_t n;
} rp_heap;

static void rp_heap_push(rp_heap *h, uint64_t v, uint32_t b) {
    size_t i = h->n++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h->v[p] >= v) break;
        h->v[i] = h->v[p];
        h->b[i] = h->b[p];
        i = p;
    }
    h->v[i] = v;
    h->b[i] = b;
}

static void rp_heap_pop(rp_heap *h, uint64_t *v, uint32_t *b) {
    *v = h->v[0];
    *b = h->b[0];
    uint64_t lv = h->v[--h->n];
    uint32_t lb = h->b[h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->v[c + 1] > h->v[c]) c++;
        if (h->v[c] <= lv) break;
        h->v[i] = h->v[c];
        h->b[i] = h->b[c];
        i = c;
    }
    h->v[i] = lv;
    h->b[i] = lb;
}

int rp_replay_min(const rp_trace *t, uint64_t cap, rp_result *out) {
    memset(out, 0, sizeof *out);
    size_t nd = t->ndistinct ? t->ndistinct : 1, N = t->nids;
    uint64_t *next = malloc((N ? N : 1) * sizeof *next), *key = malloc(nd * sizeof *key);
    uint64_t *batch = malloc(nd * sizeof *batch);  /* batch number + 1 a block was last stored in */
    size_t hcap = N + nd + 1;
    rp_heap h = {malloc(hcap * sizeof *h.v), malloc(hcap * sizeof *h.b), 0};
    rp_heap stash = {malloc((t->maxlen + 1) * sizeof *h.v), malloc((t->maxlen + 1) * sizeof *h.b), 0};
    int rc = 0;
    if (!next || !key || !batch || !h.v || !h.b || !stash.v || !stash.b) rc = KVO_ENOMEM;
    if (!rc) {
        for (size_t d = 0; d < nd; d++) key[d] = RP_NEVER;   /* reused below as "last seen" */
        for (size_t i = N; i-- > 0;) {
            next[i] = key[t->ids[i]];
            key[t->ids[i]] = i;
        }
        for (size_t d = 0; d < nd; d++) key[d] = 0, batch[d] = 0; /* 0: not cached; else next use + 1 */
    }
    uint64_t cached = 0, nbatch = 0;
    for (size_t r = 0; !rc && r < t->nreq; r++) {
        size_t s0 = t->starts[r], len = t->starts[r + 1] - s0, hits = 0;
        while (hits < len && key[t->ids[s0 + hits]]) hits++;
        out->hits += hits;
        for (size_t b = 0; b < len; b += cap) {
            size_t nb = len - b < cap ? len - b : (size_t)cap;
            nbatch++;
            for (size_t i = s0 + b; i < s0 + b + nb; i++) {
                uint32_t d = t->ids[i];
                if (!key[d]) cached++;
                uint64_t v = next[i] == RP_NEVER ? RP_NEVER - 1 : next[i];
                key[d] = v + 1;
                batch[d] = nbatch;
                if (h.n == hcap) { /* compact: drop stale entries */
                    size_t w = 0;
                    for (size_t j = 0; j < h.n; j++)
                        if (key[h.b[j]] == h.v[j] + 1) h.v[w] = h.v[j], h.b[w++] = h.b[j];
                    size_t m = w;
                    h.n = 0;
                    for (size_t j = 0; j < m; j++) rp_heap_push(&h, h.v[j], h.b[j]);
                }
                rp_heap_push(&h, v, d);
            }
            while (cached > cap && h.n) {
                uint64_t v;
                uint32_t d;
                rp_heap_pop(&h, &v, &d);
                if (key[d] != v + 1) continue;          /* stale */
                if (batch[d] == nbatch) {               /* in this batch: keep */
                    rp_heap_push(&stash, v, d);
                    continue;
                }
                key[d] = 0;
                cached--;
                out->evictions++;
            }
            while (stash.n) {
                uint64_t v;
                uint32_t d;
                rp_heap_pop(&stash, &v, &d);
                rp_heap_push(&h, v, d);
            }
        }
    }
    out->blocks = N;
    free(next); free(key); free(batch); free(h.v); free(h.b); free(stash.v); free(stash.b);
    return rc;
}
