"""The cascade (include/kvoffload/kvo_cascade.h): kvoffload's one way through
the tiers, for every engine adapter.

A Cascade owns, for one plan, the host tier (an arena of slots and its
index), an optional FileTier and an optional RemoteTier behind it: lookup of
a whole key sequence in one call (where each key is, the longest prefix
held), promotion of lower-tier chunks into host slots (one batch per tier),
stores with write-through / write-back / staging and retried back-pressure,
direct reads and writes against the engine's own memory (host_bytes=0), and
one completion ring behind one event fd.  Adapters translate their engine's
types into these calls and hold no tier logic of their own.

namespace_id() and namespace_keys() are the one namespace rule: a 128-bit
namespace from the plan, the model identity, dtype, KV layout and tenant,
and chunk keys derived from an engine's own identifiers under it;
layout_of() names a tier's directory and key prefix after a namespace, and
value_plan() is the one-group plan of engines that store fixed-size values.

Engines whose calls wait (SGLang's and LMCache's batch calls) use
Cascade.read_wait and Cascade.held: several engine threads may share one
Cascade, each waiting for its own completions.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading
from ctypes import POINTER, Structure, byref, c_bool, c_char_p, c_int, c_int64, c_size_t, c_uint8, c_uint32, c_uint64
from ctypes import c_void_p
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _lib as L
from ._lib import U128, KvoError, check, check_int, lib, set_fields
from .core import KEY_DTYPE, PENDING, READY, SLOT_DTYPE, Arena, FileTier, Model, Plan, RemoteTier, Store, _as_keys
from .core import _Handle, tenant_parts
from .core import _policy, _ptr, _stats, _uint64s

# kvo_tier_id
TIER_NONE, TIER_HOST, TIER_FILE, TIER_REMOTE = 0, 1, 2, 3
TIER_NAMES = {TIER_NONE: "none", TIER_HOST: "host", TIER_FILE: "file", TIER_REMOTE: "remote"}
# lookup flags
PREFIX, PROMOTE = 1, 2
# prepare_store: what to do with each key
SKIP, HOST, STAGED, REFUSED = 0, 1, 2, 3
ALL_OR_NOTHING = 1
# completion ops
OP_PROMOTE, OP_READ, OP_WRITE, OP_REMOVE = 1, 2, 3, 4
FILE_MODES = {"write_through": 0, "write_back": 1}


class NamespaceDesc(Structure):
    _fields_ = [("struct_size", c_size_t), ("engine", c_char_p), ("model", c_void_p), ("model_len", c_size_t),
                ("dtype", c_char_p), ("kv_layout", c_char_p), ("tenant", c_void_p), ("tenant_len", c_size_t),
                ("extra", c_void_p), ("extra_len", c_size_t), ("layout_hash", c_uint64)]


class CascadeParams(Structure):
    _fields_ = [("struct_size", c_size_t), ("plan", c_void_p), ("host_bytes", c_uint64), ("staging_bytes", c_uint64),
                ("arena", c_void_p), ("huge_pages", c_bool), ("lock_memory", c_bool), ("prefault", c_bool),
                ("policy", c_int), ("admit_after", c_uint32), ("event_capacity", c_uint32),
                ("ignore_present", c_bool), ("lookups_per_key", c_bool), ("verify_checksums", c_bool),
                ("file_tier", c_void_p), ("file_mode", c_int), ("file_zero_copy", c_bool),
                ("remote_tier", c_void_p), ("remote_lookup_budget_us", c_uint32),
                ("remote_exists_ttl_ms", c_uint32), ("retry_polls", c_uint32),
                ("tenants", c_void_p), ("n_tenants", c_uint32)]


class CascadeWait(Structure):
    _fields_ = [("since_ns", c_uint64)]


class CascadeLookupResult(Structure):
    _fields_ = [("prefix", c_size_t), ("prefix_if_pending", c_size_t), ("host", c_size_t), ("file", c_size_t),
                ("remote", c_size_t), ("promoting", c_size_t), ("remote_pending", c_bool)]


class CascadeCompletion(Structure):
    _fields_ = [("user_data", c_uint64), ("key", L.ChunkKey), ("op", c_uint32), ("tier", c_uint32),
                ("result", c_int), ("bytes", c_uint64), ("latency_ns", c_uint64)]


_TIER_STATS = ["hits", "promotions", "promotion_failures", "reads", "read_bytes", "read_failures", "writes",
               "write_bytes", "writes_skipped", "writebacks", "writes_deferred", "writes_dropped", "lent"]


class CascadeTierStats(Structure):
    _fields_ = [(n, c_uint64) for n in _TIER_STATS]


_CASCADE_STATS = ["lookups", "remote_exists", "remote_exists_refused", "remote_budget_expired", "stores_offered",
                  "stores_host", "stores_staged", "stores_refused", "checksum_failures",
                  "promotions_now", "reads_now", "deferred_now", "lent_now", "staged_now"]


class CascadeStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("host", CascadeTierStats), ("file", CascadeTierStats),
                ("remote", CascadeTierStats)] + [(n, c_uint64) for n in _CASCADE_STATS]


# completions as a numpy array (one C call fills it, no per-item Python)
COMPLETION_DTYPE = np.dtype([("user_data", "<u8"), ("lo", "<u8"), ("hi", "<u8"), ("group", "<u4"),
                             ("tenant", "<u4"), ("op", "<u4"), ("tier", "<u4"), ("result", "<i4"),
                             ("pad", "<u4"), ("bytes", "<u8"), ("latency_ns", "<u8")])
assert COMPLETION_DTYPE.itemsize == ctypes.sizeof(CascadeCompletion), "kvo_cascade_completion's layout changed"

_P = c_void_p
_PROTOS: dict[str, tuple[Any, list[Any]]] = {
    "kvo_namespace_id": (c_int, [_P, POINTER(NamespaceDesc), POINTER(U128)]),
    "kvo_namespace_keys": (c_int, [U128, c_void_p, c_size_t, c_size_t, c_size_t, c_uint32, c_void_p]),
    "kvo_tenant_label": (c_int, [c_void_p, c_size_t, c_char_p, c_size_t]),
    "kvo_cascade_default_params": (CascadeParams, []),
    "kvo_cascade_create": (c_int, [POINTER(CascadeParams), POINTER(_P)]),
    "kvo_cascade_destroy": (None, [_P]),
    "kvo_cascade_store": (_P, [_P]),
    "kvo_cascade_part_store": (_P, [_P, c_uint32]),
    "kvo_cascade_tenant_part": (c_int, [_P, c_void_p, c_size_t, POINTER(c_uint32)]),
    "kvo_cascade_host_stats": (c_int, [_P, POINTER(L.StoreStats)]),
    "kvo_cascade_drain_events": (c_size_t, [_P, c_void_p, c_size_t, POINTER(c_uint64)]),
    "kvo_cascade_arena": (_P, [_P]),
    "kvo_cascade_lookup": (c_int, [_P, c_void_p, c_size_t, c_uint32, POINTER(CascadeWait), c_int64, c_void_p,
                                   c_void_p, POINTER(CascadeLookupResult)]),
    "kvo_cascade_promote": (c_int, [_P, c_void_p, c_size_t, c_void_p, c_void_p, c_void_p]),
    "kvo_cascade_prepare_load": (c_int, [_P, c_void_p, c_size_t, c_void_p]),
    "kvo_cascade_complete_load": (c_int, [_P, c_void_p, c_size_t]),
    "kvo_cascade_touch": (c_int, [_P, c_void_p, c_size_t]),
    "kvo_cascade_verify": (c_size_t, [_P, c_void_p, c_void_p, c_size_t, c_void_p]),
    "kvo_cascade_prepare_store": (c_int, [_P, c_void_p, c_size_t, c_uint32, c_void_p, c_void_p]),
    "kvo_cascade_complete_store": (c_int, [_P, c_void_p, c_size_t, c_bool]),
    "kvo_cascade_pending_slots": (c_int, [_P, c_void_p, c_size_t, c_void_p]),
    "kvo_cascade_remove": (c_int, [_P, c_void_p, c_size_t, c_void_p, c_void_p]),
    "kvo_cascade_read": (c_int, [_P, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p]),
    "kvo_cascade_write": (c_int, [_P, c_void_p, c_void_p, c_size_t, c_int64, c_void_p]),
    "kvo_cascade_write_async": (c_int, [_P, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p]),
    "kvo_cascade_poll": (c_int, [_P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_cascade_event_fd": (c_int, [_P]),
    "kvo_cascade_wait_events": (c_int, [_P, c_int64]),
    "kvo_cascade_flush": (c_int, [_P, c_int64]),
    "kvo_cascade_persist": (c_int, [_P, c_int64, POINTER(c_uint64)]),
    "kvo_cascade_set_tier_groups": (c_int, [_P, c_int, c_uint64]),
    "kvo_cascade_invalidate": (c_int, [_P, c_uint64, POINTER(c_uint64)]),
    "kvo_cascade_get_stats": (c_int, [_P, POINTER(CascadeStats)]),
}
for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


def _bytes(name: str, v: Union[None, str, bytes]) -> Optional[bytes]:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{name} must be str or bytes, not {type(v).__name__}")


def namespace_id(plan: Plan, engine: Optional[str] = None, model: Union[None, str, bytes] = None,
                 dtype: Optional[str] = None, kv_layout: Optional[str] = None,
                 tenant: Union[None, str, bytes] = None, extra: Union[None, str, bytes] = None,
                 layout_hash: int = 0) -> int:
    """The 128-bit namespace (an int) of a plan under a model identity, dtype,
    KV layout and tenant: every field whole (no folding, no truncation); an
    absent field (None) differs from an empty one."""
    d = NamespaceDesc()
    d.struct_size = ctypes.sizeof(NamespaceDesc)
    keep = [_bytes("engine", engine), _bytes("model", model), _bytes("dtype", dtype), _bytes("kv_layout", kv_layout),
            _bytes("tenant", tenant), _bytes("extra", extra)]
    d.engine, d.dtype, d.kv_layout = keep[0], keep[2], keep[3]
    for field, v in (("model", keep[1]), ("tenant", keep[4]), ("extra", keep[5])):
        if v is not None:
            buf = ctypes.create_string_buffer(v, len(v) or 1)
            keep.append(buf)  # type: ignore[arg-type]
            setattr(d, field, ctypes.cast(buf, c_void_p))
            setattr(d, field + "_len", len(v))
    set_fields(d, layout_hash=layout_hash)
    out = U128()
    check(lib.kvo_namespace_id(plan._h, byref(d), byref(out)), "kvo_namespace_id")
    return out.lo | (out.hi << 64)


def namespace_keys(ns: int, ids: Union[Sequence[Union[str, bytes]], np.ndarray], group: int = 0,
                   id_len: Optional[int] = None) -> np.ndarray:
    """KEY_DTYPE keys of engine identifiers under namespace ns: ids are
    bytes or str (UTF-8), each hashed whole (one C call per distinct
    length: usually one), or a 2-D uint8 array, one id per row.  id_len:
    hash every id as that many bytes, a shorter one zero-padded (for ids
    of one fixed width that may end in zeros)."""
    check_int("ns", ns, 0, (1 << 128) - 1)
    check_int("group", group, 0, 0xFFFFFFFF)
    nsu = U128(ns & 0xFFFFFFFFFFFFFFFF, ns >> 64)
    if isinstance(ids, np.ndarray):
        if ids.dtype != np.uint8 or ids.ndim != 2:
            raise ValueError(f"namespace_keys: ids as an array must be 2-D uint8, not {ids.dtype} {ids.shape}")
        raw = np.ascontiguousarray(ids)
        out = np.zeros(len(raw), dtype=KEY_DTYPE)
        if len(raw):
            width = raw.shape[1]
            check(lib.kvo_namespace_keys(nsu, _ptr(raw), width, width, len(raw), group, _ptr(out)),
                  "kvo_namespace_keys")
        return out
    bs = [_bytes("ids", v) or b"" for v in ids]
    out = np.zeros(len(bs), dtype=KEY_DTYPE)
    if id_len is not None:
        check_int("id_len", id_len, 0, 1 << 30)
        long = [i for i, b in enumerate(bs) if len(b) > id_len]
        if long:
            raise ValueError(f"namespace_keys: id {long[0]} has {len(bs[long[0]])} bytes, more than id_len {id_len}")
        bs = [b.ljust(id_len, b"\0") for b in bs]
    by_len: dict[int, list[int]] = {}
    for i, b in enumerate(bs):
        by_len.setdefault(len(b), []).append(i)
    for width, idx in by_len.items():
        raw = b"".join(bs[i] for i in idx) or b"\0"
        part = out if len(idx) == len(bs) else np.zeros(len(idx), dtype=KEY_DTYPE)
        check(lib.kvo_namespace_keys(nsu, raw, width, width, len(idx), group, _ptr(part)), "kvo_namespace_keys")
        if part is not out:
            out[idx] = part
    return out


def tenant_label(tenant: Union[None, str, bytes]) -> str:
    """The label a tenant's counters go by (kvo_tenant_label): "default"
    for None or empty, else "t-" and 12 hex digits of a hash of its bytes
    (a str as UTF-8).  Never the salt itself."""
    raw = _bytes("tenant", tenant) or b""
    out = ctypes.create_string_buffer(32)
    check(lib.kvo_tenant_label(raw or None, len(raw), out, len(out)), "kvo_tenant_label")
    return out.value.decode()


def layout_of(ns: int) -> int:
    """A namespace as a tier's 64-bit layout hash (kvo_file_tier_params /
    kvo_remote_tier_params layout_hash): the files' directory and the
    cluster's key prefix of the chunks under it.  Never 0 (0 = none)."""
    check_int("ns", ns, 0, (1 << 128) - 1)
    return ((ns ^ (ns >> 64)) & 0xFFFFFFFFFFFFFFFF) or 1


