/*
 * A program using the installed CUDA transfer device (libkvoffload_cuda.so)
 * as an outside project would: built by tools/test-consumers.sh through
 * find_package(kvoffload COMPONENTS cuda) and pkg-config kvoffload-cuda.
 *
 * Without a GPU (the CI machines), kvo_cuda_device_count and kvo_cuda_create
 * must fail with KVO_ENOTSUP and a message that names CUDA, and a transfer
 * engine with device "cuda" must fail the same way -- which also shows that
 * the device is known to libkvoffload.so (it would otherwise say "not built
 * in").  With a GPU it creates and destroys a context and such an engine.
 * Exits non-zero when anything else happens.
 */
#include <stdio.h>
#include <string.h>

#include <kvoffload/kvo.h>
#include <kvoffload/kvo_cuda.h>

static int bad(const char *what, int rc) {
    fprintf(stderr, "cuda_consumer: %s: rc %d (%s): %s\n", what, rc, kvo_error_name(rc), kvo_last_error());
    return 1;
}

int main(void) {
    int n = -1;
    int rc = kvo_cuda_device_count(&n);
    bool gpu = rc == 0 && n > 0;
    if (!gpu && (rc != KVO_ENOTSUP || n != 0 || !strstr(kvo_last_error(), "CUDA")))
        return bad("kvo_cuda_device_count without a device", rc);

    kvo_cuda_params cp = kvo_cuda_default_params();
    kvo_cuda *cu = NULL;
    rc = kvo_cuda_create(&cp, &cu);
    if (gpu ? rc != 0 : rc != KVO_ENOTSUP || cu != NULL || !strstr(kvo_last_error(), "CUDA"))
        return bad("kvo_cuda_create", rc);
    if (!gpu) printf("cuda_consumer: no GPU: kvo_cuda_create -> %s: %s\n", kvo_error_name(rc), kvo_last_error());

    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    if ((rc = kvo_model_preset(kvo_model_preset_name(0), &m)) != 0) return bad("kvo_model_preset", rc);
    if ((rc = kvo_plan_create(m, NULL, &p)) != 0) return bad("kvo_plan_create", rc);
    kvo_transfer_params tp = kvo_transfer_default_params();
    tp.plan = p;
    tp.device = "cuda";
    kvo_transfer *t = NULL;
    rc = kvo_transfer_create(&tp, &t);
    if (gpu ? rc != 0 : rc != KVO_ENOTSUP || strstr(kvo_last_error(), "not built in"))
        return bad("kvo_transfer_create(device \"cuda\")", rc);
    if (!gpu) printf("cuda_consumer: no GPU: transfer device 'cuda' -> %s: %s\n", kvo_error_name(rc), kvo_last_error());
    else printf("cuda_consumer: %d CUDA device(s); context and transfer engine on device 0 created\n", n);
    kvo_transfer_destroy(t);
    kvo_cuda_destroy(cu);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    return 0;
}
