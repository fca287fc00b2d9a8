"""KvoffloadConnector: kvoffload's own vLLM KV connector (a KVConnectorBase_V1
with scheduler and worker roles and vLLM's hybrid-memory interface).

    kv_transfer_config = {
        "kv_connector": "KvoffloadConnector",
        "kv_connector_module_path": "kvoffload.vllm.connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": 8 << 30,        # host tier (slot space)
            "blocks_per_chunk": 4,
            "eviction_policy": "lru",           # lru | arc | s3fifo | branch
            "kvo_file_root": "/var/cache/kvo",  # optional file tier
            "kvo_file_bytes": 100 << 30,
            "kvo_file_mode": "write_through",   # or write_back
            "kvo_redis_url": "redis://10.0.0.5:7000",  # optional Redis Cluster tier
        }}

The extra-config keys are the spec's (kvoffload.vllm: KvoffloadOffloadingSpec
parses them, builds the plan, the shared arena and the tiers) plus:
  kvo_sync_loads     (default true) load a request's prefix in its first
                     step; with several KV-cache groups vLLM cannot take a
                     failed load back block by block, so such models load a
                     step ahead (asynchronously) whatever this says
  kvo_redis_lookup_budget_us  (default 20000) how long a request waits for
                     the Redis Cluster's presence answers before its
                     unanswered chunks count as misses
  kvo_verify_checksums (default false) the cascade's host checksums
  kvo_load_failure_policy (default "recompute") vLLM's kv_load_failure_policy
                     for this engine: a load that fails is recomputed
                     ("fail": vLLM fails the request instead)
  kvo_fault_loads, kvo_fault_stores  (tests) fail every k-th load / store job

What it is made of: the scheduler side is vLLM's own offloading scheduler
(which chunks of which group a request needs, the fences of stores) over
CascadeManager (connector_scheduler.py), which translates vLLM's manager
calls into kvoffload.cascade.Cascade calls: the whole prompt looked up in
one call per group, lower-tier chunks promoted from the lookup on, stores
with staging and counted refusals.  The worker side (connector_worker.py)
is vLLM's offloading worker driver with kvoffload's transfer engine
(worker.py), loads that run before the forward that needs them, and
failures reported as recomputes.  Against vLLM's OffloadingConnector with
kvoffload's spec, a loaded request takes as many engine steps as a device
hit (one), and a failed copy is recomputed instead of an assert."""
from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (OffloadingConnectorMetadata,
                                                                            OffloadingWorkerMetadata)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.v1.kv_offload.base import OffloadingCounterMetadata, OffloadingManager

from .. import _lib as L
from ..cascade import Cascade
from ..tenants import check_label
from .config import int_key, kvo_namespace
from .connector_scheduler import TENANT_METRICS, CascadeManager, KvoffloadConnectorScheduler
from .connector_worker import KvoffloadConnectorWorker
from .spec import KvoffloadOffloadingSpec

log = logging.getLogger(__name__)

_LIVE: "weakref.WeakSet[KvoffloadConnector]" = weakref.WeakSet()


@dataclass
class KvoffloadConnectorMetadata(OffloadingConnectorMetadata):
    """vLLM's offloading metadata and the load jobs that run before this
    step's forward."""
    sync_load_jobs: set[int] = field(default_factory=set)


@dataclass
class KvoffloadWorkerMetadata(OffloadingWorkerMetadata):
    """vLLM's worker metadata and the jobs that failed ({job id: workers})."""
    failed_jobs: dict[int, int] = field(default_factory=dict)

    def aggregate(self, other: Any) -> "KvoffloadWorkerMetadata":
        merged = super().aggregate(other)
        failed = dict(self.failed_jobs)
        for j, v in getattr(other, "failed_jobs", {}).items():
            failed[j] = failed.get(j, 0) + v
        return KvoffloadWorkerMetadata(completed_jobs=merged.completed_jobs, transfer_stats=merged.transfer_stats,
                                       failed_jobs=failed)


