/*
 * Read a small text file (a model, a configuration) whole into memory.
 *
 * One place for the open / directory check / grow-and-read loop / size cap
 * that every loader of a JSON file needs, so that each reports the same
 * errors: the path, the errno text, and what the file was expected to be.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "core/internal.h"

int kvo__read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *out_len) {
    FILE *f = fopen(path, "rb");
    if (!f) return kvo__error(KVO_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return kvo__error(KVO_EIO, "%s: is a directory, expected %s", path, what);
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap && len >= max_bytes) {
            rc = kvo__error(KVO_ERANGE, "%s: larger than %zu bytes; expected %s", path, max_bytes, what);
            break;
        }
        if (len == cap && kvo__grow((void **)&buf, &cap, len + 1, 1, 1 << 16, "file buffer")) {
            rc = kvo__error_prefix(KVO_ENOMEM, "%s", path);
            break;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    if (!rc && ferror(f)) rc = kvo__error(KVO_EIO, "%s: read error", path);
    fclose(f);
    if (rc) {
        kvo__free(buf);
        return rc;
    }
    *out = buf;
    *out_len = len;
    return 0;
}
