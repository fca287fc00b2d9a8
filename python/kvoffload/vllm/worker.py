"""Worker side: KvoffloadOffloadingWorker copies between vLLM's KV tensors
and the shared arena's slots with kvoffload's transfer engine (the host
device for CPU tensors; the CUDA device, kvoffload.core.CudaDevice, for GPU
tensors when the CUDA device library is there).

GPU tensors: the CUDA device of the tensors' own device (rank N: cuda:N),
the arena pinned for DMA (when pinning fails, as it may under a locked-memory
limit, a warning is logged and the copies run unpinned, as vLLM does), and
every job ordered after the work torch had queued on its current stream when
the job was submitted (a store reads what the forward pass wrote; a load
overwrites blocks vLLM may still be zeroing).

A replicated layout (vLLM's replicated_layout: an MLA model at tensor
parallel N holds the same bytes on every rank) keeps one copy per slot:
rank 0 stores it, every rank loads it (config.slot_part); other layouts keep
one part per rank.

Failures.  vLLM 0.32 and 0.33 assert that every submit and every transfer
result succeeded: one reported failure stops the engine.  Unless
REPORT_FAILURES is set (KvoffloadConnector sets it: it turns failures into
recomputes), the worker therefore reports:
- a failed STORE (its copies failed, or it could not be submitted) done,
  with no bytes, after writing the job's slot offsets to the failed-store
  mailbox (failures.py): the manager completes those keys as failed, so
  their slots never become loadable.  Without room in the mailbox, or
  without one (kvo_scheduler_maps_arena false), it reports the store failed
  and vLLM stops: loud, never a slot served that holds no chunk.
- a failed LOAD failed (success=False): its blocks hold no loaded KV and
  vLLM's offloading interface cannot take them back for recompute, so vLLM
  stops rather than compute on them.  Use KvoffloadConnector where a load
  must be allowed to fail (it reports load errors; vLLM recomputes).
Every failed job is logged and kept in failed_jobs; a failed load's GPU
block ids go to load_error_blocks (the connector hands them to vLLM).
"""
from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING, Optional

import numpy as np

from vllm.v1.kv_offload.base import (CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker,
                                     TransferResult)

from .. import _lib as L
from ..core import LOAD, STORE, CudaDevice, Model, Plan, Transfer
from ..shm import SharedArena
from .config import KvoffloadLoadStoreSpec, replicated, slot_part
from .failures import RANKS

if TYPE_CHECKING:
    from .spec import KvoffloadOffloadingSpec

log = logging.getLogger("kvoffload.vllm")


def torch_stream(device_index: int) -> int:
    """torch's current stream on a device as a cudaStream_t (1 = the legacy
    default stream, since torch reports it as 0 and 0 means none to
    kvo_cuda)."""
    import torch
    return int(torch.cuda.current_stream(device_index).cuda_stream) or 1


# kvo_xfer_op as a numpy record (the ctypes struct's own offsets), so a
# job's ops are built with a few vector operations, not one Python object
# per chunk (256 chunks: ~5 ms that way, inside a request's first token)
_OP = np.dtype({"names": ["group", "first_block", "n_blocks", "engine_blocks", "slot", "slot_bytes"],
                "formats": ["<u4", "<u4", "<u4", "<u8", "<u8", "<u8"],
                "offsets": [getattr(L.XferOp, f).offset for f in
                            ("group", "first_block", "n_blocks", "engine_blocks", "slot", "slot_bytes")],
                "itemsize": ctypes.sizeof(L.XferOp)})


def _ops(nchunks: int, bpc: int, skip: int, size: int, blocks_addr: int, slots: np.ndarray,
         slot_bytes: int) -> np.ndarray:
    """The ops of one group's part of a job: chunk c copies blocks
    [lo, hi) of the group's block list (the first chunk from block skip of
    its chunk) to or from slots[c]; blocks_addr is the address of the
    group's first block id (uint64)."""
    c = np.arange(nchunks, dtype=np.int64)
    lo = np.maximum(0, c * bpc - skip)
    hi = np.minimum(size, (c + 1) * bpc - skip)
    ops = np.zeros(nchunks, dtype=_OP)
    ops["first_block"][0] = skip
    ops["n_blocks"] = hi - lo
    ops["engine_blocks"] = np.uint64(blocks_addr) + 8 * lo.astype(np.uint64)
    ops["slot"] = slots
    ops["slot_bytes"] = slot_bytes
    return ops


