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
the batches over one kvoffload TierSet (file tier and/or Redis Cluster).

Values.  LMCache objects of one deployment have one size (a chunk of
tokens; a last, partial chunk is smaller).  kvoffload tiers store fixed-size
values, so every object is stored as one value of 16 + object_bytes bytes: a
16-byte header (magic, the object's length) then its bytes.  A get whose
buffer length differs from the stored length is a miss, so a value is
byte-exact or a miss (the tiers verify checksums, key and namespace on every
read).  object_bytes comes from adapter_params, else from the first object
stored (written to ROOT/kvoffload-lmcache.json so a restart finds the values
again; without a file tier and without object_bytes, lookups before the first
store are misses).

Keys are LMCache's strings (model@kv_rank@object_group@chunk_hash[@salt]),
hashed with BLAKE2b-128; the namespace (plan fingerprint and layout hash)
covers object_bytes and the key format version.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import queue
import struct
import threading
from typing import Any, List, Optional

import numpy as np

from ._tierset import TierSet, layout_hash, string_keys, value_plan
from .core import Arena, warn_if_url_has_password

HEADER = struct.Struct("<8sQ")
MAGIC = b"KVOLMC01"
META = "kvoffload-lmcache.json"


def _addr(mv: Any) -> tuple[int, int]:
    """(address, length) of a buffer (memoryview, bytearray, numpy ...)."""
    a = np.frombuffer(mv, dtype=np.uint8)
    return a.ctypes.data, a.nbytes


class KvoffloadL2Connector:
    """LMCache native_plugin connector over kvoffload's tiers.

    adapter_params (all optional, at least one tier): file_root, file_bytes
    (quota, default 64 GiB), redis_url (or KVO_REDIS_URL), redis_prefix
    (default "kvo"), redis_ttl_s, object_bytes, workers (threads running
    batches, default 2), batch (values per staging area, default 64),
    io_threads, timeout_s (default 30)."""

    def __init__(self, file_root: Optional[str] = None, file_bytes: float = 64 << 30,
                 redis_url: Optional[str] = None, redis_prefix: str = "kvo", redis_ttl_s: int = 0,
                 object_bytes: int = 0, workers: int = 2, batch: int = 64, io_threads: int = 0,
                 timeout_s: float = 30.0, model_name: str = "lmcache") -> None:
        self.file_root = file_root
        self.file_bytes = int(float(file_bytes))
        self.redis_url = redis_url or os.environ.get("KVO_REDIS_URL")
        if redis_url:  # LMCache logs its configuration, adapter_params included
            warn_if_url_has_password(str(redis_url), "redis_url")
        if not self.file_root and not self.redis_url:
            raise ValueError("kvoffload.lmcache: give adapter_params file_root (a directory) and/or redis_url "
                             "(redis://host:port[,host:port])")
        self.redis_prefix, self.redis_ttl_s = redis_prefix, int(redis_ttl_s)
        self.io_threads, self.timeout_s, self.model_name = int(io_threads), float(timeout_s), model_name
        self.batch = max(1, int(batch))
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ids = itertools.count(1)
        self._done: list[tuple[int, bool, str, Optional[List[bool]]]] = []
        self._done_lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._tiers: Optional[TierSet] = None
        self.object_bytes = int(object_bytes) or self._meta_object_bytes()
        if self.object_bytes:
            self._open(self.object_bytes)
        self._q: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._closed = False
        self._workers = [threading.Thread(target=self._work, name=f"kvo-lmcache-{i}", daemon=True)
                         for i in range(max(1, int(workers)))]
        for t in self._workers:
            t.start()

    # -- tiers
    def _meta_object_bytes(self) -> int:
        if not self.file_root:
            return 0
        try:
            with open(os.path.join(self.file_root, META)) as f:
                return int(json.load(f)["object_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _open(self, object_bytes: int) -> TierSet:
        with self._open_lock:
            if self._tiers is not None:
                return self._tiers
            value = HEADER.size + object_bytes
            plan = value_plan(f"lmcache:{self.model_name}", value)
            lh = layout_hash("lmcache-native-plugin", 1, object_bytes)
            self._tiers = TierSet(plan, file_root=self.file_root, file_bytes=self.file_bytes,
                                  redis_url=self.redis_url, redis_prefix=self.redis_prefix, layout=lh,
                                  io_threads=self.io_threads, timeout_s=self.timeout_s,
                                  redis_ttl_s=self.redis_ttl_s)
            self.object_bytes = object_bytes
            if self.file_root and not self._meta_object_bytes():
                tmp = os.path.join(self.file_root, f".{META}.{os.getpid()}")
                with open(tmp, "w") as f:
                    json.dump({"format": "kvoffload-lmcache", "object_bytes": object_bytes}, f)
                os.replace(tmp, os.path.join(self.file_root, META))
            return self._tiers

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
        if self._tiers is not None:
            self._tiers.close()
            self._tiers = None
        os.close(self._efd)

    # -- statistics for tests and benchmarks
    def flush(self) -> None:
        if self._tiers is not None:
            self._tiers.flush(self.timeout_s)

    def stats(self) -> dict[str, Any]:
        return self._tiers.stats() if self._tiers is not None else {}

    # -- workers
    def _complete(self, fid: int, ok: bool, err: str, res: Optional[List[bool]]) -> None:
        with self._done_lock:
            self._done.append((fid, ok, err, res))
        os.eventfd_write(self._efd, 1)

    def _work(self) -> None:
        stage: Optional[Arena] = None
        while True:
            item = self._q.get()
            if item is None:
                break
            fid, op, keys, bufs = item
            try:
                if op == "exists":
                    res = self._exists(keys)
                elif op == "delete":
                    res = self._delete(keys)
                else:
                    if stage is None:
                        size = max((_addr(b)[1] for b in bufs), default=0)
                        tiers = self._tiers or (self._open(size) if op == "set" and size else None)
                        if tiers is None:
                            self._complete(fid, True, "", [False] * len(keys))
                            continue
                        stage = Arena(self.batch * tiers.read_bytes, prefault=False)
                    res = self._set(keys, bufs, stage) if op == "set" else self._get(keys, bufs, stage)
                self._complete(fid, True, "", res)
            except Exception as e:  # an engine thread must not die: report the batch failed
                self._complete(fid, False, f"{type(e).__name__}: {e}", [False] * len(keys))
        if stage is not None:
            stage.close()

    def _exists(self, keys: List[str]) -> List[bool]:
        if self._tiers is None:
            return [False] * len(keys)
        return self._tiers.exists(string_keys(keys)).tolist()

    def _delete(self, keys: List[str]) -> List[bool]:
        if self._tiers is None:
            return [False] * len(keys)
        kk = string_keys(keys)
        self._tiers.remove(kk)
        return (~self._tiers.exists(kk)).tolist()

    def _set(self, keys: List[str], bufs: list, stage: Arena) -> List[bool]:
        tiers = self._tiers
        assert tiers is not None
        out = [False] * len(keys)
        slot = tiers.read_bytes
        for s in range(0, len(keys), self.batch):
            idx, srcs = [], []
            for j, i in enumerate(range(s, min(s + self.batch, len(keys)))):
                addr, n = _addr(bufs[i])
                if n > self.object_bytes:
                    continue  # larger than the values of this store: not stored (a miss later)
                dst = stage.base + j * slot
                ctypes.memmove(dst, HEADER.pack(MAGIC, n), HEADER.size)
                ctypes.memmove(dst + HEADER.size, addr, n)
                idx.append(i)
                srcs.append(dst)
            if idx:
                ok = tiers.write(string_keys([keys[i] for i in idx]), srcs)
                for i, good in zip(idx, ok):
                    out[i] = bool(good)
        return out

    def _get(self, keys: List[str], bufs: list, stage: Arena) -> List[bool]:
        tiers = self._tiers
        assert tiers is not None
        out = [False] * len(keys)
        slot = tiers.read_bytes
        for s in range(0, len(keys), self.batch):
            m = min(self.batch, len(keys) - s)
            ok = tiers.read(string_keys(keys[s: s + m]), [stage.base + j * slot for j in range(m)])
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
