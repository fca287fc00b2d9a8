/*
 * kvoffload file tier: a persistent, crash-safe, capacity-bounded chunk store
 * on a local or shared file system.
 *
 * What it is
 *  - A directory tree under `root`: one namespace directory per layout
 *    fingerprint (root/<fingerprint hex>/, or root/<fingerprint>-<slot layout
 *    hash>/ when params.layout_hash is given), holding a readable manifest.json
 *    (format version, model, groups, chunking) and one file per chunk key,
 *    fanned out in 256 subdirectories.  Layouts that store different bytes
 *    never share files.  docs/file-format.md gives the exact byte format.
 *  - Each file: a 4096-byte header (magic, format version, key, group, the
 *    group's chunk geometry, layout fingerprint, payload length, XXH3-64 of the
 *    payload, a header checksum) followed by the payload (the chunk's bytes in
 *    the canonical slot format, docs/slot-format.md) padded to 4096 so that it
 *    can be read and written with O_DIRECT.
 *  - Writes go to an unnamed file (O_TMPFILE) linked in by name when whole,
 *    or where the file system lacks that, to a temporary file (O_EXCL, name
 *    with host, pid and counter) renamed into place: a reader sees a complete
 *    file or none, also after a SIGKILL or a crash.  Every read verifies
 *    header, size, key, geometry and checksum; a file that fails is counted,
 *    removed and reported as a miss: its bytes are never delivered as valid.
 *  - A byte quota, kept with a kvo_store (capacity = quota) whose slots are
 *    only accounting; its eviction policies (LRU, ARC, S3-FIFO) choose the
 *    files to delete.  At create the namespace is scanned and the index
 *    rebuilt (oldest files first), so a restarted process hits the chunks
 *    written before.
 *
 * Tiering (the caller's choice, typically the connector's)
 *  - write-through: call kvo_file_tier_write right after storing a chunk in
 *    the host tier;
 *  - write-back: call it with the host slot of a chunk that the host store
 *    evicts (kvo_store_prepare_store's evicted list), before that slot is
 *    reused.  kvo_file_tier_write copies the bytes into the tier's own staging
 *    memory before it returns, so the host slot may be reused immediately.
 *  A load that misses the host tier: kvo_file_tier_lookup, then
 *  kvo_file_tier_read into a host slot, then the transfer engine to the engine.
 *
 * Asynchrony and completion
 *  - write and read queue operations and return at once.  Each queued read,
 *    and each queued write when params.write_completions is set, produces
 *    exactly one kvo_file_completion, collected with kvo_file_tier_poll.
 *    kvo_file_tier_event_fd is readable while completions wait.
 *  - Back-pressure: a write is dropped (counted, result KVO_EAGAIN) instead
 *    of stalling the caller when the queue holds max_pending_writes writes,
 *    when staging memory (max_staging_bytes) is used up, or while the recent
 *    write latency is above write_latency_limit_ms.
 *  - Failures of the file system (ENOSPC, EIO, EDQUOT, EROFS...) never crash
 *    and never stall: the write is dropped with a counter and a rate-limited
 *    line on stderr (at most one per log_interval_s per kind).
 *
 * Sharing between processes
 *  - Several processes (on one machine, or on a shared file system) may use
 *    one root.  Concurrent writers of one key are safe (the name appears
 *    atomically; both wrote the same bytes).  A file removed by another
 *    process during a read gives either a miss or the right bytes (the read
 *    goes through an open descriptor).
 *  - Without params.shared each process keeps its own index and quota (and
 *    must be the only one writing the namespace).  With params.shared set
 *    (every process of the namespace must set it):
 *    - an index miss probes the file system, so chunks other processes
 *      wrote since the scan are found, and a write of a key whose file
 *      exists adopts it instead;
 *    - the processes of one host share one quota, kept in the namespace's
 *      accounting file (shared-quota, docs/file-format.md): the sum of their
 *      files and writes in flight stays within it.  The first process to
 *      open the namespace while no other has it open records the quota
 *      (quota_bytes, clamped once to the file system for all); the others
 *      use the recorded one (a different quota_bytes is logged once), until
 *      every process has closed it.  A process short of room evicts its own
 *      index's files in policy order (files other processes wrote that it
 *      adopted count as its own); when it holds nothing it can evict, the
 *      least recently used files no index of it holds;
 *    - the startup scan adopts every file and evicts only what exceeds the
 *      shared quota, so a restart of all processes keeps everything;
 *    - a process that dies mid-write leaves at most its writes in flight
 *      counted, taken back when another process attaches or runs short.
 *
 * A namespace where no file can be created at create (no free inode or
 * block, a disk quota, a read-only file system) opens read-only, logged
 * once: reads are served, writes dropped (stats.dropped_readonly) until a
 * file can be created again (probed at most every 10 s by a write).
 *
 * Thread rule: every function may be called from any thread, concurrently,
 * except kvo_file_tier_destroy (no other call in progress on that tier).  No
 * lock is held while calling user code (there is none) or doing file I/O.
 * On the caller's thread, write does a memcpy into staging and unlinks the
 * files its evictions chose; lookup with params.shared may stat; nothing else
 * touches the disk.
 */
