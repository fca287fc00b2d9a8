/* Regression tests for the parser and CLI faults of issue 18 (item 16; item 14
 * is also checked through the CLI here): exit status 2 for bad input files and
 * options, the demo's temporary directory removed when it is killed, and the
 * workload's conversation grouping in O(n log n). */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine_internal.h"
#include "kvo_test.h"

static int run(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", KVO_CLI_PATH, args);
    return kvo_test_run(cmd, out);
}

/* Exit status and output of `kvoffload <args>`: status must be want and the
 * output must contain needle. */
static void expect(const char *args, int want, const char *needle) {
    char *out = NULL;
    int st = run(args, &out);
    if (st != want || !strstr(out, needle)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", out);
        free(out);
        FAILF("kvoffload %s: exit %d, expected %d with '%s'; output: %s", args, st, want, needle, msg);
    }
    free(out);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fputs(text, f);
    ASSERT_EQ_INT(fclose(f), 0);
}

/* A missing, directory or special input file is bad input: exit 2, and the
 * message says what is wrong with it. */
KVO_TEST(missing_or_directory_inputs_exit_2) {
    char args[1024];
    const char *dir = kvo_test_tmpdir();
    expect("plan --model /nonexistent/model.json", 2, "No such file");
    expect("plan --config /nonexistent/kvo.json", 2, "No such file");
    expect("demo --quiet --trace /nonexistent/trace.jsonl", 2, "No such file");
    expect("demo --quiet --config /nonexistent/kvo.json", 2, "No such file");
    snprintf(args, sizeof args, "plan --model '%s'", dir);
    expect(args, 2, "is a directory");
    snprintf(args, sizeof args, "demo --quiet --trace '%s'", dir);
    expect(args, 2, "is a directory");
    expect("demo --quiet --trace /dev/null", 2, "not a regular file");
    expect("replay --trace /nonexistent/trace.jsonl --capacity 1000", 2, "No such file");
    snprintf(args, sizeof args, "replay --trace '%s' --capacity 1000", dir);
    expect(args, 2, "is a directory");
    snprintf(args, sizeof args, "replay --trace '%s/data/mooncake_sample.jsonl' --capacity 1000 "
             "--model /nonexistent/model.json", KVO_SOURCE_DIR);
    expect(args, 2, "No such file");
    expect("bench store --trace /nonexistent/trace.jsonl", 2, "No such file");
    expect("plan --model no-such-preset", 2, "presets:");
    /* a preset name still works without a file */
    expect("plan --model llama-3.1-8b", 0, "llama-3.1-8b");
}

/* The library says a directory is not a trace (it said "no conversation"). */
KVO_TEST(workload_directory_trace_einval) {
    kvo_eng_workload_params p = kvo_eng_workload_default_params();
    p.trace_path = kvo_test_tmpdir();
    kvo_eng_workload *w = NULL;
    ASSERT_EQ_INT(kvo_eng_workload_load(&p, &w), KVO_EINVAL);
    ASSERT_CONTAINS(kvo_eng_last_error(), "is a directory");
    ASSERT_NULL(w);
}

KVO_TEST(demo_engine_tokens_below_minimum_exit_2) {
    expect("demo --quiet --engine-tokens 1", 2, "minimum for shape 'hybrid-state' is");
    expect("demo --quiet --shape single --engine-tokens 15", 2, "minimum");
}

/* Item 14 through the CLI: a config.json whose page size wraps 2^64. */
KVO_TEST(plan_hf_config_overflow_exit_2) {
    char path[512], args[1024];
    snprintf(path, sizeof path, "%s/huge-config.json", kvo_test_tmpdir());
    write_file(path, "{\"num_hidden_layers\": 2, \"num_key_value_heads\": 2147483648, "
                     "\"head_dim\": 2147483649, \"torch_dtype\": \"bfloat16\"}");
    snprintf(args, sizeof args, "plan --hf-config '%s'", path);
    expect(args, 2, "num_key_value_heads (2147483648) * head_dim (2147483649)");
    snprintf(path, sizeof path, "%s/llama-config.json", kvo_test_tmpdir());
    write_file(path, "{\"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
                     "\"hidden_size\": 4096, \"torch_dtype\": \"bfloat16\"}");
    snprintf(args, sizeof args, "plan --hf-config '%s' --hf-block-tokens 16 --json", path);
    expect(args, 0, "\"page_bytes\": 65536");
    expect("plan --hf-config /nonexistent/config.json", 2, "No such file");
}

