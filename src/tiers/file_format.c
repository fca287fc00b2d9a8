/*
 * The file tier's on-disk format: chunk file names, the 4096-byte header,
 * verification, and the namespace manifest.  docs/file-format.md is the
 * readable specification; this file is its implementation.
 *
 * Layout
 *   root/<namespace>/manifest.json
 *   root/<namespace>/<xx>/<hash: 32 hex>-g<group>.kvc
 * where namespace is the plan fingerprint (32 hex), followed by
 * "-<layout hash: 16 hex>" when the tier was given the engine's slot layout
 * hash (kvo_transfer_layout_hash: engines whose segment lists differ store
 * different bytes for one plan),
 * where xx is the low byte of hash.lo in hex (256 fan-out directories, made
 * on first use) and the hash is printed hi then lo (kvo_u128_hex).
 *
 * Header (little-endian, offsets in bytes; the rest of the 4096 bytes is 0):
 *     0  magic "KVOCHUNK"          8
 *     8  format version (1)        u32
 *    12  header bytes (4096)       u32
 *    16  fingerprint lo, hi        u64 u64
 *    32  key hash lo, hi           u64 u64
 *    48  group id                  u32
 *    52  group kind                u32
 *    56  tokens_per_block          u32
 *    60  layers                    u32
 *    64  page_bytes                u64
 *    72  blocks_per_chunk          u64
 *    80  tokens_per_chunk          u64
 *    88  chunk_bytes (payload)     u64
 *    96  slot_bytes (payload + padding on disk) u64
 *   104  XXH3-64 of the payload's chunk_bytes (seed 0)  u64
 *   112  created, ns since the epoch (information only)  u64
 *   120  group name, NUL padded    64
 *   184  model name, NUL padded    64
 *   248  layout hash (0: not given) u64
 *   256  XXH3-64 of bytes 0..255   u64
 * Version 2 is a sealed chunk (a file tier with file_secret, a Redis tier
 * with a fleet secret): the same fields with a payload checksum of 0, the
 * payload encrypted, and a seal record at 264..319 (tiers/seal.h: algorithm,
 * key id, nonce, tag) that authenticates the payload and bytes 0..303.
 * A file is exactly 4096 + slot_bytes bytes; the padding after the payload
 * is zero.  The header checksum makes a torn or overwritten header fail on
 * its own; the payload checksum catches everything else.  The fingerprint
 * and geometry fields catch a file copied into the wrong namespace, or one
 * written by a build with a different plan under a colliding name.
 *
 * Why one file per chunk: a rename makes a chunk appear atomically, removal
 * is one unlink, concurrent processes need no shared allocator, and a
 * restart rebuilds the index from names alone (no header reads).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include "core/xxh.h"

#include "tiers/file_internal.h"

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

uint64_t kvo__file_copy_sum(void *dst, const void *src, size_t n) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n;) {
        size_t k = n - off < KVO__SUM_PIECE ? n - off : KVO__SUM_PIECE;
        memcpy((unsigned char *)dst + off, (const unsigned char *)src + off, k);
        XXH3_64bits_update(&st, (unsigned char *)dst + off, k);
        off += k;
    }
    return XXH3_64bits_digest(&st);
}

void kvo__file_hdr_init(kvo__file_hdr *h, const kvo_plan *plan, uint64_t layout_hash, const kvo_group_plan *g,
                        const kvo_chunk_key *key, uint64_t payload_xxh3) {
    memset(h, 0, sizeof *h);
    h->version = KVO_FILE_FORMAT_VERSION;
    h->sealed = false;
    h->header_bytes = KVO_FILE_HEADER_BYTES;
    h->fingerprint = kvo_plan_fingerprint(plan);
    h->key = *key;
    h->key.tenant = 0;
    h->kind = (uint32_t)g->kind;
    h->tokens_per_block = g->tokens_per_block;
    h->layers = g->layers;
    h->page_bytes = g->page_bytes;
    h->blocks_per_chunk = g->blocks_per_chunk;
    h->tokens_per_chunk = g->tokens_per_chunk;
    h->chunk_bytes = g->chunk_bytes;
    h->slot_bytes = g->slot_bytes;
    h->payload_xxh3 = payload_xxh3;
    h->layout_hash = layout_hash;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->created_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    kvo__strlcpy(h->group_name, g->name, sizeof h->group_name);
    kvo__strlcpy(h->model_name, kvo_model_name(kvo_plan_model(plan)), sizeof h->model_name);
}

void kvo__file_hdr_encode(const kvo__file_hdr *h, void *buf) {
    unsigned char *p = buf;
    memset(p, 0, KVO_FILE_HEADER_BYTES);
    memcpy(p, KVO__FILE_MAGIC, 8);
    put32(p + 8, h->sealed ? KVO__FILE_VERSION_SEALED : h->version);
    put32(p + 12, h->header_bytes);
    put64(p + 16, h->fingerprint.lo);
    put64(p + 24, h->fingerprint.hi);
    put64(p + 32, h->key.hash.lo);
    put64(p + 40, h->key.hash.hi);
    put32(p + 48, h->key.group);
    put32(p + 52, h->kind);
    put32(p + 56, h->tokens_per_block);
    put32(p + 60, h->layers);
    put64(p + 64, h->page_bytes);
    put64(p + 72, h->blocks_per_chunk);
    put64(p + 80, h->tokens_per_chunk);
    put64(p + 88, h->chunk_bytes);
    put64(p + 96, h->slot_bytes);
    put64(p + 104, h->payload_xxh3);
    put64(p + 112, h->created_ns);
    memcpy(p + 120, h->group_name, strnlen(h->group_name, 63));
    memcpy(p + 184, h->model_name, strnlen(h->model_name, 63));
    put64(p + 248, h->layout_hash);
    put64(p + 256, XXH3_64bits(p, 256));
}

int kvo__file_hdr_decode(const void *buf, size_t len, kvo__file_hdr *h) {
    const unsigned char *p = buf;
    if (len < KVO__FILE_HDR_USED)
        return kvo__error(KVO_ECORRUPT, "file shorter than its header (%zu bytes, need %u)", len,
                          KVO_FILE_HEADER_BYTES);
    if (memcmp(p, KVO__FILE_MAGIC, 8) != 0)
        return kvo__error(KVO_ECORRUPT, "foreign format: no \"KVOCHUNK\" magic at offset 0");
    memset(h, 0, sizeof *h);
    h->version = get32(p + 8);
    if (h->version != KVO_FILE_FORMAT_VERSION && h->version != KVO__FILE_VERSION_SEALED)
        return kvo__error(KVO_ECORRUPT, "format version %u, this build reads versions %u and %u (sealed)", h->version,
                          KVO_FILE_FORMAT_VERSION, KVO__FILE_VERSION_SEALED);
    h->sealed = h->version == KVO__FILE_VERSION_SEALED;
    uint64_t want = get64(p + 256), got = XXH3_64bits(p, 256);
    if (want != got)
        return kvo__error(KVO_ECORRUPT, "header checksum mismatch (stored %016llx, computed %016llx): torn or "
                          "damaged header", (unsigned long long)want, (unsigned long long)got);
    h->header_bytes = get32(p + 12);
    h->fingerprint.lo = get64(p + 16);
    h->fingerprint.hi = get64(p + 24);
    h->key.hash.lo = get64(p + 32);
    h->key.hash.hi = get64(p + 40);
    h->key.group = get32(p + 48);
    h->kind = get32(p + 52);
    h->tokens_per_block = get32(p + 56);
    h->layers = get32(p + 60);
    h->page_bytes = get64(p + 64);
    h->blocks_per_chunk = get64(p + 72);
    h->tokens_per_chunk = get64(p + 80);
    h->chunk_bytes = get64(p + 88);
    h->slot_bytes = get64(p + 96);
    h->payload_xxh3 = get64(p + 104);
    h->created_ns = get64(p + 112);
    h->layout_hash = get64(p + 248);
    memcpy(h->group_name, p + 120, 63);
    memcpy(h->model_name, p + 184, 63);
    if (h->header_bytes != KVO_FILE_HEADER_BYTES)
        return kvo__error(KVO_ECORRUPT, "header size %u, expected %u", h->header_bytes, KVO_FILE_HEADER_BYTES);
    if (h->chunk_bytes == 0 || h->slot_bytes < h->chunk_bytes || h->slot_bytes % KVO_SLOT_ALIGN != 0 ||
        h->slot_bytes - h->chunk_bytes >= KVO_SLOT_ALIGN)
        return kvo__error(KVO_ECORRUPT, "inconsistent payload sizes: chunk_bytes %llu, slot_bytes %llu",
                          (unsigned long long)h->chunk_bytes, (unsigned long long)h->slot_bytes);
    return 0;
}

int kvo__file_hdr_check(const kvo__file_hdr *h, const kvo_plan *plan, const kvo_chunk_key *expect) {
    if (expect && !kvo_chunk_key_eq(&h->key, expect)) {
        char a[33], b[33];
        kvo_u128_hex(h->key.hash, a);
        kvo_u128_hex(expect->hash, b);
        return kvo__error(KVO_ECORRUPT, "file holds key %s group %u, its name says %s group %u", a, h->key.group,
                          b, expect->group);
    }
    if (!plan) return 0;
    kvo_u128 fp = kvo_plan_fingerprint(plan);
    if (fp.lo != h->fingerprint.lo || fp.hi != h->fingerprint.hi) {
        char a[33], b[33];
        kvo_u128_hex(h->fingerprint, a);
        kvo_u128_hex(fp, b);
        return kvo__error(KVO_ECORRUPT, "file belongs to layout %s, this namespace is %s", a, b);
    }
    const kvo_group_plan *g = kvo_plan_group(plan, h->key.group);
    if (!g || !g->offloaded)
        return kvo__error(KVO_ECORRUPT, "file names group %u, which this plan does not offload", h->key.group);
    if (h->kind != (uint32_t)g->kind || h->tokens_per_block != g->tokens_per_block || h->layers != g->layers ||
        h->page_bytes != g->page_bytes || h->blocks_per_chunk != g->blocks_per_chunk ||
        h->tokens_per_chunk != g->tokens_per_chunk || h->chunk_bytes != g->chunk_bytes ||
        h->slot_bytes != g->slot_bytes)
        return kvo__error(KVO_ECORRUPT,
                          "wrong geometry for group '%s': file has %u layers x %llu blocks x %llu page bytes "
                          "(%llu tokens/chunk, chunk %llu bytes), plan has %u x %llu x %llu (%llu, %llu)",
                          g->name, h->layers, (unsigned long long)h->blocks_per_chunk,
                          (unsigned long long)h->page_bytes, (unsigned long long)h->tokens_per_chunk,
                          (unsigned long long)h->chunk_bytes, g->layers, (unsigned long long)g->blocks_per_chunk,
                          (unsigned long long)g->page_bytes, (unsigned long long)g->tokens_per_chunk,
                          (unsigned long long)g->chunk_bytes);
    return 0;
}

int kvo__file_hdr_check_layout(const kvo__file_hdr *h, uint64_t layout_hash) {
    if (h->layout_hash != layout_hash)
        return kvo__error(KVO_ECORRUPT, "file was written for engine slot layout %016llx, this tier uses %016llx",
                          (unsigned long long)h->layout_hash, (unsigned long long)layout_hash);
    return 0;
}

/* ------------------------------------------------------------- names -- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int kvo__file_parse_name(const char *name, kvo_chunk_key *key) {
    /* <32 hex>-g<digits>.kvc */
    uint64_t hi = 0, lo = 0;
    for (int i = 0; i < 32; i++) {
        int v = hexval(name[i]);
        if (v < 0) return KVO_EINVAL;
        if (i < 16) hi = (hi << 4) | (uint64_t)v;
        else lo = (lo << 4) | (uint64_t)v;
    }
    if (name[32] != '-' || name[33] != 'g') return KVO_EINVAL;
    const char *p = name + 34;
    uint64_t g = 0;
    int nd = 0;
    while (*p >= '0' && *p <= '9' && nd < 10) { g = g * 10 + (uint64_t)(*p - '0'); p++; nd++; }
    if (nd == 0 || g >= KVO_MAX_GROUPS || strcmp(p, KVO__FILE_SUFFIX) != 0) return KVO_EINVAL;
    if (nd > 1 && name[34] == '0') return KVO_EINVAL; /* one spelling per key */
    key->hash.hi = hi;
    key->hash.lo = lo;
    key->group = (uint32_t)g;
    key->tenant = 0;
    return 0;
}