#ifndef KVOFFLOAD_KVO_FILE_TIER_H
#define KVOFFLOAD_KVO_FILE_TIER_H

#include "kvo_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The on-disk format version written and accepted by this library. */
#define KVO_FILE_FORMAT_VERSION 1u
/** Bytes of the header before each file's payload; payload alignment. */
#define KVO_FILE_HEADER_BYTES 4096u

typedef enum kvo_file_io_kind {
    KVO_FILE_IO_AUTO = 0,     /* io_uring for reads when built and working,
                                 else threads; writes always use threads */
    KVO_FILE_IO_URING = 1,    /* io_uring or fail at create (KVO_ENOTSUP) */
    KVO_FILE_IO_THREADS = 2   /* a pool of threads doing pread/pwrite */
} kvo_file_io_kind;

typedef enum kvo_file_direct_mode {
    KVO_FILE_DIRECT_AUTO = 0, /* O_DIRECT when a probe at create shows it works */
    KVO_FILE_DIRECT_ON = 1,   /* O_DIRECT or fail at create (KVO_ENOTSUP) */
    KVO_FILE_DIRECT_OFF = 2   /* buffered I/O */
} kvo_file_direct_mode;

typedef enum kvo_file_fsync_policy {
    KVO_FILE_FSYNC_NONE = 0,  /* no fsync: a power loss may lose recent files
                                 (never yields a torn file that verifies) */
    KVO_FILE_FSYNC_DATA = 1,  /* fdatasync each file before it gets its name */
    KVO_FILE_FSYNC_FULL = 2   /* fdatasync, name it, fsync the directory */
} kvo_file_fsync_policy;

/** "auto"/"uring"/"threads"; "none"/"data"/"full". */
KVO_API const char *kvo_file_io_name(kvo_file_io_kind k);
KVO_API const char *kvo_file_fsync_name(kvo_file_fsync_policy p);

