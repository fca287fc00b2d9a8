"""SharedArena: a host arena in a named shared-memory file that the processes
of ONE engine map (vLLM's scheduler and its workers), with an owner check.

File: /dev/shm/kvoffload-<name> (or under `directory`), laid out as
    [4096-byte header][data_bytes of slots]
Header (little endian): magic "KVOSHM01", version, header bytes, data bytes,
the plan fingerprint (16 bytes), a random instance id (16 bytes) chosen by
the creator, the number of processes expected to attach, the number attached
so far, and the pids of those processes (up to 16).

Protocol
 - open_or_create(): the first process creates the file (O_CREAT|O_EXCL),
   sizes it, writes the header; the others wait for a valid header.  Header
   updates happen under flock(LOCK_EX).
 - Every process checks magic, version, data size and plan fingerprint: a
   file written for another model/plan/capacity is refused (KVO_ESTATE), so
   an engine cannot attach to another engine's arena by mistake; the name
   includes the engine id, so engines never share a name unless configured
   to.
 - When the last expected process has attached, it unlinks the name: from
   then on only existing mappings keep the memory alive, the kernel frees it
   when the last process exits (however it exits), and no later process can
   attach (a second engine that reuses the name creates a new file).
 - A file left by a crash during start-up (before everyone attached) is
   detected as stale when none of its recorded pids is alive; it is
   removed by the next open_or_create of that name and by sweep_stale().
 - close() unmaps; the creator also unlinks the name if it is still there.
"""
from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
import time
from typing import Optional

import numpy as np

from . import _lib as L
from ._lib import KvoError
from .core import Arena

MAGIC = b"KVOSHM01"
VERSION = 1
HEADER_BYTES = 4096
MAX_PIDS = 16
_FMT = "<8sIIQ16s16sII" + "i" * MAX_PIDS
_HSIZE = struct.calcsize(_FMT)
DEFAULT_DIR = "/dev/shm"
PREFIX = "kvoffload-"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_header(fd: int) -> Optional[dict]:
    raw = os.pread(fd, _HSIZE, 0)
    if len(raw) < _HSIZE:
        return None
    f = struct.unpack(_FMT, raw)
    if f[0] != MAGIC:
        return None
    return {"version": f[1], "header_bytes": f[2], "data_bytes": f[3], "fingerprint": f[4], "instance": f[5],
            "expected": f[6], "attached": f[7], "pids": [p for p in f[8:] if p]}


def _write_header(fd: int, h: dict) -> None:
    pids = (list(h["pids"]) + [0] * MAX_PIDS)[:MAX_PIDS]
    os.pwrite(fd, struct.pack(_FMT, MAGIC, h["version"], h["header_bytes"], h["data_bytes"], h["fingerprint"],
                              h["instance"], h["expected"], h["attached"], *pids), 0)


def _stale(h: Optional[dict], fd: int) -> bool:
    if h is None:
        # No header: stale only if the file is old (its creator died before
        # writing it); a creator writes it within milliseconds.
        return time.time() - os.fstat(fd).st_mtime > 10
    return not any(_alive(p) for p in h["pids"])


def sweep_stale(directory: str = DEFAULT_DIR) -> list[str]:
    """Remove kvoffload arena files none of whose processes is alive (left by
    a crash during start-up).  Returns the removed paths."""
    removed = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for n in names:
        path = os.path.join(directory, n)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _stale(_read_header(fd), fd):
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


