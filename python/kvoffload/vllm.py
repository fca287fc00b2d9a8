"""kvoffload as a vLLM (0.33) offloading backend.

Use with vLLM's OffloadingConnector:

    kv_transfer_config = {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "KvoffloadOffloadingSpec",
            "spec_module_path": "kvoffload.vllm",
            "cpu_bytes_to_use": 8 << 30,        # host tier (slot space)
            "blocks_per_chunk": 4,              # or "block_size" (legacy)
            "eviction_policy": "lru",           # lru | arc | s3fifo
            "kvo_file_root": "/var/cache/kvo",  # optional file tier
            "kvo_file_bytes": 100 << 30,
            "kvo_redis_url": "redis://10.0.0.5:7000,10.0.0.6:7000",  # optional
        }}

Scheduler side: KvoffloadOffloadingManager, an OffloadingManager whose index,
slots and eviction are a kvoffload Store (one C call per batch; lookup, the
one per-key call of vLLM's contract, is one C call per key).  Keys are vLLM's
OffloadKey (block hash + big-endian group index); kvoffload keys take the
first 16 bytes of the hash and the group's position among the offloaded
groups.  Each group gets its own slot size (the C store's segments), so
groups with 12- and 16-token blocks, sliding and full groups share one
capacity without padding each other.

Worker side: KvoffloadOffloadingWorker copies between vLLM's KV tensors and
the slots with kvoffload's transfer engine (host device: CPU tensors; the CUDA
device when the library was built with it).  The slots live in a SharedArena
(kvoffload.shm) named after the engine id, mapped by the scheduler (for the
file tier) and by every worker, so slot offsets handed out by the manager
address the same bytes in all of them.  Each worker writes its own part of a
slot (rank r at r * worker_chunk_bytes), like vLLM's CPU backend.

File tier (optional, kvo_file_root + kvo_file_bytes): the manager writes a
chunk to files when its store completes ("write_through", default) or when
the host tier evicts it ("write_back"); a host miss that the file tier holds
is read back into a host slot (lookup answers HIT_PENDING until it lands).

Remote tier (optional, kvo_redis_url; a Redis Cluster shared by a fleet):
every chunk whose store completes is put to the cluster (write-through; the
put copies the slot at once).  A key that neither the host nor the file tier
holds is asked for with EXISTS: lookup answers RETRY (vLLM keeps scanning
and asks again next step) until the answer lands; then a present key is read
into a host slot (HIT_PENDING until it lands, then HIT) and an absent one is
a MISS.  Answers are remembered for kvo_redis_answer_ttl_ms (default 2000).
Values are verified on every read (a corrupt one is a miss).  Keys are
namespaced by kvo_redis_prefix (default "kvo"), the plan's fingerprint and
a layout hash of the parallel configuration (world size, bytes per block),
so engines whose slots are laid out differently never share a value.
Other keys: kvo_redis_ttl_s (values expire; 0: the server's LRU),
kvo_redis_io_threads.  The password comes from the URL or from
KVO_REDIS_PASSWORD (never from the config, which vLLM logs).
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Optional

import numpy as np

from vllm.v1.kv_offload.base import (CanonicalKVCaches, GPULoadStoreSpec, LoadStoreSpec, LookupResult, Medium,
                                     OffloadingEvent, OffloadingManager, OffloadingSpec, OffloadingWorker,
                                     OffloadKey, PrepareStoreOutput, ReqContext, RequestOffloadingContext,
                                     TransferResult)
from vllm.v1.kv_offload.config import OffloadingConfig

from . import _lib as L
from .core import KEY_DTYPE, LOAD, MISS, PENDING, READY, STORE, FileTier, Model, Plan, RemoteTier, Store, Transfer
from .shm import SharedArena

_HIT, _MISS, _PENDING, _RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING, LookupResult.RETRY
_STATE_TO_RESULT = {READY: _HIT, PENDING: _PENDING}


class KvoffloadLoadStoreSpec(LoadStoreSpec):
    """Where chunks live in the shared arena: offsets[i] (bytes from the
    start of slot space) of chunk i, of group groups[i] (index among the
    offloaded groups), in the order of the keys the manager was given."""

    def __init__(self, offsets: np.ndarray, groups: np.ndarray) -> None:
        self.offsets = np.asarray(offsets, dtype=np.uint64)
        self.groups = np.asarray(groups, dtype=np.uint32)

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"KvoffloadLoadStoreSpec(offsets={self.offsets!r}, groups={self.groups!r})"


# --------------------------------------------------------------- geometry --

def _int(cfg: Any, key: str, default: int) -> int:
    v = cfg.get(key)
    return default if v is None else int(v)


def build_plan(config: OffloadingConfig) -> Plan:
    """The scheduler-side plan: one kvoffload group per offloaded vLLM group
    (in config.groups order), each block sized like vLLM's CPU backend sizes
    a chunk (worker_kv_bytes_per_block * world size, or the per-group list
    kvo_group_bytes_per_block), blocks_per_chunk from vLLM."""
    extra = config.extra_config
    world = max(1, config.parallel.world_size)
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
        if g.sliding_window_size_in_chunks is None:
            model.add_group(f"g{g.group_id}", g.tokens_per_block, 1, page)
        else:
            model.add_group(f"g{g.group_id}", g.tokens_per_block, 1, page, kind="sliding",
                            window=max(1, g.sliding_window_size_in_chunks * tpc))
    return Plan(model, blocks_per_chunk=config.cache.blocks_per_chunk, dtype=config.model.dtype or None)


def layout_hash(config: OffloadingConfig) -> int:
    """A 64-bit hash of how a slot's bytes are laid out beyond the plan's
    fingerprint: the world size (each rank writes its own part of a slot)
    and the bytes per block per rank.  Tiers shared by engines (remote, or
    files with kvo_file_shared) are namespaced by it, so engines with other
    parallel layouts never read each other's values."""
    per_group = config.extra_config.get("kvo_group_bytes_per_block")
    text = repr(("kvo-vllm-slot-layout/1", max(1, config.parallel.world_size), config.worker_kv_bytes_per_block,
                 [int(x) for x in per_group] if per_group else None))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


