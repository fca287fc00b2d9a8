"""KvoffloadOffloadingSpec: the OffloadingSpec vLLM's OffloadingConnector
instantiates (spec_name "KvoffloadOffloadingSpec", spec_module_path
"kvoffload.vllm" or "kvoffload.vllm.spec"): builds the plan, the shared
arena and the tiers from kv_connector_extra_config, and hands out the
scheduler's manager and the worker.

Host sizing.  Every chunk vLLM stores is first copied into a slot of the
arena (cpu_bytes_to_use), and one scheduler step offers the stores of up
to max_num_batched_tokens tokens at once: ceil(tokens / tokens per chunk)
chunks per full group (at most the window of a sliding one), each a slot.
A cpu_bytes_to_use below that one step can never take a long prompt's
stores, so the spec refuses it at create, naming the minimum (the step is
kvo_step_tokens, else vLLM's max_num_batched_tokens).  With a file or
remote tier, the part of a batch that finds no room in the host tier goes to
the cascade's staging area at the arena's end, beside the host tier's
cpu_bytes_to_use (kvo_staging_bytes; default one step of stores; the arena
is cpu_bytes_to_use + kvo_staging_bytes, then failures.MAILBOX_BYTES): its chunks are written to the
lower tiers when their stores complete and their slots are freed, so they
reach the lower tiers without a host slot, and the host tier keeps all of
cpu_bytes_to_use for the chunks it holds and the ones read back into it.
The file and remote tiers' write queues are sized for two steps
(kvo_file_max_pending_writes, kvo_file_staging_bytes,
kvo_redis_max_pending_writes override); the cascade retries a write refused
for back-pressure while its bytes are in memory and counts what is dropped
anyway (KvoffloadOffloadingManager.stats()["stores"]).

Namespaces: the chunk keys are derived from vLLM's block hashes under
config.kvo_namespace (the whole model identity, dtype, KV layout and slot
layout); the file tier's directory (kvo_file_shared) and the cluster's key
prefix are named after the slot layout (config.layout_hash)."""
from __future__ import annotations

import weakref
from typing import Any, Optional

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingSpec, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig

from .. import _lib as L
from ..core import FileTier, RemoteTier, warn_if_url_has_password
from ..shm import SharedArena
from .config import arena_name, build_plan, int_key, kvo_namespace, layout_hash, step_floor, step_stores, step_tokens
from .failures import MAILBOX_BYTES, FailedStores
from .manager import KvoffloadOffloadingManager
from .worker import KvoffloadOffloadingWorker


# managers and workers alive in this process (weak: vLLM owns them)
_LIVE_MANAGERS: "weakref.WeakSet[KvoffloadOffloadingManager]" = weakref.WeakSet()
_LIVE_WORKERS: "weakref.WeakSet[KvoffloadOffloadingWorker]" = weakref.WeakSet()


def live_stats() -> dict[str, Any]:
    """kvoffload's counters of the managers and workers alive in this
    process (all of vLLM's when VLLM_ENABLE_V1_MULTIPROCESSING=0):
    {"manager": [manager.stats(), ...], "worker": [worker.stats(), ...]}.
    For tests and benchmarks."""
    return {"manager": [m.stats() for m in list(_LIVE_MANAGERS) if m.cascade._h],
            "worker": [w.stats() for w in list(_LIVE_WORKERS) if w.engines]}


