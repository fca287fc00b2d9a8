"""Scheduler side: KvoffloadOffloadingManager, vLLM's OffloadingManager over
a kvoffload Store (host tier) and the optional file and remote tiers (see
the package doc, kvoffload/vllm/__init__.py, for the tiers' behaviour).

Store path, and where a store can be lost (each counted in
stats()["stores"]): prepare_store reserves host slots for a batch, all or
nothing.  When the host tier has no room for the whole batch (its slots
pinned by loads or PENDING with the last step's stores) and a lower tier
exists, the host tier takes the longest prefix of the batch it has room
for and the staging area (a second Store over the arena's last
staging_bytes) the rest: complete_store writes staged chunks to the file
and remote tiers and frees their slots at once, so they reach the lower
tiers without ever holding a host slot ("staged").  Keys neither has room
for are refused ("rejected": vLLM does not store them; None when that is
the whole batch, as without a staging area).  A file write refused for
back-pressure (KVO_EAGAIN: the
write queue or its staging memory is full) is kept and retried at every
step while its slot still holds the bytes ("file_deferred"); when the host
tier evicts that slot first, the write is tried once more from the evicted
slot, and only a refusal then loses it ("file_lost").

Zero-copy write-through (file_zero_copy, kvo_file_zero_copy in the extra
config): a completed store's host slots are lent to the file tier
(FileTier.write_borrowed) instead of copied into its staging memory; each
chunk stays pinned in the host tier until the write's completion is polled
(every step), so no eviction hands its slot out while the tier reads it
("file_lent" counts the loans).  A lookup that finds a lower tier's chunk
while every free host slot is lent answers RETRY (vLLM asks again at a
later step, once the writes are done) instead of a miss.  reset_cache
waits for the loans before the slots can be reused.  Staged chunks and
retries copy as before."""
from __future__ import annotations

import ctypes
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

from vllm.v1.kv_offload.base import (LoadStoreSpec, LookupResult, Medium, OffloadingEvent, OffloadingManager,
                                     OffloadKey, OffloadPolicy, PrepareStoreOutput, ReqContext,
                                     RequestOffloadingContext)

from .. import _lib as L

try:
    from .._hot import Hot
except ImportError as e:  # a checkout used without building the package
    raise ImportError("kvoffload._hot (the vLLM manager's compiled hot calls, python/kvoffload/_hot.c) is not "
                      "built: pip install ./python, or in a checkout tools/test-python.sh (CMake target _hot "
                      "of python/CMakeLists.txt; needs a C compiler and the Python headers, Debian's python3-dev); "
                      f"import error: {e}") from e
from ..core import KEY_DTYPE, PENDING, READY, FileTier, Plan, RemoteTier, Store
from ..shm import SharedArena
from .answers import RemoteAnswers
from .compat import failed_store_event, lower_tier_events
from .config import KvoffloadLoadStoreSpec

_HIT, _MISS, _PENDING, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.RETRY
_LENT = (1 << 64) - 1  # user data of a lent (zero-copy) file write
# the store functions the compiled hot calls make (kvoffload/_hot.c), from the
# library kvoffload._lib loaded
_HOT_FUNCTIONS = ("kvo_store_lookup", "kvo_store_prepare_load", "kvo_store_complete_load", "kvo_store_touch",
                  "kvo_store_prepare_store", "kvo_store_complete_store", "kvo_last_error")


