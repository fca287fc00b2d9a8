/* `kvoffload fsck DIR [--repair] [--json]`: check a file-tier directory.
 *
 * DIR is a file-tier root (its namespaces are the subdirectories named
 * <fingerprint>[-<layout hash>]) or one namespace directory.  For every namespace: the
 * manifest (format version, model, fingerprint, the plan's groups), then
 * every chunk file fully verified (header, header checksum, size, name vs key,
 * fingerprint vs manifest, geometry vs the manifest's plan, payload checksum).
 * Bad files are listed, and removed with --repair.  Temporary files of
 * writers that are gone (kvo_file_temp_stale: dead process on this host, or
 * another host's older than an hour) count as problems too; the others
 * belong to live writers (writes in flight, recycled files) and are only
 * counted.  Files whose names are
 * not chunk names are counted as unknown and never touched.
 *
 * The fan-out directories are walked with kvo_file_walk (the walk the tier's
 * startup scan uses), one lstat per entry; every chunk-shaped name is then
 * verified in full with kvo_file_inspect.
 *
 * Beside a live tier: a chunk name may be unlinked (an eviction), replaced
 * by another file, or (recycling) renamed away and its inode rewritten for
 * another key while it is being read.  So each chunk file is opened once
 * (openat, no symbolic link followed), verified through that descriptor
 * (/proc/self/fd/N), and judged only when the inode did not change while it
 * was read and the name still names it afterwards; a file that fails is
 * looked at again after a moment and reported BAD only if the same inode,
 * unchanged, fails again.  A name that vanished is skipped, one whose file
 * keeps changing is counted as in flux (not a problem).  --repair checks a
 * BAD file once more right before removing it, then moves the name aside
 * (renameat2 RENAME_NOREPLACE to a temporary name) and removes what it
 * moved only if it is that same inode (otherwise it is put back), so a good
 * file a writer placed meanwhile is never removed.
 *
 * Nothing is ever opened blocking (a FIFO under a chunk name or as the
 * manifest is reported, not waited on).  A namespace whose manifest names
 * another (newer) format version is reported and left alone: its files are
 * not this build's to judge.  A damaged manifest is reported as not repaired
 * (the tier rebuilds it from its plan at the next create); with --repair
 * --remove-damaged the namespace is removed.  Stale temporaries in the
 * namespace directory itself (a killed first create) count like the others.
 * The summary says how many problems --repair removed and how many are left.
 *
 * Exit status: 0 clean; 1 problems found; 2 usage, or DIR is not a
 * file-tier directory.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"

typedef struct fsck_group {
    bool known;
    char name[KVO_NAME_MAX];
    uint64_t chunk_bytes, slot_bytes, blocks_per_chunk, tokens_per_chunk, tokens_per_block, layers, page_bytes;
    uint64_t chunks, bytes;
} fsck_group;

typedef struct fsck_ctx {
    bool repair, json, remove_damaged;
    uint64_t problems;
    uint64_t removed;     /* problems --repair fixed (files or namespaces removed) */
    uint64_t ns_bad;      /* bad files of the namespace being checked */
    json_t *out;  /* array of namespace objects (json mode) */
} fsck_ctx;

static void fsck_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload fsck DIR [--repair [--remove-damaged]] [--json]\n\n"
            "Checks a file-tier directory: DIR is a root (every namespace below it) or one\n"
            "namespace (root/<fingerprint>).  Lists namespaces, chunk counts and bytes per group,\n"
            "verifies every chunk file (header, size, key, geometry, XXH3-64 checksum) and lists\n"
            "bad files.\n"
            "  --repair   remove bad chunk files and stale temporary files; a damaged manifest\n"
            "             is left (the tier rebuilds it from its plan at the next create)\n"
            "  --remove-damaged  with --repair: remove a namespace whose manifest is damaged\n"
            "  A namespace of a newer format version is reported and never touched.\n"
            "  --json     one JSON object\n"
            "Exit status: 0 clean, 3 problems found and every one repaired (--repair),\n"
            "1 problems left, 2 usage or not a file-tier directory.\n");
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

