/*
 * The file tier's public API: a persistent, crash-safe, capacity-bounded
 * chunk store in a directory (format: file_format.c and
 * docs/file-format.md).  This file owns the parameters, create/destroy (as
 * phases: check, allocate, open the namespace, build the index, start the
 * workers), the write and read entry points, lookup/touch/remove,
 * completions (poll, wait, flush) and stats.  It is the top of the file
 * tier: the other pieces, one job per file, never call up into it (see
 * file_internal.h for the list and the layering):
 * file_ops.c runs one operation, file_workers.c queues and completes them,
 * file_quota.c keeps the quota index and recycles evicted files,
 * file_probe.c decides what the file system can do, file_scan.c walks the
 * namespace at startup, file_common.c has the key path and the log,
 * file_share.c keeps the quota that the processes of a namespace share
 * (params.shared).
 *
 * Pieces seen from here
 *  - Index and quota: a kvo_store whose capacity is the byte quota.  Its
 *    slots are only accounting (no memory behind them); its states give the
 *    file states: PENDING = a write is queued or running, READY = a complete
 *    file exists (as far as this process knows), pinned = being read.  Its
 *    eviction policies (LRU, ARC, S3-FIFO) choose which files to delete when
 *    a new write needs room; a pinned or pending file is never evicted by
 *    this process.
 *  - Write path (caller's thread): back-pressure checks (queue bound,
 *    latency), a staging slot, prepare_store for the key in the quota index
 *    (evicting: the evicted files are unlinked or recycled right away), a
 *    copy of the caller's bytes into the staging slot, and the op is queued.
 *    Nothing here waits for the disk except the unlinks of evicted files.
 *  - Staging memory is one region mapped and pre-faulted at create (first
 *    touch of fresh memory runs at well under 1 GB/s here: pay it once, not
 *    on the engine's thread), its slots kept by a second kvo_store (per-group
 *    slot sizes; full = back-pressure).  Slots are 4096-aligned, so with the
 *    op's 4096-byte header buffer one pwritev writes the whole file with
 *    O_DIRECT and no further copy.
 *  - Read path: prepare_load pins the key; a worker or the ring reads and
 *    verifies it (file_ops.c); a file that fails is removed and reported as
 *    KVO_ECORRUPT: a miss.
 *  - Shared namespace (params.shared): create attaches to the namespace's
 *    accounting before the scan, holding its attach lock until the scanned
 *    files are adopted; the first process attached records the quota (its
 *    own, clamped), the others take the recorded one; the scan's walk
 *    recounts.  A write whose reservation the shared quota refuses, in a
 *    process that holds nothing it can evict, evicts files no index here
 *    holds (file_scan.c) and tries once more.
 *  - Read-only: when no file can be created at create (ENOSPC: no free
 *    inode or block, EDQUOT, EROFS), the tier opens anyway and serves what
 *    is there; writes are dropped (dropped_readonly) until a probe, at most
 *    every kvo__file_ro_retry_ms, creates a file again.
 *
 * Bounded resources: ops are kept on a free list (the steady state
 * allocates nothing); staging memory is fixed at create (max_staging_bytes)
 * and queued writes are capped by max_pending_writes: a write beyond either
 * is dropped (counted), never waited for.  The completion queue holds only
 * completions of operations the caller asked for.
 *
 * Locking: one mutex (mu) for queues, free lists, counters and completions;
 * never held during file I/O or while calling the store (which has its own
 * lock).  Workers wait on work_cv; flush and wait on done_cv.
 */
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "tiers/file_internal.h"
#include "tiers/seal.h"


const char *kvo_file_io_name(kvo_file_io_kind k) {
    switch (k) {
    case KVO_FILE_IO_AUTO: return "auto";
    case KVO_FILE_IO_URING: return "uring";
    case KVO_FILE_IO_THREADS: return "threads";
    }
    return "?";
}

const char *kvo_file_fsync_name(kvo_file_fsync_policy p) {
    switch (p) {
    case KVO_FILE_FSYNC_NONE: return "none";
    case KVO_FILE_FSYNC_DATA: return "data";
    case KVO_FILE_FSYNC_FULL: return "full";
    }
    return "?";
}

