/*
 * Workloads for the reference engine, derived from the Mooncake trace
 * (FAST '25, kvcache-ai/Mooncake, Apache-2.0; see data/mooncake_sample.md).
 *
 * Each trace line is {"input_length", "output_length", "hash_ids": [...]},
 * where hash_ids are prefix-chained ids of 512-token blocks: two requests that
 * share an id share those 512 tokens and everything before them.  We scale a
 * 512-token block down to tokens_per_trace_block tokens whose ids come from
 * splitmix64 keyed by (seed, block id, index), so shared ids give identical
 * token prefixes and different ids almost surely differ.  The last id of a
 * request may cover a partial block: it gets the scaled share of the tokens.
 *
 * Selection.  Consecutive trace lines rarely share prefixes (conversations
 * are spread over time), so we keep whole conversations: requests are grouped
 * by their first block id; conversations with at least min_turns requests are
 * taken in order of first appearance, all their turns, and the result is put
 * back in trace order and cut at max_requests.  The grouping sorts line
 * numbers by (first block id, line): O(n log n) for a trace of n lines.  Prompts are capped at
 * max_trace_blocks blocks (a prefix, so sharing is kept).
 *
 * Without a trace, the same code runs on synthetic conversations: each turn
 * repeats the previous turn's blocks and appends new ones, and conversations
 * are interleaved so that a later turn finds its prefix in the tiers only.
 */
#include <errno.h>
#include <sys/stat.h>

#include <jansson.h>

#include "engine_internal.h"

typedef struct kvo__trace_rec {
    uint64_t *ids;
    uint32_t n_ids;
    uint64_t input_len, output_len;
    uint64_t root;
} kvo__trace_rec;

kvo_eng_workload_params kvo_eng_workload_default_params(void) {
    kvo_eng_workload_params p;
    memset(&p, 0, sizeof p);
    p.max_requests = 48;
    p.tokens_per_trace_block = 16;
    p.max_trace_blocks = 48;
    p.max_new_tokens = 4;
    p.min_turns = 3;
    p.vocab = 512;
    p.seed = 7;
    return p;
}

static void kvo__recs_free(kvo__trace_rec *r, size_t n) {
    for (size_t i = 0; i < n; i++) free(r[i].ids);
    free(r);
}

static int kvo__parse_trace(const char *path, kvo__trace_rec **out, size_t *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) return kvo__eng_error(KVO_EIO, "workload: cannot open trace '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode)) {
        fclose(f);
        return kvo__eng_error(KVO_EINVAL, "workload: trace '%s' is %s, expected a JSONL file", path,
                              S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
    }
    size_t cap = 256, n = 0, line_no = 0;
    kvo__trace_rec *recs = malloc(cap * sizeof *recs);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = recs ? 0 : kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
    while (!rc && (len = getline(&line, &lcap, f)) >= 0) {
        line_no++;
        if (len <= 1) continue;
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)len, 0, &jerr);
        json_t *ids = o ? json_object_get(o, "hash_ids") : NULL;
        json_t *il = o ? json_object_get(o, "input_length") : NULL;
        json_t *ol = o ? json_object_get(o, "output_length") : NULL;
        if (!o || !json_is_array(ids) || !json_array_size(ids) || !json_is_integer(il) || !json_is_integer(ol) ||
            json_integer_value(il) <= 0 || json_integer_value(ol) < 0) {
            rc = kvo__eng_error(KVO_EPARSE,
                                "workload: %s line %zu: expected {\"input_length\": >0, \"output_length\": >=0, "
                                "\"hash_ids\": [...]}%s%s",
                                path, line_no, o ? "" : ": ", o ? "" : jerr.text);
            json_decref(o);
            break;
        }
        if (n == cap) {
            kvo__trace_rec *nr = realloc(recs, 2 * cap * sizeof *recs);
            if (!nr) {
                json_decref(o);
                rc = kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
                break;
            }
            recs = nr;
            cap *= 2;
        }
        kvo__trace_rec *r = &recs[n];
        r->n_ids = (uint32_t)json_array_size(ids);
        r->ids = malloc(r->n_ids * sizeof *r->ids);
        r->input_len = (uint64_t)json_integer_value(il);
        r->output_len = (uint64_t)json_integer_value(ol);
        if (!r->ids) rc = kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
        for (uint32_t i = 0; !rc && i < r->n_ids; i++) {
            json_t *v = json_array_get(ids, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0)
                rc = kvo__eng_error(KVO_EPARSE, "workload: %s line %zu: hash_ids[%u] is not a non-negative integer",
                                    path, line_no, i);
            else r->ids[i] = (uint64_t)json_integer_value(v);
        }
        json_decref(o);
        if (rc) {
            free(r->ids);
            break;
        }
        r->root = r->ids[0];
        n++;
    }
    free(line);
    fclose(f);
    if (rc) {
        kvo__recs_free(recs, n);
        return rc;
    }
    *out = recs;
    *n_out = n;
    return 0;
}

