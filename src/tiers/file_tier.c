/*
 * The file tier: a persistent, crash-safe, capacity-bounded chunk store in a
 * directory (format: file_format.c and docs/file-format.md).
 *
 * Pieces
 *  - Index and quota: a kvo_store whose capacity is the byte quota.  Its
 *    slots are only accounting (no memory behind them); its states give the
 *    file states: PENDING = a write is queued or running, READY = a complete
 *    file exists (as far as this process knows), pinned = being read.  Its
 *    eviction policies (LRU, ARC, S3-FIFO) choose which files to delete when a
 *    new write needs room; a pinned (being read) or pending file is never
 *    evicted by this process.
 *  - Write path (caller's thread): back-pressure checks (queue bound,
 *    latency), a staging slot, prepare_store for the key in the quota index
 *    (evicting: the evicted files are unlinked right away), a copy of the
 *    caller's bytes into the staging slot, and the op is queued.  Nothing here
 *    waits for the disk except the unlinks of evicted files.
 *  - Staging memory is one region mapped and pre-faulted at create (first
 *    touch of fresh memory runs at well under 1 GB/s here: pay it once, not on
 *    the engine's thread), its slots kept by a second kvo_store (per-group
 *    slot sizes; full = back-pressure).  Slots are 4096-aligned, so with the
 *    op's 4096-byte header buffer one pwritev writes the whole file with
 *    O_DIRECT and no further copy.
 *  - Worker side: checksum the payload, encode the header, write header +
 *    payload to an unnamed file (O_TMPFILE) in the fan-out directory and link
 *    it in by name (linkat through /proc/self/fd; EEXIST means another writer
 *    placed the same key first: fine), or where the file system cannot do
 *    that, to a temporary file (O_EXCL, .tmp.<host>.<pid>.<counter>) renamed
 *    into place.  Optional fdatasync before, directory fsync after.  Then
 *    complete_store(ok) or, on any failure, remove the temporary file and
 *    complete_store(fail) with a counter and a rate-limited log line.
 *  - Recycling: when the quota is full, each write evicts a file; the evicted
 *    file is renamed to a temporary name and a later write of the same size
 *    overwrites it in place and renames it (no inode or block allocation:
 *    measured several times faster than creating files on ext4).  Off in
 *    shared mode, where another process may be reading the evicted file.
 *  - Backends: writes always run on a pool of io_threads threads (a write is
 *    bound by creating a file: open, block allocation, link, which io_uring
 *    would only hand to its own workers, and measured best with 2-4 in
 *    parallel); reads run on io_uring when it works (uring/file_uring.c), else
 *    on the same pool.  Reads are taken before writes.
 *  - Read path: prepare_load pins the key; a worker opens the file, checks its
 *    type and size, reads header and payload in one preadv straight into the
 *    caller's buffer, checks header, key, fingerprint, geometry and payload
 *    checksum.  A file that fails is unlinked (only if it is still the same
 *    inode: another process may have replaced it with a good one), counted,
 *    dropped from the index, and reported as KVO_ECORRUPT: a miss.
 *  - Startup scan: one readdir per fan-out directory and one fstatat per
 *    file (no header reads: bad files are found on first read); keys are
 *    adopted oldest first (by last use), so files beyond the quota are
 *    evicted in age order; stale temporaries of dead writers are removed.
 *    Hits on a restarted process follow.
 *
 * Bounded resources: ops are allocated on demand and kept on a free list (the
 * steady state allocates nothing); staging memory is fixed at create
 * (max_staging_bytes) and queued writes are capped by max_pending_writes: a
 * write beyond either is dropped (counted), never waited for.  The completion queue holds
 * only completions of operations the caller asked for.
 *
 * Locking: one mutex (mu) for queues, free lists, counters and completions;
 * never held during file I/O or while calling the store (which has its own
 * lock).  Workers wait on work_cv; flush and wait on done_cv.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "tiers/file_internal.h"

enum { LOG_NOSPC, LOG_IO, LOG_CORRUPT, LOG_BACKPRESSURE, LOG_KINDS };

#define EVICT_CAP 64

struct kvo_file_tier {
    kvo_file_tier_params p;
    char root[KVO__FILE_PATH_MAX];
    char ns_dir[KVO__FILE_PATH_MAX];
    const kvo_plan *plan;
    kvo_store *index;
    uint64_t quota;               /* quota_bytes, clamped to the file system */
    bool direct;
    bool tmpfile;                 /* O_TMPFILE + linkat works here */
    bool uring;
    uint32_t hostid;
    uint32_t nonce;               /* per process: tells our temps from those of
                                     an earlier process with the same pid */
    long pid;
    atomic_uint tmp_counter;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    kvo__fop *rq_head, *rq_tail;  /* reads: served first */
    kvo__fop *wq_head, *wq_tail;
    kvo__fop *free_ops;
    kvo_arena *stage_arena;       /* staging memory: allocated once, pre-faulted */
    kvo_store *stage_index;       /* its slots: one per queued write */
    uint64_t pending_writes;
    uint64_t inflight_reports;    /* ops that will produce a completion */
    kvo_file_completion *cq;
    size_t cq_cap, cq_head, cq_len;
    int efd;
    bool closing;
    pthread_t *threads;
    uint32_t n_threads;
    void *uring_state;

    /* Recycling: files of evicted chunks, renamed to temporary names, are
     * overwritten in place by later writes of the same size (no inode or
     * block allocation: several times faster on ext4 once the quota is
     * full).  Only when no other process uses the root (!params.shared). */
    struct recycled { char rel[64]; uint64_t file_bytes; } *pool;
    uint32_t pool_len, pool_reserved, pool_cap;

    kvo_file_tier_stats st;       /* counters; gauges filled at get_stats */
    uint64_t lat_ewma_ns;
    uint64_t last_log_ns[LOG_KINDS];
    uint64_t suppressed[LOG_KINDS];
};

/* A per-process random number in temporary names (see stale_tmp). */
static uint32_t process_nonce(void) {
    static atomic_uint nonce;
    unsigned v = atomic_load(&nonce);
    if (v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seed[3] = {(uint64_t)ts.tv_nsec, (uint64_t)ts.tv_sec, (uint64_t)getpid()};
    unsigned n = (unsigned)XXH3_64bits(seed, sizeof seed) | 1u;
    unsigned expect = 0;
    atomic_compare_exchange_strong(&nonce, &expect, n);
    return atomic_load(&nonce);
}

/* Test hook (process-wide). */
static atomic_int g_inject_err;
static atomic_uint g_inject_count;

void kvo_file_tier_inject_write_error(int err, uint32_t count) {
    atomic_store(&g_inject_err, err);
    atomic_store(&g_inject_count, count);
}

static int take_injected(void) {
    unsigned c = atomic_load(&g_inject_count);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&g_inject_count, &c, c - 1)) return atomic_load(&g_inject_err);
    }
    return 0;
}

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

/* ---------------------------------------------------------- logging -- */

