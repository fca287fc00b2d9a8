/*
 * The namespace walker and the file tier's startup scan.
 *
 * What it owns
 *  - kvo_file_walk: the one fan-out directory walk of the project.  The
 *    tier's startup scan, `kvoffload fsck` and `kvoffload bench file` all
 *    walk a namespace through it.  It opens the namespace once, each of the
 *    256 fan-out directories with openat + fdopendir, reads every entry once,
 *    classifies the name (chunk file with its parsed key, temporary file,
 *    other) and, when asked, lstats it with fstatat (no path lookup from the
 *    root per file).  The path handed to the callback is built in one buffer
 *    whose "<ns_dir>/<xx>/" prefix is written once per fan-out directory.
 *  - Stale temporary files: the rule telling a dead writer's leftovers from
 *    a live writer's (kvo_file_temp_stale; the scan removes stale ones).
 *  - The startup scan: collect every chunk file's key and last use in one
 *    walk, then adopt them into the quota index oldest first, in batches.
 *  - Shared mode: eviction of files no index of this process holds, from
 *    sampled fan-out directories (kvo__file_evict_foreign, below).
 *
 * Lock rules: the walker takes no lock and holds none while it calls user
 * code.  The scan runs inside kvo_file_tier_create, before any other thread
 * can see the tier: it touches t->st without mu.  The foreign eviction runs
 * on a writer's thread: it takes mu only for its counters.
 *
 * Invariants: the walk never follows a symbolic link (lstat semantics) and
 * never reads a header; the scan removes only what is provably not a valid
 * chunk of this namespace (misplaced, a group the plan does not offload, a
 * directory, a stale temporary) and leaves foreign names alone.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tiers/file_internal.h"

/* ------------------------------------------------------------ walker -- */

static bool is_dot_or_dotdot(const char *s) { return s[0] == '.' && (!s[1] || (s[1] == '.' && !s[2])); }

/* Fill the name-derived and (with KVO_FILE_WALK_STAT) stat fields. */
static void walk_classify(kvo_file_walk_entry *e, const struct dirent *de, uint32_t flags) {
    const char *name = e->name;
    if (!strncmp(name, KVO__FILE_TMP_PREFIX, strlen(KVO__FILE_TMP_PREFIX))) e->kind = KVO_FILE_WALK_TEMP;
    else if (kvo__file_parse_name(name, &e->key) == 0) e->kind = KVO_FILE_WALK_CHUNK;
    else e->kind = KVO_FILE_WALK_OTHER;
    e->is_dir = de->d_type == DT_DIR;
    if (!(flags & KVO_FILE_WALK_STAT)) return;
    struct stat st;
    if (fstatat(e->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return; /* vanished meanwhile */
    e->have_stat = true;
    e->is_dir = S_ISDIR(st.st_mode);
    e->is_regular = S_ISREG(st.st_mode);
    e->file_bytes = (uint64_t)st.st_size;
    e->disk_bytes = (uint64_t)st.st_blocks * 512u;
    e->last_used_s = st.st_atime > st.st_mtime ? (int64_t)st.st_atime : (int64_t)st.st_mtime;
}

/* One fan-out directory; path holds "<ns_dir>" (len bytes) on entry. */
static int walk_subdir(int nsfd, uint32_t b, char *path, size_t len, uint32_t flags, kvo_file_walk_fn fn, void *ctx) {
    char sub[3];
    snprintf(sub, sizeof sub, "%02x", b);
    int dfd = openat(nsfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return 0; /* made on first use: absent is normal */
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return 0;
    }
    snprintf(path + len, KVO__FILE_PATH_MAX - len, "/%s/", sub);
    size_t base = len + 4;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (is_dot_or_dotdot(de->d_name)) continue;
        size_t nl = strlen(de->d_name);
        if (base + nl >= KVO__FILE_PATH_MAX) continue; /* cannot happen: checked at the start */
        memcpy(path + base, de->d_name, nl + 1);
        kvo_file_walk_entry e;
        memset(&e, 0, sizeof e);
        e.path = path;
        e.name = path + base;
        e.dir_fd = dfd;
        e.subdir = b;
        walk_classify(&e, de, flags);
        rc = fn(&e, ctx);
    }
    closedir(d);
    return rc;
}

int kvo_file_walk(const char *ns_dir, uint32_t flags, kvo_file_walk_fn fn, void *ctx) {
    if (!ns_dir || !fn) return kvo__error(KVO_EINVAL, "kvo_file_walk: NULL %s", !ns_dir ? "ns_dir" : "callback");
    if (flags & ~KVO_FILE_WALK_STAT)
        return kvo__error(KVO_EINVAL, "kvo_file_walk: unknown flags 0x%x (only KVO_FILE_WALK_STAT is defined)",
                          (unsigned)flags);
    size_t len = strlen(ns_dir);
    if (len + 4 + 256 >= KVO__FILE_PATH_MAX)
        return kvo__error(KVO_ERANGE, "kvo_file_walk: '%.64s...' is %zu bytes long; at most %d fit", ns_dir, len,
                          KVO__FILE_PATH_MAX - 4 - 256 - 1);
    int nsfd = open(ns_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (nsfd < 0) return kvo__error(KVO_EIO, "kvo_file_walk: cannot open directory '%s': %s", ns_dir, strerror(errno));
    char path[KVO__FILE_PATH_MAX];
    memcpy(path, ns_dir, len + 1);
    int rc = 0;
    for (uint32_t b = 0; b < 256 && rc == 0; b++) rc = walk_subdir(nsfd, b, path, len, flags, fn, ctx);
    close(nsfd);
    return rc;
}

/* --------------------------------------------------- stale temporaries -- */

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
    bool stale = stale_tmp_rule(kvo__file_host_id(), (long)getpid(), kvo__file_process_nonce(), dfd, name);
    close(dfd);
    return stale ? 1 : 0;
}

/* Temporary files in the namespace directory itself: the manifest's
 * (.tmp.<host>.<pid>.<nonce>.<n>.manifest; older builds wrote
 * .tmp.manifest.<pid>.<n>, removed by the age rule) and the probes'.  A kill
 * during the first create leaves them; the fan-out walk never sees them. */
void kvo__file_clean_ns_temps(kvo_file_tier *t) {
    int dfd = open(t->ns_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, KVO__FILE_TMP_PREFIX, strlen(KVO__FILE_TMP_PREFIX)) != 0) continue;
        if (!stale_tmp_rule(t->hostid, t->pid, t->nonce, dfd, de->d_name)) continue;
        if (unlinkat(dfd, de->d_name, 0) == 0) t->st.scan_removed++;
    }
    closedir(d);
}

