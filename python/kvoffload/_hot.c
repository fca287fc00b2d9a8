/* _hot.c: the vLLM manager's calls into the cascade, compiled (the module
 * kvoffload._hot).
 *
 * Why.  vLLM's OffloadingManager asks one key at a time; through ctypes the
 * manager's cost was the binding, not the library (docs/python.md, "The
 * manager's cost"): per key a key derivation in Python, ctypes converting
 * every argument, a Python loop over the answers.  Here an OffloadKey's bytes
 * are turned into a chunk key and handed to the cascade in the same C call,
 * and the cascade's answers become what vLLM gets back: no Python bytecode
 * per key.
 *
 * What it holds.  One type, Hot, made once per manager (kvoffload/vllm/
 * manager.py) with
 *  - the offloaded groups: vLLM's group id (an OffloadKey's big-endian 4-byte
 *    suffix) -> kvoffload's group index (the manager's group_ids order);
 *  - the namespace (kvoffload.vllm.config.kvo_namespace, the cascade's one
 *    rule): chunk key = kvo_namespace_keys(namespace, the OffloadKey's block
 *    hash, its group index), so engines serving other models, dtypes or
 *    layouts never share a key in any tier;
 *  - the addresses of the kvo_* functions it calls, taken from the library
 *    that kvoffload._lib loaded (KVO_LIBRARY, next to the package, the system
 *    loader): this module links against nothing and the library is found
 *    exactly as the rest of the package finds it.  It is compiled against
 *    include/kvoffload: the records, the codes and the functions' types are
 *    the headers' (a changed prototype or struct fails this build, not a call);
 *  - names, the manager's dict {chunk key record (24 bytes): OffloadKey}: the
 *    keys it stored or is promoting, so that the host tier's events (stored,
 *    evicted, removed: kvo_store_drain_events on the cascade's store) give
 *    vLLM its own keys back;
 *  - the objects it returns and raises: vLLM's LookupResult MISS, HIT,
 *    HIT_PENDING and RETRY, kvoffload's KvoError.
 * The cascade handle is an argument of every call, an int or None (a closed
 * cascade's None becomes NULL, which the cascade refuses with KVO_EINVAL).
 * This is the only binding of the manager's cascade calls: it makes them
 * nowhere else.  Without this module kvoffload.vllm does not import (the
 * error says how to build it); the rest of the package needs it not.
 *
 * A lookup translates the cascade's answer for one key (KVO_CASCADE_PROMOTE:
 * a lower tier's chunk starts its way into a host slot at once): READY ->
 * HIT; PENDING in the host tier (a store or a promotion in flight) ->
 * HIT_PENDING; PENDING in a lower tier (a file write still queued, the
 * cluster's answer still out within the request's budget, no host slot free
 * while slots are lent) -> RETRY; MISS -> MISS.
 *
 * Errors: a key that is not bytes raises TypeError; a key whose group is not
 * offloaded raises KvoError(KVO_EINVAL) naming the group, before the cascade
 * sees the batch; a cascade error raises KvoError with its code and
 * kvo_last_error()'s text, naming the C function.
 *
 * Threads.  Nothing in a Hot changes after it is made but the names dict,
 * which is only touched with the GIL held; buffers are per call (on the stack
 * up to STACK_KEYS keys, else PyMem_Malloc'ed).  The GIL is held across the
 * cascade call for batches up to STACK_KEYS keys (the call is shorter than
 * handing the GIL over) and released around larger ones.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvoffload/kvo_cascade.h"

enum { REC = sizeof(kvo_chunk_key), SLOT = sizeof(kvo_slot) };
#define STACK_KEYS 256 /* batches up to this size use the stack, GIL held */
#define EVENTS 256     /* host tier events drained per call */
#define MEMO_BITS 14   /* the key memo: 2^14 entries (32 bytes each) */

