"""TEST-ONLY: vLLM's TieringOffloadingSpec with a CPU copy worker, so that
vLLM's tiering (its TieringOffloadingManager, its CPU primary tier
CPUPrimaryTierOffloadingManager over its SharedOffloadRegion in /dev/shm,
and kvoffload's secondary tiers) can run inside a real vLLM on the CPU.

Why a shim: vLLM's CPU primary refuses the CPU platform.  TieringOffloadingSpec
inherits get_worker from CPUOffloadingSpec (vllm/v1/kv_offload/cpu/spec.py),
which raises "CPU Offloading is currently only supported on CUDA-alike and
XPU GPUs" unless current_platform.is_cuda_alike() or is_xpu(); behind that
check, its copy worker (CPUOffloadingWorker, cpu/gpu_worker.py) asserts
`gpu_tensor.is_cuda or gpu_tensor.is_xpu` for every KV tensor and copies on
CUDA streams.  Only that worker is replaced here: CpuCopyWorker copies the
same bytes to the same places as vLLM's direct layout (its
SingleDirectionOffloadingHandler._fill_direct_ops: chunk c of tensor t at
the worker's view row c, sub-block j at j * tensor page, ref.page_size_bytes
copied per block and ref), with torch indexing on the CPU, synchronously in
submit_*, reported by get_finished with the bytes and the seconds it took.
Everything the scheduler runs is vLLM's own code.  On a GPU, use vLLM's
TieringOffloadingSpec itself (no shim)."""
from __future__ import annotations

import time

import numpy as np
import torch

from vllm.v1.kv_offload.base import CanonicalKVCaches, GPULoadStoreSpec, OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


class CpuCopyWorker(OffloadingWorker):
    """vLLM's direct CPU layout, copied on the CPU (see module doc)."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, region: SharedOffloadRegion) -> None:
        self.region = region
        self.bpc = blocks_per_chunk
        self.refs = kv_caches.group_data_refs
        self.dev: list[torch.Tensor] = []
        self.host: list[torch.Tensor] = []
        for t in kv_caches.tensors:
            page = int(t.page_size_bytes)
            self.dev.append(t.tensor.view(torch.int8).view(-1, page))
            rows = region.create_next_worker_view(page * blocks_per_chunk)
            self.host.append(rows.view(rows.shape[0], blocks_per_chunk, page))
        self.done: list[TransferResult] = []

    def _copy(self, job_id: int, gpu: GPULoadStoreSpec, chunk_ids: np.ndarray, store: bool) -> bool:
        t0 = time.perf_counter()
        blocks = np.asarray(gpu.block_ids, dtype=np.int64)
        chunk_ids = np.asarray(chunk_ids, dtype=np.int64)
        nbytes = b0 = c0 = 0
        for g, (size, bidx) in enumerate(zip(gpu.group_sizes, gpu.block_indices)):
            size = int(size)
            if size == 0:
                continue
            skip = int(bidx) % self.bpc
            pos = skip + np.arange(size)
            rows = torch.from_numpy(chunk_ids[c0 + pos // self.bpc])
            sub = torch.from_numpy(pos % self.bpc)
            dev_blocks = torch.from_numpy(blocks[b0:b0 + size])
            for ref in self.refs[g]:
                n = int(ref.page_size_bytes)
                host, dev = self.host[ref.tensor_idx], self.dev[ref.tensor_idx]
                if store:
                    host[rows, sub, :n] = dev[dev_blocks, :n]
                else:
                    dev[dev_blocks, :n] = host[rows, sub, :n]
                nbytes += size * n
            b0 += size
            c0 += -(-(size + skip) // self.bpc)
        assert b0 == len(blocks) and c0 == len(chunk_ids), (b0, len(blocks), c0, len(chunk_ids))
        self.done.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                        transfer_time=time.perf_counter() - t0))
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._copy(job_id, src_spec, dst_spec.chunk_ids, True)

    def submit_load(self, job_id, src_spec, dst_spec, expedited: bool = False) -> bool:
        return self._copy(job_id, dst_spec, src_spec.chunk_ids, False)

    def get_finished(self) -> list[TransferResult]:
        out, self.done = self.done, []
        return out

    def wait(self, job_ids) -> None:
        return  # every copy is done when submit returns

    def shutdown(self) -> None:
        self.host.clear()
        self.dev.clear()
        self.region.cleanup()


class CpuTieringOffloadingSpec(TieringOffloadingSpec):
    """vLLM's TieringOffloadingSpec, with CpuCopyWorker as the worker (test only)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(engine_id=self._engine_id, num_chunks=self.num_chunks, rank=rank,
                                         kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                         cpu_page_size=self.cpu_page_size_per_worker)
            try:
                self._worker = CpuCopyWorker(kv_caches, self.blocks_per_chunk, region)
            except BaseException:
                region.cleanup()
                raise
        return self._worker