/* ------------------------------------------------------------- collect -- */

/* The scan collects every chunk file's key and last use (the later of its
 * access and modification times: with relatime the access time moves at
 * least daily), sorts by it, and adopts oldest first in batches (one store
 * call per batch instead of two per file), so that the eviction order after
 * a restart follows the files' age rather than directory order. */
typedef struct scan_ctx {
    kvo_file_tier *t;
    kvo__scan_item *items;
    size_t n, cap;
    uint64_t bytes;
} scan_ctx;

static int scan_visit(const kvo_file_walk_entry *e, void *arg) {
    scan_ctx *c = arg;
    kvo_file_tier *t = c->t;
    if (e->kind == KVO_FILE_WALK_TEMP) {
        if (stale_tmp_rule(t->hostid, t->pid, t->nonce, e->dir_fd, e->name)) {
            unlinkat(e->dir_fd, e->name, 0);
            t->st.scan_removed++;
        }
        return 0;
    }
    if (e->kind != KVO_FILE_WALK_CHUNK) return 0; /* not ours: leave it */
    bool not_regular = e->is_dir || (e->have_stat && !e->is_regular);
    if ((e->key.hash.lo & 0xff) != e->subdir || !kvo__file_group_of(t, &e->key) || not_regular) {
        /* misplaced, a group this layout does not offload, or not a regular
         * file (a directory, a FIFO: opening it would block, a symbolic
         * link, a device): never adopted */
        if (not_regular)
            kvo__file_log(t, KVO__FLOG_CORRUPT, "%s: not a regular file where a chunk belongs: removed", e->path);
        kvo__file_remove_any(e->path);
        t->st.scan_removed++;
        return 0;
    }
    if (!e->have_stat) return 0; /* vanished meanwhile */
    int rc = kvo__grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items, 1024, "file tier: scan");
    if (rc) return rc;
    c->items[c->n].key = e->key;
    c->items[c->n].used = e->last_used_s;
    c->n++;
    /* the payload share: what the quota counts for this file */
    c->bytes += e->file_bytes > KVO_FILE_HEADER_BYTES ? e->file_bytes - KVO_FILE_HEADER_BYTES : 0;
    return 0;
}

int kvo__file_scan_collect(kvo_file_tier *t, kvo__scan_item **out, size_t *n_out, uint64_t *disk_bytes) {
    scan_ctx c = {.t = t};
    int rc = kvo_file_walk(t->ns_dir, KVO_FILE_WALK_STAT, scan_visit, &c);
    if (rc) {
        kvo__free(c.items);
        return rc;
    }
    *out = c.items;
    *n_out = c.n;
    *disk_bytes = c.bytes;
    return 0;
}