/* rc = call, with the GIL released for batches of more than STACK_KEYS keys. */
#define CALL_BATCH(n, rc, call)    \
    do {                           \
        if ((n) > STACK_KEYS) {    \
            Py_BEGIN_ALLOW_THREADS \
            rc = call;             \
            Py_END_ALLOW_THREADS   \
        } else {                   \
            rc = call;             \
        }                          \
    } while (0)

typedef struct {
    PyObject_HEAD
    Py_ssize_t ngroups;
    uint32_t *vgroup; /* vLLM group id of entry i ... */
    uint32_t *index;  /* ... and its kvoffload group index */
    kvo_u128 ns;
    __typeof__(&kvo_cascade_lookup) lookup;
    __typeof__(&kvo_cascade_prepare_load) prepare_load;
    __typeof__(&kvo_cascade_complete_load) complete_load;
    __typeof__(&kvo_cascade_touch) touch;
    __typeof__(&kvo_cascade_prepare_store) prepare_store;
    __typeof__(&kvo_cascade_complete_store) complete_store;
    __typeof__(&kvo_cascade_store) store_of;
    __typeof__(&kvo_store_drain_events) drain_events;
    __typeof__(&kvo_store_peek) peek;
    __typeof__(&kvo_namespace_keys) ns_keys;
    __typeof__(&kvo_last_error) last_error;
    PyObject *res[4]; /* MISS, HIT, HIT_PENDING, RETRY */
    PyObject *error;  /* KvoError(code, message, func) */
    PyObject *names;  /* {record bytes: OffloadKey} */
    struct memo {     /* direct-mapped by the key object's address */
        PyObject *key; /* a reference held: the same object, the same bytes */
        kvo_chunk_key rec;
    } *memo;
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

/* One OffloadKey as a chunk key; -1 with an exception set.  vLLM hands the
 * same key objects to lookup, prepare_load, touch, complete_load and the
 * stores of a request: a key object seen lately gives its chunk key from
 * the memo (bytes are immutable; the memo holds a reference, so the address
 * is that object's while it is there) instead of hashing it again. */
static int pack_one(const Hot *h, PyObject *key, kvo_chunk_key *out) {
    struct memo *m = NULL;
    if (h->memo != NULL) {
        m = &h->memo[((uintptr_t)key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - MEMO_BITS)];
        if (m->key == key) {
            *out = m->rec;
            return 0;
        }
    }
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "an OffloadKey must be bytes (a block hash + a 4-byte group id), not %.100s",
                     Py_TYPE(key)->tp_name);
        return -1;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(key);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(key);
    Py_ssize_t k = -1;
    uint32_t g = 0;
    if (len >= 4) {
        g = (uint32_t)p[len - 4] << 24 | (uint32_t)p[len - 3] << 16 | (uint32_t)p[len - 2] << 8 | p[len - 1];
        for (Py_ssize_t i = h->ngroups - 1; i >= 0; i--)
            if (h->vgroup[i] == g) {
                k = i;
                break;
            }
    }
    if (k < 0) {
        char msg[128];
        if (len < 4)
            PyOS_snprintf(msg, sizeof msg, "OffloadKey of %zd bytes: no 4-byte group id", len);
        else
            PyOS_snprintf(msg, sizeof msg, "OffloadKey of group %lu: not an offloaded group", (unsigned long)g);
        raise_kvo(h, KVO_EINVAL, msg, "manager");
        return -1;
    }
    /* the block hash (the key less its group suffix) under the namespace */
    int rc = h->ns_keys(h->ns, p, (size_t)(len - 4), (size_t)(len - 4), 1, h->index[k], out);
    if (rc < 0) {
        raise_rc(h, rc, "kvo_namespace_keys");
        return -1;
    }
    if (m != NULL) {
        Py_INCREF(key);
        Py_XSETREF(m->key, key);
        m->rec = *out;
    }
    return 0;
}

/* One batch: the keys packed followed by `extra` bytes per key for the
 * call's output, on the stack when small. */
typedef struct {
    _Alignas(16) unsigned char stack[STACK_KEYS * (REC + SLOT + 1)];
    unsigned char *buf; /* stack or heap */
    unsigned char *out; /* buf + REC * n */
    Py_ssize_t n;
} batch;

