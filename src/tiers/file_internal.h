/*
 * File tier internals shared by its source files (one job each):
 *   file_tier.c     the public API: params, create/destroy, write, read,
 *                   lookup, completions, stats
 *   file_scan.c     the namespace walker (kvo_file_walk) and startup scan
 *   file_workers.c  the backends: worker threads, starting/stopping the ring
 *   uring/file_uring.c  the io_uring read backend
 *   file_ops.c      the phases of one operation (begin, I/O, end, verdict)
 *   file_queue.c    op free list, queues, completion ring, kvo__fop_finish
 *   file_quota.c    the quota index: reserve, adopt, evict, recycling
 *   file_common.c   the key's path and group, the rate-limited log
 *   file_probe.c    create-time probes: O_DIRECT, O_TMPFILE, quota clamp;
 *                   host id and process nonce
 *   file_format.c   names, header, verification, manifest (the format)
 *   file_share.c    the shared accounting of params.shared: one quota for
 *                   every process of a namespace (a mapped file)
 *   seal.c          sealing of chunks with a secret (seal.h; the Redis tier
 *                   uses it too)
 *   file_pin.c, file_testing.c  pins; the test hooks
 * The struct and the lock rule are below; each file's essay says what it
 * owns.
 *
 * Layering: a file calls kvo_/kvo__ functions only of the files below it
 * (uring/ counts as one of this folder's files; tools/check-layering.py
 * fails on a cycle).  Nothing calls up: an op's phases leave the outcome in
 * op->result for the backend to hand back, and the queue wakes the ring
 * through a function pointer (t->ring_kick).
 *   file_tier.c        top -> everything below
 *   file_scan.c        -> file_quota, file_share, file_common, file_probe,
 *                         file_format
 *   file_workers.c     -> uring/file_uring, file_ops, file_queue, file_share
 *   uring/file_uring.c -> file_ops, file_queue
 *   file_ops.c         -> file_quota, file_common, file_format, file_probe,
 *                         file_testing, seal
 *   file_queue.c       leaf (the stores only)
 *   file_quota.c       -> file_share, file_common, file_format
 *   file_share.c       -> file_probe
 *   file_common.c      -> file_format
 *   file_format.c      -> file_probe
 *   file_probe.c, file_pin.c, file_testing.c, arena.c, seal.c  leaves
 */
#ifndef KVO_TIERS_FILE_INTERNAL_H
#define KVO_TIERS_FILE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "core/internal.h"
#include "core/ring.h"

#ifndef KVO_HAVE_URING
#define KVO_HAVE_URING 0
#endif

/* ------------------------------------------------------------- format -- */

#define KVO__FILE_MAGIC "KVOCHUNK"      /* 8 bytes, no NUL */
#define KVO__FILE_HDR_USED 264u         /* bytes of the header that carry data
                                           (a sealed one: also the seal record
                                           up to byte 320, tiers/seal.h) */
#define KVO__FILE_VERSION_SEALED 2u     /* format version of a sealed chunk */
#define KVO__FILE_SUFFIX ".kvc"
#define KVO__FILE_TMP_PREFIX ".tmp."
#define KVO__FILE_MANIFEST "manifest.json"
#define KVO__FILE_FORMAT_NAME "kvoffload-file"
#define KVO__FILE_PATH_MAX 4096

/* Decoded header. */
typedef struct kvo__file_hdr {
    uint32_t version;
    uint32_t header_bytes;
    kvo_u128 fingerprint;
    kvo_chunk_key key;
    uint32_t kind;
    uint32_t tokens_per_block;
    uint32_t layers;
    uint64_t page_bytes;
    uint64_t blocks_per_chunk;
    uint64_t tokens_per_chunk;
    uint64_t chunk_bytes;
    uint64_t slot_bytes;
    uint64_t payload_xxh3;
    uint64_t created_ns;
    uint64_t layout_hash;     /* engine slot layout (0: not given) */
    bool sealed;              /* version KVO__FILE_VERSION_SEALED: the payload
                                 is sealed (tiers/seal.h), payload_xxh3 is 0 */
    char group_name[KVO_NAME_MAX];
    char model_name[KVO_NAME_MAX];
} kvo__file_hdr;

