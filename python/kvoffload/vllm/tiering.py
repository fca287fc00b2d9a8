"""kvoffload's file tier and Redis Cluster tier as secondary tiers of vLLM's
TieringOffloadingSpec (vllm.v1.kv_offload.tiering; vLLM 0.32 has it).

vLLM's tiering spec keeps its own CPU primary tier (the chunks in a shared
memory region, the GPU copies by vLLM's worker) and cascades every stored
chunk to each secondary tier, promoting a chunk back into the primary tier
when the primary misses and a secondary holds it.  A secondary tier sees
only primary-tier chunks: fixed-size rows of vLLM's memoryview
(primary_kv_view[c], row_stride bytes, one per OffloadKey).  Each tier here
is a kvoffload Cascade with no host tier (host_bytes 0) over one kvoffload
tier, and translates vLLM's calls into the cascade's and nothing more:

  lookup        Cascade.lookup of the key: READY -> HIT, PENDING (a write
                still queued, the cluster's answer still out within the
                request's budget) -> RETRY, MISS -> MISS
  submit_load   Cascade.read straight into the primary rows; each key's
                completion says whether its row holds the verified chunk
  submit_store  Cascade.write_async from the primary rows (vLLM keeps them
                pinned until the job is reported; back-pressure is retried
                by the cascade at later polls, then counted as dropped)
  completions   Cascade.poll at get_finished_jobs -> JobResult (a load's
                failed keys are left out of successful_keys, so vLLM
                recomputes them)

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

Keys and namespaces: a chunk's key is kvo_namespace_keys of its OffloadKey
under the namespace config.kvo_namespace gives (the whole model identity,
dtype, KV layout) with everything else that decides a row's bytes in its
extra (the row's size, world size, bytes per block, the groups, blocks per
chunk, tokens per hash, replicated and canonical layout); the files'
directory and the cluster's key prefix are named by the same inputs
(tier_layout_hash).  vLLM's block hashes already include a request's
cache_salt.

Byte-exact or miss: a load reads and verifies a value straight into the
primary row, and a key whose read fails (absent, evicted since the lookup,
corrupt: the tier deletes it) is reported failed (JobResult.successful_keys
holds the others), so vLLM recomputes it.  A store job succeeds when every
key was taken by the tier (or held already).

vLLM's metrics: each JobResult carries transfer_bytes (payload moved) and
transfer_time (from the submit to the job's last completion), so vLLM's
kv_offload_tiering_{read,write}_{bytes,time} count them per tier.

Events (enable_kv_events, with vLLM's kv_events_config enabled): an
OffloadingEvent(removed=False) per batch of chunks the tier took (a write
queued or held: the store completions), with medium, locality and ownership
(the tier type) where this vLLM's OffloadingEvent has the fields.  No
removal events: the file quota and the cluster evict on their own (vLLM's
fs tier sends none either).
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
from ..cascade import OP_READ, OP_WRITE, Cascade, CascadeWait, engine_cascade, layout_of, namespace_keys, value_plan
from ..core import PENDING, READY, warn_if_url_has_password
from .compat import offloading_event
from .config import kvo_namespace

_HIT, _MISS, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


# tiers alive in this process (weak: vLLM owns them)
_LIVE: "weakref.WeakSet[_KvoSecondaryTier]" = weakref.WeakSet()


def live_stats() -> list[dict[str, Any]]:
    """kvoffload's counters of the secondary tiers alive in this process
    (vLLM's scheduler when VLLM_ENABLE_V1_MULTIPROCESSING=0): one dict per
    tier, its FileTier / RemoteTier stats, "type" (the tier type) and
    "cascade" (the cascade's counters).  For tests and benchmarks."""
    return [{"type": t.tier_type, **t.stats()} for t in list(_LIVE) if t.tier is not None]


def _row_layout(spec: Any, row_bytes: int) -> tuple[Any, ...]:
    """What decides a primary row's bytes beyond the model identity, dtype
    and KV layout (see module doc)."""
    c = spec.config
    par = c.parallel
    groups = [(g.group_id, g.tokens_per_block, tuple(g.layer_names)) for g in c.groups]
    return ("kvo-vllm-tier/1", row_bytes, max(1, par.world_size), c.worker_kv_bytes_per_block, groups,
            c.cache.blocks_per_chunk, c.cache.tokens_per_hash, bool(getattr(spec, "replicated_layout", False)),
            bool(getattr(c, "canonical_layout", False)))


def tier_namespace(spec: Any, row_bytes: int) -> int:
    """The namespace of a primary row's chunks (see module doc)."""
    return kvo_namespace(spec.config, value_plan("vllm-tier", row_bytes), engine="vllm-tier",
                         extra=_row_layout(spec, row_bytes))


def tier_layout_hash(spec: Any, row_bytes: int) -> int:
    """The tiers' directory and key prefix: the namespace's (layout_of)."""
    return layout_of(tier_namespace(spec, row_bytes))


@dataclass
class _Job:
    job_id: int
    keys: list[OffloadKey]
    left: int                                        # completions still to come
    load: bool
    ok: list[bool] = field(default_factory=list)     # per key
    nbytes: int = 0
    t0: float = 0.0


class _KvoSecondaryTier(SecondaryTierManager):
    """What both tiers share: rows of the primary view as fixed-size values
    of a one-group plan, one Cascade over the tier, jobs and their results,
    events.  Subclasses give the tier (self.tier) before _open."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, enable_kv_events: bool = False,
                 locality: Optional[str] = None, retry_polls: int = 0) -> None:
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
        self.plan = value_plan("vllm-tier", self.row_bytes)
        slot = self.plan.groups[0]["slot_bytes"]
        if slot != self.row_bytes:
            # reads fill whole slots (the chunk padded to 4096): they must not pass a row's end
            raise L.KvoError(L.KVO_ELAYOUT, f"{tier_type}: primary rows of {self.row_bytes} bytes are not a "
                             f"multiple of 4096 (a read fills {slot}); vLLM's primary aligns rows to the page size",
                             tier_type)
        self.namespace = tier_namespace(offloading_spec, self.row_bytes)
        self.layout = layout_of(self.namespace)
        if locality is not None:
            self.locality = Locality(str(locality).upper())
        self.events: Optional[list[Any]] = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self.events = []
        self._retry_polls = int(retry_polls) or None
        self._done: list[JobResult] = []
        self._jobs: dict[int, _Job] = {}                # job id -> job
        self._ud: dict[int, tuple[int, int]] = {}       # user data -> (job id, index)
        self._waits: dict[str, CascadeWait] = {}        # request -> its lookups' budget
        self._next_ud = 1
        self.tier: Any = None
        self.cascade: Optional[Cascade] = None
        _LIVE.add(self)

    def _open(self, **tiers: Any) -> None:
        """The cascade over the tier (engine_cascade's file= or remote=, and
        the cascade's options); self.tier: that tier."""
        self.cascade = engine_cascade(self.plan, retry_polls=self._retry_polls, **tiers)
        self.tier = self.cascade.file_tier or self.cascade.remote_tier

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
        """kvoffload chunk keys (KEY_DTYPE, group 0) of vLLM OffloadKeys."""
        return namespace_keys(self.namespace, [bytes(k) for k in keys])

    def _wait(self, req_context: ReqContext) -> CascadeWait:
        w = self._waits.get(req_context.req_id)
        if w is None:
            w = self._waits[req_context.req_id] = CascadeWait()
        return w

    def _event(self, keys: list[OffloadKey]) -> None:
        if self.events is not None and keys:
            self.events.append(offloading_event(list(keys), self.medium, False, locality=self.locality,
                                                ownership=self.tier_type))

    def _submit(self, job_metadata: TransferJob, load: bool) -> None:
        assert self.cascade is not None
        keys = list(job_metadata.keys)
        rows = self._rows_of(job_metadata.chunk_ids, len(keys))
        n = len(keys)
        job = _Job(job_metadata.job_id, keys, n, load, [False] * n, t0=time.monotonic())
        self._jobs[job.job_id] = job
        uds = list(range(self._next_ud, self._next_ud + n))
        self._next_ud += n
        for i, ud in enumerate(uds):
            self._ud[ud] = (job.job_id, i)
        if not n:
            self._finish(job)
            return
        ck = self.ckeys(keys)
        if load:
            res = self.cascade.read(ck, rows, uds)
            for i in np.flatnonzero(res != 0).tolist():   # no tier holds it: no completion comes
                del self._ud[uds[i]]
                job.left -= 1
            if not job.left:
                self._finish(job)
        else:
            self.cascade.write_async(ck, rows, uds)     # one completion per key, possibly queued already

    def _finish(self, job: _Job) -> None:
        del self._jobs[job.job_id]
        ok = all(job.ok)
        if not job.load and self.events is not None:
            self._event([k for k, good in zip(job.keys, job.ok) if good])
        good = tuple(k for k, g in zip(job.keys, job.ok) if g) if job.load and any(job.ok) and not ok else None
        self._done.append(JobResult(job_id=job.job_id, success=ok, successful_keys=good,
                                    transfer_time=time.monotonic() - job.t0, transfer_bytes=job.nbytes))

    def _poll(self) -> None:
        if self.cascade is None:
            return
        while True:
            comps = self.cascade.poll(1024)
            for ud, op, result, nbytes in zip(comps["user_data"].tolist(), comps["op"].tolist(),
                                              comps["result"].tolist(), comps["bytes"].tolist()):
                item = self._ud.pop(ud, None) if op in (OP_READ, OP_WRITE) else None
                if item is None:
                    continue
                job = self._jobs[item[0]]
                job.left -= 1
                if result == 0:
                    job.ok[item[1]] = True
                    job.nbytes += nbytes
                if not job.left:
                    self._finish(job)
            if len(comps) < 1024:
                break

    # -- SecondaryTierManager
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._waits.pop(req_context.req_id, None)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        assert self.cascade is not None
        st, _, _ = self.cascade.lookup(self.ckeys([key]), 0, wait=self._wait(req_context))
        return _HIT if st[0] == READY else _RETRY if st[0] == PENDING else _MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._poll()
        out, self._done = self._done, []
        return out

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def take_events(self) -> Iterable[Any]:
        if self.events:
            ev, self.events = self.events, []
            yield from ev

    def drain_jobs(self) -> None:
        """Wait until every load landed or failed and every store was taken
        or dropped (its rows are not touched after this returns)."""
        while self._jobs and self.cascade is not None:
            self.cascade.wait_events(100)
            self._poll()

    def stats(self) -> dict[str, Any]:
        """The kvoffload tier's counters (FileTier / RemoteTier stats) and
        "cascade" (kvo_cascade_stats)."""
        if self.tier is None:
            return {}
        return {**self.tier.stats(), "cascade": self.cascade.stats() if self.cascade is not None else {}}

    def shutdown(self) -> None:
        if self.cascade is None:
            return
        try:
            self.drain_jobs()
        finally:
            self.cascade.close(30000)   # queued writes reach the files / the cluster
            self.cascade = self.tier = None


class KvoffloadFileTier(_KvoSecondaryTier):
    """kvoffload's file tier as a vLLM secondary tier (see module doc).
    Config: root_dir, capacity_bytes (required), eviction_policy ("lru"),
    io_threads, shared, file_mode, max_staging_bytes (64 MiB: memory for
    queued writes), retry_polls, enable_kv_events, locality."""

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
        self._open(file=dict(root=root_dir, quota_bytes=int(capacity_bytes), policy=str(eviction_policy),
                             io_threads=int(io_threads), shared=bool(shared), layout_hash=self.layout,
                             file_mode=int(file_mode), max_staging_bytes=int(max_staging_bytes)))

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        keys = list(keys)
        if keys:
            self.tier.touch(self.ckeys(keys))


class KvoffloadRedisTier(_KvoSecondaryTier):
    """kvoffload's Redis Cluster tier as a vLLM secondary tier (see module
    doc).  Config: url (required; the password from the URL or
    KVO_REDIS_PASSWORD), key_prefix ("kvo"), ttl_s, io_threads,
    answer_ttl_ms (how long an EXISTS answer is reused, 2000),
    lookup_budget_us (how long a request's lookups wait for the cluster's
    answers, answering RETRY, before they count as misses; 20000),
    retry_polls, enable_kv_events, locality ("REMOTE")."""

    medium: ClassVar[Medium] = Medium.STORAGE
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str, url: str = "",
                 key_prefix: str = "kvo", ttl_s: int = 0, io_threads: int = 0, answer_ttl_ms: int = 2000,
                 lookup_budget_us: Optional[int] = None, locality: Optional[str] = "REMOTE",
                 backpressure_detector: Any = None, **kw: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector, locality=locality, **kw)
        if not isinstance(url, str) or not url:
            raise L.KvoError(L.KVO_EINVAL, f"{tier_type}: give url (redis://host:port,... of the cluster)", tier_type)
        warn_if_url_has_password(url, f"secondary tier {tier_type} url")
        self._open(remote=dict(url=url, key_prefix=str(key_prefix), layout_hash=self.layout, ttl_s=int(ttl_s),
                               io_threads=int(io_threads)),
                   remote_exists_ttl_ms=int(answer_ttl_ms), remote_lookup_budget_us=lookup_budget_us)


__all__ = ["KvoffloadFileTier", "KvoffloadRedisTier", "live_stats", "tier_layout_hash", "tier_namespace"]