kvo_file_tier_params kvo_file_tier_default_params(void) {
    kvo_file_tier_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.policy = KVO_POLICY_LRU;
    p.fsync = KVO_FILE_FSYNC_NONE;
    p.io = KVO_FILE_IO_AUTO;
    p.direct = KVO_FILE_DIRECT_AUTO;
    p.io_threads = 4;
    p.queue_depth = 4;
    p.max_pending_writes = 64;
    p.max_staging_bytes = UINT64_C(64) << 20;
    p.write_latency_limit_ms = 0;
    p.write_completions = false;
    p.shared = false;
    p.scan = true;
    p.log_interval_s = 10;
    return p;
}

/* ------------------------------------------------------------- create -- */

static void tier_free(kvo_file_tier *t) {
    if (!t) return;
    kvo__fshare_detach(t->share); /* after the workers: no write holds a reservation now */
    kvo_store_destroy(t->index);
    for (kvo__fop *op = t->free_ops, *n; op; op = n) {
        n = op->next;
        kvo__free(op);
    }
    kvo_store_destroy(t->stage_index);
    kvo_arena_destroy(t->stage_arena);
    for (uint32_t i = 0; i < t->pool_len; i++) {
        char path[KVO__FILE_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", t->ns_dir, t->pool[i].rel);
        unlink(path);
    }
    kvo__free(t->pool);
    kvo__ring_free(&t->cq);
    kvo__seal_destroy(t->seal);
    kvo__free(t->threads);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->share_mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    kvo__free(t);
}

/* Create phase 1: the parameters alone (nothing allocated yet). */
static int check_params(const kvo_file_tier_params *p, uint64_t max_slot) {
    if (max_slot == 0) return kvo__error(KVO_EINVAL, "file tier: the plan offloads no group");
    if (p->quota_bytes < max_slot) {
        for (size_t i = 0; i < kvo_plan_num_groups(p->plan); i++) {
            const kvo_group_plan *g = kvo_plan_group(p->plan, i);
            if (g->offloaded && g->slot_bytes == max_slot)
                return kvo__error(KVO_EINVAL, "file tier: quota %llu bytes is below one chunk of group '%s' "
                                  "(%llu bytes); use a quota of at least %llu",
                                  (unsigned long long)p->quota_bytes, g->name, (unsigned long long)max_slot,
                                  (unsigned long long)max_slot);
        }
    }
    if (p->io > KVO_FILE_IO_THREADS || p->direct > KVO_FILE_DIRECT_OFF || p->fsync > KVO_FILE_FSYNC_FULL)
        return kvo__error(KVO_EINVAL, "file tier: unknown io (%d), direct (%d) or fsync (%d) value", (int)p->io,
                          (int)p->direct, (int)p->fsync);
    if (p->file_mode && ((p->file_mode & ~0666u) || (p->file_mode & 0600u) != 0600u))
        return kvo__error(KVO_EINVAL, "file tier: file_mode %04o: want 0600 plus group/other read or write bits "
                          "(e.g. 0640: a group reads, 0660: it also writes); no execute, set-id or sticky bits",
                          p->file_mode);
    if (strlen(p->root) > KVO__FILE_PATH_MAX - 200)
        return kvo__error(KVO_EINVAL, "file tier: root path too long (%zu bytes)", strlen(p->root));
    return 0;
}

/* Create phase 2: the object, its defaults, locks, identity, recycling pool
 * and namespace path.  0 or KVO_ENOMEM. */
static int tier_alloc(const kvo_file_tier_params *p, uint64_t max_slot, kvo_file_tier **out) {
    kvo_file_tier *t = kvo__calloc(1, sizeof *t);
    if (!t) return kvo__error(KVO_ENOMEM, "file tier: out of memory");
    t->p = *p;
    t->p.file_secret = NULL; /* never kept: t->seal holds the keys derived from it */
    t->fmode = p->file_mode ? p->file_mode : 0600u;
    t->dmode = t->fmode | ((t->fmode & 0444u) >> 2); /* read bits give search bits: 0600 -> 0700, 0640 -> 0750 */
    if (t->p.io_threads == 0) t->p.io_threads = 1;
    if (t->p.queue_depth == 0) t->p.queue_depth = 16;
    if (t->p.max_pending_writes == 0) t->p.max_pending_writes = 64;
    if (t->p.max_staging_bytes < max_slot) t->p.max_staging_bytes = max_slot;
    t->plan = p->plan;
    t->cq.efd = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->share_mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    t->pid = (long)getpid();
    t->hostid = kvo__file_host_id();
    t->nonce = kvo__file_process_nonce();
    /* as many files as writes can be queued (count and staging bytes), so
     * that every queued write finds one once the quota is full */
    t->pool_cap = t->p.shared ? 0 : (t->p.max_pending_writes < 4096 ? (uint32_t)t->p.max_pending_writes : 4096);
    t->pool_max_bytes = t->p.max_staging_bytes;
    for (size_t i = 0; i < kvo_plan_num_groups(p->plan); i++) { /* the ballast's unit: the largest slot */
        const kvo_group_plan *g = kvo_plan_group(p->plan, i);
        if (g->offloaded && g->slot_bytes > t->ballast_unit) {
            t->ballast_unit = g->slot_bytes;
            t->ballast_group = (uint32_t)i;
        }
    }
    if (t->pool_cap) {
        t->pool = kvo__calloc(t->pool_cap, sizeof *t->pool);
        if (!t->pool) {
            tier_free(t);
            return kvo__error(KVO_ENOMEM, "file tier: recycling pool");
        }
    }
    kvo__strlcpy(t->root, p->root, sizeof t->root);
    t->p.root = t->root;
    char fph[33];
    kvo_u128_hex(kvo_plan_fingerprint(p->plan), fph);
    if (p->layout_hash)
        snprintf(t->ns_dir, sizeof t->ns_dir, "%s/%s-%016llx", t->root, fph, (unsigned long long)p->layout_hash);
    else
        snprintf(t->ns_dir, sizeof t->ns_dir, "%s/%s", t->root, fph);
    *out = t;
    return 0;
}

/* Create phase 3: the namespace directory, the probes, the manifest.  When
 * no file can be created (no free inode or block, a quota, a read-only file
 * system) but the namespace exists, the tier opens read-only: the files
 * already there are served, writes are dropped (file_probe.c). */
static int open_namespace(kvo_file_tier *t) {
    int rc = kvo__file_mkdir_p(t->ns_dir, t->dmode);
    if (rc) return rc;
    int werr = 0;
    rc = kvo__file_probe_direct(t, &t->direct, &werr);
    bool ro = rc != 0 && (werr == ENOSPC || werr == EDQUOT || werr == EROFS);
    if (rc && !ro) return rc;
    if (ro) {
        atomic_store(&t->readonly, true);
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s: cannot create a file (%s): opened read-only: the chunks "
                 "already there are served, writes are dropped (dropped_readonly) until files can be created "
                 "again", t->ns_dir, strerror(werr));
        t->direct = t->p.direct != KVO_FILE_DIRECT_OFF && kvo__file_probe_direct_read(t);
    }
    rc = kvo__file_make_fanout(t->ns_dir, t->dmode);
    if (rc && !ro) return rc;
    kvo__file_clean_ns_temps(t);
    if (t->p.direct == KVO_FILE_DIRECT_ON && !t->direct)
        return kvo__error(KVO_ENOTSUP, "file tier: O_DIRECT does not work on '%s' (tmpfs and some network file "
                          "systems refuse it); use direct = AUTO or OFF", t->ns_dir);
    bool rebuilt = false;
    rc = kvo__file_manifest_ensure(t->ns_dir, t->plan, t->p.layout_hash, t->fmode, &rebuilt);
    if (rc && !(ro && (rc == KVO_ENOSPC || rc == KVO_EIO))) return rc; /* read-only: chunk headers still verify */
    if (rebuilt)
        kvo__file_log(t, KVO__FLOG_CORRUPT, "%s/%s was damaged: rebuilt from the plan (chunk files are verified "
                      "on every read)", t->ns_dir, KVO__FILE_MANIFEST);
    t->tmpfile = !ro && kvo__file_probe_tmpfile(t);
    return 0;
}

