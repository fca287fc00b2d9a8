/*
 * File tier pins: keep chosen files out of the quota's eviction for a while.
 *
 * A pin is a reader's pin in the tier's quota index (kvo_store
 * prepare_load / complete_load, the same pin a queued read holds), so the
 * index never evicts the key's file while it is held, and a write that
 * would need it dropped with KVO_ENOSPC instead.  The connector pins the
 * files of a lookup's hit while the host slots it reserves for them evict
 * host chunks whose write-back needs file quota (docs/connector.md), and
 * unpins once its reads are queued (each read holds its own pin).
 *
 * A read that finds its file corrupt or gone retires the key in the index
 * (kvo_store_retire): lookups miss it at once, and the entry goes with the
 * last pin, this one or a reader's.
 *
 * Locks: the index's own lock; no file I/O.
 */
#include "tiers/file_internal.h"

int kvo_file_tier_pin(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_file_tier_pin: NULL argument");
    enum { B = 64 }; /* batches with a stack buffer: no allocation */
    kvo_slot slots[B];
    kvo_store *ix = t->index;
    for (size_t i = 0; i < n; i += B) {
        size_t b = n - i < B ? n - i : B;
        int rc = kvo_store_prepare_load(ix, keys + i, b, slots);
        if (rc) {
            if (i) (void)kvo_store_complete_load(ix, keys, i); /* all or nothing */
            return rc;
        }
    }
    return 0;
}

int kvo_file_tier_unpin(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_file_tier_unpin: NULL argument");
    if (n == 0) return 0;
    return kvo_store_complete_load(t->index, keys, n);
}

uint64_t kvo_file_tier_layout_hash(const kvo_file_tier *t) { return t ? t->p.layout_hash : 0; }
