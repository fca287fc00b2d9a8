"""kvoffload as an L2 store of LMCache's multi-process server (lmcache 0.5.6).

LMCache's ``native_plugin`` L2 adapter loads a connector object and wraps it
in its NativeConnectorL2Adapter:

    {"type": "native_plugin", "module_path": "kvoffload.lmcache",
     "class_name": "KvoffloadL2Connector", "max_capacity_gb": 100,
     "adapter_params": {"file_root": "/var/cache/kvoffload", "file_bytes": 100e9,
                        "redis_url": "redis://10.0.0.5:7000", "object_bytes": 8388608}}

The connector (this module) has the shape LMCache asks for: event_fd(),
submit_batch_get(keys, memoryviews), submit_batch_set(keys, memoryviews),
submit_batch_exists(keys), submit_batch_delete(keys) each returning a
future id at once, drain_completions() returning (future_id, ok, error,
per-key bools) tuples and clearing the eventfd, close().  Worker threads run
the batches through one kvoffload Cascade with no host tier (LMCache's L1
is the host tier) over the file tier and the Redis Cluster tier: the cascade
owns the way through them (the file tier first, the cluster for what the
files lack, a value the cluster served kept in the files too, back-pressure
waited out).

Values.  LMCache objects of one deployment have one size (a chunk of
tokens; a last, partial chunk is smaller).  kvoffload tiers store fixed-size
values, so every object is stored as one value of 16 + object_bytes bytes: a
16-byte header (magic, the object's length) then its bytes.  A get whose
buffer length differs from the stored length is a miss, so a value is
byte-exact or a miss (the tiers verify checksums, key and namespace on every
read).  object_bytes comes from adapter_params; without it, the largest
object stored so far sets it: a larger object than any before reopens the
store at its size (the objects stored at the smaller size are no longer
found: a first partial object must not turn every full one away), recorded
in ROOT/kvoffload-lmcache.json so that a restart opens the same store.

Keys are LMCache's strings (model@kv_rank@object_group@chunk_hash[@salt]),
each hashed whole under the store's namespace (kvoffload.cascade: the value
size and format, and LMCache's salt as the tenant where a key has one).

Delete: the keys leave every tier, the cluster's by a DEL that is waited
for (Cascade.remove_wait).  A key is reported deleted when no tier holds it
afterwards: removed, or held by none; a DEL the cluster failed reports the
key not deleted (LMCache keeps counting it).
"""
from __future__ import annotations

import ctypes
import itertools
import json
import logging
import os
import queue
import struct
import threading
from typing import Any, List, Optional

import numpy as np

from . import _lib as L
from .cascade import Cascade, TenantKeys, engine_cascade, layout_of, namespace_id, tenant_file_configs, value_plan
from .core import KEY_DTYPE, Arena, warn_if_url_has_password
from .tenants import TenantCounters

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<8sQ")
MAGIC = b"KVOLMC01"
META = "kvoffload-lmcache.json"
FORMAT = ("lmcache-native-plugin", 2)
# Per tenant (kvoffload.tenants; LMCache's salt): objects asked about and
# found (exists), asked for and loaded (get), offered and stored (set).
TENANT_FIELDS = ("lookup_keys", "hit_keys", "get_keys", "loaded_keys", "set_keys", "stored_keys")
_TENANT_OPS = {"exists": ("lookup_keys", "hit_keys"), "get": ("get_keys", "loaded_keys"),
               "set": ("set_keys", "stored_keys")}


def _addr(mv: Any) -> tuple[int, int]:
    """(address, length) of a buffer (memoryview, bytearray, numpy ...)."""
    a = np.frombuffer(mv, dtype=np.uint8)
    return a.ctypes.data, a.nbytes


def _tenant(key: str) -> Optional[str]:
    """LMCache's salt (a fifth @-field) of a key, or None."""
    parts = key.split("@")
    return parts[4] if len(parts) > 4 else None


def _tenants(keys: List[str]) -> Optional[List[Optional[str]]]:
    """Each key's tenant (_tenant), or None when no key has a salt (one
    namespace, the common case, without splitting every key)."""
    if not any(k.count("@") > 3 for k in keys):
        return None
    return [_tenant(k) for k in keys]


