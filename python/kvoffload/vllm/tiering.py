"""kvoffload's file tier and Redis Cluster tier as secondary tiers of vLLM's
TieringOffloadingSpec (vllm.v1.kv_offload.tiering; vLLM 0.32 has it).

vLLM's tiering spec keeps its own CPU primary tier (the chunks in a shared
memory region, the GPU copies by vLLM's worker) and cascades every stored
chunk to each secondary tier, promoting a chunk back into the primary tier
when the primary misses and a secondary holds it.  A secondary tier sees
only primary-tier chunks: fixed-size rows of vLLM's memoryview
(primary_kv_view[c], row_stride bytes, one per OffloadKey).  The two tiers
here are kvoffload's own (kvoffload.core.FileTier and RemoteTier; one C call
per batch), not a second implementation:

  KvoffloadFileTier   files under root_dir, capacity-bounded (capacity_bytes,
                      evicted by eviction_policy: lru, arc or s3fifo), every
                      file checksummed and verified on read; shared=True lets
                      several engines use one directory.  vLLM's own "fs"
                      tier has no bound and never deletes.
  KvoffloadRedisTier  a Redis Cluster shared by a fleet (url
                      "redis://host:port,..."), values verified on every
                      read, expiring by ttl_s or the server's LRU.

Configuration (kv_connector_extra_config of the OffloadingConnector):

    {"spec_name": "TieringOffloadingSpec",
     "spec_module_path": "vllm.v1.kv_offload.tiering.spec",
     "cpu_bytes_to_use": 8 << 30,
     "secondary_tiers": [
        {"type": "KvoffloadFileTier", "module_path": "kvoffload.vllm.tiering",
         "root_dir": "/var/cache/kvo", "capacity_bytes": 100 << 30},
        {"type": "KvoffloadRedisTier", "module_path": "kvoffload.vllm.tiering",
         "url": "redis://10.0.0.5:7000,10.0.0.6:7000"}]}

Keys and namespaces: a chunk's kvoffload key is BLAKE2b-128 of its
OffloadKey (block hash and group); the files' directory and the cluster's
key prefix are namespaced by the value's size, the model's name and a hash
of everything that decides a row's bytes (world size, bytes per block, the
groups, blocks per chunk, tokens per hash, dtype, replicated and canonical
layout, the KV cache layout), so engines laid out differently never read
each other's values.

Byte-exact or miss: a store copies the row into the tier's staging memory
(the primary chunk is free when submit_store's job is reported done); a load
reads and verifies a value straight into the primary row, and a key whose
read fails (absent, evicted since the lookup, corrupt: the tier deletes it)
is reported failed (JobResult.successful_keys holds the others), so vLLM
recomputes it.  Stores that find the staging memory full (KVO_EAGAIN) are
retried on the next polls while vLLM keeps the rows pinned and the tier
still has writes in flight (up to store_retry_ms, 30000), then dropped (the
job fails; nothing wrong is stored).

vLLM's metrics: each JobResult carries transfer_bytes (payload moved) and
transfer_time (loads: from queueing to the last read's completion, the
tier's own latency_ns; stores: the copy out of the primary row), so vLLM's
kv_offload_tiering_{read,write}_{bytes,time} count them per tier.

Events (enable_kv_events, with vLLM's kv_events_config enabled): an
OffloadingEvent(removed=False) per batch of chunks that reached the tier
(written to a file / acknowledged by the cluster: the tiers' write
completions), with medium, locality and ownership (the tier type) where
this vLLM's OffloadingEvent has the fields.  No removal events: the file
quota and the cluster evict on their own (vLLM's fs tier sends none either).

Lookups: the file tier answers from its in-memory index (HIT, RETRY while a
write of the key is still queued, MISS).  The cluster is asked in batches:
a key not yet known answers RETRY and joins the step's batch, sent as one
EXISTS pipeline at on_schedule_end; answers are kept answer_ttl_ms (default
2000) and this tier's own stores mark their keys present.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

import numpy as np

from vllm.v1.kv_offload.base import Locality, LookupResult, Medium, OffloadKey, ReqContext, RequestOffloadingContext
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from .. import _lib as L
from .._tierset import layout_hash, string_keys, value_plan
from ..core import PENDING, READY, FileTier, RemoteTier, warn_if_url_has_password
from .answers import RemoteAnswers
from .compat import offloading_event

_HIT, _MISS, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


# tiers alive in this process (weak: vLLM owns them)
_LIVE: "weakref.WeakSet[_KvoSecondaryTier]" = weakref.WeakSet()


def live_stats() -> list[dict[str, Any]]:
    """kvoffload's counters of the secondary tiers alive in this process
    (vLLM's scheduler when VLLM_ENABLE_V1_MULTIPROCESSING=0): one dict per
    tier, its FileTier / RemoteTier stats and "type" (the tier type).  For
    tests and benchmarks."""
    return [{"type": t.tier_type, **t.stats()} for t in list(_LIVE) if t.tier is not None]


def tier_layout_hash(spec: Any, row_bytes: int) -> int:
    """The namespace of a primary row's bytes (see module doc)."""
    c = spec.config
    par = c.parallel
    groups = [(g.group_id, g.tokens_per_block, tuple(g.layer_names)) for g in c.groups]
    return layout_hash("kvo-vllm-tier/1", row_bytes, max(1, par.world_size), c.worker_kv_bytes_per_block, groups,
                       c.cache.blocks_per_chunk, c.cache.tokens_per_hash, c.model.name, c.model.dtype,
                       bool(getattr(spec, "replicated_layout", False)), bool(getattr(c, "canonical_layout", False)),
                       getattr(c, "kv_cache_layout", None))


@dataclass
class _Load:
    job_id: int
    keys: list[OffloadKey]
    ckeys: np.ndarray
    dsts: np.ndarray
    left: set[int] = field(default_factory=set)      # indices whose read is queued
    again: list[int] = field(default_factory=list)   # indices to queue again (a write of it was pending)
    ok: set[int] = field(default_factory=set)
    nbytes: int = 0
    latency_ns: int = 0
    deadline: float = 0.0


@dataclass
class _Store:
    job_id: int
    keys: list[OffloadKey]
    ckeys: np.ndarray
    srcs: np.ndarray
    todo: np.ndarray          # indices not yet accepted (KVO_EAGAIN)
    failed: bool = False
    nbytes: int = 0
    seconds: float = 0.0
    deadline: float = 0.0


class _KvoSecondaryTier(SecondaryTierManager):
    """What both tiers share: rows of the primary view as fixed-size values
    of a one-group plan, jobs, retries, results and events.  Subclasses give
    the tier (self.tier) and its lookup."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, enable_kv_events: bool = False,
                 locality: Optional[str] = None, store_retry_ms: int = 30000, load_timeout_ms: int = 30000) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        rows = np.asarray(primary_kv_view)
        if rows.ndim != 2 or rows.dtype.itemsize != 1 or not rows.flags.c_contiguous or not rows.flags.writeable:
            raise L.KvoError(L.KVO_EINVAL, f"{tier_type}: the primary tier's view must be writable contiguous "
                             f"rows of bytes (got shape {rows.shape}, dtype {rows.dtype})", tier_type)
        # the address only: vLLM releases the memoryview at its shutdown,
        # after ours, which an export kept here would refuse
        self._base = int(rows.ctypes.data)
        self._nrows = int(rows.shape[0])
        self.row_bytes = int(rows.shape[1])
        del rows
        name = str(offloading_spec.config.model.name or "model")
        self.plan = value_plan(name[-60:] or "model", self.row_bytes)
        slot = self.plan.groups[0]["slot_bytes"]
        if slot != self.row_bytes:
            # reads fill whole slots (the chunk padded to 4096): they must not pass a row's end
            raise L.KvoError(L.KVO_ELAYOUT, f"{tier_type}: primary rows of {self.row_bytes} bytes are not a "
                             f"multiple of 4096 (a read fills {slot}); vLLM's primary aligns rows to the page size",
                             tier_type)
        self.layout = tier_layout_hash(offloading_spec, self.row_bytes)
        if locality is not None:
            self.locality = Locality(str(locality).upper())
        self.events: Optional[list[Any]] = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self.events = []
        self.store_retry_s = max(0, int(store_retry_ms)) / 1000.0
        self.load_timeout_s = max(1, int(load_timeout_ms)) / 1000.0
        self._done: list[JobResult] = []
        self._loads: dict[int, _Load] = {}              # job id -> load
        self._reads: dict[int, tuple[int, int]] = {}    # user data -> (job id, index)
        self._stores: dict[int, _Store] = {}            # job id -> stores waiting for staging room
        self._writing: dict[tuple[int, int], OffloadKey] = {}   # events: kvo key -> OffloadKey, write queued
        self._next_ud = 1
        self.tier: Any = None
        _LIVE.add(self)

    # -- the tier's calls (subclasses)
    def _write(self, ckeys: np.ndarray, srcs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _read(self, ckeys: np.ndarray, dsts: np.ndarray, uds: list[int]) -> np.ndarray:
        raise NotImplementedError

    def _on_stored(self, keys: list[OffloadKey], ckeys: np.ndarray, results: np.ndarray) -> None:
        """Keys just accepted by the tier (results 0 or KVO_EEXIST)."""

    def _on_read_failed(self, ckey: tuple[int, int]) -> None:
        """A read that did not return verified bytes."""

    def _other_completion(self, c: dict[str, Any]) -> None:
        """A completion that is not a read or write (the cluster's EXISTS)."""

    def _flush_tier(self, timeout_ms: int) -> None:
        """Wait up to timeout_ms for the queued writes (a timeout is no error)."""
        try:
            self.tier.flush(timeout_ms)
        except L.KvoError as e:
            if e.code != L.KVO_ETIMEDOUT:
                raise

    # -- helpers
    def _rows_of(self, chunk_ids: Any, n: int) -> np.ndarray:
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        if len(ids) != n:
            raise L.KvoError(L.KVO_EINVAL, f"{self.tier_type}: {n} keys but {len(ids)} chunk ids", self.tier_type)
        if n and (int(ids.min()) < 0 or int(ids.max()) >= self._nrows):
            raise L.KvoError(L.KVO_EINVAL, f"{self.tier_type}: chunk id out of the primary tier's "
                             f"{self._nrows} rows", self.tier_type)
        return (self._base + ids.astype(np.uint64) * np.uint64(self.row_bytes)).astype(np.uintp)

    def ckeys(self, keys: list[OffloadKey]) -> np.ndarray:
        """kvoffload keys (KEY_DTYPE, group 0) of vLLM OffloadKeys."""
        return string_keys([bytes(k) for k in keys])

    def _event(self, keys: list[OffloadKey]) -> None:
        if self.events is not None and keys:
            self.events.append(offloading_event(list(keys), self.medium, False, locality=self.locality,
                                                ownership=self.tier_type))

    # -- SecondaryTierManager
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        ck = self.ckeys(keys)
        srcs = self._rows_of(job_metadata.chunk_ids, len(keys))
        st = _Store(job_metadata.job_id, keys, ck, srcs, np.arange(len(keys)),
                    deadline=time.monotonic() + self.store_retry_s)
        self._try_store(st)
        if len(st.todo):
            self._stores[st.job_id] = st
        else:
            self._finish_store(st)

    def _try_store(self, st: _Store) -> int:
        """Queue st's remaining writes; how many the tier took now."""
        idx = st.todo
        if self.events is not None:
            for i in idx:
                self._writing[(int(st.ckeys["lo"][i]), int(st.ckeys["hi"][i]))] = st.keys[i]
        t0 = time.perf_counter()
        r = self._write(st.ckeys[idx], st.srcs[idx])
        st.seconds += time.perf_counter() - t0
        st.nbytes += int(np.count_nonzero(r == 0)) * self.row_bytes
        accepted = (r == 0) | (r == L.KVO_EEXIST)
        again = r == L.KVO_EAGAIN
        if self.events is not None:
            for i in idx[~(r == 0)]:  # no write queued: no completion will come
                self._writing.pop((int(st.ckeys["lo"][i]), int(st.ckeys["hi"][i])), None)
        if not (accepted | again).all():
            st.failed = True  # KVO_ENOSPC (quota all pinned), KVO_EIO...
        if accepted.any():
            self._on_stored([st.keys[i] for i in idx[accepted]], st.ckeys[idx[accepted]], r[accepted])
        st.todo = idx[again]
        return int(np.count_nonzero(accepted))

    def _finish_store(self, st: _Store) -> None:
        self._done.append(JobResult(job_id=st.job_id, success=not st.failed and not len(st.todo),
                                    transfer_time=st.seconds, transfer_bytes=st.nbytes))

    def _retry_stores(self, force: bool = False) -> None:
        """Queue again what found no room.  A store waits while the tier has
        writes in flight (they drain: room comes), whatever the time between
        vLLM's steps; it is dropped when the tier refuses it with nothing in
        flight (its own back-pressure: latency limit, a value larger than
        staging), at store_retry_ms, or when forced (drain)."""
        now = time.monotonic()
        for job in list(self._stores):
            st = self._stores[job]
            # read before the retry: a write that lands during it must not
            # make a refusal look like one with nothing in flight
            idle = int(self.tier.stats().get("pending_writes", 0)) == 0
            took = self._try_store(st)
            if len(st.todo) and not force and now <= st.deadline and not (idle and took == 0):
                continue
            del self._stores[job]
            self._finish_store(st)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        ld = _Load(job_metadata.job_id, keys, self.ckeys(keys), self._rows_of(job_metadata.chunk_ids, len(keys)),
                   deadline=time.monotonic() + self.load_timeout_s)
        self._loads[ld.job_id] = ld
        self._queue_reads(ld, list(range(len(keys))))
        self._maybe_finish_load(ld)

    def _queue_reads(self, ld: _Load, idx: list[int]) -> None:
        if not idx:
            return
        uds = list(range(self._next_ud, self._next_ud + len(idx)))
        self._next_ud += len(idx)
        sel = np.asarray(idx)
        r = self._read(ld.ckeys[sel], ld.dsts[sel], uds)
        for i, ud, rc in zip(idx, uds, r.tolist()):
            if rc == 0:
                self._reads[ud] = (ld.job_id, i)
                ld.left.add(i)
            elif rc == L.KVO_EAGAIN:   # a write of it is still queued: read it once that lands
                ld.again.append(i)
            else:
                self._on_read_failed((int(ld.ckeys["lo"][i]), int(ld.ckeys["hi"][i])))

    def _maybe_finish_load(self, ld: _Load, give_up: bool = False) -> None:
        """Report a load once none of its reads is queued (a queued read
        may write its row until its completion: never given up) and none
        waits to be queued again (given up at the deadline: failed keys)."""
        if ld.left or (ld.again and not give_up):
            return
        del self._loads[ld.job_id]
        n = len(ld.keys)
        ok = len(ld.ok) == n
        good = tuple(ld.keys[i] for i in sorted(ld.ok)) if ld.ok and not ok else None
        self._done.append(JobResult(job_id=ld.job_id, success=ok, successful_keys=good,
                                    transfer_time=ld.latency_ns / 1e9, transfer_bytes=ld.nbytes))

    def _poll(self) -> None:
        if self.tier is None:
            return
        while True:
            comps = self.tier.poll(1024)
            for c in comps:
                item = self._reads.pop(c["user_data"], None) if c["user_data"] else None
                if item is not None:
                    ld = self._loads[item[0]]
                    i = item[1]
                    ld.left.discard(i)
                    if c["result"] == 0:
                        ld.ok.add(i)
                        ld.nbytes += int(c["bytes"])
                        ld.latency_ns = max(ld.latency_ns, int(c["latency_ns"]))
                    else:
                        self._on_read_failed(c["key"])
                    continue
                if not c["user_data"] and self.events is not None:   # a write's completion
                    key = self._writing.pop(c["key"], None)
                    if key is not None and c["result"] == 0:
                        self._event([key])
                    continue
                self._other_completion(c)
            if len(comps) < 1024:
                break
        for ld in list(self._loads.values()):
            if ld.again and not ld.left:
                again, ld.again = ld.again, []
                self._queue_reads(ld, again)
            self._maybe_finish_load(ld, give_up=time.monotonic() > ld.deadline)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._poll()
        if self._stores:
            self._retry_stores()
        out, self._done = self._done, []
        return out

    def has_pending_work(self) -> bool:
        return bool(self._loads or self._stores)

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        return

    def take_events(self) -> Iterable[Any]:
        if self.events:
            ev, self.events = self.events, []
            yield from ev

    def drain_jobs(self) -> None:
        """Wait until every load landed or failed and every store was
        accepted or dropped (its rows are not read after this returns)."""
        deadline = time.monotonic() + self.load_timeout_s
        while self._loads or self._stores:
            late = time.monotonic() > deadline
            if self._stores or any(ld.again for ld in self._loads.values()):
                self._flush_tier(100)   # room in staging; pending writes readable
            if self._stores:
                self._retry_stores(force=late)
            if self._loads:
                if any(ld.left for ld in self._loads.values()):
                    self.tier.wait(100)
                self._poll()
                if late:
                    for ld in list(self._loads.values()):
                        self._maybe_finish_load(ld, give_up=True)

    def stats(self) -> dict[str, Any]:
        """The kvoffload tier's counters (FileTier / RemoteTier stats)."""
        return self.tier.stats() if self.tier is not None else {}

    def shutdown(self) -> None:
        if self.tier is None:
            return
        try:
            self.drain_jobs()
            self._flush_tier(30000)   # queued writes reach the files / the cluster
        finally:
            self.tier.close()
            self.tier = None


class KvoffloadFileTier(_KvoSecondaryTier):
    """kvoffload's file tier as a vLLM secondary tier (see module doc).
    Config: root_dir, capacity_bytes (required), eviction_policy ("lru"),
    io_threads, shared, file_mode, max_staging_bytes (64 MiB: memory for
    queued writes), enable_kv_events, locality."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 root_dir: str = "", capacity_bytes: int = 0, eviction_policy: str = "lru", io_threads: int = 0,
                 shared: bool = False, file_mode: int = 0, max_staging_bytes: int = 0,
                 backpressure_detector: Any = None, **kw: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector, **kw)
        if not isinstance(root_dir, str) or not root_dir:
            raise L.KvoError(L.KVO_EINVAL, f"{tier_type}: give root_dir (the directory of the files)", tier_type)
        if int(capacity_bytes) < self.row_bytes:
            raise L.KvoError(L.KVO_EINVAL, f"{tier_type}: capacity_bytes {capacity_bytes} holds no chunk of "
                             f"{self.row_bytes} bytes; give the bytes of files to keep (at least that)", tier_type)
        self.tier = FileTier(root_dir, self.plan, int(capacity_bytes), policy=str(eviction_policy),
                             io_threads=int(io_threads), shared=bool(shared), layout_hash=self.layout,
                             write_completions=self.events is not None, file_mode=int(file_mode),
                             max_staging_bytes=int(max_staging_bytes))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        st = int(self.tier.lookup(self.ckeys([key]))[0])
        if st == READY:
            return _HIT
        return _RETRY if st == PENDING else _MISS

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        keys = list(keys)
        if keys:
            self.tier.touch(self.ckeys(keys))

    def _write(self, ckeys: np.ndarray, srcs: np.ndarray) -> np.ndarray:
        return self.tier.write(ckeys, srcs)

    def _read(self, ckeys: np.ndarray, dsts: np.ndarray, uds: list[int]) -> np.ndarray:
        return self.tier.read(ckeys, dsts, uds)


class KvoffloadRedisTier(_KvoSecondaryTier):
    """kvoffload's Redis Cluster tier as a vLLM secondary tier (see module
    doc).  Config: url (required; the password from the URL or
    KVO_REDIS_PASSWORD), key_prefix ("kvo"), ttl_s, io_threads,
    answer_ttl_ms (2000), enable_kv_events, locality ("REMOTE")."""

    medium: ClassVar[Medium] = Medium.STORAGE
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, url: str = "",
                 key_prefix: str = "kvo", ttl_s: int = 0, io_threads: int = 0, answer_ttl_ms: int = 2000,
                 locality: Optional[str] = "REMOTE", backpressure_detector: Any = None, **kw: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector, locality=locality, **kw)
        if not isinstance(url, str) or not url:
            raise L.KvoError(L.KVO_EINVAL, f"{tier_type}: give url (redis://host:port,... of the cluster)", tier_type)
        warn_if_url_has_password(url, f"secondary tier {tier_type} url")
        # the EXISTS answers and questions in flight, by (lo, hi) of the key
        self._answers = RemoteAnswers(int(answer_ttl_ms) / 1000.0)
        self._ask: dict[tuple[int, int], int] = {}      # this step's batch: key -> its row in _ask_keys
        self._ask_keys: list[np.void] = []
        self.tier = RemoteTier(url, self.plan, key_prefix=str(key_prefix), layout_hash=self.layout,
                               ttl_s=int(ttl_s), io_threads=int(io_threads),
                               write_completions=self.events is not None)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._answers.in_flight():
            self._poll()
        k = self.ckeys([key])
        ck = (int(k["lo"][0]), int(k["hi"][0]))
        present = self._answers.get(ck)
        if present is not None:
            return _HIT if present else _MISS
        if not self._answers.asking(ck) and ck not in self._ask:
            self._ask[ck] = len(self._ask_keys)
            self._ask_keys.append(k[0])
        return _RETRY

    def on_schedule_end(self, context: Any) -> None:
        """Send the step's questions as one EXISTS batch."""
        if not self._ask:
            return
        keys = np.array(self._ask_keys, dtype=self._ask_keys[0].dtype)
        cks = list(self._ask)
        self._ask, self._ask_keys = {}, []
        uds = list(range(self._next_ud, self._next_ud + len(cks)))
        self._next_ud += len(cks)
        for ck, ud, rc in zip(cks, uds, self.tier.exists(keys, uds).tolist()):
            if rc == 0:
                self._answers.sent(ud, ck)
            else:  # too many in flight; asked again at its next lookup
                self._answers.not_sent(ck)

    def _other_completion(self, c: dict[str, Any]) -> None:
        if c["op"] == L.REMOTE_OP_EXISTS:
            self._answers.landed(c["user_data"], c["result"] == 0)

    def _on_stored(self, keys: list[OffloadKey], ckeys: np.ndarray, results: np.ndarray) -> None:
        # an "absent" remembered, on its way or about to be asked is stale
        for ck in zip(ckeys["lo"].tolist(), ckeys["hi"].tolist()):
            self._answers.stored(ck, asking=ck in self._ask)

    def _on_read_failed(self, ckey: tuple[int, int]) -> None:
        self._answers.remember(ckey, False)

    def has_pending_work(self) -> bool:
        return super().has_pending_work() or bool(self._answers.in_flight() or self._ask)

    def _write(self, ckeys: np.ndarray, srcs: np.ndarray) -> np.ndarray:
        return self.tier.put(ckeys, srcs)

    def _read(self, ckeys: np.ndarray, dsts: np.ndarray, uds: list[int]) -> np.ndarray:
        return self.tier.get(ckeys, dsts, uds)


__all__ = ["KvoffloadFileTier", "KvoffloadRedisTier", "live_stats", "tier_layout_hash"]
