/*
 * The file tier's quota index: reserving room for a key, adopting a file
 * that exists, deleting the files the eviction policy chose, and recycling.
 *
 * What it owns
 *  - reserve_key: prepare_store on the quota index (a kvo_store whose slots
 *    are only accounting), then the files of the evicted keys are removed
 *    at once, on the caller's thread (a write's eviction, the scan's).
 *  - adopt_key: a key whose file exists goes into the index as READY (the
 *    startup scan, shared-mode probes).
 *  - Recycling: with !params.shared, an evicted file goes into a pool (at
 *    most pool_cap files and pool_max_bytes) still under its chunk name: the
 *    caller's thread makes no system call for it.  A writer that needs a
 *    file of the same size takes one from the pool, renames it out of its
 *    name to a temporary name, overwrites it in place (no inode or block
 *    allocation: measured several times faster than creating files on ext4
 *    once the quota is full) and renames it to its new name (file_ops.c).
 *    Until a writer takes it, a pooled file is a complete, valid file of the
 *    evicted key, so a name never shows a partial file (the SIGKILL tests);
 *    a process killed meanwhile leaves it to be adopted (or evicted) by the
 *    next scan.  Before this, the evicting caller renamed the file at once:
 *    one rename per chunk on the one thread that feeds the writers.  A key
 *    reserved again while its file is still pooled takes the file back out
 *    of the pool (same key, same bytes: the new write's link finds it and
 *    succeeds); if a writer is renaming it away at that moment, the
 *    reservation waits for that rename (done_cv), so the new write's link or
 *    rename never races it.  Off in shared mode, where another process may
 *    be reading the evicted file.  The pool is as large as the write queue
 *    can be (max_pending_writes files, the staging memory's bytes): with a
 *    smaller pool (16 files, before) a caller that runs ahead of the writers
 *    evicted most files into unlink, and most queued writes then created a
 *    new inode after all.  Pooled files are the only bytes on disk beyond
 *    the quota: at most max_staging_bytes; they are removed at destroy
 *    (tier_free).  The pool is searched linearly (at most pool_cap entries,
 *    max_pending_writes: 64 by default), under mu, once per reservation.
 *
 *  - Shared mode (params.shared with the accounting of file_share.c): a
 *    file this process's unlink removed is un-counted there
 *    (kvo__file_unlink_key).  A reservation also takes the key's bytes in the
 *    shared quota.  The index's capacity is the whole shared quota, and the
 *    bytes of the namespace that it does not hold (other processes' files
 *    and writes in flight: the shared `used` less the index's own bytes)
 *    sit in it as a ballast of phantom entries, PENDING for good, one per
 *    largest slot, brought up to date before each reservation and
 *    adoption.  So the index's own policy makes room: when the others' bytes
 *    grow, the ballast grows and evicts this process's files in policy
 *    order (files it adopted from others count as its own), and when they
 *    shrink this process may use more.  Should the shared quota still refuse
 *    (a race, or entries of files another process removed, which free
 *    nothing shared), the ballast grows by the excess, up to four rounds;
 *    then the key leaves the index with KVO_ENOSPC and the caller may evict
 *    files no index here holds (kvo__file_evict_foreign, file_scan.c).  The
 *    ballast is not kept during the startup scan (files not yet adopted
 *    would count as others').  A write of a key whose file another process
 *    made meanwhile adopts it instead.  The ballast's keys have a high hash
 *    half no chunk key has ("KVOBALLS"); stats subtract its bytes.
 *
 * Lock rules: mu guards the pool and the eviction counter; it is taken only
 * around those, never across a rename, an unlink or a store call.  share_mu
 * guards the ballast; it is held across its store calls and the unlinks its
 * evictions cause, and taken before mu, never after.  A pool
 * entry that a writer is renaming stays in the pool marked `taking` until
 * the rename is done, so that a concurrent reservation of the same key can
 * wait for it.
 *
 * Invariants: pool_len <= pool_cap; pool_bytes (pooled files) <=
 * pool_max_bytes; a pooled file is always exactly the file size recorded
 * with it; a key is in the pool at most once, and never while it is in the
 * index (reserve takes it out).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/file_internal.h"

#define EVICT_CAP 64

/* Keep an evicted file for reuse if the pool has room: it stays under its
 * name until a writer takes it.  Returns true when kept. */