/* params.shared: attach to the namespace's accounting (file_share.c).
 * When it cannot be used the tier goes on with a quota of its own, as
 * before sharing existed, and says so. */
static void attach_shared(kvo_file_tier *t, bool *first) {
    int rc = kvo__fshare_attach(t->ns_dir, t->fmode, &t->share, first);
    if (rc)
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s: no shared quota (%s): this process keeps its own quota "
                 "and index", t->ns_dir, kvo_last_error());
}

/* The quota in force with the shared accounting: the first process to
 * attach (no other attached) records its quota, clamped to the file system
 * once for all; the others use the recorded one and say once when theirs
 * differs. */
static uint64_t agree_quota(kvo_file_tier *t, bool first, uint64_t ours, uint64_t max_slot) {
    uint64_t clamped = first ? kvo__file_clamp_quota(t, t->p.quota_bytes, ours, max_slot) : 0, rec = 0;
    uint64_t q = kvo__fshare_agree(t->share, first, t->p.quota_bytes, clamped, &rec);
    if (!first && (rec != t->p.quota_bytes || q > t->p.quota_bytes))
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s: quota_bytes %llu differs from the shared quota of this "
                 "namespace: using %llu (recorded by the first process to open it, which was given %llu; it is "
                 "recorded again once every process has closed the namespace)", t->ns_dir,
                 (unsigned long long)t->p.quota_bytes, (unsigned long long)q, (unsigned long long)rec);
    return q;
}

