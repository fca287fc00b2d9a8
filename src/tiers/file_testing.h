/*
 * Test-only hooks of the file tier.  Compiled only when the build defines
 * KVO_TESTING (CMake option KVO_TESTING, on with KVO_BUILD_TESTS, into the
 * static library the tests link): the installed libraries carry none of
 * them, and without it the write path's check folds to a constant 0.
 */
#ifndef KVO_TIERS_FILE_TESTING_H
#define KVO_TIERS_FILE_TESTING_H

#include <stdint.h>

#ifdef KVO_TESTING
/* Make the next `count` file writes fail with errno `err` (ENOSPC, EIO...)
 * as if the file system returned it; count 0 clears.  Process-wide. */
void kvo__file_tier_inject_write_error(int err, uint32_t count);
/* The errno the next file write fails with (0: none); file_ops.c. */
int kvo__file_take_injected(void);
#else
static inline int kvo__file_take_injected(void) { return 0; }
#endif

#endif