static bool recycle_file(kvo_file_tier *t, const kvo_chunk_key *k) {
    if (t->p.shared || t->pool_cap == 0) return false;
    const kvo_group_plan *g = kvo__file_group_of(t, k);
    if (!g) return false;
    uint64_t fb = kvo__file_stage_size(g);
    char sub[3], name[64];
    kvo__file_subdir(k, sub);
    kvo__file_name(k, name, sizeof name);
    pthread_mutex_lock(&t->mu);
    bool room = t->pool_len < t->pool_cap && t->pool_bytes + fb <= t->pool_max_bytes;
    if (room) {
        kvo__recycled *r = &t->pool[t->pool_len++];
        snprintf(r->rel, sizeof r->rel, "%s/%s", sub, name);
        r->key = *k;
        r->file_bytes = fb;
        r->taking = false;
        t->pool_bytes += fb;
    }
    pthread_mutex_unlock(&t->mu);
    return room;
}

static void pool_drop(kvo_file_tier *t, uint32_t i) {
    t->pool_bytes -= t->pool[i].file_bytes;
    t->pool[i] = t->pool[--t->pool_len];
}

/* A key is being reserved: if its evicted file is still pooled, take it out
 * of the pool (it is a complete file of this key: the key's new write will
 * find it under its name); if a writer is renaming it away right now, wait
 * until it is gone, so that the new write's link or rename comes after. */
static void pool_reclaim(kvo_file_tier *t, const kvo_chunk_key *k) {
    if (t->pool_cap == 0) return;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < t->pool_len;) {
        kvo__recycled *r = &t->pool[i];
        if (r->key.group != k->group || r->key.hash.lo != k->hash.lo || r->key.hash.hi != k->hash.hi) {
            i++;
            continue;
        }
        if (!r->taking) {
            pool_drop(t, i);
            break;
        }
        pthread_cond_wait(&t->done_cv, &t->mu); /* the taker broadcasts when done */
        i = 0;
    }
    pthread_mutex_unlock(&t->mu);
}

/* Take a recycled file of exactly file_bytes, if any: it is renamed from
 * its old chunk name to the temporary name in tmp (a path the caller made),
 * on this (writer) thread.  False when none is pooled or the rename failed
 * (the file was removed meanwhile: the write makes a new file). */
bool kvo__file_recycled_take(kvo_file_tier *t, uint64_t file_bytes, const char *tmp) {
    char old[KVO__FILE_PATH_MAX];
    kvo_chunk_key key;
    bool got = false;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = t->pool_len; i-- > 0;) {
        kvo__recycled *r = &t->pool[i];
        if (r->taking || r->file_bytes != file_bytes) continue;
        r->taking = true;
        key = r->key;
        snprintf(old, sizeof old, "%s/%s", t->ns_dir, r->rel);
        got = true;
        break;
    }
    pthread_mutex_unlock(&t->mu);
    if (!got) return false;
    bool ok = rename(old, tmp) == 0;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < t->pool_len; i++) {
        kvo__recycled *r = &t->pool[i];
        if (r->taking && r->key.group == key.group && r->key.hash.lo == key.hash.lo && r->key.hash.hi == key.hash.hi) {
            pool_drop(t, i);
            break;
        }
    }
    if (ok) t->st.recycled_files++;
    pthread_cond_broadcast(&t->done_cv); /* a reservation of the old key may wait */
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void kvo__file_unlink_evicted(kvo_file_tier *t, const kvo_chunk_key *ev, size_t n) {
    char path[KVO__FILE_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvo__file_key_path(t, &ev[i], path);
        if (recycle_file(t, &ev[i])) continue;
        /* ENOENT: another process's unlink un-counted it */
        if (!kvo__file_unlink_key(t, &ev[i], path, false) && errno != ENOENT && errno != EISDIR)
            kvo__file_remove_any(path);
    }
    if (n) {
        pthread_mutex_lock(&t->mu);
        t->st.evictions += n;
        pthread_mutex_unlock(&t->mu);
    }
}

bool kvo__file_unlink_key(kvo_file_tier *t, const kvo_chunk_key *k, const char *path, bool any) {
    const kvo_group_plan *g = t->share ? kvo__file_group_of(t, k) : NULL;
    if (g) kvo__fshare_unlink_begin(t->share, g->slot_bytes); /* a recount meanwhile keeps counting it */
    bool removed = any ? kvo__file_remove_any(path) == 0 : unlink(path) == 0;
    int e = errno;
    if (g) kvo__fshare_unlink_end(t->share, g->slot_bytes, removed);
    errno = e;
    return removed;
}