typedef struct kvo_file_tier_params {
    size_t struct_size;   /* sizeof(kvo_file_tier_params): kvo_file_tier_default_params() sets it */
    const char *root;              /* required; created if missing (copied) */
    const kvo_plan *plan;          /* required; must outlive the tier */
    uint64_t quota_bytes;          /* required: bytes of payload slots kept
                                      (each file adds a 4 KiB header, not
                                      counted); >= the largest slot_bytes.
                                      Clamped at create (with a log line) to
                                      what the file system can hold: free
                                      space + this namespace's files, less
                                      headers and 5 %; stats.quota_bytes
                                      tells the quota in force.  With shared:
                                      the namespace's quota, for all its
                                      processes together, recorded (and
                                      clamped) by the first to open it */
    kvo_policy_kind policy;        /* eviction policy; default LRU */
    uint64_t max_files;            /* index capacity (files kept); 0 = quota /
                                      smallest slot.  The index is allocated
                                      at create (~100 bytes per entry): cap it
                                      for huge quotas of small chunks; files
                                      beyond it are evicted like bytes */
    kvo_file_fsync_policy fsync;   /* default KVO_FILE_FSYNC_NONE */
    kvo_file_io_kind io;           /* default AUTO */
    kvo_file_direct_mode direct;   /* default AUTO */
    uint32_t io_threads;           /* threads doing pwritev/preadv (with
                                      io_uring: the writes, which are bound by
                                      file creation, not data); default 4 */
    uint32_t queue_depth;          /* io_uring: reads in flight at once;
                                      default 4 (deeper queues measured
                                      slower on virtual disks) */
    uint32_t max_pending_writes;   /* queued + running writes; default 64 */
    uint64_t max_staging_bytes;    /* staging memory for queued writes: one
                                      region mapped and pre-faulted at create;
                                      default 64 MiB, at least one chunk */
    uint32_t write_latency_limit_ms; /* drop new writes while the recent write
                                      latency (queue wait + I/O, moving
                                      average) is above this; 0 = off
                                      (default) */
    bool write_completions;        /* report a completion per queued write;
                                      default false (use flush/stats) */
    bool shared;                   /* other processes use this namespace (all
                                      of them must set it): one shared quota,
                                      an index miss probes the file system
                                      (one stat per missed key), as does a
                                      write; see "Sharing between processes"
                                      above; default false */
    bool scan;                     /* rebuild the index from the files at
                                      create; default true */
    uint32_t log_interval_s;       /* minimum seconds between two log lines of
                                      one kind (ENOSPC, EIO, corrupt...);
                                      default 10 */
    uint64_t layout_hash;          /* the engine's slot layout
                                      (kvo_transfer_layout_hash), or 0 = not
                                      given (default).  Engines whose segment
                                      lists differ store different bytes for
                                      one plan: when given, the namespace is
                                      root/<fingerprint>-<layout hash, 16 hex>
                                      and every file records and checks it */
    uint32_t file_mode;            /* permissions of the files the tier
                                      creates; 0 = 0600 (default: the KV cache
                                      is derived from users' prompts, no other
                                      local user reads it).  0640 lets a group
                                      read, 0660 also write (engines of
                                      several users on one cache: give the
                                      root that group).  Directories get the
                                      matching search bits (0700, 0750, 0770).
                                      Set exactly, whatever the umask.  Must
                                      be 0600 plus read/write bits only, else
                                      KVO_EINVAL.  docs/security.md */
    const char *file_secret;       /* NULL or "" (default): chunks as above.
                                      Else a secret of at least 16 bytes
                                      (any bytes up to a NUL; not kept: an
                                      AES-256 key is derived from it with
                                      HKDF-SHA256): every chunk is sealed
                                      with XAES-256-GCM (encrypted, bound to
                                      its namespace, key and geometry); a
                                      file sealed under another secret, not
                                      sealed, forged or tampered with is a
                                      miss, removed and counted in
                                      auth_failed.  Every process sharing a
                                      root gives the same one.  Needs
                                      OpenSSL (KVO_ENOTSUP without);
                                      KVO_EINVAL when shorter; never in a
                                      message.  docs/security.md,
                                      docs/file-format.md */
} kvo_file_tier_params;

KVO_API kvo_file_tier_params kvo_file_tier_default_params(void);

typedef struct kvo_file_tier kvo_file_tier;