static bool remove_any(const char *path) {
    if (unlink(path) == 0) return true;
    if (errno == EISDIR || errno == EPERM) return nftw(path, rm_cb, 8, FTW_DEPTH | FTW_PHYS) == 0;
    return errno == ENOENT;
}

static bool is_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* A namespace directory name: <fingerprint: 32 hex>[-<layout hash: 16 hex>]. */
static bool is_ns_name(const char *s) {
    size_t n = strlen(s);
    if (n == 32) return is_hex(s, 32);
    return n == 49 && is_hex(s, 32) && s[32] == '-' && is_hex(s + 33, 16);
}

static uint64_t jnum(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
}

/* Record a problem with a file; with --repair remove it if `removable`. */
static void report_bad(fsck_ctx *c, json_t *bad, const char *path, const char *why, bool removable) {
    bool removed = removable && c->repair && remove_any(path);
    c->problems++;
    c->removed += removed;
    c->ns_bad++;
    if (c->json) {
        json_t *b = json_object();
        json_object_set_new(b, "path", json_string(path));
        json_object_set_new(b, "error", json_string(why));
        json_object_set_new(b, "removed", json_boolean(removed));
        json_array_append_new(bad, b);
    } else {
        printf("  BAD %s: %s%s\n", path, why, removed ? " (removed)" : "");
    }
}

/* Record a bad file; remove it with --repair. */
static void bad_file(fsck_ctx *c, json_t *bad, const char *path, const char *why) {
    report_bad(c, bad, path, why, true);
}

/* One namespace being checked. */
typedef struct fsck_ns {
    fsck_ctx *c;
    fsck_group groups[KVO_MAX_GROUPS];
    json_t *bad;
    uint64_t files, bytes, tmp_live, tmp_stale, unknown;
    uint64_t in_flux, vanished;   /* changing or gone while checked (a live tier) */
    char fp_hex[33], model[KVO_NAME_MAX];
    uint64_t layout_hash;
    long long version;
    bool skip;            /* do not walk: newer format, or namespace removed */
    bool damaged;         /* manifest unreadable or malformed */
} fsck_ns;

/* Load a JSON file that must be a regular file: O_NONBLOCK for the open (a
 * FIFO would block it), fstat, S_ISREG.  NULL with why filled. */
static json_t *load_regular_json(const char *path, char *why, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, cap, "manifest unreadable: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, cap, "manifest unreadable: not a regular file");
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    json_error_t jerr;
    json_t *man = json_loadfd(fd, 0, &jerr);
    close(fd);
    if (!man) snprintf(why, cap, "manifest unreadable: %s (line %d)", jerr.text, jerr.line);
    return man;
}

/* A damaged manifest: reported, never "repaired" silently.  With --repair
 * --remove-damaged the whole namespace goes; otherwise it is left for the
 * tier, which rebuilds it from its plan at the next create. */
static void damaged_manifest(fsck_ns *n, const char *path, const char *why) {
    char msg[768];
    n->damaged = true;
    snprintf(msg, sizeof msg, "%s; not repaired: the file tier rebuilds it from its plan at the next create, "
             "--repair --remove-damaged removes the namespace", why);
    report_bad(n->c, n->bad, path, msg, false);
}

/* The manifest: format version, fingerprint, layout hash, model and the
 * plan's offloaded groups (their geometry), checked against the directory's
 * name (base). */