def value_plan(name: str, value_bytes: int, tokens: int = 1) -> Plan:
    """A one-group plan whose chunks are value_bytes long (one block of
    `tokens` tokens): engines that store fixed-size values (a vLLM primary
    row, an SGLang host page, an LMCache object) under their own keys.  The
    name is the plan's (at most 63 bytes); the model identity belongs in the
    namespace (namespace_id)."""
    model = Model(name, tokens, [dict(name="value", tokens_per_block=tokens, layers=1, page_bytes=value_bytes)])
    return Plan(model, blocks_per_chunk=1)


class TenantKeys:
    """Chunk keys of an engine's own identifiers, per tenant (the SGLang and
    LMCache back ends): each tenant's namespace (namespace_id of plan and
    desc with the tenant) and its part in cascade (Cascade.tenant_part),
    kept for the tenants seen (cleared past 4096: tenants come and go); the
    keys come tagged with the part."""

    def __init__(self, cascade: "Cascade", plan: Plan, **desc: Any) -> None:
        self.cascade, self.plan, self.desc = cascade, plan, desc
        self._of: dict[Optional[str], tuple[int, int]] = {}   # tenant -> (namespace, part)

    def __call__(self, tenant: Optional[str], ids: Any) -> np.ndarray:
        got = self._of.get(tenant)
        if got is None:
            if len(self._of) > 4096:
                self._of.clear()
            got = self._of[tenant] = (namespace_id(self.plan, tenant=tenant, **self.desc),
                                      self.cascade.tenant_part(tenant))
        out = namespace_keys(got[0], ids)
        if got[1]:
            out["tenant"] = got[1]
        return out