/* prepare_store of n keys on the quota index, then delete the files of the
 * keys it evicted (reclaim: n is 1, a write's key, which may still sit in the
 * recycling pool).  *n_evicted (may be NULL) counts them.  Retries with a
 * larger eviction buffer when one call evicts more than EVICT_CAP entries
 * (many small chunks for a large one). */
static int prepare_unlink(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n, uint8_t *need, kvo_slot *slots,
                          size_t *n_evicted, bool reclaim) {
    kvo_chunk_key ev[EVICT_CAP];
    kvo_slot evs[EVICT_CAP];
    size_t nev = 0;
    int rc = kvo_store_prepare_store(t->index, keys, n, need, slots, ev, evs, EVICT_CAP, &nev);
    if (rc == 0 && reclaim && need[0]) pool_reclaim(t, keys); /* before its own evictions: they never evict it */
    if (rc == KVO_ERANGE && nev > EVICT_CAP) {
        size_t cap = nev + 64;
        kvo_chunk_key *hev = kvo__malloc(cap * sizeof *hev);
        kvo_slot *hevs = kvo__malloc(cap * sizeof *hevs);
        if (!hev || !hevs) {
            kvo__free(hev);
            kvo__free(hevs);
            return kvo__error(KVO_ENOMEM, "file tier: eviction list of %zu entries", cap);
        }
        rc = kvo_store_prepare_store(t->index, keys, n, need, slots, hev, hevs, cap, &nev);
        if (rc == 0 && reclaim && need[0]) pool_reclaim(t, keys);
        if (rc == 0) kvo__file_unlink_evicted(t, hev, nev);
        kvo__free(hev);
        kvo__free(hevs);
    } else if (rc == 0) {
        kvo__file_unlink_evicted(t, ev, nev);
    }
    if (n_evicted) *n_evicted = rc == 0 ? nev : 0;
    return rc;
}

/* ------------------------------------------------------------ ballast -- */

/* Phantom keys of the ballast: this hash never names a chunk (chunk keys
 * are 128-bit hashes of token ids; this high half is ASCII "KVOBALLS"). */
#define BALLAST_HI UINT64_C(0x4b564f42414c4c53)

static kvo_chunk_key ballast_key(const kvo_file_tier *t, uint64_t i) {
    kvo_chunk_key k;
    memset(&k, 0, sizeof k);
    k.hash.lo = i;
    k.hash.hi = BALLAST_HI;
    k.group = t->ballast_group;
    return k;
}

/* Grow the ballast by up to m units (share_mu held): each batch's
 * prepare_store makes room the index's way, evicting this process's files in
 * policy order (they are unlinked and un-counted).  Keys 0..n_ballast-1
 * exist, no other. */
static void ballast_grow(kvo_file_tier *t, uint64_t m) {
    enum { B = 32 };
    kvo_chunk_key keys[B];
    uint8_t need[B];
    kvo_slot slots[B];
    size_t b = B;
    while (m) {
        if (b > m) b = (size_t)m;
        for (size_t i = 0; i < b; i++) keys[i] = ballast_key(t, t->n_ballast + i);
        if (prepare_unlink(t, keys, b, need, slots, NULL, false) == 0) {
            t->n_ballast += b;
            m -= b;
        } else if (b > 1) {
            b = 1; /* all or nothing per call: the rest one at a time */
        } else {
            break; /* no more room can be made (the rest pinned or pending) */
        }
    }
}

static void ballast_shrink(kvo_file_tier *t, uint64_t m) {
    enum { B = 32 };
    kvo_chunk_key keys[B];
    while (m) {
        size_t b = m < B ? (size_t)m : B;
        for (size_t i = 0; i < b; i++) keys[i] = ballast_key(t, t->n_ballast - 1 - i);
        if (kvo_store_complete_store(t->index, keys, b, false) != 0) break;
        t->n_ballast -= b;
        m -= b;
    }
}

/* Size the ballast to the namespace's bytes that this index does not hold:
 * the shared `used` less this index's own bytes, plus adjust (an adoption's
 * file, already in used, counts as this index's: -its bytes; a reservation
 * the quota refused: +the excess), in whole units rounded up. */
