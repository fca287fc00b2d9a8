"""Worker side: KvoffloadOffloadingWorker copies between vLLM's KV tensors
and the shared arena's slots with kvoffload's transfer engine (the host
device for CPU tensors; the CUDA device, kvoffload.core.CudaDevice, for GPU
tensors when the CUDA device library is there)."""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Optional

import numpy as np

from vllm.v1.kv_offload.base import (CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker,
                                     TransferResult)

from .. import _lib as L
from ..core import LOAD, STORE, CudaDevice, Model, Plan, Transfer
from ..shm import SharedArena
from .config import KvoffloadLoadStoreSpec

if TYPE_CHECKING:
    from .spec import KvoffloadOffloadingSpec


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

    def __init__(self, spec: "KvoffloadOffloadingSpec", kv_caches: CanonicalKVCaches,
                 arena: SharedArena) -> None:
        cfg = spec.config
        self.arena = arena
        self.bpc = cfg.cache.blocks_per_chunk
        self.rank = cfg.parallel.rank
        threads = int(cfg.extra_config.get("kvo_transfer_threads", 2))
        self.engines: list[Transfer] = []
        self.plans: list[Plan] = []
        self.worker_chunk_bytes: list[int] = []
        self.cuda: Optional[CudaDevice] = None
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
        self._done: list[TransferResult] = []

    def _build(self, spec: "KvoffloadOffloadingSpec", kv_caches: CanonicalKVCaches, threads: int) -> None:
        """One transfer engine per group (and the CUDA device for GPU
        tensors); __init__ closes what was made when this raises."""
        cfg = spec.config
        arena = self.arena
        device = None
        for g, refs in enumerate(kv_caches.group_data_refs):
            tens = [kv_caches.tensors[r.tensor_idx].tensor for r in refs]
            if tens and tens[0].device.type != "cpu" and device is None:
                # GPU tensors: the CUDA device library (never run on a GPU yet),
                # on the tensors' own device (tensor-parallel rank N: cuda:N)
                device = tens[0].device.type
                self.device_index = tens[0].device.index or 0
                # the device first: without the CUDA library it refuses
                # (KVO_ENOTSUP) before torch is asked for a stream
                self.cuda = CudaDevice(self.device_index)
                self.cuda.set_compute_stream(self._torch_stream())
                assert arena._arena is not None
                self.cuda.pin_arena(arena._arena)
            pages = sum(int(r.page_size_bytes) for r in refs)
            gc = cfg.groups[g]
            model = Model(f"w{g}", cfg.cache.tokens_per_hash,
                          [dict(name=f"g{gc.group_id}", tokens_per_block=gc.tokens_per_block, layers=1,
                                page_bytes=pages)])
            plan = Plan(model, blocks_per_chunk=self.bpc)
            wcb = plan.groups[0]["chunk_bytes"]
            slot = spec.plan.groups[g]["chunk_bytes"]
            if (self.rank + 1) * wcb > slot:
                raise L.KvoError(L.KVO_ELAYOUT, f"group {gc.group_id}: worker chunk of {wcb} bytes (rank "
                                 f"{self.rank}) does not fit the scheduler's {slot}-byte chunk; set "
                                 f"kvo_group_bytes_per_block >= {pages * cfg.parallel.world_size}", "worker")
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

    def _torch_stream(self) -> int:
        """torch's current stream on our device as a cudaStream_t: stores
        are ordered after the work queued on it (1 = the legacy default
        stream, since torch reports it as 0 and 0 means none to kvo_cuda)."""
        import torch
        return int(torch.cuda.current_stream(self.device_index).cuda_stream) or 1

    def _submit(self, job_id: int, direction: int, gpu: GPULoadStoreSpec, slots: KvoffloadLoadStoreSpec) -> bool:
        if self.cuda is not None and direction == STORE:
            self.cuda.set_compute_stream(self._torch_stream())  # the store waits for what produced its blocks
        blocks = np.ascontiguousarray(gpu.block_ids, dtype=np.uint64)
        offsets = np.asarray(slots.offsets, dtype=np.uint64)
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
                           offsets[c0:c0 + nchunks] + np.uint64(self.arena.base + self.rank * wcb), wcb)
                subs.append((g, _submit_ops(self.engines[g], direction, ops)))
                b0 += size
                c0 += nchunks
        except L.KvoError:
            for g, j in subs:
                self.engines[g].wait([j])
            return False
        self._jobs[job_id] = subs
        self._left[job_id] = len(subs)
        self._ok[job_id] = True
        self._bytes[job_id] = 0
        self._ns[job_id] = 0
        if not subs:
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
                self._ok[job] &= r["status"] == 0
                self._bytes[job] += r["bytes"]
                self._ns[job] += r["duration_ns"]
                if self._left[job] == 0:
                    self._done.append(TransferResult(job_id=job, success=self._ok.pop(job),
                                                     transfer_size=self._bytes.pop(job),
                                                     transfer_time=self._ns.pop(job) / 1e9))
                    del self._left[job], self._jobs[job]
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        for job in job_ids:
            for g, j in self._jobs.get(job, []):
                self.engines[g].wait([j])

    def stats(self) -> dict[str, int]:
        """kvoffload's transfer counters summed over the groups' engines
        (bytes_stored, bytes_loaded, jobs_ok, jobs_failed, ...)."""
        out: dict[str, int] = {}
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