/* Copy a chunk's payload (n bytes) into staging and return its payload
 * checksum (XXH3-64), taken 64 KiB at a time right behind the copy, while
 * the piece is in cache: hashing the staged chunk later read it back from
 * memory (on the read side the same re-read was 15-20 % of a 256 KiB
 * remote read, measured with `kvoffload bench remote`, commits c333dab and
 * d438380).  The file tier's and the remote tier's
 * puts, and the remote reader's (reply.c), which hashes a GET it receives
 * in pieces of the same size. */
#define KVO__SUM_PIECE ((size_t)64 << 10)
uint64_t kvo__file_copy_sum(void *dst, const void *src, size_t n);
/* Fill a header for a group's chunk (payload checksum given). */
void kvo__file_hdr_init(kvo__file_hdr *h, const kvo_plan *plan, uint64_t layout_hash, const kvo_group_plan *g,
                        const kvo_chunk_key *key, uint64_t payload_xxh3);
/* Encode into KVO_FILE_HEADER_BYTES bytes (zero padded, header checksum);
 * version KVO__FILE_VERSION_SEALED when h->sealed (the seal record is then
 * kvo__seal_value's to write). */
void kvo__file_hdr_encode(const kvo__file_hdr *h, void *buf);
/* Decode and check magic, version (1, or 2: h->sealed), header checksum.
 * KVO_ECORRUPT with a message on failure. */
int kvo__file_hdr_decode(const void *buf, size_t len, kvo__file_hdr *h);
/* Check a decoded header against the expected key (may be NULL), the plan's
 * fingerprint and the group's geometry (plan may be NULL: only internal
 * consistency).  KVO_ECORRUPT with a message. */
int kvo__file_hdr_check(const kvo__file_hdr *h, const kvo_plan *plan, const kvo_chunk_key *expect);
/* The layout hash must match too (tier reads; not the plan-less checks). */
int kvo__file_hdr_check_layout(const kvo__file_hdr *h, uint64_t layout_hash);

/* Parse a chunk file name "<32 hex>-g<group>.kvc".  0 or KVO_EINVAL. */
int kvo__file_parse_name(const char *name, kvo_chunk_key *key);
/* "<32 hex>-g<group>.kvc" into out (>= 64 bytes). */
void kvo__file_name(const kvo_chunk_key *key, char *out, size_t cap);
/* Subdirectory (fan-out) of a key: two hex digits of hash.lo's low byte. */
void kvo__file_subdir(const kvo_chunk_key *key, char out[3]);

/* Manifest: write if absent, rebuild from the plan if damaged (unparsable
 * or not a regular file; *rebuilt, may be NULL, says so), else check.
 * KVO_EIO / KVO_ENOSPC / KVO_ESTATE (another version or layout). */
int kvo__file_manifest_ensure(const char *ns_dir, const kvo_plan *plan, uint64_t layout_hash, unsigned fmode,
                              bool *rebuilt);
/* Read a manifest's fingerprint, layout hash (0 when absent) and format
 * version (as written: never truncated), each out pointer may be NULL.
 * Strict: fingerprint 32 and layout_hash 16 lowercase hex digits exactly.
 * KVO_ENOTFOUND (none), KVO_EPARSE (damaged, or not a regular file), KVO_EIO. */
int kvo__file_manifest_read(const char *ns_dir, kvo_u128 *fingerprint, uint64_t *layout_hash, int64_t *version,
                            char **plan_json);
/* Open a path that must be a regular file without blocking on a FIFO:
 * O_NONBLOCK for the open, fstat, S_ISREG, then blocking mode again.  The
 * descriptor (>= 0; *st filled when given), or KVO_ENOTFOUND, KVO_ECORRUPT
 * (not a regular file, or unopenable: symlink loop, permission), KVO_EIO,
 * each with a message. */