static void batch_free(batch *b) {
    if (b->buf != b->stack)
        PyMem_Free(b->buf);
}

static kvo_chunk_key *batch_keys(const batch *b) { return (kvo_chunk_key *)(void *)b->buf; }

/* Pack keys (a sequence of bytes) into b; -1 with an exception set. */
static int batch_pack(const Hot *h, PyObject *seq, batch *b, size_t extra) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    b->n = n;
    b->buf = b->stack;
    if (n > STACK_KEYS) {
        b->buf = PyMem_Malloc((size_t)n * (REC + extra));
        if (b->buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    b->out = b->buf + (size_t)n * REC;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++)
        if (pack_one(h, items[i], batch_keys(b) + i) < 0) {
            batch_free(b);
            return -1;
        }
    return 0;
}

/* The sequence form of keys (a new reference), or NULL. */
static PyObject *key_seq(PyObject *keys) {
    return PySequence_Fast(keys, "keys must be an iterable of OffloadKey (bytes)");
}

static int handle(PyObject *o, kvo_cascade **c) {
    if (o == Py_None) {
        *c = NULL;
        return 0;
    }
    *c = PyLong_AsVoidPtr(o);
    return *c == NULL && PyErr_Occurred() ? -1 : 0;
}

static int wait_arg(PyObject *o, kvo_cascade_wait **w) {
    if (o == Py_None) {
        *w = NULL;
        return 0;
    }
    *w = PyLong_AsVoidPtr(o);
    return *w == NULL && PyErr_Occurred() ? -1 : 0;
}

static int nargs_ok(Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "Hot.%s takes %zd arguments (%zd given)", name, want, nargs);
    return 0;
}

/* The arguments (cascade, ..., flag) of a call taking nargs of them, the
 * flag (a truth value) last; 0, or -1 with an exception set. */
static int cascade_and_flag(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name,
                            kvo_cascade **c, int *flag) {
    if (!nargs_ok(nargs, want, name) || handle(args[0], c) < 0)
        return -1;
    *flag = PyObject_IsTrue(args[want - 1]);
    return *flag < 0 ? -1 : 0;
}

/* names[rec] = key; -1 with an exception set. */
static int name_set(const Hot *h, const kvo_chunk_key *rec, PyObject *key) {
    PyObject *k = PyBytes_FromStringAndSize((const char *)rec, REC);
    if (k == NULL)
        return -1;
    int rc = PyDict_SetItem(h->names, k, key);
    Py_DECREF(k);
    return rc;
}

/* -- the host tier's events --------------------------------------------------
 * Drained from the cascade's store: STORED keys are looked up in names,
 * EVICTED and REMOVED ones popped from it (what is not there is left out).
 * runs: a list of (type, [OffloadKey, ...]) in event order, consecutive
 * events of one type in one run; STORED and REMOVED ones only with want
 * (EVICTED always: prepare_store gives them to vLLM). */

static int run_add(PyObject *runs, long type, PyObject *key) {
    Py_ssize_t n = PyList_GET_SIZE(runs);
    PyObject *last = n ? PyList_GET_ITEM(runs, n - 1) : NULL;
    if (last == NULL || PyLong_AsLong(PyTuple_GET_ITEM(last, 0)) != type) {
        PyObject *keys = PyList_New(0);
        if (keys == NULL)
            return -1;
        last = Py_BuildValue("(lN)", type, keys);
        if (last == NULL || PyList_Append(runs, last) < 0) {
            Py_XDECREF(last);
            return -1;
        }
        Py_DECREF(last);
    }
    return PyList_Append(PyTuple_GET_ITEM(last, 1), key);
}

