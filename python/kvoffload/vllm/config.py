"""What the scheduler and the workers derive alike from vLLM's
OffloadingConfig: the kvoffload plan (one group per offloaded vLLM group,
sized like vLLM's CPU backend sizes a chunk), the layout hash that namespaces
shared tiers by the parallel layout of a slot, the shared arena's name, the
stores one scheduler step can offer (what sizes the host tier's floor, the
staging area and the file tier's write queue), and KvoffloadLoadStoreSpec,
the slot addresses the manager hands the workers."""
from __future__ import annotations

import hashlib
import re
import sys
from typing import Any, Optional

import numpy as np

from vllm.v1.kv_offload.base import LoadStoreSpec
from vllm.v1.kv_offload.config import OffloadingConfig

from .. import _lib as L
from ..cascade import namespace_id
from ..core import Model, Plan
from .compat import GROUP_HAS_WINDOW, window_chunks


class KvoffloadLoadStoreSpec(LoadStoreSpec):
    """Where chunks live in the shared arena: offsets[i] (bytes from the
    start of slot space) of chunk i, of group groups[i] (index among the
    offloaded groups), in the order of the keys the manager was given."""

    def __init__(self, offsets: np.ndarray, groups: np.ndarray) -> None:
        self.offsets = np.asarray(offsets, dtype=np.uint64)
        self.groups = np.asarray(groups, dtype=np.uint32)

    @classmethod
    def of_bytes(cls, offsets: Any, groups: Any) -> "KvoffloadLoadStoreSpec":
        """The spec over buffers of uint64 offsets and uint32 groups (the
        compiled hot calls' output), without a copy or a dtype check: the
        manager's per-request path."""
        spec = cls.__new__(cls)
        spec.offsets = np.frombuffer(offsets, np.uint64)
        spec.groups = np.frombuffer(groups, np.uint32)
        return spec

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"KvoffloadLoadStoreSpec(offsets={self.offsets!r}, groups={self.groups!r})"




def int_key(cfg: Any, key: str, default: int) -> int:
    v = cfg.get(key)
    return default if v is None else int(v)


def replicated(config: OffloadingConfig) -> bool:
    """vLLM says every rank holds the same bytes per block (replicated_layout,
    0.33: an MLA model at tensor parallel N): a slot then holds one copy,
    rank 0 writes it and every rank reads it."""
    return bool(getattr(config, "replicated_layout", False))


def slot_copies(config: OffloadingConfig) -> int:
    """Parts of a slot: one per rank, or one for a replicated layout."""
    return 1 if replicated(config) else max(1, config.parallel.world_size)


def slot_part(config: OffloadingConfig) -> int:
    """This rank's part of a slot (0 for a replicated layout)."""
    return 0 if replicated(config) else config.parallel.rank


def kv_format(config: OffloadingConfig) -> Optional[str]:
    """What the plan's fingerprint (every tier's namespace) carries about the
    bytes beside the model: vLLM's KV cache dtype (its variant: fp8_e4m3 and
    fp8_e5m2 are not one format) and KV layout (NHD or HND; 0.33)."""
    layout = getattr(config, "kv_cache_layout", None)
    dtype = config.model.dtype or ""
    if not layout:
        return dtype or None
    return f"{dtype};layout={layout}"


def build_plan(config: OffloadingConfig) -> Plan:
    """The scheduler-side plan: one kvoffload group per offloaded vLLM group
    (in config.groups order), each block sized like vLLM's CPU backend sizes
    a chunk (worker_kv_bytes_per_block * slot_copies, or the per-group list
    kvo_group_bytes_per_block), blocks_per_chunk from vLLM, the KV format in
    the fingerprint."""
    extra = config.extra_config
    world = slot_copies(config)
    per_group = extra.get("kvo_group_bytes_per_block")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", config.model.name or "model")[-63:] or "model"
    model = Model(name, config.cache.tokens_per_hash)
    for i, g in enumerate(config.groups):
        page = int(per_group[i]) if per_group else config.worker_kv_bytes_per_block * world
        if page <= 0:
            raise L.KvoError(L.KVO_EINVAL, f"vLLM group {g.group_id}: no KV bytes per block (worker_kv_bytes_per_"
                             f"block={config.worker_kv_bytes_per_block}); give kvo_group_bytes_per_block",
                             "build_plan")
        tpc = g.tokens_per_block * config.cache.blocks_per_chunk
        window = window_chunks(g)
        if window is None:
            model.add_group(f"g{g.group_id}", g.tokens_per_block, 1, page)
        else:
            model.add_group(f"g{g.group_id}", g.tokens_per_block, 1, page, kind="sliding",
                            window=max(1, window * tpc))
    return Plan(model, blocks_per_chunk=config.cache.blocks_per_chunk, dtype=kv_format(config))