class SharedArena:
    """A shared, owner-checked arena of data_bytes for slots.

    Args:
        name: file name suffix (letters, digits, '-', '_', '.'); the vLLM spec
            uses the engine id.
        data_bytes: slot space (the store's capacity).
        fingerprint: the plan fingerprint (int); must match in every process.
        expected: processes that will attach (creator included); the last one
            unlinks the name.
        directory: where the file lives (default /dev/shm).
        timeout_s: how long a non-creator waits for the creator's header.

    Attributes: base (address of slot space), data_bytes, creator (bool),
    instance (bytes), path.
    """

    def __init__(self, name: str, data_bytes: int, fingerprint: int, expected: int = 1,
                 directory: str = DEFAULT_DIR, timeout_s: float = 60.0, prefault: bool = True) -> None:
        if not name or any(not (c.isalnum() or c in "-_.") for c in name):
            raise KvoError(L.KVO_EINVAL, f"shared arena name '{name}' must be letters, digits, '-', '_' or '.'",
                           "SharedArena")
        if expected < 1 or data_bytes < 1:
            raise KvoError(L.KVO_EINVAL, f"shared arena '{name}': expected={expected} and data_bytes={data_bytes} "
                           "must be >= 1", "SharedArena")
        self.path = os.path.join(directory, PREFIX + name)
        self.data_bytes = data_bytes
        self.creator = False
        self._fp = fingerprint.to_bytes(16, "little")
        total = HEADER_BYTES + data_bytes
        fd = self._open(expected, total, timeout_s)
        try:
            self._arena = Arena(total, shm_path=self.path, prefault=prefault)
            self._attach(fd)
        except BaseException:
            os.close(fd)
            if self.creator:
                self._unlink()
            raise
        os.close(fd)
        self.base: int = self._arena.base + HEADER_BYTES

    # -- start-up --------------------------------------------------------
    def _open(self, expected: int, total: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                fd = self._open_existing(total)
                if fd >= 0:
                    return fd
                if time.monotonic() > deadline:
                    raise KvoError(L.KVO_ETIMEDOUT, f"shared arena '{self.path}': no valid header after "
                                   f"{timeout_s}s (a creator died mid-start? remove the file)", "SharedArena")
                time.sleep(0.01)
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.creator = True
            try:
                os.ftruncate(fd, total)
                self.instance = secrets.token_bytes(16)
                _write_header(fd, {"version": VERSION, "header_bytes": HEADER_BYTES,
                                   "data_bytes": self.data_bytes, "fingerprint": self._fp,
                                   "instance": self.instance, "expected": expected, "attached": 0, "pids": []})
            except OSError as e:
                os.close(fd)
                self._unlink()
                raise KvoError(L.KVO_EIO, f"shared arena '{self.path}': cannot size to {total} bytes: {e}",
                               "SharedArena") from e
            return fd  # still locked: _attach updates and unlocks

    def _open_existing(self, total: int) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return -1
        fcntl.flock(fd, fcntl.LOCK_EX)
        h = _read_header(fd)
        if h is None or (h["attached"] >= h["expected"]) or _stale(h, fd) and h["attached"] > 0:
            if (h is not None and h["attached"] > 0 and _stale(h, fd)) or (h is None and _stale(None, fd)):
                try:
                    os.unlink(self.path)  # a crashed start-up's leftover
                except OSError:
                    pass
            os.close(fd)
            return -1
        if h["version"] != VERSION or h["data_bytes"] != self.data_bytes or h["fingerprint"] != self._fp:
            os.close(fd)
            raise KvoError(L.KVO_ESTATE, f"shared arena '{self.path}' belongs to another configuration: "
                           f"{h['data_bytes']} bytes, plan {h['fingerprint'][::-1].hex()}; this process has "
                           f"{self.data_bytes} bytes, plan {self._fp[::-1].hex()} (same model, plan and capacity "
                           "needed; or choose another arena name)", "SharedArena")
        if os.fstat(fd).st_size != total:
            os.close(fd)
            return -1
        self.instance = h["instance"]
        return fd

    def _attach(self, fd: int) -> None:
        h = _read_header(fd)
        assert h is not None
        h["attached"] += 1
        h["pids"] = (h["pids"] + [os.getpid()])[-MAX_PIDS:]
        _write_header(fd, h)
        self.attached, self.expected = h["attached"], h["expected"]
        if h["attached"] >= h["expected"]:
            self._unlink()  # everyone mapped it: the name goes, the memory stays
        fcntl.flock(fd, fcntl.LOCK_UN)

    def _unlink(self) -> None:
        try:
            os.unlink(self.path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise

    # -- use ---------------------------------------------------------------
    @property
    def linked(self) -> bool:
        """Whether the name still exists (someone expected has not attached)."""
        return os.path.exists(self.path)

    def view(self, offset: int = 0, nbytes: Optional[int] = None) -> np.ndarray:
        """uint8 view of slot space [offset, offset + nbytes)."""
        nbytes = self.data_bytes - offset if nbytes is None else nbytes
        return self._arena.view(HEADER_BYTES + offset, nbytes)

    def close(self) -> None:
        """Unmap.  The creator also removes the name if it is still there,
        and only if the file is still its own (same instance id)."""
        if getattr(self, "_arena", None) is None:
            return
        if self.creator:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    h = _read_header(fd)
                    if h is not None and h["instance"] == self.instance:
                        self._unlink()
                finally:
                    os.close(fd)
            except OSError:
                pass
        self._arena.close()
        self._arena = None

    def __del__(self) -> None:
        self.close()