static void fsck_manifest(fsck_ns *n, const char *ns, const char *base) {
    fsck_ctx *c = n->c;
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", ns);
    char why[512];
    json_t *man = load_regular_json(path, why, sizeof why);
    if (!man) {
        damaged_manifest(n, path, why);
        return;
    }
    const char *fp = json_string_value(json_object_get(man, "fingerprint"));
    const char *lh = json_string_value(json_object_get(man, "layout_hash"));
    json_t *ver = json_object_get(man, "format_version");
    if (!fp || strlen(fp) != 32 || !is_hex(fp, 32) || (json_object_get(man, "layout_hash") &&
        (!lh || strlen(lh) != 16 || !is_hex(lh, 16))) || !json_is_integer(ver) || json_integer_value(ver) < 1) {
        damaged_manifest(n, path, "manifest malformed (fingerprint: 32 hex digits, layout_hash: 16, "
                         "format_version: a positive integer)");
        json_decref(man);
        return;
    }
    snprintf(n->fp_hex, sizeof n->fp_hex, "%s", fp);
    if (lh) n->layout_hash = strtoull(lh, NULL, 16);
    const char *m = json_string_value(json_object_get(man, "model"));
    if (m) snprintf(n->model, sizeof n->model, "%s", m);
    n->version = (long long)json_integer_value(ver);
    if (n->version != KVO_FILE_FORMAT_VERSION) {
        /* written by another (newer) build: its files are not ours to judge */
        snprintf(why, sizeof why, "format version %lld is newer than this build's %u: namespace left alone",
                 n->version, KVO_FILE_FORMAT_VERSION);
        report_bad(c, n->bad, path, why, false);
        n->skip = true;
        json_decref(man);
        return;
    }
    json_t *gs = json_object_get(json_object_get(man, "plan"), "groups");
    size_t gi;
    json_t *g;
    json_array_foreach(gs, gi, g) {
        if (gi >= KVO_MAX_GROUPS) break;
        if (!json_is_true(json_object_get(g, "offloaded"))) continue;
        fsck_group *G = &n->groups[gi];
        G->known = true;
        const char *gn = json_string_value(json_object_get(g, "name"));
        snprintf(G->name, sizeof G->name, "%s", gn ? gn : "?");
        G->chunk_bytes = jnum(g, "chunk_bytes");
        G->slot_bytes = jnum(g, "slot_bytes");
        G->blocks_per_chunk = jnum(g, "blocks_per_chunk");
        G->tokens_per_chunk = jnum(g, "tokens_per_chunk");
        G->tokens_per_block = jnum(g, "tokens_per_block");
        G->layers = jnum(g, "layers");
        G->page_bytes = jnum(g, "page_bytes");
    }
    char want_name[64];
    if (n->layout_hash)
        snprintf(want_name, sizeof want_name, "%s-%016llx", n->fp_hex, (unsigned long long)n->layout_hash);
    else snprintf(want_name, sizeof want_name, "%s", n->fp_hex);
    if (strcmp(want_name, base) != 0 && is_ns_name(base)) {
        snprintf(why, sizeof why, "manifest (fingerprint, layout hash) says %s, not the directory's name", want_name);
        report_bad(c, n->bad, path, why, false);
    }
    json_decref(man);
}

/* Why a chunk file whose header verified does not belong here ("" when it
 * does): fingerprint, layout hash, fan-out directory, group, geometry. */
static void fsck_mismatch(const fsck_ns *n, const kvo_file_chunk_info *info, uint32_t subdir, char *why, size_t cap) {
    char kfp[33];
    kvo_u128_hex(info->fingerprint, kfp);
    const fsck_group *G = info->key.group < KVO_MAX_GROUPS ? &n->groups[info->key.group] : NULL;
    why[0] = 0;
    if (n->fp_hex[0] && strcmp(kfp, n->fp_hex) != 0)
        snprintf(why, cap, "belongs to layout %s, not this namespace's %s", kfp, n->fp_hex);
    else if (n->fp_hex[0] && info->layout_hash != n->layout_hash)
        snprintf(why, cap, "written for engine slot layout %016llx, this namespace is for %016llx",
                 (unsigned long long)info->layout_hash, (unsigned long long)n->layout_hash);
    else if ((info->key.hash.lo & 0xff) != (uint64_t)subdir)
        snprintf(why, cap, "misplaced: belongs in subdirectory %02x", (unsigned)(info->key.hash.lo & 0xff));
    else if (n->fp_hex[0] && (!G || !G->known))
        snprintf(why, cap, "group %u is not offloaded by the manifest's plan", info->key.group);
    else if (G && G->known &&
             (G->chunk_bytes != info->chunk_bytes || G->slot_bytes != info->slot_bytes ||
              G->blocks_per_chunk != info->blocks_per_chunk || G->tokens_per_chunk != info->tokens_per_chunk ||
              G->tokens_per_block != info->tokens_per_block || G->layers != info->layers ||
              G->page_bytes != info->page_bytes))
        snprintf(why, cap,
                 "wrong geometry for group '%s': file has %u layers x %llu blocks x %llu page bytes, "
                 "manifest %llu x %llu x %llu", G->name, info->layers,
                 (unsigned long long)info->blocks_per_chunk, (unsigned long long)info->page_bytes,
                 (unsigned long long)G->layers, (unsigned long long)G->blocks_per_chunk,
                 (unsigned long long)G->page_bytes);
}

