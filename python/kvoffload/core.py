"""Python classes over the kvoffload C objects: Model, Plan, Store, Arena,
FileTier, RemoteTier, Transfer, Connector, CudaDevice.

Conventions
 - Every object owns one C handle and frees it in close() (also called by
   __del__ and by the context manager); objects a handle depends on (the plan
   of a store) are kept referenced so they outlive it.
 - Keys travel in batches as numpy arrays of KEY_DTYPE (the C kvo_chunk_key
   layout: hash lo, hash hi, group, tenant): one C call per batch, never
   one per key.  make_keys() builds them from 16-byte hashes or integers.
 - Failures raise KvoError with the KVO_E* code and kvo_last_error()'s text.
 - Thread rules are the C library's: a Store, Transfer or FileTier may be
   called from several threads (ctypes releases the GIL during calls).
   close() is safe from any thread: it waits for the calls in flight on that
   object in other threads, and later calls raise KvoError(KVO_ECLOSED); an
   Arena's views keep its mapping alive (docs/security.md).
 - Arguments are checked here, before C sees them: ints against the range
   of the C field they fill (OverflowError / ValueError / TypeError naming
   the parameter), address and user-data lists against the keys' length
   (ValueError naming both).
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import json
import logging
import os
import re
import threading
from ctypes import byref, c_bool, c_size_t, c_uint64, c_void_p
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lib as L
from ._lib import KvoError, check, check_int, lib, need, set_fields

KEY_DTYPE = np.dtype([("lo", "<u8"), ("hi", "<u8"), ("group", "<u4"), ("tenant", "<u4")])
SLOT_DTYPE = np.dtype([("offset", "<u8"), ("bytes", "<u8")])
MISS, READY, PENDING = 0, 1, 2
POLICIES = ("lru", "arc", "s3fifo", "prefix")  # "branch": an alias of "prefix" (docs/config.md)
_KINDS = {"full": 0, "sliding": 1, "state": 2}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def make_keys(hashes: Union[Sequence[bytes], Sequence[int], np.ndarray],
              groups: Union[int, Sequence[int]]) -> np.ndarray:
    """Build a KEY_DTYPE array.

    hashes: 16-byte strings (lo then hi, little endian, as kvo_u128), Python
    ints below 2**128, or an (n, 2) uint64 array.  groups: one group id for
    all keys or one per key.
    """
    n = len(hashes)
    out = np.zeros(n, dtype=KEY_DTYPE)
    if isinstance(groups, (list, tuple, np.ndarray)):
        if len(groups) != n:
            raise ValueError(f"make_keys: {len(groups)} groups for {n} hashes (one per hash, or one int for all)")
        gs = [check_int("groups", g, 0, 0xFFFFFFFF) for g in groups]
    else:
        gs = check_int("groups", groups, 0, 0xFFFFFFFF)
    if n == 0:
        return out
    if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
        if hashes.ndim != 2 or hashes.shape[1] != 2:
            raise ValueError(f"make_keys: a uint64 hash array must have shape (n, 2), not {hashes.shape}")
        out["lo"] = hashes[:, 0]
        out["hi"] = hashes[:, 1]
    elif isinstance(hashes[0], (bytes, bytearray)):
        if not all(isinstance(h, (bytes, bytearray)) for h in hashes):
            raise TypeError("make_keys: hashes mix bytes and other types")
        raw = np.frombuffer(b"".join(bytes(h).ljust(16, b"\0")[:16] for h in hashes), dtype="<u8").reshape(n, 2)
        out["lo"] = raw[:, 0]
        out["hi"] = raw[:, 1]
    else:
        ints = [check_int("hashes", h, 0, (1 << 128) - 1) for h in hashes]
        out["lo"] = [h & 0xFFFFFFFFFFFFFFFF for h in ints]
        out["hi"] = [h >> 64 for h in ints]
    out["group"] = gs
    return out


def _as_keys(keys: Any) -> np.ndarray:
    if isinstance(keys, np.ndarray) and keys.dtype == KEY_DTYPE:
        if keys.ndim != 1:
            raise ValueError(f"keys must be a 1-D array of kvoffload.KEY_DTYPE, not of shape {keys.shape} "
                             "(use keys.ravel())")
        return np.ascontiguousarray(keys)
    raise TypeError("keys must be a numpy array of kvoffload.KEY_DTYPE (see make_keys)")


def _uint64s(what: str, name: str, values: Any, n: int) -> np.ndarray:
    """values (addresses or user data) as a contiguous 1-D uint64 array of
    exactly n entries, checked: ValueError naming both lengths when they
    differ (the C side reads n entries), TypeError for what is not an int."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise ValueError(f"{what}: {name} must be one-dimensional (one per key), not of shape {a.shape}")
    if len(a) != n:
        raise ValueError(f"{what}: {len(a)} {name} for {n} keys (one per key)")
    if n == 0:
        return np.zeros(0, dtype="<u8")
    if a.dtype.kind == "u":
        return np.ascontiguousarray(a, dtype="<u8")
    if a.dtype.kind == "i":
        if (a < 0).any():
            raise ValueError(f"{what}: {name} must not be negative")
        return np.ascontiguousarray(a, dtype="<u8")
    if a.dtype == object:  # Python ints beyond int64
        return np.array([check_int(name, v, 0, (1 << 64) - 1) for v in a], dtype="<u8")
    raise TypeError(f"{what}: {name} must be ints, not {a.dtype}")


# ---------------------------------------------------------------- fork() --
# A handle belongs to the process that made it.  After fork() the child has a
# copy of the parent's Python objects but not of its threads (the file tier's
# and the connector's workers) and must not free or unlink what the parent
# still uses (a shared arena's name): in another process a handle's calls
# raise KVO_ESTATE, and close() and the finalizers forget it without calling
# the library (docs/python.md, "fork").  _PID is this process's id, kept
# current in a child by the at-fork hook (no system call per check).
_PID = os.getpid()


def _after_fork_in_child() -> None:
    global _PID
    _PID = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

_U64 = (1 << 64) - 1


def _u64(name: str, value: Any) -> int:
    """An argument passed to C as uint64_t, checked (ctypes would truncate)."""
    return check_int(name, value, 0, _U64)


def _guarded(fn: Any) -> Any:
    """A public method of a handle class, run as a call in flight: close()
    in another thread waits for it; after close() it raises KVO_ECLOSED."""
    @functools.wraps(fn)
    def call(self: "_Handle", *a: Any, **kw: Any) -> Any:
        self._enter(fn.__name__)
        try:
            return fn(self, *a, **kw)
        finally:
            self._leave()
    return call


