/* _hot.c: the vLLM manager's hot calls, compiled (the module kvoffload._hot).
 *
 * Why.  Through vLLM's one-key-at-a-time interface the manager's cost was the
 * binding, not the store (docs/benchmarks.md, "Python: the vLLM manager"):
 * per key a slice, a dict lookup and a bytes concatenation to build the
 * 24-byte kvo_chunk_key, ctypes converting every argument of every call, a
 * Python loop per key over the store's answers (names of stored and evicted
 * keys) and numpy round trips for the slot offsets.  Here an OffloadKey's
 * bytes are packed straight into a C buffer, the store is called through a
 * function pointer, and the answers are turned into what vLLM gets back in
 * the same C call: no Python bytecode per key.
 *
 * What it holds.  One type, Hot, made once per manager (kvoffload/vllm/
 * manager.py) with
 *  - the offloaded groups: vLLM's group id (an OffloadKey's big-endian 4-byte
 *    suffix) -> kvoffload's group index (the manager's group_ids order);
 *  - the addresses of the kvo_store_* functions it calls and kvo_last_error,
 *    taken from the library that kvoffload._lib loaded (KVO_LIBRARY, next to
 *    the package, the system loader): this module links against nothing and
 *    the library is found exactly as before.  It is compiled against
 *    include/kvoffload (python/CMakeLists.txt): the key and slot records and
 *    the functions' types are the headers', and KVO_VERSION says which;
 *  - the objects it returns and raises: vLLM's LookupResult MISS, HIT and
 *    HIT_PENDING, kvoffload's KvoError and the codes it tells apart.
 * The store handle is an argument of every call, an int or None (the manager
 * swaps stores in reset_cache; a closed store's None becomes NULL, which the
 * store refuses with KVO_EINVAL as the ctypes call did).  This is the only
 * binding of the manager's store calls (lookup, prefix_hits, prepare_load,
 * touch, complete_load, prepare_store, complete_store): it makes them nowhere
 * else.  Without this module kvoffload.vllm does not import (the error says
 * how to build it); the rest of the package (ctypes, numpy batches) needs it not.
 *
 * Key packing (the manager's rule since the first version): kvo_chunk_key =
 * the first 16 bytes of the hash (the OffloadKey less its 4-byte group
 * suffix, zero-padded when shorter), the group index as uint32 little endian,
 * 4 zero bytes.  A key that is not bytes raises TypeError; a key whose group
 * is not offloaded raises KvoError(KVO_EINVAL) naming the group, before the
 * store sees the batch; a store error raises KvoError with its code and
 * kvo_last_error()'s text, naming the C function.
 *
 * Names.  The store reports evictions as records; the manager's dict names
 * {record bytes: OffloadKey} gives vLLM its own keys back.  prepare_store
 * fills it for the keys to store and pops the evicted ones (forget, for the
 * manager's other prepare_store callers).
 *
 * Threads.  Nothing in a Hot changes after it is made and buffers are per
 * call (on the stack up to STACK_KEYS keys, else PyMem_Malloc'ed), so
 * concurrent calls are as safe as the store's own rules make them.  The GIL
 * is held across the store call for batches up to STACK_KEYS keys (the call
 * is shorter than handing the GIL over) and released around larger ones;
 * the names dict is only touched with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvoffload/kvo_store.h"

/* The records and the functions are the headers' (python/CMakeLists.txt
 * compiles this file against include/kvoffload): a changed key, slot or
 * prototype fails this build, not a call at run time. */
enum { REC = sizeof(kvo_chunk_key), SLOT = sizeof(kvo_slot) };
#define STACK_KEYS 256  /* batches up to this size use the stack, GIL held */
/* pack_one writes a key as bytes: the hash's 16 bytes, then the group. */
_Static_assert(offsetof(kvo_chunk_key, hash) == 0 && sizeof(kvo_u128) == 16 &&
               offsetof(kvo_chunk_key, group) == 16, "kvo_chunk_key: hash (16 bytes), then group");
_Static_assert(offsetof(kvo_slot, offset) == 0 && sizeof(uint64_t) == 8, "kvo_slot: offset first");

