"""Worker side of KvoffloadConnector (connector.py): KvoffloadConnectorWorker,
vLLM's offloading worker driver with loads that run before the forward
that needs them and failures that vLLM recomputes instead of asserting.

vLLM's OffloadingConnectorWorker maps the KV caches to canonical tensors
(register_kv_caches) and hands them to the spec's worker, here
kvoffload's KvoffloadOffloadingWorker (worker.py: the transfer engine
copies between the tensors and the shared arena's slots).  What differs:

  loads     a job the scheduler marked synchronous (metadata
            sync_load_jobs) is submitted in start_load_kv, which vLLM calls
            before the forward when a step has such loads, and waited for
            there: its request is scheduled in this very step.  Other load
            jobs run asynchronously as in vLLM's connector and report their
            request in finished_recving.
  stores    deferred to the start of the next step, as vLLM's connector does
            (after the sampling transfers), and never waited for by the step
            unless vLLM asks for a flush (a block about to be reused).
  failures  a job the transfer engine refuses or reports failed is never an
            assert: a failed synchronous load reports its destination blocks
            in get_block_ids_with_load_errors (vLLM recomputes them), a
            failed asynchronous load reports its request in failed_recving
            (vLLM recomputes it), a failed store goes back to the scheduler
            in the worker metadata (failed_jobs) and its chunks never become
            visible.

Fault injection (tests): kv_connector_extra_config kvo_fault_loads = k fails
every k-th load job and kvo_fault_stores = k every k-th store job, as if the
transfer engine had refused them (nothing is copied)."""
from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import OffloadingConnectorWorker

from .. import _lib as L


class KvoffloadConnectorWorker(OffloadingConnectorWorker):
    """vLLM's offloading worker driver with synchronous loads and failures
    reported as recomputes (module doc)."""

    def __init__(self, spec: Any, vllm_config: Any, kv_cache_config: Any) -> None:
        super().__init__(spec, vllm_config, kv_cache_config)
        for attr in ("_load_jobs", "_unsubmitted_store_jobs", "_connector_worker_meta", "_is_store_writer"):
            if not hasattr(self, attr):
                raise L.KvoError(L.KVO_ENOTSUP, f"this vLLM's OffloadingConnectorWorker has no {attr}: "
                                 "KvoffloadConnector cannot drive it", "KvoffloadConnectorWorker")
        from .connector import KvoffloadWorkerMetadata
        self._connector_worker_meta = KvoffloadWorkerMetadata()
        extra = spec.extra_config
        self._fault = {"load": int(extra.get("kvo_fault_loads", 0) or 0),
                       "store": int(extra.get("kvo_fault_stores", 0) or 0)}
        self._n = {"load": 0, "store": 0}
        self._failed_submit: list[int] = []
        self._load_blocks: dict[int, list[int]] = {}  # synchronous load job -> destination blocks
        self._load_errors: set[int] = set()
        self._failed_recving: set[str] = set()
        self.counts = dict(loads=0, sync_loads=0, stores=0, load_failures=0, store_failures=0, faults_injected=0)

    def _injected(self, kind: str) -> bool:
        k = self._fault[kind]
        if not k:
            return False
        self._n[kind] += 1
        if self._n[kind] % k:
            return False
        self.counts["faults_injected"] += 1
        return True

    def _submit_store(self, job_id: int, src: Any, dst: Any) -> None:
        assert self.worker is not None
        self.counts["stores"] += 1
        if self._injected("store") or not self.worker.submit_store(job_id, src, dst):
            self._failed_submit.append(job_id)

    def _submit_stores(self) -> None:
        for job_id, src, dst in self._unsubmitted_store_jobs:
            self._submit_store(job_id, src, dst)
        self._unsubmitted_store_jobs.clear()

    def handle_preemptions(self, metadata: Any) -> None:
        assert self.worker is not None
        flush = metadata.jobs_to_flush
        if flush:
            for job_id in flush:
                entry = metadata.store_jobs.pop(job_id, None)
                if entry is None:
                    continue
                if not self._is_store_writer:
                    self._connector_worker_meta.mark_completed(job_id)
                    continue
                self._unsubmitted_store_jobs.append((job_id, entry.src_spec, entry.dst_spec))
        self._submit_stores()
        if flush:
            self.worker.wait(flush)

    def start_kv_transfers(self, metadata: Any) -> None:
        assert self.worker is not None
        self._submit_stores()
        sync = getattr(metadata, "sync_load_jobs", None) or set()
        waits = set()
        for job_id, entry in metadata.load_jobs.items():
            self.counts["loads"] += 1
            is_sync = job_id in sync
            self._load_jobs[job_id] = None if is_sync else entry.req_id
            if is_sync:
                self.counts["sync_loads"] += 1
                self._load_blocks[job_id] = list(entry.dst_spec.block_ids)
            if self._injected("load") or not self.worker.submit_load(job_id, entry.src_spec, entry.dst_spec):
                self._failed_submit.append(job_id)
            elif is_sync:
                waits.add(job_id)
        if waits:  # this step's forward reads them
            self.worker.wait(waits)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        assert self.worker is not None
        meta = self._connector_worker_meta
        finished_recving: set[str] = set()
        results = [(r.job_id, bool(r.success), r.transfer_size, r.transfer_time)
                   for r in self.worker.get_finished()]
        results += [(j, False, None, None) for j in self._failed_submit]
        self._failed_submit = []
        for job_id, ok, size, seconds in results:
            is_load = job_id in self._load_jobs
            if ok and size is not None and seconds is not None:
                (meta.transfer_stats.load if is_load else meta.transfer_stats.store).record(size, seconds)
            meta.mark_completed(job_id)
            blocks = self._load_blocks.pop(job_id, None)
            req_id = self._load_jobs.pop(job_id, None)
            if ok:
                if req_id is not None:
                    finished_recving.add(req_id)
                continue
            if is_load:
                self.counts["load_failures"] += 1
                if blocks is not None:
                    self._load_errors.update(blocks)
                elif req_id is not None:
                    finished_recving.add(req_id)
                    self._failed_recving.add(req_id)
            else:
                self.counts["store_failures"] += 1
                meta.failed_jobs[job_id] = 1
        return set(), finished_recving

    def take_failed_recving(self) -> set[str]:
        out, self._failed_recving = self._failed_recving, set()
        return out

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def build_connector_worker_meta(self) -> Any:
        from .connector import KvoffloadWorkerMetadata
        meta = self._connector_worker_meta
        if not meta.completed_jobs:
            return None
        self._connector_worker_meta = KvoffloadWorkerMetadata()
        return meta