/* Synthetic conversations, built to exercise every tier under memory
 * pressure: 3 turns each, 6 new blocks per turn on an 8-block system prompt
 * of the conversation's own, and the conversations interleaved turn by turn
 * (every conversation's turn 1, then every turn 2, ...).  Between two turns
 * of one conversation all the others run, so its blocks have left the
 * engine's cache (and, with enough conversations, the host tier) and must come
 * back from the tiers: with consecutive turns the engine would reuse its own
 * blocks and no tier would ever be read. */
static int kvo__synthetic(size_t max_requests, kvo__trace_rec **out, size_t *n_out) {
    size_t n = max_requests ? max_requests : 1, turns = 3;
    size_t convs = (n + turns - 1) / turns;
    kvo__trace_rec *recs = calloc(n, sizeof *recs);
    if (!recs) return kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
    uint64_t next_id = 1;
    for (size_t i = 0; i < n; i++) {
        size_t turn = i / convs;
        uint32_t nb = 8 + 6 * (uint32_t)(turn + 1);
        kvo__trace_rec *r = &recs[i];
        const kvo__trace_rec *prev = turn > 0 ? &recs[i - convs] : NULL; /* same conversation, previous turn */
        r->ids = malloc(nb * sizeof *r->ids);
        if (!r->ids) {
            kvo__recs_free(recs, i);
            return kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
        }
        for (uint32_t b = 0; b < nb; b++) {
            if (prev && b < prev->n_ids) r->ids[b] = prev->ids[b];
            else r->ids[b] = next_id++;
        }
        r->n_ids = nb;
        r->input_len = (uint64_t)nb * 512 - 100;
        r->output_len = 8;
        r->root = r->ids[0];
    }
    *out = recs;
    *n_out = n;
    return 0;
}

static int kvo__cmp_line(const void *a, const void *b, void *ops) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    (*(uint64_t *)ops)++;
    return x < y ? -1 : x > y;
}

/* Conversation selection over a sorted index, O(n log n) (a 200k-line trace
 * took 9.4 s with the former scan of every root per line).  ix[] holds the
 * line numbers sorted by (root, line): each conversation is one run of it,
 * its first line the run's head; the runs are then ordered by that head. */
typedef struct kvo__conv {
    size_t first, start, count; /* first line; the run ix[start .. start+count) */
} kvo__conv;

typedef struct kvo__sort_ctx {
    const uint64_t *roots;
    uint64_t *ops;
} kvo__sort_ctx;

static int kvo__cmp_root_line(const void *a, const void *b, void *ctx) {
    const kvo__sort_ctx *c = ctx;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    uint64_t rx = c->roots[x], ry = c->roots[y];
    (*c->ops)++;
    return rx != ry ? (rx < ry ? -1 : 1) : (x < y ? -1 : x > y);
}

static int kvo__cmp_conv(const void *a, const void *b, void *ctx) {
    const kvo__conv *x = a, *y = b;
    (*(uint64_t *)ctx)++;
    return x->first < y->first ? -1 : x->first > y->first;
}

int kvo__eng_select_conversations(const uint64_t *roots, size_t n, uint32_t min_turns, size_t max_requests,
                                  size_t *sel, size_t *n_sel, uint64_t *ops) {
    uint64_t ops_local = 0, *op = ops ? ops : &ops_local;
    *op = 0;
    *n_sel = 0;
    if (!n) return 0;
    size_t *ix = malloc(n * sizeof *ix);
    kvo__conv *conv = malloc(n * sizeof *conv);
    if (!ix || !conv) {
        free(ix);
        free(conv);
        return kvo__eng_error(KVO_ENOMEM, "workload: out of memory grouping %zu lines", n);
    }
    for (size_t i = 0; i < n; i++) ix[i] = i;
    qsort_r(ix, n, sizeof *ix, kvo__cmp_root_line, &(kvo__sort_ctx){roots, op});
    size_t n_conv = 0;
    for (size_t i = 0; i < n; i++, (*op)++) {
        if (i && roots[ix[i]] == roots[ix[i - 1]]) {
            conv[n_conv - 1].count++;
            continue;
        }
        conv[n_conv++] = (kvo__conv){ix[i], i, 1};
    }
    qsort_r(conv, n_conv, sizeof *conv, kvo__cmp_conv, op);
    /* whole conversations in order of first appearance until max_requests is
     * reached, then back in trace order and cut */
    for (size_t k = 0; k < n_conv && *n_sel < max_requests; k++, (*op)++) {
        if (conv[k].count < min_turns) continue;
        for (size_t i = 0; i < conv[k].count; i++, (*op)++) sel[(*n_sel)++] = ix[conv[k].start + i];
    }
    qsort_r(sel, *n_sel, sizeof *sel, kvo__cmp_line, op);
    if (*n_sel > max_requests) *n_sel = max_requests;
    free(ix);
    free(conv);
    return 0;
}