typedef __typeof__(&kvo_store_touch) keys_fn;  /* also kvo_store_complete_load */
_Static_assert(__builtin_types_compatible_p(__typeof__(&kvo_store_complete_load), keys_fn), "complete_load");

/* rc = call, with the GIL released for batches of more than STACK_KEYS keys. */
#define CALL_BATCH(n, rc, call)      \
    do {                             \
        if ((n) > STACK_KEYS) {      \
            Py_BEGIN_ALLOW_THREADS   \
            rc = call;               \
            Py_END_ALLOW_THREADS     \
        } else {                     \
            rc = call;               \
        }                            \
    } while (0)

typedef struct {
    PyObject_HEAD
    Py_ssize_t ngroups;
    uint32_t *vgroup;       /* vLLM group id of entry i ... */
    uint32_t *index;        /* ... and its kvoffload group index */
    __typeof__(&kvo_store_lookup) lookup;
    __typeof__(&kvo_store_prepare_load) prepare_load;
    keys_fn complete_load, touch;
    __typeof__(&kvo_store_prepare_store) prepare_store;
    __typeof__(&kvo_store_complete_store) complete_store;
    __typeof__(&kvo_last_error) last_error;
    PyObject *res[3];       /* by kvo_lookup_state: MISS, HIT (READY), HIT_PENDING */
    PyObject *error;        /* KvoError(code, message, func) */
    int einval, erange, enospc;
} Hot;

/* -- raising ------------------------------------------------------------ */