def arena_name(config: OffloadingConfig) -> str:
    n = config.extra_config.get("kvo_arena_name") or f"{config.engine_id}-dp{config.parallel.data_parallel_index}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(n))[:200]


# ----------------------------------------------------------------- manager --

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
        # vLLM group id (big-endian 4-byte suffix of an OffloadKey) -> the
        # 8 bytes after the hash in a kvo_chunk_key (LE group index, reserved).
        self._suffix = {int(g).to_bytes(4, "big"): i.to_bytes(4, "little") + b"\0\0\0\0"
                        for i, g in enumerate(group_ids)}
        self._st1 = ctypes.c_uint8()
        self._cap = 0
        self._ensure(256)
        self._nev = ctypes.c_size_t()
        self._lookup_fn = L.lib.kvo_store_lookup
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

    def _ensure(self, n: int) -> None:
        """Caller-owned C buffers for batches of n keys, grown on demand."""
        if n <= self._cap:
            return
        cap = max(n, 2 * self._cap)
        self._states = (ctypes.c_uint8 * cap)()
        self._need = (ctypes.c_uint8 * cap)()
        self._slots = (L.Slot * cap)()
        self._ev = (L.ChunkKey * (2 * cap))()
        self._evs = (L.Slot * (2 * cap))()
        self._cap = cap

    # -- key conversion ---------------------------------------------------
    def _ckey(self, key: bytes) -> bytes:
        h = key[:-4]
        if len(h) != 16:
            h = h[:16].ljust(16, b"\0")
        try:
            return h + self._suffix[key[-4:]]
        except KeyError:
            raise L.KvoError(L.KVO_EINVAL, f"OffloadKey of group {int.from_bytes(key[-4:], 'big')}: not an "
                             "offloaded group", "manager") from None

    def _cbytes(self, keys: Sequence[bytes]) -> bytes:
        """The batch as packed kvo_chunk_key records (24 bytes per key): the
        first 16 bytes of each hash and the group's index.  Plain bytes,
        handed to C without a copy."""
        sfx = self._suffix
        try:
            buf = b"".join([x[:16] + sfx[x[-4:]] for x in keys])
        except KeyError:
            buf = b""
        if len(buf) != 24 * len(keys):  # hashes shorter than 16 bytes, or a bad group
            buf = b"".join([self._ckey(x) for x in keys])
        return buf

    def _ckeys(self, keys: Sequence[bytes]) -> np.ndarray:
        return np.frombuffer(self._cbytes(keys), dtype=KEY_DTYPE).copy()

    def _call(self, rc: int, func: str) -> None:
        if rc < 0:
            raise L.KvoError(rc, L.last_error(), func)

    # -- OffloadingManager --------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        try:
            ck = key[:16] + self._suffix[key[-4:]]
        except KeyError:
            ck = self._ckey(key)
        if len(ck) != 24:
            ck = self._ckey(key)
        st = self._st1
        self._call(self._lookup_fn(self.store._h, ck, 1, ctypes.byref(st)), "kvo_store_lookup")
        r = _STATE_TO_RESULT.get(st.value)
        if r is not None:
            return r
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
        n = len(keys)
        if n == 0:
            return 0
        self._ensure(n)
        self._call(L.lib.kvo_store_lookup(self.store._h, self._cbytes(keys), n, self._states), "kvo_store_lookup")
        raw = bytes(self._states)[:n]
        i = raw.find(b"\0")
        j = raw.find(b"\2")
        ends = [x for x in (i, j) if x >= 0]
        return min(ends) if ends else n

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

    def _spec(self, buf: bytes, n: int, idx: Optional[list[int]] = None) -> KvoffloadLoadStoreSpec:
        slots = np.frombuffer(memoryview(self._slots), dtype=np.uint64, count=2 * n)[0::2]
        groups = np.frombuffer(buf, dtype=KEY_DTYPE)["group"]
        if idx is None:
            return KvoffloadLoadStoreSpec(slots.copy(), groups.copy())
        return KvoffloadLoadStoreSpec(slots[idx], groups[idx])

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        n = len(keys)
        if n == 0:
            return KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32))
        self._ensure(n)
        buf = self._cbytes(keys)
        self._call(L.lib.kvo_store_prepare_load(self.store._h, buf, n, self._slots), "kvo_store_prepare_load")
        return self._spec(buf, n)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys:
            keys = list(keys)
            self._call(L.lib.kvo_store_touch(self.store._h, self._cbytes(keys), len(keys)), "kvo_store_touch")

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if keys:
            keys = list(keys)
            self._call(L.lib.kvo_store_complete_load(self.store._h, self._cbytes(keys), len(keys)),
                       "kvo_store_complete_load")

    def _on_evicted(self, ev: Any, evs: Any, m: int) -> list[OffloadKey]:
        if m == 0:
            return []
        raw = ctypes.string_at(ev, 24 * m)
        names = self._names
        out = []
        for i in range(0, 24 * m, 24):
            x = names.pop(raw[i:i + 24], None)
            if x is not None:
                out.append(x)
        if self.file_tier is not None and self.file_mode == "write_back":
            assert self.arena is not None
            offs = np.frombuffer(ctypes.string_at(evs, 16 * m), dtype=np.uint64)[0::2]
            self.file_tier.write(np.frombuffer(raw, dtype=KEY_DTYPE).copy(),
                                 [self.arena.base + int(o) for o in offs])
        return out

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Optional[PrepareStoreOutput]:
        keys = list(keys)
        n = len(keys)
        if n == 0:
            return PrepareStoreOutput([], KvoffloadLoadStoreSpec(np.zeros(0, np.uint64), np.zeros(0, np.uint32)),
                                      [])
        self._ensure(n)
        buf = self._cbytes(keys)
        while True:
            cap = len(self._ev)
            rc = L.lib.kvo_store_prepare_store(self.store._h, buf, n, self._need, self._slots, self._ev, self._evs,
                                               cap, ctypes.byref(self._nev))
            if rc == L.KVO_ERANGE and self._nev.value > cap:
                self._ev = (L.ChunkKey * self._nev.value)()
                self._evs = (L.Slot * self._nev.value)()
                continue
            break
        if rc == L.KVO_ENOSPC:
            return None
        self._call(rc, "kvo_store_prepare_store")
        evicted = self._on_evicted(self._ev, self._evs, self._nev.value)
        need = bytes(self._need)[:n]
        names = self._names
        if need.count(1) == n:
            idx = None
            to_store = keys
            for i in range(n):
                names[buf[24 * i:24 * i + 24]] = keys[i]
        else:
            idx = [i for i in range(n) if need[i]]
            to_store = [keys[i] for i in idx]
            for i in idx:
                names[buf[24 * i:24 * i + 24]] = keys[i]
        spec = self._spec(buf, n, idx)
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
        rc = L.lib.kvo_store_complete_store(self.store._h, buf, len(keys), success)
        if rc == L.KVO_ESTATE:
            keys, buf = self._filter_pending(keys, buf)
            if not keys:
                return
            rc = L.lib.kvo_store_complete_store(self.store._h, buf, len(keys), success)
        self._call(rc, "kvo_store_complete_store")
        recs = [buf[i:i + 24] for i in range(0, len(buf), 24)]
        if not success:
            for r in recs:
                self._names.pop(r, None)
        if self.file_tier is not None or self.remote_tier is not None:
            offs = [self._pending.pop(r, 0) for r in recs]
            if success and self.arena is not None:
                ckeys = np.frombuffer(buf, dtype=KEY_DTYPE).copy()
                srcs = [self.arena.base + o for o in offs]
                if self.file_tier is not None and self.file_mode == "write_through":
                    self.file_tier.write(ckeys, srcs)
                if self.remote_tier is not None:
                    self.remote_tier.put(ckeys, srcs)  # copied before it returns
        if self.events is not None:
            self.events.append(OffloadingEvent(keys=keys, medium=self.medium, removed=not success,
                                               metadata_only=not success))

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


