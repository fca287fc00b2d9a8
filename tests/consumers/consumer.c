/*
 * A program that uses kvoffload as an outside project would: only the
 * installed (or add_subdirectory'd) public headers and library.  Built three
 * ways by tools/test-consumers.sh (find_package, pkg-config,
 * add_subdirectory).  Prints the library version, builds a plan from a preset
 * and creates a store in it; exits non-zero on any failure, or when the
 * library it runs against is not the version its headers declare.
 */
#include <stdio.h>
#include <string.h>

#include <kvoffload/kvo.h>

static int fail(const char *what, int rc) {
    fprintf(stderr, "consumer: %s: %s (%s)\n", what, kvo_last_error(), kvo_error_name(rc));
    return 1;
}

int main(void) {
    if (strcmp(kvo_version(), KVO_VERSION_STRING) != 0 || kvo_version_number() != KVO_VERSION_NUMBER) {
        fprintf(stderr, "consumer: headers say %s, library says %s\n", KVO_VERSION_STRING, kvo_version());
        return 1;
    }
    kvo_model *m = NULL;
    kvo_plan *p = NULL;
    kvo_store *s = NULL;
    int rc = kvo_model_preset(kvo_model_preset_name(0), &m);
    if (rc) return fail("kvo_model_preset", rc);
    rc = kvo_plan_create(m, NULL, &p);
    if (rc) return fail("kvo_plan_create", rc);
    kvo_store_params sp = kvo_store_default_params();
    sp.plan = p;
    sp.capacity_bytes = 64 * kvo_plan_max_slot_bytes(p);
    rc = kvo_store_create(&sp, &s);
    if (rc) return fail("kvo_store_create", rc);
    printf("kvoffload %s: model %s, %zu groups, store of %llu bytes\n", kvo_version(), kvo_model_name(m),
           kvo_plan_num_groups(p), (unsigned long long)sp.capacity_bytes);
    kvo_store_destroy(s);
    kvo_plan_destroy(p);
    kvo_model_destroy(m);
    /* an error code is never a negated errno value */
    return KVO_EINVAL < -133 ? 0 : 1;
}