def _submit_ops(t: Transfer, direction: int, ops: np.ndarray) -> int:
    """Transfer.submit for an _OP array (one C call; the engine copies
    the ops and their block lists before it returns)."""
    job = ctypes.c_uint64()
    rc = L.lib.kvo_transfer_submit(t._h, direction, ops.ctypes.data, len(ops), ctypes.byref(job))
    if rc < 0:
        raise L.KvoError(rc, L.last_error(), "kvo_transfer_submit")
    return job.value


class KvoffloadOffloadingWorker(OffloadingWorker):
    """Copies between vLLM's KV tensors and arena slots with kvoffload's
    transfer engine: one engine per offloaded group (vLLM overlays groups on
    shared tensors, which one kvoffload layout cannot describe), each with a
    one-group plan of the real page sizes (vLLM's CanonicalKVCaches)."""

    # False: a failed store is reported done (its slots failed through the
    # mailbox), a failed load failed; see the module doc.  A connector whose
    # vLLM takes failed results sets it (every failure then says False).
    REPORT_FAILURES = False

    def __init__(self, spec: "KvoffloadOffloadingSpec", kv_caches: CanonicalKVCaches,
                 arena: SharedArena) -> None:
        cfg = spec.config
        self.arena = arena
        self.bpc = cfg.cache.blocks_per_chunk
        self.rank = cfg.parallel.rank
        self.part = slot_part(cfg)
        # a replicated layout: rank 0 writes the one copy
        self.stores = not replicated(cfg) or self.rank == 0
        threads = int(cfg.extra_config.get("kvo_transfer_threads", 2))
        self.engines: list[Transfer] = []
        self.plans: list[Plan] = []
        self.worker_chunk_bytes: list[int] = []
        self.cuda: Optional[CudaDevice] = None
        self.pinned = False
        self.device_index = 0
        try:
            self._build(spec, kv_caches, threads)
        except BaseException:
            self._close_engines()
            raise
        self._jobs: dict[int, list[tuple[int, int]]] = {}   # vLLM job -> [(engine, kvo job)]
        self._left: dict[int, int] = {}
        self._ok: dict[int, bool] = {}
        self._bytes: dict[int, int] = {}
        self._ns: dict[int, int] = {}   # copy time of a job's parts, summed (vLLM's kv_offload_*_time)
        self._gpu: dict[int, np.ndarray] = {}   # a load's GPU block ids, until its result
        self._why: dict[int, str] = {}          # a job's first failure
        self._done: list[TransferResult] = []
        self.failed_jobs: dict[int, str] = {}   # vLLM job -> why (taken by take_failed_jobs)
        self.load_error_blocks: set[int] = set()
        self._store_slots: dict[int, np.ndarray] = {}   # a store's slot offsets, until its result
        # the failed stores' mailbox (one row per rank; ranks past its rows
        # report failed stores instead)
        self.mailbox = spec.failed_stores(arena) if self.rank < RANKS else None
        # test hook (kvo_fault_stores N): every Nth store job fails without a copy
        self.fault_stores = int(cfg.extra_config.get("kvo_fault_stores", 0) or 0)
        self._stores_seen = 0
        self.counts = dict(faults_injected=0, stores_failed_hidden=0, jobs_reported_failed=0)

    def _open_cuda(self, device_index: int) -> None:
        """The CUDA device (it refuses, KVO_ENOTSUP, without the CUDA library,
        before torch is asked for anything) with the arena pinned; when
        pinning fails, a warning and a device that copies unpinned slots."""
        self.device_index = device_index
        self.cuda = CudaDevice(device_index)
        assert self.arena._arena is not None
        try:
            self.cuda.pin_arena(self.arena._arena)
            self.pinned = True
        except L.KvoError as e:
            log.warning("kvoffload: pinning the %d-byte arena for cuda:%d failed (%s): copies run unpinned, "
                        "slower (raise the locked-memory limit, ulimit -l, to pin it)", self.arena.data_bytes,
                        device_index, e)
            self.cuda.close()
            self.cuda = CudaDevice(device_index, require_pinned=False)
        self.cuda.set_compute_stream(torch_stream(device_index))

    def _build(self, spec: "KvoffloadOffloadingSpec", kv_caches: CanonicalKVCaches, threads: int) -> None:
        """One transfer engine per group (and the CUDA device for GPU
        tensors); __init__ closes what was made when this raises."""
        cfg = spec.config
        device = None
        for g, refs in enumerate(kv_caches.group_data_refs):
            tens = [kv_caches.tensors[r.tensor_idx].tensor for r in refs]
            if tens and tens[0].device.type != "cpu" and device is None:
                # GPU tensors: the CUDA device library, on the tensors' own
                # device (tensor-parallel rank N: cuda:N)
                device = tens[0].device.type
                self._open_cuda(tens[0].device.index or 0)
            pages = sum(int(r.page_size_bytes) for r in refs)
            gc = cfg.groups[g]
            model = Model(f"w{g}", cfg.cache.tokens_per_hash,
                          [dict(name=f"g{gc.group_id}", tokens_per_block=gc.tokens_per_block, layers=1,
                                page_bytes=pages)])
            plan = Plan(model, blocks_per_chunk=self.bpc)
            wcb = plan.groups[0]["chunk_bytes"]
            slot = spec.plan.groups[g]["chunk_bytes"]
            if (self.part + 1) * wcb > slot:
                raise L.KvoError(L.KVO_ELAYOUT, f"group {gc.group_id}: worker chunk of {wcb} bytes (slot part "
                                 f"{self.part}) does not fit the scheduler's {slot}-byte chunk; set "
                                 f"kvo_group_bytes_per_block >= {pages * (self.part + 1)}", "worker")
            t = Transfer(plan, threads=threads, device=device, device_index=self.device_index)
            self.engines.append(t)
            self.plans.append(plan)
            self.worker_chunk_bytes.append(wcb)
            segs = []
            for r, ten in zip(refs, tens):
                segs.append(dict(group=0, base=ten.data_ptr(), num_blocks=int(ten.shape[0]),
                                 block_stride=int(ten.stride(0) * ten.element_size()),
                                 page_bytes=int(r.page_size_bytes)))
            t.set_layout(segs)

    def _finish(self, job_id: int, ok: bool, size: int, ns: Optional[int], why: str = "") -> None:
        """vLLM's result for a job; a failure as the module doc says."""
        slots = self._store_slots.pop(job_id, None)
        gpu = self._gpu.pop(job_id, None)
        hidden = False
        if not ok:
            self.failed_jobs[job_id] = why
            if gpu is not None:
                self.load_error_blocks.update(int(b) for b in gpu)
            if not self.REPORT_FAILURES and slots is not None and self.mailbox is not None:
                hidden = self.mailbox.put(self.rank, slots)
            if self.REPORT_FAILURES:
                log.warning("kvoffload: transfer job %d failed (%s)", job_id, why)
            elif hidden:
                log.warning("kvoffload: store job %d failed (%s): reported done with no bytes; its %d chunks are "
                            "never loaded (completed as failed stores)", job_id, why, len(slots))
            else:
                log.error("kvoffload: %s job %d failed (%s): reported failed, and vLLM's offloading connector "
                          "stops on it rather than use blocks without their KV (KvoffloadConnector recomputes "
                          "instead)", "load" if gpu is not None else "store", job_id, why)
            self.counts["stores_failed_hidden" if hidden else "jobs_reported_failed"] += 1
        if ok or not hidden:
            self._done.append(TransferResult(job_id=job_id, success=ok, transfer_size=size if ok else 0,
                                             transfer_time=ns / 1e9 if ns is not None else None))
        else:
            self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=0, transfer_time=None))

    def take_failed_jobs(self) -> dict[int, str]:
        """vLLM jobs that failed since the last call (job -> why)."""
        out, self.failed_jobs = self.failed_jobs, {}
        return out

    def take_load_error_blocks(self) -> set[int]:
        """GPU block ids of failed loads since the last call: they hold no
        loaded KV (vLLM's get_block_ids_with_load_errors)."""
        out, self.load_error_blocks = self.load_error_blocks, set()
        return out

    def _submit(self, job_id: int, direction: int, gpu: GPULoadStoreSpec, slots: KvoffloadLoadStoreSpec) -> bool:
        if direction == STORE and not self.stores:
            # replicated layout: rank 0 writes the one copy
            self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=0, transfer_time=0.0))
            return True
        blocks = np.ascontiguousarray(gpu.block_ids, dtype=np.uint64)
        offsets = np.asarray(slots.offsets, dtype=np.uint64)
        if direction == LOAD:
            self._gpu[job_id] = blocks
        else:
            self._store_slots[job_id] = offsets
        if direction == STORE and self.fault_stores:
            self._stores_seen += 1
            if self._stores_seen % self.fault_stores == 0:
                self.counts["faults_injected"] += 1
                self._finish(job_id, False, 0, None, "injected fault (kvo_fault_stores)")
                return True
        if self.cuda is not None:
            # the job waits for what torch has queued so far (a store for
            # the forward pass that wrote its blocks, a load for zeroing)
            self.cuda.set_compute_stream(torch_stream(self.device_index))
        subs: list[tuple[int, int]] = []
        b0 = c0 = 0
        try:
            for g, (size, bidx) in enumerate(zip(gpu.group_sizes, gpu.block_indices)):
                if size == 0:
                    continue
                skip = int(bidx) % self.bpc
                nchunks = -(-(size + skip) // self.bpc)
                wcb = self.worker_chunk_bytes[g]
                ops = _ops(nchunks, self.bpc, skip, size, blocks.ctypes.data + 8 * b0,
                           offsets[c0:c0 + nchunks] + np.uint64(self.arena.base + self.part * wcb), wcb)
                subs.append((g, _submit_ops(self.engines[g], direction, ops)))
                b0 += size
                c0 += nchunks
        except L.KvoError as e:
            for g, j in subs:
                self.engines[g].wait([j])
            if self.REPORT_FAILURES:
                self._gpu.pop(job_id, None)
                self._store_slots.pop(job_id, None)
                return False
            # the parts submitted are done (their results have no owner:
            # get_finished passes over them); the job failed
            self._finish(job_id, False, 0, None, f"submit: {e}")
            return True
        self._jobs[job_id] = subs
        self._left[job_id] = len(subs)
        self._ok[job_id] = True
        self._bytes[job_id] = 0
        self._ns[job_id] = 0
        if not subs:
            self._gpu.pop(job_id, None)
            self._store_slots.pop(job_id, None)
            self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=0, transfer_time=0.0))
            del self._jobs[job_id]
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KvoffloadLoadStoreSpec)
        return self._submit(job_id, STORE, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        assert isinstance(src_spec, KvoffloadLoadStoreSpec)
        return self._submit(job_id, LOAD, dst_spec, src_spec)

    def get_finished(self) -> list[TransferResult]:
        owner = {(g, j): job for job, subs in self._jobs.items() for g, j in subs}
        for g, t in enumerate(self.engines):
            for r in t.poll():
                job = owner.get((g, r["job_id"]))
                if job is None:
                    continue
                self._left[job] -= 1
                if r["status"] != 0 and self._ok[job]:
                    self._why[job] = f"{L.ERROR_NAMES.get(r['status'], r['status'])} in group {g}"
                self._ok[job] &= r["status"] == 0
                self._bytes[job] += r["bytes"]
                self._ns[job] += r["duration_ns"]
                if self._left[job] == 0:
                    self._finish(job, self._ok.pop(job), self._bytes.pop(job), self._ns.pop(job),
                                 self._why.pop(job, ""))
                    del self._left[job], self._jobs[job]
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        for job in job_ids:
            for g, j in self._jobs.get(job, []):
                self.engines[g].wait([j])

    def stats(self) -> dict[str, int]:
        """kvoffload's transfer counters summed over the groups' engines
        (bytes_stored, bytes_loaded, jobs_ok, jobs_failed, ...), and the
        worker's failures: stores_failed_hidden (reported done, failed
        through the mailbox), jobs_reported_failed, faults_injected."""
        out: dict[str, int] = dict(self.counts)
        for t in self.engines:
            for k, v in t.stats().items():
                if isinstance(v, int) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        return out

    def _close_engines(self) -> None:
        """Engines first (they hold the CUDA context), then the device, which
        unpins the arena."""
        for t in self.engines:
            t.close()
        self.engines = []
        if self.cuda is not None:
            self.cuda.close()
            self.cuda = None

    def shutdown(self) -> None:
        self._close_engines()
        self.arena.close()
