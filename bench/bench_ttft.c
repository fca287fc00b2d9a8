/*
 * `kvoffload bench ttft`: time to first token of the reference engine for a
 * long shared prefix, recomputed vs loaded from the host tier vs loaded from
 * the file tier (after a restart: a new connector with an empty host tier on
 * the same directory).  Ratios are against the recompute time measured in the
 * same run; the goal is loading >= 10x faster than recomputing.
 *
 *   kvoffload bench ttft [--json] [--tokens N] [--shape NAME] [--file-dir DIR]
 */
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"
#include "kvo_engine.h"
#include "kvo_engine_offload.h"

static int kvo__bt_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int kvo__bt_run(kvo_eng *e, kvo_eng_conn *conn, const uint32_t *prompt, uint32_t n, uint64_t id,
                       kvo_eng_result *res) {
    kvo_eng_request q = {id, prompt, n, 1};
    kvo_eng_run_params p = kvo_eng_run_default_params();
    p.prefill_chunk = 256;
    p.offload = conn ? kvo_eng_conn_offload(conn) : NULL;
    p.release_align = conn ? (uint32_t)kvo_eng_conn_chunk_tokens(conn) : 0;
    memset(res, 0, sizeof *res);
    int rc = kvo_eng_run(e, &q, 1, &p, res);
    if (rc) fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
    return rc;
}