static int drain_into(const Hot *h, kvo_cascade *c, bool want, PyObject *runs) {
    kvo_store *s = h->store_of(c);
    kvo_store_event ev[EVENTS];
    size_t n;
    do {
        n = s != NULL ? h->drain_events(s, ev, EVENTS, NULL) : 0;
        for (size_t i = 0; i < n; i++) {
            long type = (long)ev[i].type;
            if (type == KVO_EVENT_STORED && !want)
                continue;
            PyObject *k = PyBytes_FromStringAndSize((const char *)&ev[i].key, REC);
            if (k == NULL)
                return -1;
            PyObject *v = PyDict_GetItemWithError(h->names, k); /* borrowed */
            int bad = v == NULL && PyErr_Occurred() != NULL;
            if (v != NULL) {
                Py_INCREF(v);
                if (type != KVO_EVENT_STORED)
                    bad = PyDict_DelItem(h->names, k) < 0;
                if (!bad && (want || type == KVO_EVENT_EVICTED))
                    bad = run_add(runs, type, v) < 0;
                Py_DECREF(v);
            }
            Py_DECREF(k);
            if (bad)
                return -1;
        }
    } while (n == EVENTS);
    return 0;
}

/* -- methods -------------------------------------------------------------- */

PyDoc_STRVAR(pack_doc, "pack(keys) -> bytes: the keys' chunk keys as packed kvo_chunk_key records.");

static PyObject *Hot_pack(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_ok(nargs, 1, "pack"))
        return NULL;
    PyObject *seq = key_seq(args[0]);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * REC);
    if (out != NULL) {
        kvo_chunk_key *p = (kvo_chunk_key *)(void *)PyBytes_AS_STRING(out);
        PyObject **items = PySequence_Fast_ITEMS(seq);
        for (Py_ssize_t i = 0; i < n; i++)
            if (pack_one(self, items[i], p + i) < 0) {
                Py_CLEAR(out);
                break;
            }
    }
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(lookup_doc,
             "lookup(cascade, key, wait) -> LookupResult: kvo_cascade_lookup of one key with\n"
             "KVO_CASCADE_PROMOTE; wait: the address of the request's kvo_cascade_wait or None.  HIT (READY),\n"
             "HIT_PENDING (PENDING in the host tier: a store or a promotion in flight), RETRY (PENDING in a\n"
             "lower tier), MISS.  A key whose promotion it started is added to names.");

static PyObject *Hot_lookup(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    kvo_cascade_wait *w;
    kvo_chunk_key rec;
    uint8_t st = KVO_MISS, tier = KVO_TIER_NONE;
    kvo_cascade_lookup_result r;
    if (!nargs_ok(nargs, 3, "lookup") || handle(args[0], &c) < 0 || wait_arg(args[2], &w) < 0 ||
        pack_one(self, args[1], &rec) < 0)
        return NULL;
    int rc = self->lookup(c, &rec, 1, KVO_CASCADE_PROMOTE, w, 0, &st, &tier, &r);
    if (rc < 0)
        return raise_rc(self, rc, "kvo_cascade_lookup");
    PyObject *out = self->res[0];
    if (st == KVO_READY) {
        out = self->res[1];
    } else if (st == KVO_PENDING) {
        if (r.promoting && name_set(self, &rec, args[1]) < 0)
            return NULL;
        out = r.promoting || tier == KVO_TIER_HOST ? self->res[2] : self->res[3];
    }
    Py_INCREF(out);
    return out;
}

PyDoc_STRVAR(prefix_hits_doc,
             "prefix_hits(cascade, keys, wait) -> int: kvo_cascade_lookup of the whole batch as one chain\n"
             "(KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE, one call): how many leading keys are READY; the\n"
             "lower-tier keys before the first miss start their promotion (added to names).");

