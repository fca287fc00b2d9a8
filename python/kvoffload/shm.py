"""SharedArena: a host arena in a named shared-memory file that the processes
of ONE engine map (vLLM's scheduler and its workers), with an owner check.

A thin layer over the C arena's owned sharing (kvo_arena_params
share_processes / share_fingerprint; src/tiers/arena.c has the design):

 - File: <directory>/kvoffload-<name>, a 4096-byte header (magic, version,
   data bytes, plan fingerprint, random instance id, processes expected and
   attached, their pids) and then the slot space.
 - The first process creates it (O_EXCL); the others wait for its header and
   must ask for the same data bytes and fingerprint, else KvoError
   KVO_ESTATE: an engine cannot attach to another engine's arena by mistake.
 - The last of `expected` processes to attach unlinks the name: the memory
   then lives exactly as long as the mappings (a crash leaves nothing behind)
   and no later process can attach by name.
 - A crash during start-up leaves a file whose processes are all dead; the
   next creator under that name, or sweep_stale(), removes it.
 - close() unmaps; the creator also removes the name if nobody else took it.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

import numpy as np

from . import _lib as L
from ._lib import KvoError, check, lib
from .core import Arena

DEFAULT_DIR = "/dev/shm"
PREFIX = "kvoffload-"


def sweep_stale(directory: str = DEFAULT_DIR) -> int:
    """Remove kvoffload arena files none of whose processes is alive (left by
    a crash during start-up); returns how many were removed."""
    n = ctypes.c_size_t()
    check(lib.kvo_arena_sweep_stale(os.fsencode(directory), PREFIX.encode(), ctypes.byref(n)),
          "kvo_arena_sweep_stale")
    return n.value


class SharedArena:
    """A shared, owner-checked arena of data_bytes for slots.

    Args:
        name: file name suffix (letters, digits, '-', '_', '.'); the vLLM spec
            uses the engine id and data-parallel index.
        data_bytes: slot space (the store's capacity).
        fingerprint: the plan fingerprint (int); must match in every process.
        expected: processes that will attach (the creator included).
        directory: where the file lives (default /dev/shm).
        timeout_s: how long a non-creator waits for the creator's header.

    Attributes: base (address of slot space), data_bytes, creator (bool),
    instance (16 bytes), path.
    """

    def __init__(self, name: str, data_bytes: int, fingerprint: int, expected: int = 1,
                 directory: str = DEFAULT_DIR, timeout_s: float = 60.0, prefault: bool = True) -> None:
        if not name or any(not (c.isalnum() or c in "-_.") for c in name):
            raise KvoError(L.KVO_EINVAL, f"shared arena name '{name}' must be letters, digits, '-', '_' or '.'",
                           "SharedArena")
        L.check_int("expected", expected, 0, 0xFFFFFFFF)  # TypeError / OverflowError naming it
        if expected < 1:
            raise KvoError(L.KVO_EINVAL, f"shared arena '{name}': expected={expected} must be >= 1", "SharedArena")
        L.check_int("data_bytes", data_bytes, 1, (1 << 64) - 1)
        self.path = os.path.join(directory, PREFIX + name)
        self.data_bytes = data_bytes
        self._arena: Optional[Arena] = Arena(data_bytes, shm_path=self.path, prefault=prefault,
                                             share_processes=expected, share_fingerprint=fingerprint,
                                             share_timeout_ms=max(1, int(timeout_s * 1000)))
        self.creator: bool = bool(lib.kvo_arena_creator(self._arena._h))
        inst = lib.kvo_arena_instance(self._arena._h)
        self.instance: bytes = inst.lo.to_bytes(8, "little") + inst.hi.to_bytes(8, "little")
        self.base: int = self._arena.base

    @property
    def linked(self) -> bool:
        """Whether the name still exists (someone expected has not attached)."""
        return os.path.exists(self.path)

    def view(self, offset: int = 0, nbytes: Optional[int] = None) -> np.ndarray:
        """uint8 view of slot space [offset, offset + nbytes)."""
        assert self._arena is not None
        return self._arena.view(offset, nbytes)

    def close(self) -> None:
        """Unmap; the creator also removes the name if nobody else took it."""
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    def __del__(self) -> None:
        if getattr(self, "_arena", None) is not None:
            self.close()
