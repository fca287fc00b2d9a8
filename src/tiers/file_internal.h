/*
 * File tier internals shared by file_format.c, file_tier.c and the I/O
 * backends (file_threads in file_tier.c, uring/file_uring.c).
 */
#ifndef KVO_TIERS_FILE_INTERNAL_H
#define KVO_TIERS_FILE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/uio.h>

#include "core/internal.h"

#ifndef KVO_HAVE_URING
#define KVO_HAVE_URING 0
#endif

/* ------------------------------------------------------------- format -- */

#define KVO__FILE_MAGIC "KVOCHUNK"      /* 8 bytes, no NUL */
#define KVO__FILE_HDR_USED 264u         /* bytes of the header that carry data */
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
    char group_name[KVO_NAME_MAX];
    char model_name[KVO_NAME_MAX];
} kvo__file_hdr;

/* Fill a header for a group's chunk (payload checksum given). */
void kvo__file_hdr_init(kvo__file_hdr *h, const kvo_plan *plan, uint64_t layout_hash, const kvo_group_plan *g,
                        const kvo_chunk_key *key, uint64_t payload_xxh3);
/* Encode into KVO_FILE_HEADER_BYTES bytes (zero padded, header checksum). */
void kvo__file_hdr_encode(const kvo__file_hdr *h, void *buf);
/* Decode and check magic, version, header checksum.  KVO_ECORRUPT with a
 * message on failure. */
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

/* Manifest: write if absent, else check.  KVO_EIO / KVO_ESTATE. */
int kvo__file_manifest_ensure(const char *ns_dir, const kvo_plan *plan, uint64_t layout_hash);
/* Read a manifest's fingerprint, layout hash (0 when absent) and format
 * version. */
int kvo__file_manifest_read(const char *ns_dir, kvo_u128 *fingerprint, uint64_t *layout_hash, uint32_t *version,
                            char **plan_json);

/* Remove a path whatever it is (file, or directory tree).  0 or -errno. */
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
    /* write: staging buffer = header + payload (file image) */
    unsigned char *stage;
    /* read: destination and whether O_DIRECT is used for it */
    unsigned char *dst;
    bool direct;
    bool recycled;            /* write: overwriting a recycled file */
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

/* Phases of one operation, shared by the backends:
 *   begin: open the file (temp file for writes), prepare iov.  Returns 0;
 *          for a write -errno (finish with end(op, -errno)); for a read a
 *          KVO_E* verdict (ENOTFOUND, ECORRUPT, EIO: finish with
 *          kvo__fop_read_verdict).
 *   the backend moves op->io_bytes with preadv/pwritev on op->fd at offset 0
 *   end:   given the I/O outcome (bytes moved or -errno), verify/rename/close
 *          and hand the op back to the tier (completion, index, stats). */
int kvo__fop_begin(kvo_file_tier *t, kvo__fop *op);
void kvo__fop_end(kvo_file_tier *t, kvo__fop *op, int64_t io_res);
void kvo__fop_read_verdict(kvo_file_tier *t, kvo__fop *op, int rc);
/* Finish remaining bytes synchronously from `done` on: total or -errno. */
int64_t kvo__fop_io_continue(kvo__fop *op, uint64_t done);
/* Run the whole op synchronously (threads backend; uring fallback). */
void kvo__fop_run_sync(kvo_file_tier *t, kvo__fop *op);
/* Take the next queued op of the given kinds (a mask of KVO__FOP_READ and
 * KVO__FOP_WRITE; reads first); blocks while none and the tier is open; NULL
 * when shutting down with nothing queued.  With wait=false returns NULL at
 * once when nothing is queued. */
kvo__fop *kvo__fop_next(kvo_file_tier *t, bool wait, unsigned kinds);

/* Test hook: nonzero makes tiers created afterwards use named temporary
 * files and rename instead of O_TMPFILE + linkat. */
extern atomic_int kvo__file_test_no_tmpfile;
/* Test hook: microseconds each file write sleeps before its data (a slow
 * disk, for the latency back-pressure test). */
extern atomic_int kvo__file_test_write_delay_us;

/* For file_pin.c: the quota index and params.layout_hash of t. */
kvo_store *kvo__file_tier_index(kvo_file_tier *t);
uint64_t kvo__file_tier_layout(const kvo_file_tier *t);

/* True once destroy began and no read is queued (ring exit condition). */
bool kvo__file_tier_closing(kvo_file_tier *t);

#if KVO_HAVE_URING
/* io_uring backend: probe at create.  0 or KVO_ENOTSUP (message says why). */
int kvo__file_uring_start(kvo_file_tier *t, uint32_t depth, void **state);
void kvo__file_uring_stop(kvo_file_tier *t, void *state);
/* Wake the ring thread (new work or shutdown). */
void kvo__file_uring_kick(void *state);
#endif

#endif
