/* `kvoffload plan`: show the per-group chunk plan. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static void kvo__plan_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload plan [--model PRESET|FILE | --hf-config FILE [--hf-block-tokens N]]\n"
            "                      [--block-size N | --blocks-per-chunk N]\n"
            "                      [--group-blocks-per-chunk NAME=N[,NAME=N...]]\n"
            "                      [--target-chunk-bytes N] [--dtype NAME] [--config FILE] [--json]\n\n"
            "Prints how each KV-cache group of the model is cut into offloaded chunks.\n"
            "  --model             a preset name or a kvoffload-model/1 JSON file; default: every preset\n"
            "  --hf-config FILE    a Hugging Face config.json instead (one full group, plus one sliding\n"
            "                      group when layer_types has sliding layers)\n"
            "  --hf-block-tokens N tokens per block and per hash for --hf-config (default 16)\n"
            "  --block-size N      legacy: tokens per chunk; each group gets N / tokens_per_block blocks\n"
            "  --blocks-per-chunk N  the same block count for every group\n"
            "  --group-blocks-per-chunk NAME=N,...  per-group overrides (combine with any of the above)\n"
            "  --target-chunk-bytes N  automatic plan target (default 1048576)\n"
            "  --config FILE       a kvo_config JSON file (docs/config.md): model and chunking; the\n"
            "                      options above override it\n"
            "  --json              one JSON object per model\n"
            "Options take their value as --opt VALUE or --opt=VALUE.\n"
            "With neither --block-size nor --blocks-per-chunk the plan is automatic.\n"
            "Exit status: 0 valid plan, 2 invalid configuration, usage or input file, 1 other failure.\n\n"
            "presets:");
    for (size_t i = 0; i < kvo_model_preset_count(); i++) fprintf(f, " %s", kvo_model_preset_name(i));
    fprintf(f, "\n");
}

static void kvo__print_plan(const kvo_plan *p) {
    char hex[33];
    kvo_u128_hex(kvo_plan_fingerprint(p), hex);
    printf("model %s  tokens_per_hash %u  fingerprint %s\n", kvo_model_name(kvo_plan_model(p)),
           kvo_plan_tokens_per_hash(p), hex);
    printf("  %-10s %-8s %6s %6s %10s %8s %10s %7s %12s %12s %9s\n", "group", "kind", "tpb", "layers", "page_B",
           "blk/chk", "tok/chunk", "hashes", "chunk_bytes", "slot_bytes", "win_chks");
    for (size_t i = 0; i < kvo_plan_num_groups(p); i++) {
        const kvo_group_plan *g = kvo_plan_group(p, i);
        char win[24] = "-";
        if (g->kind == KVO_GROUP_SLIDING && g->offloaded) snprintf(win, sizeof win, "%llu", (unsigned long long)g->window_chunks);
        if (!g->offloaded) {
            printf("  %-10s %-8s %6u %6u %10llu   not offloaded (not cacheable)\n", g->name,
                   kvo_group_kind_name(g->kind), g->tokens_per_block, g->layers, (unsigned long long)g->page_bytes);
            continue;
        }
        printf("  %-10s %-8s %6u %6u %10llu %8llu %10llu %7llu %12llu %12llu %9s%s\n", g->name,
               kvo_group_kind_name(g->kind), g->tokens_per_block, g->layers, (unsigned long long)g->page_bytes,
               (unsigned long long)g->blocks_per_chunk, (unsigned long long)g->tokens_per_chunk,
               (unsigned long long)g->hashes_per_chunk, (unsigned long long)g->chunk_bytes,
               (unsigned long long)g->slot_bytes, win, g->draft ? "  (draft)" : "");
    }
}

/* --hf-config FILE (a checked regular file): the Hugging Face import, named
 * after the file. */