static PyObject *Hot_prefix_hits(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    kvo_cascade_wait *w;
    batch b;
    if (!nargs_ok(nargs, 3, "prefix_hits") || handle(args[0], &c) < 0 || wait_arg(args[2], &w) < 0)
        return NULL;
    PyObject *seq = key_seq(args[1]);
    if (seq == NULL)
        return NULL;
    if (batch_pack(self, seq, &b, 2) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    kvo_cascade_lookup_result r;
    memset(&r, 0, sizeof r);
    uint8_t *st = b.out, *tiers = b.out + b.n;
    int rc = 0;
    if (b.n)
        CALL_BATCH(b.n, rc, self->lookup(c, batch_keys(&b), (size_t)b.n, KVO_CASCADE_PREFIX | KVO_CASCADE_PROMOTE,
                                         w, 0, st, tiers, &r));
    PyObject *out = NULL;
    if (rc < 0) {
        raise_rc(self, rc, "kvo_cascade_lookup");
    } else {
        int bad = 0;
        /* the promotions started: PENDING in a lower tier's answer, PENDING in
         * the host store now */
        kvo_store *s = r.promoting ? self->store_of(c) : NULL;
        for (Py_ssize_t i = 0; s != NULL && !bad && i < b.n; i++) {
            kvo_store_entry e;
            if (st[i] == KVO_PENDING && tiers[i] != KVO_TIER_HOST &&
                self->peek(s, batch_keys(&b) + i, &e) == 0 && e.state == KVO_PENDING)
                bad = name_set(self, batch_keys(&b) + i, PySequence_Fast_GET_ITEM(seq, i)) < 0;
        }
        if (!bad)
            out = PyLong_FromSize_t(r.prefix);
    }
    batch_free(&b);
    Py_DECREF(seq);
    return out;
}

PyDoc_STRVAR(prepare_load_doc,
             "prepare_load(cascade, keys) -> (offsets, groups): kvo_cascade_prepare_load (pins the keys);\n"
             "their slot offsets (uint64 each) and group indices (uint32 each) as bytearrays, in key order.");

static PyObject *Hot_prepare_load(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    batch b;
    if (!nargs_ok(nargs, 2, "prepare_load") || handle(args[0], &c) < 0)
        return NULL;
    PyObject *seq = key_seq(args[1]);
    if (seq == NULL)
        return NULL;
    int ok = batch_pack(self, seq, &b, SLOT);
    Py_DECREF(seq);
    if (ok < 0)
        return NULL;
    Py_ssize_t n = b.n;
    kvo_slot *slots = (kvo_slot *)(void *)b.out;
    int rc = 0;
    if (n)
        CALL_BATCH(n, rc, self->prepare_load(c, batch_keys(&b), (size_t)n, slots));
    if (rc < 0) {
        batch_free(&b);
        return raise_rc(self, rc, "kvo_cascade_prepare_load");
    }
    PyObject *offs = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *groups = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *out = NULL;
    if (offs != NULL && groups != NULL) {
        uint64_t *o = (uint64_t *)(void *)PyByteArray_AS_STRING(offs);
        uint32_t *g = (uint32_t *)(void *)PyByteArray_AS_STRING(groups);
        for (Py_ssize_t i = 0; i < n; i++) {
            o[i] = slots[i].offset;
            g[i] = batch_keys(&b)[i].group;
        }
        out = PyTuple_Pack(2, offs, groups);
    }
    Py_XDECREF(offs);
    Py_XDECREF(groups);
    batch_free(&b);
    return out;
}

static PyObject *keys_call(Hot *self, PyObject *const *args, Py_ssize_t nargs,
                           __typeof__(&kvo_cascade_touch) fn, const char *name, const char *func) {
    kvo_cascade *c;
    batch b;
    if (!nargs_ok(nargs, 2, name) || handle(args[0], &c) < 0)
        return NULL;
    PyObject *seq = key_seq(args[1]);
    if (seq == NULL)
        return NULL;
    int ok = batch_pack(self, seq, &b, 0);
    Py_DECREF(seq);
    if (ok < 0)
        return NULL;
    int rc = 0;
    if (b.n)
        CALL_BATCH(b.n, rc, fn(c, batch_keys(&b), (size_t)b.n));
    batch_free(&b);
    if (rc < 0)
        return raise_rc(self, rc, func);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(touch_doc, "touch(cascade, keys): kvo_cascade_touch of the batch (one call; none when empty).");

static PyObject *Hot_touch(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    return keys_call(self, args, nargs, self->touch, "touch", "kvo_cascade_touch");
}

PyDoc_STRVAR(complete_load_doc,
             "complete_load(cascade, keys): kvo_cascade_complete_load of the batch (one call; none when empty).");

static PyObject *Hot_complete_load(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    return keys_call(self, args, nargs, self->complete_load, "complete_load", "kvo_cascade_complete_load");
}

PyDoc_STRVAR(drain_doc,
             "drain(cascade, want) -> runs: the host tier's events since the last drain, as a list of\n"
             "(type, [OffloadKey, ...]) in order (1 stored, 2 evicted, 3 removed; STORED and REMOVED only\n"
             "with want); evicted and removed keys leave names.  Keys names does not hold are left out.");

static PyObject *Hot_drain(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    int want;
    if (cascade_and_flag(args, nargs, 2, "drain", &c, &want) < 0)
        return NULL;
    PyObject *runs = PyList_New(0);
    if (runs != NULL && drain_into(self, c, want, runs) < 0)
        Py_CLEAR(runs);
    return runs;
}

PyDoc_STRVAR(prepare_store_doc,
             "prepare_store(cascade, keys, want) -> (to_store, offsets, groups, refused, runs):\n"
             "kvo_cascade_prepare_store of the keys (a non-empty list), one call, then the events drained\n"
             "(drain(cascade, want): the evictions it made among them).  to_store: the keys to write (HOST\n"
             "or STAGED slots; `keys` itself when all are), the HOST ones added to names; offsets /\n"
             "groups: their slots' arena offsets and group indices (bytearrays of uint64 / uint32);\n"
             "refused: how many keys found no room anywhere.");

static PyObject *Hot_prepare_store(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    int want;
    if (cascade_and_flag(args, nargs, 3, "prepare_store", &c, &want) < 0)
        return NULL;
    PyObject *keys = args[1];
    if (!PyList_Check(keys))
        return PyErr_Format(PyExc_TypeError, "Hot.prepare_store(cascade, keys: list, want)");
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n == 0)
        return PyErr_Format(PyExc_ValueError, "Hot.prepare_store: no keys (the cascade refuses n 0)");
    batch b;
    /* the list stays alive (the caller holds it); its items while packed */
    if (batch_pack(self, keys, &b, 1 + SLOT) < 0)
        return NULL;
    kvo_slot *slots = (kvo_slot *)(void *)b.out;
    uint8_t *need = b.out + (size_t)n * SLOT;
    int rc;
    CALL_BATCH(n, rc, self->prepare_store(c, batch_keys(&b), (size_t)n, 0, need, slots));
    PyObject *to_store = NULL, *offs = NULL, *groups = NULL, *runs = NULL, *out = NULL;
    if (rc < 0) {
        raise_rc(self, rc, "kvo_cascade_prepare_store");
        goto done;
    }
    if (PyList_GET_SIZE(keys) != n) { /* another thread changed the list while the GIL was released */
        PyErr_Format(PyExc_RuntimeError, "Hot.prepare_store: the keys list changed during the call (%zd -> %zd keys)",
                     n, PyList_GET_SIZE(keys));
        goto done;
    }
    Py_ssize_t m = 0, refused = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        m += need[i] == KVO_CASCADE_HOST || need[i] == KVO_CASCADE_STAGED;
        refused += need[i] == KVO_CASCADE_REFUSED;
    }
    if (m == n) {
        to_store = keys;
        Py_INCREF(keys);
    } else if ((to_store = PyList_New(m)) == NULL) {
        goto done;
    }
    if ((offs = PyByteArray_FromStringAndSize(NULL, m * 8)) == NULL ||
        (groups = PyByteArray_FromStringAndSize(NULL, m * 4)) == NULL || (runs = PyList_New(0)) == NULL)
        goto done;
    uint64_t *o = (uint64_t *)(void *)PyByteArray_AS_STRING(offs);
    uint32_t *g = (uint32_t *)(void *)PyByteArray_AS_STRING(groups);
    for (Py_ssize_t i = 0, j = 0; i < n; i++) {
        if (need[i] != KVO_CASCADE_HOST && need[i] != KVO_CASCADE_STAGED)
            continue;
        PyObject *key = PyList_GET_ITEM(keys, i);
        /* a staged chunk never enters the host tier: no event will name it */
        if (need[i] == KVO_CASCADE_HOST && name_set(self, batch_keys(&b) + i, key) < 0)
            goto done;
        if (m != n) {
            Py_INCREF(key);
            PyList_SET_ITEM(to_store, j, key);
        }
        o[j] = slots[i].offset;
        g[j] = batch_keys(&b)[i].group;
        j++;
    }
    if (drain_into(self, c, want, runs) < 0)
        goto done;
    out = Py_BuildValue("(OOOnO)", to_store, offs, groups, refused, runs);
done:
    batch_free(&b);
    Py_XDECREF(to_store);
    Py_XDECREF(offs);
    Py_XDECREF(groups);
    Py_XDECREF(runs);
    return out;
}