class _Handle:
    """One owned C handle: close() destroys it with the class's _destroy
    function (also on garbage collection and at the end of a with block).

    Every public method of a subclass is wrapped (_guarded): it counts as a
    call in flight while it runs.  close() marks the object closing, waits
    until no call is in flight in another thread, then destroys the handle:
    the C object is never freed under a running call.  Calls after (or
    during) close() raise KvoError(KVO_ECLOSED); a call already running may
    call further methods of the object (same thread) until it returns."""

    _destroy = ""
    _h: Optional[int] = None
    _dll: Any = lib  # the library holding _destroy (CudaDevice: the CUDA device library)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        for name, fn in list(vars(cls).items()):
            if not name.startswith("_") and name != "close" and inspect.isfunction(fn):
                setattr(cls, name, _guarded(fn))

    def __new__(cls, *a: Any, **kw: Any) -> Any:
        self = super().__new__(cls)
        self._pid = _PID  # the process that owns the C object (fork: see above)
        self._cv = threading.Condition(threading.Lock())
        self._calls: dict[int, int] = {}  # thread id -> depth of its calls in flight
        self._closing = False
        return self

    def _enter(self, what: str) -> None:
        if self._pid != _PID:
            name = f"{type(self).__name__}.{what}"
            raise KvoError(L.KVO_ESTATE, f"{name}: made by process {self._pid}, called in process {_PID} (a fork): "
                           "a handle belongs to the process that made it; make a new one in this process", name)
        me = threading.get_ident()
        with self._cv:
            depth = self._calls.get(me, 0)
            if (self._closing or not self._h) and depth == 0:
                name = f"{type(self).__name__}.{what}"
                raise KvoError(L.KVO_ECLOSED, f"{name}: the object is closed (close() was called)", name)
            self._calls[me] = depth + 1

    def _leave(self) -> None:
        me = threading.get_ident()
        with self._cv:
            depth = self._calls[me] - 1
            if depth:
                self._calls[me] = depth
            else:
                del self._calls[me]
                self._cv.notify_all()

    def _release(self, h: int) -> None:
        """Free the C object (after every call in flight returned)."""
        getattr(self._dll, self._destroy)(h)

    def close(self) -> None:
        cv = self.__dict__.get("_cv")
        if cv is None:  # __new__ never ran: nothing of ours
            return
        if self._pid != _PID:  # another process's (a fork): forget it, never free it (nor take its lock)
            self._h = None
            return
        me = threading.get_ident()
        with cv:
            if me in self._calls:
                raise KvoError(L.KVO_EBUSY, f"{type(self).__name__}.close() from inside one of its own calls",
                               f"{type(self).__name__}.close")
            self._closing = True
            while self._calls:
                cv.wait()
            h, self._h = self._h, None
        if h:
            self._release(h)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing sensible left to do
            pass

    def _batch(self, func: str, keys: np.ndarray) -> None:
        """One C call func(handle, keys, n) on a batch of keys."""
        keys = _as_keys(keys)
        check(getattr(lib, func)(self._h, _ptr(keys), len(keys)), func)


def _segments(segments: Sequence[Mapping[str, int]]) -> Any:
    arr = (L.Segment * len(segments))()
    for i, s in enumerate(segments):
        set_fields(arr[i], names={f: f"segments[{i}].{f}" for f in ("group", "num_blocks", "block_stride",
                                                                     "page_bytes")},
                   group=s["group"], num_blocks=s["num_blocks"], block_stride=s["block_stride"],
                   page_bytes=s["page_bytes"])
        arr[i].base = _u64(f"segments[{i}].base", s["base"])
    return arr


def _cap(cap: int) -> int:
    """A buffer's entry count for a poll or drain (one C call fills it)."""
    return check_int("cap", cap, 1, 1 << 24)


def _stats(t: type) -> Any:
    """A statistics struct with struct_size set (the library refuses 0)."""
    s = t()
    s.struct_size = ctypes.sizeof(t)
    return s


def _queue_io(h: Optional[int], func: str, keys: Any, addrs: Optional[Sequence[int]],
              user_data: Optional[Sequence[int]], with_ud: bool) -> np.ndarray:
    """One C call func(h, keys, [addrs,] n, user_data, results, NULL) of a
    tier's queueing functions (write/read, put/get/exists): the per-key
    results.  addrs None: the call takes no addresses (exists); with_ud
    False: it takes NULL user data (write, put).  Addresses and user data
    are checked against the keys first (_uint64s): C reads n of each."""
    keys = _as_keys(keys)
    n = len(keys)
    args: list[Any] = [h, _ptr(keys)]
    if addrs is not None:
        ptrs = _uint64s(func, "addresses", addrs, n)
        args.append(_ptr(ptrs))
    args.append(n)
    ud = (_uint64s(func, "user_data", user_data, n) if user_data is not None else np.zeros(n, dtype="<u8")) \
        if with_ud else None
    res = np.empty(n, dtype=np.int32)
    check(getattr(lib, func)(*args, _ptr(ud) if ud is not None else None, _ptr(res), None), func)
    return res


def _poll_completions(h: Optional[int], func: str, t: type, cap: int) -> list[dict[str, Any]]:
    """A tier's poll (file or remote completions, the same fields) as dicts."""
    buf = (t * _cap(cap))()
    n = ctypes.c_size_t(0)
    check(getattr(lib, func)(h, buf, cap, byref(n)), func)
    return [{"user_data": c.user_data, "group": c.key.group, "op": c.op, "result": c.result, "bytes": c.bytes,
             "latency_ns": c.latency_ns, "key": (c.key.hash.lo, c.key.hash.hi)} for c in buf[:n.value]]


def _wait(h: Optional[int], func: str, timeout_ms: int) -> int:
    """A tier's wait: 0, KVO_ETIMEDOUT or KVO_ENOTFOUND (nothing in flight)."""
    rc = getattr(lib, func)(h, _ns(timeout_ms))
    if rc not in (0, L.KVO_ETIMEDOUT, L.KVO_ENOTFOUND):
        check(rc, func)
    return rc


def _flush(h: Optional[int], func: str, timeout_ms: int) -> int:
    """A tier's flush: 0, or KVO_ETIMEDOUT with writes still queued (a
    timeout is an answer, not a failure: the caller decides)."""
    rc = getattr(lib, func)(h, _ns(timeout_ms))
    if rc not in (0, L.KVO_ETIMEDOUT):
        check(rc, func)
    return rc