static PyObject *raise_kvo(const Hot *h, int code, const char *msg, const char *func) {
    PyObject *e = PyObject_CallFunction(h->error, "iss", code, msg, func);
    if (e != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
    return NULL;
}

static PyObject *raise_rc(const Hot *h, int rc, const char *func) {
    const char *m = h->last_error();
    return raise_kvo(h, rc, m != NULL ? m : "", func);
}

/* -- keys ----------------------------------------------------------------- */

/* Pack one OffloadKey into rec[REC]; -1 with an exception set. */
static int pack_one(const Hot *h, PyObject *key, unsigned char *rec) {
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "an OffloadKey must be bytes (a block hash + a 4-byte group id), not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(key);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(key);
    Py_ssize_t glen = len < 4 ? len : 4;
    uint32_t g = 0;
    for (Py_ssize_t i = len - glen; i < len; i++)
        g = g << 8 | p[i];
    Py_ssize_t k = -1;
    if (glen == 4) {
        for (Py_ssize_t i = h->ngroups - 1; i >= 0; i--)
            if (h->vgroup[i] == g) {
                k = i;
                break;
            }
    }
    if (k < 0) {
        char msg[128];
        PyOS_snprintf(msg, sizeof msg, "OffloadKey of group %lu: not an offloaded group", (unsigned long)g);
        raise_kvo(h, h->einval, msg, "manager");
        return -1;
    }
    Py_ssize_t hl = len - 4 < 16 ? len - 4 : 16;
    memcpy(rec, p, (size_t)hl);
    memset(rec + hl, 0, (size_t)(REC - hl));
    uint32_t gi = h->index[k];
    rec[16] = (unsigned char)gi;
    rec[17] = (unsigned char)(gi >> 8);
    rec[18] = (unsigned char)(gi >> 16);
    rec[19] = (unsigned char)(gi >> 24);
    return 0;
}

/* One batch: the keys packed (REC bytes each) followed by `extra` bytes per
 * key for the call's output, on the stack when small. */
typedef struct {
    _Alignas(16) unsigned char stack[STACK_KEYS * (REC + SLOT)];
    unsigned char *buf;  /* stack or heap */
    unsigned char *out;  /* buf + REC * n */
    Py_ssize_t n;
} batch;

static void batch_free(batch *b) {
    if (b->buf != b->stack)
        PyMem_Free(b->buf);
}

/* Pack keys (any iterable of bytes) into b; -1 with an exception set. */
static int batch_pack(const Hot *h, PyObject *keys, batch *b, size_t extra) {
    PyObject *seq = PySequence_Fast(keys, "keys must be an iterable of OffloadKey (bytes)");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    b->n = n;
    b->buf = b->stack;
    if (n > STACK_KEYS) {
        b->buf = PyMem_Malloc((size_t)n * (REC + extra));
        if (b->buf == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
    }
    b->out = b->buf + (size_t)n * REC;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pack_one(h, items[i], b->buf + (size_t)i * REC) < 0) {
            Py_DECREF(seq);
            batch_free(b);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static int handle(PyObject *o, void **s) {
    if (o == Py_None) {
        *s = NULL;
        return 0;
    }
    *s = PyLong_AsVoidPtr(o);
    return *s == NULL && PyErr_Occurred() ? -1 : 0;
}

/* The batch's keys as the store takes them. */
static const kvo_chunk_key *batch_keys(const batch *b) { return (const kvo_chunk_key *)(const void *)b->buf; }

static int nargs_ok(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "Hot.%s takes %zd arguments (%zd given)", name, want, nargs);
    return 0;
}

/* -- methods -------------------------------------------------------------- */

PyDoc_STRVAR(pack_doc, "pack(keys) -> bytes: the keys as packed kvo_chunk_key records (24 bytes each).");

static PyObject *Hot_pack(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_ok(nargs, 1, "pack"))
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "keys must be an iterable of OffloadKey (bytes)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * REC);
    if (out != NULL) {
        unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (pack_one(self, items[i], p + (size_t)i * REC) < 0) {
                Py_CLEAR(out);
                break;
            }
        }
    }
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(lookup_doc,
             "lookup(store, key) -> LookupResult: kvo_store_lookup of one key; HIT for READY, HIT_PENDING\n"
             "for PENDING, MISS otherwise.");

static PyObject *Hot_lookup(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    void *s;
    _Alignas(16) unsigned char rec[REC];
    uint8_t st = 0;
    if (!nargs_ok(nargs, 2, "lookup") || handle(args[0], &s) < 0 || pack_one(self, args[1], rec) < 0)
        return NULL;
    int rc = self->lookup(s, (const kvo_chunk_key *)(const void *)rec, 1, &st);
    if (rc < 0)
        return raise_rc(self, rc, "kvo_store_lookup");
    PyObject *r = self->res[st <= 2 ? st : 0];
    Py_INCREF(r);
    return r;
}

PyDoc_STRVAR(prefix_hits_doc,
             "prefix_hits(store, keys) -> int: kvo_store_lookup of the whole batch (one call); how many\n"
             "leading keys are READY.");

static PyObject *Hot_prefix_hits(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    void *s;
    batch b;
    if (!nargs_ok(nargs, 2, "prefix_hits") || handle(args[0], &s) < 0 || batch_pack(self, args[1], &b, 1) < 0)
        return NULL;
    Py_ssize_t i = 0;
    int rc = 0;
    if (b.n)
        CALL_BATCH(b.n, rc, self->lookup(s, batch_keys(&b), (size_t)b.n, b.out));
    if (rc >= 0)
        while (i < b.n && b.out[i] == 1)
            i++;
    batch_free(&b);
    if (rc < 0)
        return raise_rc(self, rc, "kvo_store_lookup");
    return PyLong_FromSsize_t(i);
}

PyDoc_STRVAR(prepare_load_doc,
             "prepare_load(store, keys) -> (offsets, groups): kvo_store_prepare_load (pins the keys); their\n"
             "slot offsets (uint64 each) and group indices (uint32 each) as bytearrays, in key order.");

static PyObject *Hot_prepare_load(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    void *s;
    batch b;
    if (!nargs_ok(nargs, 2, "prepare_load") || handle(args[0], &s) < 0 || batch_pack(self, args[1], &b, SLOT) < 0)
        return NULL;
    Py_ssize_t n = b.n;
    int rc = 0;
    if (n)
        CALL_BATCH(n, rc, self->prepare_load(s, batch_keys(&b), (size_t)n, (kvo_slot *)(void *)b.out));
    if (rc < 0) {
        batch_free(&b);
        return raise_rc(self, rc, "kvo_store_prepare_load");
    }
    PyObject *offs = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *groups = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *out = NULL;
    if (offs != NULL && groups != NULL) {
        char *o = PyByteArray_AS_STRING(offs), *g = PyByteArray_AS_STRING(groups);
        for (Py_ssize_t i = 0; i < n; i++) {
            memcpy(o + 8 * i, b.out + (size_t)i * SLOT, 8);            /* kvo_slot.offset */
            memcpy(g + 4 * i, b.buf + (size_t)i * REC + 16, 4);        /* kvo_chunk_key.group */
        }
        out = PyTuple_Pack(2, offs, groups);
    }
    Py_XDECREF(offs);
    Py_XDECREF(groups);
    batch_free(&b);
    return out;
}

static PyObject *keys_call(Hot *self, PyObject *const *args, Py_ssize_t nargs, keys_fn fn, const char *name,
                           const char *func) {
    void *s;
    batch b;
    if (!nargs_ok(nargs, 2, name) || handle(args[0], &s) < 0 || batch_pack(self, args[1], &b, 0) < 0)
        return NULL;
    int rc = 0;
    if (b.n)
        CALL_BATCH(b.n, rc, fn(s, batch_keys(&b), (size_t)b.n));
    batch_free(&b);
    if (rc < 0)
        return raise_rc(self, rc, func);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(touch_doc, "touch(store, keys): kvo_store_touch of the batch (one call; none when empty).");

static PyObject *Hot_touch(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    return keys_call(self, args, nargs, self->touch, "touch", "kvo_store_touch");
}

PyDoc_STRVAR(complete_load_doc,
             "complete_load(store, keys): kvo_store_complete_load of the batch (one call; none when empty).");

static PyObject *Hot_complete_load(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    return keys_call(self, args, nargs, self->complete_load, "complete_load", "kvo_store_complete_load");
}

/* -- prepare_store and the OffloadKey names of stored records --------------
 * The store reports evictions as kvo_chunk_key records; the manager keeps
 * names: {record bytes: OffloadKey} for the keys it stored, to give vLLM its
 * own keys back.  These keep that dict without a Python loop per key. */

static int address(PyObject *o, const unsigned char **p) {
    *p = PyLong_AsVoidPtr(o);
    return *p == NULL && PyErr_Occurred() ? -1 : 0;
}

/* Pop m records from names; a new list of the values found, in order. */
static PyObject *forget(PyObject *names, const unsigned char *rec, Py_ssize_t m) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)rec + (size_t)i * REC, REC);
        if (k == NULL)
            goto fail;
        PyObject *v = PyDict_GetItemWithError(names, k);  /* borrowed */
        int bad = v == NULL ? PyErr_Occurred() != NULL : PyList_Append(out, v) < 0 || PyDict_DelItem(names, k) < 0;
        Py_DECREF(k);
        if (bad)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* After kvo_store_prepare_store of the n keys (a list) packed at rec:
 * names[record] = key for each key whose need byte is set.  *to_store: those
 * keys (`keys` itself when all are), *idx: their positions (None when all),
 * *offs / *groups: bytearrays of their slots' offsets (uint64) and group
 * indices (uint32).  New references; -1 with an exception set. */