/* A name shaped like a chunk file's (<32>-g<..>.kvc), even if not one the
 * tier would parse: such files are verified, everything else is unknown. */
static bool chunk_shaped(const char *name) {
    size_t len = strlen(name);
    return len >= 38 && strcmp(name + len - 4, ".kvc") == 0 && name[32] == '-' && name[33] == 'g';
}

/* Whether a chunk file's size rules it out before a byte is read: a header
 * can be re-sealed to claim any payload, and a sparse file of that size
 * costs nothing to make but hours to read.  With the manifest's geometry for
 * the group named in the file name, the size must be exactly the header plus
 * that group's slot; otherwise it must not exceed the largest slot of any
 * group of the manifest, or KVO__FSCK_MAX_FILE_BYTES with no usable manifest. */
#define KVO__FSCK_MAX_FILE_BYTES (64ull << 30)
static bool size_unbelievable(const fsck_ns *n, const kvo_file_walk_entry *e, uint64_t size, char *why, size_t cap) {
    const fsck_group *G = NULL;
    if (e->kind == KVO_FILE_WALK_CHUNK && e->key.group < KVO_MAX_GROUPS && n->groups[e->key.group].known)
        G = &n->groups[e->key.group];
    if (G) {
        uint64_t want = KVO_FILE_HEADER_BYTES + G->slot_bytes;
        if (size == want) return false;
        snprintf(why, cap, "%s: %llu bytes, but a chunk file of group %u (%s) is %llu bytes (header + %llu-byte "
                 "slot): not read", size < want ? "truncated" : "too long", (unsigned long long)size, e->key.group, G->name, (unsigned long long)want,
                 (unsigned long long)G->slot_bytes);
        return true;
    }
    uint64_t max = 0;
    for (size_t i = 0; i < KVO_MAX_GROUPS; i++)
        if (n->groups[i].known && n->groups[i].slot_bytes > max) max = n->groups[i].slot_bytes;
    max = max ? KVO_FILE_HEADER_BYTES + max : KVO__FSCK_MAX_FILE_BYTES;
    if (size <= max) return false;
    snprintf(why, cap, "%llu bytes, more than any chunk file here can be (%llu bytes at most): not read",
             (unsigned long long)size, (unsigned long long)max);
    return true;
}

/* ------------------------------------------------- one chunk, live-safe -- */

/* What identifies a file's contents as read: inode, size, and the times a
 * write (mtime) or a rename or link change (ctime) moves. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim, ctim;
} file_id;

static void id_of(const struct stat *st, file_id *id) {
    id->dev = st->st_dev;
    id->ino = st->st_ino;
    id->size = st->st_size;
    id->mtim = st->st_mtim;
    id->ctim = st->st_ctim;
}

static bool id_same(const file_id *a, const file_id *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtim.tv_sec == b->mtim.tv_sec &&
           a->mtim.tv_nsec == b->mtim.tv_nsec && a->ctim.tv_sec == b->ctim.tv_sec &&
           a->ctim.tv_nsec == b->ctim.tv_nsec;
}

enum { CHUNK_OK, CHUNK_BAD, CHUNK_GONE, CHUNK_FLUX };
/* A file that fails once is looked at again after this long (a writer's
 * rename and rewrite take far less); at most this many looks in all. */
#define FSCK_RECHECK_US 50000
#define FSCK_LOOKS 6