/* Create phase 4: walk the namespace first (what it holds decides, with the
 * free space, how large the quota can really be), create the quota index,
 * the staging memory (one pre-faulted region: first touch of new memory is
 * slow, pay it here, not on the engine's thread; its slots kept by a store,
 * per-group slot sizes shared by all groups) and the eventfd, then adopt
 * the scanned files. */
static int build_index(kvo_file_tier *t, uint64_t max_slot) {
    kvo__scan_item *items = NULL;
    size_t n_items = 0;
    uint64_t t_scan = kvo__now_ns(), ours = 0;
    int rc;
    bool first = false;
    kvo__fshare_snap snap;
    memset(&snap, 0, sizeof snap);
    if (t->p.shared) attach_shared(t, &first); /* holds the attach lock until the scan is adopted */
    if (t->share) kvo__fshare_snapshot(t->share, &snap);
    if (t->p.scan && (rc = kvo__file_scan_collect(t, &items, &n_items, &ours)) != 0) return rc;
    t->st.scan_ns = kvo__now_ns() - t_scan;
    if (t->share) {
        t->quota = agree_quota(t, first, ours, max_slot);
        if (t->p.scan) kvo__fshare_recount(t->share, first, &snap, ours, n_items);
    } else {
        t->quota = kvo__file_clamp_quota(t, t->p.quota_bytes, ours, max_slot);
    }
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = t->plan;
    sp.capacity_bytes = t->quota;
    sp.policy = t->p.policy;
    sp.max_entries = t->p.max_files;
    rc = kvo_store_create(&sp, &t->index);
    if (rc) {
        kvo__error_prefix(rc, "file tier quota index");
        goto out;
    }
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = kvo__align_up_u64(t->p.max_staging_bytes, KVO_SLOT_ALIGN);
    rc = kvo_arena_create(&ap, &t->stage_arena);
    if (rc) {
        kvo__error_prefix(rc, "file tier staging memory (max_staging_bytes)");
        goto out;
    }
    sp.capacity_bytes = ap.bytes;
    sp.policy = KVO_POLICY_LRU;
    sp.max_entries = 0;
    rc = kvo_store_create(&sp, &t->stage_index);
    if (rc) {
        kvo__error_prefix(rc, "file tier staging index");
        goto out;
    }
    rc = kvo__ring_init(&t->cq, sizeof(kvo_file_completion), 0, 0, true, "file tier completions");
    if (rc) goto out;
    if (t->p.scan) {
        t_scan = kvo__now_ns();
        rc = kvo__file_scan_adopt(t, items, n_items);
        if (rc == 0) t->st.scan_ns += kvo__now_ns() - t_scan;
    }
    if (rc == 0 && t->share) {
        kvo__file_share_settle(t); /* what other processes hold beyond the scanned files */
        kvo__fshare_attached(t->share);
    }
out:
    kvo__free(items);
    return rc;
}