# ------------------------------------------------------------------ worker --

def _cuda_pin(arena: SharedArena, device_index: int) -> int:
    """A kvo_cuda for the device with the arena pinned (CUDA tensors).  Only
    when the library has the CUDA device (kvoffload_cuda) linked in."""
    lib = L.lib
    if not hasattr(lib, "kvo_cuda_create"):
        raise L.KvoError(L.KVO_ENOTSUP, f"{L.LIBRARY_PATH} has no CUDA device (kvoffload_cuda): the KV cache is on "
                         "the GPU; build the library with -DKVO_CUDA=ON", "KvoffloadOffloadingWorker")
    lib.kvo_cuda_default_params.restype = L.CudaParams
    lib.kvo_cuda_create.argtypes = [ctypes.POINTER(L.CudaParams), ctypes.POINTER(ctypes.c_void_p)]
    lib.kvo_cuda_pin_arena.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    p = lib.kvo_cuda_default_params()
    p.device_index = device_index
    cu = ctypes.c_void_p()
    L.check(lib.kvo_cuda_create(ctypes.byref(p), ctypes.byref(cu)), "kvo_cuda_create")
    rc = lib.kvo_cuda_pin_arena(cu, arena._arena._h if arena._arena else None)
    if rc < 0:
        err = L.KvoError(rc, L.last_error(), "kvo_cuda_pin_arena")
        lib.kvo_cuda_destroy.argtypes = [ctypes.c_void_p]
        lib.kvo_cuda_destroy(cu)
        raise err
    return int(cu.value or 0)