class KvoffloadOffloadingManager(OffloadingManager):
    """vLLM's OffloadingManager over a kvoffload Store (see module doc)."""

    def __init__(self, plan: Plan, capacity_bytes: int, group_ids: Sequence[int], policy: str = "lru",
                 enable_events: bool = False, arena: Optional[SharedArena] = None,
                 file_tier: Optional[FileTier] = None, file_mode: str = "write_through",
                 store_threshold: int = 0, remote_tier: Optional[RemoteTier] = None,
                 remote_answer_ttl_ms: int = 2000, staging_bytes: int = 0, file_zero_copy: bool = False) -> None:
        self.plan = plan
        # the arena's slot space: [0, capacity_bytes) the host tier, then
        # staging_bytes of staging area (only with a lower tier and an arena)
        if not (arena is not None and (file_tier is not None or remote_tier is not None)):
            staging_bytes = 0
        slot = plan.max_slot_bytes
        if staging_bytes and (staging_bytes < slot or capacity_bytes - staging_bytes < slot):
            raise L.KvoError(L.KVO_EINVAL, f"staging_bytes {staging_bytes}: need at least one slot ({slot} bytes) "
                             f"for it and for the host tier out of {capacity_bytes}", "manager")
        self.staging_bytes = staging_bytes
        self.capacity_bytes = capacity_bytes - staging_bytes
        self.policy = policy
        self.store_threshold = store_threshold
        # the host tier is the last one (no file or remote tier written from
        # its slots): the policy may turn a chunk away (the branch policy's
        # admission, kvo_store_params.policy_admission), as the C connector
        # lets it; with a lower tier every chunk is stored, so it reaches them
        self.policy_admission = file_tier is None and remote_tier is None
        self.store = self._new_store()
        self._offload_policy = OffloadPolicy.REQUEST_LEVEL if policy == "branch" else OffloadPolicy.CHUNK_LEVEL
        self.medium = Medium.CPU
        self.events: Optional[list[OffloadingEvent]] = [] if enable_events else None
        self.arena = arena
        self.file_tier = file_tier
        if file_tier is not None and arena is None:
            raise L.KvoError(L.KVO_EINVAL, "a file tier needs the shared arena (the chunk bytes)", "manager")
        self.remote_tier = remote_tier
        if remote_tier is not None and arena is None:
            raise L.KvoError(L.KVO_EINVAL, "a remote tier needs the shared arena (the chunk bytes)", "manager")
        if file_mode not in ("write_through", "write_back"):
            raise L.KvoError(L.KVO_EINVAL, f"kvo_file_mode '{file_mode}': use write_through or write_back",
                             "manager")
        self.file_mode = file_mode
        self.file_zero_copy = bool(file_zero_copy) and file_mode == "write_through"
        self._lent = 0                                  # file writes lent from host slots, in flight
        # the store calls (lookup, prefix_hits, prepare_load, touch,
        # complete_load, prepare_store, complete_store) and the key packing,
        # compiled: one C call each, no Python bytecode per key
        # (docs/benchmarks.md, "Python: the vLLM manager").  Groups: vLLM's group id (an OffloadKey's big-endian
        # 4-byte suffix) -> the kvoffload group index in a kvo_chunk_key.
        groups = [(L.check_int("group_ids", int(g), 0, 0xFFFFFFFF), i) for i, g in enumerate(group_ids)]
        self._hot = Hot(groups, L.addresses(L.lib, _HOT_FUNCTIONS), (_MISS, _HIT, _PENDING), L.KvoError,
                        (L.KVO_EINVAL, L.KVO_ERANGE, L.KVO_ENOSPC))
        self._names: dict[bytes, OffloadKey] = {}     # kvo key bytes -> OffloadKey (stored/pending)
        self._pending: dict[bytes, int] = {}          # with a file tier: kvo key bytes -> slot offset
        self._promoting: dict[int, tuple[bytes, OffloadKey]] = {}  # file reads into host slots
        self._fetching: dict[int, tuple[bytes, OffloadKey]] = {}   # remote gets into host slots
        # the remote tier's EXISTS answers and questions in flight, by kvo key bytes
        self._answers = RemoteAnswers(remote_answer_ttl_ms / 1000.0)
        self._next_ud = 1
        self._stage: Optional[Store] = Store(plan, staging_bytes) if staging_bytes else None
        self._staged: dict[bytes, int] = {}             # kvo key bytes -> arena offset, store in flight
        self._retry: dict[bytes, tuple[int, bool]] = {}  # file writes to retry: -> (arena offset, staged)
        self._retry_stalls = 0
        self._sc = dict(offered=0, rejected=0, staged=0, file_queued=0, file_deferred=0, file_lost=0,
                        file_refused=0, remote_refused=0, read_no_room=0, file_lent=0, read_wait_lent=0)

    def _new_store(self) -> Store:
        # lookups_per_key: vLLM looks keys up one at a time, which names no
        # request (the policy learns from prepare_store instead)
        return Store(self.plan, self.capacity_bytes, policy=self.policy, admit_after=self.store_threshold,
                     policy_admission=self.policy_admission, lookups_per_key=True)

    # -- key conversion ---------------------------------------------------
    def _ckey(self, key: bytes) -> bytes:
        """One key's kvo_chunk_key record (24 bytes)."""
        return self._hot.pack((key,))

    def _cbytes(self, keys: Sequence[bytes]) -> bytes:
        """The batch as packed kvo_chunk_key records (24 bytes per key): the
        first 16 bytes of each hash (zero-padded), the group's index, 4 zero
        bytes.  Plain bytes, handed to C without a copy.  KvoError
        (KVO_EINVAL) for a group that is not offloaded, TypeError for a key
        that is not bytes."""
        return self._hot.pack(keys)

    def _ckeys(self, keys: Sequence[bytes]) -> np.ndarray:
        return np.frombuffer(self._cbytes(keys), dtype=KEY_DTYPE).copy()

    def _call(self, rc: int, func: str) -> None:
        if rc < 0:
            raise L.KvoError(rc, L.last_error(), func)

    # -- OffloadingManager --------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        # the branch policy learns a request's shape (the prefix it branches
        # from) from prepare_store batches that name the request from its
        # first chunk: vLLM's request-level offloading offers the prefix hits
        # too (present, so not stored again: they count as used)
        return RequestOffloadingContext(policy=self._offload_policy)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        r = self._hot.lookup(self.store._h, key)  # HIT, HIT_PENDING or MISS (the host tier)
        if r is not _MISS or (self.file_tier is None and self.remote_tier is None):
            return r
        ck = self._ckey(key)
        if self.file_tier is not None:
            r = self._promote(ck, key)
            if r is not _MISS or self.remote_tier is None:
                return r
        if self.remote_tier is None:
            return _MISS
        return self._remote_lookup(ck, key)

    def prefix_hits(self, keys: Sequence[OffloadKey]) -> int:
        """Batched form of the per-key lookup loop vLLM runs for a request's
        prefix: how many leading keys are READY in the host tier, with one C
        call for all of them (no file-tier promotion)."""
        return self._hot.prefix_hits(self.store._h, keys)

    def _promote(self, ck: bytes, key: OffloadKey) -> LookupResult:
        """Host miss: if the file tier holds the chunk, read it into a fresh
        host slot (the entry is PENDING until the read lands)."""
        assert self.file_tier is not None and self.arena is not None
        keys = np.frombuffer(ck, dtype=KEY_DTYPE).copy()
        if self.file_tier.lookup(keys)[0] != READY:
            return _MISS
        return self._read_into_host(ck, key, self.file_tier.read, self._promoting)

    def _read_into_host(self, ck: bytes, key: OffloadKey, read: Any, inflight: dict) -> LookupResult:
        """Start reading a lower tier's chunk (read: FileTier.read or
        RemoteTier.get) into a fresh host slot, PENDING until the completion
        (inflight[user_data] = (ck, key)): HIT_PENDING, or MISS when there is
        no room or the read was refused; HIT_PENDING too when the key is in
        the host tier already (READY or PENDING)."""
        assert self.arena is not None
        keys = np.frombuffer(ck, dtype=KEY_DTYPE).copy()
        try:
            need, slots, ev, evs = self.store.prepare_store(keys)
        except L.KvoError:
            if self._lent:  # slots lent to file writes: room once they are written
                self._poll_file()
                if self._lent:
                    self._sc["read_wait_lent"] += 1
                    return _RETRY
                return self._read_into_host(ck, key, read, inflight)
            self._sc["read_no_room"] += 1
            return _MISS
        self._on_evicted(ev.ctypes.data, evs.ctypes.data, len(ev))
        if not need[0]:
            return _PENDING
        ud = self._next_ud
        self._next_ud += 1
        if read(keys, [self.arena.base + int(slots[0]["offset"])], [ud])[0] != 0:
            self.store.complete_store(keys, ok=False)
            return _MISS
        inflight[ud] = (ck, key)
        self._names[ck] = key
        return _PENDING

    def _remote_lookup(self, ck: bytes, key: OffloadKey) -> LookupResult:
        """Host and file miss with a remote tier: ask the cluster (RETRY
        until the answer lands), then read a present chunk into a host slot
        (HIT_PENDING until it lands)."""
        rt = self.remote_tier
        assert rt is not None and self.arena is not None
        answers = self._answers
        if answers.in_flight() or self._fetching:
            self._poll_remote()
        present = answers.get(ck)
        if present is None:
            if answers.asking(ck):
                return _RETRY
            ud = self._next_ud
            self._next_ud += 1
            if rt.exists(np.frombuffer(ck, dtype=KEY_DTYPE).copy(), [ud])[0] != 0:  # too many in flight
                return _MISS
            answers.sent(ud, ck)
            return _RETRY
        if not present:
            return _MISS
        r = self._read_into_host(ck, key, rt.get, self._fetching)
        if r is _PENDING:
            answers.forget(ck)  # the read's outcome decides from here
        return r

    def _poll_remote(self) -> None:
        if self.remote_tier is None or not (self._answers.in_flight() or self._fetching):
            return
        for c in self.remote_tier.poll():
            ud = c["user_data"]
            if c["op"] == L.REMOTE_OP_EXISTS:
                self._answers.landed(ud, c["result"] == 0)
                continue
            item = self._fetching.pop(ud, None) if c["op"] == L.REMOTE_OP_GET else None
            if item is None:
                continue
            ck, _key = item
            ok = c["result"] == 0
            self.store.complete_store(np.frombuffer(ck, dtype=KEY_DTYPE).copy(), ok=ok)
            if not ok:
                self._names.pop(ck, None)
                self._answers.remember(ck, False)

    def _poll_tiers(self) -> None:
        self._poll_file()
        self._poll_remote()

    def _poll_file(self) -> None:
        if self.file_tier is None:
            return
        if self._retry:
            self._retry_file()
        if not self._promoting and not self._lent:
            return
        returned: list[tuple[int, int, int, int]] = []  # lent writes that ended: unpinned at once below
        for c in self.file_tier.poll():
            if c["op"] == L.FILE_OP_WRITE:
                if c["user_data"] == _LENT:
                    returned.append((c["key"][0], c["key"][1], c["group"], 0))
                continue
            item = self._promoting.pop(c["user_data"], None)
            if item is None:
                continue
            ck, key = item
            keys = np.frombuffer(ck, dtype=KEY_DTYPE).copy()
            self.store.complete_store(keys, ok=c["result"] == 0)
            if c["result"] != 0:
                self._names.pop(ck, None)
        if returned:
            self._lent -= len(returned)
            self.store.complete_load(np.array(returned, dtype=KEY_DTYPE))

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        offsets, groups = self._hot.prepare_load(self.store._h, keys)  # writable bytearrays, key order
        return KvoffloadLoadStoreSpec.of_bytes(offsets, groups)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._hot.touch(self.store._h, keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._hot.complete_load(self.store._h, keys)

    def _on_evicted(self, ev: int, evs: int, m: int) -> list[OffloadKey]:
        """The OffloadKeys of m evicted records (kvo_chunk_key at address ev,
        their old kvo_slot at evs), dropped from _names; write-back writes
        them."""
        if m == 0:
            return []
        out = self._hot.forget(self._names, ev, m)
        self._evicted_slots(ctypes.string_at(ev, 24 * m), np.frombuffer(ctypes.string_at(evs, 16 * m), np.uint64)[0::2])
        return out

    def _evicted_slots(self, raw: bytes, offs: Any) -> None:
        """Evicted records (raw, 24 bytes each) whose old slots (arena
        offsets offs) are about to be reused: with a file tier, write-back
        writes them, and write-through writes those still waiting for a
        retry (_write_evicted)."""
        if raw and self.file_tier is not None and (self._retry or self.file_mode == "write_back"):
            self._write_evicted(raw, offs, 0)

    def _write_evicted(self, raw: bytes, offs: np.ndarray, base: int) -> None:
        """Slots about to be reused (evicted from the host tier, or from
        the staging area at offset base): their last chance to reach the
        file tier (write_back: every host one; else those whose write waits
        for a retry).  A refusal now loses the chunk."""
        assert self.file_tier is not None and self.arena is not None
        sel: Sequence[int] = range(len(offs))
        if self.file_mode != "write_back" or base:
            sel = [i for i in sel if self._retry.pop(raw[24 * i:24 * i + 24], None) is not None]
            if not sel:
                return
        elif self._retry:
            for i in sel:
                self._retry.pop(raw[24 * i:24 * i + 24], None)
        res = self.file_tier.write(np.frombuffer(b"".join(raw[24 * i:24 * i + 24] for i in sel), dtype=KEY_DTYPE),
                                   [self.arena.base + base + int(offs[i]) for i in sel])
        self._count_file(res, "file_lost")

    def _count_file(self, res: np.ndarray, again: Optional[str]) -> None:
        """Count file write results; a KVO_EAGAIN counts as `again`."""
        sc = self._sc
        sc["file_queued"] += int(np.count_nonzero(res == 0))
        if again:
            sc[again] += int(np.count_nonzero(res == L.KVO_EAGAIN))
        sc["file_refused"] += int(np.count_nonzero((res != 0) & (res != L.KVO_EAGAIN) & (res != L.KVO_EEXIST)))

    def _write_file(self, recs: list[bytes], offs: list[int], staged: list[bool], again: Optional[str]) -> None:
        """Queue file writes of chunks at arena offsets offs; the ones
        refused for back-pressure wait in _retry (their slots still hold
        the bytes)."""
        assert self.file_tier is not None and self.arena is not None
        res = self.file_tier.write(np.frombuffer(b"".join(recs), dtype=KEY_DTYPE),
                                   [self.arena.base + o for o in offs])
        self._count_file(res, again)
        for i in np.flatnonzero(res == L.KVO_EAGAIN).tolist():
            self._retry[recs[i]] = (offs[i], staged[i])

    def _lend_file(self, recs: list[bytes], offs: list[int]) -> None:
        """Zero-copy write-through of READY host chunks (module doc): pin,
        lend; a write the tier does not take is unpinned at once (and, for
        back-pressure, retried with the copy while the slot holds it)."""
        assert self.file_tier is not None and self.arena is not None
        keys = np.frombuffer(b"".join(recs), dtype=KEY_DTYPE)
        try:
            self.store.prepare_load(keys)
        except L.KvoError:  # not all READY (a reset between): the copy
            self._write_file(recs, offs, [False] * len(recs), "file_deferred")
            return
        res = self.file_tier.write_borrowed(keys, [self.arena.base + o for o in offs], [_LENT] * len(recs))
        lent = res == 0
        self._lent += int(np.count_nonzero(lent))
        self._sc["file_lent"] += int(np.count_nonzero(lent))
        if not lent.all():
            self.store.complete_load(keys[~lent].copy())
        self._count_file(res, "file_deferred")
        for i in np.flatnonzero(res == L.KVO_EAGAIN).tolist():
            self._retry[recs[i]] = (offs[i], False)

    def _write_lower(self, recs: list[bytes], offs: list[int], staged: bool) -> None:
        """Chunks whose stores completed (at arena offsets offs) to the
        file tier (write_through; in any mode for staged chunks, which the
        host tier never holds) and the remote tier; staged chunks whose
        writes are not waiting for a retry leave the staging area."""
        assert self.arena is not None
        if self.file_tier is not None and (staged or self.file_mode == "write_through"):
            if self.file_zero_copy and not staged:
                self._lend_file(recs, offs)
            else:
                self._write_file(recs, offs, [staged] * len(recs), "file_deferred")
        if self.remote_tier is not None:
            ckeys = np.frombuffer(b"".join(recs), dtype=KEY_DTYPE)
            res = self.remote_tier.put(ckeys, [self.arena.base + o for o in offs])  # copied before it returns
            self._sc["remote_refused"] += int(np.count_nonzero((res != 0) & (res != L.KVO_EEXIST)))
            for r, rc in zip(recs, res.tolist()):
                if rc == 0 or rc == L.KVO_EEXIST:
                    self._answers.stored(r)  # an "absent" remembered or on its way is stale
        if staged:
            self._unstage([r for r in recs if r not in self._retry])

    def _unstage(self, recs: list[bytes]) -> None:
        if recs:
            assert self._stage is not None
            self._stage.remove(np.frombuffer(b"".join(recs), dtype=KEY_DTYPE))

    def _retry_file(self) -> None:
        """Write again what the file tier refused for back-pressure."""
        if not self._retry or self.file_tier is None:
            return
        items, self._retry = self._retry, {}
        recs = list(items)
        self._write_file(recs, [items[r][0] for r in recs], [items[r][1] for r in recs], None)
        self._unstage([r for r in recs if items[r][1] and r not in self._retry])
        self._retry_stalls = self._retry_stalls + 1 if len(self._retry) >= len(items) else 0

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        if type(keys) is not list:
            keys = list(keys)
        n = len(keys)
        if n == 0:
            return PrepareStoreOutput([], KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32)),
                                      [])
        self._sc["offered"] += n
        if self._staged:  # keys being stored through the staging area count as present
            buf = self._cbytes(keys)
            keep = [i for i in range(n) if buf[24 * i:24 * i + 24] not in self._staged]
            if len(keep) < n:
                keys, n = [keys[i] for i in keep], len(keep)
                if n == 0:
                    return PrepareStoreOutput([], KvoffloadLoadStoreSpec(np.zeros(0, np.uint64),
                                                                         np.zeros(0, np.uint32)), [])
        # one C call (kvoffload._hot): pack the keys, kvo_store_prepare_store
        # (the evicted buffer grown on KVO_ERANGE), the names of the keys to
        # store recorded and of the evicted ones dropped; None: KVO_ENOSPC
        r = self._hot.prepare_store(self.store._h, keys, self._names)
        if r is None:
            if self._stage is None:
                self._sc["rejected"] += n
                return None
            return self._prepare_split(keys, self._cbytes(keys))
        buf, to_store, idx, offsets, groups, evicted, ev_recs, ev_offs = r
        if ev_recs and self.file_tier is not None:
            self._evicted_slots(ev_recs, np.frombuffer(ev_offs, np.uint64))
        spec = KvoffloadLoadStoreSpec.of_bytes(offsets, groups)
        if self.file_tier is not None or self.remote_tier is not None:
            for j, i in enumerate(range(n) if idx is None else idx):
                self._pending[buf[24 * i:24 * i + 24]] = int(spec.offsets[j])
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=spec, evicted_keys=evicted)

    @staticmethod
    def _fill(store: Store, ck: np.ndarray) -> tuple[int, list[tuple[int, Any, Any, Any, Any]]]:
        """Reserve slots in store for the longest prefix of ck that fits,
        in parts (prepare_store is all or nothing: halve the part on
        KVO_ENOSPC): (keys taken, [(first, need, slots, evicted,
        evicted_slots), ...])."""
        i, part, n, parts = 0, len(ck), len(ck), []
        while i < n and part > 0:
            part = min(part, n - i)
            try:
                need, slots, ev, evs = store.prepare_store(ck[i:i + part])
            except L.KvoError as err:
                if err.code != L.KVO_ENOSPC:
                    raise
                part //= 2
                continue
            parts.append((i, need, slots, ev, evs))
            i += part
        return i, parts

    def _prepare_split(self, keys: list[OffloadKey], buf: bytes) -> Optional[PrepareStoreOutput]:
        """The host tier has no room for the whole batch (and a staging
        area exists): the host tier takes the longest prefix it has room
        for, the staging area the rest that the host tier does not hold;
        what neither has room for is refused ("rejected"; None when that is
        every key)."""
        assert self._stage is not None
        n = len(keys)
        ck = np.frombuffer(buf, dtype=KEY_DTYPE)
        took, parts = self._fill(self.store, ck)
        to_store: list[OffloadKey] = []
        offs: list[int] = []
        pos: list[int] = []
        evicted: list[OffloadKey] = []
        names = self._names
        for first, need, slots, ev, evs in parts:
            evicted += self._on_evicted(ev.ctypes.data, evs.ctypes.data, len(ev))
            for j in np.flatnonzero(need).tolist():
                rec = buf[24 * (first + j):24 * (first + j) + 24]
                names[rec] = keys[first + j]
                off = int(slots[j]["offset"])
                self._pending[rec] = off
                to_store.append(keys[first + j])
                offs.append(off)
                pos.append(first + j)
        # the rest through the staging area, but not keys the host holds
        e = L.StoreEntry()
        peek, h = L.lib.kvo_store_peek, self.store._h
        idx = [i for i in range(took, n) if peek(h, buf[24 * i:24 * i + 24], ctypes.byref(e)) != 0]
        sk = ck[idx]
        staged, sparts = self._fill(self._stage, sk) if idx else (0, [])
        base = self.capacity_bytes
        for first, need, slots, ev, evs in sparts:
            if len(ev) and self.file_tier is not None:
                self._write_evicted(ev.tobytes(), evs["offset"], base)
            for j in np.flatnonzero(need).tolist():
                i = idx[first + j]
                off = base + int(slots[j]["offset"])
                self._staged[buf[24 * i:24 * i + 24]] = off
                to_store.append(keys[i])
                offs.append(off)
                pos.append(i)
                self._sc["staged"] += 1
        self._sc["rejected"] += len(idx) - staged
        if took == 0 and staged == 0 and idx:
            return None
        groups = ck["group"][pos] if pos else np.zeros(0, np.uint32)
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=KvoffloadLoadStoreSpec(
            np.array(offs, dtype=np.uint64), groups), evicted_keys=evicted)

    def _complete_staged(self, keys: list[OffloadKey], buf: bytes, success: bool) -> tuple[list[OffloadKey], bytes]:
        """Finish the stores of staged keys (written to the lower tiers,
        their slots freed); returns the other keys."""
        n = len(keys)
        mine = [i for i in range(n) if buf[24 * i:24 * i + 24] in self._staged]
        if not mine:
            return keys, buf
        assert self._stage is not None
        recs = [buf[24 * i:24 * i + 24] for i in mine]
        offs = [self._staged.pop(r) for r in recs]
        self._stage.complete_store(np.frombuffer(b"".join(recs), dtype=KEY_DTYPE), ok=success)
        if success:
            self._write_lower(recs, offs, True)
        done = set(recs)
        rest = [i for i in range(n) if buf[24 * i:24 * i + 24] not in done]
        return [keys[i] for i in rest], b"".join(buf[24 * i:24 * i + 24] for i in rest)

    def _filter_pending(self, keys: list[OffloadKey], buf: bytes) -> tuple[list[OffloadKey], bytes]:
        """The keys that are PENDING (vLLM may complete keys it did not get to
        store, e.g. after a reset); rare path, one peek per key."""
        e = L.StoreEntry()
        keep = []
        for i in range(len(keys)):
            rec = buf[24 * i:24 * i + 24]
            if L.lib.kvo_store_peek(self.store._h, rec, ctypes.byref(e)) == 0 and e.state == PENDING:
                keep.append(i)
        return [keys[i] for i in keep], b"".join(buf[24 * i:24 * i + 24] for i in keep)

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        if type(keys) is not list:
            keys = list(keys)
        if not keys:
            return
        buf = self._cbytes(keys)
        if success and self.events is not None:  # handed to the lower tiers: their KV events
            self.events += lower_tier_events(keys, self.file_tier is not None and self.file_mode == "write_through",
                                             self.remote_tier is not None)
        if self._staged:
            keys, buf = self._complete_staged(keys, buf, success)
            if not keys:
                return
        rc = self._hot.complete_store(self.store._h, buf, success)
        if rc == L.KVO_ESTATE:
            keys, buf = self._filter_pending(keys, buf)
            if not keys:
                return
            rc = self._hot.complete_store(self.store._h, buf, success)
        self._call(rc, "kvo_store_complete_store")
        tiers = self.file_tier is not None or self.remote_tier is not None
        recs = [buf[i:i + 24] for i in range(0, len(buf), 24)] if tiers or not success else []
        if not success:
            for r in recs:
                self._names.pop(r, None)
        if tiers:
            offs = [self._pending.pop(r, 0) for r in recs]
            if success and self.arena is not None:
                self._write_lower(recs, offs, False)
        if self.events is not None:
            ev = (OffloadingEvent(keys=keys, medium=self.medium, removed=False) if success
                  else failed_store_event(keys, self.medium))
            if ev is not None:
                self.events.append(ev)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return
        events, self.events = self.events, []
        yield from events

    def on_schedule_end(self, context: Any) -> None:
        self._poll_tiers()

    def has_pending_work(self) -> bool:
        self._poll_tiers()
        # file writes waiting for a retry keep vLLM stepping while they make
        # progress (the queue drains); a tier that refuses them for 200
        # steps in a row no longer does
        return bool(self._promoting or self._fetching or self._answers.in_flight() or self._lent or
                    (self._retry and self._retry_stalls < 200))

    def reset_cache(self) -> None:
        # file and remote reads still landing in host slots must finish
        # before the slots can be handed out again
        while self._promoting and self.file_tier is not None:
            self.file_tier.wait(1000)
            self._poll_file()
        if self._lent and self.file_tier is not None:  # lent slots must not be handed out again
            self.file_tier.flush(-1)
            self._poll_file()
        while (self._fetching or self._answers.in_flight()) and self.remote_tier is not None:
            self.remote_tier.wait(1000)
            self._poll_remote()
        self._answers.clear()
        self._retry_file()
        self._sc["file_lost"] += len(self._retry)
        self._retry.clear()
        old = self.store
        self.store = self._new_store()
        old.close()
        if self._stage is not None:
            self._stage.close()
            self._stage = Store(self.plan, self.staging_bytes)
        self._staged.clear()
        self._names.clear()
        self._pending.clear()

    def stats(self) -> dict[str, Any]:
        """kvoffload's store statistics (and the file tier's); "stores":
        the store path's counters (module doc): offered, rejected (lost:
        no host or staging room), staged, file_queued, file_deferred,
        file_lost, file_refused (quota or I/O), remote_refused,
        read_no_room (a lower tier's chunk found but not read: no host slot
        free for it, a miss), file_lent (zero-copy file writes lent),
        read_wait_lent (lookups answered RETRY: no host slot free while
        slots are lent to file writes), and staged_now / retry_now (in
        flight)."""
        d: dict[str, Any] = {"host": self.store.stats(),
                             "stores": {**self._sc, "staged_now": len(self._staged), "retry_now": len(self._retry)}}
        if self._stage is not None:
            d["staging"] = self._stage.stats()
        if self.file_tier is not None:
            d["file"] = self.file_tier.stats()
        if self.remote_tier is not None:
            d["remote"] = self.remote_tier.stats()
        return d

    def shutdown(self) -> None:
        if self.file_tier is not None:
            for _ in range(100):  # writes waiting for a retry: until the queue takes them
                self._retry_file()
                if not self._retry:
                    break
                try:
                    self.file_tier.flush(100)
                except L.KvoError:
                    pass
            self._sc["file_lost"] += len(self._retry)
            self._retry.clear()
            self.file_tier.flush(-1)
            self.file_tier.close()
            self.file_tier = None
        if self.remote_tier is not None:
            # destroy sends the queued puts (bounded by the I/O timeout) and
            # cancels gets before the arena goes
            self.remote_tier.close()
            self.remote_tier = None
            self._fetching.clear()
            self._answers.cancel()
        self.store.close()
        if self._stage is not None:
            self._stage.close()
            self._stage = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None
