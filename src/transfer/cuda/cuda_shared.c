/*
 * Only in libkvoffload_cuda.so: how the CUDA device joins libkvoffload.so.
 *
 * The CUDA files call a handful of the core's internal functions (errors,
 * the allocator, the struct_size check, the log, a job's device token).  In a static build those are the
 * core's own; libkvoffload.so hides them, so this file defines them here
 * (hidden too) as calls through the table the core fills in
 * kvo_xfer_device_attach (src/transfer/device.h).  The attach
 * (kvo__cuda_core_attach) runs from an ELF constructor in device_cuda.c when
 * the library is loaded (linked by a program, or
 * dlopen'ed by Python after libkvoffload.so, which the loader then finds by
 * its SONAME): from then on transfer engines find the device "cuda" by name
 * and every error lands in the core's kvo_last_error().
 *
 * Before the attach (never, in practice: libkvoffload.so is initialised
 * first) and when it is refused (a libkvoffload of another ABI), the
 * functions fall back to libc, and kvo_cuda_create and
 * kvo_cuda_device_count fail with the core's reason (kvo__cuda_attached).
 */
#include <stdio.h>
#include <stdlib.h>

#include "transfer/cuda/cuda_internal.h"
#include "transfer/device.h"

/* The fallbacks (libc, and errors that only return their code) until the
 * attach succeeds. */
static int kvo__own_verror(int err, const char *fmt, va_list ap) {
    (void)fmt;
    (void)ap;
    return err;
}
static int kvo__own_error_prefix(int err, const char *fmt, ...) {
    (void)fmt;
    return err;
}
static int kvo__own_check(const char *fn, const char *type, size_t given, size_t min, const char *init) {
    (void)fn;
    (void)type;
    (void)init;
    return given >= min ? 0 : KVO_EINVAL;
}

static void kvo__own_vlog(kvo_log_level level, const char *fmt, va_list ap) {
    (void)level;
    (void)fmt;
    (void)ap;
}
static int kvo__own_job_token(kvo_transfer *t, uint64_t job_id, void (*grab)(void *token, void *arg), void *arg) {
    (void)t;
    (void)job_id;
    (void)grab;
    (void)arg;
    return KVO_ESTATE;
}

static kvo__core_fns kvo__core = {kvo__own_verror, kvo__own_error_prefix, malloc,        calloc,
                                  realloc,         free,                  kvo__own_check, kvo__own_vlog,
                                  kvo__own_job_token};
static int kvo__attach_rc = KVO_ESTATE;
static const kvo__xfer_device_ops *kvo__attach_ops;

static int kvo__cuda_attach_now(void) {
    kvo__core_fns fns;
    int rc = kvo_xfer_device_attach(KVO__XFER_DEVICE_ABI, kvo__attach_ops, sizeof *kvo__attach_ops, &fns,
                                    sizeof fns);
    if (rc == 0) kvo__core = fns;
    return rc;
}

void kvo__cuda_core_attach(const kvo__xfer_device_ops *ops) {
    kvo__attach_ops = ops;
    __atomic_store_n(&kvo__attach_rc, kvo__cuda_attach_now(), __ATOMIC_RELEASE);
}

int kvo__cuda_attached(const char *fn) {
    if (__atomic_load_n(&kvo__attach_rc, __ATOMIC_ACQUIRE) == 0) return 0;
    if (!kvo__attach_ops) return KVO_ESTATE; /* not loaded through its constructor: cannot happen */
    /* Again, on this thread: the core then sets kvo_last_error() to why it
     * refuses (or it accepts now, and the library works). */
    int rc = kvo__cuda_attach_now();
    if (rc == 0) {
        __atomic_store_n(&kvo__attach_rc, 0, __ATOMIC_RELEASE);
        return 0;
    }
    return kvo__error_prefix(rc, "%s: libkvoffload_cuda cannot use this libkvoffload", fn);
}

int kvo__verror(int err, const char *fmt, va_list ap) { return kvo__core.verror(err, fmt, ap); }

int kvo__error(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvo__core.verror(err, fmt, ap);
    va_end(ap);
    return err;
}

int kvo__error_prefix(int err, const char *fmt, ...) {
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return kvo__core.error_prefix(err, "%s", prefix);
}

void *kvo__malloc(size_t n) { return kvo__core.malloc(n); }
void *kvo__calloc(size_t n, size_t size) { return kvo__core.calloc(n, size); }
void *kvo__realloc(void *p, size_t n) { return kvo__core.realloc(p, n); }
void kvo__free(void *p) { kvo__core.free(p); }

int kvo__check_struct_size(const char *fn, const char *type, size_t given, size_t min, const char *init) {
    return kvo__core.check_struct_size(fn, type, given, min, init);
}

void kvo__vlog(kvo_log_level level, const char *fmt, va_list ap) { kvo__core.vlog(level, fmt, ap); }

void kvo__log(kvo_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvo__core.vlog(level, fmt, ap);
    va_end(ap);
}

int kvo__transfer_job_token(kvo_transfer *t, uint64_t job_id, void (*grab)(void *token, void *arg), void *arg) {
    return kvo__core.job_token(t, job_id, grab, arg);
}