def _ns(timeout_ms: int) -> int:
    """A millisecond timeout as the library's int64_t nanoseconds (< 0: forever)."""
    timeout_ms = check_int("timeout_ms", timeout_ms, -(1 << 63), ((1 << 63) - 1) // 1_000_000)
    return -1 if timeout_ms < 0 else timeout_ms * 1_000_000


def _struct_dict(s: ctypes.Structure) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, _t in s._fields_:
        if name == "struct_size":
            continue
        v = getattr(s, name)
        if isinstance(v, bytes):
            v = v.decode()
        out[name] = v
    return out


# ------------------------------------------------------------------- model --

class Model(_Handle):
    """A model's KV-cache description (kvo_model): name, tokens_per_hash, groups.

    Build one with Model.preset / Model.open (preset name or JSON file),
    Model.from_json, Model.from_hf_config, or Model(name, tokens_per_hash,
    groups=[{...}]) where each group dict has name, kind ("full", "sliding",
    "state"), tokens_per_block, layers, page_bytes and optionally window,
    cacheable, draft.
    """

    _destroy = "kvo_model_destroy"

    def __init__(self, name: str, tokens_per_hash: int, groups: Iterable[Mapping[str, Any]] = (),
                 _handle: Optional[int] = None) -> None:
        if _handle is not None:
            self._h: Optional[int] = _handle
            return
        need("name", name, str)
        tph = check_int("tokens_per_hash", tokens_per_hash, 0, 0xFFFFFFFF)
        h = c_void_p()
        check(lib.kvo_model_create(name.encode(), tph, byref(h)), "kvo_model_create")
        self._h = h.value
        try:
            for g in groups:
                self.add_group(**g)
        except Exception:
            self.close()
            raise

    def add_group(self, name: str, tokens_per_block: int, layers: int, page_bytes: int, kind: str = "full",
                  window: int = 0, cacheable: bool = True, draft: bool = False) -> int:
        """Append a group; returns its id."""
        d = lib.kvo_group_desc_default()
        d.name = need("name", name, str).encode()
        if kind not in _KINDS:
            raise KvoError(L.KVO_EINVAL, f"group '{name}': kind '{kind}' is not one of {sorted(_KINDS)}",
                           "Model.add_group")
        d.kind = _KINDS[kind]
        set_fields(d, tokens_per_block=tokens_per_block, layers=layers, page_bytes=page_bytes, window=window)
        d.cacheable, d.draft = cacheable, draft
        check(lib.kvo_model_add_group(self._h, byref(d)), "kvo_model_add_group")
        return len(self.to_dict()["groups"]) - 1

    @classmethod
    def open(cls, preset_or_path: str) -> "Model":
        """A built-in preset (Model.presets()) or a kvoffload-model/1 JSON file."""
        h = c_void_p()
        check(lib.kvo_model_open(os.fsencode(need("preset_or_path", preset_or_path, str)), byref(h)),
              "kvo_model_open")
        return cls("", 0, _handle=h.value)

    preset = open

    @staticmethod
    def presets() -> list[str]:
        return [lib.kvo_model_preset_name(i).decode() for i in range(lib.kvo_model_preset_count())]

    @classmethod
    def from_json(cls, text: Union[str, Mapping[str, Any]], source: str = "<python>") -> "Model":
        data = (json.dumps(text) if not isinstance(text, str) else text).encode()
        h = c_void_p()
        check(lib.kvo_model_from_json(data, len(data), source.encode(), byref(h)), "kvo_model_from_json")
        return cls("", 0, _handle=h.value)

    @classmethod
    def from_hf_config(cls, config: Union[str, Mapping[str, Any]], name: str, tokens_per_block: int,
                       tokens_per_hash: int) -> "Model":
        data = (json.dumps(config) if not isinstance(config, str) else config).encode()
        h = c_void_p()
        check(lib.kvo_model_from_hf_config(data, len(data), need("name", name, str).encode(),
                                           check_int("tokens_per_block", tokens_per_block, 0, 0xFFFFFFFF),
                                           check_int("tokens_per_hash", tokens_per_hash, 0, 0xFFFFFFFF), byref(h)),
              "kvo_model_from_hf_config")
        return cls("", 0, _handle=h.value)

    def to_dict(self) -> dict[str, Any]:
        out = c_void_p()
        check(lib.kvo_model_to_json(self._h, byref(out)), "kvo_model_to_json")
        return json.loads(L.take_string(out))


class Plan(_Handle):
    """A validated chunk plan (kvo_plan) of a model.

    Give at most one of block_size (legacy: tokens per chunk) and
    blocks_per_chunk; overrides maps group names to blocks_per_chunk; neither:
    the automatic plan (target_chunk_bytes).  plan.groups is a list of dicts
    (kvo_group_plan fields), plan.to_dict() the library's JSON.
    """

    _destroy = "kvo_plan_destroy"

    def __init__(self, model: Model, block_size: int = 0, blocks_per_chunk: int = 0,
                 overrides: Optional[Mapping[str, int]] = None, target_chunk_bytes: Optional[int] = None,
                 dtype: Optional[str] = None, tp_rank: int = 0, tp_size: int = 0) -> None:
        need("model", model, Model)
        p = lib.kvo_plan_default_params()
        set_fields(p, block_size=block_size, blocks_per_chunk=blocks_per_chunk, tp_rank=tp_rank, tp_size=tp_size)
        names = []
        if overrides:
            arr = (L.GroupOverride * len(overrides))()
            for i, (g, b) in enumerate(overrides.items()):
                names.append(g.encode())
                arr[i].group = names[-1]
                set_fields(arr[i], names={"blocks_per_chunk": f"overrides[{g!r}]"}, blocks_per_chunk=b)
            p.overrides, p.n_overrides = arr, len(overrides)
        if target_chunk_bytes is not None:
            set_fields(p, target_chunk_bytes=target_chunk_bytes)
        dt = dtype.encode() if dtype else None
        p.dtype = dt
        h = c_void_p()
        check(lib.kvo_plan_create(model._h, byref(p), byref(h)), "kvo_plan_create")
        self._h: Optional[int] = h.value
        self.groups: list[dict[str, Any]] = []
        for i in range(lib.kvo_plan_num_groups(self._h)):
            gd = _struct_dict(lib.kvo_plan_group(self._h, i).contents)
            gd["kind"] = _KIND_NAMES.get(gd["kind"], "?")
            self.groups.append(gd)
        self._gp = [lib.kvo_plan_group(self._h, i) for i in range(len(self.groups))]
        self.tokens_per_hash: int = lib.kvo_plan_tokens_per_hash(self._h)
        fp = lib.kvo_plan_fingerprint(self._h)
        self.fingerprint: int = fp.lo | (fp.hi << 64)
        self.max_slot_bytes: int = lib.kvo_plan_max_slot_bytes(self._h)

    @property
    def fingerprint_hex(self) -> str:
        return f"{self.fingerprint:032x}"

    def to_dict(self) -> dict[str, Any]:
        out = c_void_p()
        check(lib.kvo_plan_to_json(self._h, byref(out)), "kvo_plan_to_json")
        return json.loads(L.take_string(out))

    def namespace(self, salt: bytes = b"") -> int:
        """kvo_keys_namespace(fingerprint, salt) as an int."""
        fp = L.U128(self.fingerprint & 0xFFFFFFFFFFFFFFFF, self.fingerprint >> 64)
        ns = lib.kvo_keys_namespace(fp, salt or None, len(salt))
        return ns.lo | (ns.hi << 64)

    def hash_tokens(self, tokens: Sequence[int], parent: Optional[int] = None, extra: bytes = b"") -> np.ndarray:
        """Chained unit hashes of tokens ((n, 2) uint64: lo, hi) from parent
        (default: the plan's namespace).  One C call."""
        parent = self.namespace() if parent is None else check_int("parent", parent, 0, (1 << 128) - 1)
        toks = np.ascontiguousarray(tokens, dtype="<u4")
        cap = max(1, len(toks) // self.tokens_per_hash)
        out = np.zeros((cap, 2), dtype="<u8")
        n = c_size_t()
        check(lib.kvo_hash_tokens(L.U128(parent & 0xFFFFFFFFFFFFFFFF, parent >> 64), _ptr(toks), len(toks),
                                  self.tokens_per_hash, extra or None, len(extra), _ptr(out), cap, byref(n)),
              "kvo_hash_tokens")
        return out[: n.value]

    def chunk_keys(self, group: int, units: np.ndarray) -> np.ndarray:
        """Chunk keys of a group for a prefix of unit hashes (from hash_tokens)."""
        group = check_int("group", group, 0, len(self.groups) - 1)
        units = np.ascontiguousarray(units, dtype="<u8")
        hpc = self.groups[group]["hashes_per_chunk"] or 1
        out = np.zeros(max(1, len(units) // hpc), dtype=KEY_DTYPE)
        n = lib.kvo_chunk_keys(self._gp[group], _ptr(units), len(units), _ptr(out), len(out))
        return out[: min(n, len(out))]


def _policy(name: str) -> int:
    v = ctypes.c_int()
    check(lib.kvo_policy_parse(name.encode(), byref(v)), "kvo_policy_parse")
    return v.value


# ------------------------------------------------------------------- store --

def drain_store_events(h: Optional[int], cap: int = 4096) -> list[tuple[str, np.ndarray]]:
    """A store's pending events (kvo_store_drain_events on handle h, until
    none is left) as (type, KEY_DTYPE array) runs: "stored", "evicted",
    "removed"; consecutive events of one type are merged."""
    buf = (L.StoreEvent * _cap(cap))()
    out: list[tuple[str, np.ndarray]] = []
    names = {1: "stored", 2: "evicted", 3: "removed"}
    while True:
        n = lib.kvo_store_drain_events(h, buf, cap, None)
        if n == 0:
            return out
        raw = np.frombuffer(memoryview(buf), dtype=np.dtype([("type", "<u4"), ("pad", "<u4"), ("key", KEY_DTYPE)]),
                            count=n).copy()
        start = 0
        for i in range(1, n + 1):
            if i == n or raw["type"][i] != raw["type"][start]:
                out.append((names.get(int(raw["type"][start]), "?"), raw["key"][start:i].copy()))
                start = i
        if n < cap:
            return out


class Store(_Handle):
    """The index of stored chunks and their slots (kvo_store).  Batched:
    every method takes a KEY_DTYPE array and makes one C call."""

    _destroy = "kvo_store_destroy"

    def __init__(self, plan: Plan, capacity_bytes: int, policy: str = "lru", admit_after: int = 0,
                 max_entries: int = 0, event_capacity: int = 0, segment_bytes: int = 0,
                 policy_admission: bool = False, lookups_per_key: bool = False) -> None:
        """policy: one of POLICIES ("branch" is accepted as an alias of
        "prefix").  policy_admission, lookups_per_key: kvo_store_params'
        fields of the same names, accepted and ignored by every policy
        there is (kept so that code written for the removed branch policy
        keeps running)."""
        need("plan", plan, Plan)
        p = lib.kvo_store_default_params()
        p.plan, p.policy = plan._h, _policy(policy)
        p.policy_admission = bool(policy_admission)
        p.lookups_per_key = bool(lookups_per_key)
        set_fields(p, capacity_bytes=capacity_bytes, admit_after=admit_after, max_entries=max_entries,
                   event_capacity=event_capacity, segment_bytes=segment_bytes)
        h = c_void_p()
        check(lib.kvo_store_create(byref(p), byref(h)), "kvo_store_create")
        self._h: Optional[int] = h.value
        self.plan = plan
        self._nev = c_size_t()

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """uint8 per key: MISS (0), READY (1), PENDING (2)."""
        keys = _as_keys(keys)
        st = np.empty(len(keys), dtype=np.uint8)
        check(lib.kvo_store_lookup(self._h, _ptr(keys), len(keys), _ptr(st)), "kvo_store_lookup")
        return st

    def prepare_store(self, keys: np.ndarray, evicted_cap: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                             np.ndarray]:
        """Reserve slots: (need bool[n], slots SLOT_DTYPE[n], evicted keys,
        evicted slots).  evicted_cap 0: as many as keys (enough for equal
        slot sizes; a KVO_ERANGE retry with the needed count otherwise)."""
        keys = _as_keys(keys)
        n = len(keys)
        need = np.empty(n, dtype=np.uint8)
        slots = np.empty(n, dtype=SLOT_DTYPE)
        cap = evicted_cap or max(n, 1) * 2
        while True:
            ev = np.empty(cap, dtype=KEY_DTYPE)
            evs = np.empty(cap, dtype=SLOT_DTYPE)
            rc = lib.kvo_store_prepare_store(self._h, _ptr(keys), n, _ptr(need), _ptr(slots), _ptr(ev), _ptr(evs),
                                             cap, byref(self._nev))
            if rc == L.KVO_ERANGE and self._nev.value > cap:
                cap = self._nev.value
                continue
            check(rc, "kvo_store_prepare_store")
            m = self._nev.value
            return need.view(np.bool_), slots, ev[:m], evs[:m]

    def complete_store(self, keys: np.ndarray, ok: bool = True) -> None:
        keys = _as_keys(keys)
        check(lib.kvo_store_complete_store(self._h, _ptr(keys), len(keys), ok), "kvo_store_complete_store")

    def prepare_load(self, keys: np.ndarray) -> np.ndarray:
        """Pin READY keys; their slots (SLOT_DTYPE)."""
        keys = _as_keys(keys)
        slots = np.empty(len(keys), dtype=SLOT_DTYPE)
        check(lib.kvo_store_prepare_load(self._h, _ptr(keys), len(keys), _ptr(slots)), "kvo_store_prepare_load")
        return slots

    def complete_load(self, keys: np.ndarray) -> None:
        self._batch("kvo_store_complete_load", keys)

    def touch(self, keys: np.ndarray) -> None:
        self._batch("kvo_store_touch", keys)

    def remove(self, keys: np.ndarray) -> None:
        self._batch("kvo_store_remove", keys)

    def retire(self, keys: np.ndarray) -> None:
        """Remove keys now, or hide pinned ones and drop them at their last unpin."""
        self._batch("kvo_store_retire", keys)

    def clear(self) -> int:
        """Remove every READY unpinned entry; returns how many remain."""
        return lib.kvo_store_clear(self._h)

    def drain_events(self, cap: int = 4096) -> list[tuple[str, np.ndarray]]:
        """Pending events as (type, KEY_DTYPE array) runs: "stored",
        "evicted", "removed"; consecutive events of one type are merged."""
        return drain_store_events(self._h, cap)

    def stats(self) -> dict[str, Any]:
        """kvo_store_get_stats as a dict (groups: one dict per plan group)."""
        s = _stats(L.StoreStats)
        check(lib.kvo_store_get_stats(self._h, byref(s)), "kvo_store_get_stats")
        d = {n: getattr(s, n) for n in L._STORE_STATS}
        d["groups"] = [{n: getattr(s.groups[i], n) for n in L._GROUP_STATS} for i in range(s.n_groups)]
        return d


class _Mapping:
    """Owns a C arena: destroys it when the last reference goes (the Arena
    and every numpy view of it hold one), so a view never outlives the
    memory it shows."""

    def __init__(self, h: int) -> None:
        self.h = h
        self.pid = _PID

    def __del__(self) -> None:
        if self.pid == _PID:  # in a forked child: the parent's, left alone (no unmap, no unlink)
            lib.kvo_arena_destroy(self.h)


class Arena(_Handle):
    """Host memory for slots (kvo_arena): anonymous, or a shared file
    (shm_path) that several processes map.  See kvoffload.shm.SharedArena for
    the owned, checked shared arena the vLLM spec uses.  close() releases
    the arena's own reference: the memory is unmapped once no view of it
    (view()) is left either; view() after close() raises KVO_ECLOSED."""

    _destroy = "kvo_arena_destroy"

    def __init__(self, nbytes: int, shm_path: Optional[str] = None, shm_unlink: bool = False,
                 prefault: bool = True, huge_pages: bool = False, lock: bool = False, share_processes: int = 0,
                 share_fingerprint: int = 0, share_timeout_ms: int = 0) -> None:
        p = lib.kvo_arena_default_params()
        set_fields(p, names={"bytes": "nbytes"}, bytes=nbytes, share_processes=share_processes,
                   share_timeout_ms=share_timeout_ms)
        p.prefault, p.huge_pages, p.lock = prefault, huge_pages, lock
        self._path = os.fsencode(shm_path) if shm_path else None
        p.shm_path, p.shm_unlink = self._path, shm_unlink
        fp = check_int("share_fingerprint", share_fingerprint, 0, (1 << 128) - 1)
        p.share_fingerprint = L.U128(fp & 0xFFFFFFFFFFFFFFFF, fp >> 64)
        h = c_void_p()
        check(lib.kvo_arena_create(byref(p), byref(h)), "kvo_arena_create")
        self._h: Optional[int] = h.value
        self._map: Optional[_Mapping] = _Mapping(h.value)
        self.base: int = lib.kvo_arena_base(self._h)
        self.size: int = lib.kvo_arena_size(self._h)

    def view(self, offset: int = 0, nbytes: Optional[int] = None) -> np.ndarray:
        """A uint8 numpy view of [offset, offset+nbytes); it keeps the
        mapping alive (also after close())."""
        offset = check_int("offset", offset, 0, self.size)
        nbytes = self.size - offset if nbytes is None else check_int("nbytes", nbytes, 0, self.size)
        if offset + nbytes > self.size:
            raise KvoError(L.KVO_ERANGE, f"arena view [{offset}, {offset + nbytes}) beyond {self.size} bytes",
                           "Arena.view")
        buf = (ctypes.c_uint8 * nbytes).from_address(self.base + offset)
        buf._kvo_mapping = self._map  # numpy -> memoryview -> buf -> the mapping
        return np.ctypeslib.as_array(buf)

    def _release(self, h: int) -> None:
        self._map = None  # the views that are left keep it


# --------------------------------------------------------------- file tier --

class FileTier(_Handle):
    """The persistent chunk store on a file system (kvo_file_tier)."""

    _destroy = "kvo_file_tier_destroy"

    def __init__(self, root: str, plan: Plan, quota_bytes: int, policy: str = "lru", io_threads: int = 0,
                 shared: bool = False, scan: bool = True, write_completions: bool = False,
                 layout_hash: int = 0, max_staging_bytes: int = 0, file_mode: int = 0,
                 max_pending_writes: int = 0, secret: Optional[str] = None) -> None:
        """file_mode: permissions of the files it creates (0 = 0600; 0640 or
        0660 to share with a group; directories get the search bits).
        max_staging_bytes, max_pending_writes: the write queue's bounds (0:
        the C defaults, 64 MiB and 64 writes); a write beyond them is
        refused with KVO_EAGAIN.  secret (file_secret, 16 bytes or more):
        chunks are sealed (docs/security.md); not kept by this object."""
        need("plan", plan, Plan)
        p = lib.kvo_file_tier_default_params()
        self._root = os.fsencode(root)
        p.root, p.plan, p.policy = self._root, plan._h, _policy(policy)
        set_fields(p, quota_bytes=quota_bytes, layout_hash=layout_hash, file_mode=file_mode)
        if io_threads:
            set_fields(p, io_threads=io_threads)
        if max_staging_bytes:
            set_fields(p, max_staging_bytes=max_staging_bytes)
        if max_pending_writes:
            set_fields(p, max_pending_writes=max_pending_writes)
        p.shared, p.scan, p.write_completions = shared, scan, write_completions
        if secret is not None and "\0" in need("secret", secret, str):
            raise ValueError("secret must not contain a NUL character")
        p.file_secret = secret.encode() if secret is not None else None
        h = c_void_p()
        try:
            check(lib.kvo_file_tier_create(byref(p), byref(h)), "kvo_file_tier_create")
        finally:
            p.file_secret = None
        self._h: Optional[int] = h.value
        self.plan = plan
        self.dir: str = lib.kvo_file_tier_dir(self._h).decode()
        self.backend: str = lib.kvo_file_tier_backend(self._h).decode()

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        keys = _as_keys(keys)
        st = np.empty(len(keys), dtype=np.uint8)
        check(lib.kvo_file_tier_lookup(self._h, _ptr(keys), len(keys), _ptr(st)), "kvo_file_tier_lookup")
        return st

    def write(self, keys: np.ndarray, srcs: Sequence[int]) -> np.ndarray:
        """Queue writes of chunks at addresses srcs[i]; per-key results (0
        queued, KVO_EEXIST, KVO_EAGAIN, KVO_ENOSPC...)."""
        return _queue_io(self._h, "kvo_file_tier_write", keys, srcs, None, False)

    def write_borrowed(self, keys: np.ndarray, srcs: Sequence[int], user_data: Sequence[int],
                       sums: Optional[Sequence[int]] = None) -> np.ndarray:
        """Queue writes straight from addresses srcs[i] (no staging copy):
        each source is lent to the tier until that write's completion
        (poll, op FILE_OP_WRITE, user_data[i]; every queued one reports).
        sums: the XXH3-64 of each chunk as the caller knows it (a source
        changed since writes no file: KVO_ECORRUPT).  Per-key results as
        write."""
        keys = _as_keys(keys)
        n = len(keys)
        f = "kvo_file_tier_write_borrowed"
        ptrs = _uint64s(f, "addresses", srcs, n)
        ud = _uint64s(f, "user_data", user_data, n)
        sm = _uint64s(f, "sums", sums, n) if sums is not None else None
        res = np.empty(n, dtype=np.int32)
        check(lib.kvo_file_tier_write_borrowed(self._h, _ptr(keys), _ptr(ptrs), _ptr(sm) if sm is not None else None,
                                               n, _ptr(ud), _ptr(res), None), f)
        return res

    def read(self, keys: np.ndarray, dsts: Sequence[int], user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Queue reads into addresses dsts[i] (room for slot_bytes); per-key
        results; each 0 is followed by one completion (poll)."""
        return _queue_io(self._h, "kvo_file_tier_read", keys, dsts, user_data, True)

    def poll(self, cap: int = 256) -> list[dict[str, Any]]:
        return _poll_completions(self._h, "kvo_file_tier_poll", L.FileCompletion, cap)

    def wait(self, timeout_ms: int = -1) -> int:
        return _wait(self._h, "kvo_file_tier_wait", timeout_ms)

    def flush(self, timeout_ms: int = -1) -> int:
        """Wait until no write is queued or running: 0 or KVO_ETIMEDOUT."""
        return _flush(self._h, "kvo_file_tier_flush", timeout_ms)

    def touch(self, keys: np.ndarray) -> None:
        self._batch("kvo_file_tier_touch", keys)

    def remove(self, keys: np.ndarray) -> None:
        self._batch("kvo_file_tier_remove", keys)

    def stats(self) -> dict[str, Any]:
        s = _stats(L.FileTierStats)
        check(lib.kvo_file_tier_get_stats(self._h, byref(s)), "kvo_file_tier_get_stats")
        return _struct_dict(s)


# ------------------------------------------------------------- remote tier --

_URL_CREDS = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<creds>.*)@(?P<hosts>[^@]*)$", re.S)
_URL_SEEDS = re.compile(r"^(?:\[[^\]]*\]|[^:,/@\[\]]+):[0-9]{1,5}(?:,(?:\[[^\]]*\]|[^:,/@\[\]]+):[0-9]{1,5})*/?$")


def _seeds_malformed(url: str) -> bool:
    """A URL without credentials whose seeds are not host:port[,host:port]:
    what follows the scheme may be "user:PASSWORD" written without its
    "@host:port" (the C parser refuses it naming only the seed's position)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    return bool(rest) and not _URL_SEEDS.match(rest)


def url_has_password(url: str) -> bool:
    """Whether a redis:// URL carries a password (the C parser's rule: the
    credentials end at the last '@'; without ':' they are all password), or
    may carry one: seeds that are not host:port (e.g. "redis://user:PASSWORD"
    without "@host:port") count as one."""
    if not isinstance(url, str):
        return False
    m = _URL_CREDS.match(url)
    if not m:
        return "://" in url and _seeds_malformed(url)
    creds = m.group("creds")
    return bool(creds.split(":", 1)[1] if ":" in creds else creds)


def redact_url(url: str) -> str:
    """url with its password replaced by *** (the user name stays), for logs
    and messages; "<unparsable url>" for what is not scheme://...  The vLLM
    spec logs kv_transfer_config: it should warn once, with this, when
    url_has_password(kvo_redis_url) and point to KVO_REDIS_PASSWORD."""
    if not isinstance(url, str) or "://" not in url:
        return "<unparsable url>"
    m = _URL_CREDS.match(url)
    if not m:  # no credentials: shown only when the seeds are host:port
        return f"{url.split('://', 1)[0]}://<not host:port[,host:port]>" if _seeds_malformed(url) else url
    creds = m.group("creds")
    if not url_has_password(url):
        return url
    user = creds.split(":", 1)[0] + ":" if ":" in creds else ""
    return f"{m.group('scheme')}{user}***@{m.group('hosts')}"


_password_warned: set = set()


def warn_if_url_has_password(url: str, where: str) -> bool:
    """Warn once per `where` (e.g. "kvo_redis_url") when url carries a
    password: engines log their configuration (vLLM prints
    kv_transfer_config), so the secret ends up in their logs.  The warning
    shows the URL redacted and points to KVO_REDIS_PASSWORD.  Returns whether
    it warned now."""
    if where in _password_warned or not url_has_password(url):
        return False
    _password_warned.add(where)
    logging.getLogger("kvoffload").warning(
        "%s carries a password (%s): the engine's configuration log shows it; put it in the "
        "KVO_REDIS_PASSWORD environment variable instead", where, redact_url(url))
    return True


class RemoteTier(_Handle):
    """A chunk cache shared by engines in a Redis Cluster (kvo_remote_tier).

    url: redis://[user:pass@]host:port[,host:port...] (seed nodes).  Values
    are verified on every get (a corrupt or foreign value is a miss).  put,
    get and exists queue and return per-key results at once (0 queued); get
    and exists each give one completion (poll), and put too with
    write_completions.  secret: the fleet secret (16 bytes or more: every
    value sealed, docs/security.md); None takes KVO_REMOTE_SECRET (and
    secret_previous KVO_REMOTE_SECRET_PREVIOUS), "" none.  Raises KvoError
    with KVO_ENOTSUP when the library was built without hiredis (or
    without OpenSSL and given a secret)."""

    _destroy = "kvo_remote_tier_destroy"

    def __init__(self, url: str, plan: Plan, key_prefix: str = "kvo", layout_hash: int = 0, ttl_s: int = 0,
                 io_threads: int = 0, user: Optional[str] = None, password: Optional[str] = None,
                 io_timeout_ms: int = 0, max_pending_reads: int = 0, max_pending_writes: int = 0,
                 write_completions: bool = False, secret: Optional[str] = None,
                 secret_previous: Optional[str] = None) -> None:
        need("url", url, str)
        need("plan", plan, Plan)
        p = lib.kvo_remote_tier_default_params()
        p.plan = plan._h
        p.write_completions = bool(write_completions)
        set_fields(p, layout_hash=layout_hash, ttl_s=ttl_s)
        for name, v in (("io_threads", io_threads), ("io_timeout_ms", io_timeout_ms),
                        ("max_pending_reads", max_pending_reads), ("max_pending_writes", max_pending_writes)):
            if v:
                set_fields(p, **{name: v})
        # the encoded strings live in this frame only (p refers to them until
        # create returns; the library copies them): no copy of the password
        # stays with the object, also when create fails
        p.url, p.key_prefix = url.encode(), need("key_prefix", key_prefix, str).encode()
        p.user = user.encode() if user else None
        p.password = password.encode() if password else None
        # the fleet secret: None = env KVO_REMOTE_SECRET (and _PREVIOUS), "" = none
        for name, v in (("secret", secret), ("secret_previous", secret_previous)):
            if v is not None and "\0" in need(name, v, str):
                raise ValueError(f"{name} must not contain a NUL character")
        p.secret = secret.encode() if secret is not None else None
        p.secret_previous = secret_previous.encode() if secret_previous is not None else None
        h = c_void_p()
        try:
            check(lib.kvo_remote_tier_create(byref(p), byref(h)), "kvo_remote_tier_create")
        finally:
            p.url = p.user = p.password = p.secret = p.secret_previous = None
        self._h: Optional[int] = h.value
        self.plan = plan

    def put(self, keys: np.ndarray, srcs: Sequence[int]) -> np.ndarray:
        """Queue stores of the chunks at addresses srcs[i] (copied before
        this returns); per-key results (0, KVO_EEXIST, KVO_EAGAIN...)."""
        return _queue_io(self._h, "kvo_remote_tier_put", keys, srcs, None, False)

    def get(self, keys: np.ndarray, dsts: Sequence[int], user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Queue loads into addresses dsts[i] (room for chunk_bytes, kept
        untouched until the completion); per-key results."""
        return _queue_io(self._h, "kvo_remote_tier_get", keys, dsts, user_data, True)

    def exists(self, keys: np.ndarray, user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Queue presence queries; per-key results; completions say 0
        (present), KVO_ENOTFOUND or KVO_EIO."""
        return _queue_io(self._h, "kvo_remote_tier_exists", keys, None, user_data, True)

    def poll(self, cap: int = 256) -> list[dict[str, Any]]:
        return _poll_completions(self._h, "kvo_remote_tier_poll", L.RemoteCompletion, cap)

    def wait(self, timeout_ms: int = -1) -> int:
        return _wait(self._h, "kvo_remote_tier_wait", timeout_ms)

    def flush(self, timeout_ms: int = -1) -> int:
        """Wait until no put is queued or running: 0 or KVO_ETIMEDOUT."""
        return _flush(self._h, "kvo_remote_tier_flush", timeout_ms)

    def key_name(self, key: np.ndarray) -> str:
        keys = _as_keys(key)
        out = ctypes.create_string_buffer(256)
        check(lib.kvo_remote_tier_key_name(self._h, _ptr(keys), out, 256), "kvo_remote_tier_key_name")
        return out.value.decode()

    def stats(self) -> dict[str, Any]:
        s = _stats(L.RemoteTierStats)
        check(lib.kvo_remote_tier_get_stats(self._h, byref(s)), "kvo_remote_tier_get_stats")
        return _struct_dict(s)


# ---------------------------------------------------------------- transfer --

STORE, LOAD = 0, 1


class Transfer(_Handle):
    """The batched copy engine (kvo_transfer) between engine blocks and slots.

    set_layout(segments) takes dicts {group, base, num_blocks, block_stride,
    page_bytes} (base: an address, e.g. tensor.data_ptr()).  submit(dir, ops)
    takes dicts {group, first_block, engine_blocks, slot, slot_bytes} and
    makes one C call for the whole job."""

    _destroy = "kvo_transfer_destroy"

    def __init__(self, plan: Plan, threads: int = 2, device: Optional[str] = None, max_queued_jobs: int = 0,
                 device_index: int = 0) -> None:
        need("plan", plan, Plan)
        p = lib.kvo_transfer_default_params()
        p.plan = plan._h
        set_fields(p, threads=threads, device_index=device_index)
        if max_queued_jobs:
            set_fields(p, max_queued_jobs=max_queued_jobs)
        self._dev = device.encode() if device else None
        p.device = self._dev
        h = c_void_p()
        check(lib.kvo_transfer_create(byref(p), byref(h)), "kvo_transfer_create")
        self._h: Optional[int] = h.value
        self.plan = plan

    def set_layout(self, segments: Sequence[Mapping[str, int]]) -> None:
        arr = _segments(segments)
        check(lib.kvo_transfer_set_layout(self._h, arr, len(segments)), "kvo_transfer_set_layout")

    def submit(self, direction: int, ops: Sequence[Mapping[str, Any]]) -> int:
        """Queue one job; returns its id.  direction: STORE (engine -> slot)
        or LOAD (slot -> engine)."""
        if direction not in (STORE, LOAD):
            raise ValueError(f"Transfer.submit: direction={direction!r} must be STORE ({STORE}) or LOAD ({LOAD})")
        arr = (L.XferOp * len(ops))()
        keep = []
        for i, o in enumerate(ops):
            blocks = _uint64s("Transfer.submit", f"ops[{i}].engine_blocks", o["engine_blocks"],
                              len(o["engine_blocks"]))
            keep.append(blocks)
            set_fields(arr[i], names={"group": f"ops[{i}].group", "first_block": f"ops[{i}].first_block",
                                      "n_blocks": f"ops[{i}].engine_blocks (count)",
                                      "slot_bytes": f"ops[{i}].slot_bytes"},
                       group=o["group"], first_block=o.get("first_block", 0), n_blocks=len(blocks),
                       slot_bytes=o["slot_bytes"])
            arr[i].engine_blocks = ctypes.cast(blocks.ctypes.data, ctypes.POINTER(ctypes.c_uint64))
            arr[i].slot = _u64(f"ops[{i}].slot", o["slot"])
        job = c_uint64()
        check(lib.kvo_transfer_submit(self._h, direction, arr, len(ops), byref(job)), "kvo_transfer_submit")
        return job.value

    def poll(self, cap: int = 256) -> list[dict[str, int]]:
        buf = (L.XferResult * _cap(cap))()
        n = c_size_t()
        check(lib.kvo_transfer_poll(self._h, buf, cap, byref(n)), "kvo_transfer_poll")
        return [_struct_dict(r) for r in buf[: n.value]]

    def wait(self, job_ids: Sequence[int], timeout_ns: int = -1) -> None:
        ids = _uint64s("Transfer.wait", "job_ids", job_ids, len(job_ids))
        timeout_ns = check_int("timeout_ns", timeout_ns, -(1 << 63), (1 << 63) - 1)
        check(lib.kvo_transfer_wait(self._h, _ptr(ids), len(ids), timeout_ns), "kvo_transfer_wait")

    def stats(self) -> dict[str, Any]:
        s = _stats(L.TransferStats)
        check(lib.kvo_transfer_get_stats(self._h, byref(s)), "kvo_transfer_get_stats")
        return _struct_dict(s)


# --------------------------------------------------------------- connector --

def tenant_parts(tenant_host_bytes: Optional[dict[str, int]],
                 tenant_file_tiers: Optional[dict[str, "FileTier"]] = None) -> Optional[Any]:
    """A kvo_cascade_tenant array for {label: host bytes} and {label:
    FileTier} (labels as tenant_label gives them; never salts), or None for
    none.  The C call copies it; the tiers are borrowed (keep them open)."""
    host, files = tenant_host_bytes or {}, tenant_file_tiers or {}
    for name, d in (("tenant_host_bytes", host), ("tenant_file_tiers", files)):
        if not isinstance(d, dict):
            raise TypeError(f"{name} must be a dict keyed by tenant label, not {type(d).__name__}")
    labels = list(dict.fromkeys([*host, *files]))
    if not labels:
        return None
    arr = (L.CascadeTenant * len(labels))()
    for i, label in enumerate(labels):
        n = host.get(label, 0)
        if not isinstance(label, str) or isinstance(n, bool) or not isinstance(n, int):
            raise TypeError("tenant_host_bytes: keys are tenant labels (str), values bytes (int)")
        arr[i].label, arr[i].host_bytes = label.encode(), check_int("tenant_host_bytes", n, 0, (1 << 64) - 1)
        if label in files:
            need(f"tenant_file_tiers[{label!r}]", files[label], FileTier)
            arr[i].file_tier = files[label]._h
    return arr


class Connector(_Handle):
    """The whole offload path for one engine (kvo_connector): arena, store,
    transfer engine, optional file tier.  Requests are registered with their
    prompt tokens; lookup/load/update/finish take one call per request."""

    _destroy = "kvo_connector_destroy"

    def __init__(self, plan: Plan, host_bytes: int, policy: str = "lru", file_tier: Optional[FileTier] = None,
                 transfer_threads: int = 2, shm_path: Optional[str] = None, prefault: bool = True,
                 event_capacity: int = 4096, tenant_host_bytes: Optional[dict[str, int]] = None,
                 tenant_file_tiers: Optional[dict[str, FileTier]] = None) -> None:
        need("plan", plan, Plan)
        if file_tier is not None:
            need("file_tier", file_tier, FileTier)
        p = lib.kvo_connector_default_params()
        p.plan, p.policy, p.prefault = plan._h, _policy(policy), prefault
        set_fields(p, host_bytes=host_bytes, transfer_threads=transfer_threads, event_capacity=event_capacity)
        self._shm = shm_path.encode() if shm_path else None
        p.shm_path = self._shm
        p.file_tier = file_tier._h if file_tier else None
        parts = tenant_parts(tenant_host_bytes, tenant_file_tiers)
        if parts is not None:
            p.tenants, p.n_tenants = ctypes.addressof(parts), len(parts)
        h = c_void_p()
        check(lib.kvo_connector_create(byref(p), byref(h)), "kvo_connector_create")
        self._h: Optional[int] = h.value
        self.plan, self.file_tier = plan, file_tier
        self.tenant_file_tiers = dict(tenant_file_tiers or {})   # borrowed by the C object
        self.step: int = lib.kvo_connector_step(self._h)

    def set_layout(self, segments: Sequence[Mapping[str, int]]) -> None:
        arr = _segments(segments)
        check(lib.kvo_connector_set_layout(self._h, arr, len(segments)), "kvo_connector_set_layout")

    def add_request(self, req_id: int, tokens: Sequence[int], cache_salt: bytes = b"") -> None:
        req_id = _u64("req_id", req_id)
        toks = np.ascontiguousarray(tokens, dtype="<u4")
        d = L.RequestDesc()
        d.struct_size = ctypes.sizeof(d)
        d.id, d.n_tokens = req_id, len(toks)
        d.tokens = ctypes.cast(toks.ctypes.data, ctypes.POINTER(ctypes.c_uint32))
        salt = ctypes.create_string_buffer(bytes(cache_salt), len(cache_salt)) if cache_salt else None
        d.cache_salt, d.cache_salt_len = (ctypes.cast(salt, c_void_p) if salt is not None else None), len(cache_salt)
        check(lib.kvo_connector_add_request(self._h, byref(d)), "kvo_connector_add_request")   # copies the salt

    def lookup(self, req_id: int, local_tokens: int = 0) -> dict[str, int]:
        r = L.LookupResultC()
        check(lib.kvo_connector_lookup(self._h, _u64("req_id", req_id), _u64("local_tokens", local_tokens), byref(r)),
              "kvo_connector_lookup")
        return _struct_dict(r)

    @staticmethod
    def _tables(tables: Sequence[Sequence[int]]) -> tuple[Any, list[np.ndarray]]:
        arr = (L.BlockTable * len(tables))()
        keep = []
        for i, t in enumerate(tables):
            b = _uint64s("Connector", f"tables[{i}]", t, len(t))
            keep.append(b)
            arr[i].blocks = ctypes.cast(b.ctypes.data, ctypes.POINTER(ctypes.c_uint64))
            arr[i].n = len(b)
        return arr, keep

    def load(self, req_id: int, tokens: int, tables: Sequence[Sequence[int]]) -> None:
        arr, _keep = self._tables(tables)
        check(lib.kvo_connector_load(self._h, _u64("req_id", req_id), _u64("tokens", tokens), arr, len(tables)),
              "kvo_connector_load")

    def update(self, req_id: int, computed_tokens: int, tables: Sequence[Sequence[int]]) -> None:
        arr, _keep = self._tables(tables)
        check(lib.kvo_connector_update(self._h, _u64("req_id", req_id), _u64("computed_tokens", computed_tokens), arr,
                                       len(tables)), "kvo_connector_update")

    def finish(self, req_id: int, computed_tokens: int, tables: Optional[Sequence[Sequence[int]]] = None) -> bool:
        busy = c_bool()
        req_id, computed_tokens = _u64("req_id", req_id), _u64("computed_tokens", computed_tokens)
        if tables is None:
            check(lib.kvo_connector_finish(self._h, req_id, computed_tokens, None, 0, byref(busy)),
                  "kvo_connector_finish")
        else:
            arr, _keep = self._tables(tables)
            check(lib.kvo_connector_finish(self._h, req_id, computed_tokens, arr, len(tables), byref(busy)),
                  "kvo_connector_finish")
        return busy.value

    def wait_request(self, req_id: int) -> None:
        check(lib.kvo_connector_wait_request(self._h, _u64("req_id", req_id)), "kvo_connector_wait_request")

    def preempt(self, req_id: int) -> None:
        check(lib.kvo_connector_preempt(self._h, _u64("req_id", req_id)), "kvo_connector_preempt")

    def abort(self, req_id: int) -> None:
        check(lib.kvo_connector_abort(self._h, _u64("req_id", req_id)), "kvo_connector_abort")

    def poll(self, cap: int = 256) -> list[dict[str, int]]:
        buf = (L.Completion * _cap(cap))()
        n = ctypes.c_size_t(0)
        check(lib.kvo_connector_poll(self._h, buf, cap, byref(n)), "kvo_connector_poll")
        return [_struct_dict(c) for c in buf[:n.value]]

    def request_stats(self, req_id: int) -> dict[str, int]:
        s = _stats(L.RequestStats)
        check(lib.kvo_connector_request_stats(self._h, _u64("req_id", req_id), byref(s)), "kvo_connector_request_stats")
        return _struct_dict(s)

    def stats(self) -> dict[str, Any]:
        s = _stats(L.ConnectorStats)
        check(lib.kvo_connector_get_stats(self._h, byref(s)), "kvo_connector_get_stats")
        d: dict[str, Any] = {n: getattr(s, n) for n in L._CONN_STATS + L._CONN_STATS_REMOTE}
        d["host"] = {n: getattr(s.host, n) for n in L._STORE_STATS}
        return d

    def tenant_stats(self) -> dict[str, dict[str, int]]:
        """Per tenant (kvo_connector_tenant_stats): label -> its counters
        (requests, lookup_tokens, hit_tokens, loaded_tokens, stored_chunks,
        load_failures); the first 32 tenants by label, later ones under
        "other"."""
        n = ctypes.c_size_t(0)
        check(lib.kvo_connector_tenant_stats(self._h, None, 0, byref(n)), "kvo_connector_tenant_stats")
        buf = (L.TenantStats * max(1, n.value))()
        check(lib.kvo_connector_tenant_stats(self._h, buf, len(buf), byref(n)), "kvo_connector_tenant_stats")
        return {r.label.decode(): {f: getattr(r, f) for f, _ in L.TenantStats._fields_[1:]} for r in buf[:n.value]}




# ------------------------------------------------------------- CUDA device --

class CudaDevice(_Handle):
    """The CUDA transfer device of one GPU (kvo_cuda, kvo_cuda.h): its
    streams and the host memory pinned for DMA.  In the CUDA device library
    (_lib.cuda_lib(): KVO_CUDA_LIBRARY or libkvoffload_cuda.so next to
    libkvoffload.so); without it, creating one raises KvoError KVO_ENOTSUP
    saying where it looked.  close() unpins the arenas pinned through it and
    drops the context (freed once no transfer engine uses it: close the
    engines first); an arena must stay mapped until then."""

    _destroy = "kvo_cuda_destroy"

    def __init__(self, device_index: int = 0, require_pinned: Optional[bool] = None,
                 compute_stream: Optional[int] = None, completion_timeout_ms: Optional[int] = None) -> None:
        """compute_stream: the cudaStream_t (an int, e.g. torch's
        current_stream().cuda_stream; 1 for the legacy default stream, since
        0/None means none) that stores are ordered after (kvo_cuda.h)."""
        self._pinned: list[Any] = []
        dll = L.cuda_lib()
        self._dll = dll
        p = dll.kvo_cuda_default_params()
        set_fields(p, device_index=device_index)
        if require_pinned is not None:
            p.require_pinned = require_pinned
        if compute_stream:
            p.compute_stream = _u64("compute_stream", compute_stream)
        if completion_timeout_ms is not None:
            set_fields(p, completion_timeout_ms=completion_timeout_ms)
        h = c_void_p()
        check(dll.kvo_cuda_create(byref(p), byref(h)), "kvo_cuda_create")
        self._h: Optional[int] = h.value
        self.device_index = device_index

    def set_compute_stream(self, stream: Optional[int]) -> None:
        """The stream later stores are ordered after (an event recorded on it
        at each store's submit); None or 0: none."""
        stream = _u64("stream", stream) if stream else None
        check(self._dll.kvo_cuda_set_compute_stream(self._h, stream), "kvo_cuda_set_compute_stream")

    def pin_arena(self, arena: "Arena") -> None:
        """Page-lock an arena's region (kept until close or unpin_arena)."""
        check(self._dll.kvo_cuda_pin_arena(self._h, arena._h), "kvo_cuda_pin_arena")
        self._pinned.append(arena)

    def unpin_arena(self, arena: "Arena") -> None:
        self._pinned.remove(arena)
        check(self._dll.kvo_cuda_unpin_arena(self._h, arena._h), "kvo_cuda_unpin_arena")

    def stats(self) -> dict[str, Any]:
        s = _stats(L.CudaStats)
        check(self._dll.kvo_cuda_get_stats(self._h, byref(s)), "kvo_cuda_get_stats")
        return _struct_dict(s)

    def close(self) -> None:
        if getattr(self, "_h", None) and getattr(self, "_pid", None) == _PID:
            for a in getattr(self, "_pinned", []):
                if a._h:
                    self._dll.kvo_cuda_unpin_arena(self._h, a._h)
            self._pinned = []
        super().close()
