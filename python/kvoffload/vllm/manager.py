"""Scheduler side: KvoffloadOffloadingManager, vLLM's OffloadingManager over
a kvoffload Store (host tier) and the optional file and remote tiers (see
the package doc, kvoffload/vllm/__init__.py, for the tiers' behaviour)."""
from __future__ import annotations

import ctypes
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

from vllm.v1.kv_offload.base import (LoadStoreSpec, LookupResult, Medium, OffloadingEvent, OffloadingManager,
                                     OffloadKey, PrepareStoreOutput, ReqContext, RequestOffloadingContext)

from .. import _lib as L

try:
    from .._hot import Hot
except ImportError as e:  # a checkout used without building the package
    raise ImportError("kvoffload._hot (the vLLM manager's compiled hot calls, python/kvoffload/_hot.c) is not "
                      "built: pip install ./python, or in a checkout `cd python && python setup.py build_ext "
                      "--inplace` (needs a C compiler and the Python headers, Debian's python3-dev); "
                      f"import error: {e}") from e
from ..core import KEY_DTYPE, PENDING, READY, FileTier, Plan, RemoteTier, Store
from ..shm import SharedArena
from .compat import failed_store_event
from .config import KvoffloadLoadStoreSpec

_HIT, _MISS, _PENDING, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.RETRY
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
                 remote_answer_ttl_ms: int = 2000) -> None:
        self.plan = plan
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.store_threshold = store_threshold
        self.store = self._new_store()
        self.medium = Medium.CPU
        self.events: Optional[list[OffloadingEvent]] = [] if enable_events else None
        self.arena = arena
        self.file_tier = file_tier
        if file_tier is not None and arena is None:
            raise L.KvoError(L.KVO_EINVAL, "a file tier needs the shared arena (the chunk bytes)", "manager")
        self.remote_tier = remote_tier
        if remote_tier is not None and arena is None:
            raise L.KvoError(L.KVO_EINVAL, "a remote tier needs the shared arena (the chunk bytes)", "manager")
        self.remote_answer_ttl_s = max(0, remote_answer_ttl_ms) / 1000.0
        if file_mode not in ("write_through", "write_back"):
            raise L.KvoError(L.KVO_EINVAL, f"kvo_file_mode '{file_mode}': use write_through or write_back",
                             "manager")
        self.file_mode = file_mode
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
        self._asking: dict[int, bytes] = {}                         # remote EXISTS in flight
        self._asked: set[bytes] = set()                             # ... their keys
        # remote answers: kvo key bytes -> (present, expiry); oldest first,
        # bounded (an entry is only a hint: a wrong one costs a RETRY or a miss)
        self._answers: OrderedDict[bytes, tuple[bool, float]] = OrderedDict()
        self._answers_max = 1 << 16
        self._next_ud = 1

    def _new_store(self) -> Store:
        return Store(self.plan, self.capacity_bytes, policy=self.policy, admit_after=self.store_threshold)

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
        return RequestOffloadingContext()

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
        if self._asking or self._fetching:
            self._poll_remote()
        now = time.monotonic()
        ans = self._answers.get(ck)
        if ans is not None and ans[1] < now:
            del self._answers[ck]
            ans = None
        if ans is None:
            if ck in self._asked:
                return _RETRY
            ud = self._next_ud
            self._next_ud += 1
            if rt.exists(np.frombuffer(ck, dtype=KEY_DTYPE).copy(), [ud])[0] != 0:  # too many in flight
                return _MISS
            self._asking[ud] = ck
            self._asked.add(ck)
            return _RETRY
        if not ans[0]:
            return _MISS
        r = self._read_into_host(ck, key, rt.get, self._fetching)
        if r is _PENDING:
            self._answers.pop(ck, None)  # the read's outcome decides from here
        return r

    def _remember(self, ck: bytes, present: bool) -> None:
        a = self._answers
        a[ck] = (present, time.monotonic() + self.remote_answer_ttl_s)
        a.move_to_end(ck)
        while len(a) > self._answers_max:
            a.popitem(last=False)

    def _poll_remote(self) -> None:
        if self.remote_tier is None or not (self._asking or self._fetching):
            return
        for c in self.remote_tier.poll():
            ud = c["user_data"]
            if c["op"] == L.REMOTE_OP_EXISTS:
                ck = self._asking.pop(ud, None)
                if ck is not None:
                    self._asked.discard(ck)
                    self._remember(ck, c["result"] == 0)
                continue
            item = self._fetching.pop(ud, None) if c["op"] == L.REMOTE_OP_GET else None
            if item is None:
                continue
            ck, _key = item
            ok = c["result"] == 0
            self.store.complete_store(np.frombuffer(ck, dtype=KEY_DTYPE).copy(), ok=ok)
            if not ok:
                self._names.pop(ck, None)
                self._remember(ck, False)

    def _poll_tiers(self) -> None:
        self._poll_file()
        self._poll_remote()

    def _poll_file(self) -> None:
        if self.file_tier is None or not self._promoting:
            return
        for c in self.file_tier.poll():
            item = self._promoting.pop(c["user_data"], None)
            if item is None:
                continue
            ck, key = item
            keys = np.frombuffer(ck, dtype=KEY_DTYPE).copy()
            self.store.complete_store(keys, ok=c["result"] == 0)
            if c["result"] != 0:
                self._names.pop(ck, None)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        offsets, groups = self._hot.prepare_load(self.store._h, keys)  # writable bytearrays, key order
        return KvoffloadLoadStoreSpec(np.frombuffer(offsets, np.uint64), np.frombuffer(groups, np.uint32))

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
        self._write_back(ctypes.string_at(ev, 24 * m), np.frombuffer(ctypes.string_at(evs, 16 * m), np.uint64)[0::2])
        return out

    def _write_back(self, records: bytes, offsets: Any) -> None:
        """With a write-back file tier: write the evicted records (bytes, 24
        each) from their old slots (offsets) before the slots are reused."""
        if records and self.file_tier is not None and self.file_mode == "write_back":
            assert self.arena is not None
            self.file_tier.write(np.frombuffer(records, dtype=KEY_DTYPE).copy(),
                                 [self.arena.base + int(o) for o in offsets])

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        n = len(keys)
        if n == 0:
            return PrepareStoreOutput([], KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32)),
                                      [])
        # one C call (kvoffload._hot): pack the keys, kvo_store_prepare_store
        # (the evicted buffer grown on KVO_ERANGE), the names of the keys to
        # store recorded and of the evicted ones dropped; None: KVO_ENOSPC
        r = self._hot.prepare_store(self.store._h, keys, self._names)
        if r is None:
            return None
        buf, to_store, idx, offsets, groups, evicted, ev_recs, ev_offs = r
        self._write_back(ev_recs, np.frombuffer(ev_offs, np.uint64))
        spec = KvoffloadLoadStoreSpec(np.frombuffer(offsets, np.uint64), np.frombuffer(groups, np.uint32))
        if self.file_tier is not None or self.remote_tier is not None:
            for j, i in enumerate(range(n) if idx is None else idx):
                self._pending[buf[24 * i:24 * i + 24]] = int(spec.offsets[j])
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(keys=evicted, medium=self.medium, removed=True))
        return PrepareStoreOutput(keys_to_store=to_store, store_spec=spec, evicted_keys=evicted)

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
        keys = list(keys)
        if not keys:
            return
        buf = self._cbytes(keys)
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
                ckeys = np.frombuffer(buf, dtype=KEY_DTYPE).copy()
                srcs = [self.arena.base + o for o in offs]
                if self.file_tier is not None and self.file_mode == "write_through":
                    self.file_tier.write(ckeys, srcs)
                if self.remote_tier is not None:
                    self.remote_tier.put(ckeys, srcs)  # copied before it returns
                    # an "absent" answer remembered for these keys is stale
                    # now: a lookup before the answer expired would miss
                    for r in recs:
                        if r in self._answers:
                            self._remember(r, True)
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
        return bool(self._promoting or self._fetching or self._asking)

    def reset_cache(self) -> None:
        # file and remote reads still landing in host slots must finish
        # before the slots can be handed out again
        while self._promoting and self.file_tier is not None:
            self.file_tier.wait(1000)
            self._poll_file()
        while (self._fetching or self._asking) and self.remote_tier is not None:
            self.remote_tier.wait(1000)
            self._poll_remote()
        self._answers.clear()
        old = self.store
        self.store = self._new_store()
        old.close()
        self._names.clear()
        self._pending.clear()

    def stats(self) -> dict[str, Any]:
        """kvoffload's store statistics (and the file tier's)."""
        d = {"host": self.store.stats()}
        if self.file_tier is not None:
            d["file"] = self.file_tier.stats()
        if self.remote_tier is not None:
            d["remote"] = self.remote_tier.stats()
        return d

    def shutdown(self) -> None:
        if self.file_tier is not None:
            self.file_tier.flush(-1)
            self.file_tier.close()
            self.file_tier = None
        if self.remote_tier is not None:
            # destroy sends the queued puts (bounded by the I/O timeout) and
            # cancels gets before the arena goes
            self.remote_tier.close()
            self.remote_tier = None
            self._fetching.clear()
            self._asking.clear()
            self._asked.clear()
        self.store.close()
        if self.arena is not None:
            self.arena.close()
            self.arena = None