static void tier_log(kvo_file_tier *t, int kind, const char *fmt, ...) KVO__PRINTF(3, 4);
static void tier_log(kvo_file_tier *t, int kind, const char *fmt, ...) {
    uint64_t now = kvo__now_ns(), interval = (uint64_t)t->p.log_interval_s * 1000000000u, suppressed;
    pthread_mutex_lock(&t->mu);
    if (t->last_log_ns[kind] && now - t->last_log_ns[kind] < interval) {
        t->suppressed[kind]++;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    t->last_log_ns[kind] = now;
    suppressed = t->suppressed[kind];
    t->suppressed[kind] = 0;
    pthread_mutex_unlock(&t->mu);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed)
        fprintf(stderr, "kvoffload file tier: %s (%llu similar events not logged)\n", msg,
                (unsigned long long)suppressed);
    else
        fprintf(stderr, "kvoffload file tier: %s\n", msg);
}

/* ------------------------------------------------------- small pieces -- */

static void key_path(const kvo_file_tier *t, const kvo_chunk_key *k, char *out) {
    kvo_file_chunk_path(t->ns_dir, k, out, KVO__FILE_PATH_MAX);
}

static const kvo_group_plan *group_of(const kvo_file_tier *t, const kvo_chunk_key *k) {
    const kvo_group_plan *g = kvo_plan_group(t->plan, k->group);
    return g && g->offloaded ? g : NULL;
}

static int mkdir_p(const char *path) {
    char buf[KVO__FILE_PATH_MAX];
    if (kvo__strlcpy(buf, path, sizeof buf)) return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(buf, &st) != 0) return -errno;
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
    return 0;
}

/* Ops: allocated on demand, reused from a free list; hdr is 4096-aligned. */
static kvo__fop *op_get(kvo_file_tier *t) {
    pthread_mutex_lock(&t->mu);
    kvo__fop *op = t->free_ops;
    if (op) t->free_ops = op->next;
    pthread_mutex_unlock(&t->mu);
    if (!op) {
        unsigned char *mem = kvo__malloc(sizeof(kvo__fop) + 2 * KVO_FILE_HEADER_BYTES);
        if (!mem) return NULL;
        op = (kvo__fop *)mem;
        uintptr_t h = (uintptr_t)(mem + sizeof(kvo__fop));
        h = (h + KVO_FILE_HEADER_BYTES - 1) & ~(uintptr_t)(KVO_FILE_HEADER_BYTES - 1);
        op->hdr = (unsigned char *)h;
    }
    unsigned char *hdr = op->hdr;
    memset(op, 0, offsetof(kvo__fop, tmp));
    op->tmp[0] = op->path[0] = 0;
    op->hdr = hdr;
    op->fd = -1;
    return op;
}

/* Called with mu held. */
static void op_put_locked(kvo_file_tier *t, kvo__fop *op) {
    op->next = t->free_ops;
    t->free_ops = op;
}

static uint64_t stage_size(const kvo_group_plan *g) { return KVO_FILE_HEADER_BYTES + g->slot_bytes; }

/* Give a write's staging slot back (not under mu). */
static void stage_release(kvo_file_tier *t, const kvo_chunk_key *k) {
    kvo_store_complete_store(t->stage_index, k, 1, false);
}

/* Room in the completion queue for one more reported op, taken when the op
 * is queued (with mu held): cq_len + inflight_reports <= cq_cap always, so
 * a finishing op never needs memory to report, and an op that was queued
 * always produces its completion.  KVO_ENOMEM (no message) when the queue
 * cannot grow. */
static int reserve_completion_locked(kvo_file_tier *t) {
    if (t->cq_len + t->inflight_reports < t->cq_cap) return 0;
    size_t ncap = t->cq_cap ? t->cq_cap * 2 : 64;
    kvo_file_completion *n = kvo__malloc(ncap * sizeof *n);
    if (!n) return KVO_ENOMEM;
    for (size_t i = 0; i < t->cq_len; i++) n[i] = t->cq[(t->cq_head + i) % t->cq_cap];
    kvo__free(t->cq);
    t->cq = n;
    t->cq_cap = ncap;
    t->cq_head = 0;
    return 0;
}

static void push_completion_locked(kvo_file_tier *t, const kvo__fop *op, uint64_t bytes) {
    assert(t->cq_len < t->cq_cap); /* reserved at enqueue */
    kvo_file_completion *c = &t->cq[(t->cq_head + t->cq_len) % t->cq_cap];
    c->user_data = op->user_data;
    c->key = op->key;
    c->op = op->kind == KVO__FOP_WRITE ? KVO_FILE_OP_WRITE : KVO_FILE_OP_READ;
    c->result = op->result;
    c->bytes = op->result == 0 ? bytes : 0;
    c->latency_ns = kvo__now_ns() - op->t_queued;
    if (t->cq_len++ == 0) {
        uint64_t one = 1;
        ssize_t w = write(t->efd, &one, sizeof one);
        (void)w;
    }
}

/* Keep an evicted file for reuse if the pool has room: rename it to a
 * temporary name in its directory.  Returns true when kept. */
static bool recycle_file(kvo_file_tier *t, const kvo_chunk_key *k, const char *path) {
    if (t->p.shared || t->pool_cap == 0) return false;
    const kvo_group_plan *g = group_of(t, k);
    if (!g) return false;
    pthread_mutex_lock(&t->mu);
    bool room = t->pool_len + t->pool_reserved < t->pool_cap;
    if (room) t->pool_reserved++;
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
        struct recycled *r = &t->pool[t->pool_len++];
        memcpy(r->rel, rel, sizeof r->rel);
        r->file_bytes = stage_size(g);
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

/* Take a recycled file of exactly file_bytes (its path into out), if any. */
static bool recycled_take(kvo_file_tier *t, uint64_t file_bytes, char *out, size_t cap) {
    bool got = false;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = t->pool_len; i-- > 0;) {
        if (t->pool[i].file_bytes != file_bytes) continue;
        snprintf(out, cap, "%s/%s", t->ns_dir, t->pool[i].rel);
        t->pool[i] = t->pool[--t->pool_len];
        got = true;
        break;
    }
    if (got) t->st.recycled_files++;
    pthread_mutex_unlock(&t->mu);
    return got;
}