static int remember(PyObject *names, const unsigned char *rec, PyObject *keys, Py_ssize_t n, const uint8_t *need,
                    const unsigned char *slots, PyObject **to_store, PyObject **idx, PyObject **offs,
                    PyObject **groups) {
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        m += need[i] != 0;
    *to_store = *idx = *offs = *groups = NULL;
    if (m == n) {
        *to_store = keys;
        Py_INCREF(keys);
        *idx = Py_None;
        Py_INCREF(Py_None);
    } else if ((*to_store = PyList_New(m)) == NULL || (*idx = PyList_New(m)) == NULL) {
        goto fail;
    }
    if ((*offs = PyByteArray_FromStringAndSize(NULL, m * 8)) == NULL ||
        (*groups = PyByteArray_FromStringAndSize(NULL, m * 4)) == NULL)
        goto fail;
    char *o = PyByteArray_AS_STRING(*offs), *g = PyByteArray_AS_STRING(*groups);
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        if (!need[i])
            continue;
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *k = PyBytes_FromStringAndSize((const char *)rec + (size_t)i * REC, REC);
        if (k == NULL || PyDict_SetItem(names, k, key) < 0) {
            Py_XDECREF(k);
            goto fail;
        }
        Py_DECREF(k);
        if (m != n) {
            PyObject *pos = PyLong_FromSsize_t(i);
            if (pos == NULL)
                goto fail;
            Py_INCREF(key);
            PyList_SET_ITEM(*to_store, j, key);
            PyList_SET_ITEM(*idx, j, pos);
        }
        memcpy(o + 8 * j, slots + (size_t)i * SLOT, 8);    /* kvo_slot.offset */
        memcpy(g + 4 * j, rec + (size_t)i * REC + 16, 4);  /* kvo_chunk_key.group */
        j++;
    }
    return 0;