/** Create a tier: make root and the namespace directory, write or check the
 *  manifest, probe O_DIRECT, O_TMPFILE and io_uring, scan the namespace (when
 *  params.scan), clamp the quota to the file system, map and pre-fault the
 *  staging memory and start the I/O workers.  Files found beyond the quota
 *  are evicted (deleted, oldest first); stale temporary files of dead writers
 *  are removed, and so are entries under chunk names that are not regular
 *  files (a FIFO is never opened blocking).  A damaged manifest (unparsable,
 *  malformed or not a regular file) is rebuilt from the plan, with a log
 *  line: the namespace's name is the plan's fingerprint and layout hash and
 *  every chunk is verified against both on read.  The quota clamp to the
 *  file system never evicts files that fit the configured quota.
 *  *out owned by the caller (kvo_file_tier_destroy).
 *  Directories it makes are 0700 and files 0600 (params.file_mode to share
 *  with a group); an existing namespace directory that is a symbolic link
 *  is refused (lstat), as another local user could have put it there.
 *  Errors: KVO_EINVAL (NULL, no root or plan, quota below the largest slot:
 *  message names the group and sizes; a bad file_mode), KVO_EIO (root or
 *  namespace not creatable or not writable, or the namespace a symbolic
 *  link: message names the path and the system error),
 *  KVO_ESTATE (the namespace's manifest has another format version,
 *  fingerprint or layout hash), KVO_ENOTSUP (io or direct forced ON but
 *  unavailable), KVO_ENOMEM (staging memory, index). */
KVO_API int kvo_file_tier_create(const kvo_file_tier_params *p, kvo_file_tier **out);

/** Wait for queued writes to finish, cancel queued reads (their completions
 *  are discarded; their destinations are not written), let running reads
 *  finish into their destinations, stop the workers and free everything
 *  (staging memory included).  Files stay.  When this returns, no read
 *  touches a destination any more.  The caller guarantees no other call on t
 *  is in progress or follows.  NULL is a no-op. */
KVO_API void kvo_file_tier_destroy(kvo_file_tier *t);

/** The namespace directory (root/<fingerprint hex>[-<layout hash>]); valid
 *  while t lives. */
KVO_API const char *kvo_file_tier_dir(const kvo_file_tier *t);
/** Backend in use: "io_uring" (reads on a ring, writes on the thread pool)
 *  or "threads". */
KVO_API const char *kvo_file_tier_backend(const kvo_file_tier *t);
/** Whether O_DIRECT is in use. */
KVO_API bool kvo_file_tier_direct(const kvo_file_tier *t);

/** Per key: KVO_READY (a file is indexed: a read will very probably hit),
 *  KVO_PENDING (a write of it is queued or running: not readable yet) or
 *  KVO_MISS, into states[i].  Counts hits and misses.  With params.shared, a
 *  miss in the index checks the file system and adopts a file found there.
 *  Errors: KVO_EINVAL (NULL with n > 0, group not offloaded). */
KVO_API int kvo_file_tier_lookup(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n, uint8_t *states);

/** Queue writes of n chunks.  srcs[i] points to the group's chunk_bytes bytes
 *  of key i (canonical slot format); they are copied into staging memory
 *  before this returns, so the caller may reuse srcs at once.  results[i]
 *  (may be NULL) receives per key: 0 queued; KVO_EEXIST already stored or
 *  being written (skipped; with params.shared also: another process's file
 *  of the key was found and adopted); KVO_EAGAIN dropped by back-pressure
 *  (queue bound, staging memory full, latency limit); KVO_ENOSPC
 *  the quota cannot make room (everything else pinned or being written;
 *  shared: nothing this process may evict), or the tier is read-only
 *  (stats.read_only: counted in dropped_readonly); KVO_EINVAL bad key.  user_data[i] (may be NULL) is returned in the
 *  write's completion when params.write_completions is set.
 *  *n_queued (may be NULL) receives how many were queued.
 *  Returns 0 when every key was handled (even if some were dropped: see
 *  results and stats), KVO_EINVAL for NULL arguments (nothing queued),
 *  KVO_ECLOSED after destroy began. */
KVO_API int kvo_file_tier_write(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs, size_t n,
                        const uint64_t *user_data, int *results, size_t *n_queued);