class KvoffloadOffloadingWorker(OffloadingWorker):
    """Copies between vLLM's KV tensors and arena slots with kvoffload's
    transfer engine: one engine per offloaded group (vLLM overlays groups on
    shared tensors, which one kvoffload layout cannot describe), each with a
    one-group plan of the real page sizes (vLLM's CanonicalKVCaches)."""

    def __init__(self, spec: "KvoffloadOffloadingSpec", kv_caches: CanonicalKVCaches,
                 arena: SharedArena) -> None:
        cfg = spec.config
        self.arena = arena
        self.bpc = cfg.cache.blocks_per_chunk
        self.rank = cfg.parallel.rank
        threads = int(cfg.extra_config.get("kvo_transfer_threads", 2))
        self.engines: list[Transfer] = []
        self.plans: list[Plan] = []
        self.worker_chunk_bytes: list[int] = []
        device = None
        self._cuda = 0
        for g, refs in enumerate(kv_caches.group_data_refs):
            tens = [kv_caches.tensors[r.tensor_idx].tensor for r in refs]
            if tens and tens[0].device.type != "cpu" and device is None:
                # GPU tensors: the CUDA device of the library (untested here)
                device = tens[0].device.type
                self._cuda = _cuda_pin(arena, tens[0].device.index or 0)
            pages = sum(int(r.page_size_bytes) for r in refs)
            gc = cfg.groups[g]
            model = Model(f"w{g}", cfg.cache.tokens_per_hash,
                          [dict(name=f"g{gc.group_id}", tokens_per_block=gc.tokens_per_block, layers=1,
                                page_bytes=pages)])
            plan = Plan(model, blocks_per_chunk=self.bpc)
            wcb = plan.groups[0]["chunk_bytes"]
            slot = spec.plan.groups[g]["chunk_bytes"]
            if (self.rank + 1) * wcb > slot:
                raise L.KvoError(L.KVO_ELAYOUT, f"group {gc.group_id}: worker chunk of {wcb} bytes (rank "
                                 f"{self.rank}) does not fit the scheduler's {slot}-byte chunk; set "
                                 f"kvo_group_bytes_per_block >= {pages * cfg.parallel.world_size}", "worker")
            t = Transfer(plan, threads=threads, device=device)
            segs = []
            for r, ten in zip(refs, tens):
                segs.append(dict(group=0, base=ten.data_ptr(), num_blocks=int(ten.shape[0]),
                                 block_stride=int(ten.stride(0) * ten.element_size()),
                                 page_bytes=int(r.page_size_bytes)))
            t.set_layout(segs)
            self.engines.append(t)
            self.plans.append(plan)
            self.worker_chunk_bytes.append(wcb)
        self._jobs: dict[int, list[tuple[int, int]]] = {}   # vLLM job -> [(engine, kvo job)]
        self._left: dict[int, int] = {}
        self._ok: dict[int, bool] = {}
        self._bytes: dict[int, int] = {}
        self._done: list[TransferResult] = []

    def _submit(self, job_id: int, direction: int, gpu: GPULoadStoreSpec, slots: KvoffloadLoadStoreSpec) -> bool:
        blocks = np.asarray(gpu.block_ids, dtype=np.uint64)
        subs: list[tuple[int, int]] = []
        b0 = c0 = 0
        try:
            for g, (size, bidx) in enumerate(zip(gpu.group_sizes, gpu.block_indices)):
                if size == 0:
                    continue
                skip = int(bidx) % self.bpc
                nchunks = -(-(size + skip) // self.bpc)
                ops = []
                wcb = self.worker_chunk_bytes[g]
                for c in range(nchunks):
                    first = skip if c == 0 else 0
                    lo = max(0, c * self.bpc - skip)
                    hi = min(size, (c + 1) * self.bpc - skip)
                    off = int(slots.offsets[c0 + c]) + self.rank * wcb
                    ops.append(dict(group=0, first_block=first, engine_blocks=blocks[b0 + lo:b0 + hi],
                                    slot=self.arena.base + off, slot_bytes=wcb))
                subs.append((g, self.engines[g].submit(direction, ops)))
                b0 += size
                c0 += nchunks
        except L.KvoError:
            for g, j in subs:
                self.engines[g].wait([j])
            return False
        self._jobs[job_id] = subs
        self._left[job_id] = len(subs)
        self._ok[job_id] = True
        self._bytes[job_id] = 0
        if not subs:
            self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=0))
            del self._jobs[job_id]
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KvoffloadLoadStoreSpec)
        return self._submit(job_id, STORE, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        assert isinstance(src_spec, KvoffloadLoadStoreSpec)
        return self._submit(job_id, LOAD, dst_spec, src_spec)

    def get_finished(self) -> list[TransferResult]:
        owner = {(g, j): job for job, subs in self._jobs.items() for g, j in subs}
        for g, t in enumerate(self.engines):
            for r in t.poll():
                job = owner.get((g, r["job_id"]))
                if job is None:
                    continue
                self._left[job] -= 1
                self._ok[job] &= r["status"] == 0
                self._bytes[job] += r["bytes"]
                if self._left[job] == 0:
                    self._done.append(TransferResult(job_id=job, success=self._ok.pop(job),
                                                     transfer_size=self._bytes.pop(job)))
                    del self._left[job], self._jobs[job]
        out, self._done = self._done, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        for job in job_ids:
            for g, j in self._jobs.get(job, []):
                self.engines[g].wait([j])

    def shutdown(self) -> None:
        for t in self.engines:
            t.close()
        self.engines = []
        if self._cuda:
            L.lib.kvo_cuda_unpin_arena.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            L.lib.kvo_cuda_destroy.argtypes = [ctypes.c_void_p]
            L.lib.kvo_cuda_unpin_arena(self._cuda, self.arena._arena._h if self.arena._arena else None)
            L.lib.kvo_cuda_destroy(self._cuda)
            self._cuda = 0
        self.arena.close()


# -------------------------------------------------------------------- spec --

class KvoffloadOffloadingSpec(OffloadingSpec):
    """vLLM OffloadingSpec backed by kvoffload (see module doc for the
    kv_connector_extra_config keys)."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra = self.extra_config
        self.capacity_bytes = _int(extra, "cpu_bytes_to_use", 0)
        if self.capacity_bytes <= 0:
            raise L.KvoError(L.KVO_EINVAL, "kvoffload spec: cpu_bytes_to_use must be given in "
                             "kv_connector_extra_config (bytes of host slot space)", "KvoffloadOffloadingSpec")
        self.plan = build_plan(config)
        self.policy = str(extra.get("eviction_policy", "lru"))
        self.arena_name = arena_name(config)
        # every worker maps the arena, and the scheduler unless told not to
        # (kvo_scheduler_maps_arena false: no file tier then); the last of
        # them to attach removes the name
        self.scheduler_maps_arena = bool(extra.get("kvo_scheduler_maps_arena", True))
        self.arena_expected = _int(extra, "kvo_arena_processes",
                                   max(1, config.parallel.world_size) + int(self.scheduler_maps_arena))
        self._manager: Optional[KvoffloadOffloadingManager] = None
        self._worker: Optional[KvoffloadOffloadingWorker] = None

    def _arena(self) -> SharedArena:
        return SharedArena(self.arena_name, self.capacity_bytes, self.plan.fingerprint,
                           expected=self.arena_expected,
                           directory=str(self.extra_config.get("kvo_shm_dir", "/dev/shm")))

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            extra = self.extra_config
            arena = None
            if self.scheduler_maps_arena:
                arena = self._arena()
            file_tier = None
            root = extra.get("kvo_file_root")
            shared = bool(extra.get("kvo_file_shared", False))
            if root:
                file_tier = FileTier(str(root), self.plan, _int(extra, "kvo_file_bytes", 0),
                                     policy=self.policy, shared=shared,
                                     layout_hash=layout_hash(self.config) if shared else 0)
            remote_tier = None
            url = extra.get("kvo_redis_url")
            if url:
                if not self.scheduler_maps_arena:
                    raise L.KvoError(L.KVO_EINVAL, "kvo_redis_url needs the scheduler to map the arena "
                                     "(kvo_scheduler_maps_arena true)", "KvoffloadOffloadingSpec")
                try:
                    remote_tier = RemoteTier(str(url), self.plan,
                                             key_prefix=str(extra.get("kvo_redis_prefix", "kvo")),
                                             layout_hash=layout_hash(self.config),
                                             ttl_s=_int(extra, "kvo_redis_ttl_s", 0),
                                             io_threads=_int(extra, "kvo_redis_io_threads", 0))
                except BaseException:
                    if file_tier is not None:
                        file_tier.close()
                    if arena is not None:
                        arena.close()
                    raise
            self._manager = KvoffloadOffloadingManager(
                self.plan, self.capacity_bytes, [g.group_id for g in self.config.groups], policy=self.policy,
                enable_events=self.kv_events_config.enable_kv_cache_events, arena=arena, file_tier=file_tier,
                file_mode=str(extra.get("kvo_file_mode", "write_through")),
                store_threshold=_int(extra, "store_threshold", 0), remote_tier=remote_tier,
                remote_answer_ttl_ms=_int(extra, "kvo_redis_answer_ttl_ms", 2000))
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            arena = self._arena()
            try:
                self._worker = KvoffloadOffloadingWorker(self, kv_caches, arena)
            except BaseException:
                arena.close()
                raise
        return self._worker
