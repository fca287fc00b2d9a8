"""kvoffload as a storage back end (L3) of SGLang's HiCache (sglang 0.5.23).

Configuration (SGLang's dynamic back end):

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvoffload",
        "module_path": "kvoffload.sglang", "class_name": "KvoffloadHiCacheStorage",
        "interface_v1": 1, "kvo_file_root": "/var/cache/kvoffload", "kvo_file_bytes": 500e9,
        "kvo_redis_url": "redis://10.0.0.5:7000"}'

How a page is stored.  One SGLang host page of one pool (KV, MLA KV, SWA,
Mamba state, indexer, draft ...) is one value: one chunk of a one-group
kvoffload plan, one file of the file tier, one key of the Redis Cluster.
Each registered pool gets its own tiers (its own plan, so its own value
size).  Two byte formats:

 - "segments" (v1 and v2 calls): the pool's get_page_buffer_meta() names,
   for every page, the memory regions that hold it (per layer K and V for
   layer_first, one K and one V run for page_first ...).  They become
   kvoffload transfer-engine segments (base, stride between pages, bytes),
   and the transfer engine gathers a page into a staging slot (and scatters
   it back) with its multi-threaded streaming copies: no per-page Python.
 - "flat" (the base get/set calls, and pools whose regions are not affine in
   the page index): SGLang's own flat data page (get_data_page /
   set_from_flat_data_page).

Tiers and namespaces.  Each pool's pages go through one kvoffload Cascade
with no host tier (host_bytes 0: SGLang's host pool is the host tier) over
the file tier and the Redis Cluster tier; the cascade owns the way through
them (the file tier first, the cluster for what the files lack, a page the
cluster served kept in the files too, back-pressure waited out).  A page's
key is kvo_namespace_keys of SGLang's page key under the pool's namespace
(kvoffload.cascade.namespace_id): the model identity as configured, whole;
the pool's class and name, host layout, dtype, page size, byte format and
region sizes; the TP rank only where the pool is sharded (MHA KV and Mamba
state are; MLA KV is replicated across TP ranks: one namespace for all of
them, as SGLang's own file back end shares it), and PP, attention-CP and DCP
ranks; and SGLang's per-request extra key (a tenant's salt) as the tenant
where SGLang gives one.  The files' directory and the cluster's key prefix
are named after the same namespace without ranks and tenants, so the ranks
of one engine share one directory (opened shared: every rank sees the pages
the others write) and one quota.  Every read is verified by the tiers
(checksums, key, namespace): a page is byte-exact or a miss.

Extra config keys: kvo_file_root, kvo_file_bytes (per pool, default 64 GiB),
kvo_redis_url (or KVO_REDIS_URL; password in the URL or KVO_REDIS_PASSWORD),
kvo_redis_prefix (default "kvo"), kvo_redis_ttl_s, kvo_io_threads,
kvo_transfer_threads (default 2), kvo_staging_bytes (per pool and direction,
default 256 MiB), kvo_timeout_s (default 30), interface_v1 (SGLang's own: the
zero-copy v1 calls for the KV pool), kvo_kv_format ("segments" or "flat"; by
default segments with interface_v1, else flat), tenant_file_bytes ({label:
bytes}, per pool: a file tier of a tenant's own under
kvo_file_root/tenants/<label>, its quota; docs/security.md "Tenants").
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Any, List, Optional

import numpy as np
import torch

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo,
                                                  PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult)

from . import _lib as L
from .cascade import Cascade, TenantKeys, engine_cascade, layout_of, namespace_id, tenant_file_configs, value_plan
from .core import LOAD, STORE, Arena, Transfer, warn_if_url_has_password
from .tenants import TenantCounters

logger = logging.getLogger(__name__)

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
FORMAT_VERSION = 1


def _region_segments(pool: Any) -> Optional[list[dict[str, int]]]:
    """Transfer segments of a host pool's pages (block = host page), from
    get_page_buffer_meta: region r of page p is at base_r + p * stride_r.
    None when the pool has no such meta or its regions are not affine in
    the page index (then the flat format is used)."""
    meta = getattr(pool, "get_page_buffer_meta", None)
    ps, n = pool.page_size, pool.page_num
    if meta is None or n < 2:
        return None
    try:
        p0, s0 = meta(torch.arange(0, ps, dtype=torch.int64))
        p1, s1 = meta(torch.arange(ps, 2 * ps, dtype=torch.int64))
        pl, sl = meta(torch.arange((n - 1) * ps, n * ps, dtype=torch.int64))
    except (NotImplementedError, ValueError, AssertionError, AttributeError) as e:
        logger.info("kvoffload: pool %s has no zero-copy page regions (%s): flat pages", type(pool).__name__, e)
        return None
    if not p0 or len(p0) != len(p1) or len(p0) != len(pl) or list(s0) != list(s1) or list(s0) != list(sl):
        return None
    segs = []
    for b0, b1, bl, sz in zip(p0, p1, pl, s0):
        stride = int(b1) - int(b0)
        if stride < int(sz) or int(bl) != int(b0) + (n - 1) * stride:
            return None
        segs.append(dict(group=0, base=int(b0), num_blocks=n, block_stride=stride, page_bytes=int(sz)))
    return segs


# Per tenant (kvoffload.tenants): prefix lookups (batch_exists) with the pages
# asked and found, and the KV pool's pages asked for and loaded, offered and
# stored.
TENANT_FIELDS = ("lookups", "lookup_pages", "hit_pages", "get_pages", "loaded_pages", "set_pages", "stored_pages")


def _tenant(extra_info: Optional[HiCacheStorageExtraInfo]) -> Optional[str]:
    """A request's tenant where SGLang gives one: extra_info.extra_info's
    "extra_key" (SGLang's per-request namespace tag) or "cache_salt"."""
    d = getattr(extra_info, "extra_info", None)
    if not isinstance(d, dict):
        return None
    v = d.get("extra_key", d.get("cache_salt"))
    return None if v is None else str(v)


def _torch_bytes(addr: int, n: int) -> torch.Tensor:
    """A uint8 tensor over n bytes at addr (no copy; valid while the memory is)."""
    return torch.frombuffer((ctypes.c_uint8 * n).from_address(addr), dtype=torch.uint8)


class _PoolStore:
    """One host pool's pages in kvoffload's tiers: a plan, its namespaces, a
    Cascade over the tiers, staging slots and (segments format) a transfer
    engine over the pool's memory."""

    def __init__(self, owner: "KvoffloadHiCacheStorage", name: str, pool: Any, fmt: str) -> None:
        layout = getattr(pool, "layout", None)
        if layout not in LAYOUTS:
            raise ValueError(f"kvoffload.sglang: pool '{name}' ({type(pool).__name__}) has host layout "
                             f"{layout!r}; kvoffload stores {', '.join(LAYOUTS)} (set --hicache-mem-layout)")
        self.name, self.pool, self.page_size = name, pool, int(pool.page_size)
        self.segments = _region_segments(pool) if fmt == "segments" else None
        self.fmt = "segments" if self.segments else "flat"
        if self.fmt == "flat":
            dummy = pool.get_dummy_flat_data_page()
            self.flat_dtype, self.flat_numel = dummy.dtype, dummy.numel()
            value_bytes = dummy.numel() * dummy.element_size()
            regions: Any = value_bytes
        else:
            value_bytes = sum(s["page_bytes"] for s in self.segments)
            regions = [s["page_bytes"] for s in self.segments]
        self.value_bytes = value_bytes
        self.plan = value_plan("sglang", value_bytes, self.page_size)
        cfg = owner.storage_config
        # what decides a page's bytes (the model identity whole, in the
        # namespace's model field); ranks and tenants only in the keys'
        self._desc = dict(engine="sglang", model=owner.model_name, dtype=str(getattr(pool, "dtype", "")),
                          kv_layout=str(layout))
        self._pool_desc = (FORMAT_VERSION, type(pool).__name__, name, self.fmt, regions, self.page_size)
        sharded = name == PoolName.MAMBA or not cfg.is_mla_model
        self._ranks = ((cfg.tp_rank, cfg.tp_size) if sharded else None, cfg.pp_rank, cfg.pp_size, cfg.attn_cp_rank,
                       cfg.attn_cp_size, cfg.dcp_rank, cfg.dcp_size, cfg.logical_page_size)
        layout_ns = layout_of(namespace_id(self.plan, extra=repr(self._pool_desc), **self._desc))
        ex = owner.extra
        io_threads = int(ex.get("kvo_io_threads", 0))
        self.timeout_ms = float(ex.get("kvo_timeout_s", 30.0)) * 1000
        self.cascade: Optional[Cascade] = None
        self.transfer: Optional[Transfer] = None
        self._stage: dict[int, tuple[Arena, threading.Lock]] = {}
        try:
            # the file tier shared: the ranks (processes) of one engine write its directory at once
            file = dict(root=owner.file_root, quota_bytes=owner.file_bytes, io_threads=io_threads, shared=True,
                        layout_hash=layout_ns) if owner.file_root else None
            self.cascade = engine_cascade(
                self.plan, file=file, tenant_files=tenant_file_configs(file, ex.get("tenant_file_bytes")),
                remote=dict(url=owner.redis_url, key_prefix=ex.get("kvo_redis_prefix", "kvo"), layout_hash=layout_ns,
                            io_threads=io_threads, ttl_s=int(ex.get("kvo_redis_ttl_s", 0))) if owner.redis_url else None)
            # ranks and tenants in the keys' namespace, never in the tiers' layout
            self._keys = TenantKeys(self.cascade, self.plan, extra=repr((self._pool_desc, self._ranks)), **self._desc)
            slot = self.plan.groups[0]["slot_bytes"]   # a read fills a whole slot
            self.batch = max(1, min(128, int(ex.get("kvo_staging_bytes", 256 << 20)) // slot))
            # one staging area per direction: SGLang reads (prefetch) and writes (backup) on two threads
            self._stage = {d: (Arena(self.batch * slot, prefault=False), threading.Lock()) for d in (LOAD, STORE)}
            if self.fmt == "segments":
                self.transfer = Transfer(self.plan, threads=int(ex.get("kvo_transfer_threads", 2)))
                self.transfer.set_layout(self.segments)
        except BaseException:
            self.close()
            raise
        self._xfer_lock = threading.Lock()

    # -- helpers
    def keys(self, keys: List[str], tenant: Optional[str] = None) -> np.ndarray:
        """The chunk keys of SGLang's page keys (of one tenant; tagged with
        its file part, tenant_file_bytes)."""
        return self._keys(tenant, keys)

    def _pages(self, host_indices: torch.Tensor, n: int) -> Optional[list[int]]:
        """Host page numbers of n pages from SGLang's token indices (page i
        starts at host_indices[i * page_size]); None when misaligned."""
        idx = host_indices.reshape(-1)
        if idx.numel() != n * self.page_size:
            logger.error("kvoffload.sglang: pool %s: %d host indices for %d pages of %d tokens", self.name,
                         idx.numel(), n, self.page_size)
            return None
        first = idx[:: self.page_size].to(torch.int64).cpu()
        if bool((first % self.page_size).any()):
            logger.error("kvoffload.sglang: pool %s: host indices are not page aligned", self.name)
            return None
        return (first // self.page_size).tolist()

    def _copy(self, direction: int, pages: list[int], base: int, which: list[int]) -> bool:
        """Transfer engine or flat copies between host pages and staging slots."""
        slot = self.plan.groups[0]["slot_bytes"]
        if self.transfer is not None:
            ops = [dict(group=0, engine_blocks=[pages[i]], slot=base + j * slot, slot_bytes=slot)
                   for j, i in enumerate(which)]
            return self._run(direction, ops)
        for j, i in enumerate(which):
            buf = _torch_bytes(base + j * slot, self.value_bytes)
            index = pages[i] * self.page_size
            if direction == STORE:
                page = self.pool.get_data_page(index, flat=True)
                buf.copy_(page.contiguous().view(torch.uint8).reshape(-1))
            else:
                self.pool.set_from_flat_data_page(index, buf.view(self.flat_dtype)[: self.flat_numel])
        return True

    def _run(self, direction: int, ops: list[dict[str, Any]]) -> bool:
        """One transfer job, waited for; True when it copied everything.  Under
        a lock: the reading and the writing thread share the engine's results."""
        assert self.transfer is not None
        with self._xfer_lock:
            job = self.transfer.submit(direction, ops)
            self.transfer.wait([job])
            res = [r for r in self.transfer.poll() if r["job_id"] == job]
        return len(res) == 1 and res[0]["status"] == 0

    def _write(self, kk: np.ndarray, srcs: list[int]) -> np.ndarray:
        """bool per key: some tier took the value (queued, or held already);
        back-pressure is waited out up to kvo_timeout_s, so the engine's
        writer thread carries it instead of losing pages."""
        assert self.cascade is not None
        r = self.cascade.write(kk, srcs, timeout_ms=self.timeout_ms)
        return (r == 0) | (r == L.KVO_EEXIST)

    def _read(self, kk: np.ndarray, dsts: list[int]) -> np.ndarray:
        """bool per key: dsts[i] holds the verified value."""
        assert self.cascade is not None
        return self.cascade.read_wait(kk, dsts, timeout_ms=self.timeout_ms) == 0

    # -- host pages <-> tiers
    def set_pages(self, keys: List[str], host_indices: torch.Tensor, tenant: Optional[str] = None) -> List[bool]:
        pages = self._pages(host_indices, len(keys))
        if pages is None:
            return [False] * len(keys)
        kk = self.keys(keys, tenant)
        out = np.zeros(len(keys), dtype=bool)
        arena, lock = self._stage[STORE]
        slot = self.plan.groups[0]["slot_bytes"]
        with lock:
            for s in range(0, len(keys), self.batch):
                which = list(range(s, min(s + self.batch, len(keys))))
                if not self._copy(STORE, pages, arena.base, which):
                    continue
                out[s: s + len(which)] = self._write(kk[s: s + len(which)],
                                                     [arena.base + j * slot for j in range(len(which))])
        return out.tolist()

    def get_pages(self, keys: List[str], host_indices: torch.Tensor, tenant: Optional[str] = None) -> List[bool]:
        pages = self._pages(host_indices, len(keys))
        if pages is None:
            return [False] * len(keys)
        kk = self.keys(keys, tenant)
        out = np.zeros(len(keys), dtype=bool)
        arena, lock = self._stage[LOAD]
        slot = self.plan.groups[0]["slot_bytes"]
        with lock:
            for s in range(0, len(keys), self.batch):
                m = min(self.batch, len(keys) - s)
                ok = self._read(kk[s: s + m], [arena.base + j * slot for j in range(m)])
                # only verified pages reach the host pool; the copy of a batch is one job
                hit = [j for j in range(m) if ok[j]]
                if hit:
                    # staging slot j holds page s + j: compact the hits' slots into the job's order
                    if self.transfer is not None:
                        ops = [dict(group=0, engine_blocks=[pages[s + j]], slot=arena.base + j * slot,
                                    slot_bytes=slot) for j in hit]
                        if not self._run(LOAD, ops):
                            continue
                    else:
                        for j in hit:
                            buf = _torch_bytes(arena.base + j * slot, self.value_bytes)
                            self.pool.set_from_flat_data_page(pages[s + j] * self.page_size,
                                                              buf.view(self.flat_dtype)[: self.flat_numel])
                    out[[s + j for j in hit]] = True
        return out.tolist()

    def set_values(self, keys: List[str], values: List[torch.Tensor], tenant: Optional[str] = None) -> List[bool]:
        """The base API: flat data pages given as tensors."""
        kk = self.keys(keys, tenant)
        idx, srcs, keep = [], [], []
        for i, v in enumerate(values):
            if v is None or v.numel() * v.element_size() != self.value_bytes:
                continue
            t = v.contiguous().view(torch.uint8).reshape(-1).cpu()
            keep.append(t)   # alive until the write copied it
            idx.append(i)
            srcs.append(t.data_ptr())
        out = np.zeros(len(keys), dtype=bool)
        if idx:
            out[idx] = self._write(kk[idx], srcs)
        return out.tolist()

    def get_values(self, keys: List[str], targets: List[Optional[torch.Tensor]],
                   tenant: Optional[str] = None) -> List[Optional[torch.Tensor]]:
        kk = self.keys(keys, tenant)
        arena, lock = self._stage[LOAD]
        slot = self.plan.groups[0]["slot_bytes"]
        out: List[Optional[torch.Tensor]] = []
        with lock:
            for s in range(0, len(keys), self.batch):
                m = min(self.batch, len(keys) - s)
                ok = self._read(kk[s: s + m], [arena.base + j * slot for j in range(m)])
                for j in range(m):
                    t = targets[s + j] if targets else None
                    if not ok[j]:
                        out.append(None)
                        continue
                    buf = _torch_bytes(arena.base + j * slot, self.value_bytes)
                    if t is None:
                        t = buf.clone().view(self.flat_dtype)
                    elif t.numel() * t.element_size() != self.value_bytes:
                        out.append(None)
                        continue
                    else:
                        t.view(torch.uint8).reshape(-1).copy_(buf)
                    out.append(t)
        return out

    def exists(self, keys: List[str], tenant: Optional[str] = None, prefix: bool = False) -> np.ndarray:
        """bool per key: a read would find the page (prefix: the keys are one
        chain; the ones after the first absent page are False)."""
        assert self.cascade is not None
        return self.cascade.held(self.keys(keys, tenant), prefix=prefix, wait_ms=self.timeout_ms)

    def flush(self, timeout_s: float) -> None:
        if self.cascade is not None:
            self.cascade.flush(timeout_s * 1000)

    def stats(self) -> dict[str, Any]:
        c = self.cascade
        if c is None:
            return {}
        out: dict[str, Any] = {"cascade": c.stats()}
        for name, t in (("file", c.file_tier), ("remote", c.remote_tier)):
            if t is not None:
                out[name] = t.stats()
        return out

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.close()
            self.transfer = None
        if self.cascade is not None:
            self.cascade.close(self.timeout_ms)
            self.cascade = None
        for arena, _ in self._stage.values():
            arena.close()
        self._stage = {}


class KvoffloadHiCacheStorage(HiCacheStorage):
    """HiCache storage back end over kvoffload's file tier and Redis Cluster
    tier.  Built by SGLang's StorageBackendFactory as cls(storage_config,
    kwargs); see the module docstring for the configuration."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        self.storage_config = storage_config
        ex = dict(storage_config.extra_config or {})
        self.extra = ex
        self.model_name = str(storage_config.model_name or "")   # whole: the namespace holds it
        self.file_root = ex.get("kvo_file_root")
        self.file_bytes = int(float(ex.get("kvo_file_bytes", 64 << 30)))
        self.redis_url = ex.get("kvo_redis_url") or os.environ.get("KVO_REDIS_URL")
        if ex.get("kvo_redis_url"):  # SGLang logs its server args, extra config included
            warn_if_url_has_password(str(ex["kvo_redis_url"]), "kvo_redis_url")
        if not self.file_root and not self.redis_url:
            raise ValueError("kvoffload.sglang: set kvo_file_root (a directory) and/or kvo_redis_url "
                             "(redis://host:port[,host:port]) in --hicache-storage-backend-extra-config")
        fmt = ex.get("kvo_kv_format") or ("segments" if ex.get("interface_v1") else "flat")
        if fmt not in ("segments", "flat"):
            raise ValueError(f"kvoffload.sglang: kvo_kv_format {fmt!r} is not 'segments' or 'flat'")
        self.kv_format = fmt
        self.stores: dict[str, _PoolStore] = {}
        self._lock = threading.Lock()
        self.tenants = TenantCounters(TENANT_FIELDS)
        mem_pool_host = (kwargs or {}).get("mem_pool_host") if isinstance(kwargs, dict) else None
        if mem_pool_host is not None:
            self.register_mem_pool_host(mem_pool_host)

    # -- registration
    def _store_for(self, pool: Any, name: str, fmt: str) -> _PoolStore:
        with self._lock:
            st = self.stores.get(name)
            if st is None or st.pool is not pool:
                if st is not None:
                    st.close()
                st = self.stores[name] = _PoolStore(self, name, pool, fmt)
            return st

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._store_for(mem_pool_host, PoolName.KV.value, self.kv_format)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        fmt = self.kv_format if name == PoolName.KV.value else "segments"
        self._store_for(host_pool, name, fmt)

    def _kv(self) -> _PoolStore:
        st = self.stores.get(PoolName.KV.value)
        if st is None:
            raise RuntimeError("kvoffload.sglang: no KV host pool registered (register_mem_pool_host)")
        return st

    # -- base interface (flat data pages)
    def _flat_kv(self) -> Optional[_PoolStore]:
        st = self._kv()
        if st.fmt != "flat":
            logger.error("kvoffload.sglang: the base get/set calls need flat pages; this back end stores the "
                         "KV pool's pages as segments (interface_v1 / kvo_kv_format): use the v1 calls")
            return None
        return st

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        st = self._flat_kv()
        if st is None:
            return [None] * len(keys)
        return st.get_values(keys, list(target_locations) if target_locations is not None else [])

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        st = self._flat_kv()
        if st is None or values is None:
            return False
        return all(st.set_values(keys, list(values)))

    def exists(self, key: str) -> bool:
        return bool(self._kv().exists([key])[0])

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        tenant = _tenant(extra_info)
        have = self._kv().exists(keys, tenant, prefix=True)
        miss = np.flatnonzero(~have)
        n = int(miss[0]) if len(miss) else len(keys)
        self.tenants.add(tenant, lookups=1, lookup_pages=len(keys), hit_pages=n)
        return n

    def _count_transfer(self, tenant: Optional[str], write: bool, res: List[bool]) -> List[bool]:
        """Count a KV pool transfer's pages for its tenant; res as it is."""
        ok = sum(1 for r in res if r)
        if write:
            self.tenants.add(tenant, set_pages=len(res), stored_pages=ok)
        else:
            self.tenants.add(tenant, get_pages=len(res), loaded_pages=ok)
        return res

    # -- v1: zero-copy with host indices (KV pool)
    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        tenant = _tenant(extra_info)
        return self._count_transfer(tenant, False, self._kv().get_pages(keys, host_indices, tenant))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        tenant = _tenant(extra_info)
        return self._count_transfer(tenant, True, self._kv().set_pages(keys, host_indices, tenant))

    # -- v2: one PoolTransfer per pool
    def _pool(self, name: Any) -> Optional[_PoolStore]:
        st = self.stores.get(str(name))
        if st is None:
            logger.error("kvoffload.sglang: pool %s was never registered (register_mem_host_pool_v2)", name)
        return st

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        tenant = _tenant(extra_info)
        kv_have = self._kv().exists(keys, tenant, prefix=True)
        miss = np.flatnonzero(~kv_have)
        kv_pages = int(miss[0]) if len(miss) else len(keys)
        hit_count: dict[str, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            st = self._pool(t.name)
            have = st.exists(keys[:kv_pages], tenant) if st is not None else np.zeros(kv_pages, dtype=bool)
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                m = np.flatnonzero(~have)
                boundary = int(m[0]) if len(m) else kv_pages
                pool_ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                pool_ok = {n for n in range(1, kv_pages + 1) if have[max(0, n - trailing): n].all()}
                boundary = max(pool_ok, default=0)
            else:
                raise ValueError(f"kvoffload.sglang: pool {t.name}: hit policy {t.hit_policy} is not supported "
                                 "(all_pages and trailing_pages are)")
            if boundary:
                hit_count[t.name] = boundary
            restorable &= pool_ok
        ordered = sorted(restorable)
        pages = ordered[-1] if ordered else 0
        self.tenants.add(tenant, lookups=1, lookup_pages=len(keys), hit_pages=pages)
        return PoolTransferResult(pages, hit_count, ordered)

    def _batch_v2(self, transfers: List[PoolTransfer], write: bool,
                  tenant: Optional[str]) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for t in transfers:
            keys = list(t.keys or [])
            st = self._pool(t.name)
            if st is None or t.host_indices is None:
                out[t.name] = [False] * len(keys)
                continue
            out[t.name] = (st.set_pages if write else st.get_pages)(keys, t.host_indices, tenant)
            if str(t.name) == PoolName.KV.value:
                self._count_transfer(tenant, write, out[t.name])
        return out

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[str, List[bool]]:
        return self._batch_v2(transfers, False, _tenant(extra_info))

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict[str, List[bool]]:
        return self._batch_v2(transfers, True, _tenant(extra_info))

    # -- housekeeping
    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued write has landed (tests, shutdown)."""
        for st in list(self.stores.values()):
            st.flush(timeout_s)

    def get_stats(self) -> dict[str, Any]:
        """Per pool: format, value_bytes, and the counters of its cascade,
        file tier and cluster tier; the KV pool's also "tenants": per tenant
        label (kvoffload.tenants; SGLang's extra_key or cache_salt) the
        TENANT_FIELDS counters of the KV pool's pages."""
        out = {name: dict(format=st.fmt, value_bytes=st.value_bytes, **st.stats())
               for name, st in self.stores.items()}
        if PoolName.KV.value in out:
            out[PoolName.KV.value]["tenants"] = self.tenants.snapshot()
        return out

    def clear(self) -> bool:
        logger.warning("kvoffload.sglang: clear() is not supported; values age out by the tiers' LRU")
        return False

    def close(self) -> None:
        with self._lock:
            for st in self.stores.values():
                st.close()
            self.stores.clear()


__all__ = ["KvoffloadHiCacheStorage", "LAYOUTS"]
