"""Scheduler side of KvoffloadConnector (connector.py): CascadeManager, vLLM's
OffloadingManager translated into kvoffload Cascade calls, and
KvoffloadConnectorScheduler, vLLM's own offloading scheduler with the
prompt looked up in one call and loads in the request's first step.

Why vLLM's scheduler.  vLLM's OffloadingConnectorScheduler already knows
which chunk of which KV-cache group a request needs back: full-attention
groups their prefix, sliding-window groups their last window, recurrent
(Mamba) groups one state at an aligned boundary, and the fences that keep a
block from being reused while it is stored.  That knowledge is vLLM's and
changes with it; kvoffload keeps the tiers.  The scheduler asks a manager
about one key at a time; here the connector looks the whole prompt up
first, and the manager answers the scheduler's per-key questions from that
answer (a dict look-up, no C call).

One request's way (the tiers: include/kvoffload/kvo_cascade.h):
  1. get_num_new_matched_tokens: every offloaded group's keys from the first
     chunk the device cache does not hold, one Cascade.lookup per group:
     PREFIX | PROMOTE for a full-attention group (the chain up to the first
     chunk no tier holds; its file and Redis chunks start moving into host
     slots now), PROMOTE for the others (their chunks are not one chain).
     The request's CascadeWait carries the Redis answers' budget.  A chunk
     still moving or still being asked about is HIT_PENDING: vLLM asks again
     at a later step and the request waits only for what is not yet in host
     memory.
  2. With every chunk in host memory, vLLM's scheduler counts the hit; the
     connector answers "not asynchronous", so the request is scheduled in
     this step with its prefix counted as computed and the load runs before
     this step's forward (KvoffloadConnectorScheduler moves the load job out
     of vLLM's asynchronous bookkeeping; the worker reports it done).
  3. prepare_load pins the host slots until the worker reports the load.
  4. Computed chunks are stored the step after they are computed (vLLM's
     deferral), through Cascade.prepare_store (host slots, staging when the
     host tier is full, REFUSED counted by the cascade) and complete_store,
     which hands them to the file and Redis tiers.  A store the worker could
     not copy completes as failed: the chunk never becomes visible.

Events: the host tier's store events (stored, evicted, removed) with medium
CPU; the file tier's (STORAGE, LOCAL, ownership "kvoffload-file") and the
Redis tier's (STORAGE, REMOTE, ownership "kvoffload-redis") stored events
when a chunk is handed to them, and their removed events when a later
lookup of this engine finds a chunk it announced gone from every tier (a
lower tier evicts on its own and says nothing; the cascade has no event
for that yet).  vLLM's OffloadingEventsTracker turns them into KV events.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler
from vllm.v1.kv_offload.base import (LookupResult, Medium, OffloadingEvent, OffloadingManager, OffloadKey,
                                     PrepareStoreOutput, ReqContext, RequestOffloadingContext)

from .. import _lib as L
from .. import cascade as kc
from ..core import KEY_DTYPE, MISS, PENDING, READY
from ..tenants import TenantCounters
from .compat import FILE_OWNER, REDIS_OWNER, lower_tier_events  # noqa: F401 (the owners: re-exported)
from .config import KvoffloadLoadStoreSpec

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover
    CacheHitSource = None  # type: ignore[assignment,misc]

_HIT, _MISS, _PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING
_EMPTY = KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32))


# What the connector counts per tenant (vLLM's cache_salt; kvoffload.tenants):
# requests looked up, their tokens not in the device cache (lookup_tokens),
# those the tiers gave (hit_tokens), requests whose load failed (recomputed)
# and chunks stored.
TENANT_FIELDS = ("requests", "lookup_tokens", "hit_tokens", "load_failures", "stored_chunks")
# ... and as vLLM's Prometheus counters (with a "tenant" label; vLLM's own
# prefix, so that vLLM unregisters them with its own; exposed with _total)
TENANT_METRICS = {f: f"vllm:kvoffload_tenant_{f}" for f in TENANT_FIELDS}


class _Tenant:
    """A request's tenant (its cache_salt, None without one) and whether its
    lookup was counted, kept in its ReqContext (set_state): they live and
    go with the request."""
    __slots__ = ("salt", "counted", "part")

    def __init__(self, salt: Optional[str], part: int = 0) -> None:
        self.salt = salt
        self.part = part   # its host-tier part (Cascade.tenant_part): every key of the request is tagged with it
        self.counted = False


_IDENTITY_BYTES = KEY_DTYPE.fields["tenant"][1]   # lo, hi, group: the record up to its tenant tag


def _identity(rec: Any) -> bytes:
    """A chunk key record's identity (hash and group; its tenant tag names
    where it lives, not what it is): events name keys by it."""
    return rec.tobytes()[:_IDENTITY_BYTES]


def _part_of(req_context: Optional[ReqContext]) -> int:
    t = req_context.get_state(_Tenant) if req_context is not None else None
    return t.part if t is not None else 0


def _tenant_of(req_context: Optional[ReqContext]) -> Optional[str]:
    t = req_context.get_state(_Tenant) if req_context is not None else None
    return t.salt if t is not None else None


def _result(state: int, tier: int) -> LookupResult:
    if state == READY:
        return _HIT if tier == kc.TIER_HOST else _PENDING  # a lower tier's chunk not promoted yet
    return _PENDING if state == PENDING else _MISS


class CascadeManager(OffloadingManager):
    """vLLM's OffloadingManager over a kvoffload Cascade (module doc).  Keys:
    vLLM's OffloadKey (block hash, big-endian group id) becomes a chunk key
    under the engine's namespace (kvoffload.cascade.namespace_keys of the
    hash, the group's index among the offloaded groups)."""

    def __init__(self, cascade: kc.Cascade, namespace: int, group_ids: Sequence[int],
                 enable_events: bool = False, file_mode: str = "write_through") -> None:
        self.cascade = cascade
        self.file_mode = file_mode
        self.ns = namespace
        self._gidx = {int(g): i for i, g in enumerate(group_ids)}
        self._answers: dict[str, dict[OffloadKey, tuple[int, int]]] = {}  # req -> key -> (state, tier)
        self._origin: dict[str, dict[OffloadKey, int]] = {}  # req -> key -> tier first found in
        self._waits: dict[str, kc.CascadeWait] = {}
        self._failed: set[OffloadKey] = set()       # stores the worker could not copy
        self.events: Optional[list[OffloadingEvent]] = [] if enable_events else None
        self._names: dict[bytes, OffloadKey] = {}   # chunk key record -> OffloadKey (events only)
        self._lower: dict[OffloadKey, int] = {}     # announced in a lower tier: key -> tier bits
        self.has_file = cascade.file_tier is not None
        self.has_remote = cascade.remote_tier is not None
        self.counts = dict(lookups=0, lookup_keys=0, fallback_lookups=0, stores_failed=0)
        self.tenants = TenantCounters(TENANT_FIELDS)

    # -- keys ------------------------------------------------------------
    def ckeys(self, keys: Sequence[OffloadKey], req_context: Optional[ReqContext] = None) -> np.ndarray:
        """The chunk keys (KEY_DTYPE) of OffloadKeys: one namespace_keys call
        per group in the batch; tagged with the request's tenant part."""
        n = len(keys)
        out = np.zeros(n, dtype=KEY_DTYPE)
        if n == 0:
            return out
        part = _part_of(req_context)
        width = len(keys[0])
        raw = np.frombuffer(b"".join(keys), dtype=np.uint8)
        if raw.size != n * width:
            raise L.KvoError(L.KVO_EINVAL, "offload keys of different lengths in one batch", "CascadeManager")
        raw = raw.reshape(n, width)
        gids = raw[:, width - 4:].copy().view(">u4").ravel()
        for gid in (np.unique(gids) if gids[0] != gids[-1] or (gids != gids[0]).any() else gids[:1]):
            g = self._gidx.get(int(gid))
            if g is None:
                raise L.KvoError(L.KVO_EINVAL, f"vLLM group {int(gid)} is not offloaded", "CascadeManager")
            m = gids == gid
            out[m] = kc.namespace_keys(self.ns, raw[m, :width - 4], group=g)
        if part:
            out["tenant"] = part
        return out

    # -- lookup ----------------------------------------------------------
    def lookup_request(self, req_context: ReqContext, groups: Sequence[tuple[Sequence[OffloadKey], bool]]) -> None:
        """Look a request's keys up, one Cascade.lookup per group (chain:
        PREFIX | PROMOTE, else PROMOTE), and keep the answers for lookup()."""
        rid = req_context.req_id
        wait = self._waits.setdefault(rid, kc.CascadeWait())
        answers: dict[OffloadKey, tuple[int, int]] = {}
        origin = self._origin.setdefault(rid, {})
        for keys, chain in groups:
            if not keys:
                continue
            ck = self.ckeys(keys, req_context)
            states, tiers, _ = self.cascade.lookup(ck, (kc.PREFIX if chain else 0) | kc.PROMOTE, wait)
            self.counts["lookups"] += 1
            self.counts["lookup_keys"] += len(keys)
            for i, (key, s, t) in enumerate(zip(keys, states.tolist(), tiers.tolist())):
                answers[key] = (s, t)
                if s != MISS and key not in origin:
                    origin[key] = t
                    if t != kc.TIER_HOST and self.events is not None:  # promoted: named in the host events
                        self._names[_identity(ck[i])] = key
            if self._lower:
                self._gone(keys, states)
        self._answers[rid] = answers

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        a = self._answers.get(req_context.req_id)
        r = a.get(key) if a is not None else None
        if r is None:  # a key outside the request's chunks (a boundary key): one call for it
            self.counts["fallback_lookups"] += 1
            states, tiers, _ = self.cascade.lookup(self.ckeys([key], req_context), kc.PROMOTE,
                                                   self._waits.setdefault(req_context.req_id, kc.CascadeWait()))
            r = (int(states[0]), int(tiers[0]))
            if a is not None:
                a[key] = r
            if r[0] != MISS:
                self._origin.setdefault(req_context.req_id, {}).setdefault(key, r[1])
        return _result(*r)

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> Any:
        t = self._origin.get(req_context.req_id, {}).get(key, kc.TIER_HOST)
        names = {kc.TIER_HOST: "HOST", kc.TIER_FILE: "DISK"}
        return getattr(CacheHitSource, names.get(t, "EXTERNAL_UNSPECIFIED"))

    # -- loads -----------------------------------------------------------
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> KvoffloadLoadStoreSpec:
        ck = self.ckeys(list(keys), req_context)
        if len(ck) == 0:
            return _EMPTY
        slots = self.cascade.prepare_load(ck)
        return KvoffloadLoadStoreSpec(slots["offset"], ck["group"])

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys:
            self.cascade.touch(self.ckeys(list(keys), req_context))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys:
            self.cascade.complete_load(self.ckeys(list(keys), req_context))

    # -- stores ----------------------------------------------------------
    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        if not keys:
            return PrepareStoreOutput([], _EMPTY, [])
        ck = self.ckeys(keys, req_context)
        need, slots = self.cascade.prepare_store(ck)
        take = np.flatnonzero((need == kc.HOST) | (need == kc.STAGED))
        if len(take) == 0:
            # None: vLLM counts an allocation failure (the cascade counted
            # the refused keys in stores_refused)
            return None if (need == kc.REFUSED).any() else PrepareStoreOutput([], _EMPTY, [])
        to_store = [keys[i] for i in take.tolist()]
        self.count_tenant(req_context, stored_chunks=len(to_store))
        if self.events is not None:
            for i, k in zip(take.tolist(), to_store):
                self._names[_identity(ck[i])] = k
        return PrepareStoreOutput(to_store, KvoffloadLoadStoreSpec(slots["offset"][take], ck["group"][take]), [])

    def fail_stores(self, keys: Collection[OffloadKey]) -> None:
        """The worker could not copy these keys: complete_store drops them."""
        self._failed.update(keys)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        keys = list(keys)
        if not keys:
            return
        if self._failed:
            bad = [k for k in keys if k in self._failed]
            if bad:
                self._failed.difference_update(bad)
                self.counts["stores_failed"] += len(bad)
                self._complete(bad, False, req_context)
                keys = [k for k in keys if k not in set(bad)]
        self._complete(keys, success, req_context)

    def _complete(self, keys: list[OffloadKey], ok: bool, req_context: Optional[ReqContext]) -> None:
        if not keys:
            return
        ck = self.ckeys(keys, req_context)
        try:
            self.cascade.complete_store(ck, ok)
        except L.KvoError as e:
            if e.code != L.KVO_ESTATE:
                raise
            # some keys are not being stored (a cache reset forgot them):
            # the others one at a time (rare)
            for i in range(len(ck)):
                try:
                    self.cascade.complete_store(ck[i:i + 1], ok)
                except L.KvoError as e1:
                    if e1.code != L.KVO_ESTATE:
                        raise
        if ok and self.events is not None and (self.has_file or self.has_remote):
            self._announce_lower(keys)

    # -- events ----------------------------------------------------------
    def _lower_event(self, keys: list[OffloadKey], bit: int, removed: bool) -> None:
        assert self.events is not None
        self.events += lower_tier_events(keys, bit == 1, bit == 2, removed)

    def _announce_lower(self, keys: list[OffloadKey]) -> None:
        """Chunks handed to the lower tiers (write-through; staged chunks
        too): stored events for each tier they were handed to."""
        write_file = self.has_file and self.file_mode == "write_through"
        for bit, on in ((1, write_file), (2, self.has_remote)):
            if on:
                new = [k for k in keys if not self._lower.get(k, 0) & bit]
                for k in new:
                    self._lower[k] = self._lower.get(k, 0) | bit
                if new:
                    self._lower_event(new, bit, False)

    def _gone(self, keys: Sequence[OffloadKey], states: np.ndarray) -> None:
        """Chunks this engine announced in a lower tier that a lookup found
        in no tier: removed events."""
        gone = [k for k, s in zip(keys, states.tolist()) if s == MISS and k in self._lower]
        if not gone or self.events is None:
            return
        for bit in (1, 2):
            ks = [k for k in gone if self._lower[k] & bit]
            if ks:
                self._lower_event(ks, bit, True)
        for k in gone:
            del self._lower[k]

    def _drain_host_events(self) -> None:
        if self.events is None:
            return
        ev = self.cascade.host_events()
        if len(ev) == 0:
            return
        write_back = self.has_file and self.file_mode == "write_back"
        start = 0
        types = ev["type"]
        for i in range(1, len(ev) + 1):
            if i < len(ev) and types[i] == types[start]:
                continue
            recs = [_identity(r) for r in ev["key"][start:i]]
            removed = int(types[start]) != 1
            keys = [self._names[r] for r in recs if r in self._names]
            if removed:
                for r in recs:
                    self._names.pop(r, None)
            if keys:
                self.events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=removed))
                if removed and write_back and int(types[start]) == 2:
                    self._announce_write_back(keys)
            start = i

    def _announce_write_back(self, keys: list[OffloadKey]) -> None:
        new = [k for k in keys if not self._lower.get(k, 0) & 1]
        for k in new:
            self._lower[k] = self._lower.get(k, 0) | 1
        if new:
            self._lower_event(new, 1, False)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        self._drain_host_events()
        events, self.events = self.events, []
        yield from events

    def get_stats(self) -> Optional[OffloadingConnectorStats]:
        """The per-tenant counts since the last call, as vLLM's offloading
        stats (TENANT_METRICS, labelled by tenant); None when none changed."""
        deltas = self.tenants.take_deltas()
        if not deltas:
            return None
        stats = OffloadingConnectorStats()
        for lab, row in deltas.items():
            for f, v in row.items():
                stats.increase_counter(TENANT_METRICS[f], v, (lab,))
        return stats

    def count_tenant(self, req_context: Optional[ReqContext], **deltas: int) -> None:
        """Count for the request's tenant (its label, set by the scheduler's
        on_new_request; "default" without one)."""
        self.tenants.add(_tenant_of(req_context), **deltas)

    # -- engine steps ----------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        rid = req_context.req_id
        self._answers.pop(rid, None)
        self._origin.pop(rid, None)
        self._waits.pop(rid, None)

    def on_schedule_end(self, context: Any) -> None:
        self.cascade.poll()
        for a in self._answers.values():  # the next lookup answers afresh
            a.clear()

    def has_pending_work(self) -> bool:
        self.cascade.poll()
        s = self.cascade.stats()
        return bool(s["promotions_now"] or s["reads_now"] or s["deferred_now"] or s["lent_now"])

    def reset_cache(self) -> None:
        self.cascade.invalidate()
        self._answers.clear()
        self._origin.clear()
        self._failed.clear()
        self._names.clear()

    def stats(self) -> dict[str, Any]:
        """The cascade's counters, the host tier's store statistics and this
        manager's counters (lookups: cascade
        lookup calls, lookup_keys, fallback_lookups: single keys outside a
        request's chunks, stores_failed: stores the worker could not copy)
        and the counters per tenant (TENANT_FIELDS, by label:
        kvoffload.tenants)."""
        return {"cascade": self.cascade.stats(), "host": self.cascade.host_stats(), "manager": dict(self.counts),
                "tenants": self.tenants.snapshot()}

    def shutdown(self) -> None:
        c = self.cascade
        ft, rt, arena = c.file_tier, c.remote_tier, c.arena
        try:
            c.flush(30_000)
        except L.KvoError:
            pass
        c.close()
        for t in (ft, rt):
            if t is not None:
                if hasattr(t, "flush"):
                    try:
                        t.flush(30_000)
                    except L.KvoError:
                        pass
                t.close()
        if arena is not None:
            arena.close()