def tenant_file_configs(file: Optional[dict[str, Any]], tenant_file_bytes: Any) -> dict[str, dict[str, Any]]:
    """The file tiers of tenants' own file parts ({label: bytes}, labels as
    tenant_label gives them): FileTier arguments as `file` (the shared tier's)
    with root <root>/tenants/<label> and the tenant's quota.  {} for none."""
    from .tenants import check_label   # (tenants imports this module)
    if not tenant_file_bytes:
        return {}
    if not isinstance(tenant_file_bytes, dict):
        raise TypeError(f"tenant_file_bytes must be a dict of tenant labels and bytes, not "
                        f"{type(tenant_file_bytes).__name__}")
    if file is None:
        raise KvoError(L.KVO_EINVAL, "tenant_file_bytes needs a file tier (its root) beside the tenants' own",
                       "tenant_file_bytes")
    return {check_label(label, "tenant_file_bytes"):
            {**file, "root": os.path.join(str(file["root"]), "tenants", label), "quota_bytes": int(float(n))}
            for label, n in tenant_file_bytes.items()}


def engine_cascade(plan: Plan, file: Optional[dict[str, Any]] = None, remote: Optional[dict[str, Any]] = None,
                   tenant_files: Optional[dict[str, dict[str, Any]]] = None, **cascade: Any) -> "Cascade":
    """A Cascade with no host tier (the engine's own host memory is its host
    tier: SGLang, LMCache, vLLM's secondary tiers) over the tiers it makes
    and owns: FileTier(plan=plan, **file) and RemoteTier(plan=plan, **remote)
    (None: no such tier), and each tenant's own file tier,
    FileTier(plan=plan, **tenant_files[label]) (tenant_file_configs);
    cascade: Cascade's keyword arguments.  close() closes the tiers after
    the cascade (close(flush_ms) flushes first).  The tiers: .file_tier,
    .remote_tier, .tenant_file_tiers."""
    if file is None and remote is None:
        raise KvoError(L.KVO_EINVAL, "engine_cascade: give a file tier, a remote tier, or both", "engine_cascade")
    made: list[Any] = []
    try:
        ft = FileTier(plan=plan, **file) if file is not None else None
        if ft is not None:
            made.append(ft)
        rt = RemoteTier(plan=plan, **remote) if remote is not None else None
        if rt is not None:
            made.append(rt)
        tfs = {}
        for label, cfg in (tenant_files or {}).items():
            tfs[label] = FileTier(plan=plan, **cfg)
            made.append(tfs[label])
        c = Cascade(plan, 0, file_tier=ft, remote_tier=rt, tenant_file_tiers=tfs or None, **cascade)
    except BaseException:
        for t in made:
            t.close()
        raise
    c._owned = made
    return c