static int kvo__plan_hf(const char *path, uint32_t tpb, kvo_model **out) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0 || st.st_size > (64 << 20)) {
        fprintf(stderr, "kvoffload plan: --hf-config '%s': %s\n", path,
                f && st.st_size > (64 << 20) ? "larger than 64 MiB, not a config.json" : strerror(errno));
        if (f) fclose(f);
        return KVO_EXIT_USAGE;
    }
    size_t cap = (size_t)st.st_size, len = 0;
    char *buf = malloc(cap ? cap : 1);
    if (buf) len = fread(buf, 1, cap, f);
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "kvoffload plan: cannot read --hf-config '%s'\n", path);
        free(buf);
        return KVO_EXIT_FAIL;
    }
    const char *base = strrchr(path, '/');
    int rc = kvo_model_from_hf_config(buf, len, base ? base + 1 : path, tpb, tpb, out);
    free(buf);
    if (rc) {  /* the library calls its input "config.json": name the file read */
        const char *m = kvo_last_error();
        bool label = !strncmp(m, "config.json", 11);
        fprintf(stderr, "kvoffload plan: --hf-config %s%s%s (%s)\n", path, label ? "" : ": ", label ? m + 11 : m,
                kvo_error_name(rc));
        return kvo_cli_exit_code(rc);
    }
    return 0;
}

static int kvo__plan_one(const char *model_name, const char *hf, uint32_t hf_tpb, const kvo_plan_params *prm,
                         int json) {
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    int rc;
    if (hf) {
        if ((rc = kvo_cli_input_file("plan", "--hf-config", hf)) || (rc = kvo__plan_hf(hf, hf_tpb, &m))) return rc;
    } else if ((rc = kvo_cli_model_input("plan", model_name))) {
        return rc;
    }
    rc = m ? 0 : kvo_model_open(model_name, &m);
    if (!rc) rc = kvo_plan_create(m, prm, &p);
    if (rc) {
        kvo_model_destroy(m);
        return kvo_cli_fail("plan", rc);
    }
    if (json) {
        char *s = NULL;
        rc = kvo_plan_to_json(p, &s);
        if (!rc) printf("%s\n", s);
        kvo_free(s);
    } else {
        kvo__print_plan(p);
    }
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    return rc ? kvo_cli_fail("plan", rc) : 0;
}

