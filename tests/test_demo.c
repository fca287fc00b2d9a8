/* The demo as an installed or out-of-tree user runs it (issue 25, item 10):
 * no bundled sample next to the working directory or the executable, so the
 * synthetic conversations run.  They must put every tier to work under
 * memory pressure (tokens loaded from the host tier and from the file tier,
 * verdict MATCH); before, the synthetic workload never loaded a token, and
 * the demo reported success anyway. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "kvo_test.h"

/* Copy the CLI into a fresh directory and run `kvoffload demo ARGS` there. */
static json_t *demo_outside_tree(const char *args, int *status) {
    char dir[1024], cmd[4096];
    snprintf(dir, sizeof dir, "%s/outside", kvo_test_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/bin' && cp '%s' '%s/bin/kvoffload' && cd '%s' && ./bin/kvoffload demo "
             "--quiet --json %s 2>/dev/null", dir, KVO_CLI_PATH, dir, dir, args);
    char *out = NULL;
    *status = kvo_test_run(cmd, &out);
    json_error_t err;
    const char *obj = out ? strstr(out, "{\"shape\"") : NULL; /* the one object --json prints */
    json_t *o = obj ? json_loads(obj, 0, &err) : NULL;
    if (!o) FAILF("demo --json printed no JSON object: %s", out ? out : "");
    free(out);
    return o;
}

static json_int_t offload_int(json_t *o, const char *k) {
    json_t *v = json_object_get(json_object_get(o, "offload"), k);
    if (!json_is_integer(v)) FAILF("offload.%s missing", k);
    return json_integer_value(v);
}

KVO_TEST(synthetic_workload_loads_from_every_tier) {
    int st = 0;
    json_t *o = demo_outside_tree("", &st);
    ASSERT_EQ_INT(st, 0);
    ASSERT_TRUE(json_is_true(json_object_get(o, "match")));
    ASSERT_GT_U64((uint64_t)offload_int(o, "tokens_loaded_host"), 0);
    ASSERT_GT_U64((uint64_t)offload_int(o, "tokens_loaded_file"), 0);
    ASSERT_GT_U64((uint64_t)json_integer_value(json_object_get(o, "engine_block_evictions")), 0);
    json_decref(o);
}

KVO_TEST(synthetic_workload_every_shape_loads) {
    static const char *shapes[] = {"single", "hybrid", "tiny-blocks"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char args[128];
        snprintf(args, sizeof args, "--shape %s --requests 24", shapes[i]);
        int st = 0;
        json_t *o = demo_outside_tree(args, &st);
        if (st != 0) FAILF("shape %s: exit %d", shapes[i], st);
        ASSERT_TRUE(json_is_true(json_object_get(o, "match")));
        if (offload_int(o, "tokens_loaded_host") + offload_int(o, "tokens_loaded_file") <= 0)
            FAILF("shape %s: nothing loaded", shapes[i]);
        json_decref(o);
    }
}

/* A demo whose workload never comes back to an evicted prefix loads nothing:
 * it must say so and exit 1, not claim success. */
KVO_TEST(demo_that_loads_nothing_fails) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' demo --quiet --requests 1 --file-mib 0 2>&1", kvo_test_tmpdir(),
             KVO_CLI_PATH);
    char *out = NULL;
    ASSERT_EQ_INT(kvo_test_run(cmd, &out), 1);
    ASSERT_CONTAINS(out, "no prompt token was loaded");
    free(out);
}

/* A file tier written by a run with other weights (--seed) never hits: the
 * namespace of every key holds the model's whole identity.  Before, the
 * file tier was namespaced by the geometry alone: the second run loaded the
 * first one's KV and its verdict was MISMATCH. */
KVO_TEST(file_dir_of_other_weights_never_hits) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/files", kvo_test_tmpdir());
    char args[1400];
    snprintf(args, sizeof args, "--requests 24 --host-mib 1 --file-dir '%s' --seed 1", dir);
    int st = 0;
    json_t *o = demo_outside_tree(args, &st);
    ASSERT_EQ_INT(st, 0);
    json_decref(o);
    /* the same weights again: the files of the first run are hits */
    o = demo_outside_tree(args, &st);
    ASSERT_EQ_INT(st, 0);
    json_int_t same = offload_int(o, "tokens_loaded_file");
    json_decref(o);
    snprintf(args, sizeof args, "--requests 24 --host-mib 1 --file-dir '%s' --seed 2", dir);
    o = demo_outside_tree(args, &st);
    ASSERT_EQ_INT(st, 0);
    ASSERT_TRUE(json_is_true(json_object_get(o, "match")));
    json_int_t other = offload_int(o, "tokens_loaded_file");
    json_decref(o);
    /* with other weights only what this run stored itself loads: fewer
     * tokens than the run that also found the first run's files */
    ASSERT_LT_INT(other, same);
}