def step_tokens(config: OffloadingConfig) -> Optional[int]:
    """Most tokens one scheduler step computes (vLLM's
    max_num_batched_tokens): kvo_step_tokens in kv_connector_extra_config,
    else vLLM's current config where one is set, else the vllm_config of
    the caller that builds the manager (vLLM's OffloadingConnectorScheduler
    has it; OffloadingConfig does not carry it); None when none says."""
    v = config.extra_config.get("kvo_step_tokens")
    if v is not None:
        return int(v) if int(v) > 0 else None
    vc = None
    try:
        from vllm.config import get_current_vllm_config_or_none
        vc = get_current_vllm_config_or_none()
    except ImportError:
        pass
    f = sys._getframe(1)
    for _ in range(8):  # the spec's get_manager, then vLLM's connector scheduler
        if vc is not None or f is None:
            break
        vc = f.f_locals.get("vllm_config")
        f = f.f_back
    n = getattr(getattr(vc, "scheduler_config", None), "max_num_batched_tokens", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def step_stores(config: OffloadingConfig, plan: Plan, tokens: int) -> list[tuple[int, int, int]]:
    """Per offloaded group (config.groups order): (vLLM group id, chunks,
    bytes) that one step of `tokens` computed tokens can offer to store at
    once: ceil(tokens / tokens per chunk) chunks of a full group, at most
    its window of a sliding one, each a slot of the group's slot_bytes."""
    out = []
    for g, pg in zip(config.groups, plan.groups):
        tpc = g.tokens_per_block * config.cache.blocks_per_chunk
        n = -(-tokens // tpc)
        w = window_chunks(g)
        if w is not None:
            n = min(n, max(1, w))
        out.append((g.group_id, n, n * int(pg["slot_bytes"])))
    return out


def step_floor(step: list[tuple[int, int, int]]) -> int:
    """The host bytes below which one step's stores can never fit: every
    group's (step_stores), or, where vLLM does not say which groups slide
    (0.32: a sliding or recurrent group stores only its reachable chunks),
    the largest group's alone."""
    if not step:
        return 0
    return sum(b for _, _, b in step) if GROUP_HAS_WINDOW else max(b for _, _, b in step)


def layout_hash(config: OffloadingConfig) -> int:
    """A 64-bit hash of how a slot's bytes are laid out beyond the plan's
    fingerprint: its parts (one per rank, each rank writing its own; one for
    a replicated layout, so every rank and a single-rank engine share it)
    and the bytes per block per rank.  Tiers shared by engines (remote, or
    files with kvo_file_shared) are namespaced by it, so engines with other
    parallel layouts never read each other's values."""
    per_group = config.extra_config.get("kvo_group_bytes_per_block")
    text = repr(("kvo-vllm-slot-layout/1", slot_copies(config), config.worker_kv_bytes_per_block,
                 [int(x) for x in per_group] if per_group else None))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


def kvo_namespace(config: OffloadingConfig, plan: Plan, engine: str = "vllm", extra: Any = None) -> int:
    """The 128-bit namespace of this engine's chunks (kvoffload's one rule,
    kvoffload.cascade.namespace_id): the plan's geometry, the model identity
    as configured (its whole name or path, never folded or cut), the dtype,
    the KV cache layout and format (kv_format), and what decides a slot's
    bytes beyond them (layout_hash: the slot's parts, one per rank or one
    for a replicated layout, bytes per block per rank, the per-group
    sizes).  Chunk keys are derived from vLLM's block hashes under it
    (namespace_keys), so engines serving other models or layouts never
    share a key in any tier.  extra: what else decides the bytes for this
    caller (its repr joins them)."""
    layout = getattr(config, "kv_cache_layout", None) or config.extra_config.get("kvo_kv_layout")
    return namespace_id(plan, engine=engine, model=str(config.model.name or ""), dtype=str(config.model.dtype or ""),
                        kv_layout=str(layout) if layout else kv_format(config), layout_hash=layout_hash(config),
                        extra=None if extra is None else repr(extra))


def arena_name(config: OffloadingConfig) -> str:
    n = config.extra_config.get("kvo_arena_name") or f"{config.engine_id}-dp{config.parallel.data_parallel_index}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(n))[:200]


