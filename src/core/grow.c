/*
 * Array growth: the one place that doubles a heap array's capacity.
 *
 * Every growable array in the library (connector scratch, store scratch and
 * victim lists, the file tier's startup scan) is a pointer plus a capacity in
 * elements.  kvo__grow() doubles the capacity (starting from `initial`) until
 * it holds `need` elements; kvo__grow_all() does the same for several arrays
 * that share one capacity.
 *
 * Invariants: a failed grow leaves every array valid and *cap unchanged (an
 * array already reallocated is merely larger than *cap says); cap * elem never
 * overflows size_t (checked before each multiplication).  Errors are
 * KVO_ENOMEM with a message naming `what` and the count.
 */
#include "core/internal.h"

static size_t kvo__grow_cap(size_t cap, size_t need, size_t elem, size_t initial) {
    size_t ncap = cap ? cap : (initial ? initial : 16);
    if (elem == 0) elem = 1;
    while (ncap < need && ncap <= SIZE_MAX / 2 / elem) ncap *= 2;
    return ncap;
}

int kvo__grow(void **p, size_t *cap, size_t need, size_t elem, size_t initial, const char *what) {
    if (need <= *cap) return 0;
    size_t ncap = kvo__grow_cap(*cap, need, elem, initial);
    if (ncap < need || ncap > SIZE_MAX / (elem ? elem : 1))
        return kvo__error(KVO_ENOMEM, "%s: out of memory (%zu entries of %zu bytes)", what, need, elem);
    void *np = kvo__realloc(*p, ncap * elem);
    if (!np) return kvo__error(KVO_ENOMEM, "%s: out of memory (%zu x %zu bytes)", what, ncap, elem);
    *p = np;
    *cap = ncap;
    return 0;
}

int kvo__grow_all(size_t *cap, size_t need, const kvo__arr *a, size_t n, size_t initial, const char *what) {
    if (need <= *cap) return 0;
    size_t elem = 1;
    for (size_t i = 0; i < n; i++)
        if (a[i].elem > elem) elem = a[i].elem;
    size_t ncap = kvo__grow_cap(*cap, need, elem, initial);
    if (ncap < need || ncap > SIZE_MAX / elem)
        return kvo__error(KVO_ENOMEM, "%s: out of memory for %zu entries", what, need);
    for (size_t i = 0; i < n; i++) {
        void *np = kvo__realloc(*a[i].p, ncap * a[i].elem);
        if (!np) return kvo__error(KVO_ENOMEM, "%s: out of memory for %zu entries", what, ncap);
        *a[i].p = np;
    }
    *cap = ncap;
    return 0;
}
