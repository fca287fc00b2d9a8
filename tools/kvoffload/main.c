/* kvoffload: the command-line tool.  Each subcommand lives in its own file. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} kvo__cmds[] = {
    {"plan", kvo_cmd_plan, "show the per-group chunk plan for a model and offload configuration"},
    {"bench", kvo_cmd_bench, "run a benchmark (store, transfer, file, ttft) and print JSON figures"},
    {"fsck", kvo_cmd_fsck, "check (and repair) a file-tier directory"},
    {"replay", kvo_cmd_replay, "replay a request trace against policies, Belady's MIN and the infinite cache"},
    {"demo", kvo_cmd_demo, "run the reference engine with and without offloading and compare"},
    {"version", kvo_cmd_version, "print the version of the tool and of the library"},
};
#define KVO__NCMDS (sizeof kvo__cmds / sizeof kvo__cmds[0])

static void kvo__usage(FILE *f) {
    fprintf(f, "usage: kvoffload <command> [options]   (kvoffload <command> --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < KVO__NCMDS; i++) fprintf(f, "  %-8s %s\n", kvo__cmds[i].name, kvo__cmds[i].help);
    fprintf(f, "\nkvoffload %s\n", kvo_version());
}

int kvo_cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    if (!s || !*s) {
        fprintf(stderr, "kvoffload: %s needs a value\n", opt);
        return KVO_EXIT_USAGE;
    }
    errno = 0;
    unsigned long long v = *s == '-' ? 0 : strtoull(s, &end, 10);
    if (*s == '-' || errno || *end || end == s) {
        fprintf(stderr, "kvoffload: %s must be an integer in %llu..%llu, got '%s'\n", opt, (unsigned long long)min,
                (unsigned long long)max, s);
        return KVO_EXIT_USAGE;
    }
    if (v < min || v > max) {
        fprintf(stderr, "kvoffload: %s is %llu, must be in %llu..%llu\n", opt, v, (unsigned long long)min,
                (unsigned long long)max);
        return KVO_EXIT_USAGE;
    }
    *out = v;
    return 0;
}

void kvo_cli_getopt_reset(void) {
    optind = 0; /* GNU getopt: 0 re-initialises (a subcommand parses its own argv) */
    opterr = 0; /* kvo_cli_bad_option prints the message */
}

int kvo_cli_bad_option(const char *cmd, int c, char **argv) {
    const char *arg = optind > 0 ? argv[optind - 1] : "?";
    if (c == ':')
        fprintf(stderr, "kvoffload %s: option '%s' needs a value (kvoffload %s --help)\n", cmd, arg, cmd);
    else if (optopt)
        fprintf(stderr, "kvoffload %s: unknown option '-%c' (kvoffload %s --help)\n", cmd, optopt, cmd);
    else
        fprintf(stderr, "kvoffload %s: unknown option '%s' (kvoffload %s --help)\n", cmd, arg, cmd);
    return KVO_EXIT_USAGE;
}

int kvo_cmd_version(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    int c;
    kvo_cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            printf("usage: kvoffload version\n\nPrints the tool's version and the library's.\n");
            return 0;
        }
        return kvo_cli_bad_option("version", c, argv);
    }
    if (optind < argc) {
        fprintf(stderr, "kvoffload version: unexpected argument '%s'\n", argv[optind]);
        return KVO_EXIT_USAGE;
    }
    printf("kvoffload %s\n", KVO_VERSION_STRING);
    printf("library %s\n", kvo_version());
    return 0;
}

int kvo_cli_exit_code(int err) {
    switch (err) {
    case 0: return KVO_EXIT_OK;
    case KVO_EINVAL: case KVO_ERANGE: case KVO_EPARSE: case KVO_ENOTFOUND: case KVO_ELAYOUT:
        return KVO_EXIT_USAGE;
    default: return KVO_EXIT_FAIL;
    }
}

int kvo_cli_input_file(const char *cmd, const char *what, const char *path) {
    struct stat st;
    const char *why = NULL;
    if (!path || !*path) why = "an empty path";
    else if (stat(path, &st) != 0) why = strerror(errno);
    else if (S_ISDIR(st.st_mode)) why = "is a directory, not a file";
    else if (!S_ISREG(st.st_mode)) why = "is not a regular file";
    else if (access(path, R_OK) != 0) why = strerror(errno);
    if (!why) return 0;
    fprintf(stderr, "kvoffload %s: %s '%s': %s\n", cmd, what, path ? path : "", why);
    return KVO_EXIT_USAGE;
}

int kvo_cli_model_input(const char *cmd, const char *name) {
    for (size_t i = 0; i < kvo_model_preset_count(); i++)
        if (!strcmp(name, kvo_model_preset_name(i))) return 0;
    if (!strchr(name, '/') && access(name, F_OK) != 0) return 0;
    return kvo_cli_input_file(cmd, "--model", name);
}

int kvo_cli_fail(const char *cmd, int err) {
    fprintf(stderr, "kvoffload %s: %s (%s)\n", cmd, kvo_last_error(), kvo_error_name(err));
    return kvo_cli_exit_code(err);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        kvo__usage(stderr);
        return KVO_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        kvo__usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V")) {
        printf("kvoffload %s\n", kvo_version());
        return 0;
    }
    for (size_t i = 0; i < KVO__NCMDS; i++)
        if (!strcmp(argv[1], kvo__cmds[i].name)) return kvo__cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvoffload: unknown command '%s'\n", argv[1]);
    kvo__usage(stderr);
    return KVO_EXIT_USAGE;
}
