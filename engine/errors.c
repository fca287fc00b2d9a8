/*
 * The reference engine's error text: one thread-local message that every
 * engine file sets through kvo__eng_error (and kvo__eng_lib_error, which
 * prefixes the library's own kvo_last_error()).  A leaf: it calls no other
 * engine file, so the pool (kvcache.c), the model (transformer.c), the
 * scheduler and the offload glue can all report errors without a cycle.
 */
#include "engine_internal.h"

static _Thread_local char kvo__eng_msg[512];

const char *kvo_eng_last_error(void) { return kvo__eng_msg; }

int kvo__eng_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvo__eng_msg, sizeof kvo__eng_msg, fmt, ap);
    va_end(ap);
    return code;
}

int kvo__eng_lib_error(int code, const char *what) {
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s", kvo_last_error());
    return kvo__eng_error(code, "%s: %s (%s)", what, tmp, kvo_error_name(code));
}