int kvo_file_tier_create(const kvo_file_tier_params *p, kvo_file_tier **out) {
    kvo_file_tier_params p_in_;
    KVO__PARAMS_IN(p, kvo_file_tier_params, p_in_, kvo_file_tier_default_params, layout_hash, "kvo_file_tier_create");
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_file_tier_create: NULL argument");
    if (!p->root || !p->root[0]) return kvo__error(KVO_EINVAL, "file tier: no root directory given");
    if (!p->plan) return kvo__error(KVO_EINVAL, "file tier: no plan given");
    uint64_t max_slot = kvo_plan_max_slot_bytes(p->plan);
    int rc = check_params(p, max_slot);
    if (rc) return rc;
    kvo_file_tier *t = NULL;
    if ((rc = tier_alloc(p, max_slot, &t)) != 0) return rc;
    if (p->file_secret && p->file_secret[0] &&
        (rc = kvo__seal_create(p->file_secret, NULL, "file tier: file_secret", &t->seal)) != 0) {
        tier_free(t);
        return rc;
    }
    /* Everything that can fail comes before the ring thread starts, except
     * the worker threads, whose failure path stops the ring. */
    if ((rc = open_namespace(t)) != 0 || (rc = build_index(t, max_slot)) != 0 ||
        (rc = kvo__file_workers_start(t)) != 0) {
        tier_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kvo_file_tier_destroy(kvo_file_tier *t) {
    if (!t) return;
    kvo__file_workers_stop(t);
    tier_free(t);
}

const char *kvo_file_tier_dir(const kvo_file_tier *t) { return t ? t->ns_dir : NULL; }
const char *kvo_file_tier_backend(const kvo_file_tier *t) { return t && t->uring ? "io_uring" : "threads"; }
bool kvo_file_tier_direct(const kvo_file_tier *t) { return t && t->direct; }
int kvo_file_tier_event_fd(const kvo_file_tier *t) { return t ? t->cq.efd : -1; }

/* ------------------------------------------------------------ lookup -- */

int kvo_file_tier_lookup(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    if (!t || (n && (!keys || !states))) return kvo__error(KVO_EINVAL, "kvo_file_tier_lookup: NULL argument");
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!kvo__file_group_of(t, &keys[i]))
            return kvo__error(KVO_EINVAL, "file tier lookup: key %zu has group %u, which the plan does not offload",
                              i, keys[i].group);
    int rc = kvo_store_lookup(t->index, keys, n, states);
    if (rc) return rc;
    if (t->p.shared) {
        for (size_t i = 0; i < n; i++) {
            if (states[i] != KVO_MISS || !kvo__file_probe_key(t, &keys[i], kvo__file_group_of(t, &keys[i]))) continue;
            if (kvo__file_adopt_key(t, &keys[i], NULL) == 0) states[i] = KVO_READY;
        }
    }
    uint64_t hits = 0;
    for (size_t i = 0; i < n; i++) hits += states[i] == KVO_READY;
    pthread_mutex_lock(&t->mu);
    t->st.hits += hits;
    t->st.misses += n - hits;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int kvo_file_tier_touch(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_file_tier_touch: NULL argument");
    if (n == 0) return 0;
    return kvo_store_touch(t->index, keys, n);
}

int kvo_file_tier_remove(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n) {
    if (!t || (n && !keys)) return kvo__error(KVO_EINVAL, "kvo_file_tier_remove: NULL argument");
    if (n == 0) return 0;
    int rc = kvo_store_remove(t->index, keys, n);
    if (rc) return rc;
    char path[KVO__FILE_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvo__file_key_path(t, &keys[i], path);
        (void)kvo__file_unlink_key(t, &keys[i], path, true);
    }
    return 0;
}

/* ------------------------------------------------------------- write -- */

/* Key i of a write or read batch: its group, or NULL with *r set to
 * KVO_EINVAL (and the message) when the plan does not offload it or its
 * buffer (the op's `what`) is NULL. */
static const kvo_group_plan *batch_item(kvo_file_tier *t, const kvo_chunk_key *keys, size_t i, const void *buf,
                                        const char *op, const char *what, int *r) {
    const kvo_group_plan *g = kvo__file_group_of(t, &keys[i]);
    *r = 0;
    if (g && buf) return g;
    *r = kvo__error(KVO_EINVAL, "file tier %s: key %zu: %s%s", op, i, !g ? "group not offloaded by the plan" : "NULL ",
                    !g ? "" : what);
    return NULL;
}

/* Whether a borrowed write can take src in place: the payload slot has no
 * padding to zero and, with O_DIRECT, src is aligned as the device needs
 * (else the write copies into staging like any other). */
static bool can_borrow(const kvo_file_tier *t, const kvo_group_plan *g, const void *src) {
    if (t->seal) return false; /* sealed in staging, never in the caller's memory */
    return g->slot_bytes == g->chunk_bytes && (!t->direct || ((uintptr_t)src & (KVO_FILE_HEADER_BYTES - 1)) == 0);
}

/* kvo_file_tier_write and kvo_file_tier_write_borrowed (borrow). */
/* A read-only tier (no file could be created) tries again at most every
 * kvo__file_ro_retry_ms; true when it is writable now. */
static bool writable(kvo_file_tier *t) {
    if (!atomic_load(&t->readonly)) return true;
    if (t->p.shared && !t->share) return false; /* no accounting could be attached: stays read-only */
    uint64_t now = kvo__now_ns(), every = (uint64_t)atomic_load(&kvo__file_ro_retry_ms) * 1000000u;
    pthread_mutex_lock(&t->mu);
    bool due = now - t->ro_probe_ns >= every;
    if (due) t->ro_probe_ns = now;
    pthread_mutex_unlock(&t->mu);
    if (!due || !kvo__file_probe_writable(t)) return false;
    bool was = true;
    if (atomic_compare_exchange_strong(&t->readonly, &was, false))
        kvo__log(KVO_LOG_WARN, "kvoffload file tier: %s: files can be created again: writable", t->ns_dir);
    return true;
}

static int write_batch(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs, const uint64_t *sums,
                       size_t n, const uint64_t *user_data, int *results, size_t *n_queued, bool borrow) {
    size_t queued = 0;
    int ret = 0;
    if (n && !writable(t)) {
        for (size_t i = 0; i < n && results; i++) results[i] = KVO_ENOSPC;
        pthread_mutex_lock(&t->mu);
        t->st.dropped_readonly += n;
        pthread_mutex_unlock(&t->mu);
        if (n_queued) *n_queued = 0;
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        int r;
        const kvo_group_plan *g = batch_item(t, keys, i, srcs[i], "write", "source", &r);
        if (!g) goto next;
        /* 1. back-pressure: queue bound and latency (under the lock). */
        pthread_mutex_lock(&t->mu);
        if (t->closing) {
            pthread_mutex_unlock(&t->mu);
            ret = kvo__error(KVO_ECLOSED, "file tier is shutting down");
            break;
        }
        bool slow = t->p.write_latency_limit_ms && t->pending_writes > 0 &&
                    t->lat_ewma_ns > (uint64_t)t->p.write_latency_limit_ms * 1000000u;
        if (t->pending_writes >= t->p.max_pending_writes || slow) {
            t->st.dropped_backpressure++;
            uint64_t behind = t->pending_writes, lat = t->lat_ewma_ns; /* read under the lock */
            pthread_mutex_unlock(&t->mu);
            kvo__file_log(t, KVO__FLOG_BACKPRESSURE, "%s: writes fall behind (%llu queued, latency %.1f ms): dropping stores",
                     t->ns_dir, (unsigned long long)behind, lat / 1e6);
            r = KVO_EAGAIN;
            goto next;
        }
        t->pending_writes++;
        pthread_mutex_unlock(&t->mu);

        /* 2. a staging slot (none free: back-pressure, the write is dropped);
         * a borrowed write takes none */
        bool lend = borrow && can_borrow(t, g, srcs[i]);
        uint8_t sneed = 0;
        kvo_slot sslot;
        int srs = lend ? 0 : kvo_store_prepare_store(t->stage_index, &keys[i], 1, &sneed, &sslot, NULL, NULL, 0, NULL);
        if (lend) sneed = 1;
        if (srs != 0 || !sneed) {
            pthread_mutex_lock(&t->mu);
            t->pending_writes--;
            if (srs == 0) t->st.write_skipped++; /* the same key is being staged right now */
            else t->st.dropped_backpressure++;
            pthread_cond_broadcast(&t->done_cv);
            pthread_mutex_unlock(&t->mu);
            if (srs != 0)
                kvo__file_log(t, KVO__FLOG_BACKPRESSURE, "%s: staging memory full (max_staging_bytes %llu): dropping stores",
                         t->ns_dir, (unsigned long long)t->p.max_staging_bytes);
            r = srs == 0 ? KVO_EEXIST : KVO_EAGAIN;
            goto next;
        }
        unsigned char *stage = lend ? (unsigned char *)(uintptr_t)srcs[i] : kvo_arena_slot(t->stage_arena, sslot);

        /* 3. the index: reserve quota, evict. */
        uint8_t need = 0;
        int src = kvo__file_reserve_key(t, &keys[i], &need, NULL);
        if (src == KVO_ENOSPC && t->share && kvo__file_evict_foreign(t, g->slot_bytes) > 0)
            src = kvo__file_reserve_key(t, &keys[i], &need, NULL); /* room made from files no index here holds */
        if (src != 0 || !need) {
            if (!lend) kvo__file_stage_release(t, &keys[i]);
            pthread_mutex_lock(&t->mu);
            t->pending_writes--;
            if (src == 0) t->st.write_skipped++;
            else t->st.dropped_quota++;
            pthread_cond_broadcast(&t->done_cv);
            pthread_mutex_unlock(&t->mu);
            r = src == 0 ? KVO_EEXIST : KVO_ENOSPC;
            goto next;
        }
        /* 4. copy the payload (zero padding) and queue; a borrowed one is
         * hashed where it is, by the worker (write_begin) */
        uint64_t sum = 0;
        if (!lend) {
            sum = kvo__file_copy_sum(stage, srcs[i], g->chunk_bytes);
            if (g->slot_bytes > g->chunk_bytes) memset(stage + g->chunk_bytes, 0, g->slot_bytes - g->chunk_bytes);
        }
        kvo__fop *op = kvo__fop_get(t);
        if (op) {
            op->stage = stage;
            op->sum = lend && sums ? sums[i] : sum;
            op->expect = lend && sums;
            op->borrowed = lend;
        }
        if (!op || kvo__fop_enqueue(t, op, KVO__FOP_WRITE, &keys[i], g, user_data ? user_data[i] : 0,
                           t->p.write_completions || borrow) != 0) {
            kvo_store_complete_store(t->index, &keys[i], 1, false);
            if (!lend) kvo__file_stage_release(t, &keys[i]);
            pthread_mutex_lock(&t->mu);
            t->pending_writes--;
            t->st.dropped_backpressure++;
            pthread_cond_broadcast(&t->done_cv);
            pthread_mutex_unlock(&t->mu);
            r = KVO_EAGAIN;
            goto next;
        }
        queued++;
    next:
        if (results) results[i] = r;
    }
    if (n_queued) *n_queued = queued;
    return ret;
}

int kvo_file_tier_write(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                        const uint64_t *user_data, int *results, size_t *n_queued) {
    if (!t || (n && (!keys || !srcs))) return kvo__error(KVO_EINVAL, "kvo_file_tier_write: NULL argument");
    return write_batch(t, keys, srcs, NULL, n, user_data, results, n_queued, false);
}

int kvo_file_tier_write_borrowed(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs,
                                 const uint64_t *sums, size_t n, const uint64_t *user_data, int *results,
                                 size_t *n_queued) {
    if (!t || (n && (!keys || !srcs))) return kvo__error(KVO_EINVAL, "kvo_file_tier_write_borrowed: NULL argument");
    return write_batch(t, keys, srcs, sums, n, user_data, results, n_queued, true);
}

/* -------------------------------------------------------------- read -- */

int kvo_file_tier_read(kvo_file_tier *t, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                       const uint64_t *user_data, int *results, size_t *n_queued) {
    if (!t || (n && (!keys || !dsts))) return kvo__error(KVO_EINVAL, "kvo_file_tier_read: NULL argument");
    size_t queued = 0;
    int ret = 0;
    for (size_t i = 0; i < n; i++) {
        int r;
        const kvo_group_plan *g = batch_item(t, keys, i, dsts[i], "read", "destination", &r);
        if (!g) goto next;
        pthread_mutex_lock(&t->mu);
        bool closing = t->closing;
        pthread_mutex_unlock(&t->mu);
        if (closing) {
            ret = kvo__error(KVO_ECLOSED, "file tier is shutting down");
            break;
        }
        kvo_slot slot;
        int lr = kvo_store_prepare_load(t->index, &keys[i], 1, &slot);
        if (lr == KVO_ENOTFOUND && t->p.shared && kvo__file_probe_key(t, &keys[i], g) && kvo__file_adopt_key(t, &keys[i], NULL) == 0)
            lr = kvo_store_prepare_load(t->index, &keys[i], 1, &slot);
        if (lr) {
            r = lr == KVO_EAGAIN ? KVO_EAGAIN : KVO_ENOTFOUND;
            if (r == KVO_ENOTFOUND) {
                pthread_mutex_lock(&t->mu);
                t->st.read_misses++;
                pthread_mutex_unlock(&t->mu);
            }
            goto next;
        }
        kvo__fop *op = kvo__fop_get(t);
        if (op) {
            op->dst = dsts[i];
            op->direct = t->direct && ((uintptr_t)dsts[i] % KVO_FILE_HEADER_BYTES) == 0;
        }
        if (!op || kvo__fop_enqueue(t, op, KVO__FOP_READ, &keys[i], g, user_data ? user_data[i] : 0, true) != 0) {
            kvo_store_complete_load(t->index, &keys[i], 1);
            r = kvo__error(KVO_ENOMEM, "file tier read: out of memory");
            goto next;
        }
        queued++;
    next:
        if (results) results[i] = r;
    }
    if (n_queued) *n_queued = queued;
    return ret;
}

/* -------------------------------------------------------- completion -- */

int kvo_file_tier_poll(kvo_file_tier *t, kvo_file_completion *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || !n_out || (!out && cap)) return kvo__error(KVO_EINVAL, "kvo_file_tier_poll: NULL argument");
    pthread_mutex_lock(&t->mu);
    size_t n = kvo__ring_take(&t->cq, out, cap);
    pthread_mutex_unlock(&t->mu);
    *n_out = n;
    return 0;
}

int kvo_file_tier_wait(kvo_file_tier *t, int64_t timeout_ns) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_file_tier_wait: NULL tier");
    int timeout_ms = kvo__timeout_ms(timeout_ns);
    pthread_mutex_lock(&t->mu);
    int rc = kvo__ring_wait(&t->cq, &t->mu, &t->done_cv, timeout_ns, true);
    pthread_mutex_unlock(&t->mu);
    if (rc == KVO_ENOTFOUND) return kvo__error(rc, "file tier: nothing in flight to wait for");
    if (rc == KVO_ETIMEDOUT) return kvo__error(rc, "file tier: no completion within %d ms", timeout_ms);
    return 0;
}