static void ballast_refresh(kvo_file_tier *t, int64_t adjust) {
    kvo_store_stats ss = KVO_STORE_STATS_INIT;
    pthread_mutex_lock(&t->share_mu);
    if (t->ballast_on && kvo_store_get_stats(t->index, &ss) == 0) {
        uint64_t ball = t->n_ballast * t->ballast_unit;
        uint64_t mine = ss.bytes_used > ball ? ss.bytes_used - ball : 0;
        int64_t others = (int64_t)kvo__fshare_used(t->share) - (int64_t)mine + adjust;
        uint64_t want = others > 0 ? ((uint64_t)others + t->ballast_unit - 1) / t->ballast_unit : 0;
        if (want > t->n_ballast) ballast_grow(t, want - t->n_ballast);
        else if (want < t->n_ballast) ballast_shrink(t, t->n_ballast - want);
    }
    pthread_mutex_unlock(&t->share_mu);
}

uint64_t kvo__file_ballast_bytes(kvo_file_tier *t) {
    if (!t->share) return 0;
    pthread_mutex_lock(&t->share_mu);
    uint64_t b = t->n_ballast * t->ballast_unit;
    pthread_mutex_unlock(&t->share_mu);
    return b;
}

void kvo__file_share_settle(kvo_file_tier *t) {
    if (!t->share) return;
    pthread_mutex_lock(&t->share_mu);
    t->ballast_on = true; /* during the scan, files not yet adopted would count as others' */
    pthread_mutex_unlock(&t->share_mu);
    ballast_refresh(t, 0);
}

/* ------------------------------------------------------------ reserve -- */

/* Shared mode: the key is reserved in this index (need); now in the shared
 * accounting.  A file another process wrote meanwhile is adopted instead
 * (need 0).  When the shared quota refuses, this index grows its ballast by
 * the excess, which evicts this process's files in policy order (files of
 * other processes that it adopted count as its own), and tries again; if it
 * has nothing left to evict, the key leaves the index and KVO_ENOSPC says so
 * (the caller may evict files no index of this process holds:
 * kvo__file_evict_foreign). */
static int reserve_shared(kvo_file_tier *t, const kvo_chunk_key *k, uint8_t *need) {
    const kvo_group_plan *g = kvo__file_group_of(t, k);
    if (kvo__file_probe_key(t, k, g)) {
        *need = 0;
        return kvo_store_complete_store(t->index, k, 1, true);
    }
    /* The index holds the key (pending) but used does not yet: the ballast
     * is used - mine + the key's bytes, and grows by the excess each round
     * (entries of files another process removed still count as mine here:
     * evicting them frees nothing shared, so the next round asks for more). */
    uint64_t over = 0;
    for (int round = 0; round < 4; round++) {
        if (kvo__fshare_reserve(t->share, g->slot_bytes, &over)) return 0;
        ballast_refresh(t, (int64_t)(g->slot_bytes + over));
    }
    kvo_store_complete_store(t->index, k, 1, false);
    *need = 0;
    return kvo__error(KVO_ENOSPC, "file tier: the shared quota (%llu bytes) is full and this process holds "
                      "nothing it can evict", (unsigned long long)kvo__fshare_quota(t->share));
}

int kvo__file_reserve_key(kvo_file_tier *t, const kvo_chunk_key *k, uint8_t *need, size_t *n_evicted) {
    kvo_slot slot;
    if (t->share) ballast_refresh(t, 0);
    int rc = prepare_unlink(t, k, 1, need, &slot, n_evicted, true);
    if (rc == 0 && *need && t->share) rc = reserve_shared(t, k, need);
    return rc;
}

/* Put a key known to have a file into the index as READY (scan, shared-mode
 * adoption).  Returns 0, or an error (file left alone). */
int kvo__file_adopt_key(kvo_file_tier *t, const kvo_chunk_key *k, size_t *evicted_out) {
    uint8_t need = 0;
    kvo_slot slot;
    const kvo_group_plan *g = kvo__file_group_of(t, k);
    if (t->share && g) ballast_refresh(t, -(int64_t)g->slot_bytes); /* the file is counted already */
    int rc = prepare_unlink(t, k, 1, &need, &slot, evicted_out, true);
    if (rc) return rc;
    if (need) rc = kvo_store_complete_store(t->index, k, 1, true);
    return rc;
}

/* Does a complete-looking file for k exist (shared mode probe)? */
bool kvo__file_probe_key(kvo_file_tier *t, const kvo_chunk_key *k, const kvo_group_plan *g) {
    char path[KVO__FILE_PATH_MAX];
    struct stat st;
    kvo__file_key_path(t, k, path);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == kvo__file_stage_size(g);
}
