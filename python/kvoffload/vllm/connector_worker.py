"""Worker side of KvoffloadConnector (connector.py): KvoffloadConnectorWorker,
vLLM's offloading worker driver with loads that run before the forward
that needs them and failures that vLLM recomputes instead of asserting.

vLLM's OffloadingConnectorWorker maps the KV caches to canonical tensors
(register_kv_caches) and hands them to the spec's worker, here
kvoffload's KvoffloadOffloadingWorker (worker.py: the transfer engine
copies between the tensors and the shared arena's slots).  What differs:

  loads     a job the scheduler marked synchronous (metadata
            sync_load_jobs) is submitted in start_load_kv, which vLLM calls
            before the forward when a step has such loads: its request is
            scheduled in this very step.  Layer by layer where vLLM offers
            it: once a step has shown that vLLM calls wait_for_layer_load for
            every layer of the (one) offloaded group, a synchronous load is
            one job per layer on a transfer engine of per-layer groups
            (LayerLoader: the same slot bytes, segment-major) and each
            layer waits only for its own copy, so the copies of later
            layers overlap the forward of earlier ones; until then (and for
            layouts it cannot split) the whole load is waited for in
            start_load_kv.  Other load jobs run asynchronously as in vLLM's
            connector and report their request in finished_recving.
  stores    deferred to the start of the next step, as vLLM's connector does
            (after the sampling transfers), and never waited for by the step
            unless vLLM asks for a flush (a block about to be reused).
  failures  a job the transfer engine refuses or reports failed is never an
            assert: a failed synchronous load reports its destination blocks
            in get_block_ids_with_load_errors (vLLM recomputes them), a
            failed asynchronous load reports its request in failed_recving
            (vLLM recomputes it), a failed store goes back to the scheduler
            in the worker metadata (failed_jobs) and its chunks never become
            visible; a failed load goes back there too, so that its request
            is not offered a load again (it recomputes).

Fault injection (tests): kv_connector_extra_config kvo_fault_loads = k fails
every k-th load job and kvo_fault_stores = k every k-th store job, as if the
transfer engine had refused them (nothing is copied)."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import OffloadingConnectorWorker

from .. import _lib as L
from ..core import LOAD, Model, Plan, Transfer
from .worker import _ops, _submit_ops


class LayerLoader:
    """Synchronous loads of a one-group model, one transfer job per layer
    (module doc).  A plan of one kvoffload group per segment (layer) with
    its real page size; segment s of a chunk lies at B * (pages of the
    segments before s) in the worker's part of the slot, as the group's
    segment-major slot format puts it, so the bytes are those the group's
    engine stores."""

    def __init__(self, worker: Any, kv_caches: Any, layer_names: list[str], tokens_per_block: int,
                 tokens_per_hash: int, threads: int) -> None:
        (refs,) = kv_caches.group_data_refs
        if len(refs) != len(layer_names):
            raise L.KvoError(L.KVO_ENOTSUP, "layers and KV tensors do not pair up", "LayerLoader")
        self.worker = worker
        self.bpc = worker.bpc
        pages = [int(r.page_size_bytes) for r in refs]
        model = Model("layers", tokens_per_hash, [dict(name=f"l{i}", tokens_per_block=tokens_per_block, layers=1,
                                                       page_bytes=p) for i, p in enumerate(pages)])
        self.plan = Plan(model, blocks_per_chunk=self.bpc)
        device = None
        tens = [kv_caches.tensors[r.tensor_idx].tensor for r in refs]
        if tens[0].device.type != "cpu":
            device = tens[0].device.type
        self.engine = Transfer(self.plan, threads=threads, device=device, device_index=worker.device_index)
        try:
            self.engine.set_layout([dict(group=i, base=t.data_ptr(), num_blocks=int(t.shape[0]),
                                         block_stride=int(t.stride(0) * t.element_size()), page_bytes=p)
                                    for i, (t, p) in enumerate(zip(tens, pages))])
        except BaseException:
            self.engine.close()
            raise
        self.layer_of = {name: i for i, name in enumerate(layer_names)}
        self.seg_off = np.cumsum([0] + pages[:-1]).astype(np.uint64) * np.uint64(self.bpc)
        self.chunk = [int(g["chunk_bytes"]) for g in self.plan.groups]
        self.pending: dict[int, list[int]] = {}    # layer -> kvo jobs not waited for
        self.owner: dict[int, int] = {}            # kvo job -> vLLM job
        self.left: dict[int, list[Any]] = {}       # vLLM job -> [jobs left, ok, bytes, ns]

    def submit(self, job_id: int, src: Any, dst: Any) -> bool:
        """One job per layer for vLLM load job job_id (one group)."""
        w = self.worker
        blocks = np.ascontiguousarray(dst.block_ids, dtype=np.uint64)
        size, bidx = int(dst.group_sizes[0]), int(dst.block_indices[0])
        skip = bidx % self.bpc
        nchunks = -(-(size + skip) // self.bpc)
        base = np.asarray(src.offsets, dtype=np.uint64)[:nchunks] + np.uint64(w.arena.base + w.rank *
                                                                              w.worker_chunk_bytes[0])
        jobs = []
        try:
            for layer in range(len(self.chunk)):
                ops = _ops(nchunks, self.bpc, skip, size, blocks.ctypes.data, base + self.seg_off[layer],
                           self.chunk[layer])
                ops["group"] = layer
                jobs.append((layer, _submit_ops(self.engine, LOAD, ops)))
        except L.KvoError:
            self.engine.wait([j for _, j in jobs])
            for _, j in jobs:  # their results are not this job's any more
                self.owner[j] = -1
            return False
        for layer, j in jobs:
            self.pending.setdefault(layer, []).append(j)
            self.owner[j] = job_id
        self.left[job_id] = [len(jobs), True, 0, 0]
        return True

    def wait_layer(self, name: str) -> None:
        layer = self.layer_of.get(name)
        jobs = self.pending.pop(layer, None) if layer is not None else None
        if jobs:
            self.engine.wait(jobs)

    def wait_all(self) -> None:
        jobs = [j for js in self.pending.values() for j in js]
        self.pending.clear()
        if jobs:
            self.engine.wait(jobs)

    def finished(self) -> list[tuple[int, bool, int, float]]:
        """(vLLM job, ok, bytes, seconds) of the jobs whose layers all ended."""
        out = []
        for r in self.engine.poll():
            job = self.owner.pop(r["job_id"], None)
            if job is None or job < 0:
                continue
            e = self.left[job]
            e[0] -= 1
            e[1] &= r["status"] == 0
            e[2] += r["bytes"]
            e[3] += r["duration_ns"]
            if e[0] == 0:
                del self.left[job]
                out.append((job, e[1], e[2], e[3] / 1e9))
        return out

    def close(self) -> None:
        self.wait_all()
        self.engine.close()


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
        self.counts = dict(loads=0, sync_loads=0, layered_loads=0, stores=0, load_failures=0, store_failures=0,
                           faults_injected=0)
        self.layers: Optional[LayerLoader] = None
        self._layer_names: list[str] = []
        self._seen: Optional[set[str]] = None  # layers that waited in a probing step (None: not probing)
        self._layered = False                  # every layer waits: loads go layer by layer

    def _init_worker(self, kv_caches: Any) -> None:
        super()._init_worker(kv_caches)
        assert self.worker is not None
        self.worker.REPORT_FAILURES = True   # every failure is reported: loads become recomputes
        self.worker.fault_stores = 0         # the connector injects its own faults (_injected)
        groups = [self.kv_cache_config.kv_cache_groups[g.group_id] for g in self.spec.config.groups]
        if len(groups) != 1 or len(self.kv_cache_config.kv_cache_groups) != 1:
            return  # loads in the step need one KV-cache group
        names = list(groups[0].layer_names)
        try:
            self.layers = LayerLoader(self.worker, kv_caches, names, self.spec.config.groups[0].tokens_per_block,
                                      self.spec.config.cache.tokens_per_hash,
                                      int(self.spec.extra_config.get("kvo_transfer_threads", 2)))
            self._layer_names = names
        except L.KvoError:
            self.layers = None  # a layout it cannot split (aliased or packed layers): whole loads

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
            layered = is_sync and self._layered and self.layers is not None
            if self._injected("load"):
                self._failed_submit.append(job_id)
            elif layered:
                assert self.layers is not None
                self.counts["layered_loads"] += 1
                if not self.layers.submit(job_id, entry.src_spec, entry.dst_spec):
                    self._failed_submit.append(job_id)
            elif not self.worker.submit_load(job_id, entry.src_spec, entry.dst_spec):
                self._failed_submit.append(job_id)
            elif is_sync:
                waits.add(job_id)
        if waits:  # this step's forward reads them: all of it now
            self.worker.wait(waits)
            if self.layers is not None and not self._layered:
                self._seen = set()  # learn whether every layer waits

    def wait_for_layer(self, layer_name: str) -> None:
        """vLLM's wait_for_layer_load: this layer's copies (layered loads)."""
        if self._seen is not None:
            self._seen.add(layer_name)
        if self.layers is not None and self._layered:
            self.layers.wait_layer(layer_name)

    def end_forward(self) -> None:
        """After the forward (vLLM's wait_for_save): whatever layer did not
        wait is waited for; a probing step that saw every layer wait turns
        layered loads on."""
        if self.layers is not None:
            self.layers.wait_all()
        if self._seen is not None:
            self._layered = self._seen >= set(self._layer_names)
            self._seen = None

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        assert self.worker is not None
        meta = self._connector_worker_meta
        finished_recving: set[str] = set()
        results = [(r.job_id, bool(r.success), r.transfer_size, r.transfer_time)
                   for r in self.worker.get_finished()]
        if self.layers is not None:
            results += self.layers.finished()
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
            meta.failed_jobs[job_id] = 1
            if is_load:
                self.counts["load_failures"] += 1
                if blocks is not None:
                    self._load_errors.update(blocks)
                elif req_id is not None:
                    finished_recving.add(req_id)
                    self._failed_recving.add(req_id)
            else:
                self.counts["store_failures"] += 1
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

    def transfer_stats(self) -> dict[str, int]:
        """The transfer engines' counters summed (the groups' and the
        layered loads')."""
        out: dict[str, int] = dict(self.worker.stats()) if self.worker is not None else {}
        if self.layers is not None:
            for k, v in self.layers.engine.stats().items():
                if isinstance(v, int) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        return out

    def shutdown(self) -> None:
        if self.layers is not None:
            self.layers.close()
            self.layers = None
        super().shutdown()