/* Check once what e's name names now.  CHUNK_OK: valid, *info filled;
 * CHUNK_BAD: why says what is wrong with the inode *id, which did not change
 * while it was read and which the name still names; CHUNK_GONE: the name
 * vanished; CHUNK_FLUX: the file changed while read, or the name now names
 * another file. */
static int chunk_check_once(const fsck_ns *n, const kvo_file_walk_entry *e, kvo_file_chunk_info *info, file_id *id,
                            char *why, size_t cap) {
    struct stat a, b;
    int fd = openat(e->dir_fd, e->name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) return CHUNK_GONE;
        if (fstatat(e->dir_fd, e->name, &a, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? CHUNK_GONE : CHUNK_FLUX;
        id_of(&a, id);
        if (S_ISLNK(a.st_mode)) snprintf(why, cap, "a symbolic link where a chunk file should be");
        else snprintf(why, cap, "cannot open: %s", strerror(err));
        return CHUNK_BAD;
    }
    int verdict = CHUNK_OK;
    if (fstat(fd, &a) != 0) {
        close(fd);
        return CHUNK_FLUX;
    }
    id_of(&a, id);
    if (!S_ISREG(a.st_mode)) {
        snprintf(why, cap, "%s where a chunk file should be", S_ISDIR(a.st_mode) ? "a directory" : "not a regular file");
        verdict = CHUNK_BAD;
    } else if (size_unbelievable(n, e, (uint64_t)a.st_size, why, cap)) {
        verdict = CHUNK_BAD;
    } else {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        if (kvo_file_inspect(proc, NULL, info) != 0) {
            const char *msg = kvo_last_error();
            size_t pl = strlen(proc);
            if (!strncmp(msg, proc, pl) && msg[pl] == ':') msg += pl + 2;
            snprintf(why, cap, "%s", msg);
            verdict = CHUNK_BAD;
        } else if (e->kind == KVO_FILE_WALK_CHUNK && !kvo_chunk_key_eq(&info->key, &e->key)) {
            char kh[33];
            kvo_u128_hex(info->key.hash, kh);
            snprintf(why, cap, "the header names another chunk (%s, group %u) than the file name", kh, info->key.group);
            verdict = CHUNK_BAD;
        } else {
            fsck_mismatch(n, info, e->subdir, why, cap);
            if (why[0]) verdict = CHUNK_BAD;
        }
    }
    bool changed = fstat(fd, &b) != 0;
    close(fd);
    file_id after;
    if (!changed) {
        id_of(&b, &after);
        changed = !id_same(id, &after);
    }
    if (changed) return CHUNK_FLUX; /* written while read */
    if (fstatat(e->dir_fd, e->name, &b, AT_SYMLINK_NOFOLLOW) != 0)
        return verdict == CHUNK_OK ? CHUNK_OK : CHUNK_GONE; /* removed meanwhile (a good file still counts) */
    if (b.st_ino != a.st_ino || b.st_dev != a.st_dev) return verdict == CHUNK_OK ? CHUNK_OK : CHUNK_FLUX;
    return verdict;
}

/* --repair of a BAD chunk file: look once more right before, then move the
 * name aside without replacing anything and remove what was moved only if it
 * is the inode that failed; anything else is put back. */
static bool repair_chunk(const fsck_ns *n, const kvo_file_walk_entry *e, const file_id *bad) {
    kvo_file_chunk_info info;
    file_id id;
    char why[512];
    if (chunk_check_once(n, e, &info, &id, why, sizeof why) != CHUNK_BAD || !id_same(&id, bad)) return false;
    static unsigned counter;
    char q[96];
    snprintf(q, sizeof q, ".tmp.fsck.%ld.%u", (long)getpid(), counter++);
    if (renameat2(e->dir_fd, e->name, e->dir_fd, q, RENAME_NOREPLACE) != 0) {
        if (errno != EINVAL && errno != ENOSYS) return false;
        /* no RENAME_NOREPLACE here: unlink after one more look (a narrow race) */
        struct stat st;
        if (fstatat(e->dir_fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_ino != bad->ino) return false;
        return unlinkat(e->dir_fd, e->name, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) == 0;
    }
    struct stat st;
    if (fstatat(e->dir_fd, q, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == bad->ino && st.st_dev == bad->dev &&
        unlinkat(e->dir_fd, q, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) == 0)
        return true;
    /* a writer's file took the name meanwhile: back it goes (a copy of the
     * same chunk may have been placed since: then this one is a spare) */
    if (renameat2(e->dir_fd, q, e->dir_fd, e->name, RENAME_NOREPLACE) != 0) unlinkat(e->dir_fd, q, 0);
    return false;
}

/* Record a BAD chunk file; with --repair remove it as repair_chunk says. */
static void bad_chunk(fsck_ns *n, const kvo_file_walk_entry *e, const char *why, const file_id *id) {
    fsck_ctx *c = n->c;
    bool removed = c->repair && repair_chunk(n, e, id);
    c->problems++;
    c->removed += removed;
    c->ns_bad++;
    if (c->json) {
        json_t *b = json_object();
        json_object_set_new(b, "path", json_string(e->path));
        json_object_set_new(b, "error", json_string(why));
        json_object_set_new(b, "removed", json_boolean(removed));
        json_array_append_new(n->bad, b);
    } else {
        printf("  BAD %s: %s%s\n", e->path, why, removed ? " (removed)" : (c->repair ? " (not removed: it changed)" : ""));
    }
}

/* One chunk-shaped name: judged on a stable inode, twice when it fails. */
static void fsck_chunk(fsck_ns *n, const kvo_file_walk_entry *e) {
    file_id failed = {0};
    bool failed_once = false;
    char why[512];
    for (int look = 0; look < FSCK_LOOKS; look++) {
        kvo_file_chunk_info info;
        file_id id;
        why[0] = 0;
        int v = chunk_check_once(n, e, &info, &id, why, sizeof why);
        if (v == CHUNK_OK) {
            fsck_group *G = info.key.group < KVO_MAX_GROUPS ? &n->groups[info.key.group] : NULL;
            if (G) {
                if (!G->known && !G->name[0]) snprintf(G->name, sizeof G->name, "%s", info.group_name);
                G->chunks++;
                G->bytes += info.file_bytes;
            }
            n->files++;
            n->bytes += info.file_bytes;
            return;
        }
        if (v == CHUNK_GONE) {
            n->vanished++;
            return;
        }
        if (v == CHUNK_BAD && failed_once && id_same(&failed, &id)) {
            bad_chunk(n, e, why, &id);
            return;
        }
        failed_once = v == CHUNK_BAD;
        failed = id;
        usleep(v == CHUNK_BAD ? FSCK_RECHECK_US : 1000u << look); /* a writer renaming or rewriting it */
    }
    n->in_flux++;
}

/* kvo_file_walk callback: one entry of a fan-out directory. */
static int fsck_visit(const kvo_file_walk_entry *e, void *arg) {
    fsck_ns *n = arg;
    fsck_ctx *c = n->c;
    if (!e->have_stat) return 0; /* vanished */
    if (e->kind == KVO_FILE_WALK_TEMP) {
        if (kvo_file_temp_stale(e->path) == 1) {
            n->tmp_stale++;
            bad_file(c, n->bad, e->path, "stale temporary file (a writer died)");
        } else {
            n->tmp_live++;
        }
        return 0;
    }
    if (e->kind != KVO_FILE_WALK_CHUNK && !chunk_shaped(e->name)) {
        n->unknown++;
        return 0;
    }
    if (e->is_dir) {
        bad_file(c, n->bad, e->path, "a directory where a chunk file should be");
        return 0;
    }
    fsck_chunk(n, e);
    return 0;
}

/* Temporary files in the namespace directory itself (a manifest being
 * written, probes): a killed first create leaves them behind. */
static void fsck_ns_temps(fsck_ns *n, const char *ns) {
    DIR *d = opendir(ns);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, ".tmp.", 5) != 0) continue;
        snprintf(path, sizeof path, "%s/%s", ns, e->d_name);
        if (kvo_file_temp_stale(path) == 1) {
            n->tmp_stale++;
            bad_file(n->c, n->bad, path, "stale temporary file (a writer died)");
        } else {
            n->tmp_live++;
        }
    }
    closedir(d);
}

