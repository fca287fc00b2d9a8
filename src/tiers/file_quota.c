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
 *  - Recycling: with !params.shared, an evicted file is renamed to a
 *    temporary name in its directory (pool of at most pool_cap files and
 *    pool_max_bytes) and a later write of the same size overwrites it in
 *    place (no inode or block allocation: measured several times faster than
 *    creating files on ext4 once the quota is full).  Off in shared mode,
 *    where another process may be reading the evicted file.  The pool is as
 *    large as the write queue can be (max_pending_writes files, the staging
 *    memory's bytes): with a smaller pool (16 files, before) a caller that
 *    runs ahead of the writers evicted most files into unlink, and most
 *    queued writes then created a new inode after all.  Pooled files are
 *    the only bytes on disk beyond the quota: at most max_staging_bytes.
 *
 * Lock rules: mu guards the pool and the eviction counter; it is taken only
 * around those, never across a rename, an unlink or a store call.  A pool
 * slot is reserved (pool_reserved) before the rename so that concurrent
 * evictions never overfill the pool.
 *
 * Invariants: pool_len + pool_reserved <= pool_cap; pool_bytes (pooled and
 * reserved files) <= pool_max_bytes; a pooled file is always
 * exactly the file size recorded with it; pooled files are removed at
 * destroy (tier_free).
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/file_internal.h"

#define EVICT_CAP 64

/* Keep an evicted file for reuse if the pool has room: rename it to a
 * temporary name in its directory.  Returns true when kept. */
static bool recycle_file(kvo_file_tier *t, const kvo_chunk_key *k, const char *path) {
    if (t->p.shared || t->pool_cap == 0) return false;
    const kvo_group_plan *g = kvo__file_group_of(t, k);
    if (!g) return false;
    uint64_t fb = kvo__file_stage_size(g);
    pthread_mutex_lock(&t->mu);
    bool room = t->pool_len + t->pool_reserved < t->pool_cap && t->pool_bytes + fb <= t->pool_max_bytes;
    if (room) {
        t->pool_reserved++;
        t->pool_bytes += fb;
    }
    pthread_mutex_unlock(&t->mu);
    if (!room) return false;
    char sub[3], rel[64], full[KVO__FILE_PATH_MAX];
    kvo__file_subdir(k, sub);
    snprintf(rel, sizeof rel, "%s/%s%08x.%ld.%08x.%u", sub, KVO__FILE_TMP_PREFIX, t->hostid, t->pid, t->nonce,
             atomic_fetch_add(&t->tmp_counter, 1));
    snprintf(full, sizeof full, "%s/%s", t->ns_dir, rel);
    bool ok = rename(path, full) == 0;
    pthread_mutex_lock(&t->mu);
    t->pool_reserved--;
    if (ok) {
        kvo__recycled *r = &t->pool[t->pool_len++];
        memcpy(r->rel, rel, sizeof r->rel);
        r->file_bytes = fb;
    } else {
        t->pool_bytes -= fb;
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

/* Take a recycled file of exactly file_bytes (its path into out), if any. */
bool kvo__file_recycled_take(kvo_file_tier *t, uint64_t file_bytes, char *out, size_t cap) {
    bool got = false;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = t->pool_len; i-- > 0;) {
        if (t->pool[i].file_bytes != file_bytes) continue;
        snprintf(out, cap, "%s/%s", t->ns_dir, t->pool[i].rel);
        t->pool_bytes -= t->pool[i].file_bytes;
        t->pool[i] = t->pool[--t->pool_len];
        got = true;
        break;
    }
    if (got) t->st.recycled_files++;
    pthread_mutex_unlock(&t->mu);
    return got;
}

void kvo__file_unlink_evicted(kvo_file_tier *t, const kvo_chunk_key *ev, size_t n) {
    char path[KVO__FILE_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvo__file_key_path(t, &ev[i], path);
        if (recycle_file(t, &ev[i], path)) continue;
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