int kvo_file_tier_flush(kvo_file_tier *t, int64_t timeout_ns) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_file_tier_flush: NULL tier");
    int timeout_ms = kvo__timeout_ms(timeout_ns);
    struct timespec ts;
    if (timeout_ms >= 0) kvo__deadline_ts(timeout_ms, &ts);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    while (t->pending_writes > 0) {
        if (timeout_ms < 0) pthread_cond_wait(&t->done_cv, &t->mu);
        else if (pthread_cond_timedwait(&t->done_cv, &t->mu, &ts) == ETIMEDOUT && t->pending_writes > 0) {
            rc = KVO_ETIMEDOUT;
            break;
        }
    }
    uint64_t left = t->pending_writes;
    pthread_mutex_unlock(&t->mu);
    if (rc) return kvo__error(rc, "file tier flush: %llu writes still pending after %d ms", (unsigned long long)left,
                              timeout_ms);
    return 0;
}

static int kvo__file_tier_get_stats_fill(kvo_file_tier *t, kvo_file_tier_stats *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_file_tier_get_stats: NULL argument");
    kvo_store_stats ss = KVO_STORE_STATS_INIT, sst = KVO_STORE_STATS_INIT;
    int rc = kvo_store_get_stats(t->index, &ss);
    if (rc) return rc;
    bool have_sst = kvo_store_get_stats(t->stage_index, &sst) == 0; /* not under mu: see Locking */
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->pending_writes = t->pending_writes;
    out->write_latency_ns = t->lat_ewma_ns;
    pthread_mutex_unlock(&t->mu);
    if (have_sst) out->staging_bytes = sst.bytes_used;
    uint64_t ballast = kvo__file_ballast_bytes(t);
    out->quota_bytes = t->quota;
    out->bytes_used = ss.bytes_used > ballast ? ss.bytes_used - ballast : 0;
    out->files = ss.entries - ss.pending; /* the ballast's entries are pending */
    out->read_only = atomic_load(&t->readonly);
    if (t->share) {
        out->shared = 1;
        out->shared_bytes_used = kvo__fshare_used(t->share);
        out->shared_files = kvo__fshare_files(t->share);
    }
    return 0;
}

int kvo_file_tier_get_stats(kvo_file_tier *t, kvo_file_tier_stats *out) {
    kvo_file_tier_stats full = KVO_FILE_TIER_STATS_INIT; /* struct_size convention: fill whole, copy out */
    KVO__STATS_OUT("kvo_file_tier_get_stats", kvo_file_tier_stats, write_latency_ns, "KVO_FILE_TIER_STATS_INIT",
                   out, full,
                   kvo__file_tier_get_stats_fill(t, &full));
}

/* For file_pin.c (the tier's struct is private to this file). */
