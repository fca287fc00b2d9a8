/* Shared declarations of the kvoffload command-line tool. */
#ifndef KVO_CLI_H
#define KVO_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "kvoffload/kvo.h"

/* Exit codes of every command: 0 success, 1 runtime failure (or a demo
 * mismatch, fsck problems), 2 bad input: invalid usage or configuration, or an
 * input file that is missing, unreadable, a directory or malformed. */
#define KVO_EXIT_OK 0
#define KVO_EXIT_FAIL 1
#define KVO_EXIT_USAGE 2
#define KVO_EXIT_REPAIRED 3 /* fsck --repair: problems were found and every one was repaired */

/* Every subcommand: argv[0] is the subcommand's name. */
int kvo_cmd_plan(int argc, char **argv);
int kvo_cmd_bench(int argc, char **argv);
int kvo_cmd_fsck(int argc, char **argv);
int kvo_cmd_demo(int argc, char **argv);
int kvo_cmd_version(int argc, char **argv);
int kvo_cmd_replay(int argc, char **argv);

/* Parse a positive integer option value; prints an error naming the option. */
int kvo_cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Print "kvoffload <cmd>: <message from kvo_last_error()>" and return the exit
 * code for the error: 2 for configuration errors, 1 otherwise. */
int kvo_cli_fail(const char *cmd, int err);
int kvo_cli_exit_code(int err);
/* An input file named on the command line (what: "--trace", "--model", ...):
 * 0 when path is a readable regular file; otherwise prints
 * "kvoffload <cmd>: <what> '<path>': <why>" (missing, a directory, not a
 * regular file, unreadable) and returns KVO_EXIT_USAGE: bad input is exit 2. */
int kvo_cli_input_file(const char *cmd, const char *what, const char *path);
/* --model PRESET|FILE: 0 for a preset, or a bare name that is no file (the
 * library then answers with the list of presets, exit 2); otherwise
 * kvo_cli_input_file(cmd, "--model", name). */
int kvo_cli_model_input(const char *cmd, const char *name);

/* Subcommands parse options with getopt_long (so --opt=value and --opt value
 * both work): call kvo_cli_getopt_reset() first, pass an optstring starting
 * with ':' and handle '?' and ':' with kvo_cli_bad_option(), which prints
 * "kvoffload <cmd>: unknown option '--x'" or "option '--x' needs a value"
 * and returns KVO_EXIT_USAGE. */
void kvo_cli_getopt_reset(void);
int kvo_cli_bad_option(const char *cmd, int c, char **argv);

#endif