class _HostStore(Store):
    """A cascade's host store, borrowed: never destroyed here (the
    cascade's destroy frees it and clears _h first)."""

    def __init__(self, h: int, plan: Plan) -> None:
        self._h = h
        self.plan = plan

    def _release(self, h: int) -> None:
        pass


class _Router:
    """The completions of one cascade for threads that each wait for their
    own (Cascade.read_wait): user data from one counter; one waiting thread
    at a time polls and files every completion by its user data, the
    others sleep on the condition until theirs are in."""

    def __init__(self, c: "Cascade") -> None:
        self.c = c
        self.cv = threading.Condition()
        self.next = itertools.count(1)
        self.done: dict[int, int] = {}
        self.mine: set[int] = set()   # user data waited for (other completions are dropped)
        self.polling = False

    def ids(self, n: int) -> np.ndarray:
        with self.cv:
            out = np.array([next(self.next) for _ in range(n)], dtype=np.uint64)
            self.mine.update(out.tolist())
        return out

    def forget(self, ids: np.ndarray) -> None:
        """User data that will get no completion (the call refused the key)."""
        with self.cv:
            self.mine.difference_update(ids.tolist())

    def settle(self, ids: np.ndarray, res: np.ndarray) -> np.ndarray:
        """res, a call's per-key results for user data ids, with each key
        the call queued (0) replaced by its completion's result; the ids it
        refused are forgotten."""
        self.forget(ids[res != 0])
        queued = ids[res == 0]
        if len(queued):
            res[res == 0] = self.wait(queued)
        return res

    def wait(self, ids: np.ndarray) -> np.ndarray:
        """The results of the completions with these user data, in order."""
        want = ids.tolist()
        with self.cv:
            while True:
                if all(i in self.done for i in want):
                    out = np.array([self.done.pop(i) for i in want], dtype=np.int32)
                    self.mine.difference_update(want)
                    return out
                if self.polling:
                    self.cv.wait(0.05)
                    continue
                self.polling = True
                self.cv.release()
                try:
                    self.c.wait_events(50)
                    comps = self.c.poll(1024)
                finally:
                    self.cv.acquire()
                    self.polling = False
                for ud, r in zip(comps["user_data"].tolist(), comps["result"].tolist()):
                    if ud in self.mine:
                        self.done[ud] = r
                self.cv.notify_all()


