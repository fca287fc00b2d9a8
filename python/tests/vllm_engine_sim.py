"""A CPU-only stand-in for vLLM's engine loop around the real scheduler:
vLLM's (0.33 or 0.32) Scheduler (with its KV-cache manager and the scheduler side of
the OffloadingConnector) and the worker side of the OffloadingConnector over
CPU tensors as the "GPU" KV cache.  The model is fake: computing a token
block writes bytes derived from the block's tokens into its KV pages, so a
block filled by a load can be checked against what computing it would give.

Used by test_vllm.py; needs a local HF config (no download) and
DeviceConfig("cpu")."""
import json
import os
import tempfile
import time
from typing import Optional

import numpy as np
import torch

from vllm.config import (CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                         VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,
                                        SlidingWindowSpec)
from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def tiny_model_dir() -> str:
    d = os.path.join(tempfile.gettempdir(), "kvo-tiny-llama")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
                   "torch_dtype": "float16", "rms_norm_eps": 1e-6, "head_dim": 16}, f)
    return d


class Engine:
    def __init__(self, extra: dict, num_blocks: int = 48, engine_id: str = "kvo-sim",
                 fake_worker: bool = False, sliding_window: int = 0, kv_events: bool = False,
                 connector: str = "OffloadingConnector") -> None:
        """fake_worker: no KV copies; every transfer job reports done at once
        (for specs whose worker needs a GPU, e.g. vLLM's CPUOffloadingSpec).
        sliding_window: a hybrid model instead: layer 0 full attention (group
        0), layer 1 sliding window (group 1), overlaid on one tensor as vLLM's
        hybrid allocator does.  kv_events: vLLM's KV cache events on (null
        publisher; the connector's take_events).  connector:
        "OffloadingConnector" (vLLM's, with the spec named in extra) or
        "KvoffloadConnector" (kvoffload.vllm.connector)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        mc = ModelConfig(model=tiny_model_dir(), skip_tokenizer_init=True, dtype="float16", max_model_len=2048)
        self.vc = VllmConfig(
            model_config=mc, device_config=DeviceConfig(device="cpu"),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=8, max_model_len=2048,
                                             is_encoder_decoder=False),
            kv_transfer_config=KVTransferConfig(kv_connector=connector, kv_role="kv_both", engine_id=engine_id,
                                                kv_connector_extra_config=dict(extra),
                                                **({"kv_connector_module_path": "kvoffload.vllm.connector"}
                                                   if connector == "KvoffloadConnector" else {})),
            **({"kv_events_config": KVEventsConfig(enable_kv_cache_events=True, publisher="null")} if kv_events
               else {}))
        self.spec_attn = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float16)
        self.page = self.spec_attn.page_size_bytes
        self.num_blocks = num_blocks
        if sliding_window:
            swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float16,
                                    sliding_window=sliding_window)
            kcc = KVCacheConfig(num_blocks=num_blocks,
                                kv_cache_tensors=[KVCacheTensor(size=self.page * num_blocks, layers=list(LAYERS),
                                                                layer_stride=0, block_stride=self.page)],
                                kv_cache_groups=[KVCacheGroupSpec([LAYERS[0]], self.spec_attn),
                                                 KVCacheGroupSpec([LAYERS[1]], swa)])
            self.n_tensors, refs = 1, [[CanonicalKVCacheRef(0, self.page)], [CanonicalKVCacheRef(0, self.page)]]
        else:
            kcc = KVCacheConfig(num_blocks=num_blocks,
                                kv_cache_tensors=[KVCacheTensor(size=self.page * num_blocks * len(LAYERS),
                                                                layers=list(LAYERS),
                                                                layer_stride=self.page * num_blocks,
                                                                block_stride=self.page)],
                                kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), self.spec_attn)])
            self.n_tensors = len(LAYERS)
            refs = [[CanonicalKVCacheRef(i, self.page) for i in range(len(LAYERS))]]
        self.n_groups = len(kcc.kv_cache_groups)
        self.kcc = kcc
        self.vc.cache_config.num_gpu_blocks = num_blocks
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.sched = Scheduler(self.vc, kcc, StructuredOutputManager(self.vc), block_size=BLOCK,
                               hash_block_size=BLOCK)
        self.connector = self.sched.connector
        # worker side: CPU tensors as the KV cache
        self.kv = [torch.zeros((num_blocks, self.page), dtype=torch.int8) for _ in range(self.n_tensors)]
        self.fake_worker = fake_worker
        self.wconn = None
        if not fake_worker:
            cls = OffloadingConnector
            if connector == "KvoffloadConnector":
                from kvoffload.vllm.connector import KvoffloadConnector
                cls = KvoffloadConnector
            self.wconn = cls(self.vc, KVConnectorRole.WORKER, kcc)
            self.wconn.connector_worker._init_worker(CanonicalKVCaches(
                tensors=[CanonicalKVCacheTensor(t, self.page) for t in self.kv], group_data_refs=refs))
        # external (offload) hit tokens the connector reported per request
        self.hits: dict[str, int] = {}
        orig = self.connector.get_num_new_matched_tokens

        def record(request, num_computed_tokens):
            n, is_async = orig(request, num_computed_tokens)
            if n is not None:
                self.hits[request.request_id] = max(self.hits.get(request.request_id, 0), n)
            return n, is_async

        self.connector.get_num_new_matched_tokens = record
        self.tokens: dict[str, list[int]] = {}
        self.loaded_blocks_checked = 0
        self.load_jobs = 0

    def tensors_of(self, group: int) -> list:
        return self.kv if self.n_groups == 1 else [self.kv[0]]

    def block_bytes(self, tokens: list[int], group: int, tensor: torch.Tensor) -> np.ndarray:
        """What the fake model writes for a block: a function of the prefix,
        the group and the layer tensor."""
        layer = next(i for i, t in enumerate(self.kv) if t is tensor)
        seed = hash((tuple(tokens), group, layer)) & 0xFFFFFFFF
        return np.random.default_rng(seed).integers(-128, 127, self.page, dtype=np.int8)

    def add(self, req_id: str, tokens: list[int], cache_salt: Optional[str] = None) -> None:
        self.tokens[req_id] = list(tokens)
        self.sched.add_request(Request(req_id, list(tokens), SamplingParams(max_tokens=1), None, None,
                                       block_hasher=self.hasher, cache_salt=cache_salt))

    def step(self) -> bool:
        out = self.sched.schedule()
        meta = out.kv_connector_metadata
        self.load_jobs += len(meta.load_jobs)
        if self.fake_worker:
            self.fake_step(out, meta)
            return bool(out.num_scheduled_tokens)
        w = self.wconn
        w.bind_connector_metadata(meta)
        w.handle_preemptions(meta)
        w.start_load_kv(None)
        sampled = {}
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[req_id]
            end = req.num_computed_tokens  # schedule() already advanced it
            start = end - n
            toks = self.tokens[req_id]
            for g, blocks in enumerate(self.sched.kv_cache_manager.get_block_ids(req_id)):
                # KV of blocks computed before this step must be in place (from
                # this engine's earlier steps or from a load); null blocks
                # (id 0: outside a sliding window) hold nothing
                for b in range(0, min(start // BLOCK, len(blocks))):
                    if blocks[b]:
                        self.check_block(req_id, toks, g, blocks, b)
                for b in range(start // BLOCK, min(end, len(toks)) // BLOCK):
                    if blocks[b]:
                        for t in self.tensors_of(g):
                            t[blocks[b]] = torch.from_numpy(self.block_bytes(toks[: (b + 1) * BLOCK], g, t))
            if end >= len(toks):
                sampled[req_id] = [7]
        w.wait_for_save()
        failed: set = set()
        if hasattr(w, "get_transfer_results"):  # as vLLM's model runner asks (0.32, 0.33)
            tr = w.get_transfer_results(out.finished_req_ids)
            recving, failed = tr.finished_recving, tr.failed_recving
        else:
            _, recving = w.get_finished(out.finished_req_ids)
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[sampled.get(r, []) for r in ids],
                                kv_connector_output=KVConnectorOutput(
                                    finished_recving=recving or None,
                                    **({"failed_recving": failed} if failed else {}),
                                    invalid_block_ids=w.get_block_ids_with_load_errors(),
                                    kv_connector_worker_meta=w.build_connector_worker_meta()))
        self.sched.update_from_output(out, mro)
        w.clear_connector_metadata()
        return bool(out.num_scheduled_tokens)

    def fake_step(self, out, meta) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        wm = OffloadingWorkerMetadata()
        recving = set()
        for jid, job in list(meta.load_jobs.items()) + list(meta.store_jobs.items()):
            wm.mark_completed(jid)
            if jid in meta.load_jobs and not getattr(job, "sync", False):  # vLLM 0.32: no sync loads
                recving.add(job.req_id)
        sampled = {}
        for req_id in out.num_scheduled_tokens:
            if self.sched.requests[req_id].num_computed_tokens >= len(self.tokens[req_id]):
                sampled[req_id] = [7]
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[sampled.get(r, []) for r in ids],
                                kv_connector_output=KVConnectorOutput(finished_recving=recving or None,
                                                                      kv_connector_worker_meta=wm))
        self.sched.update_from_output(out, mro)

    def check_block(self, req_id: str, toks: list[int], group: int, blocks: list[int], b: int) -> None:
        for t in self.tensors_of(group):
            want = self.block_bytes(toks[: (b + 1) * BLOCK], group, t)
            if not np.array_equal(t[blocks[b]].numpy(), want):
                raise AssertionError(f"request {req_id}: group {group} block {b} (engine block {blocks[b]}) "
                                     "does not hold the KV its tokens give")
        self.loaded_blocks_checked += 1

    def run(self, timeout_s: float = 60.0) -> None:
        """Step until every request finished.  Loads are asynchronous: a step
        that schedules nothing waits a little for the copies in flight."""
        deadline = time.monotonic() + timeout_s
        while self.sched.has_requests() or self.connector.has_pending_push_work():
            if time.monotonic() > deadline:
                raise AssertionError(f"requests did not finish in {timeout_s} s")
            if not self.step():
                time.sleep(0.002)

    def shutdown(self) -> None:
        if self.wconn is not None:
            self.wconn.shutdown()
        self.connector.shutdown()