/* The namespace's summary: a JSON object appended to c->out, or text. */
static void fsck_summary(fsck_ns *n, const char *ns) {
    fsck_ctx *c = n->c;
    if (c->json) {
        json_t *o = json_object();
        json_object_set_new(o, "dir", json_string(ns));
        json_object_set_new(o, "fingerprint", json_string(n->fp_hex));
        json_object_set_new(o, "model", json_string(n->model));
        if (n->layout_hash) {
            char lh[17];
            snprintf(lh, sizeof lh, "%016llx", (unsigned long long)n->layout_hash);
            json_object_set_new(o, "layout_hash", json_string(lh));
        }
        json_object_set_new(o, "format_version", json_integer(n->version));
        json_t *ga = json_array();
        for (int i = 0; i < KVO_MAX_GROUPS; i++) {
            if (!n->groups[i].known && !n->groups[i].chunks) continue;
            json_t *g = json_object();
            json_object_set_new(g, "group", json_integer(i));
            json_object_set_new(g, "name", json_string(n->groups[i].name));
            json_object_set_new(g, "chunks", json_integer((json_int_t)n->groups[i].chunks));
            json_object_set_new(g, "bytes", json_integer((json_int_t)n->groups[i].bytes));
            json_array_append_new(ga, g);
        }
        json_object_set_new(o, "groups", ga);
        json_object_set_new(o, "files", json_integer((json_int_t)n->files));
        json_object_set_new(o, "bytes", json_integer((json_int_t)n->bytes));
        json_object_set_new(o, "temporary_in_progress", json_integer((json_int_t)n->tmp_live));
        json_object_set_new(o, "temporary_stale", json_integer((json_int_t)n->tmp_stale));
        json_object_set_new(o, "unknown_files", json_integer((json_int_t)n->unknown));
        json_object_set_new(o, "in_flux", json_integer((json_int_t)n->in_flux));
        json_object_set_new(o, "vanished", json_integer((json_int_t)n->vanished));
        json_object_set_new(o, "bad", n->bad);
        json_array_append_new(c->out, o);
        return;
    }
    printf("  %-6s %-16s %10s %16s\n", "group", "name", "chunks", "bytes");
    for (int i = 0; i < KVO_MAX_GROUPS; i++) {
        if (!n->groups[i].known && !n->groups[i].chunks) continue;
        printf("  %-6d %-16s %10llu %16llu\n", i, n->groups[i].name, (unsigned long long)n->groups[i].chunks,
               (unsigned long long)n->groups[i].bytes);
    }
    printf("  files %llu (%llu bytes), bad %zu, temporary %llu in progress + %llu stale, unknown %llu\n",
           (unsigned long long)n->files, (unsigned long long)n->bytes, (size_t)c->ns_bad,
           (unsigned long long)n->tmp_live, (unsigned long long)n->tmp_stale, (unsigned long long)n->unknown);
    if (n->in_flux || n->vanished)
        printf("  changing while checked (a live tier): %llu in flux, %llu removed meanwhile (not problems)\n",
               (unsigned long long)n->in_flux, (unsigned long long)n->vanished);
    json_decref(n->bad);
}