int kvo__file_open_regular(const char *path, int flags, struct stat *st);

/* Remove a path whatever it is (file, or directory tree).  0, KVO_ENOTFOUND
 * or KVO_EIO (with the errno text in the message). */
int kvo__file_remove_any(const char *path);

/* -------------------------------------------------------------- tier -- */

enum { KVO__FOP_WRITE = 1, KVO__FOP_READ = 2 };

typedef struct kvo__fop kvo__fop;
struct kvo__fop {
    kvo__fop *next;
    uint32_t kind;
    bool report;              /* produce a completion */
    kvo_chunk_key key;
    uint64_t user_data;
    const kvo_group_plan *g;
    uint64_t t_queued;
    /* write: staging buffer = header + payload (file image), and the
     * payload's checksum (kvo__file_copy_sum) */
    unsigned char *stage;
    uint64_t sum;
    bool borrowed;            /* write: stage is the caller's memory (no
                                 staging slot; the sum is taken in begin) */
    bool expect;              /* borrowed: the caller gave the sum (sum):
                                 begin checks the bytes against it */
    /* read: destination and whether O_DIRECT is used for it */
    unsigned char *dst;
    bool direct;
    bool recycled;            /* write: overwriting a recycled file */
    bool unreadable;          /* read: the file cannot be opened (loop,
                                 permission, not regular): drop the key */
    bool auth_failed;         /* read: sealed under no key the tier holds,
                                 or not sealed while the tier seals
                                 (file_secret): removed, counted auth_failed */
    /* I/O state */
    int fd;
    struct iovec iov[2];
    int iovcnt;
    uint64_t io_bytes;        /* bytes the data I/O must move */
    char tmp[KVO__FILE_PATH_MAX];
    char path[KVO__FILE_PATH_MAX];
    int result;
    unsigned char *hdr;       /* 4096-aligned header buffer inside this op */
};

typedef struct kvo__file_backend kvo__file_backend;
typedef struct kvo__fshare kvo__fshare; /* the shared accounting (file_share.c) */

/* Phases of one operation, shared by the backends:
 *   begin: open the file (temp file for writes), prepare iov.  Returns 0;
 *          for a write -errno (finish with end(op, -errno)); for a read a
 *          KVO_E* verdict (ENOTFOUND, ECORRUPT, EIO: finish with
 *          kvo__fop_read_verdict).
 *   the backend moves op->io_bytes with preadv/pwritev on op->fd at offset 0
 *   end:   given the I/O outcome (bytes moved or -errno), verify/rename/close
 *          and set op->result.
 * After end (or the verdict, or run_sync) the backend hands the op back
 * with kvo__fop_finish (completion, index, stats). */
int kvo__fop_begin(kvo_file_tier *t, kvo__fop *op);
void kvo__fop_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res);
void kvo__fop_read_verdict(kvo_file_tier *t, kvo__fop *op, int rc);
/* Finish remaining bytes synchronously from `done` on: total or -errno. */
int64_t kvo__fop_io_continue(kvo__fop *op, uint64_t done);
/* Run the whole op synchronously (threads backend; uring fallback); the
 * caller then calls kvo__fop_finish. */
void kvo__fop_run_sync(kvo_file_tier *t, kvo__fop *op);

/* The tier object.  Locking (the rule every file_*.c follows): one mutex,
 * mu, guards the queues, the free list, the recycling pool, counters (st,
 * lat_ewma_ns, pending_writes), the completion ring (cq, whose owed entries
 * are the ops that will report) and the log rate limits; it is never held during file I/O or while calling the stores
 * (index, stage_index: each has its own lock).  Workers wait on work_cv;
 * flush and wait on done_cv.  Fields above mu are set at create and read
 * only afterwards. */