class KvoffloadOffloadingSpec(OffloadingSpec):
    """vLLM OffloadingSpec backed by kvoffload (see module doc for the
    kv_connector_extra_config keys)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra = self.extra_config
        self.capacity_bytes = int_key(extra, "cpu_bytes_to_use", 0)
        if self.capacity_bytes <= 0:
            raise L.KvoError(L.KVO_EINVAL, "kvoffload spec: cpu_bytes_to_use must be given in "
                             "kv_connector_extra_config (bytes of host slot space)", "KvoffloadOffloadingSpec")
        self.plan = build_plan(config)
        self.step_tokens = step_tokens(config)
        self.step = step_stores(config, self.plan, self.step_tokens) if self.step_tokens else []
        step_bytes = sum(b for _, _, b in self.step)
        floor = step_floor(self.step)
        if self.capacity_bytes < floor:
            per = "; ".join(f"group {g}: {n} chunks x {b // max(1, n)} bytes" for g, n, b in self.step)
            which = "" if floor == step_bytes else ", the largest group's (this vLLM does not say which slide)"
            raise L.KvoError(L.KVO_EINVAL, f"kvoffload spec: cpu_bytes_to_use {self.capacity_bytes} is below one "
                             f"scheduler step of stores ({self.step_tokens} tokens: {per}; {floor} bytes{which}): "
                             f"a long prompt's stores could never find host slots; use cpu_bytes_to_use >= "
                             f"{floor} (2x, {2 * floor}, leaves room for loads and the next step), or a "
                             f"smaller max_num_batched_tokens", "KvoffloadOffloadingSpec")
        lower = bool(extra.get("kvo_file_root") or extra.get("kvo_redis_url"))
        # the staging area is arena space beside the host tier's (not carved
        # from it: a host tier read back into must keep its size)
        stage = int_key(extra, "kvo_staging_bytes", step_bytes if lower else 0)
        if stage < 0 or (0 < stage < self.plan.max_slot_bytes):
            raise L.KvoError(L.KVO_EINVAL, f"kvoffload spec: kvo_staging_bytes {stage}: use 0 (no staging "
                             f"area) or at least one slot ({self.plan.max_slot_bytes} bytes)",
                             "KvoffloadOffloadingSpec")
        self.staging_bytes = stage if lower else 0
        self.policy = str(extra.get("eviction_policy", "lru"))
        self.arena_name = arena_name(config)
        # every worker maps the arena, and the scheduler unless told not to
        # (kvo_scheduler_maps_arena false: no file tier then); the last of
        # them to attach removes the name
        self.scheduler_maps_arena = bool(extra.get("kvo_scheduler_maps_arena", True))
        self.arena_expected = int_key(extra, "kvo_arena_processes",
                                   max(1, config.parallel.world_size) + int(self.scheduler_maps_arena))
        self._manager: Optional[KvoffloadOffloadingManager] = None
        self._worker: Optional[KvoffloadOffloadingWorker] = None

    def _arena(self) -> SharedArena:
        """The shared arena: the host tier, the staging area, and the failed
        stores' mailbox at its end (failures.py)."""
        return SharedArena(self.arena_name, self.mailbox_offset + MAILBOX_BYTES, self.plan.fingerprint,
                           expected=self.arena_expected,
                           directory=str(self.extra_config.get("kvo_shm_dir", "/dev/shm")))

    @property
    def mailbox_offset(self) -> int:
        """Where the failed stores' mailbox starts in the arena."""
        return self.capacity_bytes + self.staging_bytes

    def failed_stores(self, arena: SharedArena) -> Optional[FailedStores]:
        """The failed stores' mailbox in this arena; None when the scheduler
        does not map the arena (kvo_scheduler_maps_arena false): a failed
        store is then reported failed to vLLM."""
        if not self.scheduler_maps_arena:
            return None
        return FailedStores(arena.view(self.mailbox_offset, MAILBOX_BYTES))

    def make_file_tier(self, root: str, quota_bytes: int) -> FileTier:
        """A file tier at root as kv_connector_extra_config asks for (shared,
        policy, queues), its write queue sized for two steps of stores (each
        write is copied into the tier's staging memory at once)."""
        extra = self.extra_config
        shared = bool(extra.get("kvo_file_shared", False))
        step_chunks = sum(n for _, n, _ in self.step)
        step_bytes = sum(b for _, _, b in self.step)
        return FileTier(root, self.plan, quota_bytes, policy=self.policy, shared=shared,
                        layout_hash=layout_hash(self.config) if shared else 0,
                        max_pending_writes=int_key(extra, "kvo_file_max_pending_writes",
                                                   min(1 << 16, max(64, 2 * step_chunks))),
                        max_staging_bytes=int_key(extra, "kvo_file_staging_bytes", max(64 << 20, 2 * step_bytes)))

    def make_tiers(self) -> tuple[Optional[FileTier], Optional[RemoteTier]]:
        """The file and remote tiers kv_connector_extra_config asks for (each
        None when not configured), their write queues sized for two steps of
        stores; the caller owns them (the manager closes them)."""
        extra = self.extra_config
        file_tier = None
        root = extra.get("kvo_file_root")
        step_chunks = sum(n for _, n, _ in self.step)
        if root:
            file_tier = self.make_file_tier(str(root), int_key(extra, "kvo_file_bytes", 0))
        remote_tier = None
        url = extra.get("kvo_redis_url")
        if url:
            warn_if_url_has_password(str(url), "kvo_redis_url")
            try:
                if not self.scheduler_maps_arena:
                    raise L.KvoError(L.KVO_EINVAL, "kvo_redis_url needs the scheduler to map the arena "
                                     "(kvo_scheduler_maps_arena true)", "KvoffloadOffloadingSpec")
                remote_tier = RemoteTier(str(url), self.plan,
                                         key_prefix=str(extra.get("kvo_redis_prefix", "kvo")),
                                         layout_hash=layout_hash(self.config),
                                         ttl_s=int_key(extra, "kvo_redis_ttl_s", 0),
                                         io_threads=int_key(extra, "kvo_redis_io_threads", 0),
                                         max_pending_writes=int_key(
                                             extra, "kvo_redis_max_pending_writes",
                                             min(1 << 16, max(64, 2 * step_chunks))))
            except BaseException:
                if file_tier is not None:
                    file_tier.close()
                raise
        return file_tier, remote_tier

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            extra = self.extra_config
            if extra.get("tenant_host_bytes") or extra.get("tenant_file_bytes"):
                raise L.KvoError(L.KVO_ENOTSUP, "tenant_host_bytes / tenant_file_bytes: tenant quotas need the "
                                 "request's tenant at every manager call; use KvoffloadConnector (docs/engines.md)",
                                 "KvoffloadOffloadingSpec")
            arena = None
            if self.scheduler_maps_arena:
                arena = self._arena()
            try:
                file_tier, remote_tier = self.make_tiers()
            except BaseException:
                if arena is not None:
                    arena.close()
                raise
            try:
                self._manager = KvoffloadOffloadingManager(
                    self.plan, self.capacity_bytes + self.staging_bytes, [g.group_id for g in self.config.groups],
                    policy=self.policy,
                    enable_events=self.kv_events_config.enable_kv_cache_events, arena=arena, file_tier=file_tier,
                    file_mode=str(extra.get("kvo_file_mode", "write_through")),
                    store_threshold=int_key(extra, "store_threshold", 0), remote_tier=remote_tier,
                    remote_answer_ttl_ms=int_key(extra, "kvo_redis_answer_ttl_ms", 2000),
                    staging_bytes=self.staging_bytes, file_zero_copy=bool(extra.get("kvo_file_zero_copy", False)),
                    namespace=kvo_namespace(self.config, self.plan),
                    remote_lookup_budget_us=extra.get("kvo_redis_lookup_budget_us"),
                    failed_stores=self.failed_stores(arena) if arena is not None else None)
            except BaseException:
                for part in (file_tier, remote_tier, arena):
                    if part is not None:
                        part.close()
                raise
            _LIVE_MANAGERS.add(self._manager)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            arena = self._arena()
            try:
                self._worker = KvoffloadOffloadingWorker(self, kv_caches, arena)
            except BaseException:
                arena.close()
                raise
            _LIVE_WORKERS.add(self._worker)
        return self._worker
