"""The tiers behind the engine back ends (kvoffload.sglang, kvoffload.lmcache).

An engine back end stores fixed-size values under string keys.  This module
turns that into kvoffload's tiers:

 - TierSet: one group of one plan (one value size) over an optional file tier
   (FileTier) and an optional Redis Cluster tier (RemoteTier).  Writes go to
   both; exists asks the file tier's index first and the cluster only for
   keys the file tier does not hold; reads try the file tier, then the
   cluster.  Every read is verified by the tier (checksum, key, namespace):
   a value is byte-exact or a miss, never wrong bytes.
 - string_keys: engine key strings as 128-bit chunk keys (BLAKE2b of a salt
   and the key), so one engine's keys are spread evenly over the cluster and
   a salt (pool, rank) keeps values of different shards apart.
 - Completions of one tier may be waited for by several threads at once (the
   engines read and write from different threads): _Waiter routes them by
   user_data, one poller at a time, the others sleeping on a condition.

Namespaces: the plan's fingerprint (model name and the value's geometry) and
a layout hash the caller computes (engine, layout, dtype, rank...) name the
file tier's directory and the cluster's key prefix, so values written with
another layout are never found.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from . import _lib as L
from .core import KEY_DTYPE, PENDING, READY, FileTier, KvoError, Model, Plan, RemoteTier, make_keys


def layout_hash(*parts: Any) -> int:
    """A 64-bit hash (nonzero) of the repr of parts: the namespace of values
    whose bytes depend on them."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") or 1


def string_keys(keys: Sequence[str], salt: bytes = b"") -> np.ndarray:
    """KEY_DTYPE keys (group 0) of engine key strings: BLAKE2b-128 of salt
    and the key."""
    out = np.zeros(len(keys), dtype=KEY_DTYPE)
    if not keys:
        return out
    mac = hashlib.blake2b(salt, digest_size=32).digest()
    raw = b"".join(hashlib.blake2b(k.encode() if isinstance(k, str) else bytes(k), digest_size=16,
                                   key=mac).digest() for k in keys)
    pairs = np.frombuffer(raw, dtype="<u8").reshape(len(keys), 2)
    out["lo"], out["hi"] = pairs[:, 0], pairs[:, 1]
    return out


def value_plan(name: str, value_bytes: int, tokens: int = 1) -> Plan:
    """A one-group plan whose chunks are value_bytes long (one block)."""
    model = Model(name, tokens, [dict(name="value", tokens_per_block=tokens, layers=1, page_bytes=value_bytes)])
    return Plan(model, blocks_per_chunk=1)