enum { KVO__FLOG_NOSPC, KVO__FLOG_IO, KVO__FLOG_CORRUPT, KVO__FLOG_BACKPRESSURE, KVO__FLOG_KINDS };

typedef struct kvo__recycled {
    char rel[64];             /* "<xx>/<hash>-g<group>.kvc": the evicted key's name under ns_dir */
    kvo_chunk_key key;        /* the evicted key */
    uint64_t file_bytes;
    bool taking;              /* a writer is renaming it away (file_quota.c) */
} kvo__recycled;

struct kvo_file_tier {
    kvo_file_tier_params p;
    char root[KVO__FILE_PATH_MAX];
    char ns_dir[KVO__FILE_PATH_MAX];
    const kvo_plan *plan;
    kvo_store *index;
    uint64_t quota;               /* quota_bytes, clamped to the file system */
    unsigned fmode, dmode;        /* files / directories it creates
                                     (params.file_mode; 0600 / 0700) */
    bool direct;
    bool tmpfile;                 /* O_TMPFILE + linkat works here */
    bool uring;
    uint32_t hostid;
    uint32_t nonce;               /* per process: tells our temps from those of
                                     an earlier process with the same pid */
    long pid;
    atomic_uint tmp_counter;
    struct kvo__seal *seal;       /* file_secret's keys, or NULL: chunks are
                                     sealed (tiers/seal.h) */

    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    kvo__fop *rq_head, *rq_tail;  /* reads: served first */
    kvo__fop *wq_head, *wq_tail;
    kvo__fop *free_ops;
    kvo_arena *stage_arena;       /* staging memory: allocated once, pre-faulted */
    kvo_store *stage_index;       /* its slots: one per queued write */
    uint64_t pending_writes;
    kvo__ring cq;                 /* kvo_file_completion; owed = ops that
                                     will report; its eventfd is the tier's */
    bool closing;
    pthread_t *threads;
    uint32_t n_threads;
    void *uring_state;
    void (*ring_kick)(void *uring_state); /* wakes the ring (set with uring) */

    /* Recycling: files of evicted chunks, pooled under their names, are
     * renamed away by a writer and overwritten in place by later writes of
     * the same size (no inode or block allocation: several times faster on
     * ext4 once the quota is full).  Only when no other process uses the
     * root (!params.shared).
     * As large as the write queue (file_quota.c says why). */
    kvo__recycled *pool;
    uint32_t pool_len, pool_cap;
    uint64_t pool_bytes, pool_max_bytes;  /* pooled; its bound */

    /* Shared accounting (params.shared, file_share.c): NULL when unshared,
     * or when the accounting file cannot be used (then the quota is this
     * process's own, as unshared).  The ballast: phantom entries of the
     * quota index, PENDING for good (group ballast_group, ballast_unit bytes
     * each: the largest slot), standing for the bytes of the namespace that
     * this index does not hold (other processes' files and writes), so that
     * the index's own policy evicts this process's files when the shared
     * quota needs room (file_quota.c).  share_mu guards n_ballast; it is
     * taken before mu (never after) and held across the store calls and
     * unlinks of a ballast change. */
    kvo__fshare *share;
    pthread_mutex_t share_mu;
    uint64_t n_ballast;
    bool ballast_on;              /* set once the startup scan is adopted */
    uint32_t ballast_group;
    uint64_t ballast_unit;
    /* Read-only: no file could be created at create (no free inodes or
     * space, a read-only file system): reads are served, writes dropped
     * (dropped_readonly) until a probe creates a file again (at most every
     * kvo__file_ro_retry_ms; ro_probe_ns under mu). */
    atomic_bool readonly;
    uint64_t ro_probe_ns;

    kvo_file_tier_stats st;       /* counters; gauges filled at get_stats */
    uint64_t lat_ewma_ns;
    uint64_t last_log_ns[KVO__FLOG_KINDS];
    uint64_t suppressed[KVO__FLOG_KINDS];
};