/* --------------------------------------------------------------- adopt -- */

static int scan_item_cmp(const void *a, const void *b) {
    const kvo__scan_item *x = a, *y = b;
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
        kvo__file_unlink_evicted(t, sc->ev, nev);
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
        if (kvo__file_adopt_key(t, &sc->keys[i], &one) != 0) {
            kvo__file_key_path(t, &sc->keys[i], path);
            (void)kvo__file_unlink_key(t, &sc->keys[i], path, true);
            t->st.scan_removed++;
            continue;
        }
        t->st.scanned_files++;
        t->st.scan_removed += one;
        t->st.evictions -= one;
    }
    sc->n = 0;
}

int kvo__file_scan_adopt(kvo_file_tier *t, kvo__scan_item *items, size_t n_items) {
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

/* ------------------------------------------ eviction of foreign files -- */

/* Shared mode: files that no index of this process can evict (written by
 * processes that never told this one, some of them gone) still count in the
 * shared quota.  When this index has nothing left to evict, fan-out
 * directories are sampled, round robin over every process of the namespace
 * (the accounting's cursor), until FOREIGN_SEEN chunk files were seen or
 * every directory was: one readdir and one fstatat per entry, bounded.  The
 * least recently used of them (access or modification time) are removed
 * until `need` bytes and a little more (FOREIGN_SLACK units, at most 1/16 of
 * the quota: the next writes then need not sample) are free.  A file this
 * index holds pinned or pending is skipped; one it holds ready leaves the
 * index first.  Another process that indexed a removed file misses it on
 * its next read, as with any eviction elsewhere. */
enum { FOREIGN_SEEN = 64, FOREIGN_MAX = 256, FOREIGN_SLACK = 8 };

typedef struct foreign_ctx {
    kvo_file_tier *t;
    kvo__scan_item items[FOREIGN_MAX];
    size_t n;
} foreign_ctx;

static int foreign_visit(const kvo_file_walk_entry *e, void *arg) {
    foreign_ctx *c = arg;
    if (e->kind != KVO_FILE_WALK_CHUNK || !e->have_stat || !e->is_regular || c->n == FOREIGN_MAX) return 0;
    const kvo_group_plan *g = kvo__file_group_of(c->t, &e->key);
    if (!g || e->file_bytes != kvo__file_stage_size(g) || (e->key.hash.lo & 0xff) != e->subdir) return 0;
    kvo_store_entry se;
    if (kvo_store_peek(c->t->index, &e->key, &se) == 0 && (se.pins || se.state != KVO_READY)) return 0;
    c->items[c->n].key = e->key;
    c->items[c->n].used = e->last_used_s;
    c->n++;
    return 0;
}

uint64_t kvo__file_evict_foreign(kvo_file_tier *t, uint64_t need) {
    if (!t->share) return 0;
    uint64_t freed = kvo__fshare_reap(t->share); /* a dead process's reservations first */
    if (freed >= need) return freed;
    foreign_ctx *c = kvo__malloc(sizeof *c);
    if (!c) return freed;
    c->t = t;
    c->n = 0;
    int nsfd = open(t->ns_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char path[KVO__FILE_PATH_MAX];
    size_t len = strlen(t->ns_dir);
    memcpy(path, t->ns_dir, len + 1);
    for (uint32_t d = 0; nsfd >= 0 && d < 256 && c->n < FOREIGN_SEEN; d++)
        walk_subdir(nsfd, kvo__fshare_next_dir(t->share), path, len, KVO_FILE_WALK_STAT, foreign_visit, c);
    if (nsfd >= 0) close(nsfd);
    if (c->n > 1) qsort(c->items, c->n, sizeof *c->items, scan_item_cmp);
    uint64_t slack = FOREIGN_SLACK * t->ballast_unit, cap = t->quota / 16;
    uint64_t target = need + (slack < cap ? slack : cap), removed = 0;
    for (size_t i = 0; i < c->n && freed < target; i++) {
        const kvo_chunk_key *k = &c->items[i].key;
        if (kvo_store_remove(t->index, k, 1) != 0) continue; /* pinned or pending meanwhile */
        kvo__file_key_path(t, k, path);
        if (!kvo__file_unlink_key(t, k, path, false)) continue; /* gone: whoever removed it un-counted it */
        freed += kvo__file_group_of(t, k)->slot_bytes;
        removed++;
    }
    kvo__free(c);
    if (removed) {
        pthread_mutex_lock(&t->mu);
        t->st.evictions += removed;
        t->st.foreign_evictions += removed;
        pthread_mutex_unlock(&t->mu);
    }
    return freed;
}
