/* Subcommands whose layers are not built yet.  Each one moves to its own file
 * (cmd_<name>.c) when it is implemented; remove it from here then. */
#include <string.h>

#include "cli.h"

#define KVO__STUB(fn, name)                                                          \
    int fn(int argc, char **argv) {                                                  \
        if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {  \
            printf("usage: kvoffload " name " (not available in this build yet)\n"); \
            return 0;                                                                \
        }                                                                            \
        fprintf(stderr, "kvoffload " name ": not available in this build yet\n");   \
        return KVO_EXIT_FAIL;                                                        \
    }

KVO__STUB(kvo_cmd_fsck, "fsck")
KVO__STUB(kvo_cmd_demo, "demo")