/* --- small helpers (file_common.c) --- */
/* A rate-limited log line (kvo__log: the kvo_set_log sink, stderr by default; at most one per log_interval_s per kind). */
void kvo__file_log(kvo_file_tier *t, int kind, const char *fmt, ...) KVO__PRINTF(3, 4);
/* The key's file path under the namespace (out: KVO__FILE_PATH_MAX bytes). */
void kvo__file_key_path(const kvo_file_tier *t, const kvo_chunk_key *k, char *out);
/* The key's group when the plan offloads it, else NULL. */
const kvo_group_plan *kvo__file_group_of(const kvo_file_tier *t, const kvo_chunk_key *k);
/* Bytes of a group's file: header + slot. */
static inline uint64_t kvo__file_stage_size(const kvo_group_plan *g) { return KVO_FILE_HEADER_BYTES + g->slot_bytes; }
/* Give a write's staging slot back (not under mu). */
static inline void kvo__file_stage_release(kvo_file_tier *t, const kvo_chunk_key *k) {
    kvo_store_complete_store(t->stage_index, k, 1, false);
}
/* Test hook: the errno the next file write fails with (0: none; always 0
 * without KVO_TESTING). */
#include "tiers/file_testing.h"

/* --- quota index and recycling (file_quota.c) --- */
/* Reserve quota for one key (prepare_store), deleting or recycling the files
 * of the keys it evicts.  *need as in kvo_store_prepare_store; *n_evicted
 * (may be NULL) counts the evicted files. */
int kvo__file_reserve_key(kvo_file_tier *t, const kvo_chunk_key *k, uint8_t *need, size_t *n_evicted);
/* Put a key known to have a file into the index as READY. */
int kvo__file_adopt_key(kvo_file_tier *t, const kvo_chunk_key *k, size_t *evicted_out);
/* Delete (or keep for recycling) the files of n evicted keys; counts them. */
void kvo__file_unlink_evicted(kvo_file_tier *t, const kvo_chunk_key *ev, size_t n);
/* Take a recycled file of exactly file_bytes, if any, renaming it (on the
 * calling writer thread) from its old chunk name to the path tmp. */
bool kvo__file_recycled_take(kvo_file_tier *t, uint64_t file_bytes, const char *tmp);
/* Shared mode: does a complete-looking file for k exist? */
bool kvo__file_probe_key(kvo_file_tier *t, const kvo_chunk_key *k, const kvo_group_plan *g);
/* Remove key k's file at path (any: kvo__file_remove_any, whatever is under
 * its name; else unlink) and, shared, tell the accounting before and after
 * (un-counted when this call removed it).  True when it did; errno is the
 * removal's. */
bool kvo__file_unlink_key(kvo_file_tier *t, const kvo_chunk_key *k, const char *path, bool any);
/* Shared mode: bring the ballast up to date (after the startup scan); the
 * bytes it stands for now (0 unshared). */
void kvo__file_share_settle(kvo_file_tier *t);
uint64_t kvo__file_ballast_bytes(kvo_file_tier *t);

/* --- shared accounting (file_share.c) --- */
#define KVO__FSHARE_NAME "shared-quota"   /* in the namespace directory */
#define KVO__FSHARE_BYTES 4096u
/* Attach to ns_dir's accounting file (made if missing), holding its attach
 * lock until kvo__fshare_attached, and take a slot (reaping what dead
 * processes reserved).  *first: no other process is attached (this one
 * records the quota and recounts exactly).  0 or KVO_ENOSPC / KVO_EIO /
 * KVO_ESTATE / KVO_ENOTSUP / KVO_EBUSY with a message (the caller goes on
 * without sharing, logged). */
int kvo__fshare_attach(const char *ns_dir, unsigned fmode, kvo__fshare **out, bool *first);
/* Release the attach lock (after the scan). */
void kvo__fshare_attached(kvo__fshare *s);
/* Give the slot back (and anything still reserved) and unmap; NULL ok. */
void kvo__fshare_detach(kvo__fshare *s);
/* The quota in force: `first` records configured and clamped; otherwise the
 * recorded one.  *recorded_configured (may be NULL): what its recorder was
 * configured with. */
