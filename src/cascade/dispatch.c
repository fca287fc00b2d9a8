/*
 * The dispatcher: everything that finishes in a lower tier comes back here.
 *
 * kvo__casc_drive consumes the file tier's completions (reads landing,
 * lent writes ending) and the remote tier's (gets landing, presence
 * answers), finishing each op by its record (tierio.c), then retries the
 * deferred writes once.  A promotion that lands completes its host entry
 * (READY when the read verified and the group was not invalidated since,
 * with its checksum taken while still PENDING; else removed).  A direct
 * read whose file read failed goes on to the remote tier under the same
 * record; one the remote tier served is also written to the file tier
 * (the tier copies it from the caller's memory before the completion is
 * queued).  Every op ends in exactly one completion in the ring.
 *
 * Locks: the caller holds c->mu; the tiers' poll calls never block.
 * kvo__casc_drain (destroy) is the one function here that waits, and it
 * takes and releases mu itself.
 */
#include "cascade/cascade_internal.h"

static void kvo__finish(kvo_cascade *c, kvo__cop *o, int result, uint64_t bytes) {
    const uint32_t g = o->key.group;
    bool stale = o->gen != c->gen[g];
    if (o->tier == KVO_TIER_FILE) {
        if (c->file_reads) c->file_reads--;
    } else if (c->remote_gets)
        c->remote_gets--;
    if (result && o->tier == KVO_TIER_REMOTE) kvo__casc_pres_absent(c, &o->key);
    if (o->op == KVO_CASCADE_OP_READ && result && !stale && o->tier == KVO_TIER_FILE && o->chain && c->remote &&
        kvo__casc_uses(c, KVO_TIER_REMOTE, g)) {
        /* the file read failed: the remote tier under the same record */
        uint64_t id = o->k0;
        int r = KVO_EINVAL;
        size_t nq = 0;
        c->st.file.read_failures++;
        if (kvo_remote_tier_get(c->remote, &o->key, &o->dst, 1, &id, &r, &nq) == 0 && r == 0) {
            o->tier = KVO_TIER_REMOTE;
            c->remote_gets++;
            return;
        }
        o->tier = KVO_TIER_REMOTE;
        result = r ? r : KVO_EIO;
    }
    kvo_cascade_tier_stats *ts = o->tier == KVO_TIER_FILE ? &c->st.file : &c->st.remote;
    int out = stale ? KVO_ESTATE : result;
    if (o->op == KVO_CASCADE_OP_PROMOTE) {
        bool ok = out == 0;
        if (ok && c->sums) /* still PENDING: nothing can pin, evict or rewrite it yet */
            c->sums[o->slot.offset / KVO_SLOT_ALIGN] = kvo__casc_sum(c, &o->key, o->slot);
        (void)kvo_store_complete_store(kvo__casc_hs(c, &o->key), &o->key, 1, ok);
        if (ok) ts->promotions++;
        else ts->promotion_failures++;
        if (c->promoting) c->promoting--;
    } else {
        if (out == 0) {
            ts->reads++;
            ts->read_bytes += bytes;
            if (o->tier == KVO_TIER_REMOTE && o->fill_file && c->file && kvo__casc_uses(c, KVO_TIER_FILE, g)) {
                const void *src = o->dst;
                kvo__casc_write(c, KVO__CASC_TIER_BIT(KVO_TIER_FILE), &o->key, &src, NULL, false, 1, 0, NULL, NULL);
            }
        } else
            ts->read_failures++;
        if (c->reading) c->reading--;
    }
    kvo_cascade_completion cp = {o->user_data, o->key, o->op, o->tier, out, out == 0 ? bytes : 0,
                                 kvo__now_ns() - o->t0};
    kvo__casc_op_del(c, o);
    kvo__casc_emit(c, &cp);
}

/* A remote DEL of kvo_cascade_remove finished: its completion (removed if
 * the local tiers held the key, whatever the DEL found). */
static void kvo__removed(kvo_cascade *c, uint64_t id, int result) {
    kvo__cop *o = kvo__casc_op_get(c, id);
    if (!o) return;
    int out = o->chain && result == KVO_ENOTFOUND ? 0 : result;
    kvo_cascade_completion cp = {o->user_data, o->key, KVO_CASCADE_OP_REMOVE, KVO_TIER_REMOTE, out, 0,
                                 kvo__now_ns() - o->t0};
    kvo__casc_op_del(c, o);
    kvo__casc_emit(c, &cp);
}

static void kvo__landed(kvo_cascade *c, uint64_t id, int result, uint64_t bytes) {
    kvo__cop *o = kvo__casc_op_get(c, id);
    if (o) kvo__finish(c, o, result, bytes);
}

void kvo__casc_drive(kvo_cascade *c) {
    enum { B = 32 };
    for (uint32_t f = 0; f < c->nft; f++) {
        kvo_file_completion fc[B];
        size_t n;
        while (kvo_file_tier_poll(c->ftiers[f], fc, B, &n) == 0 && n > 0)
            for (size_t i = 0; i < n; i++) {
                if (fc[i].op == KVO_FILE_OP_READ)
                    kvo__landed(c, fc[i].user_data, fc[i].result, fc[i].bytes);
                else if (KVO__CASC_IS_LENT(fc[i].user_data))
                    kvo__casc_lent_done(c, &fc[i]);
            }
    }
    if (c->remote) {
        kvo_remote_completion rc[B];
        size_t n;
        while (kvo_remote_tier_poll(c->remote, rc, B, &n) == 0 && n > 0)
            for (size_t i = 0; i < n; i++) {
                if (rc[i].op == KVO_REMOTE_OP_EXISTS) kvo__casc_pres_answer(c, &rc[i].key, rc[i].result);
                else if (rc[i].op == KVO_REMOTE_OP_GET) kvo__landed(c, rc[i].user_data, rc[i].result, rc[i].bytes);
                else if (rc[i].op == KVO_REMOTE_OP_REMOVE && rc[i].user_data)
                    kvo__removed(c, rc[i].user_data, rc[i].result);
            }
    }
    kvo__casc_retry(c);
}

void kvo__casc_drain(kvo_cascade *c) {
    kvo__casc_lock(c);
    for (;;) {
        kvo__casc_drive(c);
        bool file_busy = c->file && (c->file_reads || c->lent);
        bool remote_busy = c->remote && c->remote_gets;
        if (!file_busy && !remote_busy) break;
        kvo__casc_unlock(c);
        /* a tier with nothing that reports in flight answers ENOTFOUND at
         * once: then no completion can come from it any more */
        bool file_done = true; /* every file tier says nothing of ours is in flight */
        for (uint32_t f = 0; file_busy && f < c->nft; f++)
            if (kvo_file_tier_wait(c->ftiers[f], KVO_MS(100) / c->nft) != KVO_ENOTFOUND) file_done = false;
        bool remote_done = !remote_busy || kvo_remote_tier_wait(c->remote, KVO_MS(100)) == KVO_ENOTFOUND;
        kvo__casc_lock(c);
        if (file_done && remote_done) {
            kvo__casc_drive(c);
            break;
        }
    }
    kvo__casc_unlock(c);
}
