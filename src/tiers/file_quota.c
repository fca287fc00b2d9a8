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
 * Lock rules: mu guards the pool and the eviction counter; it is taken only
 * around those, never across a rename, an unlink or a store call.  A pool
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
        if (unlink(path) != 0 && errno != ENOENT && errno != EISDIR) kvo__file_remove_any(path);
    }
    if (n) {
        pthread_mutex_lock(&t->mu);
        t->st.evictions += n;
        pthread_mutex_unlock(&t->mu);
    }
}

/* Reserve quota for one key: prepare_store, then delete the files of the
 * keys it evicted.  *need as in kvo_store_prepare_store; *n_evicted (may be
 * NULL) counts the evicted files.  Retries with a larger eviction buffer when
 * one call evicts more than EVICT_CAP entries (many small chunks for a large
 * one). */
int kvo__file_reserve_key(kvo_file_tier *t, const kvo_chunk_key *k, uint8_t *need, size_t *n_evicted) {
    kvo_slot slot;
    kvo_chunk_key ev[EVICT_CAP];
    kvo_slot evs[EVICT_CAP];
    size_t nev = 0;
    int rc = kvo_store_prepare_store(t->index, k, 1, need, &slot, ev, evs, EVICT_CAP, &nev);
    if (rc == 0 && *need) pool_reclaim(t, k); /* before its own evictions: they never evict k */
    if (rc == KVO_ERANGE && nev > EVICT_CAP) {
        size_t cap = nev + 64;
        kvo_chunk_key *hev = kvo__malloc(cap * sizeof *hev);
        kvo_slot *hevs = kvo__malloc(cap * sizeof *hevs);
        if (!hev || !hevs) {
            kvo__free(hev);
            kvo__free(hevs);
            return kvo__error(KVO_ENOMEM, "file tier: eviction list of %zu entries", cap);
        }
        rc = kvo_store_prepare_store(t->index, k, 1, need, &slot, hev, hevs, cap, &nev);
        if (rc == 0) kvo__file_unlink_evicted(t, hev, nev);
        kvo__free(hev);
        kvo__free(hevs);
    } else if (rc == 0) {
        kvo__file_unlink_evicted(t, ev, nev);
    }
    if (n_evicted) *n_evicted = rc == 0 ? nev : 0;
    return rc;
}

/* Put a key known to have a file into the index as READY (scan, shared-mode
 * adoption).  Returns 0, or an error (file left alone). */
int kvo__file_adopt_key(kvo_file_tier *t, const kvo_chunk_key *k, size_t *evicted_out) {
    uint8_t need = 0;
    int rc = kvo__file_reserve_key(t, k, &need, evicted_out);
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