/** kvo_file_tier_write without the staging copy: the tier writes the file
 *  straight from srcs[i] (and takes its checksum there, on a worker), so
 *  the caller lends that memory: it must stay mapped and unchanged until
 *  the write's completion.  Every queued borrowed write reports one
 *  (kvo_file_tier_poll, op KVO_FILE_OP_WRITE, user_data[i]), whatever
 *  params.write_completions says; kvo_file_tier_flush returning 0 or
 *  kvo_file_tier_destroy returning also ends every loan.  sums (may be
 *  NULL): the XXH3-64 of each source's chunk_bytes as the caller knows them
 *  (e.g. taken when the chunk was stored); the writer checks the bytes
 *  against it and writes no file when they differ (completion KVO_ECORRUPT,
 *  counted in dropped_io), so bytes changed before the write never get a
 *  valid checksum of their own.  Bytes changed during the write give a file
 *  whose checksum does not match: a later read reports KVO_ECORRUPT, never
 *  wrong bytes.  A source the file cannot take in place is copied into
 *  staging as by kvo_file_tier_write (same completion rule; the copy is
 *  made in this call, so its sum is not checked): with O_DIRECT one not
 *  4096-aligned, or a group whose chunk_bytes is below its slot_bytes (the
 *  padding must be zero).  Results, back-pressure and
 *  errors as kvo_file_tier_write (a lent source needs no staging memory, so
 *  only the queue bound and the latency limit refuse it for back-pressure).
 *  Counted in writes_borrowed.  Typical caller: write-through from a host
 *  slot that stays pinned until the completion (the connector does). */
KVO_API int kvo_file_tier_write_borrowed(kvo_file_tier *t, const kvo_chunk_key *keys, const void *const *srcs,
                                         const uint64_t *sums, size_t n, const uint64_t *user_data, int *results,
                                         size_t *n_queued);

/** Queue reads of n chunks into dsts[i], which must have room for the group's
 *  slot_bytes (the payload is read with its zero padding; 4096-aligned
 *  destinations are read with O_DIRECT when it is in use, others buffered).
 *  dsts[i] must stay valid and untouched until the read's completion is
 *  polled (or destroy returned).  Only a completion with result 0 means
 *  dsts[i] holds the chunk's bytes; on any error its contents are
 *  unspecified.  results[i] (may be NULL), no completion unless 0:
 *  0 queued (exactly one completion will follow); KVO_ENOTFOUND not indexed
 *  (with params.shared: and no file either); KVO_EAGAIN a write of it is
 *  pending; KVO_EINVAL bad key or NULL dst.
 *  Completion results: 0 ok; KVO_ENOTFOUND the file vanished (removed by
 *  another process); KVO_ECORRUPT the file failed verification (it was
 *  removed, counted; a miss); KVO_EIO read error; KVO_ECANCELED at destroy.
 *  Returns 0, KVO_EINVAL (NULL arguments), KVO_ECLOSED. */
KVO_API int kvo_file_tier_read(kvo_file_tier *t, const kvo_chunk_key *keys, void *const *dsts, size_t n,
                       const uint64_t *user_data, int *results, size_t *n_queued);

typedef enum kvo_file_op_kind {
    KVO_FILE_OP_WRITE = 1,
    KVO_FILE_OP_READ = 2
} kvo_file_op_kind;

/** One finished operation. */
typedef struct kvo_file_completion {
    uint64_t user_data;
    kvo_chunk_key key;
    uint32_t op;          /* kvo_file_op_kind */
    int result;           /* 0 or a negative KVO_E* code (see read/write) */
    uint64_t bytes;       /* payload bytes moved (0 on error) */
    uint64_t latency_ns;  /* from queueing to completion */
} kvo_file_completion;

/** Move up to cap finished completions to out (oldest first); *n = the
 *  count (0 when none).  Never blocks.  Errors: KVO_EINVAL (NULL t or n, out
 *  NULL with cap > 0). */
KVO_API int kvo_file_tier_poll(kvo_file_tier *t, kvo_file_completion *out, size_t cap, size_t *n);