/* Entries of dir whose name starts with prefix, and whether any is non-empty. */
static size_t count_entries(const char *dir, const char *prefix, char *first, size_t cap) {
    DIR *d = opendir(dir);
    size_t n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        if (!n && first) snprintf(first, cap, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static void demo_killed_cleans_up(int sig) {
    char tmp[512], sub[1100] = "";
    snprintf(tmp, sizeof tmp, "%s/demo-sig%d", kvo_test_tmpdir(), sig);
    ASSERT_EQ_INT(mkdir(tmp, 0700), 0);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        setenv("TMPDIR", tmp, 1);
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
        signal(SIGINT, SIG_DFL); /* a harness may run us with these ignored */
        signal(SIGTERM, SIG_DFL);
        execl(KVO_CLI_PATH, "kvoffload", "demo", "--quiet", "--requests", "200", (char *)NULL);
        _exit(127);
    }
    /* wait until the demo's file tier has written into its directory */
    int st = 0, done = 0;
    for (int i = 0; i < 6000 && !done; i++) {
        if (count_entries(tmp, "kvoffload-demo-", sub, sizeof sub) == 1 &&
            count_entries(sub, "", NULL, 0) > 2) /* ".", ".." and a file */
            break;
        done = waitpid(pid, &st, WNOHANG) == pid;
        usleep(10000);
    }
    if (done) FAILF("the demo ended (status %d) before it could be killed", st);
    ASSERT_EQ_INT(kill(pid, sig), 0);
    ASSERT_EQ_INT(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(st));
    ASSERT_EQ_INT(WTERMSIG(st), sig);
    /* the watcher removes it once the demo is gone */
    size_t left = 1;
    for (int i = 0; i < 3000 && left; i++) {
        left = count_entries(tmp, "kvoffload-demo-", NULL, 0);
        if (left) usleep(10000);
    }
    if (left) FAILF("signal %d: %s left behind", sig, sub);
}

KVO_TEST(demo_sigterm_removes_tmpdir) { demo_killed_cleans_up(SIGTERM); }
KVO_TEST(demo_sigint_removes_tmpdir) { demo_killed_cleans_up(SIGINT); }

/* The former grouping, written plainly: conversations in order of first
 * appearance, whole ones while fewer than max lines are taken, then sorted by
 * line and cut.  Quadratic; only for small n. */
static size_t reference_select(const uint64_t *roots, size_t n, uint32_t min_turns, size_t max, size_t *sel) {
    size_t n_sel = 0;
    for (size_t i = 0; i < n && n_sel < max; i++) {
        size_t j = 0, count = 0;
        while (j < i && roots[j] != roots[i]) j++;
        if (j < i) continue; /* not the first line of its conversation */
        for (j = i; j < n; j++) count += roots[j] == roots[i];
        if (count < min_turns) continue;
        for (j = i; j < n; j++)
            if (roots[j] == roots[i]) sel[n_sel++] = j;
    }
    for (size_t a = 1; a < n_sel; a++) /* insertion sort */
        for (size_t b = a; b > 0 && sel[b - 1] > sel[b]; b--) {
            size_t t = sel[b];
            sel[b] = sel[b - 1];
            sel[b - 1] = t;
        }
    return n_sel < max ? n_sel : max;
}

/* Random roots: a mix of one-line requests and conversations of 1..8 turns
 * interleaved the way a trace spreads them over time. */
static void random_roots(uint64_t *roots, size_t n, size_t n_conv) {
    for (size_t i = 0; i < n; i++)
        roots[i] = kvo_test_rand() % 4 ? 1000000 + i : kvo_test_rand() % n_conv; /* unique or shared */
}

KVO_TEST(select_conversations_matches_reference) {
    enum { N = 3000 };
    uint64_t *roots = malloc(N * sizeof *roots);
    size_t *sel = malloc(N * sizeof *sel), *ref = malloc(N * sizeof *ref), n_sel = 0;
    ASSERT_TRUE(roots && sel && ref);
    static const struct { uint32_t min_turns; size_t max; } cases[] = {{3, 48}, {3, N}, {1, 100}, {5, 7}, {9, N}};
    for (int round = 0; round < 4; round++) {
        random_roots(roots, N, 50 + 150 * (size_t)round);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            ASSERT_OK(kvo__eng_select_conversations(roots, N, cases[c].min_turns, cases[c].max, sel, &n_sel, NULL));
            size_t n_ref = reference_select(roots, N, cases[c].min_turns, cases[c].max, ref);
            ASSERT_EQ_U64(n_sel, n_ref);
            for (size_t i = 0; i < n_sel; i++)
                if (sel[i] != ref[i]) FAILF("round %d case %zu: sel[%zu] = %zu, reference %zu", round, c, i, sel[i], ref[i]);
        }
    }
    free(roots);
    free(sel);
    free(ref);
}