static int fsck_namespace(fsck_ctx *c, const char *ns) {
    fsck_ns ns_state;
    fsck_ns *n = &ns_state;
    memset(n, 0, sizeof *n);
    n->c = c;
    n->bad = json_array();
    n->version = -1;
    snprintf(n->model, sizeof n->model, "?");
    const char *base = strrchr(ns, '/');
    base = base ? base + 1 : ns;
    c->ns_bad = 0;

    if (!c->json) printf("namespace %s\n", ns);
    fsck_manifest(n, ns, base);
    if (!c->json) {
        printf("  model %s  fingerprint %s  format %lld", n->model, n->fp_hex[0] ? n->fp_hex : "?", n->version);
        if (n->layout_hash) printf("  slot layout %016llx", (unsigned long long)n->layout_hash);
        printf("\n");
    }
    int rc = 0;
    if (n->damaged && c->repair && c->remove_damaged) {
        bool ok = remove_any(ns);
        c->removed += ok;
        if (c->json) {
            json_t *b = json_object();
            json_object_set_new(b, "path", json_string(ns));
            json_object_set_new(b, "error", json_string(ok ? "namespace removed (damaged manifest)"
                                                           : "namespace could not be removed"));
            json_object_set_new(b, "removed", json_boolean(ok));
            json_array_append_new(n->bad, b);
        } else {
            printf("  %s: %s\n", ns, ok ? "namespace removed (damaged manifest)" : "namespace could not be removed");
        }
        n->skip = true;
    }
    if (!n->skip) {
        fsck_ns_temps(n, ns);
        rc = kvo_file_walk(ns, KVO_FILE_WALK_STAT, fsck_visit, n);
        if (rc) fprintf(stderr, "kvoffload fsck: %s\n", kvo_last_error());
    }
    fsck_summary(n, ns);
    return rc;
}