class _Store:
    """The tiers of one object size: a plan, its namespaces, a Cascade over
    the file and cluster tiers.  users: batches running on it (a store
    replaced by a larger one closes when the last of them ends)."""

    def __init__(self, c: "KvoffloadL2Connector", object_bytes: int) -> None:
        self.object_bytes = object_bytes
        self.plan = value_plan("lmcache", HEADER.size + object_bytes)
        self.slot_bytes: int = self.plan.groups[0]["slot_bytes"]   # a read fills a whole slot
        self._desc = dict(engine="lmcache", model=c.model_name, extra=repr(FORMAT + (object_bytes,)))
        layout = layout_of(namespace_id(self.plan, **self._desc))
        self.users, self.retired = 0, False
        # the file tier shared: several LMCache servers (processes) may use one root
        file = dict(root=c.file_root, quota_bytes=c.file_bytes, io_threads=c.io_threads, shared=True,
                    layout_hash=layout) if c.file_root else None
        self.cascade: Optional[Cascade] = engine_cascade(
            self.plan, file=file, tenant_files=tenant_file_configs(file, c.tenant_file_bytes),
            remote=dict(url=c.redis_url, key_prefix=c.redis_prefix, layout_hash=layout, io_threads=c.io_threads,
                        ttl_s=c.redis_ttl_s) if c.redis_url else None)
        self.file, self.remote = self.cascade.file_tier, self.cascade.remote_tier
        self._keys = TenantKeys(self.cascade, self.plan, **self._desc)

    def keys(self, keys: List[str]) -> np.ndarray:
        """The chunk keys of LMCache's key strings (each under its tenant's namespace)."""
        tenants = _tenants(keys)
        if tenants is None:   # no salt: one namespace
            return self._keys(None, keys)
        out = np.zeros(len(keys), dtype=KEY_DTYPE)
        for t in set(tenants):
            idx = [i for i, x in enumerate(tenants) if x == t]
            out[idx] = self._keys(t, [keys[i] for i in idx])
        return out

    def close(self, timeout_ms: float) -> None:
        if self.cascade is not None:
            self.cascade.close(timeout_ms)
            self.cascade = None
        self.file = self.remote = None