class Cascade(_Handle):
    """The host tier (host_bytes of slots; 0 for none) and the given lower
    tiers, as one object (kvo_cascade_create).  The tiers are borrowed: close
    the Cascade before them.  arena: an Arena or SharedArena whose slot space
    holds the host tier (and the staging area after it); None: the cascade
    maps its own."""

    _destroy = "kvo_cascade_destroy"

    def __init__(self, plan: Plan, host_bytes: int = 0, *, file_tier: Optional[FileTier] = None,
                 remote_tier: Optional[RemoteTier] = None, arena: Any = None, staging_bytes: int = 0,
                 policy: str = "lru", admit_after: int = 0, event_capacity: int = 0,
                 ignore_present: bool = False, lookups_per_key: bool = False, verify_checksums: bool = False,
                 file_mode: str = "write_through", file_zero_copy: bool = False,
                 remote_lookup_budget_us: Optional[int] = None, remote_exists_ttl_ms: Optional[int] = None,
                 retry_polls: Optional[int] = None, prefault: bool = True,
                 tenant_host_bytes: Optional[dict[str, int]] = None,
                 tenant_file_tiers: Optional[dict[str, FileTier]] = None) -> None:
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a Plan, not {type(plan).__name__}")
        if file_mode not in FILE_MODES:
            raise KvoError(L.KVO_EINVAL, f"file_mode '{file_mode}': use write_through or write_back", "Cascade")
        p = lib.kvo_cascade_default_params()
        p.plan = plan._h
        set_fields(p, host_bytes=host_bytes, staging_bytes=staging_bytes, admit_after=admit_after,
                   event_capacity=event_capacity)
        p.policy = _policy(policy)
        p.ignore_present, p.lookups_per_key, p.verify_checksums = ignore_present, lookups_per_key, verify_checksums
        p.file_mode, p.file_zero_copy, p.prefault = FILE_MODES[file_mode], file_zero_copy, prefault
        for name, v in (("remote_lookup_budget_us", remote_lookup_budget_us),
                        ("remote_exists_ttl_ms", remote_exists_ttl_ms), ("retry_polls", retry_polls)):
            if v is not None:
                set_fields(p, **{name: v})
        inner = getattr(arena, "_arena", arena)  # a SharedArena wraps an Arena
        if inner is not None:
            if not isinstance(inner, Arena):
                raise TypeError(f"arena must be an Arena or SharedArena, not {type(arena).__name__}")
            p.arena = inner._h
        if file_tier is not None:
            p.file_tier = file_tier._h
        if remote_tier is not None:
            p.remote_tier = remote_tier._h
        parts = tenant_parts(tenant_host_bytes, tenant_file_tiers)
        if parts is not None:
            p.tenants, p.n_tenants = ctypes.addressof(parts), len(parts)
        h = c_void_p()
        check(lib.kvo_cascade_create(byref(p), byref(h)), "kvo_cascade_create")
        self._h: Optional[int] = h.value
        # keep what the C object borrows alive as long as it
        self.plan, self.file_tier, self.remote_tier, self.arena = plan, file_tier, remote_tier, arena
        self.tenant_file_tiers = dict(tenant_file_tiers or {})
        a = lib.kvo_cascade_arena(self._h)
        self.base: int = lib.kvo_arena_base(a) if a else 0
        self.host_bytes, self.staging_bytes = host_bytes, staging_bytes
        self._host: Optional[_HostStore] = None
        self._router = _Router(self)
        self._owned: list[Any] = []   # tiers closed with the cascade (engine_cascade)

    def _release(self, h: int) -> None:
        if self._host is not None:  # the borrowed store goes with the cascade
            self._host._h = None
        lib.kvo_cascade_destroy(h)
        for t in self._owned:   # after the cascade: it borrowed them
            t.close()
        self._owned = []

    def close(self, flush_ms: Optional[float] = None) -> None:
        """Destroy the cascade (waiting for the reads and lent writes still
        touching memory), then close the tiers it owns (engine_cascade).
        flush_ms: flush first, up to that long (the tiers' queued writes
        land; a timeout is no error)."""
        if flush_ms is not None and self._h:
            try:
                self.flush(flush_ms)
            except KvoError:
                pass
        super().close()

    def tenant_part(self, salt: Union[None, str, bytes]) -> int:
        """The host-tier part of the tenant whose cache salt is salt
        (kvo_cascade_tenant_part): its index when tenant_host_bytes gave
        its label one, else 0 (shared).  Tag every key of the tenant with it
        (KEY_DTYPE's "tenant" field) before any call."""
        b = _bytes("salt", salt) or b""
        part = c_uint32(0)
        check(lib.kvo_cascade_tenant_part(self._h, b or None, len(b), byref(part)), "kvo_cascade_tenant_part")
        return part.value

    def host_store(self) -> Store:
        """The host tier's store (kvo_cascade_store), borrowed: its reads
        (stats, lookup, peek ...) answer for the host tier; it closes with
        the cascade.  KVO_EINVAL without a host tier."""
        if self._host is None:
            h = lib.kvo_cascade_store(self._h)
            if not h:
                raise KvoError(L.KVO_EINVAL, "the cascade has no host tier (host_bytes 0)", "Cascade.host_store")
            self._host = _HostStore(h, self.plan)
        return self._host

    # -- lookup and promotion
    def lookup(self, keys: np.ndarray, flags: int = PREFIX, wait: Optional[CascadeWait] = None,
               wait_ms: float = 0) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(states, tiers, result) of keys: states MISS/READY/PENDING, tiers
        TIER_*; result: prefix, prefix_if_pending, host, file, remote,
        promoting, remote_pending.  flags: PREFIX, PROMOTE.  wait: a
        CascadeWait kept per request (the cluster's answers count as PENDING
        within its budget); wait_ms: wait that long for them here."""
        keys = _as_keys(keys)
        n = len(keys)
        st = np.empty(n, dtype=np.uint8)
        tiers = np.empty(n, dtype=np.uint8)
        r = CascadeLookupResult()
        check(lib.kvo_cascade_lookup(self._h, _ptr(keys), n, check_int("flags", flags, 0, 3),
                                     byref(wait) if wait is not None else None, int(wait_ms * 1_000_000), _ptr(st),
                                     _ptr(tiers), byref(r)), "kvo_cascade_lookup")
        return st, tiers, {f: getattr(r, f) for f, _ in r._fields_}

    def promote(self, keys: np.ndarray, tiers: Optional[np.ndarray] = None,
                user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Start promoting lower-tier keys into host slots; per key: 0 (one
        completion follows), KVO_EEXIST, KVO_ENOTFOUND, KVO_ENOSPC, KVO_EAGAIN."""
        keys = _as_keys(keys)
        n = len(keys)
        t = np.ascontiguousarray(tiers, dtype=np.uint8) if tiers is not None else None
        if t is not None and len(t) != n:
            raise ValueError(f"promote: {len(t)} tiers for {n} keys")
        ud = _uint64s("promote", "user_data", user_data, n) if user_data is not None else None
        res = np.empty(n, dtype=np.int32)
        check(lib.kvo_cascade_promote(self._h, _ptr(keys), n, _ptr(t) if t is not None else None,
                                      _ptr(ud) if ud is not None else None, _ptr(res)), "kvo_cascade_promote")
        return res

    # -- host tier
    def prepare_store(self, keys: np.ndarray, all_or_nothing: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(need, slots): need SKIP / HOST / STAGED / REFUSED per key; slots
        (SLOT_DTYPE) as arena offsets of the keys to write."""
        keys = _as_keys(keys)
        n = len(keys)
        need = np.empty(n, dtype=np.uint8)
        slots = np.empty(n, dtype=SLOT_DTYPE)
        check(lib.kvo_cascade_prepare_store(self._h, _ptr(keys), n, ALL_OR_NOTHING if all_or_nothing else 0,
                                            _ptr(need), _ptr(slots)), "kvo_cascade_prepare_store")
        return need, slots

    def complete_store(self, keys: np.ndarray, ok: bool = True) -> None:
        keys = _as_keys(keys)
        check(lib.kvo_cascade_complete_store(self._h, _ptr(keys), len(keys), ok), "kvo_cascade_complete_store")

    def pending_slots(self, keys: np.ndarray) -> np.ndarray:
        """The slots (SLOT_DTYPE, arena offsets) of keys prepare_store
        reserved and nothing completed yet; bytes 0 for other keys."""
        keys = _as_keys(keys)
        slots = np.empty(len(keys), dtype=SLOT_DTYPE)
        if len(keys):
            check(lib.kvo_cascade_pending_slots(self._h, _ptr(keys), len(keys), _ptr(slots)),
                  "kvo_cascade_pending_slots")
        return slots

    def prepare_load(self, keys: np.ndarray) -> np.ndarray:
        keys = _as_keys(keys)
        slots = np.empty(len(keys), dtype=SLOT_DTYPE)
        check(lib.kvo_cascade_prepare_load(self._h, _ptr(keys), len(keys), _ptr(slots)), "kvo_cascade_prepare_load")
        return slots

    def complete_load(self, keys: np.ndarray) -> None:
        keys = _as_keys(keys)
        check(lib.kvo_cascade_complete_load(self._h, _ptr(keys), len(keys)), "kvo_cascade_complete_load")

    def touch(self, keys: np.ndarray) -> None:
        keys = _as_keys(keys)
        check(lib.kvo_cascade_touch(self._h, _ptr(keys), len(keys)), "kvo_cascade_touch")

    def remove(self, keys: np.ndarray, user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Remove keys from every tier (host and file now, the cluster by a
        queued DEL); per key 0, KVO_ENOTFOUND or KVO_EAGAIN.  With user_data,
        each 0 is followed by one completion (op OP_REMOVE: 0 removed from
        some tier, KVO_ENOTFOUND held by none, KVO_EIO the cluster failed)."""
        keys = _as_keys(keys)
        n = len(keys)
        ud = _uint64s("remove", "user_data", user_data, n) if user_data is not None else None
        res = np.empty(n, dtype=np.int32)
        check(lib.kvo_cascade_remove(self._h, _ptr(keys), n, _ptr(ud) if ud is not None else None, _ptr(res)),
              "kvo_cascade_remove")
        return res

    def remove_wait(self, keys: np.ndarray) -> np.ndarray:
        """remove, then wait for the keys' completions: per key 0 (removed
        from some tier, the cluster's DEL included), KVO_ENOTFOUND (no tier
        held it) or why not (KVO_EIO: the cluster failed; it may still hold
        the key).  Thread rules as read_wait's."""
        keys = _as_keys(keys)
        ids = self._router.ids(len(keys))
        return self._router.settle(ids, self.remove(keys, ids))

    # -- the engine's own memory
    def read(self, keys: np.ndarray, dsts: Sequence[int], user_data: Optional[Sequence[int]] = None) -> np.ndarray:
        """Read keys from the lower tiers into addresses dsts (room for the
        group's slot_bytes each); per key 0 (a completion follows) or why not."""
        keys = _as_keys(keys)
        n = len(keys)
        d = _uint64s("read", "addresses", dsts, n)
        ud = _uint64s("read", "user_data", user_data, n) if user_data is not None else None
        res = np.empty(n, dtype=np.int32)
        check(lib.kvo_cascade_read(self._h, _ptr(keys), _ptr(d), n, _ptr(ud) if ud is not None else None,
                                   _ptr(res)), "kvo_cascade_read")
        return res

    def write(self, keys: np.ndarray, srcs: Sequence[int], timeout_ms: float = 0) -> np.ndarray:
        """Write chunks at addresses srcs to every lower tier (copied before
        this returns); waits out back-pressure up to timeout_ms; per key 0,
        KVO_EEXIST or why every tier refused."""
        keys = _as_keys(keys)
        n = len(keys)
        s = _uint64s("write", "addresses", srcs, n)
        res = np.empty(n, dtype=np.int32)
        check(lib.kvo_cascade_write(self._h, _ptr(keys), _ptr(s), n, int(timeout_ms * 1_000_000), _ptr(res)),
              "kvo_cascade_write")
        return res

    def write_async(self, keys: np.ndarray, srcs: Sequence[int], user_data: Sequence[int]) -> None:
        """Write chunks at addresses srcs to every lower tier; the memory is
        lent until each key's completion (op OP_WRITE, user_data[i]),
        refusals for back-pressure are retried at later polls."""
        keys = _as_keys(keys)
        n = len(keys)
        s = _uint64s("write_async", "addresses", srcs, n)
        ud = _uint64s("write_async", "user_data", user_data, n)
        check(lib.kvo_cascade_write_async(self._h, _ptr(keys), _ptr(s), n, _ptr(ud), None),
              "kvo_cascade_write_async")

    def read_wait(self, keys: np.ndarray, dsts: Sequence[int], timeout_ms: float = 30000) -> np.ndarray:
        """read, then wait for the keys' completions: per key 0 (dsts[i]
        holds the verified chunk) or why not.  Keys whose file write is
        still queued are read once more after the file tier's queue drained
        (up to timeout_ms).  A queued read is always waited for: its memory
        is written until its completion.  Any number of threads may call it
        at once (one of them polls for all, the others sleep until their
        completions are in); do not mix it with poll() on one cascade."""
        keys = _as_keys(keys)
        res = self._read_once(keys, dsts)
        miss = np.flatnonzero(res == L.KVO_ENOTFOUND)
        if len(miss) and self.file_tier is not None:
            st, tiers, _ = self.lookup(keys[miss], 0)
            again = miss[(st == PENDING) & (tiers == TIER_FILE)]
            if len(again):
                try:
                    self.flush(timeout_ms)
                except KvoError as e:
                    if e.code != L.KVO_ETIMEDOUT:
                        raise
                d = _uint64s("read_wait", "addresses", dsts, len(keys))
                res[again] = self._read_once(keys[again], d[again])
        return res

    def _read_once(self, keys: np.ndarray, dsts: Sequence[int]) -> np.ndarray:
        ids = self._router.ids(len(keys))
        return self._router.settle(ids, self.read(keys, dsts, ids))

    def held(self, keys: np.ndarray, prefix: bool = False, wait_ms: float = 0) -> np.ndarray:
        """Per key (bool): a read would find it: READY in some tier, or its
        file write still queued.  The cluster's answers are waited for up to
        wait_ms (an answer still out then counts as absent).  prefix: the
        keys are one chain (PREFIX): the ones after the first key no tier
        holds are False without asking."""
        st, tiers, _ = self.lookup(keys, PREFIX if prefix else 0, CascadeWait(), wait_ms)
        return (st == READY) | ((st == PENDING) & (tiers == TIER_FILE))

    def drain_events(self, cap: int = 4096) -> list[tuple[str, np.ndarray]]:
        """The host tier's events as (type, KEY_DTYPE array) runs, "stored" /
        "evicted" / "removed" (host_events, merged by type)."""
        ev = self.host_events(cap)
        names = {1: "stored", 2: "evicted", 3: "removed"}
        out: list[tuple[str, np.ndarray]] = []
        start = 0
        for i in range(1, len(ev) + 1):
            if i == len(ev) or ev["type"][i] != ev["type"][start]:
                out.append((names.get(int(ev["type"][start]), "?"), ev["key"][start:i].copy()))
                start = i
        return out

    # -- completions
    def poll(self, cap: int = 1024) -> np.ndarray:
        """Drive the cascade; up to cap completions (COMPLETION_DTYPE)."""
        out = np.empty(check_int("cap", cap, 0, 1 << 24), dtype=COMPLETION_DTYPE)
        n = c_size_t(0)
        check(lib.kvo_cascade_poll(self._h, _ptr(out) if cap else None, cap, byref(n)), "kvo_cascade_poll")
        return out[:n.value]

    def event_fd(self) -> int:
        return lib.kvo_cascade_event_fd(self._h)

    def wait_events(self, timeout_ms: float = -1) -> bool:
        """Whether poll has work (False: timed out)."""
        rc = lib.kvo_cascade_wait_events(self._h, -1 if timeout_ms < 0 else int(timeout_ms * 1_000_000))
        if rc not in (0, L.KVO_ETIMEDOUT):
            check(rc, "kvo_cascade_wait_events")
        return rc == 0

    def flush(self, timeout_ms: float = -1) -> None:
        check(lib.kvo_cascade_flush(self._h, -1 if timeout_ms < 0 else int(timeout_ms * 1_000_000)),
              "kvo_cascade_flush")

    def persist(self, timeout_ms: float = -1) -> int:
        n = c_uint64(0)
        check(lib.kvo_cascade_persist(self._h, -1 if timeout_ms < 0 else int(timeout_ms * 1_000_000), byref(n)),
              "kvo_cascade_persist")
        return n.value

    # -- control
    def set_tier_groups(self, tier: int, groups: int) -> None:
        check(lib.kvo_cascade_set_tier_groups(self._h, check_int("tier", tier, 0, 3),
                                              check_int("groups", groups, 0, (1 << 64) - 1)),
              "kvo_cascade_set_tier_groups")

    def invalidate(self, groups: int = (1 << 64) - 1) -> int:
        n = c_uint64(0)
        check(lib.kvo_cascade_invalidate(self._h, check_int("groups", groups, 0, (1 << 64) - 1), byref(n)),
              "kvo_cascade_invalidate")
        return n.value

    def host_events(self, cap: int = 4096) -> np.ndarray:
        """The host tier's pending store events (event_capacity > 0), oldest
        first, as records of (type, key): type 1 stored, 2 evicted, 3
        removed (kvo_store_event_type); one C call per cap events."""
        dt = np.dtype([("type", "<u4"), ("pad", "<u4"), ("key", KEY_DTYPE)])
        assert dt.itemsize == ctypes.sizeof(L.StoreEvent), "kvo_store_event's layout changed"
        parts = []
        buf = np.empty(check_int("cap", cap, 1, 1 << 24), dtype=dt)
        while lib.kvo_cascade_store(self._h):
            n = lib.kvo_cascade_drain_events(self._h, _ptr(buf), cap, None)
            parts.append(buf[:n].copy())
            if n < cap:
                break
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dt)

    def host_stats(self) -> dict[str, Any]:
        """The host tier's store statistics over every tenant part
        (kvo_cascade_host_stats: bytes_used, entries, evictions ...); {}
        without a host tier."""
        if not lib.kvo_cascade_store(self._h):
            return {}
        st = _stats(L.StoreStats)
        check(lib.kvo_cascade_host_stats(self._h, byref(st)), "kvo_cascade_host_stats")
        return {n: getattr(st, n) for n in L._STORE_STATS}

    def stats(self) -> dict[str, Any]:
        """Counters: host / file / remote (per tier) and the cascade's own."""
        s = _stats(CascadeStats)
        check(lib.kvo_cascade_get_stats(self._h, byref(s)), "kvo_cascade_get_stats")
        out: dict[str, Any] = {t: {f: getattr(getattr(s, t), f) for f in _TIER_STATS}
                               for t in ("host", "file", "remote")}
        out.update({f: getattr(s, f) for f in _CASCADE_STATS})
        return out


__all__ = ["Cascade", "CascadeWait", "engine_cascade", "namespace_id", "namespace_keys", "layout_of", "value_plan",
           "COMPLETION_DTYPE", "TIER_NONE", "TIER_HOST", "TIER_FILE", "TIER_REMOTE", "TIER_NAMES", "PREFIX", "PROMOTE",
           "SKIP", "HOST", "STAGED", "REFUSED", "OP_PROMOTE", "OP_READ", "OP_WRITE", "OP_REMOVE"]