fail:
    Py_CLEAR(*to_store);
    Py_CLEAR(*idx);
    Py_CLEAR(*offs);
    Py_CLEAR(*groups);
    return -1;
}

PyDoc_STRVAR(forget_doc,
             "forget(names, records, m) -> list: pop the m kvo_chunk_key records at address `records`\n"
             "from the dict names; the OffloadKeys that were there, in order.");

static PyObject *Hot_forget(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    const unsigned char *rec;
    Py_ssize_t m;
    (void)self;
    if (!nargs_ok(nargs, 3, "forget") || address(args[1], &rec) < 0)
        return NULL;
    if (!PyDict_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "Hot.forget: names must be a dict, not %.100s",
                            Py_TYPE(args[0])->tp_name);
    if ((m = PyLong_AsSsize_t(args[2])) < 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "Hot.forget: m=%zd is negative", m);
    return forget(args[0], rec, m);
}

PyDoc_STRVAR(prepare_store_doc,
             "prepare_store(store, keys, names) -> None | (records, to_store, idx, offsets, groups, evicted,\n"
             "evicted_records, evicted_offsets): kvo_store_prepare_store of the keys (a non-empty list), one\n"
             "call.  None: KVO_ENOSPC (nothing changed).  records: the keys packed (bytes, 24 each);\n"
             "names[record] = key for each key to store; to_store: those keys (`keys` itself when all are),\n"
             "idx: their positions (None when all); offsets / groups: their slot offsets and group indices\n"
             "(bytearrays of uint64 / uint32); evicted: the OffloadKeys of the evicted records found in\n"
             "names (popped from it); evicted_records / evicted_offsets: every evicted record (bytes, 24\n"
             "each) and its old slot offset (bytes of uint64), for a write-back tier.");

static PyObject *Hot_prepare_store(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    void *s;
    if (!nargs_ok(nargs, 3, "prepare_store") || handle(args[0], &s) < 0)
        return NULL;
    PyObject *keys = args[1], *names = args[2];
    if (!PyList_Check(keys) || !PyDict_Check(names))
        return PyErr_Format(PyExc_TypeError, "Hot.prepare_store(store, keys: list, names: dict)");
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n == 0)
        return PyErr_Format(PyExc_ValueError, "Hot.prepare_store: no keys (the store refuses n 0)");
    PyObject *recs = PyBytes_FromStringAndSize(NULL, n * REC);
    if (recs == NULL)
        return NULL;
    unsigned char *r = (unsigned char *)PyBytes_AS_STRING(recs);
    for (Py_ssize_t i = 0; i < n; i++)
        if (pack_one(self, PyList_GET_ITEM(keys, i), r + (size_t)i * REC) < 0) {
            Py_DECREF(recs);
            return NULL;
        }
    /* need (n), slots (n), evicted records and slots (cap, grown on KVO_ERANGE) */
    size_t cap = 2 * (size_t)n, nev = 0;
    unsigned char *mem = NULL;
    int rc;
    for (;;) {
        unsigned char *grown = PyMem_Realloc(mem, (size_t)n * (1 + SLOT) + cap * (REC + SLOT));
        if (grown == NULL) {
            PyMem_Free(mem);
            Py_DECREF(recs);
            return PyErr_NoMemory();
        }
        mem = grown;
        unsigned char *slots = mem, *ev = slots + (size_t)n * SLOT, *evs = ev + cap * REC, *need = evs + cap * SLOT;
        CALL_BATCH(n, rc, self->prepare_store(s, (const kvo_chunk_key *)(const void *)r, (size_t)n, need, (kvo_slot *)(void *)slots,
                                              (kvo_chunk_key *)(void *)ev, (kvo_slot *)(void *)evs, cap, &nev));
        if (rc == self->erange && nev > cap) {
            cap = nev;
            continue;
        }
        break;
    }
    PyObject *out = NULL, *to_store = NULL, *idx = NULL, *offs = NULL, *groups = NULL, *evicted = NULL,
             *ev_recs = NULL, *ev_offs = NULL;
    if (rc == self->enospc) {
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    if (rc < 0) {
        raise_rc(self, rc, "kvo_store_prepare_store");
        goto done;
    }
    if (PyList_GET_SIZE(keys) != n) {  /* another thread changed the list while the GIL was released */
        PyErr_Format(PyExc_RuntimeError, "Hot.prepare_store: the keys list changed during the call (%zd -> %zd keys)",
                     n, PyList_GET_SIZE(keys));
        goto done;
    }
    unsigned char *slots = mem, *ev = slots + (size_t)n * SLOT, *evs = ev + cap * REC, *need = evs + cap * SLOT;
    if ((evicted = forget(names, ev, (Py_ssize_t)nev)) == NULL ||
        (ev_recs = PyBytes_FromStringAndSize((const char *)ev, (Py_ssize_t)(nev * REC))) == NULL ||
        (ev_offs = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(nev * 8))) == NULL)
        goto done;
    for (size_t i = 0; i < nev; i++)
        memcpy(PyBytes_AS_STRING(ev_offs) + 8 * i, evs + i * SLOT, 8);
    if (remember(names, r, keys, n, need, slots, &to_store, &idx, &offs, &groups) < 0)
        goto done;
    out = PyTuple_Pack(8, recs, to_store, idx, offs, groups, evicted, ev_recs, ev_offs);