class KvoffloadConnectorSpec(KvoffloadOffloadingSpec):
    """The spec's parsing, arena, tiers and worker; the manager is a
    CascadeManager over one Cascade of them."""

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """vLLM's Prometheus counters of the per-tenant counts
        (CascadeManager.get_stats), labelled by tenant (kvoffload.tenants)."""
        defs = dict(super().build_metric_definitions(extra_config))
        for f, name in TENANT_METRICS.items():
            defs[name] = OffloadingCounterMetadata(
                documentation=f"KvoffloadConnector: {f.replace('_', ' ')} per tenant (cache_salt, by label)",
                labelnames=("tenant",))
        return defs

    def _tenant_file_tiers(self, shared: Any) -> dict[str, Any]:
        """tenant_file_bytes ({label: bytes}): a file tier of each tenant's
        own under kvo_file_root/tenants/<label>, its quota that tenant's
        share of the disk (docs/security.md, "Tenants")."""
        want = self.extra_config.get("tenant_file_bytes") or {}
        if not want:
            return {}
        if not isinstance(want, dict):
            raise TypeError(f"tenant_file_bytes must be a dict of tenant labels and bytes, not {type(want).__name__}")
        if shared is None:
            raise L.KvoError(L.KVO_EINVAL, "tenant_file_bytes needs kvo_file_root (the shared file tier beside the "
                             "tenants' own)", "KvoffloadConnector")
        root = str(self.extra_config["kvo_file_root"])
        made: dict[str, Any] = {}
        try:
            for label, n in want.items():
                made[check_label(label, "tenant_file_bytes")] = self.make_file_tier(
                    os.path.join(root, "tenants", label), int(n))
        except BaseException:
            for t in made.values():
                t.close()
            raise
        return made

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            extra = self.extra_config
            if not self.scheduler_maps_arena:
                raise L.KvoError(L.KVO_EINVAL, "KvoffloadConnector: the scheduler maps the host arena (the cascade's "
                                 "host tier); kvo_scheduler_maps_arena must stay true", "KvoffloadConnector")
            arena = self._arena()
            tiers: tuple[Any, Any] = (None, None)
            tenant_files: dict[str, Any] = {}
            try:
                tiers = self.make_tiers()
                tenant_files = self._tenant_file_tiers(tiers[0])
                mode = str(extra.get("kvo_file_mode", "write_through"))
                budget = extra.get("kvo_redis_lookup_budget_us")
                cascade = Cascade(self.plan, self.capacity_bytes, file_tier=tiers[0], remote_tier=tiers[1],
                                  arena=arena, staging_bytes=self.staging_bytes, policy=self.policy,
                                  admit_after=int_key(extra, "store_threshold", 0),
                                  event_capacity=(1 << 16) if self.kv_events_config.enable_kv_cache_events else 0,
                                  verify_checksums=bool(extra.get("kvo_verify_checksums", False)),
                                  file_mode=mode, file_zero_copy=bool(extra.get("kvo_file_zero_copy", False)),
                                  remote_lookup_budget_us=None if budget is None else int(budget),
                                  tenant_host_bytes=extra.get("tenant_host_bytes"),
                                  tenant_file_tiers=tenant_files)
                cascade._owned += list(tenant_files.values())   # closed after it (flushed by its flush)
            except BaseException:
                for t in (*tiers, *tenant_files.values()):
                    if t is not None:
                        t.close()
                arena.close()
                raise
            self._manager = CascadeManager(cascade, kvo_namespace(self.config, self.plan),  # type: ignore[assignment]
                                           [g.group_id for g in self.config.groups],
                                           enable_events=self.kv_events_config.enable_kv_cache_events,
                                           file_mode=mode)
        return self._manager  # type: ignore[return-value]


class _TenantPromMetrics(OffloadPromMetrics):
    """vLLM's offloading Prometheus metrics with KvoffloadConnectorSpec's:
    vLLM takes a connector's metric definitions from the spec its extra
    config names, and KvoffloadConnector's config names none (vLLM's CPU
    spec's are taken); the connector's own are added here."""

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: Any, per_engine_labelvalues: Any) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        meta = getattr(self, "_offloading_metric_metadata", None)
        made = getattr(self, "_offloading_metric_defs", None)
        if meta is None or made is None or not hasattr(self, "_create_metric"):
            log.warning("KvoffloadConnector: this vLLM's OffloadPromMetrics changed shape; the per-tenant counters "
                        "stay in KvoffloadConnector.stats() only")
            return
        for name, m in KvoffloadConnectorSpec.build_metric_definitions({}).items():
            if name not in meta:
                meta[name] = m
                made[name] = self._create_metric(name, m)


