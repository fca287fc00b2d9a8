"""Scheduler side: KvoffloadOffloadingManager, vLLM's OffloadingManager over
one kvoffload Cascade (kvoffload.cascade): the host tier (slots of the
shared arena, indexed and evicted by the cascade's store), an optional
staging area, an optional file tier and an optional Redis Cluster tier.

The manager translates and does nothing else: the way a chunk takes
through the tiers (where a lookup finds it, promotion into host slots,
write-through or write-back, staging, retries and back-pressure, what is
dropped and counted) is the cascade's (include/kvoffload/kvo_cascade.h,
docs/cascade.md).  What it translates:

  keys      an OffloadKey (block hash + big-endian group id) becomes the
            chunk key kvo_namespace_keys(namespace, block hash, group
            index); the namespace (config.kvo_namespace) holds the whole
            model identity, dtype and KV layout, so engines serving other
            models never share a key in any tier.  vLLM's block hashes
            already include a request's cache_salt.
  lookup    one key, KVO_CASCADE_PROMOTE: READY -> HIT; PENDING in the host
            tier (a store, or a lower tier's chunk on its way into a host
            slot) -> HIT_PENDING; PENDING in a lower tier (a file write still
            queued, the cluster's answer still out within the request's
            budget, every free host slot lent to file writes) -> RETRY; MISS.
  stores    prepare_store's HOST and STAGED slots are the PrepareStoreOutput
            (keys that found no room anywhere are left out; None when that
            is every key to store); complete_store hands the chunks to the
            lower tiers.
  events    the host tier's events (stored, evicted, removed) with vLLM's
            keys; a failed store is a metadata-only removal where vLLM has
            one (compat.failed_store_event).

The compiled module kvoffload._hot makes the per-key and per-batch calls:
one C call each, no Python bytecode per key."""
from __future__ import annotations

import ctypes
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

from vllm.v1.kv_offload.base import (LoadStoreSpec, LookupResult, Medium, OffloadingEvent, OffloadingManager,
                                     OffloadKey, PrepareStoreOutput, ReqContext, RequestOffloadingContext)

from .. import _lib as L

try:
    from .._hot import Hot
except ImportError as e:  # a checkout used without building the package
    raise ImportError("kvoffload._hot (the vLLM manager's compiled calls, python/kvoffload/_hot.c) is not "
                      "built: pip install ./python, or in a checkout tools/test-python.sh (CMake target _hot "
                      "of python/CMakeLists.txt; needs a C compiler and the Python headers, Debian's python3-dev); "
                      f"import error: {e}") from e
from ..cascade import OP_PROMOTE, Cascade, CascadeWait
from ..core import KEY_DTYPE, FileTier, Plan, RemoteTier
from ..shm import SharedArena
from .compat import failed_store_event, lower_tier_events
from .config import KvoffloadLoadStoreSpec
from .failures import FailedStores

_RESULTS = (LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.RETRY)
# the functions the compiled calls make (kvoffload/_hot.c), from the library kvoffload._lib loaded
_HOT_FUNCTIONS = ("kvo_cascade_lookup", "kvo_cascade_prepare_load", "kvo_cascade_complete_load",
                  "kvo_cascade_touch", "kvo_cascade_prepare_store", "kvo_cascade_complete_store",
                  "kvo_cascade_store", "kvo_store_drain_events", "kvo_store_peek", "kvo_namespace_keys",
                  "kvo_last_error")
_STORED, _EVICTED = 1, 2   # kvo_store_event_type (3: removed)
_EMPTY = KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32))