done:
    PyMem_Free(mem);
    Py_DECREF(recs);
    Py_XDECREF(to_store);
    Py_XDECREF(idx);
    Py_XDECREF(offs);
    Py_XDECREF(groups);
    Py_XDECREF(evicted);
    Py_XDECREF(ev_recs);
    Py_XDECREF(ev_offs);
    return out;
}

PyDoc_STRVAR(complete_store_doc,
             "complete_store(store, records, ok) -> int: kvo_store_complete_store of packed records (bytes,\n"
             "24 each; none: 0 without a call); its return code, not raised (the manager retries\n"
             "KVO_ESTATE with the keys that are PENDING).");

static PyObject *Hot_complete_store(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    void *s;
    if (!nargs_ok(nargs, 3, "complete_store") || handle(args[0], &s) < 0)
        return NULL;
    if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) % REC)
        return PyErr_Format(PyExc_TypeError, "Hot.complete_store: records must be bytes of 24-byte records");
    int ok = PyObject_IsTrue(args[2]);
    if (ok < 0)
        return NULL;
    size_t n = (size_t)PyBytes_GET_SIZE(args[1]) / REC;
    const char *r = PyBytes_AS_STRING(args[1]);
    int rc = 0;
    if (n)
        CALL_BATCH(n, rc, self->complete_store(s, (const kvo_chunk_key *)(const void *)r, n, ok));
    return PyLong_FromLong(rc);
}

/* -- the type ------------------------------------------------------------- */

static void *fn_addr(PyObject *fns, const char *name) {
    PyObject *v = PyMapping_GetItemString(fns, name);
    if (v == NULL)
        return NULL;
    void *p = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    if (p == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "Hot: the address of %s is 0", name);
    return p;
}

static int Hot_init(Hot *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"groups", "functions", "results", "error", "codes", NULL};
    PyObject *groups, *fns, *results, *error;
    int einval, erange, enospc;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO(iii):Hot", kw, &groups, &fns, &results, &error, &einval,
                                     &erange, &enospc))
        return -1;
    if (self->vgroup != NULL) {
        PyErr_SetString(PyExc_TypeError, "Hot is initialised once");
        return -1;
    }
    PyObject *seq = PySequence_Fast(groups, "groups must be a sequence of (vllm_group_id, index) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->vgroup = PyMem_Calloc((size_t)n + 1, sizeof(uint32_t));
    self->index = PyMem_Calloc((size_t)n + 1, sizeof(uint32_t));
    if (self->vgroup == NULL || self->index == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *go, *xo;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OO:groups", &go, &xo)) {
            Py_DECREF(seq);
            return -1;
        }
        unsigned long g = PyLong_AsUnsignedLong(go), x = PyErr_Occurred() ? 0 : PyLong_AsUnsignedLong(xo);
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (g > 0xFFFFFFFFul || x > 0xFFFFFFFFul) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_OverflowError, "groups[%zd]: (%lu, %lu) does not fit uint32", i, g, x);
            return -1;
        }
        self->vgroup[i] = (uint32_t)g;
        self->index[i] = (uint32_t)x;
    }
    self->ngroups = n;
    Py_DECREF(seq);