/** Block until a completion is waiting or timeout_ns passes (< 0: forever,
 *  but returns KVO_ENOTFOUND at once if no read or reported write is in
 *  flight; 0: no wait).  0, KVO_ETIMEDOUT, KVO_ENOTFOUND. */
KVO_API int kvo_file_tier_wait(kvo_file_tier *t, int64_t timeout_ns);

/** An eventfd (EFD_NONBLOCK) that is readable while completions wait; poll
 *  drains it.  Owned by the tier; valid until destroy. */
KVO_API int kvo_file_tier_event_fd(const kvo_file_tier *t);

/** Wait until no write is queued or running (so every write queued before
 *  this call has finished: written or dropped).  With writers on other
 *  threads this may wait for their writes too.  timeout_ns < 0 = forever.
 *  0 or KVO_ETIMEDOUT. */
KVO_API int kvo_file_tier_flush(kvo_file_tier *t, int64_t timeout_ns);

/** Mark keys as used now (eviction recency).  Absent keys are ignored. */
KVO_API int kvo_file_tier_touch(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n);

/** Pin indexed keys so that this process never evicts their files (the
 *  quota makes room from other files, or drops the write with KVO_ENOSPC)
 *  until kvo_file_tier_unpin; a key pinned twice needs two unpins.  For a
 *  caller whose next writes may evict what it is about to read.  All or
 *  nothing: KVO_ENOTFOUND (a key not indexed), KVO_EAGAIN (a write of one
 *  is pending), KVO_EINVAL (NULL with n > 0, bad group); nothing pinned. */
KVO_API int kvo_file_tier_pin(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n);
/** Release pins of kvo_file_tier_pin.  KVO_ESTATE if one is not pinned. */
KVO_API int kvo_file_tier_unpin(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n);
/** params.layout_hash as given at create (0: the namespace is not keyed by
 *  a slot layout). */
KVO_API uint64_t kvo_file_tier_layout_hash(const kvo_file_tier *t);

/** Delete the files of keys (absent keys ignored).  KVO_EBUSY if one is being
 *  written or read (nothing removed). */
KVO_API int kvo_file_tier_remove(kvo_file_tier *t, const kvo_chunk_key *keys, size_t n);

typedef struct kvo_file_tier_stats {
    size_t struct_size;   /* sizeof(kvo_file_tier_stats): KVO_FILE_TIER_STATS_INIT sets it */
    uint64_t quota_bytes;       /* in force (after the clamp at create) */
    uint64_t bytes_used;        /* payload slot bytes of indexed files */
    uint64_t files;             /* indexed files */
    uint64_t scanned_files;     /* files adopted by the scan at create */
    uint64_t scan_removed;      /* bad names, stale temps, over-quota at scan */
    uint64_t scan_ns;           /* duration of the scan */
    uint64_t hits, misses;      /* lookups */
    uint64_t writes, write_bytes;   /* files written */
    uint64_t reads, read_bytes;     /* files read and verified */
    uint64_t read_misses;       /* reads that found no file */
    uint64_t write_skipped;     /* already present or pending */
    uint64_t dropped_backpressure;  /* queue, staging or latency limit */
    uint64_t dropped_quota;     /* no room could be made */
    uint64_t dropped_nospace;   /* ENOSPC / EDQUOT from the file system */
    uint64_t dropped_io;        /* EIO and other write errors */
    uint64_t read_errors;       /* EIO on read */
    uint64_t corrupt_removed;   /* files that failed verification (removed) */
    uint64_t evictions;         /* files evicted for the quota */
    uint64_t recycled_files;    /* writes that overwrote an evicted file in
                                   place instead of creating one */
    uint64_t pending_writes;    /* queued or running now */
    uint64_t staging_bytes;     /* staging memory holding queued writes now */
    uint64_t write_latency_ns;  /* moving average */
    uint64_t writes_borrowed;   /* writes queued from the caller's memory
                                   (kvo_file_tier_write_borrowed, no copy) */
    /* params.shared (see "Sharing between processes" above): */
    uint64_t shared;            /* 1: the namespace's shared accounting is in
                                   use; 0: unshared, or it could not be used
                                   (logged: this process's own quota) */
    uint64_t shared_bytes_used; /* payload slot bytes every process of the
                                   namespace counts: files + writes in flight
                                   (<= quota_bytes) */
    uint64_t shared_files;      /* files counted there */
    uint64_t foreign_evictions; /* files no index of this process held,
                                   removed for the shared quota (also in
                                   evictions) */
    uint64_t read_only;         /* 1 while no file can be created (opened
                                   with no free inode or space, or on a
                                   read-only file system): reads served,
                                   writes dropped */
    uint64_t dropped_readonly;  /* writes dropped while read_only */
    uint64_t auth_failed;       /* reads of files that failed authentication
                                   (params.file_secret: another secret's,
                                   not sealed, forged or tampered; or a
                                   sealed file without a secret): removed,
                                   a miss (not in corrupt_removed) */
} kvo_file_tier_stats;
/** Initialiser (the struct_size convention, kvo_common.h):
 *  kvo_file_tier_stats st = KVO_FILE_TIER_STATS_INIT; */
