/* Tests of the kvoffload command line: `plan` output, JSON shape, exit codes. */
#include <stdlib.h>

#include <jansson.h>

#include "kvo_test.h"

static int run(const char *args, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

KVO_TEST(plan_json_deepseek_block_size_256) {
    char *out = NULL;
    ASSERT_EQ_INT(run("plan --model deepseek-v4-flash-like --block-size 256 --json", &out), 0);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    if (!j) FAILF("not JSON (%s): %s", err.text, out);
    ASSERT_EQ_STR(json_string_value(json_object_get(j, "model")), "deepseek-v4-flash-like");
    ASSERT_EQ_INT(json_integer_value(json_object_get(j, "tokens_per_hash")), 32);
    ASSERT_EQ_U64(strlen(json_string_value(json_object_get(j, "fingerprint"))), 32);
    json_t *groups = json_object_get(j, "groups");
    ASSERT_EQ_U64(json_array_size(groups), 9);
    for (size_t i = 0; i < json_array_size(groups); i++) {
        json_t *g = json_array_get(groups, i);
        static const char *fields[] = {"name", "kind", "tokens_per_block", "blocks_per_chunk", "tokens_per_chunk",
                                       "hashes_per_chunk", "chunk_bytes", "offloaded", "window_chunks"};
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++)
            if (!json_object_get(g, fields[f])) FAILF("group %zu lacks %s", i, fields[f]);
        const char *kind = json_string_value(json_object_get(g, "kind"));
        int offl = json_is_true(json_object_get(g, "offloaded"));
        if (offl) {
            ASSERT_EQ_INT(json_integer_value(json_object_get(g, "tokens_per_chunk")), 256);
            ASSERT_EQ_INT(json_integer_value(json_object_get(g, "hashes_per_chunk")), 8);
        }
        if (strcmp(kind, "sliding") != 0 || !offl) ASSERT_TRUE(json_is_null(json_object_get(g, "window_chunks")));
        else ASSERT_EQ_INT(json_integer_value(json_object_get(g, "window_chunks")), 2); /* 128/256 -> 1, +1 */
    }
    ASSERT_FALSE(json_is_true(json_object_get(json_array_get(groups, 8), "offloaded")));
    json_decref(j);
    free(out);
}

KVO_TEST(plan_every_preset_prints) {
    char *out = NULL;
    ASSERT_EQ_INT(run("plan", &out), 0);
    for (size_t i = 0; i < kvo_model_preset_count(); i++) ASSERT_CONTAINS(out, kvo_model_preset_name(i));
    free(out);
    ASSERT_EQ_INT(run("plan --model glm-5.3-flash-like --blocks-per-chunk 16 --json", &out), 0);
    json_t *j = json_loads(out, 0, NULL);
    ASSERT_NOT_NULL(j);
    json_decref(j);
    free(out);
}

KVO_TEST(plan_model_file) {
    char *out = NULL, args[1024];
    snprintf(args, sizeof args, "plan --model '%s' --json", kvo_test_shared_path("models/gemma-4-31b-like.json"));
    ASSERT_EQ_INT(run(args, &out), 0);
    ASSERT_CONTAINS(out, "gemma-4-31b-like");
    free(out);
}

static const struct {
    const char *args;
    int code;
    const char *needle;
} bad[] = {
    {"plan --model deepseek-v4-flash-like --block-size 256 --blocks-per-chunk 4", 2, "not both"},
    {"plan --model llama-3.1-8b --block-size 0", 2, "--block-size"},
    {"plan --model llama-3.1-8b --block-size -16", 2, "integer in 1.."},
    {"plan --model llama-3.1-8b --blocks-per-chunk abc", 2, "integer"},
    {"plan --model llama-3.1-8b --block-size 99999999999999999999999", 2, "integer"},
    {"plan --model glm-5.3-flash-like --blocks-per-chunk 2", 2, "minimum 16"},
    {"plan --model qwen3-next-80b-like --block-size 256", 2, "group 'state'"},
    {"plan --model gemma-4-31b-like --group-blocks-per-chunk nosuch=4", 2, "unknown group 'nosuch'"},
    {"plan --model gemma-4-31b-like --group-blocks-per-chunk full", 2, "NAME=N"},
    {"plan --model no-such-model", 2, "presets:"},
    {"plan --model /nonexistent.json", 2, "No such file"}, /* bad input: 2 (issue 18) */
    {"plan --frobnicate", 2, "unknown option"},
    {"frobnicate", 2, "unknown command"},
};

KVO_TEST(plan_invalid_configurations_exit_2) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        int code = run(bad[i].args, &out);
        if (code != bad[i].code) FAILF("'%s' exited %d, expected %d: %s", bad[i].args, code, bad[i].code, out);
        ASSERT_CONTAINS(out, bad[i].needle);
        free(out);
    }
}

KVO_TEST(broken_model_file_exit_2_with_line) {
    char path[512], args[700], *out = NULL;
    snprintf(path, sizeof path, "%s/broken.json", kvo_test_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs("{\n  \"format\": \"kvoffload-model/1\",\n  \"name\": \"b\",\n  \"groups\": [,]\n}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "plan --model '%s'", path);
    ASSERT_EQ_INT(run(args, &out), 2);
    ASSERT_CONTAINS(out, ":4:");
    free(out);
}

KVO_TEST(help_everywhere) {
    static const char *cmds[] = {"--help", "plan --help", "bench --help", "fsck --help", "demo --help"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL;
        ASSERT_EQ_INT(run(cmds[i], &out), 0);
        ASSERT_CONTAINS(out, "usage");
        free(out);
    }
}
