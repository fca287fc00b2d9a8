/* Weak fallbacks for subcommands whose layers are not built yet.  A real
 * definition in tools/kvoffload/cmd_<name>.c replaces one at link time; no
 * edit here is needed. */
#include <string.h>

#include "cli.h"

#define KVO__STUB(fn, name)                                                          \
    __attribute__((weak)) int fn(int argc, char **argv) {                                                  \
        if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {  \
            printf("usage: kvoffload " name " (not available in this build yet)\n"); \
            return 0;                                                                \
        }                                                                            \
        fprintf(stderr, "kvoffload " name ": not available in this build yet\n");   \
        return KVO_EXIT_FAIL;                                                        \
    }

KVO__STUB(kvo_cmd_fsck, "fsck")
KVO__STUB(kvo_cmd_demo, "demo")
