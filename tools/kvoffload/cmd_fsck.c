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
 * Exit status: 0 clean; 1 problems found (with --repair: found and removed);
 * 2 usage, or DIR is not a file-tier directory.
 */
#include <dirent.h>
#include <errno.h>
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
    bool repair, json;
    uint64_t problems;
    uint64_t ns_bad;      /* bad files of the namespace being checked */
    json_t *out;  /* array of namespace objects (json mode) */
} fsck_ctx;

static void fsck_usage(FILE *f) {
    fprintf(f,
            "usage: kvoffload fsck DIR [--repair] [--json]\n\n"
            "Checks a file-tier directory: DIR is a root (every namespace below it) or one\n"
            "namespace (root/<fingerprint>).  Lists namespaces, chunk counts and bytes per group,\n"
            "verifies every chunk file (header, size, key, geometry, XXH3-64 checksum) and lists\n"
            "bad files.\n"
            "  --repair   remove bad chunk files and stale temporary files\n"
            "  --json     one JSON object\n"
            "Exit status: 0 clean, 1 problems found (removed with --repair), 2 usage or not a\n"
            "file-tier directory.\n");
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

static int fsck_namespace(fsck_ctx *c, const char *ns) {
    fsck_group groups[KVO_MAX_GROUPS];
    memset(groups, 0, sizeof groups);
    json_t *bad = json_array();
    uint64_t files = 0, bytes = 0, tmp_live = 0, tmp_stale = 0, unknown = 0;
    char path[4096], fp_hex[33] = "", model[KVO_NAME_MAX] = "?";
    uint64_t layout_hash = 0;
    long long version = -1;
    const char *base = strrchr(ns, '/');
    base = base ? base + 1 : ns;
    c->ns_bad = 0;

    if (!c->json) printf("namespace %s\n", ns);
    snprintf(path, sizeof path, "%s/manifest.json", ns);
    json_error_t jerr;
    json_t *man = json_load_file(path, 0, &jerr);
    if (!man) {
        char why[512];
        snprintf(why, sizeof why, "manifest unreadable: %s (line %d)", jerr.text, jerr.line);
        report_bad(c, bad, path, why, false);
    } else {
        const char *fp = json_string_value(json_object_get(man, "fingerprint"));
        if (fp) snprintf(fp_hex, sizeof fp_hex, "%s", fp);
        const char *lh = json_string_value(json_object_get(man, "layout_hash"));
        if (lh) layout_hash = strtoull(lh, NULL, 16);
        const char *m = json_string_value(json_object_get(man, "model"));
        if (m) snprintf(model, sizeof model, "%s", m);
        version = (long long)jnum(man, "format_version");
        json_t *gs = json_object_get(json_object_get(man, "plan"), "groups");
        size_t gi;
        json_t *g;
        json_array_foreach(gs, gi, g) {
            if (gi >= KVO_MAX_GROUPS) break;
            if (!json_is_true(json_object_get(g, "offloaded"))) continue;
            fsck_group *G = &groups[gi];
            G->known = true;
            const char *n = json_string_value(json_object_get(g, "name"));
            snprintf(G->name, sizeof G->name, "%s", n ? n : "?");
            G->chunk_bytes = jnum(g, "chunk_bytes");
            G->slot_bytes = jnum(g, "slot_bytes");
            G->blocks_per_chunk = jnum(g, "blocks_per_chunk");
            G->tokens_per_chunk = jnum(g, "tokens_per_chunk");
            G->tokens_per_block = jnum(g, "tokens_per_block");
            G->layers = jnum(g, "layers");
            G->page_bytes = jnum(g, "page_bytes");
        }
        if (version != KVO_FILE_FORMAT_VERSION) {
            char why[128];
            snprintf(why, sizeof why, "format version %lld; this build reads %u", version, KVO_FILE_FORMAT_VERSION);
            bad_file(c, bad, path, why);
        }
        char want_name[64];
        if (layout_hash) snprintf(want_name, sizeof want_name, "%s-%016llx", fp_hex, (unsigned long long)layout_hash);
        else snprintf(want_name, sizeof want_name, "%s", fp_hex);
        if (strcmp(want_name, base) != 0 && is_ns_name(base)) {
            char why[160];
            snprintf(why, sizeof why, "manifest (fingerprint, layout hash) says %s, not the directory's name", want_name);
            report_bad(c, bad, path, why, false);
        }
        json_decref(man);
    }
    if (!c->json) {
        printf("  model %s  fingerprint %s  format %lld", model, fp_hex[0] ? fp_hex : "?", version);
        if (layout_hash) printf("  slot layout %016llx", (unsigned long long)layout_hash);
        printf("\n");
    }

    for (int b = 0; b < 256; b++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%02x", ns, b);
        DIR *d = opendir(dir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            const char *name = e->d_name;
            if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
            snprintf(path, sizeof path, "%s/%s", dir, name);
            struct stat st;
            if (lstat(path, &st) != 0) continue; /* vanished */
            if (!strncmp(name, ".tmp.", 5)) {
                if (kvo_file_temp_stale(path) == 1) {
                    tmp_stale++;
                    bad_file(c, bad, path, "stale temporary file (a writer died)");
                } else {
                    tmp_live++;
                }
                continue;
            }
            size_t len = strlen(name);
            if (len < 38 || strcmp(name + len - 4, ".kvc") != 0 || name[32] != '-' || name[33] != 'g') {
                unknown++;
                continue;
            }
            if (S_ISDIR(st.st_mode)) {
                bad_file(c, bad, path, "a directory where a chunk file should be");
                continue;
            }
            kvo_file_chunk_info info;
            int rc = kvo_file_inspect(path, NULL, &info);
            if (rc) {
                const char *why = kvo_last_error();
                size_t pl = strlen(path);
                if (!strncmp(why, path, pl) && why[pl] == ':') why += pl + 2;
                bad_file(c, bad, path, why);
                continue;
            }
            char why[512] = "";
            char kfp[33];
            kvo_u128_hex(info.fingerprint, kfp);
            fsck_group *G = info.key.group < KVO_MAX_GROUPS ? &groups[info.key.group] : NULL;
            if (fp_hex[0] && strcmp(kfp, fp_hex) != 0)
                snprintf(why, sizeof why, "belongs to layout %s, not this namespace's %s", kfp, fp_hex);
            else if (fp_hex[0] && info.layout_hash != layout_hash)
                snprintf(why, sizeof why, "written for engine slot layout %016llx, this namespace is for %016llx",
                         (unsigned long long)info.layout_hash, (unsigned long long)layout_hash);
            else if ((info.key.hash.lo & 0xff) != (uint64_t)b)
                snprintf(why, sizeof why, "misplaced: belongs in subdirectory %02x",
                         (unsigned)(info.key.hash.lo & 0xff));
            else if (fp_hex[0] && (!G || !G->known))
                snprintf(why, sizeof why, "group %u is not offloaded by the manifest's plan", info.key.group);
            else if (G && G->known &&
                     (G->chunk_bytes != info.chunk_bytes || G->slot_bytes != info.slot_bytes ||
                      G->blocks_per_chunk != info.blocks_per_chunk || G->tokens_per_chunk != info.tokens_per_chunk ||
                      G->tokens_per_block != info.tokens_per_block || G->layers != info.layers ||
                      G->page_bytes != info.page_bytes))
                snprintf(why, sizeof why,
                         "wrong geometry for group '%s': file has %u layers x %llu blocks x %llu page bytes, "
                         "manifest %llu x %llu x %llu", G->name, info.layers,
                         (unsigned long long)info.blocks_per_chunk, (unsigned long long)info.page_bytes,
                         (unsigned long long)G->layers, (unsigned long long)G->blocks_per_chunk,
                         (unsigned long long)G->page_bytes);
            if (why[0]) {
                bad_file(c, bad, path, why);
                continue;
            }
            if (G) {
                if (!G->known && !G->name[0]) snprintf(G->name, sizeof G->name, "%s", info.group_name);
                G->chunks++;
                G->bytes += info.file_bytes;
            }
            files++;
            bytes += info.file_bytes;
        }
        closedir(d);
    }

    if (c->json) {
        json_t *o = json_object();
        json_object_set_new(o, "dir", json_string(ns));
        json_object_set_new(o, "fingerprint", json_string(fp_hex));
        json_object_set_new(o, "model", json_string(model));
        if (layout_hash) {
            char lh[17];
            snprintf(lh, sizeof lh, "%016llx", (unsigned long long)layout_hash);
            json_object_set_new(o, "layout_hash", json_string(lh));
        }
        json_object_set_new(o, "format_version", json_integer(version));
        json_t *ga = json_array();
        for (int i = 0; i < KVO_MAX_GROUPS; i++) {
            if (!groups[i].known && !groups[i].chunks) continue;
            json_t *g = json_object();
            json_object_set_new(g, "group", json_integer(i));
            json_object_set_new(g, "name", json_string(groups[i].name));
            json_object_set_new(g, "chunks", json_integer((json_int_t)groups[i].chunks));
            json_object_set_new(g, "bytes", json_integer((json_int_t)groups[i].bytes));
            json_array_append_new(ga, g);
        }
        json_object_set_new(o, "groups", ga);
        json_object_set_new(o, "files", json_integer((json_int_t)files));
        json_object_set_new(o, "bytes", json_integer((json_int_t)bytes));
        json_object_set_new(o, "temporary_in_progress", json_integer((json_int_t)tmp_live));
        json_object_set_new(o, "temporary_stale", json_integer((json_int_t)tmp_stale));
        json_object_set_new(o, "unknown_files", json_integer((json_int_t)unknown));
        json_object_set_new(o, "bad", bad);
        json_array_append_new(c->out, o);
    } else {
        printf("  %-6s %-16s %10s %16s\n", "group", "name", "chunks", "bytes");
        for (int i = 0; i < KVO_MAX_GROUPS; i++) {
            if (!groups[i].known && !groups[i].chunks) continue;
            printf("  %-6d %-16s %10llu %16llu\n", i, groups[i].name, (unsigned long long)groups[i].chunks,
                   (unsigned long long)groups[i].bytes);
        }
        printf("  files %llu (%llu bytes), bad %zu, temporary %llu in progress + %llu stale, unknown %llu\n",
               (unsigned long long)files, (unsigned long long)bytes, (size_t)c->ns_bad,
               (unsigned long long)tmp_live, (unsigned long long)tmp_stale, (unsigned long long)unknown);
        json_decref(bad);
    }
    return 0;
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
        char *s = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("%zu namespace%s, %llu problem%s%s\n", n_ns, n_ns == 1 ? "" : "s", (unsigned long long)c.problems,
               c.problems == 1 ? "" : "s", c.repair && c.problems ? " (bad files removed)" : "");
    }
    return c.problems ? KVO_EXIT_FAIL : KVO_EXIT_OK;
}