#define FN(field, name) (self->field = (__typeof__(self->field))fn_addr(fns, name)) == NULL
    if (FN(lookup, "kvo_store_lookup") || FN(prepare_load, "kvo_store_prepare_load") ||
        FN(complete_load, "kvo_store_complete_load") || FN(touch, "kvo_store_touch") ||
        FN(prepare_store, "kvo_store_prepare_store") || FN(complete_store, "kvo_store_complete_store") ||
        FN(last_error, "kvo_last_error"))
        return -1;
#undef FN
    if (!PyArg_ParseTuple(results, "OOO:results (MISS, HIT, HIT_PENDING)", &self->res[0], &self->res[1],
                          &self->res[2]))
        return -1;
    for (int i = 0; i < 3; i++)
        Py_INCREF(self->res[i]);
    Py_INCREF(error);
    self->error = error;
    self->einval = einval;
    self->erange = erange;
    self->enospc = enospc;
    return 0;
}

static void Hot_dealloc(Hot *self) {
    PyMem_Free(self->vgroup);
    PyMem_Free(self->index);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(self->res[i]);
    Py_XDECREF(self->error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Hot_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))Hot_pack, METH_FASTCALL, pack_doc},
    {"lookup", (PyCFunction)(void (*)(void))Hot_lookup, METH_FASTCALL, lookup_doc},
    {"prefix_hits", (PyCFunction)(void (*)(void))Hot_prefix_hits, METH_FASTCALL, prefix_hits_doc},
    {"prepare_load", (PyCFunction)(void (*)(void))Hot_prepare_load, METH_FASTCALL, prepare_load_doc},
    {"touch", (PyCFunction)(void (*)(void))Hot_touch, METH_FASTCALL, touch_doc},
    {"complete_load", (PyCFunction)(void (*)(void))Hot_complete_load, METH_FASTCALL, complete_load_doc},
    {"forget", (PyCFunction)(void (*)(void))Hot_forget, METH_FASTCALL, forget_doc},
    {"prepare_store", (PyCFunction)(void (*)(void))Hot_prepare_store, METH_FASTCALL, prepare_store_doc},
    {"complete_store", (PyCFunction)(void (*)(void))Hot_complete_store, METH_FASTCALL, complete_store_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Hot_doc,
             "Hot(groups, functions, results, error, codes): the vLLM manager's hot calls over one store's\n"
             "C functions.  groups: (vllm_group_id, kvoffload_group_index) pairs (the last of a repeated id\n"
             "wins); functions: a mapping of kvo_store_lookup, kvo_store_prepare_load,\n"
             "kvo_store_complete_load, kvo_store_touch, kvo_store_prepare_store, kvo_store_complete_store\n"
             "and kvo_last_error to "
             "their addresses; results: vLLM's (MISS, HIT, HIT_PENDING); error: the class raised as\n"
             "error(code, message, func); codes: (KVO_EINVAL, KVO_ERANGE, KVO_ENOSPC).");

static PyTypeObject HotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvoffload._hot.Hot",
    .tp_basicsize = sizeof(Hot),
    .tp_dealloc = (destructor)Hot_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = Hot_doc,
    .tp_methods = Hot_methods,
    .tp_init = (initproc)Hot_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef hot_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvoffload._hot",
    .m_doc = "The vLLM manager's hot calls in C (see _hot.c's opening comment).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__hot(void) {
    if (PyType_Ready(&HotType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&hot_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&HotType);
    if (PyModule_AddObject(m, "Hot", (PyObject *)&HotType) < 0) {
        Py_DECREF(&HotType);
        Py_DECREF(m);
        return NULL;
    }
    /* the headers' version (tests compare it with the loaded library's) */
    if (PyModule_AddStringConstant(m, "KVO_VERSION", KVO_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
