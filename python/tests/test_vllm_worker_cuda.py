"""The vLLM worker's CUDA branch without a GPU (tools/test-python.sh --vllm):
KV tensors that say they live on cuda:N but are CPU memory underneath, a
mocked CudaDevice that records what the worker asks of it, and transfer
engines created as the worker asks (device "cuda", its index) but run by the
host device, so the bytes still move and are checked.  Covers: the device
and index taken from the tensors, the arena pinned, every job ordered after
torch's current stream (stores and loads), a failed pin running unpinned
with a warning, failed stores reported done and never loaded (the mailbox),
failed loads reported failed (their blocks kept as load errors), a replicated layout stored once, and the
namespace (KV layout, dtype variant, replication)."""
import dataclasses
import logging

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm.v1.kv_offload.base")

import torch  # noqa: E402
from vllm.v1.kv_offload.base import (CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor,  # noqa: E402
                                     GPULoadStoreSpec, LookupResult, ReqContext)
from vllm.v1.kv_offload.config import OffloadingConfig  # noqa: E402

import kvoffload as k  # noqa: E402
from kvoffload import vllm as kvo_vllm  # noqa: E402
from kvoffload.vllm import KvoffloadOffloadingSpec  # noqa: E402
from kvoffload.vllm import worker as W  # noqa: E402
from test_vllm import keys_of, make_config, make_kv  # noqa: E402


# vLLM 0.33's OffloadingConfig says whether the layout is replicated and
# which KV layout the cache has; 0.32's does not.
HAS_LAYOUT_FIELDS = {"replicated_layout", "kv_cache_layout"} <= {f.name for f in dataclasses.fields(OffloadingConfig)}
needs_layout_fields = pytest.mark.skipif(not HAS_LAYOUT_FIELDS, reason="this vLLM's OffloadingConfig has no "
                                         "replicated_layout / kv_cache_layout (0.32)")


class FakeCudaTensor:
    """A CPU tensor that reports device cuda:index (what the worker reads of
    a KV tensor: device, data_ptr, shape, stride, element_size)."""

    def __init__(self, t: torch.Tensor, index: int) -> None:
        self.t = t
        self.device = torch.device("cuda", index)
        self.shape = t.shape

    def data_ptr(self) -> int:
        return self.t.data_ptr()

    def stride(self, d: int) -> int:
        return self.t.stride(d)

    def element_size(self) -> int:
        return self.t.element_size()


class FakeCuda:
    """Stands in for kvoffload.core.CudaDevice; records the calls."""
    made: list["FakeCuda"] = []
    pin_fails = False

    def __init__(self, device_index: int = 0, require_pinned=None, **kw) -> None:
        self.device_index = device_index
        self.require_pinned = require_pinned
        self.calls: list[tuple] = []
        self.closed = False
        FakeCuda.made.append(self)

    def pin_arena(self, arena) -> None:
        self.calls.append(("pin", arena))
        if FakeCuda.pin_fails:
            raise k.KvoError(k._lib.KVO_ENOMEM, "cuMemHostRegister: CUDA_ERROR_OUT_OF_MEMORY (locked memory)",
                             "kvo_cuda_pin_arena")

    def set_compute_stream(self, stream) -> None:
        self.calls.append(("stream", stream))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def cuda_worker(monkeypatch):
    """The worker module with the CUDA device mocked; engines record the
    device they were asked for and run on the host device."""
    FakeCuda.made = []
    FakeCuda.pin_fails = False
    engines = []
    real = W.Transfer

    def transfer(plan, threads=2, device=None, device_index=0):
        engines.append((device, device_index))
        return real(plan, threads=threads)

    streams = iter(range(0x1000, 0x100000))
    monkeypatch.setattr(W, "CudaDevice", FakeCuda)
    monkeypatch.setattr(W, "Transfer", transfer)
    monkeypatch.setattr(W, "torch_stream", lambda index: next(streams))
    return engines


def _kv(tensors, page, index):
    return CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(FakeCudaTensor(t, index), page) for t in tensors],
                             group_data_refs=[[CanonicalKVCacheRef(0, page), CanonicalKVCacheRef(1, page)]])


