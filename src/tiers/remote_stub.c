/*
 * The remote tier's public functions in a build without hiredis
 * (KVO_WITH_REDIS off or libhiredis-dev missing): create fails with
 * KVO_ENOTSUP, the rest are harmless no-ops.  With hiredis the real ones are
 * in src/tiers/remote/ and this file is empty.
 */
#include "core/internal.h"
#include "kvoffload/kvo_remote_tier.h"

#if !defined(KVO_HAVE_REDIS) || !KVO_HAVE_REDIS
kvo_remote_tier_params kvo_remote_tier_default_params(void) {
    kvo_remote_tier_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    return p;
}
int kvo_remote_tier_create(const kvo_remote_tier_params *p, kvo_remote_tier **out) {
    (void)p;
    (void)out;
    return kvo__error(KVO_ENOTSUP, "remote tier: this build has no hiredis (install libhiredis-dev and "
                      "configure with -DKVO_WITH_REDIS=ON)");
}
void kvo_remote_tier_destroy(kvo_remote_tier *t) { (void)t; }
#define KVO__NOTSUP return kvo__error(KVO_ENOTSUP, "remote tier: not built")
int kvo_remote_tier_put(kvo_remote_tier *t, const kvo_chunk_key *k, const void *const *s, size_t n,
                        const uint64_t *u, int *r, size_t *q) { (void)t; (void)k; (void)s; (void)n; (void)u; (void)r; (void)q; KVO__NOTSUP; }
int kvo_remote_tier_get(kvo_remote_tier *t, const kvo_chunk_key *k, void *const *d, size_t n, const uint64_t *u,
                        int *r, size_t *q) { (void)t; (void)k; (void)d; (void)n; (void)u; (void)r; (void)q; KVO__NOTSUP; }
int kvo_remote_tier_exists(kvo_remote_tier *t, const kvo_chunk_key *k, size_t n, const uint64_t *u, int *r,
                           size_t *q) { (void)t; (void)k; (void)n; (void)u; (void)r; (void)q; KVO__NOTSUP; }
int kvo_remote_tier_remove(kvo_remote_tier *t, const kvo_chunk_key *k, size_t n, const uint64_t *u, int *r,
                           size_t *q) { (void)t; (void)k; (void)n; (void)u; (void)r; (void)q; KVO__NOTSUP; }
int kvo_remote_tier_poll(kvo_remote_tier *t, kvo_remote_completion *o, size_t c, size_t *n) {
    (void)t; (void)o; (void)c;
    if (n) *n = 0;
    return 0;
}
int kvo_remote_tier_wait(kvo_remote_tier *t, int64_t ns) { (void)t; (void)ns; KVO__NOTSUP; }
int kvo_remote_tier_event_fd(const kvo_remote_tier *t) { (void)t; return -1; }
uint64_t kvo_remote_tier_layout_hash(const kvo_remote_tier *t) { (void)t; return 0; }
int kvo_remote_tier_flush(kvo_remote_tier *t, int64_t ns) { (void)t; (void)ns; return 0; }
int kvo_remote_tier_key_name(const kvo_remote_tier *t, const kvo_chunk_key *k, char *o, size_t c) { (void)t; (void)k; (void)o; (void)c; KVO__NOTSUP; }
uint32_t kvo_remote_key_slot(const char *key, size_t len) { (void)key; (void)len; return 0; }
int kvo_remote_tier_get_stats(kvo_remote_tier *t, kvo_remote_tier_stats *o) { (void)t; (void)o; KVO__NOTSUP; }
#endif