#define KVO_FILE_TIER_STATS_INIT {sizeof(kvo_file_tier_stats)}

KVO_API int kvo_file_tier_get_stats(kvo_file_tier *t, kvo_file_tier_stats *out);

/* ------------------------------------------------------------- checking -- */

/** Verify one chunk file's header and payload against the format (and, when
 *  plan is not NULL, against the plan's geometry).  On success fills *key and
 *  *payload_bytes (either may be NULL).  Errors: KVO_ECORRUPT with a message
 *  saying what is wrong (magic, version, size, checksum, geometry...),
 *  KVO_ENOTFOUND, KVO_EIO.  For fsck and tests; any thread. */
KVO_API int kvo_file_verify(const char *path, const kvo_plan *plan, kvo_chunk_key *key, uint64_t *payload_bytes);

/** What a chunk file's header says (see docs/file-format.md). */
typedef struct kvo_file_chunk_info {
    kvo_chunk_key key;
    kvo_u128 fingerprint;         /* layout fingerprint of the writer's plan */
    uint32_t format_version;
    uint32_t kind;                /* kvo_group_kind */
    char group_name[KVO_NAME_MAX];
    char model_name[KVO_NAME_MAX];
    uint32_t tokens_per_block, layers;
    uint64_t page_bytes, blocks_per_chunk, tokens_per_chunk;
    uint64_t chunk_bytes;         /* payload length */
    uint64_t slot_bytes;          /* payload bytes on disk (padded to 4096) */
    uint64_t payload_xxh3;
    uint64_t created_unix_ns;
    uint64_t layout_hash;         /* engine slot layout hash (0: not given) */
    uint64_t file_bytes;          /* size of the file */
} kvo_file_chunk_info;

/** kvo_file_verify, and on success (or on a KVO_ECORRUPT found after the
 *  header decoded: checksum, size, key or geometry) also what the header says
 *  into *info (may be NULL); info->format_version is 0 when the header itself
 *  could not be decoded, 2 for a sealed chunk (file_secret), whose payload
 *  is read but not authenticated here (that needs the secret: the tier
 *  does it on every read).  Same errors; any thread. */
KVO_API int kvo_file_inspect(const char *path, const kvo_plan *plan, kvo_file_chunk_info *info);

/** The path of key's file under a namespace directory into out (cap bytes).
 *  KVO_ERANGE if it does not fit. */
KVO_API int kvo_file_chunk_path(const char *ns_dir, const kvo_chunk_key *key, char *out, size_t cap);