/* 200k lines, three quarters of them distinct conversations (the worst case
 * of the former per-line scan of every root, ~n^2/2 = 2e10 steps): the
 * comparisons and steps stay within a few n log2 n. */
KVO_TEST(select_conversations_200k_lines_n_log_n) {
    enum { N = 200000 };
    uint64_t *roots = malloc(N * sizeof *roots), ops = 0;
    size_t *sel = malloc(N * sizeof *sel), n_sel = 0;
    ASSERT_TRUE(roots && sel);
    random_roots(roots, N, 5000);
    ASSERT_OK(kvo__eng_select_conversations(roots, N, 3, N, sel, &n_sel, &ops));
    uint64_t log2n = 0;
    while ((UINT64_C(1) << log2n) < N) log2n++;
    ASSERT_LE_U64(ops, 4 * (uint64_t)N * log2n);
    ASSERT_GT_U64(n_sel, 0);
    for (size_t i = 1; i < n_sel; i++) ASSERT_LT_U64(sel[i - 1], sel[i]);
    for (size_t i = 0; i < n_sel; i++) ASSERT_LT_U64(roots[sel[i]], 5000); /* no one-line request */
    free(roots);
    free(sel);
}

/* The same grouping through a trace file: the loaded requests are the
 * reference selection's lines, in order. */
KVO_TEST(workload_trace_grouping_matches_reference) {
    enum { N = 2000 };
    char path[512];
    snprintf(path, sizeof path, "%s/trace.jsonl", kvo_test_tmpdir());
    uint64_t *roots = malloc(N * sizeof *roots);
    size_t *ref = malloc(N * sizeof *ref);
    ASSERT_TRUE(roots && ref);
    random_roots(roots, N, 200);
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    for (size_t i = 0; i < N; i++)
        fprintf(f, "{\"input_length\": 1500, \"output_length\": 4, \"hash_ids\": [%llu, %llu, %zu]}\n",
                (unsigned long long)roots[i], (unsigned long long)roots[i] + 7, 10000000 + i);
    ASSERT_EQ_INT(fclose(f), 0);
    kvo_eng_workload_params p = kvo_eng_workload_default_params();
    p.trace_path = path;
    p.max_requests = 300;
    kvo_eng_workload *w = NULL;
    ASSERT_OK(kvo_eng_workload_load(&p, &w));
    size_t n_ref = reference_select(roots, N, p.min_turns, p.max_requests, ref);
    ASSERT_EQ_U64(w->n, n_ref);
    for (size_t i = 0; i < w->n; i++) ASSERT_EQ_U64(w->reqs[i].id, ref[i]);
    kvo_eng_workload_free(w);
    free(roots);
    free(ref);
}