static void unlink_evicted(kvo_file_tier *t, const kvo_chunk_key *ev, size_t n) {
    char path[KVO__FILE_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        key_path(t, &ev[i], path);
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
static int reserve_key(kvo_file_tier *t, const kvo_chunk_key *k, uint8_t *need, size_t *n_evicted) {
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
        if (rc == 0) unlink_evicted(t, hev, nev);
        kvo__free(hev);
        kvo__free(hevs);
    } else if (rc == 0) {
        unlink_evicted(t, ev, nev);
    }
    if (n_evicted) *n_evicted = rc == 0 ? nev : 0;
    return rc;
}

/* Put a key known to have a file into the index as READY (scan, shared-mode
 * adoption).  Returns 0, or an error (file left alone). */
static int adopt_key(kvo_file_tier *t, const kvo_chunk_key *k, size_t *evicted_out) {
    uint8_t need = 0;
    int rc = reserve_key(t, k, &need, evicted_out);
    if (rc) return rc;
    if (need) rc = kvo_store_complete_store(t->index, k, 1, true);
    return rc;
}

/* Does a complete-looking file for k exist (shared mode probe)? */
static bool probe_file(kvo_file_tier *t, const kvo_chunk_key *k, const kvo_group_plan *g) {
    char path[KVO__FILE_PATH_MAX];
    struct stat st;
    key_path(t, k, path);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == stage_size(g);
}

/* --------------------------------------------------------- op phases -- */

static int open_retry_mkdir(kvo_file_tier *t, const kvo_chunk_key *k, const char *path, int flags) {
    int fd = open(path, flags, 0644);
    if (fd < 0 && errno == ENOENT) {
        char sub[3], dir[KVO__FILE_PATH_MAX];
        kvo__file_subdir(k, sub);
        snprintf(dir, sizeof dir, "%s/%s", t->ns_dir, sub);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
        fd = open(path, flags, 0644);
    }
    return fd;
}

int kvo__fop_begin(kvo_file_tier *t, kvo__fop *op) {
    const kvo_group_plan *g = op->g;
    key_path(t, &op->key, op->path);
    if (op->kind == KVO__FOP_WRITE) {
        kvo__file_hdr h;
        kvo__file_hdr_init(&h, t->plan, t->p.layout_hash, g, &op->key, XXH3_64bits(op->stage, g->chunk_bytes));
        kvo__file_hdr_encode(&h, op->hdr);
        char sub[3];
        kvo__file_subdir(&op->key, sub);
        snprintf(op->tmp, sizeof op->tmp, "%s/%s/%s%08x.%ld.%08x.%u", t->ns_dir, sub, KVO__FILE_TMP_PREFIX,
                 t->hostid, t->pid, t->nonce, atomic_fetch_add(&t->tmp_counter, 1));
        op->recycled = false;
        if (recycled_take(t, stage_size(g), op->tmp, sizeof op->tmp)) {
            /* overwrite an evicted file of the same size in place (no
             * O_TRUNC: its blocks stay allocated), then rename it */
            op->fd = open(op->tmp, O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0));
            if (op->fd >= 0) op->recycled = true;
            else unlink(op->tmp);
        }
        if (op->recycled) {
            /* nothing more to open */
        } else if (t->tmpfile) {
            /* an unnamed file in the fan-out directory, linked in when whole */
            snprintf(op->tmp, sizeof op->tmp, "%s/%s", t->ns_dir, sub);
            op->fd = open_retry_mkdir(t, &op->key, op->tmp, O_TMPFILE | O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0));
            op->tmp[0] = 0;
        } else {
            int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | (t->direct ? O_DIRECT : 0);
            op->fd = open_retry_mkdir(t, &op->key, op->tmp, flags);
        }
        if (op->fd < 0) {
            op->tmp[0] = 0;
            return -errno;
        }
        int inj = take_injected();
        if (inj) return -inj;
        int delay = atomic_load(&kvo__file_test_write_delay_us);
        if (delay > 0) usleep((useconds_t)delay);
        op->iov[0].iov_base = op->hdr;
        op->iov[0].iov_len = KVO_FILE_HEADER_BYTES;
        op->iov[1].iov_base = op->stage;
        op->iov[1].iov_len = g->slot_bytes;
        op->iovcnt = 2;
        op->io_bytes = stage_size(g);
        return 0;
    }
    /* read */
    int flags = O_RDONLY | O_CLOEXEC | (op->direct ? O_DIRECT : 0);
    op->fd = open(op->path, flags);
    if (op->fd < 0 && op->direct && errno == EINVAL) { /* e.g. a directory */
        op->direct = false;
        op->fd = open(op->path, O_RDONLY | O_CLOEXEC);
    }
    if (op->fd < 0) {
        if (errno == ENOENT) return KVO_ENOTFOUND;
        return kvo__error(KVO_EIO, "%s: open: %s", op->path, strerror(errno));
    }
    struct stat st;
    if (fstat(op->fd, &st) != 0) return kvo__error(KVO_EIO, "%s: fstat: %s", op->path, strerror(errno));
    if (!S_ISREG(st.st_mode)) {
        kvo__error(KVO_ECORRUPT, "%s: not a regular file", op->path);
        return KVO_ECORRUPT;
    }
    if ((uint64_t)st.st_size != stage_size(g)) {
        kvo__error(KVO_ECORRUPT, "%s: %s (%lld bytes, expected %llu)", op->path,
                   st.st_size == 0 ? "zero-length file" : "wrong size: truncated or foreign", (long long)st.st_size,
                   (unsigned long long)stage_size(g));
        return KVO_ECORRUPT;
    }
    op->iov[0].iov_base = op->hdr;
    op->iov[0].iov_len = KVO_FILE_HEADER_BYTES;
    op->iov[1].iov_base = op->dst;
    op->iov[1].iov_len = g->slot_bytes;
    op->iovcnt = 2;
    op->io_bytes = stage_size(g);
    return 0;
}

/* Move the remaining bytes of op's iov with pwritev/preadv starting from
 * `done` bytes already moved.  Returns total moved or -errno; a read that
 * hits end of file returns the short count. */
static int64_t io_sync(kvo__fop *op, uint64_t done) {
    while (done < op->io_bytes) {
        struct iovec iov[2];
        int cnt = 0;
        uint64_t skip = done;
        for (int i = 0; i < op->iovcnt; i++) {
            if (skip >= op->iov[i].iov_len) { skip -= op->iov[i].iov_len; continue; }
            iov[cnt].iov_base = (unsigned char *)op->iov[i].iov_base + skip;
            iov[cnt].iov_len = op->iov[i].iov_len - skip;
            skip = 0;
            cnt++;
        }
        ssize_t r = op->kind == KVO__FOP_WRITE ? pwritev(op->fd, iov, cnt, (off_t)done)
                                               : preadv(op->fd, iov, cnt, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) {
            if (op->kind == KVO__FOP_WRITE) return -ENOSPC;
            break;
        }
        done += (uint64_t)r;
    }
    return (int64_t)done;
}

int64_t kvo__fop_io_continue(kvo__fop *op, uint64_t done) { return io_sync(op, done); }