/* --group-blocks-per-chunk NAME=N,...: overrides pointing into *buf (owned). */
static int kvo__plan_overrides(const char *v, char **buf, kvo_group_override *ovr, kvo_plan_params *prm) {
    free(*buf);
    *buf = strdup(v);
    if (!*buf) {
        fprintf(stderr, "kvoffload plan: out of memory\n");
        return KVO_EXIT_FAIL;
    }
    prm->n_overrides = 0;
    for (char *save = NULL, *tok = strtok_r(*buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        uint64_t n;
        int rc;
        if (!eq || eq == tok) {
            fprintf(stderr, "kvoffload plan: --group-blocks-per-chunk wants NAME=N, got '%s'\n", tok);
            return KVO_EXIT_USAGE;
        }
        *eq = 0;
        if ((rc = kvo_cli_parse_u64("--group-blocks-per-chunk", eq + 1, 1, UINT32_MAX, &n))) return rc;
        if (prm->n_overrides >= KVO_MAX_GROUPS) {
            fprintf(stderr, "kvoffload plan: at most %d overrides\n", KVO_MAX_GROUPS);
            return KVO_EXIT_USAGE;
        }
        ovr[prm->n_overrides].group = tok;
        ovr[prm->n_overrides].blocks_per_chunk = (uint32_t)n;
        prm->n_overrides++;
    }
    prm->overrides = ovr;
    return 0;
}

int kvo_cmd_plan(int argc, char **argv) {
    enum { O_MODEL = 256, O_BLOCK_SIZE, O_BPC, O_TARGET, O_DTYPE, O_GROUP_BPC, O_JSON, O_CONFIG, O_HF, O_HF_TPB };
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, O_JSON},
        {"model", required_argument, NULL, O_MODEL},
        {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"blocks-per-chunk", required_argument, NULL, O_BPC},
        {"target-chunk-bytes", required_argument, NULL, O_TARGET},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"group-blocks-per-chunk", required_argument, NULL, O_GROUP_BPC},
        {"config", required_argument, NULL, O_CONFIG},
        {"hf-config", required_argument, NULL, O_HF},
        {"hf-block-tokens", required_argument, NULL, O_HF_TPB},
        {NULL, 0, NULL, 0},
    };
    kvo_plan_params prm = kvo_plan_default_params(), cli = {0};
    const char *model = NULL, *config = NULL, *hf = NULL;
    uint64_t hf_tpb = 16;
    int json = 0, rc = 0, c;
    kvo_group_override ovr[KVO_MAX_GROUPS];
    char *ovr_buf = NULL;
    kvo_config *cfg = NULL;
    kvo_cli_getopt_reset();
    while (!rc && (c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            kvo__plan_usage(stdout);
            free(ovr_buf);
            return 0;
        case O_JSON: json = 1; break;
        case O_MODEL: model = optarg; break;
        case O_CONFIG: config = optarg; break;
        case O_HF: hf = optarg; break;
        case O_HF_TPB: rc = kvo_cli_parse_u64("--hf-block-tokens", optarg, 1, KVO_MAX_TOKENS_PER_CHUNK, &hf_tpb); break;
        case O_DTYPE: prm.dtype = optarg; break;
        case O_BLOCK_SIZE: rc = kvo_cli_parse_u64("--block-size", optarg, 1, UINT64_C(1) << 31, &cli.block_size); break;
        case O_BPC:
            rc = kvo_cli_parse_u64("--blocks-per-chunk", optarg, 1, UINT64_C(1) << 31, &cli.blocks_per_chunk);
            break;
        case O_TARGET:
            rc = kvo_cli_parse_u64("--target-chunk-bytes", optarg, 1, UINT64_C(1) << 40, &cli.target_chunk_bytes);
            break;
        case O_GROUP_BPC: rc = kvo__plan_overrides(optarg, &ovr_buf, ovr, &prm); break;
        default: rc = kvo_cli_bad_option("plan", c, argv); break;
        }
    }
    if (rc) goto fail;
    if (optind < argc) {
        fprintf(stderr, "kvoffload plan: unexpected argument '%s' (kvoffload plan --help)\n", argv[optind]);
        rc = KVO_EXIT_USAGE;
        goto fail;
    }
    /* --config FILE first, then the options given on the command line win */
    if (hf && model) {
        fprintf(stderr, "kvoffload plan: give either --model or --hf-config, not both\n");
        rc = KVO_EXIT_USAGE;
        goto fail;
    }
    if (config) {
        if ((rc = kvo_cli_input_file("plan", "--config", config))) goto fail;
        if ((rc = kvo_config_from_file(config, &cfg)) != 0) {
            rc = kvo_cli_fail("plan", rc);
            goto fail;
        }
        kvo_config_apply_plan(cfg, &prm);
        if (!model && !hf) model = kvo_config_model(cfg);
        if (cli.block_size || cli.blocks_per_chunk) prm.block_size = prm.blocks_per_chunk = 0;
    }
    if (cli.block_size) prm.block_size = cli.block_size;
    if (cli.blocks_per_chunk) prm.blocks_per_chunk = cli.blocks_per_chunk;
    if (cli.target_chunk_bytes) prm.target_chunk_bytes = cli.target_chunk_bytes;
    if (prm.block_size && prm.blocks_per_chunk) {
        fprintf(stderr, "kvoffload plan: give either --block-size or --blocks-per-chunk, not both\n");
        rc = KVO_EXIT_USAGE;
        goto fail;
    }
    rc = 0;
    if (model || hf) {
        rc = kvo__plan_one(model, hf, (uint32_t)hf_tpb, &prm, json);
    } else {
        for (size_t i = 0; i < kvo_model_preset_count(); i++) {
            int r = kvo__plan_one(kvo_model_preset_name(i), NULL, 0, &prm, json);
            if (r && !rc) rc = r;
            if (!json) printf("\n");
        }
    }
fail:
    kvo_config_destroy(cfg);
    free(ovr_buf);
    return rc;
}