int kvo_cmd_fsck(int argc, char **argv) {
    fsck_ctx c = {0};
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fsck_usage(stdout);
            return KVO_EXIT_OK;
        } else if (!strcmp(argv[i], "--repair")) c.repair = true;
        else if (!strcmp(argv[i], "--json")) c.json = true;
        else if (!strcmp(argv[i], "--remove-damaged")) c.remove_damaged = true;
        else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "kvoffload fsck: unexpected argument '%s'\n", argv[i]);
            fsck_usage(stderr);
            return KVO_EXIT_USAGE;
        } else dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "kvoffload fsck: name a directory\n");
        fsck_usage(stderr);
        return KVO_EXIT_USAGE;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvoffload fsck: '%s' is not a directory\n", dir);
        return KVO_EXIT_USAGE;
    }
    if (c.json) c.out = json_array();
    char path[4096];
    size_t n_ns = 0;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (access(path, F_OK) == 0) {
        fsck_namespace(&c, dir);
        n_ns = 1;
    } else {
        DIR *d = opendir(dir);
        struct dirent *e;
        char **names = NULL;
        size_t cap = 0;
        while (d && (e = readdir(d)) != NULL) {
            if (!is_ns_name(e->d_name)) continue;
            if (n_ns == cap) {
                cap = cap ? 2 * cap : 8;
                names = realloc(names, cap * sizeof *names);
            }
            names[n_ns++] = strdup(e->d_name);
        }
        if (d) closedir(d);
        for (size_t i = 0; i < n_ns; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            fsck_namespace(&c, path);
            free(names[i]);
        }
        free(names);
        if (n_ns == 0) {
            fprintf(stderr, "kvoffload fsck: '%s' holds no file-tier namespace (no manifest.json, no "
                            "<fingerprint> directories)\n", dir);
            if (c.out) json_decref(c.out);
            return KVO_EXIT_USAGE;
        }
    }
    if (c.json) {
        json_t *o = json_object();
        json_object_set_new(o, "root", json_string(dir));
        json_object_set_new(o, "namespaces", c.out);
        json_object_set_new(o, "problems", json_integer((json_int_t)c.problems));
        json_object_set_new(o, "repair", json_boolean(c.repair));
        json_object_set_new(o, "removed", json_integer((json_int_t)c.removed));
        char *s = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("%zu namespace%s, %llu problem%s", n_ns, n_ns == 1 ? "" : "s", (unsigned long long)c.problems,
               c.problems == 1 ? "" : "s");
        if (c.repair && c.problems)
            printf(" (%llu removed, %llu left: see above)", (unsigned long long)c.removed,
                   (unsigned long long)(c.problems - c.removed));
        printf("\n");
    }
    if (!c.problems) return KVO_EXIT_OK;
    return c.repair && c.removed >= c.problems ? KVO_EXIT_REPAIRED : KVO_EXIT_FAIL;
}