static void fsync_dir(const char *file_path) {
    char dir[KVO__FILE_PATH_MAX];
    kvo__strlcpy(dir, file_path, sizeof dir);
    char *s = strrchr(dir, '/');
    if (!s) return;
    *s = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Hand a finished op back: index, stats, staging, completion. */
static void op_finish(kvo_file_tier *t, kvo__fop *op) {
    const kvo_group_plan *g = op->g;
    bool ok = op->result == 0;
    if (op->kind == KVO__FOP_WRITE) {
        kvo_store_complete_store(t->index, &op->key, 1, ok);
        stage_release(t, &op->key);
    } else {
        kvo_store_complete_load(t->index, &op->key, 1);
        if (op->result == KVO_ECORRUPT || op->result == KVO_ENOTFOUND) kvo_store_remove(t->index, &op->key, 1);
    }
    pthread_mutex_lock(&t->mu);
    if (op->kind == KVO__FOP_WRITE) {
        uint64_t lat = kvo__now_ns() - op->t_queued;
        t->lat_ewma_ns = t->lat_ewma_ns ? t->lat_ewma_ns - t->lat_ewma_ns / 8 + lat / 8 : lat;
        if (ok) {
            t->st.writes++;
            t->st.write_bytes += g->chunk_bytes;
        } else if (op->result == KVO_ENOSPC) {
            t->st.dropped_nospace++;
        } else {
            t->st.dropped_io++;
        }
        t->pending_writes--;
    } else {
        if (ok) {
            t->st.reads++;
            t->st.read_bytes += g->chunk_bytes;
        } else if (op->result == KVO_ECORRUPT) {
            t->st.corrupt_removed++;
        } else if (op->result == KVO_ENOTFOUND) {
            t->st.read_misses++;
        } else if (op->result != KVO_ECANCELED) {
            t->st.read_errors++;
        }
    }
    if (op->report) {
        push_completion_locked(t, op, g->chunk_bytes);
        t->inflight_reports--;
    }
    op_put_locked(t, op);
    pthread_cond_broadcast(&t->done_cv);
    pthread_mutex_unlock(&t->mu);
}

static int errno_to_result(int e) {
    return (e == ENOSPC || e == EDQUOT || e == EFBIG) ? KVO_ENOSPC : KVO_EIO;
}

/* A read's verdict: remove a bad file, close, hand back. */
void kvo__fop_read_verdict(kvo_file_tier *t, kvo__fop *op, int rc) {
    if (rc == KVO_ECORRUPT) {
        char why[512];
        kvo__strlcpy(why, kvo_last_error(), sizeof why);
        /* Remove it only if the path still names the file we read. */
        struct stat a, b;
        if (op->fd >= 0 && fstat(op->fd, &a) == 0 && lstat(op->path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            kvo__file_remove_any(op->path);
        tier_log(t, LOG_CORRUPT, "%s: failed verification, removed: %s", op->path, why);
    } else if (rc == KVO_EIO) {
        tier_log(t, LOG_IO, "read failed: %s", kvo_last_error());
    }
    if (op->fd >= 0) close(op->fd);
    op->fd = -1;
    op->result = rc;
    op_finish(t, op);
}

void kvo__fop_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res) {
    const kvo_group_plan *g = op->g;
    if (op->kind == KVO__FOP_WRITE) {
        int e = 0;
        if (io_res < 0) e = (int)-io_res;
        else if ((uint64_t)io_res < op->io_bytes) e = ENOSPC;
        if (!e && t->p.fsync != KVO_FILE_FSYNC_NONE && fdatasync(op->fd) != 0) e = errno;
        bool linked = t->tmpfile && !op->recycled;
        if (!e && linked) {
            char proc[64];
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", op->fd);
            /* EEXIST: another writer linked the same key first (same bytes) */
            if (linkat(AT_FDCWD, proc, AT_FDCWD, op->path, AT_SYMLINK_FOLLOW) != 0 && errno != EEXIST) e = errno;
        }
        if (op->fd >= 0 && close(op->fd) != 0 && !e) e = errno;
        op->fd = -1;
        if (!e && !linked && rename(op->tmp, op->path) != 0) {
            e = errno;
            if (e == ENOENT && op->recycled) { /* the key's directory does not exist yet */
                char sub[3], dir[KVO__FILE_PATH_MAX];
                kvo__file_subdir(&op->key, sub);
                snprintf(dir, sizeof dir, "%s/%s", t->ns_dir, sub);
                if ((mkdir(dir, 0755) == 0 || errno == EEXIST) && rename(op->tmp, op->path) == 0) e = 0;
            }
        }
        if (!e && t->p.fsync == KVO_FILE_FSYNC_FULL) fsync_dir(op->path);
        if (e) {
            if (op->tmp[0]) unlink(op->tmp);
            op->result = errno_to_result(e);
            if (op->result == KVO_ENOSPC)
                tier_log(t, LOG_NOSPC, "%s: no space (%s): chunk write dropped", t->ns_dir, strerror(e));
            else
                tier_log(t, LOG_IO, "%s: write failed (%s): chunk write dropped", op->path, strerror(e));
        } else {
            op->result = 0;
        }
        op_finish(t, op);
        return;
    }
    /* read */
    int rc = 0;
    if (io_res < 0) {
        rc = io_res == -EISDIR ? KVO_ECORRUPT : KVO_EIO;
        if (rc == KVO_EIO) kvo__error(rc, "%s: read: %s", op->path, strerror((int)-io_res));
    } else if ((uint64_t)io_res < op->io_bytes) {
        rc = kvo__error(KVO_ECORRUPT, "%s: truncated while reading (%lld of %llu bytes)", op->path,
                        (long long)io_res, (unsigned long long)op->io_bytes);
    } else {
        kvo__file_hdr h;
        rc = kvo__file_hdr_decode(op->hdr, KVO_FILE_HEADER_BYTES, &h);
        if (!rc) rc = kvo__file_hdr_check(&h, t->plan, &op->key);
        if (!rc) rc = kvo__file_hdr_check_layout(&h, t->p.layout_hash);
        if (!rc) {
            uint64_t sum = XXH3_64bits(op->dst, g->chunk_bytes);
            if (sum != h.payload_xxh3)
                rc = kvo__error(KVO_ECORRUPT, "payload checksum mismatch (stored %016llx, computed %016llx)",
                                (unsigned long long)h.payload_xxh3, (unsigned long long)sum);
        }
    }
    kvo__fop_read_verdict(t, op, rc);
}

void kvo__fop_run_sync(kvo_file_tier *t, kvo__fop *op) {
    int rc = kvo__fop_begin(t, op);
    if (rc != 0 && op->kind == KVO__FOP_READ) {
        kvo__fop_read_verdict(t, op, rc);
        return;
    }
    kvo__fop_end(t, op, rc < 0 ? rc : io_sync(op, 0));
}

kvo__fop *kvo__fop_next(kvo_file_tier *t, bool wait, unsigned kinds) {
    pthread_mutex_lock(&t->mu);
    for (;;) {
        kvo__fop *op = NULL;
        if ((kinds & KVO__FOP_READ) && t->rq_head) {
            op = t->rq_head;
            t->rq_head = op->next;
            if (!t->rq_head) t->rq_tail = NULL;
        } else if ((kinds & KVO__FOP_WRITE) && t->wq_head) {
            op = t->wq_head;
            t->wq_head = op->next;
            if (!t->wq_head) t->wq_tail = NULL;
        }
        if (op || !wait || t->closing) {
            pthread_mutex_unlock(&t->mu);
            return op;
        }
        pthread_cond_wait(&t->work_cv, &t->mu);
    }
}

/* Fill in an op's request and queue it for the workers (or the ring).
 * KVO_ENOMEM (no message) when no completion can be reserved for a reported
 * op: the op goes back to the free list, nothing is queued. */
static int enqueue(kvo_file_tier *t, kvo__fop *op, uint32_t kind, const kvo_chunk_key *k, const kvo_group_plan *g,
                   uint64_t user_data, bool report) {
    op->kind = kind;
    op->key = *k;
    op->key.reserved = 0;
    op->g = g;
    op->user_data = user_data;
    op->report = report;
    op->next = NULL;
    op->t_queued = kvo__now_ns();
    pthread_mutex_lock(&t->mu);
    if (report) {
        if (reserve_completion_locked(t)) {
            op_put_locked(t, op);
            pthread_mutex_unlock(&t->mu);
            return KVO_ENOMEM;
        }
        t->inflight_reports++;
    }
    kvo__fop **head = op->kind == KVO__FOP_READ ? &t->rq_head : &t->wq_head;
    kvo__fop **tail = op->kind == KVO__FOP_READ ? &t->rq_tail : &t->wq_tail;
    if (*tail) (*tail)->next = op;
    else *head = op;
    *tail = op;
    bool ring = t->uring && op->kind == KVO__FOP_READ;
    if (!ring) pthread_cond_signal(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
#if KVO_HAVE_URING
    if (ring) kvo__file_uring_kick(t->uring_state);
#endif
    return 0;
}

static void *worker_main(void *arg) {
    kvo_file_tier *t = arg;
    kvo__fop *op;
    unsigned kinds = t->uring ? KVO__FOP_WRITE : KVO__FOP_READ | KVO__FOP_WRITE;
    while ((op = kvo__fop_next(t, true, kinds)) != NULL) kvo__fop_run_sync(t, op);
    return NULL;
}

bool kvo__file_tier_closing(kvo_file_tier *t) {
    pthread_mutex_lock(&t->mu);
    bool c = t->closing && !t->rq_head;
    pthread_mutex_unlock(&t->mu);
    return c;
}

/* ------------------------------------------------------------- probes -- */

/* Probe O_DIRECT with a real write and read in the namespace directory.  Also
 * the writability check.  Returns 0 and sets *ok, or KVO_EIO. */
static int probe_direct(kvo_file_tier *t, bool *ok) {
    char path[KVO__FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s%08x.%ld.probe", t->ns_dir, KVO__FILE_TMP_PREFIX, t->hostid, t->pid);
    *ok = false;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return kvo__error(KVO_EIO, "file tier directory '%s' is not writable: %s", t->ns_dir, strerror(errno));
    close(fd);
    if (t->p.direct == KVO_FILE_DIRECT_OFF) {
        unlink(path);
        return 0;
    }
    void *buf = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        unlink(path);
        return kvo__error(KVO_ENOMEM, "probe buffer");
    }
    memset(buf, 0x5a, 4096);
    fd = open(path, O_RDWR | O_CLOEXEC | O_DIRECT);
    if (fd >= 0) {
        if (pwrite(fd, buf, 4096, 0) == 4096 && pread(fd, buf, 4096, 0) == 4096 &&
            ((unsigned char *)buf)[4095] == 0x5a)
            *ok = true;
        close(fd);
    }
    munmap(buf, 4096);
    unlink(path);
    return 0;
}

/* Can files be written unnamed (O_TMPFILE) and linked in by name (linkat
 * through /proc)?  Then a killed writer leaves nothing behind at all and a
 * write needs one directory operation less.  Otherwise: named temporary files
 * and rename.  Probed with the real flags, in the namespace directory. */
atomic_int kvo__file_test_no_tmpfile;
atomic_int kvo__file_test_write_delay_us;

static bool probe_tmpfile(kvo_file_tier *t) {
    if (atomic_load(&kvo__file_test_no_tmpfile)) return false;
    int fd = open(t->ns_dir, O_TMPFILE | O_WRONLY | O_CLOEXEC | (t->direct ? O_DIRECT : 0), 0644);
    if (fd < 0) return false;
    char proc[64], path[KVO__FILE_PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    snprintf(path, sizeof path, "%s/%s%08x.%ld.link", t->ns_dir, KVO__FILE_TMP_PREFIX, t->hostid, t->pid);
    unlink(path);
    bool ok = linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0;
    if (ok) unlink(path);
    close(fd);
    return ok;
}

/* --------------------------------------------------------------- scan -- */

/* Is a temporary file (.tmp.<host>.<pid>.<nonce>.<counter>) left by a
 * writer that is gone?  On this host: its process no longer exists, or it is
 * our pid with another process's nonce (pid reuse, e.g. pid 1 in containers).
 * A live process's temporaries (writes in flight, recycled files) are never
 * touched.  Another host's (shared file system): older than an hour. */
static bool stale_tmp_rule(uint32_t my_host, long my_pid, uint32_t my_nonce, int dfd, const char *name) {
    unsigned host = 0, nonce = 0, ctr = 0;
    long pid = 0;
    int got = sscanf(name + strlen(KVO__FILE_TMP_PREFIX), "%8x.%ld.%8x.%u", &host, &pid, &nonce, &ctr);
    if (got == 4 && host == my_host && pid > 0) {
        if (pid == my_pid) return nonce != my_nonce;
        return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
    return time(NULL) - st.st_mtime > 3600;
}

static bool stale_tmp(kvo_file_tier *t, int dfd, const char *name) {
    return stale_tmp_rule(t->hostid, t->pid, t->nonce, dfd, name);
}

static uint32_t host_id(void) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    return (uint32_t)XXH3_64bits(host, strlen(host));
}

int kvo_file_temp_stale(const char *path) {
    if (!path) return kvo__error(KVO_EINVAL, "kvo_file_temp_stale: NULL path");
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (strncmp(name, KVO__FILE_TMP_PREFIX, strlen(KVO__FILE_TMP_PREFIX)) != 0)
        return kvo__error(KVO_EINVAL, "%s: not a temporary file name (.tmp.*)", path);
    char dir[KVO__FILE_PATH_MAX];
    if (slash) {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof dir) return kvo__error(KVO_ERANGE, "%s: path too long", path);
        memcpy(dir, path, n);
        dir[n] = 0;
        if (n == 0) snprintf(dir, sizeof dir, "/");
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return kvo__error(KVO_EIO, "%s: %s", dir, strerror(errno));
    bool stale = stale_tmp_rule(host_id(), (long)getpid(), process_nonce(), dfd, name);
    close(dfd);
    return stale ? 1 : 0;
}

/* The scan collects every chunk file's key and last use (the later of its
 * access and modification times: with relatime the access time moves at
 * least daily), sorts by it, and adopts oldest first in batches (one store
 * call per batch instead of two per file), so that the eviction order after
 * a restart follows the files' age rather than directory order. */
typedef struct scan_item {
    kvo_chunk_key key;
    int64_t used;
} scan_item;

static int scan_item_cmp(const void *a, const void *b) {
    const scan_item *x = a, *y = b;
    return (x->used > y->used) - (x->used < y->used);
}

enum { SCAN_BATCH = 256, SCAN_EVICT_CAP = SCAN_BATCH * 64 };
typedef struct scan_scratch {
    kvo_chunk_key keys[SCAN_BATCH];
    uint8_t need[SCAN_BATCH];
    kvo_slot slots[SCAN_BATCH];
    kvo_chunk_key ev[SCAN_EVICT_CAP];
    kvo_slot evs[SCAN_EVICT_CAP];
    size_t n;
} scan_scratch;

static void scan_flush(kvo_file_tier *t, scan_scratch *sc) {
    if (sc->n == 0) return;
    size_t nev = 0;
    int rc = kvo_store_prepare_store(t->index, sc->keys, sc->n, sc->need, sc->slots, sc->ev, sc->evs,
                                     SCAN_EVICT_CAP, &nev);
    if (rc == 0) {
        unlink_evicted(t, sc->ev, nev);
        t->st.evictions -= nev; /* counted by unlink_evicted; these are scan removals */
        t->st.scan_removed += nev;
        size_t m = 0;
        for (size_t i = 0; i < sc->n; i++)
            if (sc->need[i]) sc->keys[m++] = sc->keys[i];
        if (m) kvo_store_complete_store(t->index, sc->keys, m, true);
        t->st.scanned_files += m;
        sc->n = 0;
        return;
    }
    /* The batch does not fit as a whole (quota below it): one by one, so
     * that the newest of them evict the older ones. */
    char path[KVO__FILE_PATH_MAX];
    for (size_t i = 0; i < sc->n; i++) {
        size_t one = 0;
        if (adopt_key(t, &sc->keys[i], &one) != 0) {
            key_path(t, &sc->keys[i], path);
            kvo__file_remove_any(path);
            t->st.scan_removed++;
            continue;
        }
        t->st.scanned_files++;
        t->st.scan_removed += one;
        t->st.evictions -= one;
    }
    sc->n = 0;
}

/* The directory walk: stale temporaries and misplaced files are removed;
 * every chunk file's key and last use are collected, and the bytes they
 * occupy summed (for the quota clamp). */
static int scan_collect(kvo_file_tier *t, scan_item **out, size_t *n_out, uint64_t *disk_bytes) {
    scan_item *items = NULL;
    size_t n_items = 0, cap_items = 0;
    uint64_t bytes = 0;
    for (int b = 0; b < 256; b++) {
        char dir[KVO__FILE_PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%02x", t->ns_dir, b);
        DIR *d = opendir(dir);
        if (!d) continue;
        int dfd = dirfd(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            const char *name = e->d_name;
            if (name[0] == '.') {
                if (!strncmp(name, KVO__FILE_TMP_PREFIX, strlen(KVO__FILE_TMP_PREFIX)) && stale_tmp(t, dfd, name)) {
                    unlinkat(dfd, name, 0);
                    t->st.scan_removed++;
                }
                continue;
            }
            kvo_chunk_key k;
            if (kvo__file_parse_name(name, &k) != 0) continue; /* not ours: leave it */
            struct stat st;
            bool is_dir = e->d_type == DT_DIR;
            bool have_st = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
            if (have_st) is_dir = S_ISDIR(st.st_mode);
            if ((int)(k.hash.lo & 0xff) != b || !group_of(t, &k) || is_dir) {
                /* misplaced, a group this layout does not offload, or a directory */
                char path[KVO__FILE_PATH_MAX];
                snprintf(path, sizeof path, "%s/%s", dir, name);
                kvo__file_remove_any(path);
                t->st.scan_removed++;
                continue;
            }
            if (!have_st) continue; /* vanished meanwhile */
            if (n_items == cap_items) {
                size_t ncap = cap_items ? 2 * cap_items : 1024;
                scan_item *n = kvo__realloc(items, ncap * sizeof *n);
                if (!n) {
                    closedir(d);
                    kvo__free(items);
                    return kvo__error(KVO_ENOMEM, "file tier: scan of %zu files", n_items);
                }
                items = n;
                cap_items = ncap;
            }
            items[n_items].key = k;
            items[n_items].used = st.st_atime > st.st_mtime ? (int64_t)st.st_atime : (int64_t)st.st_mtime;
            n_items++;
            bytes += (uint64_t)st.st_blocks * 512u;
        }
        closedir(d);
    }
    *out = items;
    *n_out = n_items;
    *disk_bytes = bytes;
    return 0;
}

/* Adopt the collected files into the index, oldest first. */
static int scan_adopt(kvo_file_tier *t, scan_item *items, size_t n_items) {
    scan_scratch *sc = kvo__malloc(sizeof *sc);
    if (!sc) return kvo__error(KVO_ENOMEM, "file tier: scan scratch");
    sc->n = 0;
    if (n_items > 1) qsort(items, n_items, sizeof *items, scan_item_cmp);
    for (size_t i = 0; i < n_items; i++) {
        sc->keys[sc->n++] = items[i].key;
        if (sc->n == SCAN_BATCH) scan_flush(t, sc);
    }
    scan_flush(t, sc);
    kvo__free(sc);
    return 0;
}

/* The quota the file system can actually hold: free space plus what this
 * namespace's files occupy, less the 4 KiB header per file and a margin.  A
 * quota above it would, once the disk is full, drop every new write with
 * ENOSPC instead of evicting old files. */
static uint64_t clamp_quota(kvo_file_tier *t, uint64_t quota, uint64_t ours, uint64_t max_slot) {
    struct statvfs vfs;
    if (statvfs(t->ns_dir, &vfs) != 0 || vfs.f_frsize == 0) return quota;
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    uint64_t room = avail + ours;
    if (room / 2 > UINT64_MAX / 64) return quota;
    /* payload share of a file, and 5 % for metadata and other writers */
    uint64_t fit = (uint64_t)((double)room * 0.95 * (double)max_slot / (double)(max_slot + KVO_FILE_HEADER_BYTES));
    if (fit >= quota) return quota;
    uint64_t q = fit < max_slot ? max_slot : fit;
    fprintf(stderr, "kvoffload file tier: %s: quota %llu bytes is more than the file system can hold (%llu free + "
            "%llu in this namespace); using %llu\n", t->ns_dir, (unsigned long long)quota,
            (unsigned long long)avail, (unsigned long long)ours, (unsigned long long)q);
    return q;
}

/* ------------------------------------------------------------- create -- */

static void tier_free(kvo_file_tier *t) {
    if (!t) return;
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
    kvo__free(t->cq);
    kvo__free(t->threads);
    if (t->efd >= 0) close(t->efd);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    kvo__free(t);
}

int kvo_file_tier_create(const kvo_file_tier_params *p, kvo_file_tier **out) {
    if (!p || !out) return kvo__error(KVO_EINVAL, "kvo_file_tier_create: NULL argument");
    if (!p->root || !p->root[0]) return kvo__error(KVO_EINVAL, "file tier: no root directory given");
    if (!p->plan) return kvo__error(KVO_EINVAL, "file tier: no plan given");
    uint64_t max_slot = kvo_plan_max_slot_bytes(p->plan);
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
    if (strlen(p->root) > KVO__FILE_PATH_MAX - 200)
        return kvo__error(KVO_EINVAL, "file tier: root path too long (%zu bytes)", strlen(p->root));

    scan_item *items = NULL;
    size_t n_items = 0;
    kvo_file_tier *t = kvo__calloc(1, sizeof *t);
    if (!t) return kvo__error(KVO_ENOMEM, "file tier: out of memory");
    t->p = *p;
    if (t->p.io_threads == 0) t->p.io_threads = 1;
    if (t->p.queue_depth == 0) t->p.queue_depth = 16;
    if (t->p.max_pending_writes == 0) t->p.max_pending_writes = 64;
    if (t->p.max_staging_bytes < max_slot) t->p.max_staging_bytes = max_slot;
    t->plan = p->plan;
    t->efd = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    t->pid = (long)getpid();
    t->hostid = host_id();
    t->nonce = process_nonce();
    /* a few files beyond the quota, so that queued writes find one */
    t->pool_cap = t->p.shared ? 0 : (t->p.max_pending_writes < 16 ? t->p.max_pending_writes : 16);
    if (t->pool_cap) {
        t->pool = kvo__calloc(t->pool_cap, sizeof *t->pool);
        if (!t->pool) {
            pthread_mutex_destroy(&t->mu);
            pthread_cond_destroy(&t->work_cv);
            pthread_cond_destroy(&t->done_cv);
            kvo__free(t);
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

    int rc;
    int e = mkdir_p(t->ns_dir);
    if (e < 0) {
        rc = kvo__error(KVO_EIO, "file tier: cannot create directory '%s': %s (is the root '%s' writable?)",
                        t->ns_dir, strerror(-e), t->root);
        goto fail;
    }
    rc = probe_direct(t, &t->direct);
    if (rc) goto fail;
    if (p->direct == KVO_FILE_DIRECT_ON && !t->direct) {
        rc = kvo__error(KVO_ENOTSUP, "file tier: O_DIRECT does not work on '%s' (tmpfs and some network file "
                        "systems refuse it); use direct = AUTO or OFF", t->ns_dir);
        goto fail;
    }
    rc = kvo__file_manifest_ensure(t->ns_dir, p->plan, p->layout_hash);
    if (rc) goto fail;
    t->tmpfile = probe_tmpfile(t);

    /* Walk the namespace first: what it holds decides, with the free space,
     * how large the quota can really be. */
    uint64_t t_scan = kvo__now_ns(), ours = 0;
    if (p->scan) {
        rc = scan_collect(t, &items, &n_items, &ours);
        if (rc) goto fail;
    }
    t->st.scan_ns = kvo__now_ns() - t_scan;
    t->quota = clamp_quota(t, p->quota_bytes, ours, max_slot);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p->plan;
    sp.capacity_bytes = t->quota;
    sp.policy = p->policy;
    sp.max_entries = p->max_files;
    rc = kvo_store_create(&sp, &t->index);
    if (rc) {
        kvo__error_prefix(rc, "file tier quota index");
        goto fail;
    }
    /* Staging: one pre-faulted region (first touch of new memory is slow:
     * pay it here, not on the engine's thread), its slots kept by a store
     * (per-group slot sizes, shared by all groups). */
    kvo_arena_params ap = kvo_arena_default_params();
    ap.bytes = kvo__align_up_u64(t->p.max_staging_bytes, KVO_SLOT_ALIGN);
    rc = kvo_arena_create(&ap, &t->stage_arena);
    if (rc) {
        kvo__error_prefix(rc, "file tier staging memory (max_staging_bytes)");
        goto fail;
    }
    sp.capacity_bytes = ap.bytes;
    sp.policy = KVO_POLICY_LRU;
    sp.max_entries = 0;
    rc = kvo_store_create(&sp, &t->stage_index);
    if (rc) {
        kvo__error_prefix(rc, "file tier staging index");
        goto fail;
    }
    t->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->efd < 0) {
        rc = kvo__error(KVO_EIO, "file tier: eventfd: %s", strerror(errno));
        goto fail;
    }
    if (p->scan) {
        t_scan = kvo__now_ns();
        rc = scan_adopt(t, items, n_items);
        if (rc) goto fail;
        t->st.scan_ns += kvo__now_ns() - t_scan;
    }
    kvo__free(items);
    items = NULL;

    /* Everything that can fail comes before the ring thread starts, except
     * the worker threads, whose failure path stops the ring. */
    t->threads = kvo__calloc(t->p.io_threads, sizeof(pthread_t));
    if (!t->threads) {
        rc = kvo__error(KVO_ENOMEM, "file tier: threads");
        goto fail;
    }
    if (p->io != KVO_FILE_IO_THREADS) {
#if KVO_HAVE_URING
        rc = kvo__file_uring_start(t, t->p.queue_depth, &t->uring_state);
        if (rc == 0) t->uring = true;
        else if (p->io == KVO_FILE_IO_URING) goto fail;
#else
        if (p->io == KVO_FILE_IO_URING) {
            rc = kvo__error(KVO_ENOTSUP, "file tier: this build has no io_uring support (liburing not found)");
            goto fail;
        }
#endif
    }
    for (uint32_t i = 0; i < t->p.io_threads; i++) {
        if (pthread_create(&t->threads[i], NULL, worker_main, t) != 0) {
            pthread_mutex_lock(&t->mu);
            t->closing = true;
            pthread_cond_broadcast(&t->work_cv);
            pthread_mutex_unlock(&t->mu);
            for (uint32_t j = 0; j < i; j++) pthread_join(t->threads[j], NULL);
#if KVO_HAVE_URING
            if (t->uring) kvo__file_uring_stop(t, t->uring_state);
#endif
            rc = kvo__error(KVO_ENOMEM, "file tier: cannot start I/O thread %u", i);
            goto fail;
        }
        t->n_threads++;
    }
    *out = t;
    return 0;
fail:
    kvo__free(items);
    tier_free(t);
    return rc;
}

void kvo_file_tier_destroy(kvo_file_tier *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->closing = true;
    kvo__fop *reads = t->rq_head;
    t->rq_head = t->rq_tail = NULL;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (kvo__fop *op = reads, *n; op; op = n) {
        n = op->next;
        op->result = KVO_ECANCELED;
        op_finish(t, op);
    }
#if KVO_HAVE_URING
    if (t->uring) kvo__file_uring_stop(t, t->uring_state);
#endif
    for (uint32_t i = 0; i < t->n_threads; i++) pthread_join(t->threads[i], NULL);
    tier_free(t);
}

const char *kvo_file_tier_dir(const kvo_file_tier *t) { return t ? t->ns_dir : NULL; }
const char *kvo_file_tier_backend(const kvo_file_tier *t) { return t && t->uring ? "io_uring" : "threads"; }
bool kvo_file_tier_direct(const kvo_file_tier *t) { return t && t->direct; }
int kvo_file_tier_event_fd(const kvo_file_tier *t) { return t ? t->efd : -1; }

/* ------------------------------------------------------------ lookup -- */

int kvo_file_tier_lookup(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n, uint8_t *states) {
    if (!t || (n && (!keys || !states))) return kvo__error(KVO_EINVAL, "kvo_file_tier_lookup: NULL argument");
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!group_of(t, &keys[i]))
            return kvo__error(KVO_EINVAL, "file tier lookup: key %zu has group %u, which the plan does not offload",
                              i, keys[i].group);
    int rc = kvo_store_lookup(t->index, keys, n, states);
    if (rc) return rc;
    if (t->p.shared) {
        for (size_t i = 0; i < n; i++) {
            if (states[i] != KVO_MISS || !probe_file(t, &keys[i], group_of(t, &keys[i]))) continue;
            if (adopt_key(t, &keys[i], NULL) == 0) states[i] = KVO_READY;
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
        key_path(t, &keys[i], path);
        kvo__file_remove_any(path);
    }
    return 0;
}

/* ------------------------------------------------------------- write -- */

/* Key i of a write or read batch: its group, or NULL with *r set to
 * KVO_EINVAL (and the message) when the plan does not offload it or its
 * buffer (the op's `what`) is NULL. */
static const kvo_group_plan *batch_item(kvo_file_tier *t, const kvo_chunk_key *keys, size_t i, const void *buf,
                                        const char *op, const char *what, int *r) {
    const kvo_group_plan *g = group_of(t, &keys[i]);
    *r = 0;
    if (g && buf) return g;
    *r = kvo__error(KVO_EINVAL, "file tier %s: key %zu: %s%s", op, i, !g ? "group not offloaded by the plan" : "NULL ",
                    !g ? "" : what);
    return NULL;
}

int kvo_file_tier_write(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                        const uint64_t *user_data, int *results, size_t *n_queued) {
    if (!t || (n && (!keys || !srcs))) return kvo__error(KVO_EINVAL, "kvo_file_tier_write: NULL argument");
    size_t queued = 0;
    int ret = 0;
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
            tier_log(t, LOG_BACKPRESSURE, "%s: writes fall behind (%llu queued, latency %.1f ms): dropping stores",
                     t->ns_dir, (unsigned long long)behind, lat / 1e6);
            r = KVO_EAGAIN;
            goto next;
        }
        t->pending_writes++;
        pthread_mutex_unlock(&t->mu);

        /* 2. a staging slot (none free: back-pressure, the write is dropped). */
        uint8_t sneed = 0;
        kvo_slot sslot;
        int srs = kvo_store_prepare_store(t->stage_index, &keys[i], 1, &sneed, &sslot, NULL, NULL, 0, NULL);
        if (srs != 0 || !sneed) {
            pthread_mutex_lock(&t->mu);
            t->pending_writes--;
            if (srs == 0) t->st.write_skipped++; /* the same key is being staged right now */
            else t->st.dropped_backpressure++;
            pthread_cond_broadcast(&t->done_cv);
            pthread_mutex_unlock(&t->mu);
            if (srs != 0)
                tier_log(t, LOG_BACKPRESSURE, "%s: staging memory full (max_staging_bytes %llu): dropping stores",
                         t->ns_dir, (unsigned long long)t->p.max_staging_bytes);
            r = srs == 0 ? KVO_EEXIST : KVO_EAGAIN;
            goto next;
        }
        unsigned char *stage = kvo_arena_slot(t->stage_arena, sslot);

        /* 3. the index: reserve quota, evict. */
        uint8_t need = 0;
        int src = reserve_key(t, &keys[i], &need, NULL);
        if (src != 0 || !need) {
            stage_release(t, &keys[i]);
            pthread_mutex_lock(&t->mu);
            t->pending_writes--;
            if (src == 0) t->st.write_skipped++;
            else t->st.dropped_quota++;
            pthread_cond_broadcast(&t->done_cv);
            pthread_mutex_unlock(&t->mu);
            r = src == 0 ? KVO_EEXIST : KVO_ENOSPC;
            goto next;
        }
        /* 4. copy the payload (zero padding) and queue. */
        memcpy(stage, srcs[i], g->chunk_bytes);
        if (g->slot_bytes > g->chunk_bytes) memset(stage + g->chunk_bytes, 0, g->slot_bytes - g->chunk_bytes);
        kvo__fop *op = op_get(t);
        if (op) op->stage = stage;
        if (!op || enqueue(t, op, KVO__FOP_WRITE, &keys[i], g, user_data ? user_data[i] : 0,
                           t->p.write_completions) != 0) {
            kvo_store_complete_store(t->index, &keys[i], 1, false);
            stage_release(t, &keys[i]);
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
        if (lr == KVO_ENOTFOUND && t->p.shared && probe_file(t, &keys[i], g) && adopt_key(t, &keys[i], NULL) == 0)
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
        kvo__fop *op = op_get(t);
        if (op) {
            op->dst = dsts[i];
            op->direct = t->direct && ((uintptr_t)dsts[i] % KVO_FILE_HEADER_BYTES) == 0;
        }
        if (!op || enqueue(t, op, KVO__FOP_READ, &keys[i], g, user_data ? user_data[i] : 0, true) != 0) {
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

size_t kvo_file_tier_poll(kvo_file_tier *t, kvo_file_completion *out, size_t cap) {
    if (!t || !out || !cap) return 0;
    pthread_mutex_lock(&t->mu);
    size_t n = t->cq_len < cap ? t->cq_len : cap;
    for (size_t i = 0; i < n; i++) {
        out[i] = t->cq[t->cq_head];
        t->cq_head = (t->cq_head + 1) % t->cq_cap;
    }
    t->cq_len -= n;
    if (t->cq_len == 0 && n) {
        uint64_t v;
        ssize_t r = read(t->efd, &v, sizeof v);
        (void)r;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

static void deadline_ts(int timeout_ms, struct timespec *ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int kvo_file_tier_wait(kvo_file_tier *t, int timeout_ms) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_file_tier_wait: NULL tier");
    struct timespec ts;
    if (timeout_ms >= 0) deadline_ts(timeout_ms, &ts);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    while (t->cq_len == 0) {
        if (t->inflight_reports == 0) {
            rc = KVO_ENOTFOUND;
            break;
        }
        if (timeout_ms < 0) pthread_cond_wait(&t->done_cv, &t->mu);
        else if (pthread_cond_timedwait(&t->done_cv, &t->mu, &ts) == ETIMEDOUT && t->cq_len == 0) {
            rc = KVO_ETIMEDOUT;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (rc == KVO_ENOTFOUND) return kvo__error(rc, "file tier: nothing in flight to wait for");
    if (rc == KVO_ETIMEDOUT) return kvo__error(rc, "file tier: no completion within %d ms", timeout_ms);
    return 0;
}

int kvo_file_tier_flush(kvo_file_tier *t, int timeout_ms) {
    if (!t) return kvo__error(KVO_EINVAL, "kvo_file_tier_flush: NULL tier");
    struct timespec ts;
    if (timeout_ms >= 0) deadline_ts(timeout_ms, &ts);
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

int kvo_file_tier_get_stats(kvo_file_tier *t, kvo_file_tier_stats *out) {
    if (!t || !out) return kvo__error(KVO_EINVAL, "kvo_file_tier_get_stats: NULL argument");
    kvo_store_stats ss, sst;
    int rc = kvo_store_get_stats(t->index, &ss);
    if (rc) return rc;
    bool have_sst = kvo_store_get_stats(t->stage_index, &sst) == 0; /* not under mu: see Locking */
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    out->pending_writes = t->pending_writes;
    out->write_latency_ns = t->lat_ewma_ns;
    pthread_mutex_unlock(&t->mu);
    if (have_sst) out->staging_bytes = sst.bytes_used;
    out->quota_bytes = t->quota;
    out->bytes_used = ss.bytes_used;
    out->files = ss.entries - ss.pending;
    return 0;
}

/* For file_pin.c (the tier's struct is private to this file). */
kvo_store *kvo__file_tier_index(kvo_file_tier *t) { return t->index; }
uint64_t kvo__file_tier_layout(const kvo_file_tier *t) { return t->p.layout_hash; }