class KvoffloadOffloadingManager(OffloadingManager):
    """vLLM's OffloadingManager over a kvoffload Cascade (see module doc).

    capacity_bytes: the arena's slot space; with a lower tier and an arena,
    its last staging_bytes are the staging area and the rest the host tier.
    namespace: the chunk keys' namespace (config.kvo_namespace; 0 for a
    manager alone).  policy: the host tier's eviction (lru, arc, s3fifo,
    prefix; "branch" is taken as the library names it).
    remote_answer_ttl_ms / remote_lookup_budget_us: how long the cluster's
    answers are reused / a request's lookups answer RETRY for answers still
    out (the cascade's remote_exists_ttl_ms / remote_lookup_budget_us).  The
    tiers and the arena are the manager's from here on: shutdown closes
    them."""

    def __init__(self, plan: Plan, capacity_bytes: int, group_ids: Sequence[int], policy: str = "lru",
                 enable_events: bool = False, arena: Optional[SharedArena] = None,
                 file_tier: Optional[FileTier] = None, file_mode: str = "write_through",
                 store_threshold: int = 0, remote_tier: Optional[RemoteTier] = None,
                 remote_answer_ttl_ms: int = 2000, staging_bytes: int = 0, file_zero_copy: bool = False,
                 namespace: int = 0, remote_lookup_budget_us: Optional[int] = None,
                 failed_stores: Optional[FailedStores] = None) -> None:
        self.plan = plan
        lower = file_tier is not None or remote_tier is not None
        if lower and arena is None:
            raise L.KvoError(L.KVO_EINVAL, "a file or remote tier needs the shared arena (the chunk bytes)",
                             "manager")
        if not (lower and arena is not None):
            staging_bytes = 0
        slot = plan.max_slot_bytes
        if staging_bytes and (staging_bytes < slot or capacity_bytes - staging_bytes < slot):
            raise L.KvoError(L.KVO_EINVAL, f"staging_bytes {staging_bytes}: need at least one slot ({slot} bytes) "
                             f"for it and for the host tier out of {capacity_bytes}", "manager")
        self.capacity_bytes = capacity_bytes - staging_bytes
        self.staging_bytes = staging_bytes
        self.policy = policy
        self.medium = Medium.CPU
        self.events: Optional[list[OffloadingEvent]] = [] if enable_events else None
        self.arena, self.file_tier, self.remote_tier = arena, file_tier, remote_tier
        self.file_mode = file_mode
        # the workers' failed stores (slot offsets), and those read but not
        # yet matched to a completing key
        self._mailbox = failed_stores
        self._failed: set[int] = set()
        self.stores_failed = 0   # keys completed as failed stores (vLLM's or the mailbox's)
        # the host tier's events give vLLM its keys back (evictions in
        # PrepareStoreOutput, events): room for what one drain may meet
        min_slot = min(int(g["slot_bytes"]) for g in plan.groups if g["slot_bytes"])
        events = min(1 << 22, 2 * (self.capacity_bytes // min_slot) + 4096)
        # without an arena (kvo_scheduler_maps_arena false: no lower tier) the
        # cascade maps its own, never touched: not pre-faulted
        self.cascade = Cascade(plan, self.capacity_bytes, arena=arena, staging_bytes=staging_bytes,
                               file_tier=file_tier, remote_tier=remote_tier, policy=policy,
                               admit_after=store_threshold, event_capacity=events, file_mode=file_mode,
                               file_zero_copy=bool(file_zero_copy), remote_exists_ttl_ms=remote_answer_ttl_ms,
                               remote_lookup_budget_us=remote_lookup_budget_us, prefault=arena is not None)
        self.store = self.cascade.host_store()
        self._names: dict[bytes, OffloadKey] = {}   # chunk key record -> OffloadKey (stored or on its way)
        groups = [(L.check_int("group_ids", int(g), 0, 0xFFFFFFFF), i) for i, g in enumerate(group_ids)]
        L.check_int("namespace", namespace, 0, (1 << 128) - 1)
        self._hot = Hot(groups, (namespace & ((1 << 64) - 1), namespace >> 64),
                        L.addresses(L.lib, _HOT_FUNCTIONS), _RESULTS, L.KvoError, self._names)
        self._waits: dict[str, CascadeWait] = {}     # with a remote tier: the budget of each request's lookups

    # -- key conversion ---------------------------------------------------
    def _ckeys(self, keys: Sequence[OffloadKey]) -> np.ndarray:
        """The chunk keys (KEY_DTYPE) of OffloadKeys."""
        return np.frombuffer(self._hot.pack(keys), dtype=KEY_DTYPE).copy()

    def _wait(self, req_context: ReqContext) -> Optional[int]:
        """The address of the request's lookup budget (None without a remote tier)."""
        if self.remote_tier is None:
            return None
        w = self._waits.get(req_context.req_id)
        if w is None:
            w = self._waits[req_context.req_id] = CascadeWait()
        return ctypes.addressof(w)

    def _drain(self) -> list[OffloadKey]:
        """The host tier's events since the last drain into self.events;
        returns the evicted keys."""
        return self._events(self._hot.drain(self.cascade._h, self.events is not None))

    def _events(self, runs: list[tuple[int, list[OffloadKey]]]) -> list[OffloadKey]:
        evicted: list[OffloadKey] = []
        for kind, keys in runs:
            if kind == _EVICTED:
                evicted += keys
            if self.events is not None:
                self.events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=kind != _STORED))
        return evicted

    # -- OffloadingManager --------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # vLLM's one per-key call: one C call (the key derived, the cascade asked)
        return self._hot.lookup(self.cascade._h, key, self._wait(req_context) if self.remote_tier else None)

    def prefix_hits(self, keys: Sequence[OffloadKey], req_context: Optional[ReqContext] = None) -> int:
        """Batched form of the per-key lookup loop vLLM runs for a request's
        prefix: how many leading keys are READY (host tier), one C call for
        all of them; the lower tiers' chunks before the first miss start
        their promotion as lookup's do."""
        w = self._wait(req_context) if self.remote_tier is not None and req_context is not None else None
        return self._hot.prefix_hits(self.cascade._h, keys, w)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return KvoffloadLoadStoreSpec.of_bytes(*self._hot.prepare_load(self.cascade._h, keys))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._hot.touch(self.cascade._h, keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._hot.complete_load(self.cascade._h, keys)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        if type(keys) is not list:
            keys = list(keys)
        if not keys:
            return PrepareStoreOutput([], _EMPTY, [])
        to_store, offs, groups, refused, runs = self._hot.prepare_store(self.cascade._h, keys,
                                                                        self.events is not None)
        evicted = self._events(runs)
        if refused and not to_store:
            return None   # no room anywhere for any key to store: vLLM's "cannot store"
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=KvoffloadLoadStoreSpec.of_bytes(offs, groups),
                                  evicted_keys=evicted)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        if type(keys) is not list:
            keys = list(keys)
        if not keys:
            return
        if success:
            failed = self._failed_keys(keys)
            ok = [k for k in keys if k not in failed] if failed else keys
            if ok:
                self._hot.complete_store(self.cascade._h, ok, True)
                if self.events is not None:   # handed to the lower tiers: their KV events
                    self.events += lower_tier_events(ok, self.file_tier is not None and
                                                     self.file_mode == "write_through", self.remote_tier is not None)
            if not failed:
                return
            keys = failed
        elif self._failed:
            # their slots are free again: an offset read for one of them
            # must not fail the next key given that slot
            self._failed.difference_update(self._offsets(keys))
        self._drain()   # events before the failure keep their order
        self._hot.complete_store(self.cascade._h, keys, False)
        self.stores_failed += len(keys)
        if self.events is not None:
            ev = failed_store_event(keys, self.medium)
            if ev is not None:
                self.events.append(ev)

    def _offsets(self, keys: list[OffloadKey]) -> list[int]:
        """The arena offset of each key being stored, in order (-1: none,
        the key is not being stored or its slot holds no bytes)."""
        slots = self.cascade.pending_slots(self._ckeys(keys))
        return [o if b else -1 for o, b in zip(slots["offset"].tolist(), slots["bytes"].tolist())]

    def _failed_keys(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        """Of keys about to complete, those whose copy a worker reported
        failed (failures.py: the worker said done to vLLM; their slots hold
        no chunk and must never become READY)."""
        if self._mailbox is not None:
            self._failed |= self._mailbox.take()
        if not self._failed:
            return []
        out = []
        for k, off in zip(keys, self._offsets(keys)):
            if off in self._failed:   # never -1: the mailbox holds offsets
                self._failed.discard(off)
                out.append(k)
        return out

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        self._drain()
        events, self.events = self.events, []
        yield from events

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._waits.pop(req_context.req_id, None)

    def _poll(self) -> None:
        """Drive the cascade: promotions land, deferred writes are retried;
        a promotion that failed takes its key out of names."""
        comps = self.cascade.poll()
        bad = comps[(comps["op"] == OP_PROMOTE) & (comps["result"] != 0)]
        if len(bad):
            recs = np.zeros(len(bad), dtype=KEY_DTYPE)
            for f in ("lo", "hi", "group"):
                recs[f] = bad[f]
            raw = recs.tobytes()
            for i in range(len(bad)):
                self._names.pop(raw[24 * i:24 * i + 24], None)
        self._drain()

    def on_schedule_end(self, context: Any) -> None:
        self._poll()

    def has_pending_work(self) -> bool:
        # the cluster's answers still out (lookups answered RETRY): counted
        # before the poll, since the tier stops counting a read when it posts
        # its completion, not when the poll takes it; what was posted before
        # this line is taken by the poll below
        reads = self.remote_tier is not None and self.remote_tier.stats()["pending_reads"]
        self._poll()
        s = self.cascade.stats()
        # a deferred write is retried at most retry_polls steps: then counted
        return bool(reads or s["promotions_now"] or s["deferred_now"] or s["lent_now"])

    def reset_cache(self) -> None:
        # every READY chunk of the host tier goes (pinned ones when unpinned),
        # reads on their way into host slots land as failures; the lower
        # tiers keep their files and values
        self.cascade.invalidate()
        self._poll()

    def stats(self) -> dict[str, Any]:
        """Counters: "host" (the host tier's store), "cascade" (the
        cascade's own and per tier: kvo_cascade_stats), "stores" (the store
        path in short: offered, rejected (no host or staging room), staged,
        file_queued, file_deferred (refused for back-pressure, retried),
        file_lost (dropped in the end), file_lent (zero-copy writes),
        remote_queued, remote_lost, retry_now, staged_now, failed: keys
        completed as failed stores), and "file" /
        "remote" (the tiers' own stats)."""
        c = self.cascade.stats()
        f, r = c["file"], c["remote"]
        d: dict[str, Any] = {"host": self.store.stats(), "cascade": c,
                             "stores": {"offered": c["stores_offered"], "rejected": c["stores_refused"],
                                        "staged": c["stores_staged"], "file_queued": f["writes"],
                                        "file_deferred": f["writes_deferred"], "file_lost": f["writes_dropped"],
                                        "file_lent": f["lent"], "remote_queued": r["writes"],
                                        "remote_lost": r["writes_dropped"], "retry_now": c["deferred_now"],
                                        "staged_now": c["staged_now"], "failed": self.stores_failed}}
        if self.file_tier is not None:
            d["file"] = self.file_tier.stats()
        if self.remote_tier is not None:
            d["remote"] = self.remote_tier.stats()
        return d

    def shutdown(self) -> None:
        if self.cascade._h:
            try:
                self.cascade.flush(30000)   # writes waiting for a retry, and the tiers' queues
            except L.KvoError:
                pass
            self.cascade.close()   # waits for reads still landing in host slots and lent writes
        for t in (self.file_tier, self.remote_tier):
            if t is not None:
                if t is self.file_tier:
                    t.flush(-1)
                t.close()   # the remote tier sends its queued puts (bounded by its I/O timeout)
        self.file_tier = self.remote_tier = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None
