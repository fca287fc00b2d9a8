/*
 * The instruction count of vLLM's store cycle: exactly bench_store_trace.c's bs_vllm_cycle calls (lookup,
 * prepare_load, complete_load, touch of the prefix hits, prepare_store of
 * the request, complete_store of what it stored), once over the Mooncake
 * trace at 10k blocks on an LRU store.  Not part of the build: a program to
 * run under callgrind, built by hand against the library and the replay
 * loader, from the checkout root:
 *
 *   cc -O2 -g -Iinclude -Ibuild/include -Itools/kvoffload -Ibench bench/cg/bench_store_cycle_cg.c \
 *      bench/bench_store_plan.c tools/kvoffload/replay.c build/libkvoffload.a \
 *      $(pkg-config --libs libxxhash jansson liburing hiredis) -lpthread -lm -o /tmp/cg
 *   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out /tmp/cg \
 *      ../shared/traces/mooncake_synthetic_trace.jsonl
 *   callgrind_annotate --inclusive=yes /tmp/cg.out | grep kvo_store_
 *
 * Prints the hit count (the same as the bench's hit rate) so that a change
 * that alters the cycle's results shows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvoffload/kvo.h"
#include "bench_store.h" /* kvo__bs_plan: the plan of `kvoffload bench store` */
#include "replay.h"

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "../shared/traces/mooncake_synthetic_trace.jsonl";
    rp_trace t;
    char err[256];
    if (rp_trace_load(path, &t, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kvo_chunk_key *keys = malloc((t.nids + 1) * sizeof *keys);
    kvo_chunk_key *todo = malloc((t.maxlen + 1) * sizeof *todo);
    uint8_t *st = malloc(t.maxlen + 1), *need = malloc(t.maxlen + 1);
    kvo_slot *sl = malloc((t.maxlen + 1) * sizeof *sl);
    if (!keys || !todo || !st || !need || !sl) return 1;
    for (size_t i = 0; i < t.nids; i++) keys[i] = rp_trace_key(t.ids[i]);
    kvo_plan *p = kvo__bs_plan();
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 10000 * 4096;
    sp.policy = KVO_POLICY_LRU;
    kvo_store *s = NULL;
    if (!p || kvo_store_create(&sp, &s)) return 1;
    unsigned long long hits = 0;
    int rc = 0;
    for (size_t r = 0; !rc && r < t.nreq; r++) {
        size_t n = t.starts[r + 1] - t.starts[r];
        const kvo_chunk_key *k = keys + t.starts[r];
        if (!n) continue;
        if ((rc = kvo_store_lookup(s, k, n, st))) break;
        size_t h = 0;
        while (h < n && st[h] == KVO_READY) h++;
        if (h && ((rc = kvo_store_prepare_load(s, k, h, sl)) || (rc = kvo_store_complete_load(s, k, h)) ||
                  (rc = kvo_store_touch(s, k, h))))
            break;
        if ((rc = kvo_store_prepare_store(s, k, n, need, sl, NULL, NULL, 0, NULL))) break;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (need[i]) todo[m++] = k[i];
        if (m && (rc = kvo_store_complete_store(s, todo, m, true))) break;
        hits += h;
    }
    printf("rc %d hits %llu of %zu\n", rc, hits, t.nids);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    return rc != 0;
}