def sync_loads(extra: dict[str, Any], kv_cache_config: Any) -> bool:
    """Whether loads run in the request's first step: asked for
    (kvo_sync_loads, default true) and possible, that is one KV-cache group:
    vLLM takes a failed synchronous load back as block ids
    (get_block_ids_with_load_errors) and refuses those for models with
    several groups, whose failed loads it takes only as failed receives of
    asynchronous loads."""
    return bool(extra.get("kvo_sync_loads", True)) and len(kv_cache_config.kv_cache_groups) == 1


class KvoffloadConnector(OffloadingConnector):
    """kvoffload's vLLM KV connector (module doc)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        oc = build_offloading_config(vllm_config, kv_cache_config)
        self._canonical_layout = getattr(oc, "canonical_layout", False)
        self.spec = KvoffloadConnectorSpec(oc)
        self.sync_loads = sync_loads(oc.extra_config, kv_cache_config)
        self.connector_scheduler: Optional[KvoffloadConnectorScheduler] = None  # type: ignore[assignment]
        self.connector_worker: Optional[KvoffloadConnectorWorker] = None  # type: ignore[assignment]
        if role == KVConnectorRole.SCHEDULER:
            self._failure_policy(vllm_config.kv_transfer_config, oc.extra_config)
            self.connector_scheduler = KvoffloadConnectorScheduler(self.spec, vllm_config, kv_cache_config,
                                                                   self.sync_loads)
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = KvoffloadConnectorWorker(self.spec, vllm_config, kv_cache_config)
        _LIVE.add(self)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: Any,
                           per_engine_labelvalues: Any) -> Any:
        return _TenantPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @staticmethod
    def _failure_policy(ktc: Any, extra: dict[str, Any]) -> None:
        want = str(extra.get("kvo_load_failure_policy", "recompute"))
        if want not in ("recompute", "fail"):
            raise L.KvoError(L.KVO_EINVAL, f"kvo_load_failure_policy '{want}': use recompute or fail",
                             "KvoffloadConnector")
        if getattr(ktc, "kv_load_failure_policy", want) != want:
            log.info("KvoffloadConnector: kv_load_failure_policy %s (a failed load is %s)", want,
                     "recomputed" if want == "recompute" else "the request's failure")
            ktc.kv_load_failure_policy = want

    # -- loads layer by layer (worker) -----------------------------------
    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.connector_worker is not None:
            self.connector_worker.wait_for_layer(layer_name)

    def wait_for_save(self) -> None:
        assert self.connector_worker is not None
        self.connector_worker.end_forward()
        super().wait_for_save()

    # -- failures (worker) -----------------------------------------------
    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.connector_worker.take_load_errors() if self.connector_worker is not None else set()

    if hasattr(_base, "KVConnectorTransferResults") and \
            "failed_recving" in getattr(_base.KVConnectorTransferResults, "__dataclass_fields__", {}):
        def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
            sending, recving = self.get_finished(finished_req_ids)
            failed = self.connector_worker.take_failed_recving() if self.connector_worker is not None else set()
            return _base.KVConnectorTransferResults(finished_sending=set(sending or ()),
                                                    finished_recving=set(recving or ()), failed_recving=failed)

    def stats(self) -> dict[str, Any]:
        """kvoffload's counters of this side: the scheduler's manager
        (cascade and lookups) or the worker (its transfer engines' sums and
        the connector's own: loads, sync_loads, layered_loads, stores,
        load_failures, store_failures, faults_injected)."""
        if self.connector_scheduler is not None:
            return {"role": "scheduler", **self.connector_scheduler.manager.stats()}
        w = self.connector_worker
        out: dict[str, Any] = {"role": "worker"}
        if w is not None:
            out["connector"] = dict(w.counts)
            out["transfer"] = w.transfer_stats()
        return out


def live_stats() -> list[dict[str, Any]]:
    """stats() of the KvoffloadConnectors alive in this process (scheduler
    and worker when VLLM_ENABLE_V1_MULTIPROCESSING=0).  For tests and
    benchmarks."""
    return [c.stats() for c in list(_LIVE)]


__all__ = ["KvoffloadConnector", "KvoffloadConnectorSpec", "KvoffloadConnectorMetadata", "KvoffloadWorkerMetadata",
           "live_stats", "sync_loads"]
