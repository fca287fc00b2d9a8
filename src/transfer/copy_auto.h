/* The host copy routine chosen by measurement (copy_auto.c's essay): used by
 * the host device when nontemporal is -1 (auto).  Process-wide, any thread. */
#ifndef KVO_TRANSFER_COPY_AUTO_H
#define KVO_TRANSFER_COPY_AUTO_H

#include <stdbool.h>
#include <stdint.h>

#include "transfer/copy.h"

/* Monotonic wall clock in ns (the units' timer). */
uint64_t kvo__copy_auto_now_ns(void);
/* True, with *kind, once direction dir (0 store, 1 load) is decided (at once
 * on a CPU without streaming stores); false while it is being measured. */
bool kvo__copy_auto_decided(int dir, kvo__copy_kind *kind);
/* The candidate for a worker's n-th measured unit: alternates the best
 * streaming kind and memcpy. */
kvo__copy_kind kvo__copy_auto_candidate(uint32_t n);
/* One measured unit: `bytes` copied with `kind` in `ns` (first copy to after
 * its fence).  Units under 64 KiB are ignored; the call that completes both
 * candidates' samples decides the direction (and logs the choice at INFO). */
void kvo__copy_auto_sample(int dir, kvo__copy_kind kind, uint64_t bytes, uint64_t ns);
/* For stats: "auto (measuring)", a kind's name, or both directions' names
 * (static strings); and whether streaming stores may be in use. */
const char *kvo__copy_auto_name(void);
bool kvo__copy_auto_streams(void);
/* Tests: forget the decision and the samples (no engine may be copying). */
void kvo__copy_auto_reset(void);

#endif