int kvo_bench_ttft(int argc, char **argv, const kvo_bench_out *o) {
    uint64_t tokens = 8192, chunk = 256;
    const char *shape = "hybrid-state", *dir_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(argv[i], "--tokens")) rc = kvo_cli_parse_u64("--tokens", v, 256, 1u << 20, &tokens), i++;
        else if (!strcmp(argv[i], "--chunk-tokens")) rc = kvo_cli_parse_u64("--chunk-tokens", v, 1, 1u << 20, &chunk), i++;
        else if (!strcmp(argv[i], "--shape") && v) shape = argv[++i];
        else if (!strcmp(argv[i], "--file-dir") && v) dir_arg = argv[++i];
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: kvoffload bench ttft [--json] [--tokens N (8192)] [--shape NAME (hybrid-state)]\n"
                   "                            [--chunk-tokens N (256)] [--file-dir DIR]\n");
            return 0;
        } else {
            fprintf(stderr, "kvoffload bench ttft: unknown option '%s'\n", argv[i]);
            return KVO_EXIT_USAGE;
        }
        if (rc) return rc;
    }
    kvo_eng_config cfg;
    if (kvo_eng_shape_config(shape, &cfg)) {
        fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
        return KVO_EXIT_USAGE;
    }
    const uint32_t P = (uint32_t)tokens, S = 16;
    cfg.max_seq = P + S + 16;
    cfg.budget_tokens = P + S + 2 * chunk + 64;
    uint32_t *pa = malloc((P + S) * sizeof *pa), *pb = malloc((P + S) * sizeof *pb), *pc = malloc((P + S) * sizeof *pc);
    kvo_eng *e = NULL;
    kvo_eng_conn *c1 = NULL, *c2 = NULL;
    char tmp[PATH_MAX] = "";
    int code = KVO_EXIT_FAIL;
    kvo_eng_result ra, rb, rc_;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    memset(&rc_, 0, sizeof rc_);
    if (!pa || !pb || !pc) goto out;
    uint64_t st = 42;
    for (uint32_t i = 0; i < P + S; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        pa[i] = pb[i] = pc[i] = (uint32_t)(st >> 33) % cfg.vocab;
    }
    for (uint32_t i = P; i < P + S; i++) {
        pb[i] = (pa[i] + 1) % cfg.vocab;
        pc[i] = (pa[i] + 2) % cfg.vocab;
    }
    if (kvo_eng_create(&cfg, &e)) {
        fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
        goto out;
    }
    const char *dir = dir_arg;
    if (!dir) {
        const char *t = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/kvoffload-bench-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmp)) {
            tmp[0] = 0;
            fprintf(stderr, "kvoffload bench ttft: cannot create a temporary directory (use --file-dir)\n");
            goto out;
        }
        dir = tmp;
    }
    uint64_t kv = kvo_eng_kv_bytes(e, P + S);
    kvo_eng_conn_params cp = kvo_eng_conn_default_params();
    cp.chunk_tokens = chunk;
    cp.host_bytes = 2 * kv + (16u << 20);
    cp.file_dir = dir;
    cp.file_bytes = 2 * kv + (16u << 20);
    if (kvo_eng_conn_create(e, &cp, &c1)) {
        fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
        goto out;
    }
    /* 1: recompute (the connector stores the chunks as they fill) */
    if (kvo__bt_run(e, c1, pa, P + S, 1, &ra)) goto out;
    if (kvo_eng_conn_flush(c1)) {
        fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
        goto out;
    }
    /* 2: engine cache dropped, prefix loaded from the host tier */
    kvo_eng_evict_cached(e);
    if (kvo__bt_run(e, c1, pb, P + S, 2, &rb)) goto out;
    /* 3: restart: a new connector, empty host tier, same file directory */
    kvo_eng_conn_destroy(c1);
    c1 = NULL;
    kvo_eng_evict_cached(e);
    if (kvo_eng_conn_create(e, &cp, &c2)) {
        fprintf(stderr, "kvoffload bench ttft: %s\n", kvo_eng_last_error());
        goto out;
    }
    if (kvo__bt_run(e, c2, pc, P + S, 3, &rc_)) goto out;

    const kvo_eng_config *ec = kvo_eng_get_config(e);
    uint32_t layers = 0;
    for (uint32_t g = 0; g < ec->n_groups; g++) layers += ec->groups[g].layers;
    if (!o->json)
        printf("# engine '%s': %u layers, d_model %u, vocab %u, %llu parameters; prefix %u tokens "
               "(%.1f MiB of KV), %llu-token chunks\n",
               ec->shape, layers, ec->d_model, ec->vocab, (unsigned long long)kvo_eng_param_count(e), P,
               (double)kv / 1048576.0, (unsigned long long)chunk);
    kvo_bench_report(o, "ttft.model_params", (double)kvo_eng_param_count(e), "params", NULL, 0);
    kvo_bench_report(o, "ttft.prefix_tokens", P, "tokens", NULL, 0);
    kvo_bench_report(o, "ttft.prefix_kv_bytes", (double)kv, "B", NULL, 0);
    kvo_bench_report(o, "ttft.recompute", ra.ttft_s * 1e3, "ms", NULL, 0);
    kvo_bench_report(o, "ttft.host_load", rb.ttft_s * 1e3, "ms", "recompute", ra.ttft_s * 1e3);
    kvo_bench_report(o, "ttft.file_load", rc_.ttft_s * 1e3, "ms", "recompute", ra.ttft_s * 1e3);
    kvo_bench_report(o, "ttft.host_tokens_loaded", rb.tokens_loaded, "tokens", "prefix", P);
    kvo_bench_report(o, "ttft.file_tokens_loaded", rc_.tokens_loaded_file, "tokens", "prefix", P);
    kvo_bench_report(o, "ttft.host_speedup", rb.ttft_s > 0 ? ra.ttft_s / rb.ttft_s : 0, "x", "goal", 10);
    kvo_bench_report(o, "ttft.file_speedup", rc_.ttft_s > 0 ? ra.ttft_s / rc_.ttft_s : 0, "x", "goal", 10);
    code = rb.tokens_loaded > 0 && rc_.tokens_loaded_file > 0 ? KVO_EXIT_OK : KVO_EXIT_FAIL;
    if (code) fprintf(stderr, "kvoffload bench ttft: expected loads from both tiers (host %u, file %u tokens)\n",
                      rb.tokens_loaded, rc_.tokens_loaded_file);
out:
    kvo_eng_results_free(&ra, 1);
    kvo_eng_results_free(&rb, 1);
    kvo_eng_results_free(&rc_, 1);
    kvo_eng_conn_destroy(c1);
    kvo_eng_conn_destroy(c2);
    kvo_eng_destroy(e);
    if (tmp[0]) nftw(tmp, kvo__bt_rm, 16, FTW_DEPTH | FTW_PHYS);
    free(pa);
    free(pb);
    free(pc);
    return code;
}