class KvoffloadL2Connector:
    """LMCache native_plugin connector over kvoffload's tiers.

    adapter_params (all optional, at least one tier): file_root, file_bytes
    (quota, default 64 GiB), redis_url (or KVO_REDIS_URL), redis_prefix
    (default "kvo"), redis_ttl_s, object_bytes, workers (threads running
    batches, default 2), batch (values per staging area, default 64),
    io_threads, timeout_s (default 30), model_name (the deployment's model
    identity, part of the namespace; LMCache's keys name the model too),
    tenant_file_bytes ({label: bytes}: a file tier of a salt's own under
    file_root/tenants/<label>, its quota; docs/security.md "Tenants")."""

    def __init__(self, file_root: Optional[str] = None, file_bytes: float = 64 << 30,
                 redis_url: Optional[str] = None, redis_prefix: str = "kvo", redis_ttl_s: int = 0,
                 object_bytes: int = 0, workers: int = 2, batch: int = 64, io_threads: int = 0,
                 timeout_s: float = 30.0, model_name: str = "lmcache",
                 tenant_file_bytes: Optional[dict[str, float]] = None) -> None:
        self.file_root = file_root
        self.file_bytes = int(float(file_bytes))
        self.tenant_file_bytes = dict(tenant_file_bytes or {})
        self.redis_url = redis_url or os.environ.get("KVO_REDIS_URL")
        if redis_url:  # LMCache logs its configuration, adapter_params included
            warn_if_url_has_password(str(redis_url), "redis_url")
        if not self.file_root and not self.redis_url:
            raise ValueError("kvoffload.lmcache: give adapter_params file_root (a directory) and/or redis_url "
                             "(redis://host:port[,host:port])")
        self.redis_prefix, self.redis_ttl_s = redis_prefix, int(redis_ttl_s)
        self.io_threads, self.timeout_s, self.model_name = int(io_threads), float(timeout_s), str(model_name)
        self.batch = max(1, int(batch))
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ids = itertools.count(1)
        self._done: list[tuple[int, bool, str, Optional[List[bool]]]] = []
        self._done_lock = threading.Lock()
        self.tenants = TenantCounters(TENANT_FIELDS)
        self._open_lock = threading.Lock()
        self._store: Optional[_Store] = None
        self._fixed = bool(int(object_bytes))   # configured: never changes
        size = int(object_bytes) or self._meta_object_bytes()
        if size:
            self._store = _Store(self, size)
        self._q: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._closed = False
        self._workers = [threading.Thread(target=self._work, name=f"kvo-lmcache-{i}", daemon=True)
                         for i in range(max(1, int(workers)))]
        for t in self._workers:
            t.start()

    @property
    def object_bytes(self) -> int:
        """The objects' size of the store in use (0: none yet)."""
        st = self._store
        return st.object_bytes if st is not None else 0

    # -- the store of the objects' size
    def _meta_object_bytes(self) -> int:
        if not self.file_root:
            return 0
        try:
            with open(os.path.join(self.file_root, META)) as f:
                return int(json.load(f)["object_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _acquire(self, size: int = 0) -> Optional[_Store]:
        """The store for a batch (its users counted until _release); with
        size (a set without a configured object_bytes): one whose objects
        are at least size bytes, opened or grown to it."""
        with self._open_lock:
            st = self._store
            if size and not self._fixed and (st is None or st.object_bytes < size):
                new = _Store(self, size)
                if st is not None:
                    n = st.file.stats()["files"] if st.file is not None else 0
                    logger.warning("kvoffload.lmcache: an object of %d bytes, larger than the %d of the objects "
                                   "so far: the store now holds objects of %d bytes (give adapter_params "
                                   "object_bytes to fix the size); the %d files of the smaller size are no "
                                   "longer read", size, st.object_bytes, size, n)
                    st.retired = True
                    if not st.users:
                        st.close(self.timeout_s * 1000)
                self._store = st = new
                if self.file_root:
                    tmp = os.path.join(self.file_root, f".{META}.{os.getpid()}.{threading.get_ident()}")
                    with open(tmp, "w") as f:
                        json.dump({"format": "kvoffload-lmcache", "object_bytes": size}, f)
                    os.replace(tmp, os.path.join(self.file_root, META))
            if st is not None:
                st.users += 1
            return st

    def _release(self, st: Optional[_Store]) -> None:
        if st is None:
            return
        with self._open_lock:
            st.users -= 1
            last = st.retired and not st.users
        if last:
            st.close(self.timeout_s * 1000)

    # -- the native connector interface
    def event_fd(self) -> int:
        return self._efd

    def _submit(self, op: str, keys: List[str], bufs: Optional[list]) -> int:
        if self._closed:
            raise RuntimeError("kvoffload.lmcache: connector is closed")
        fid = next(self._ids)
        self._q.put((fid, op, list(keys), bufs))
        return fid

    def submit_batch_get(self, keys: List[str], memoryviews: list) -> int:
        return self._submit("get", keys, list(memoryviews))

    def submit_batch_set(self, keys: List[str], memoryviews: list) -> int:
        return self._submit("set", keys, list(memoryviews))

    def submit_batch_exists(self, keys: List[str]) -> int:
        return self._submit("exists", keys, None)

    def submit_batch_delete(self, keys: List[str]) -> int:
        return self._submit("delete", keys, None)

    def drain_completions(self) -> list[tuple[int, bool, str, Optional[List[bool]]]]:
        """Finished batches, oldest first; clears the eventfd (LMCache polls
        it and never reads it)."""
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._done_lock:
            out, self._done = self._done, []
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._workers:
            self._q.put(None)
        for t in self._workers:
            t.join(timeout=self.timeout_s)
        with self._open_lock:
            st, self._store = self._store, None
        if st is not None:
            st.close(self.timeout_s * 1000)
        os.close(self._efd)

    # -- statistics for tests and benchmarks
    def flush(self) -> None:
        st = self._store
        if st is not None and st.cascade is not None:
            st.cascade.flush(self.timeout_s * 1000)

    def stats(self) -> dict[str, Any]:
        """The counters of the store in use: its cascade, file tier and
        cluster tier; and "tenants": per tenant label (kvoffload.tenants,
        LMCache's salt) the TENANT_FIELDS counters."""
        st = self._store
        out: dict[str, Any] = {"tenants": self.tenants.snapshot()}
        if st is None or st.cascade is None:
            return out
        out.update(cascade=st.cascade.stats(), object_bytes=st.object_bytes)
        if st.file is not None:
            out["file"] = st.file.stats()
        if st.remote is not None:
            out["remote"] = st.remote.stats()
        return out

    # -- workers
    def _complete(self, fid: int, ok: bool, err: str, res: Optional[List[bool]]) -> None:
        with self._done_lock:
            self._done.append((fid, ok, err, res))
        os.eventfd_write(self._efd, 1)

    def _work(self) -> None:
        stages: dict[int, Arena] = {}   # staging memory by slot size
        while True:
            item = self._q.get()
            if item is None:
                break
            fid, op, keys, bufs = item
            st: Optional[_Store] = None
            try:
                st = self._acquire(max((_addr(b)[1] for b in bufs), default=0) if op == "set" else 0)
                if st is None:   # nothing stored yet: every key a miss
                    res = [False] * len(keys)
                elif op == "exists":
                    res = self._exists(st, keys)
                elif op == "delete":
                    res = self._delete(st, keys)
                else:
                    stage = stages.get(st.slot_bytes)
                    if stage is None:
                        for a in stages.values():
                            a.close()
                        stages = {st.slot_bytes: Arena(self.batch * st.slot_bytes, prefault=False)}
                        stage = stages[st.slot_bytes]
                    res = self._set(st, keys, bufs, stage) if op == "set" else self._get(st, keys, bufs, stage)
                self._count(op, keys, res)
                self._complete(fid, True, "", res)
            except Exception as e:  # an engine thread must not die: report the batch failed
                self._complete(fid, False, f"{type(e).__name__}: {e}", [False] * len(keys))
            finally:
                self._release(st)
        for a in stages.values():
            a.close()

    def _count(self, op: str, keys: List[str], res: List[bool]) -> None:
        """A batch's keys and successes, counted for each key's tenant."""
        fields = _TENANT_OPS.get(op)
        if fields is None:
            return
        per: dict[Optional[str], list[int]] = {}
        for t, r in zip(_tenants(keys) or [None] * len(keys), res):
            n = per.setdefault(t, [0, 0])
            n[0] += 1
            n[1] += bool(r)
        for t, (n, ok) in per.items():
            self.tenants.add(t, **{fields[0]: n, fields[1]: ok})

    def _exists(self, st: _Store, keys: List[str]) -> List[bool]:
        assert st.cascade is not None
        return st.cascade.held(st.keys(keys), wait_ms=self.timeout_s * 1000).tolist()

    def _delete(self, st: _Store, keys: List[str]) -> List[bool]:
        """Remove from every tier and wait for the cluster's DEL
        (Cascade.remove_wait); deleted = no tier holds the key any more."""
        assert st.cascade is not None
        res = st.cascade.remove_wait(st.keys(keys))
        return ((res == 0) | (res == L.KVO_ENOTFOUND)).tolist()

    def _set(self, st: _Store, keys: List[str], bufs: list, stage: Arena) -> List[bool]:
        assert st.cascade is not None
        out = [False] * len(keys)
        slot = st.slot_bytes
        for s in range(0, len(keys), self.batch):
            idx, srcs = [], []
            for j, i in enumerate(range(s, min(s + self.batch, len(keys)))):
                addr, n = _addr(bufs[i])
                if n > st.object_bytes:
                    continue  # larger than the configured object_bytes: not stored (a miss later)
                dst = stage.base + j * slot
                ctypes.memmove(dst, HEADER.pack(MAGIC, n), HEADER.size)
                ctypes.memmove(dst + HEADER.size, addr, n)
                idx.append(i)
                srcs.append(dst)
            if idx:
                r = st.cascade.write(st.keys([keys[i] for i in idx]), srcs, timeout_ms=self.timeout_s * 1000)
                for i, rc in zip(idx, r.tolist()):
                    out[i] = rc == 0 or rc == L.KVO_EEXIST
        return out

    def _get(self, st: _Store, keys: List[str], bufs: list, stage: Arena) -> List[bool]:
        assert st.cascade is not None
        out = [False] * len(keys)
        slot = st.slot_bytes
        for s in range(0, len(keys), self.batch):
            m = min(self.batch, len(keys) - s)
            ok = st.cascade.read_wait(st.keys(keys[s: s + m]), [stage.base + j * slot for j in range(m)],
                                      timeout_ms=self.timeout_s * 1000) == 0
            for j in range(m):
                if not ok[j]:
                    continue
                addr, n = _addr(bufs[s + j])
                magic, length = HEADER.unpack(ctypes.string_at(stage.base + j * slot, HEADER.size))
                if magic != MAGIC or length != n:
                    continue  # another object's size: a miss, never a short or long copy
                ctypes.memmove(addr, stage.base + j * slot + HEADER.size, n)
                out[s + j] = True
        return out


__all__ = ["KvoffloadL2Connector"]