void kvo__file_name(const kvo_chunk_key *key, char *out, size_t cap) {
    char hex[33];
    kvo_u128_hex(key->hash, hex);
    snprintf(out, cap, "%s-g%u%s", hex, key->group, KVO__FILE_SUFFIX);
}

void kvo__file_subdir(const kvo_chunk_key *key, char out[3]) {
    static const char digits[] = "0123456789abcdef";
    unsigned b = (unsigned)(key->hash.lo & 0xff);
    out[0] = digits[b >> 4];
    out[1] = digits[b & 15];
    out[2] = 0;
}

int kvo_file_chunk_path(const char *ns_dir, const kvo_chunk_key *key, char *out, size_t cap) {
    if (!ns_dir || !key || !out) return kvo__error(KVO_EINVAL, "kvo_file_chunk_path: NULL argument");
    char sub[3], name[64];
    kvo__file_subdir(key, sub);
    kvo__file_name(key, name, sizeof name);
    int n = snprintf(out, cap, "%s/%s/%s", ns_dir, sub, name);
    if (n < 0 || (size_t)n >= cap)
        return kvo__error(KVO_ERANGE, "chunk path under '%s' needs %d bytes, buffer has %zu", ns_dir, n + 1, cap);
    return 0;
}

/* ------------------------------------------------------------ verify -- */