uint64_t kvo__fshare_agree(kvo__fshare *s, bool first, uint64_t configured, uint64_t clamped,
                           uint64_t *recorded_configured);
/* Before the startup walk: the counters a recount beside live processes
 * needs. */
typedef struct kvo__fshare_snap {
    uint64_t used, reserved, unlinked, landed;
} kvo__fshare_snap;
void kvo__fshare_snapshot(kvo__fshare *s, kvo__fshare_snap *snap);
/* After the walk (walked_bytes: payload of the chunk files found). */
void kvo__fshare_recount(kvo__fshare *s, bool first, const kvo__fshare_snap *before, uint64_t walked_bytes,
                         uint64_t walked_files);
/* The counting steps (file_share.c's essay): reserve is false (nothing
 * changed) when used + x would pass the quota, *over (may be NULL) = by how
 * much. */
bool kvo__fshare_reserve(kvo__fshare *s, uint64_t x, uint64_t *over);
void kvo__fshare_release(kvo__fshare *s, uint64_t x);
void kvo__fshare_commit(kvo__fshare *s, uint64_t x);
/* A committed write's link (or rename, or drop) is done. */
void kvo__fshare_landed(kvo__fshare *s, uint64_t x);
void kvo__fshare_drop(kvo__fshare *s, uint64_t x);
/* A chunk file's unlink: begin before it, end after it (removed: this
 * call removed the file, which is un-counted). */
void kvo__fshare_unlink_begin(kvo__fshare *s, uint64_t x);
void kvo__fshare_unlink_end(kvo__fshare *s, uint64_t x, bool removed);
uint64_t kvo__fshare_used(const kvo__fshare *s);
uint64_t kvo__fshare_files(const kvo__fshare *s);
uint64_t kvo__fshare_quota(const kvo__fshare *s);
/* Reservations of dead processes' slots back out of used; bytes reclaimed. */
uint64_t kvo__fshare_reap(kvo__fshare *s);
/* The next fan-out directory (0..255) to sample, round robin over every
 * process of the namespace. */
uint32_t kvo__fshare_next_dir(kvo__fshare *s);

/* --- ops, queues, completions (file_queue.c) --- */
/* An op from the free list or the heap (hdr 4096-aligned); NULL: no memory. */
kvo__fop *kvo__fop_get(kvo_file_tier *t);
/* Fill in an op's request and queue it; KVO_ENOMEM (no message, op freed)
 * when no completion can be reserved for a reported op. */
int kvo__fop_enqueue(kvo_file_tier *t, kvo__fop *op, uint32_t kind, const kvo_chunk_key *k, const kvo_group_plan *g,
                     uint64_t user_data, bool report);
/* Hand a finished op back: index, stats, staging, completion, free list. */
void kvo__fop_finish(kvo_file_tier *t, kvo__fop *op);
/* Take the next queued op of the given kinds (a mask of KVO__FOP_READ and
 * KVO__FOP_WRITE; reads first); blocks while none and the tier is open; NULL
 * when shutting down with nothing queued.  With wait=false returns NULL at
 * once when nothing is queued. */
kvo__fop *kvo__fop_next(kvo_file_tier *t, bool wait, unsigned kinds);
/* True once destroy began and no read is queued (ring exit condition). */
bool kvo__file_tier_closing(kvo_file_tier *t);

/* --- backends (file_workers.c) --- */
/* Start the I/O backends (ring, then threads); KVO_E* with a message. */
int kvo__file_workers_start(kvo_file_tier *t);
/* Cancel queued reads, stop the ring and join the threads. */
void kvo__file_workers_stop(kvo_file_tier *t);