int kvo_eng_workload_load(const kvo_eng_workload_params *prm, kvo_eng_workload **out) {
    if (!out) return kvo__eng_error(KVO_EINVAL, "kvo_eng_workload_load: out is NULL");
    kvo_eng_workload_params p = prm ? *prm : kvo_eng_workload_default_params();
    if (!p.max_requests || !p.tokens_per_trace_block || !p.max_trace_blocks || !p.max_new_tokens || p.vocab < 2)
        return kvo__eng_error(KVO_EINVAL, "workload: max_requests, tokens_per_trace_block, max_trace_blocks, "
                                          "max_new_tokens must be >= 1 and vocab >= 2");
    kvo__trace_rec *recs = NULL;
    size_t n = 0;
    int rc = p.trace_path ? kvo__parse_trace(p.trace_path, &recs, &n) : kvo__synthetic(p.max_requests, &recs, &n);
    if (rc) return rc;
    /* whole conversations with >= min_turns lines (see kvo__eng_select_conversations) */
    size_t *sel = malloc((n ? n : 1) * sizeof *sel), n_sel = 0;
    uint64_t *roots = malloc((n ? n : 1) * sizeof *roots);
    if (!sel || !roots) rc = kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
    for (size_t i = 0; !rc && i < n; i++) roots[i] = recs[i].root;
    uint32_t min_turns = p.trace_path ? p.min_turns : 1;
    if (!rc) rc = kvo__eng_select_conversations(roots, n, min_turns, p.max_requests, sel, &n_sel, NULL);
    if (!rc && !n_sel)
        rc = kvo__eng_error(KVO_ENOTFOUND, "workload: no conversation in '%s' has >= %u turns",
                            p.trace_path ? p.trace_path : "(synthetic)", min_turns);
    kvo_eng_workload *w = NULL;
    if (!rc) {
        w = calloc(1, sizeof *w);
        uint64_t total = 0;
        for (size_t s = 0; s < n_sel; s++) {
            const kvo__trace_rec *r = &recs[sel[s]];
            uint32_t nb = r->n_ids < p.max_trace_blocks ? r->n_ids : p.max_trace_blocks;
            total += (uint64_t)nb * p.tokens_per_trace_block;
        }
        if (w) {
            w->reqs = calloc(n_sel, sizeof *w->reqs);
            w->tokens = malloc((total ? total : 1) * sizeof *w->tokens);
        }
        if (!w || !w->reqs || !w->tokens) rc = kvo__eng_error(KVO_ENOMEM, "workload: out of memory");
        uint64_t off = 0;
        const uint32_t tptb = p.tokens_per_trace_block;
        for (size_t s = 0; !rc && s < n_sel; s++) {
            const kvo__trace_rec *r = &recs[sel[s]];
            uint32_t nb = r->n_ids, len;
            if (nb > p.max_trace_blocks) {
                nb = p.max_trace_blocks;
                len = nb * tptb;
            } else {
                uint64_t scaled = (r->input_len * tptb + 511) / 512; /* ceil */
                uint64_t lo = (uint64_t)(nb - 1) * tptb + 1, hi = (uint64_t)nb * tptb;
                len = (uint32_t)(scaled < lo ? lo : scaled > hi ? hi : scaled);
            }
            if (len < 2) len = 2 > nb * tptb ? nb * tptb : 2;
            uint32_t *toks = w->tokens + off;
            for (uint32_t t = 0; t < len; t++) {
                uint64_t id = r->ids[t / tptb];
                uint64_t st = p.seed * 0x9e3779b97f4a7c15ULL ^ (id * 0xd1b54a32d192ed03ULL) ^ ((t % tptb) + 1);
                toks[t] = (uint32_t)(kvo__eng_mix64(kvo__eng_mix64(st)) % p.vocab);
            }
            kvo_eng_request *q = &w->reqs[s];
            q->id = sel[s];
            q->prompt = toks;
            q->prompt_len = len;
            uint64_t gen = r->output_len ? r->output_len : 1;
            q->max_new = (uint32_t)(gen < p.max_new_tokens ? gen : p.max_new_tokens);
            off += len;
            w->prompt_tokens += len;
            if (len > w->max_prompt) w->max_prompt = len;
            if (q->max_new > w->max_new) w->max_new = q->max_new;
        }
        if (!rc) {
            w->n = n_sel;
            snprintf(w->source, sizeof w->source, "%s", p.trace_path ? p.trace_path : "synthetic conversations");
        }
    }
    free(sel);
    free(roots);
    kvo__recs_free(recs, n);
    if (rc) {
        kvo_eng_workload_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

void kvo_eng_workload_free(kvo_eng_workload *w) {
    if (!w) return;
    free(w->reqs);
    free(w->tokens);
    free(w);
}