/** Whether a temporary file in a namespace (a ".tmp.*" name) belongs to a
 *  writer that is gone: on this host, its process no longer exists (or its pid
 *  was reused by another process); written on another host, older than an
 *  hour.  1 stale, 0 in use, or KVO_EINVAL (not a temporary name), KVO_EIO.
 *  The tier removes stale ones at create; for fsck.  Any thread. */
KVO_API int kvo_file_temp_stale(const char *path);

/* ---------------------------------------------------------- walking -- */

typedef enum kvo_file_walk_kind {
    KVO_FILE_WALK_CHUNK = 1,  /* a chunk file name ("<32 hex>-g<group>.kvc"):
                                 key parsed from the name */
    KVO_FILE_WALK_TEMP = 2,   /* a temporary file (".tmp.*"): a write in
                                 progress, a recycled file or a dead writer's
                                 leftover (see kvo_file_temp_stale) */
    KVO_FILE_WALK_OTHER = 3   /* any other name: not the tier's */
} kvo_file_walk_kind;

/** Stat every entry (lstat: links are not followed) and fill the stat
 *  fields of kvo_file_walk_entry. */
#define KVO_FILE_WALK_STAT 1u

/** One entry of a fan-out directory, as kvo_file_walk shows it.  Every
 *  pointer and the descriptor are valid only during the callback. */
typedef struct kvo_file_walk_entry {
    const char *path;         /* ns_dir/<xx>/<name> */
    const char *name;         /* the file name */
    int dir_fd;               /* the fan-out directory, open: for *at() calls
                                 (do not close it) */
    uint32_t subdir;          /* the fan-out directory, 0..255 (<xx> in hex) */
    uint32_t kind;            /* kvo_file_walk_kind */
    kvo_chunk_key key;        /* KVO_FILE_WALK_CHUNK: parsed from the name
                                 (a file in the wrong subdirectory has
                                 key.hash.lo & 0xff != subdir); else zero */
    bool have_stat;           /* KVO_FILE_WALK_STAT given and the lstat
                                 worked (false: the entry vanished meanwhile) */
    bool is_dir;              /* a directory (from the stat when have_stat,
                                 else from the directory entry's type) */
    bool is_regular;          /* a regular file (have_stat only) */
    uint64_t file_bytes;      /* size (have_stat only) */
    uint64_t disk_bytes;      /* blocks it occupies, in bytes (have_stat only) */
    int64_t last_used_s;      /* the later of access and modification time,
                                 seconds since the epoch (have_stat only) */
} kvo_file_walk_entry;

/** Called once per entry; return 0 to go on, anything else to stop the walk
 *  (kvo_file_walk then returns that value). */
typedef int (*kvo_file_walk_fn)(const kvo_file_walk_entry *e, void *ctx);

/** Visit every entry of a namespace directory's 256 fan-out directories
 *  (ns_dir/00 .. ns_dir/ff, in that order; within one, in directory order;
 *  "." and ".." left out; missing fan-out directories skipped), classified by
 *  name (chunk file with its parsed key and group, temporary file, other),
 *  with lstat data when flags has KVO_FILE_WALK_STAT.  One readdir per
 *  fan-out directory and, with the flag, one fstatat per entry: no header is
 *  read (kvo_file_inspect does that).  The tier's startup scan, fsck and the
 *  benchmarks use it.
 *  The callback may remove or rename the entry it is given (entries added or
 *  removed during the walk may or may not be visited); it must not close
 *  e->dir_fd.  ctx is passed through untouched.
 *  Thread rules: any thread; the walk holds no lock of any tier while it
 *  calls fn (fn may call any kvoffload function); tiers may write to the
 *  namespace meanwhile.
 *  Errors: KVO_EINVAL (NULL ns_dir or fn, flags unknown), KVO_ERANGE (ns_dir
 *  too long for a chunk path), KVO_EIO (ns_dir cannot be opened as a
 *  directory: the message names it and the system error); else fn's nonzero
 *  return, or 0. */
KVO_API int kvo_file_walk(const char *ns_dir, uint32_t flags, kvo_file_walk_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