class _Block:
    """A block as update_state_after_alloc reads it, its hash hidden."""
    __slots__ = ("block_id", "is_null", "block_hash")

    def __init__(self, b: Any) -> None:
        self.block_id, self.is_null, self.block_hash = b.block_id, b.is_null, None


class _Unhashed:
    """A request's newly allocated blocks with the hashes of those past its
    locally computed tokens hidden.  vLLM's scheduler finds the blocks to
    load as the first unhashed ones past the local hit: true of an
    asynchronous load, whose blocks are cached once it lands; a synchronous
    load's blocks are cached at once (the load runs before any forward reads
    them), so they carry their hashes already."""

    def __init__(self, blocks: Any, req_status: Any, group_configs: Any) -> None:
        local = req_status.num_locally_computed_tokens
        self.blocks = list(blocks.blocks)
        for gc in group_configs:
            first = -(-local // gc.tokens_per_block)
            bl = self.blocks[gc.group_idx]
            self.blocks[gc.group_idx] = list(bl[:first]) + [_Block(b) for b in bl[first:]]


class KvoffloadConnectorScheduler(OffloadingConnectorScheduler):
    """vLLM's offloading scheduler with the prompt looked up in one call per
    group (CascadeManager.lookup_request) and, with sync_loads, loads in the
    request's first step (module doc)."""

    manager: CascadeManager

    def __init__(self, spec: Any, vllm_config: Any, kv_cache_config: Any, sync_loads: bool) -> None:
        super().__init__(spec, vllm_config, kv_cache_config)
        for attr in ("_req_status", "_jobs", "_current_batch_load_jobs", "_chunks_being_loaded",
                     "_stale_job_threshold"):
            if not hasattr(self, attr):  # vLLM's scheduler changed shape: refuse rather than guess
                raise L.KvoError(L.KVO_ENOTSUP, f"this vLLM's OffloadingConnectorScheduler has no {attr}: "
                                 "KvoffloadConnector cannot drive it", "KvoffloadConnectorScheduler")
        self.sync_loads = sync_loads
        # loads run in this step (job id -> [request id, keys, workers still due, request context])
        self._sync_jobs: dict[int, list[Any]] = {}
        self._batch_sync: set[int] = set()
        # requests whose load failed: recomputed, never offered a load again
        # (a load failing again and again would otherwise send a request
        # back and forth between its load and its recompute)
        self._load_failed: set[str] = set()

    def on_new_request(self, request: Any) -> None:
        super().on_new_request(request)
        st = self._req_status.get(request.request_id)
        if st is not None:
            salt = getattr(request, "cache_salt", None) or None
            st.req_context.set_state(_Tenant(salt, self.manager.cascade.tenant_part(salt)))

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int,
                                   max_num_new_tokens: Optional[int] = None) -> tuple[Optional[int], bool]:
        if request.request_id in self._load_failed:
            return 0, False
        st = self._req_status.get(request.request_id)
        if st is not None and not st.transfer_jobs and not request.skip_reading_prefix_cache:
            st.update_offload_keys()
            groups = []
            for gc, gs in zip(self.config.kv_group_configs, st.group_states):
                first = num_computed_tokens // gc.tokens_per_chunk
                groups.append((gs.offload_keys[first:], gc.sliding_window_size_in_chunks is None))
            self.manager.lookup_request(st.req_context, groups)
        if self.sync_loads:
            # a load in the step leaves the last token to compute (a hit of
            # the whole prompt would leave the step nothing to schedule)
            cap = request.num_tokens - 1 - num_computed_tokens
            if cap <= 0:
                return 0, False
            max_num_new_tokens = cap if max_num_new_tokens is None else min(cap, max_num_new_tokens)
        n, load_async = super().get_num_new_matched_tokens(request, num_computed_tokens, max_num_new_tokens)
        t = st.req_context.get_state(_Tenant) if st is not None else None
        if n is not None and t is not None and not t.counted:
            t.counted = True   # the first definite answer
            self.manager.count_tenant(st.req_context, requests=1, hit_tokens=n,
                                      lookup_tokens=max(0, request.num_tokens - num_computed_tokens))
        return n, (load_async and not self.sync_loads)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if not self.sync_loads or num_external_tokens == 0:
            super().update_state_after_alloc(request, blocks, num_external_tokens)
            return
        before = set(self._current_batch_load_jobs)
        super().update_state_after_alloc(request, _Unhashed(blocks, self._req_status[request.request_id],
                                                            self.config.kv_group_configs), num_external_tokens)
        for job_id in set(self._current_batch_load_jobs) - before:
            # the load runs before this step's forward: out of vLLM's
            # asynchronous bookkeeping (which refuses stores next to a load)
            status = self._jobs.pop(job_id)
            rs = self._req_status[status.req_id]
            rs.transfer_jobs.discard(job_id)
            self._sync_jobs[job_id] = [status.req_id, status.keys, status.pending_count, rs.req_context]
            self._batch_sync.add(job_id)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        from .connector import KvoffloadConnectorMetadata
        meta = super().build_connector_meta(scheduler_output)
        out = KvoffloadConnectorMetadata(load_jobs=meta.load_jobs, store_jobs=meta.store_jobs,
                                         jobs_to_flush=meta.jobs_to_flush, sync_load_jobs=self._batch_sync)
        self._batch_sync = set()
        return out

    def update_connector_output(self, connector_output: Any) -> None:
        meta = connector_output.kv_connector_worker_meta
        if meta is not None:
            for job_id in getattr(meta, "failed_jobs", {}):
                status = self._jobs.get(job_id)
                sync = self._sync_jobs.get(job_id)
                if status is not None and status.is_store:
                    self.manager.fail_stores(status.keys)
                elif status is not None or sync is not None:
                    rid = status.req_id if status is not None else sync[0]
                    if rid not in self._load_failed:
                        self._load_failed.add(rid)
                        rs = self._req_status.get(rid)
                        self.manager.count_tenant(rs.req_context if rs is not None else None, load_failures=1)
            done = meta.completed_jobs
            for job_id in [j for j in done if j in self._sync_jobs]:
                entry = self._sync_jobs[job_id]
                entry[2] -= done.pop(job_id)
                if entry[2] <= 0:
                    del self._sync_jobs[job_id]
                    self.manager.complete_load(entry[1], entry[3])
                    if self._chunks_being_loaded:
                        self._chunks_being_loaded.difference_update(entry[1])
        super().update_connector_output(connector_output)

    def request_finished(self, request: Any) -> tuple[bool, Any]:
        self._load_failed.discard(request.request_id)
        return super().request_finished(request)

    def has_pending_push_work(self) -> bool:
        return bool(self._sync_jobs) or super().has_pending_push_work()

    def reset_cache(self) -> None:
        super().reset_cache()
        self._sync_jobs.clear()  # their pins went with the cache; late reports are ignored
