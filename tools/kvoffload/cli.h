/* Shared declarations of the kvoffload command-line tool. */
#ifndef KVO_CLI_H
#define KVO_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "kvoffload/kvo.h"

/* Exit codes: 0 success, 1 runtime failure, 2 invalid configuration or usage. */
#define KVO_EXIT_OK 0
#define KVO_EXIT_FAIL 1
#define KVO_EXIT_USAGE 2

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

/* Subcommands parse options with getopt_long (so --opt=value and --opt value
 * both work): call kvo_cli_getopt_reset() first, pass an optstring starting
 * with ':' and handle '?' and ':' with kvo_cli_bad_option(), which prints
 * "kvoffload <cmd>: unknown option '--x'" or "option '--x' needs a value"
 * and returns KVO_EXIT_USAGE. */
void kvo_cli_getopt_reset(void);
int kvo_cli_bad_option(const char *cmd, int c, char **argv);

#endif
