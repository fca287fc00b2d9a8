/* Shared declarations of the kvoffload command-line tool. */
#ifndef KVO_CLI_H
#define KVO_CLI_H

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
int kvo_cmd_replay(int argc, char **argv);

/* Parse a positive integer option value; prints an error naming the option. */
int kvo_cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Print "kvoffload <cmd>: <message from kvo_last_error()>" and return the exit
 * code for the error: 2 for configuration errors, 1 otherwise. */
int kvo_cli_fail(const char *cmd, int err);
int kvo_cli_exit_code(int err);

#endif