PyDoc_STRVAR(complete_store_doc,
             "complete_store(cascade, keys, ok): kvo_cascade_complete_store of the batch (one call; none when\n"
             "empty).  Keys neither being stored nor held (vLLM may complete keys it did not get to store)\n"
             "are left out: on KVO_ESTATE the keys are completed one by one.  With ok false the keys leave\n"
             "names first (their removal is no event of a stored chunk).");

static PyObject *Hot_complete_store(Hot *self, PyObject *const *args, Py_ssize_t nargs) {
    kvo_cascade *c;
    batch b;
    int ok;
    if (cascade_and_flag(args, nargs, 3, "complete_store", &c, &ok) < 0)
        return NULL;
    PyObject *seq = key_seq(args[1]);
    if (seq == NULL)
        return NULL;
    int packed = batch_pack(self, seq, &b, 0);
    Py_DECREF(seq);
    if (packed < 0)
        return NULL;
    kvo_chunk_key *k = batch_keys(&b);
    for (Py_ssize_t i = 0; !ok && i < b.n; i++) {
        PyObject *r = PyBytes_FromStringAndSize((const char *)(k + i), REC);
        int bad = r == NULL;
        if (!bad && PyDict_DelItem(self->names, r) < 0) { /* absent: fine */
            bad = !PyErr_ExceptionMatches(PyExc_KeyError);
            if (!bad)
                PyErr_Clear();
        }
        Py_XDECREF(r);
        if (bad) {
            batch_free(&b);
            return NULL;
        }
    }
    int rc = 0;
    if (b.n)
        CALL_BATCH(b.n, rc, self->complete_store(c, k, (size_t)b.n, ok));
    for (Py_ssize_t i = 0; rc == KVO_ESTATE && i < b.n; i++) { /* rare: one by one */
        int r = self->complete_store(c, k + i, 1, ok);
        if (r < 0 && r != KVO_ESTATE) {
            rc = r;
            break;
        }
        if (i == b.n - 1)
            rc = 0;
    }
    batch_free(&b);
    if (rc < 0)
        return raise_rc(self, rc, "kvo_cascade_complete_store");
    Py_RETURN_NONE;
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

#define FN(field, name) ((self->field = (__typeof__(self->field))fn_addr(fns, name)) == NULL)

static int Hot_init(Hot *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"groups", "namespace", "functions", "results", "error", "names", NULL};
    PyObject *groups, *ns, *fns, *results, *error, *names;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOO!:Hot", kw, &groups, &ns, &fns, &results, &error,
                                     &PyDict_Type, &names))
        return -1;
    if (self->vgroup != NULL) {
        PyErr_SetString(PyExc_TypeError, "Hot is initialised once");
        return -1;
    }
    /* the namespace: (lo, hi), two ints below 2**64 */
    PyObject *lo, *hi;
    if (!PyArg_ParseTuple(ns, "OO:namespace (lo, hi)", &lo, &hi))
        return -1;
    self->ns.lo = PyLong_AsUnsignedLongLong(lo);
    if (PyErr_Occurred())
        return -1;
    self->ns.hi = PyLong_AsUnsignedLongLong(hi);
    if (PyErr_Occurred())
        return -1;
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
    if (FN(lookup, "kvo_cascade_lookup") || FN(prepare_load, "kvo_cascade_prepare_load") ||
        FN(complete_load, "kvo_cascade_complete_load") || FN(touch, "kvo_cascade_touch") ||
        FN(prepare_store, "kvo_cascade_prepare_store") || FN(complete_store, "kvo_cascade_complete_store") ||
        FN(store_of, "kvo_cascade_store") || FN(drain_events, "kvo_store_drain_events") ||
        FN(peek, "kvo_store_peek") || FN(ns_keys, "kvo_namespace_keys") || FN(last_error, "kvo_last_error"))
        return -1;
    if (!PyArg_ParseTuple(results, "OOOO:results (MISS, HIT, HIT_PENDING, RETRY)", &self->res[0], &self->res[1],
                          &self->res[2], &self->res[3]))
        return -1;
    for (int i = 0; i < 4; i++)
        Py_INCREF(self->res[i]);
    Py_INCREF(error);
    self->error = error;
    Py_INCREF(names);
    self->names = names;
    if ((self->memo = PyMem_Calloc((size_t)1 << MEMO_BITS, sizeof *self->memo)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Hot_dealloc(Hot *self) {
    for (size_t i = 0; self->memo != NULL && i < (size_t)1 << MEMO_BITS; i++)
        Py_XDECREF(self->memo[i].key);
    PyMem_Free(self->memo);
    PyMem_Free(self->vgroup);
    PyMem_Free(self->index);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(self->res[i]);
    Py_XDECREF(self->error);
    Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Hot_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))Hot_pack, METH_FASTCALL, pack_doc},
    {"lookup", (PyCFunction)(void (*)(void))Hot_lookup, METH_FASTCALL, lookup_doc},
    {"prefix_hits", (PyCFunction)(void (*)(void))Hot_prefix_hits, METH_FASTCALL, prefix_hits_doc},
    {"prepare_load", (PyCFunction)(void (*)(void))Hot_prepare_load, METH_FASTCALL, prepare_load_doc},
    {"touch", (PyCFunction)(void (*)(void))Hot_touch, METH_FASTCALL, touch_doc},
    {"complete_load", (PyCFunction)(void (*)(void))Hot_complete_load, METH_FASTCALL, complete_load_doc},
    {"drain", (PyCFunction)(void (*)(void))Hot_drain, METH_FASTCALL, drain_doc},
    {"prepare_store", (PyCFunction)(void (*)(void))Hot_prepare_store, METH_FASTCALL, prepare_store_doc},
    {"complete_store", (PyCFunction)(void (*)(void))Hot_complete_store, METH_FASTCALL, complete_store_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Hot_doc,
             "Hot(groups, namespace, functions, results, error, names): the vLLM manager's calls into one\n"
             "cascade.  groups: (vllm_group_id, kvoffload_group_index) pairs (the last of a repeated id wins);\n"
             "namespace: the chunk keys' 128-bit namespace as (lo, hi); functions: a mapping of\n"
             "kvo_cascade_lookup, kvo_cascade_prepare_load, kvo_cascade_complete_load, kvo_cascade_touch,\n"
             "kvo_cascade_prepare_store, kvo_cascade_complete_store, kvo_cascade_store,\n"
             "kvo_store_drain_events, kvo_store_peek, kvo_namespace_keys and kvo_last_error to their\n"
             "addresses; results: vLLM's (MISS, HIT, HIT_PENDING, RETRY); error: the class raised as\n"
             "error(code, message, func); names: the dict {chunk key record: OffloadKey} it keeps.");

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
    .m_doc = "The vLLM manager's calls into the cascade, in C (see _hot.c's opening comment).",
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
    /* the headers it was compiled against: kvoffload checks them against the
     * library it loaded */
    if (PyModule_AddStringConstant(m, "KVO_VERSION", KVO_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
