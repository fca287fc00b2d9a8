"""The spec path's failed stores, from the workers to the manager.

vLLM's OffloadingConnector (0.32, 0.33) asserts that every transfer job
succeeded: a worker that reported a failed copy would stop the engine.  A
store whose copy failed is therefore reported done, and the slots it was to
fill must never become loadable: the worker writes their arena offsets here
before it reports the job, and the manager reads them before it completes
any store, completing those keys as failed (removed, never READY).  vLLM
reports a job done to the scheduler only after the worker processed it, so
the offsets are always here first.

Layout: MAILBOX_BYTES at the end of the shared arena (after the host tier
and the staging area), one row per rank: a uint64 head (entries written,
ever: the worker's), a uint64 tail (entries read, ever: the manager's) and
RING entries (slot offsets).  One writer per row (its rank's worker), one
reader (the manager); the writer stores the entries, then the head (x86:
stores are not reordered with stores), the reader loads the head, then the
entries below it, then stores the tail.  A worker whose entries would not
fit beside the unread ones reports the job as failed instead (vLLM then
stops, loudly, rather than ever loading a slot it was told was written).

A failed LOAD cannot be hidden on this path: its blocks hold no loaded KV
and vLLM's interface has no way to say so, so the worker reports it failed
(success=False) and vLLM stops.  KvoffloadConnector (connector.py) reports
failed loads as load errors, which vLLM recomputes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

RANKS = 64
RING = 1022  # entries per rank: with the head and the tail, 8 KiB a rank
MAILBOX_BYTES = RANKS * (RING + 2) * 8


class FailedStores:
    """The mailbox over an arena's last MAILBOX_BYTES (view: a uint8 numpy
    view of them, e.g. SharedArena.view(offset, MAILBOX_BYTES))."""

    def __init__(self, view: np.ndarray) -> None:
        if view.nbytes < MAILBOX_BYTES:
            raise ValueError(f"failed-store mailbox: {view.nbytes} bytes, {MAILBOX_BYTES} needed")
        self._w = view[:MAILBOX_BYTES].view(np.uint64).reshape(RANKS, RING + 2)

    def put(self, rank: int, offsets: Any) -> bool:
        """Worker of rank `rank`: record these slot offsets as not written.
        False when the ring has no room for them (unread entries)."""
        row = self._w[rank % RANKS]
        offs = np.asarray(offsets, dtype=np.uint64).ravel()
        head, tail = int(row[0]), int(row[1])
        if head - tail + len(offs) > RING:
            return False
        for k, off in enumerate(offs):
            row[2 + (head + k) % RING] = off
        row[0] = head + len(offs)  # after the entries
        return True

    def take(self) -> set[int]:
        """Manager: the offsets written since the last call (every rank)."""
        out: set[int] = set()
        heads = self._w[:, 0].copy()
        for rank in np.flatnonzero(heads != self._w[:, 1]).tolist():
            row = self._w[rank]
            head, tail = int(heads[rank]), int(row[1])
            out.update(int(row[2 + i % RING]) for i in range(tail, head))
            row[1] = head  # after the entries were read
        return out