def test_cuda_branch_round_trip(cuda_worker):
    """Tensors on cuda:1: the CUDA device of device 1, the arena pinned,
    engines on device "cuda" index 1; each job (store and load) sets the
    compute stream to torch's current one first; bytes round-trip."""
    page = 4096
    spec = KvoffloadOffloadingSpec(make_config(kv_bytes=2 * page))
    m = spec.get_manager()
    tensors = make_kv(16, page)
    orig = [t.clone() for t in tensors]
    w = spec.get_worker(_kv(tensors, page, 1))
    cu = FakeCuda.made[-1]
    assert cu.device_index == 1 and cu.require_pinned is None and w.pinned
    assert cu.calls[0][0] == "pin" and cu.calls[1][0] == "stream"
    assert cuda_worker == [("cuda", 1)]
    rc = ReqContext("r")
    keys = keys_of(1, 2)
    out = m.prepare_store(keys, rc)
    n = len(cu.calls)
    assert w.submit_store(1, GPULoadStoreSpec([3, 4, 5, 6], group_sizes=[4], block_indices=[0]), out.store_spec)
    assert [c[0] for c in cu.calls[n:]] == ["stream"]
    w.wait({1})
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(1, True, 4 * 2 * page)]
    m.complete_store(keys, rc)
    ls = m.prepare_load(keys, rc)
    n = len(cu.calls)
    assert w.submit_load(2, ls, GPULoadStoreSpec([10, 11, 12, 13], group_sizes=[4], block_indices=[0]))
    assert [c[0] for c in cu.calls[n:]] == ["stream"]       # loads follow torch's stream too
    w.wait({2})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(2, True)]
    m.complete_load(keys, rc)
    for t, o in zip(tensors, orig):
        assert torch.equal(t[10:14], o[3:7])
    w.shutdown()
    assert cu.closed
    m.shutdown()


def test_pin_failure_runs_unpinned_with_a_warning(cuda_worker, caplog):
    """Pinning fails (a locked-memory limit): a warning, a device that
    copies unpinned slots (require_pinned False), and the worker works."""
    FakeCuda.pin_fails = True
    page = 4096
    spec = KvoffloadOffloadingSpec(make_config(kv_bytes=2 * page))
    spec.arena_expected = 1
    tensors = make_kv(8, page)
    with caplog.at_level(logging.WARNING, logger="kvoffload.vllm"):
        w = spec.get_worker(_kv(tensors, page, 0))
    assert len(FakeCuda.made) == 2 and FakeCuda.made[0].closed
    assert FakeCuda.made[1].require_pinned is False and not w.pinned
    assert "failed" in caplog.text and "unpinned" in caplog.text
    w.shutdown()


def test_failed_jobs_never_leave_a_loadable_slot_without_its_chunk(cuda_worker, monkeypatch):
    """Jobs whose copies fail (the engine reports KVO_EIO, as a failed DMA
    would) or cannot be submitted.  vLLM 0.32/0.33 assert on success=False,
    so a failed STORE is reported done with no bytes and its slots go
    through the mailbox: the manager completes its keys as failed (a miss,
    never READY over bytes nobody wrote).  A failed LOAD says
    success=False (vLLM stops: its blocks hold no KV), its GPU blocks kept
    as load errors.  With REPORT_FAILURES (KvoffloadConnector) every
    failure says success=False."""
    page = 4096
    spec = KvoffloadOffloadingSpec(make_config(kv_bytes=2 * page))
    m = spec.get_manager()
    w = spec.get_worker(_kv(make_kv(16, page), page, 0))
    assert w.mailbox is not None
    rc = ReqContext("r")
    keys = keys_of(7, 2)
    out = m.prepare_store(keys, rc)
    assert w.submit_store(1, GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[4], block_indices=[0]), out.store_spec)
    w.wait({1})
    assert w.get_finished()[0].success
    m.complete_store(keys, rc)
    eng = w.engines[0]
    real_poll = eng.poll

    def failing_poll(cap=256):
        return [dict(r, status=k._lib.KVO_EIO, bytes=0) for r in real_poll(cap)]

    monkeypatch.setattr(eng, "poll", failing_poll)
    # a failed store: done for vLLM, a miss for every later lookup
    bad_keys = keys_of(8, 2)
    out = m.prepare_store(bad_keys, rc)
    assert w.submit_store(2, GPULoadStoreSpec([5, 6, 7, 8], group_sizes=[4], block_indices=[0]), out.store_spec)
    w.wait({2})
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(2, True, 0)]
    assert "KVO_EIO" in w.take_failed_jobs()[2]
    m.complete_store(bad_keys, rc)
    assert [m.lookup(x, rc) for x in bad_keys] == [LookupResult.MISS] * 2
    assert [m.lookup(x, rc) for x in keys] == [LookupResult.HIT] * 2
    assert not m._failed   # every offset matched its key
    # a failed load: success=False, its blocks load errors
    ls = m.prepare_load(keys, rc)
    assert w.submit_load(3, ls, GPULoadStoreSpec([9, 10, 11, 12], group_sizes=[4], block_indices=[0]))
    w.wait({3})
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(3, False, 0)]
    assert "KVO_EIO" in w.take_failed_jobs()[3]
    assert w.take_load_error_blocks() == {9, 10, 11, 12}
    assert w.take_load_error_blocks() == set()
    # a load that cannot be submitted (a block id beyond the tensor): failed too
    bad = GPULoadStoreSpec([1000, 1001, 1002, 1003], group_sizes=[4], block_indices=[0])
    assert w.submit_load(4, ls, bad)
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(4, False)]
    assert "submit" in w.take_failed_jobs()[4]
    # without the mailbox a failed store is reported failed: never hidden
    monkeypatch.setattr(w, "mailbox", None)
    more = keys_of(9, 1)
    out = m.prepare_store(more, rc)
    assert w.submit_store(5, GPULoadStoreSpec([13, 14], group_sizes=[2], block_indices=[0]), out.store_spec)
    w.wait({5})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(5, False)]
    m.complete_store(more, rc, success=False)
    # REPORT_FAILURES: every failure says False, a failed submit returns False
    monkeypatch.setattr(w, "REPORT_FAILURES", True)
    assert w.submit_load(6, ls, GPULoadStoreSpec([9, 10, 11, 12], group_sizes=[4], block_indices=[0]))
    w.wait({6})
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(6, False)]
    assert not w.submit_load(7, ls, bad)
    m.complete_load(keys, rc)
    w.shutdown()
    m.shutdown()


