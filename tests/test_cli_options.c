/* Tests of the command line's option parsing (getopt_long: --opt=value and
 * --opt value), `kvoffload version` and --config FILE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvo_test.h"

static int run(const char *args, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

/* The same plan whichever way the values are written. */
KVO_TEST(equals_and_separate_values_agree) {
    char *a = NULL, *b = NULL;
    ASSERT_EQ_INT(run("plan --model llama-3.1-8b --block-size 256 --json", &a), 0);
    ASSERT_EQ_INT(run("plan --model=llama-3.1-8b --block-size=256 --json", &b), 0);
    ASSERT_EQ_STR(a, b);
    ASSERT_CONTAINS(a, "\"tokens_per_chunk\": 256");
    free(a);
    free(b);
}

KVO_TEST(bad_options_exit_2) {
    static const struct { const char *args, *msg; } cases[] = {
        {"plan --model", "needs a value"},
        {"plan --block-size=", "--block-size"},
        {"plan --jsn", "unknown option '--jsn'"},
        {"plan extra", "unexpected argument 'extra'"},
        {"demo --requests", "needs a value"},
        {"demo --requests=0", "--requests"},
        {"demo --file-mode=sideways", "through or back"},
        {"demo --nosuch=1", "unknown option"},
        {"version --nosuch", "unknown option"},
        {"version extra", "unexpected argument"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int st = run(cases[i].args, &out);
        if (st != 2 || !strstr(out, cases[i].msg))
            FAILF("'%s': exit %d, output '%s'; expected exit 2 and '%s'", cases[i].args, st, out, cases[i].msg);
        free(out);
    }
}

KVO_TEST(version_command) {
    char *out = NULL, want[64];
    ASSERT_EQ_INT(run("version", &out), 0);
    snprintf(want, sizeof want, "kvoffload %s\n", KVO_VERSION_STRING);
    ASSERT_CONTAINS(out, want);
    snprintf(want, sizeof want, "library %s\n", kvo_version());
    ASSERT_CONTAINS(out, want);
    free(out);
    ASSERT_EQ_INT(run("--help", &out), 0);
    ASSERT_CONTAINS(out, "version");
    free(out);
}

/* Write text to path (a test input file). */
static void put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(text, f);
    fclose(f);
}

/* --config FILE gives the model and chunking; options on the command line win;
 * a typo in the file exits 2 naming the nearest key. */
KVO_TEST(plan_config_file) {
    char path[512], args[1024], *a = NULL, *b = NULL;
    snprintf(path, sizeof path, "%s/lmcache.json", kvo_test_tmpdir());
    put_file(path, "{\"model\": \"llama-3.1-8b\", \"chunk_size\": 512}");
    snprintf(args, sizeof args, "plan --config '%s' --json", path);
    ASSERT_EQ_INT(run(args, &a), 0);
    ASSERT_EQ_INT(run("plan --model llama-3.1-8b --block-size 512 --json", &b), 0);
    ASSERT_EQ_STR(a, b);
    free(a);
    free(b);
    snprintf(args, sizeof args, "plan --config='%s' --block-size=128 --json", path);
    ASSERT_EQ_INT(run(args, &a), 0);
    ASSERT_CONTAINS(a, "\"tokens_per_chunk\": 128");
    free(a);
    put_file(path, "{\"model\": \"llama-3.1-8b\", \"chunk_sise\": 512}");
    snprintf(args, sizeof args, "plan --config '%s'", path);
    ASSERT_EQ_INT(run(args, &a), 2);
    ASSERT_CONTAINS(a, "'chunk_size'");
    free(a);
}

/* Exit codes as the help says (1 a failure, 2 bad usage or input) and
 * refusals that say what would be accepted (issue 51, item 6); TRACE and
 * EMPTY stand for the sample trace and an empty JSON file. */
KVO_TEST(refusals_say_what_is_accepted) {
    static const struct { const char *args; int code; const char *says, *says_too; } cases[] = {
        /* a server out of reach is a failure, not bad usage */
        {"demo --quiet --requests 4 --remote redis://127.0.0.1:1", 1, "cannot connect to 127.0.0.1:1", ""},
        /* a sweep that goes down says so and gives one that works */
        {"replay --trace TRACE --capacity 10:5:3", 2, "FROM 10 is above TO 5", "5:10:3"},
        {"replay --trace TRACE --capacity 5:10:x", 2, "COUNT 'x' must be an integer in 2..", ""},
        /* a number out of range names the range */
        {"demo --requests=-3", 2, "--requests must be an integer in 1..", ""},
        /* the file read is the file named (not config.json) */
        {"plan --hf-config EMPTY", 2, "empty.json: missing field", ""},
    };
    char trace[512], empty[512], args[1400], *out = NULL;
    snprintf(trace, sizeof trace, "'%s/data/mooncake_sample.jsonl'", KVO_SOURCE_DIR);
    snprintf(empty, sizeof empty, "%s/empty.json", kvo_test_tmpdir());
    put_file(empty, "{}\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *a = cases[i].args, *t = strstr(a, "TRACE"), *e = strstr(a, "EMPTY");
        if (t) snprintf(args, sizeof args, "%.*s%s%s", (int)(t - a), a, trace, t + 5);
        else if (e) snprintf(args, sizeof args, "%.*s'%s'%s", (int)(e - a), a, empty, e + 5);
        else snprintf(args, sizeof args, "%s", a);
        int st = run(args, &out);
        if (st != cases[i].code || !strstr(out, cases[i].says) || !strstr(out, cases[i].says_too) ||
            strstr(out, "config.json"))
            FAILF("'%s': exit %d, output '%s'; expected exit %d and '%s'", args, st, out, cases[i].code,
                  cases[i].says);
        free(out);
    }
}

/* A benchmark prints a line of progress per figure (group) on stderr, none
 * with --quiet; the file tier's back-pressure under the benchmark's
 * saturation is a figure, never a warning line (issue 51, item 5). */
KVO_TEST(bench_progress_and_quiet) {
    char args[1024], *out = NULL;
    const char *common = "bench file --json --total-mib 8 --sizes 256 --rebuild-files 50 --reps 1";
    snprintf(args, sizeof args, "'%s' %s --dir '%s' 2>/dev/null", KVO_CLI_PATH, common, kvo_test_tmpdir());
    ASSERT_EQ_INT(kvo_test_run(args, &out), 0);
    ASSERT_CONTAINS(out, "\"name\":\"file.write.256KiB.");
    ASSERT_CONTAINS(out, "backpressure_refusals_per_chunk");
    if (strstr(out, "kvoffload bench")) FAILF("progress on stdout: %s", out);
    free(out);
    snprintf(args, sizeof args, "'%s' %s --dir '%s' 2>&1 >/dev/null", KVO_CLI_PATH, common, kvo_test_tmpdir());
    ASSERT_EQ_INT(kvo_test_run(args, &out), 0);
    ASSERT_CONTAINS(out, "kvoffload bench file [");
    ASSERT_CONTAINS(out, "256 KiB chunks");
    ASSERT_CONTAINS(out, "index rebuild over 50 files");
    if (strstr(out, "dropping stores")) FAILF("a back-pressure note printed as a warning: %s", out);
    free(out);
    snprintf(args, sizeof args, "'%s' %s --quiet --dir '%s' 2>&1 >/dev/null", KVO_CLI_PATH, common,
             kvo_test_tmpdir());
    ASSERT_EQ_INT(kvo_test_run(args, &out), 0);
    ASSERT_EQ_STR(out, "");
    free(out);
}