static void fill_info(kvo_file_chunk_info *info, const kvo__file_hdr *h, uint64_t size) {
    memset(info, 0, sizeof *info);
    info->key = h->key;
    info->fingerprint = h->fingerprint;
    info->format_version = h->version;
    info->kind = h->kind;
    memcpy(info->group_name, h->group_name, sizeof info->group_name);
    memcpy(info->model_name, h->model_name, sizeof info->model_name);
    info->group_name[KVO_NAME_MAX - 1] = info->model_name[KVO_NAME_MAX - 1] = 0;
    info->tokens_per_block = h->tokens_per_block;
    info->layers = h->layers;
    info->page_bytes = h->page_bytes;
    info->blocks_per_chunk = h->blocks_per_chunk;
    info->tokens_per_chunk = h->tokens_per_chunk;
    info->chunk_bytes = h->chunk_bytes;
    info->slot_bytes = h->slot_bytes;
    info->payload_xxh3 = h->payload_xxh3;
    info->created_unix_ns = h->created_ns;
    info->layout_hash = h->layout_hash;
    info->file_bytes = size;
}

int kvo__file_open_regular(const char *path, int flags, struct stat *st) {
    int fd = open(path, flags | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return kvo__error(KVO_ENOTFOUND, "%s: no such file", path);
        return kvo__error(e == ELOOP || e == EACCES || e == EPERM || e == ENOTDIR || e == ENXIO || e == EISDIR
                              ? KVO_ECORRUPT : KVO_EIO,
                          "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (!st) st = &sb;
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return kvo__error(KVO_EIO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return kvo__error(KVO_ECORRUPT, "%s: not a regular file (%s)", path,
                          S_ISFIFO(st->st_mode) ? "a FIFO" : S_ISDIR(st->st_mode) ? "a directory"
                          : S_ISLNK(st->st_mode) ? "a symbolic link" : "a device or socket");
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return kvo__error(KVO_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    return fd;
}

/* Read [off, off + n) of fd in pieces of `cap` bytes through buf, feeding
 * the checksum state (when given) and checking that bytes at or beyond
 * `zero_from` are zero (the padding).  0 or KVO_E* with a message. */
static int read_pieces(int fd, const char *path, uint64_t off, uint64_t n, unsigned char *buf, size_t cap,
                       XXH3_state_t *sum, uint64_t zero_from) {
    uint64_t done = 0;
    while (done < n) {
        size_t want = n - done < cap ? (size_t)(n - done) : cap;
        ssize_t r = pread(fd, buf, want, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return kvo__error(KVO_EIO, "%s: read: %s", path, strerror(errno));
        if (r == 0) return kvo__error(KVO_ECORRUPT, "%s: truncated while reading", path);
        if (sum) XXH3_64bits_update(sum, buf, (size_t)r);
        for (ssize_t i = 0; zero_from != UINT64_MAX && i < r; i++)
            if (off + done + (uint64_t)i >= zero_from && buf[i])
                return kvo__error(KVO_ECORRUPT, "%s: non-zero padding at offset %llu", path,
                                  (unsigned long long)(off + done + (uint64_t)i));
        done += (uint64_t)r;
    }
    return 0;
}

int kvo_file_inspect(const char *path, const kvo_plan *plan, kvo_file_chunk_info *info) {
    if (!path) return kvo__error(KVO_EINVAL, "kvo_file_inspect: NULL path");
    if (info) memset(info, 0, sizeof *info);
    struct stat st;
    int fd = kvo__file_open_regular(path, O_RDONLY | O_CLOEXEC, &st);
    if (fd < 0) return fd;
    int rc = 0;
    unsigned char *buf = NULL;
    XXH3_state_t *xs = NULL;
    if (st.st_size == 0) { rc = kvo__error(KVO_ECORRUPT, "%s: zero-length file", path); goto out; }
    unsigned char hb[KVO_FILE_HEADER_BYTES];
    ssize_t r = pread(fd, hb, sizeof hb, 0);
    if (r < 0) { rc = kvo__error(KVO_EIO, "%s: read: %s", path, strerror(errno)); goto out; }
    kvo__file_hdr h;
    rc = kvo__file_hdr_decode(hb, (size_t)r, &h);
    if (rc == 0 && (size_t)r < KVO_FILE_HEADER_BYTES)
        rc = kvo__error(KVO_ECORRUPT, "truncated header (%zd of %u bytes)", r, KVO_FILE_HEADER_BYTES);
    if (rc) { kvo__error_prefix(rc, "%s", path); goto out; }
    if (info) fill_info(info, &h, (uint64_t)st.st_size);
    kvo_chunk_key named;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    bool have_name = kvo__file_parse_name(base, &named) == 0;
    rc = kvo__file_hdr_check(&h, plan, have_name ? &named : NULL);
    if (rc) { kvo__error_prefix(rc, "%s", path); goto out; }
    uint64_t want = KVO_FILE_HEADER_BYTES + h.slot_bytes;
    if ((uint64_t)st.st_size != want) {
        rc = kvo__error(KVO_ECORRUPT, "%s: %s: %lld bytes, header says %llu", path,
                        (uint64_t)st.st_size < want ? "truncated" : "too long", (long long)st.st_size,
                        (unsigned long long)want);
        goto out;
    }
    /* The payload is read in pieces of at most 1 MiB, whatever size the
     * header claims (it matches the file size, but a sparse file can claim
     * terabytes), and the padding must be zero. */
    size_t cap = h.slot_bytes < (1u << 20) ? (size_t)h.slot_bytes : (1u << 20);
    buf = kvo__malloc(cap);
    xs = XXH3_createState();
    if (!buf || !xs || XXH3_64bits_reset(xs) != XXH_OK) {
        rc = kvo__error(KVO_ENOMEM, "%s: cannot allocate a %zu-byte read buffer", path, cap);
        goto out;
    }
    /* a sealed payload is authenticated by a tier holding the secret only:
     * here it is read (it must be there) but not checked */
    rc = read_pieces(fd, path, KVO_FILE_HEADER_BYTES, h.chunk_bytes, buf, cap, h.sealed ? NULL : xs, UINT64_MAX);
    if (!rc)
        rc = read_pieces(fd, path, KVO_FILE_HEADER_BYTES + h.chunk_bytes, h.slot_bytes - h.chunk_bytes, buf, cap,
                         NULL, 0);
    if (rc) goto out;
    uint64_t sum = XXH3_64bits_digest(xs);
    if (!h.sealed && sum != h.payload_xxh3) {
        rc = kvo__error(KVO_ECORRUPT, "%s: payload checksum mismatch (stored %016llx, computed %016llx)", path,
                        (unsigned long long)h.payload_xxh3, (unsigned long long)sum);
        goto out;
    }
out:
    XXH3_freeState(xs);
    kvo__free(buf);
    close(fd);
    return rc;
}

int kvo_file_verify(const char *path, const kvo_plan *plan, kvo_chunk_key *key_out, uint64_t *payload_bytes) {
    kvo_file_chunk_info info;
    int rc = kvo_file_inspect(path, plan, &info);
    if (rc) return rc;
    if (key_out) *key_out = info.key;
    if (payload_bytes) *payload_bytes = info.chunk_bytes;
    return 0;
}

/* ---------------------------------------------------------- manifest -- */

/* Exactly n lowercase hex digits (the spelling this code writes) into *out. */
static bool parse_hex_exact(const char *s, size_t n, uint64_t *hi, uint64_t *lo) {
    if (!s || strlen(s) != n) return false;
    uint64_t h = 0, l = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hexval(s[i]);
        if (d < 0) return false;
        if (n > 16 && i < n - 16) h = (h << 4) | (uint64_t)d;
        else l = (l << 4) | (uint64_t)d;
    }
    if (hi) *hi = h;
    *lo = l;
    return true;
}

/* Load a JSON file that must be a regular file (a FIFO would block the
 * open).  NULL with KVO_ENOTFOUND / KVO_EPARSE / KVO_EIO set. */
static json_t *load_json_regular(const char *path, int *rc) {
    int fd = kvo__file_open_regular(path, O_RDONLY | O_CLOEXEC, NULL);
    if (fd < 0) {
        *rc = fd == KVO_ECORRUPT ? kvo__error(KVO_EPARSE, "%s", kvo_last_error()) : fd;
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loadfd(fd, 0, &jerr);
    close(fd);
    if (!root) *rc = kvo__error(KVO_EPARSE, "%s: line %d: %s", path, jerr.line, jerr.text);
    return root;
}

int kvo__file_manifest_read(const char *ns_dir, kvo_u128 *fingerprint, uint64_t *layout_hash, int64_t *version,
                            char **plan_json) {
    char path[KVO__FILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", ns_dir, KVO__FILE_MANIFEST);
    int rc = 0;
    json_t *root = load_json_regular(path, &rc);
    if (!root) return rc;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *ver = json_object_get(root, "format_version");
    json_t *lhj = json_object_get(root, "layout_hash");
    kvo_u128 v = {0, 0};
    uint64_t lh = 0;
    if (!fmt || strcmp(fmt, KVO__FILE_FORMAT_NAME) != 0 || !json_is_integer(ver)) {
        rc = kvo__error(KVO_EPARSE, "%s: not a kvoffload-file manifest (fields format, format_version)", path);
        goto out;
    }
    if (!parse_hex_exact(json_string_value(json_object_get(root, "fingerprint")), 32, &v.hi, &v.lo)) {
        rc = kvo__error(KVO_EPARSE, "%s: fingerprint is not 32 lowercase hex digits", path);
        goto out;
    }
    if (lhj && !parse_hex_exact(json_string_value(lhj), 16, NULL, &lh)) {
        rc = kvo__error(KVO_EPARSE, "%s: layout_hash is not 16 lowercase hex digits", path);
        goto out;
    }
    if (fingerprint) *fingerprint = v;
    if (layout_hash) *layout_hash = lh;
    if (version) *version = (int64_t)json_integer_value(ver);
    if (plan_json) {
        json_t *pl = json_object_get(root, "plan");
        *plan_json = pl ? json_dumps(pl, JSON_INDENT(2)) : NULL;
    }
out:
    json_decref(root);
    return rc;
}

/* The manifest's text for a plan and layout hash (malloc'd) or NULL. */
static char *manifest_text(const kvo_plan *plan, uint64_t layout_hash) {
    char *plan_json = NULL, fph[33];
    if (kvo_plan_to_json(plan, &plan_json)) return NULL;
    kvo_u128_hex(kvo_plan_fingerprint(plan), fph);
    json_error_t jerr;
    json_t *pl = json_loads(plan_json, 0, &jerr);
    kvo_free(plan_json);
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(KVO__FILE_FORMAT_NAME));
    json_object_set_new(root, "format_version", json_integer(KVO_FILE_FORMAT_VERSION));
    json_object_set_new(root, "fingerprint", json_string(fph));
    if (layout_hash) {
        char lh[17];
        snprintf(lh, sizeof lh, "%016llx", (unsigned long long)layout_hash);
        json_object_set_new(root, "layout_hash", json_string(lh));
    }
    json_object_set_new(root, "model", json_string(kvo_model_name(kvo_plan_model(plan))));
    json_object_set_new(root, "header_bytes", json_integer(KVO_FILE_HEADER_BYTES));
    json_object_set_new(root, "layout", json_string("<xx>/<hash hex>-g<group>.kvc, xx = low byte of hash.lo; "
                                                    "see docs/file-format.md"));
    if (pl) json_object_set_new(root, "plan", pl);
    char *text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    return text;
}

/* Write the manifest through a temporary file: link(2) when creating (a
 * concurrent creator's manifest wins), rename(2) when replacing a damaged
 * one.  The temporary's name carries host, pid and nonce, so that the stale
 * rule (file_scan.c) removes it after a kill. */
static int manifest_write(const char *ns_dir, const kvo_plan *plan, uint64_t layout_hash, unsigned fmode,
                          bool replace) {
    char *text = manifest_text(plan, layout_hash);
    if (!text) return kvo__error(KVO_ENOMEM, "cannot format the manifest");
    char tmp[KVO__FILE_PATH_MAX], path[KVO__FILE_PATH_MAX];
    static atomic_uint counter;
    snprintf(tmp, sizeof tmp, "%s/%s%08x.%ld.%08x.%u.manifest", ns_dir, KVO__FILE_TMP_PREFIX, kvo__file_host_id(),
             (long)getpid(), kvo__file_process_nonce(), atomic_fetch_add(&counter, 1));
    snprintf(path, sizeof path, "%s/%s", ns_dir, KVO__FILE_MANIFEST);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)fmode);
    kvo__file_set_mode(fd, fmode);
    if (fd < 0) {
        int e = errno;
        free(text);
        return kvo__error(e == ENOSPC || e == EDQUOT ? KVO_ENOSPC : KVO_EIO,
                          "%s: cannot create: %s (is the root writable?)", tmp, strerror(e));
    }
    size_t len = strlen(text), off = 0;
    int e = 0;
    while (off < len && !e) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) e = w < 0 ? errno : ENOSPC;
        else off += (size_t)w;
    }
    free(text);
    if (!e && (write(fd, "\n", 1) != 1 || fsync(fd) != 0)) e = errno ? errno : EIO;
    close(fd);
    if (!e) {
        if (replace) {
            if (rename(tmp, path) != 0 && (errno != EISDIR || kvo__file_remove_any(path) != 0 ||
                                           rename(tmp, path) != 0))
                e = errno ? errno : EIO;
        } else if (link(tmp, path) != 0 && errno != EEXIST) {
            e = errno;
        }
    }
    unlink(tmp);
    if (e)
        return kvo__error(e == ENOSPC || e == EDQUOT ? KVO_ENOSPC : KVO_EIO, "%s: cannot write: %s", path,
                          strerror(e));
    return 0;
}

int kvo__file_manifest_ensure(const char *ns_dir, const kvo_plan *plan, uint64_t layout_hash, unsigned fmode,
                              bool *rebuilt) {
    kvo_u128 fp = kvo_plan_fingerprint(plan), have;
    uint64_t have_lh = 0;
    int64_t ver = 0;
    char fph[33];
    kvo_u128_hex(fp, fph);
    if (rebuilt) *rebuilt = false;
    int rc = kvo__file_manifest_read(ns_dir, &have, &have_lh, &ver, NULL);
    if (rc == 0) {
        if (ver != KVO_FILE_FORMAT_VERSION)
            return kvo__error(KVO_ESTATE, "%s/%s: format version %lld, this build writes version %u: use another "
                              "root or remove the namespace", ns_dir, KVO__FILE_MANIFEST, (long long)ver,
                              KVO_FILE_FORMAT_VERSION);
        if (have.lo != fp.lo || have.hi != fp.hi || have_lh != layout_hash)
            return kvo__error(KVO_ESTATE, "%s/%s: manifest is for another layout (fingerprint, slot layout hash) "
                              "than %s / %016llx", ns_dir, KVO__FILE_MANIFEST, fph, (unsigned long long)layout_hash);
        return 0;
    }
    /* Missing: create it.  Damaged (unparsable, not a regular file): the
     * namespace's name is this plan's fingerprint and layout hash, and every
     * chunk file is verified against them on read, so the manifest is
     * rebuilt from the plan. */
    if (rc != KVO_ENOTFOUND && rc != KVO_EPARSE) return kvo__error_prefix(rc, "unusable namespace");
    bool replace = rc == KVO_EPARSE;
    rc = manifest_write(ns_dir, plan, layout_hash, fmode, replace);
    if (rc) return rc;
    if (rebuilt) *rebuilt = replace;
    rc = kvo__file_manifest_read(ns_dir, &have, &have_lh, &ver, NULL);
    if (rc) return rc;
    if (have.lo != fp.lo || have.hi != fp.hi || have_lh != layout_hash || ver != KVO_FILE_FORMAT_VERSION)
        return kvo__error(KVO_ESTATE, "%s/%s: manifest written concurrently for another layout", ns_dir,
                          KVO__FILE_MANIFEST);
    return 0;
}

/* ------------------------------------------------------------ remove -- */

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

int kvo__file_remove_any(const char *path) {
    if (unlink(path) == 0) return 0;
    int e = errno;
    if (e == ENOENT) return KVO_ENOTFOUND;
    if ((e == EISDIR || e == EPERM) && nftw(path, rm_cb, 8, FTW_DEPTH | FTW_PHYS) == 0) return 0;
    if (e == EISDIR || e == EPERM) e = errno;
    return kvo__error(KVO_EIO, "%s: cannot remove: %s", path, strerror(e));
}