def _replicated(rank, world=2, page=4096):
    cfg = make_config(kv_bytes=2 * page, extra={"kvo_arena_processes": 3})
    par = dataclasses.replace(cfg.parallel, rank=rank, world_size=world, tp_size=world)
    return dataclasses.replace(cfg, parallel=par, replicated_layout=True)


@needs_layout_fields
def test_replicated_layout_is_stored_once(cuda_worker):
    """MLA at tensor parallel 2 (vLLM's replicated_layout): a slot holds one
    copy (the plan's block is one rank's bytes, not two), rank 0 writes it,
    rank 1 submits no copy and reads rank 0's bytes from the same place."""
    page = 4096
    c0 = _replicated(0)
    plain = dataclasses.replace(c0, replicated_layout=False)
    assert kvo_vllm.build_plan(c0).groups[0]["page_bytes"] * 2 == kvo_vllm.build_plan(plain).groups[0]["page_bytes"]
    spec0 = KvoffloadOffloadingSpec(c0)
    m = spec0.get_manager()
    t0 = make_kv(16, page, seed=1)
    w0 = spec0.get_worker(_kv(t0, page, 0))
    spec1 = KvoffloadOffloadingSpec(dataclasses.replace(_replicated(1), engine_id=c0.engine_id))
    t1 = make_kv(16, page, seed=2)
    w1 = spec1.get_worker(_kv(t1, page, 1))
    assert w0.part == w1.part == 0 and w0.stores and not w1.stores
    rc = ReqContext("r")
    keys = keys_of(3, 2)
    out = m.prepare_store(keys, rc)
    src = GPULoadStoreSpec([1, 2, 3, 4], group_sizes=[4], block_indices=[0])
    assert w0.submit_store(1, src, out.store_spec)
    assert w1.submit_store(1, src, out.store_spec)       # no copy: rank 0 wrote it
    w0.wait({1})
    assert [r.success for r in w0.get_finished()] == [True]
    assert [(r.success, r.transfer_size) for r in w1.get_finished()] == [(True, 0)]
    assert w1.stats().get("jobs_submitted", 0) == 0
    m.complete_store(keys, rc)
    ls = m.prepare_load(keys, rc)
    dst = GPULoadStoreSpec([8, 9, 10, 11], group_sizes=[4], block_indices=[0])
    assert w1.submit_load(2, ls, dst)
    w1.wait({2})
    assert [r.success for r in w1.get_finished()] == [True]
    m.complete_load(keys, rc)
    for a, b in zip(t1, t0):
        assert torch.equal(a[8:12], b[1:5])               # rank 1 holds rank 0's bytes
    w0.shutdown()
    w1.shutdown()
    m.shutdown()


@needs_layout_fields
def test_namespace_has_the_kv_layout_dtype_and_replication():
    """The plan's fingerprint (every tier's namespace) differs by KV layout
    (NHD/HND) and dtype variant; the slot layout hash is the same for every
    rank of a replicated layout and a one-rank engine, and differs from a
    two-rank layout with a part per rank."""
    base = make_config()
    fp = lambda c: kvo_vllm.build_plan(c).fingerprint  # noqa: E731
    nhd = dataclasses.replace(base, kv_cache_layout="NHD")
    hnd = dataclasses.replace(base, kv_cache_layout="HND")
    e4 = dataclasses.replace(nhd, model=dataclasses.replace(base.model, dtype="fp8_e4m3"))
    e5 = dataclasses.replace(nhd, model=dataclasses.replace(base.model, dtype="fp8_e5m2"))
    assert len({fp(base), fp(nhd), fp(hnd), fp(e4), fp(e5)}) == 5
    r0, r1 = _replicated(0), _replicated(1)
    one = make_config(kv_bytes=2 * 4096)
    two = dataclasses.replace(r0, replicated_layout=False)
    assert kvo_vllm.layout_hash(r0) == kvo_vllm.layout_hash(r1) == kvo_vllm.layout_hash(one)
    assert kvo_vllm.layout_hash(two) != kvo_vllm.layout_hash(r0)
    assert fp(r0) == fp(r1)