class _Waiter:
    """Completion routing for one tier shared by threads: wait(ids) returns
    {user_data: result} for the ids it was given."""

    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.cv = threading.Condition()
        self.done: dict[int, int] = {}
        self.polling = False

    def wait(self, ids: Sequence[int], timeout_s: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        want = set(ids)
        with self.cv:
            while True:
                if want.issubset(self.done.keys()):
                    return {i: self.done.pop(i) for i in want}
                left = deadline - time.monotonic()
                if left <= 0:
                    # what did not answer in time is a miss; its late completion is dropped
                    got = {i: self.done.pop(i) for i in want if i in self.done}
                    return {i: got.get(i, L.KVO_ETIMEDOUT) for i in want}
                if self.polling:
                    self.cv.wait(min(left, 0.05))
                    continue
                self.polling = True
                self.cv.release()
                comps: list[dict[str, Any]] = []
                try:
                    self.tier.wait(int(min(left, 0.05) * 1000) or 1)
                    comps = self.tier.poll(1024)
                finally:
                    self.cv.acquire()
                    self.polling = False
                for c in comps:
                    self.done[c["user_data"]] = c["result"]
                self.cv.notify_all()
                # late completions of timed-out waits would pile up: keep the map bounded
                if len(self.done) > 1 << 16:
                    self.done.clear()


class TierSet:
    """Fixed-size values of one plan group in a file tier and/or a Redis
    Cluster.  Addresses given to write/read are raw pointers: write's are
    copied before it returns; read's must have room for read_bytes (the
    file tier reads whole slots) and stay valid until read returns."""

    _ids = itertools.count(1)

    def __init__(self, plan: Plan, *, file_root: Optional[str] = None, file_bytes: int = 0,
                 redis_url: Optional[str] = None, redis_prefix: str = "kvo", layout: int = 0,
                 io_threads: int = 0, timeout_s: float = 30.0, redis_ttl_s: int = 0) -> None:
        if not file_root and not redis_url:
            raise ValueError("kvoffload: configure a file tier (file root) or a Redis Cluster (URL), or both")
        self.plan = plan
        g = plan.groups[0]
        self.chunk_bytes: int = g["chunk_bytes"]
        self.slot_bytes: int = g["slot_bytes"]
        self.timeout_s = timeout_s
        self.file: Optional[FileTier] = None
        self.remote: Optional[RemoteTier] = None
        try:
            if file_root:
                os.makedirs(file_root, exist_ok=True)
                if file_bytes < self.slot_bytes:
                    raise ValueError(f"kvoffload: file tier quota {file_bytes} bytes holds no value of "
                                     f"{self.slot_bytes} bytes on disk; give at least that")
                self.file = FileTier(file_root, plan, file_bytes, io_threads=io_threads, layout_hash=layout)
                self._fw = _Waiter(self.file)
            if redis_url:
                self.remote = RemoteTier(redis_url, plan, key_prefix=redis_prefix, layout_hash=layout,
                                         io_threads=io_threads, ttl_s=redis_ttl_s)
                self._rw = _Waiter(self.remote)
        except Exception:
            self.close()
            raise
        # the file tier reads the zero padding of a slot too
        self.read_bytes = self.slot_bytes if self.file is not None else self.chunk_bytes

    # -- queries
    def exists(self, keys: np.ndarray) -> np.ndarray:
        """bool per key: the value can very probably be read (indexed or being
        written in the file tier, or present in the cluster)."""
        n = len(keys)
        have = np.zeros(n, dtype=bool)
        if n == 0:
            return have
        if self.file is not None:
            st = self.file.lookup(keys)
            have |= (st == READY) | (st == PENDING)
        if self.remote is not None and not have.all():
            ask = np.flatnonzero(~have)
            ids = [next(self._ids) for _ in ask]
            res = self.remote.exists(keys[ask], ids)
            queued = [i for i, r in zip(ids, res) if r == 0]
            got = self._rw.wait(queued, self.timeout_s) if queued else {}
            for j, i, r in zip(ask, ids, res):
                have[j] = r == 0 and got.get(i) == 0
        return have

    # -- writes
    def write(self, keys: np.ndarray, srcs: Sequence[int]) -> np.ndarray:
        """bool per key: accepted (queued or already stored) by some tier."""
        ok = np.zeros(len(keys), dtype=bool)
        if len(keys) == 0:
            return ok
        srcs = np.asarray(srcs, dtype=np.uintp)
        for tier, call in ((self.file, "write"), (self.remote, "put")):
            if tier is not None:
                ok |= self._queue(tier, call, keys, srcs)
        return ok

    def _queue(self, tier: Any, call: str, keys: np.ndarray, srcs: np.ndarray) -> np.ndarray:
        """Queue writes; a batch larger than the tier's staging room is
        dropped in part (KVO_EAGAIN): wait for the queue to drain and queue
        the rest, so the engine's writer thread carries the back-pressure
        instead of losing pages (until timeout_s)."""
        todo = np.arange(len(keys))
        ok = np.zeros(len(keys), dtype=bool)
        deadline = time.monotonic() + self.timeout_s
        flushed = False
        while True:
            r = getattr(tier, call)(keys[todo], srcs[todo])
            ok[todo] = (r == 0) | (r == L.KVO_EEXIST)
            again = todo[r == L.KVO_EAGAIN]
            # stop when all went in, or an empty queue took none of them (a value larger than staging)
            if not len(again) or (flushed and len(again) == len(todo)) or time.monotonic() > deadline:
                return ok
            tier.flush(max(1, int((deadline - time.monotonic()) * 1000)))
            flushed, todo = True, again

    def flush(self, timeout_s: float = 30.0) -> None:
        if self.file is not None:
            self.file.flush(int(timeout_s * 1000))
        if self.remote is not None:
            self.remote.flush(int(timeout_s * 1000))

    # -- reads
    def read(self, keys: np.ndarray, dsts: Sequence[int]) -> np.ndarray:
        """Read values into dsts (room for read_bytes each); bool per key:
        dsts[i] holds the verified value.  File tier first (a write still
        pending is flushed once and read again), then the cluster."""
        n = len(keys)
        ok = np.zeros(n, dtype=bool)
        if n == 0:
            return ok
        dsts = np.asarray(dsts, dtype=np.uintp)
        todo = np.arange(n)
        if self.file is not None:
            for attempt in range(2):
                ids = [next(self._ids) for _ in todo]
                res = self.file.read(keys[todo], dsts[todo], ids)
                queued = [i for i, r in zip(ids, res) if r == 0]
                got = self._fw.wait(queued, self.timeout_s) if queued else {}
                for j, i, r in zip(todo, ids, res):
                    ok[j] = r == 0 and got.get(i) == 0
                pending = [j for j, r in zip(todo, res) if r == L.KVO_EAGAIN]
                if not pending or attempt:
                    break
                self.file.flush(int(self.timeout_s * 1000))
                todo = np.asarray(pending)
        if self.remote is not None and not ok.all():
            todo = np.flatnonzero(~ok)
            ids = [next(self._ids) for _ in todo]
            res = self.remote.get(keys[todo], dsts[todo], ids)
            queued = [i for i, r in zip(ids, res) if r == 0]
            got = self._rw.wait(queued, self.timeout_s) if queued else {}
            hit = []
            for j, i, r in zip(todo, ids, res):
                if r == 0 and got.get(i) == 0:
                    ok[j] = True
                    hit.append(j)
            if hit and self.file is not None:
                # keep what the cluster gave in the local file tier too
                self.file.write(keys[hit], dsts[hit])
        return ok

    def remove(self, keys: np.ndarray) -> None:
        """Drop values from the file tier (the cluster's LRU or TTL expires them)."""
        if self.file is not None and len(keys):
            try:
                self.file.remove(keys)
            except KvoError as e:
                if e.code != L.KVO_EBUSY:
                    raise

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.file is not None:
            out["file"] = self.file.stats()
        if self.remote is not None:
            out["remote"] = self.remote.stats()
        return out

    def close(self) -> None:
        for t in (self.file, self.remote):
            if t is not None:
                try:
                    t.flush(int(self.timeout_s * 1000))
                except KvoError:
                    pass
                t.close()
        self.file = self.remote = None


__all__ = ["TierSet", "layout_hash", "string_keys", "value_plan", "make_keys"]