/* --- create-time probes (file_probe.c) --- */
/* mkdir -p; 0 or KVO_EIO / KVO_ENOSPC / KVO_ERANGE with a message. */
int kvo__file_mkdir_p(const char *path, unsigned dmode);
/* The 256 fan-out directories of a namespace (existing ones kept); 0 or
 * KVO_EIO / KVO_ENOSPC with a message. */
int kvo__file_make_fanout(const char *ns_dir, unsigned dmode);
/* Modes of what the tier creates (params.file_mode; docs/security.md): a
 * new directory (mkdir, then chmod when group/other bits are asked for, as a
 * umask may have cleared them) and a new file's fd.  -1/errno like mkdir. */
int kvo__file_mkdir(const char *path, unsigned dmode);
void kvo__file_set_mode(int fd, unsigned fmode);
/* O_DIRECT with a real write + read (also the writability check): 0 and
 * *ok, or KVO_EIO (*werr: the errno of creating a file) / KVO_ENOMEM. */
int kvo__file_probe_direct(kvo_file_tier *t, bool *ok, int *werr);
/* Read-only tier: O_DIRECT reads work (probed on the manifest)? */
bool kvo__file_probe_direct_read(kvo_file_tier *t);
/* Read-only tier: can files be created again (and the fan-out exists)? */
bool kvo__file_probe_writable(kvo_file_tier *t);
/* How often a read-only tier probes (milliseconds; 10 s; tests lower it). */
extern atomic_int kvo__file_ro_retry_ms;
/* O_TMPFILE + linkat through /proc work in the namespace directory? */
bool kvo__file_probe_tmpfile(kvo_file_tier *t);
/* The quota the file system can hold: ours (payload bytes of this
 * namespace's files) + free space less headers and a margin. */
uint64_t kvo__file_clamp_quota(kvo_file_tier *t, uint64_t quota, uint64_t ours, uint64_t max_slot);
/* This host's id and this process's nonce (in temporary names). */
uint32_t kvo__file_host_id(void);
uint32_t kvo__file_process_nonce(void);

/* --- startup scan (file_scan.c) --- */
/* One chunk file found by the scan: its key and last use. */
typedef struct kvo__scan_item {
    kvo_chunk_key key;
    int64_t used;
} kvo__scan_item;
/* Walk the namespace: remove stale temporaries, misplaced and non-regular
 * files; collect chunk files and their payload bytes (file size less the
 * header).  *out owned by the caller. */
int kvo__file_scan_collect(kvo_file_tier *t, kvo__scan_item **out, size_t *n_out, uint64_t *disk_bytes);
/* Remove stale temporary files in the namespace directory itself (a killed
 * first create's manifest temporary, probe files); counts scan_removed. */
void kvo__file_clean_ns_temps(kvo_file_tier *t);
/* Adopt collected files into the index, oldest first (sorts items). */
int kvo__file_scan_adopt(kvo_file_tier *t, kvo__scan_item *items, size_t n_items);
/* Shared mode, when this index has nothing left to evict: remove the least
 * recently used chunk files that no index of this process holds (pinned or
 * pending) from sampled fan-out directories, at least need bytes if found
 * (and a little more, so the next writes need not sample).  Returns the
 * bytes freed (un-counted). */
uint64_t kvo__file_evict_foreign(kvo_file_tier *t, uint64_t need);

/* Test hook: nonzero makes tiers created afterwards use named temporary
 * files and rename instead of O_TMPFILE + linkat. */
extern atomic_int kvo__file_test_no_tmpfile;
/* Test hook: microseconds each file write sleeps before its data (a slow
 * disk, for the latency back-pressure test). */
extern atomic_int kvo__file_test_write_delay_us;

#if KVO_HAVE_URING
/* io_uring backend: probe at create.  0 or KVO_ENOTSUP (message says why). */
int kvo__file_uring_start(kvo_file_tier *t, uint32_t depth, void **state);
void kvo__file_uring_stop(kvo_file_tier *t, void *state);
/* Wake the ring thread (new work or shutdown). */
void kvo__file_uring_kick(void *state);
#endif

#endif
