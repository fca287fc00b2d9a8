"""Engine back ends, kvoffload vs the engine's own file back end, one run, one
machine, the same directory's file system.

SGLang (HiCache L3): pages of an MHA host pool (SGLang's
MHATokenToKVPoolHost, page_first, CPU memory) written and read back through
the storage interface the cache controller calls:
  - sglang-file: SGLang's HiCacheFile (built by its factory, "file"), driven
    like the controller's generic path (get_data_page + batch_set;
    batch_get into flat pages + set_from_flat_data_page);
  - kvoffload-v1: kvoffload.sglang with interface_v1 (batch_set_v1 /
    batch_get_v1 on host indices: the transfer engine gathers the pages);
  - kvoffload-flat: kvoffload.sglang's base calls, the same generic path.
LMCache (MP-mode L2): objects stored, looked up and loaded through
LMCache's NativeConnectorL2Adapter:
  - lmcache-fs_native: LMCache's own C++ file connector (fs_native);
  - kvoffload: kvoffload.lmcache (native_plugin).

Stores are timed until the data is in the file system (kvoffload's writes
are asynchronous: the timing includes the flush).  Reads are served from
the page cache for both sides (nothing drops it: the machine is shared).
Figures: keys (pages, objects) per second and GB/s, best of --repeat.

    python bench/bench_engines.py [--dir DIR] [--pages 256] [--objects 256] [--repeat 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import tempfile
import time

import torch


def _best(fn, repeat):
    best = None
    for _ in range(repeat):
        t = fn()
        best = t if best is None or t < best else best
    return best


# ----------------------------------------------------------------- SGLang --

def bench_sglang(root, pages, repeat):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    ps, layers, heads, dim = 32, 16, 4, 128  # a page: 2 x 16 x 32 x 4 x 128 x 2 B = 1 MiB
    dev = MHATokenToKVPool(pages * ps, ps, torch.float16, heads, dim, layers, "cpu", False, start_layer=0,
                           end_layer=layers - 1)
    host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2.5, 0, ps, "page_first",
                                pin_memory=False, device_capacity_tokens=dev.size, start_layer=0,
                                end_layer=layers - 1)
    host.kv_buffer.view(torch.uint8).copy_(torch.randint(0, 256, host.kv_buffer.view(torch.uint8).shape,
                                                         dtype=torch.uint8))
    page_bytes = host.get_size_per_token() * ps
    src = torch.arange(0, pages * ps, dtype=torch.int64)
    dst = torch.arange(pages * ps, 2 * pages * ps, dtype=torch.int64)
    out = {}

    def config(extra):
        return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                    is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                    model_name="bench/model", extra_config=extra)

    def run(name, make, set_fn, get_fn, flush):
        res = {}
        run_no = [0]

        def one_set():
            d = os.path.join(root, f"{name}-{run_no[0]}")
            run_no[0] += 1
            shutil.rmtree(d, ignore_errors=True)
            be = make(d)
            keys = [f"{run_no[0]}-{i:064x}" for i in range(pages)]
            t0 = time.perf_counter()
            for s in range(0, pages, 128):  # STORAGE_BATCH_SIZE
                set_fn(be, keys[s: s + 128], s)
            flush(be)
            dt = time.perf_counter() - t0
            one_set.last = (be, keys)
            return dt

        res["set_s"] = _best(one_set, repeat)
        be, keys = one_set.last
        t0 = time.perf_counter()
        for s in range(0, pages, 128):
            assert be.batch_exists(keys[s: s + 128]) == min(128, pages - s)
        res["exists_s"] = time.perf_counter() - t0

        def one_get():
            t0 = time.perf_counter()
            for s in range(0, pages, 128):
                get_fn(be, keys[s: s + 128], s)
            return time.perf_counter() - t0

        res["get_s"] = _best(one_get, repeat)
        assert torch.equal(host.get_data_page(int(dst[0])).view(torch.uint8),
                           host.get_data_page(int(src[0])).view(torch.uint8))
        if hasattr(be, "close"):
            be.close()
        out[name] = {k: v for k, v in res.items()}
        for op in ("set", "exists", "get"):
            s = res[f"{op}_s"]
            out[name][f"{op}_keys_per_s"] = pages / s
            if op != "exists":
                out[name][f"{op}_GBps"] = pages * page_bytes / s / 1e9

    # SGLang's own file back end through the controller's generic calls
    def generic_set(be, keys, s):
        assert be.batch_set(keys, [host.get_data_page(int(src[(s + i) * ps])) for i in range(len(keys))])

    def generic_get(be, keys, s):
        got = be.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
        for i, g in enumerate(got):
            assert g is not None
            host.set_from_flat_data_page(int(dst[(s + i) * ps]), g)

    run("sglang-file",
        lambda d: StorageBackendFactory.create_backend("file", config({"file_storage_path": d}), host),
        generic_set, generic_get, lambda be: None)

    def kvo(d, v1):
        extra = dict(backend_name="kvoffload", module_path="kvoffload.sglang", class_name="KvoffloadHiCacheStorage",
                     kvo_file_root=d, kvo_file_bytes=4 * pages * page_bytes, interface_v1=1 if v1 else 0)
        be = StorageBackendFactory.create_backend("dynamic", config(extra), host)
        be.register_mem_pool_host(host)
        return be

    run("kvoffload-v1", lambda d: kvo(d, True),
        lambda be, keys, s: be.batch_set_v1(keys, src[s * ps:(s + len(keys)) * ps]),
        lambda be, keys, s: be.batch_get_v1(keys, dst[s * ps:(s + len(keys)) * ps]),
        lambda be: be.flush())
    run("kvoffload-flat", lambda d: kvo(d, False), generic_set, generic_get, lambda be: be.flush())
    return {"page_bytes": page_bytes, "pages": pages, "results": out}


# ---------------------------------------------------------------- LMCache --

def bench_lmcache(root, objects, repeat, obj_bytes=1 << 20):
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters.fs_native_l2_adapter import (FSNativeL2AdapterConfig,
                                                                        _create_fs_native_l2_adapter)
    from lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter import (NativePluginL2AdapterConfig,
                                                                            _create_native_plugin_l2_adapter)
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    def mobj(seed=None):
        raw = torch.randint(0, 256, (obj_bytes,), dtype=torch.uint8) if seed else torch.zeros(obj_bytes,
                                                                                              dtype=torch.uint8)
        meta = MemoryObjMetadata(shape=torch.Size([obj_bytes]), dtype=torch.uint8, address=0, phy_size=obj_bytes,
                                 ref_count=1)
        return TensorMemoryObj(raw, meta, None)

    srcs = [mobj(seed=1) for _ in range(objects)]
    dsts = [mobj() for _ in range(objects)]
    out = {}

    def wait(fd, poll, task):
        # one notification may stand for several tasks: ask before sleeping
        while True:
            r = poll(task)
            if r is not None:
                return r
            select.select([fd], [], [], 0.05)
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass

    def run(name, make, flush):
        res = {}
        run_no = [0]

        def one_store():
            d = os.path.join(root, f"{name}-{run_no[0]}")
            run_no[0] += 1
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            a = make(d)
            keys = [ObjectKey(chunk_hash=os.urandom(32), model_name="bench", kv_rank=0) for _ in range(objects)]
            t0 = time.perf_counter()
            tasks = [a.submit_store_task(keys[s: s + 32], srcs[s: s + 32]) for s in range(0, objects, 32)]
            done = {}
            while len(done) < len(tasks):
                done.update(a.pop_completed_store_tasks())
                if len(done) == len(tasks):
                    break
                select.select([a.get_store_event_fd()], [], [], 0.05)
                try:
                    os.eventfd_read(a.get_store_event_fd())
                except BlockingIOError:
                    pass
                done.update(a.pop_completed_store_tasks())
            assert all(v >= 0 for v in done.values())
            flush(a)
            dt = time.perf_counter() - t0
            if getattr(one_store, "last", None):
                one_store.last[0].close()
            one_store.last = (a, keys)
            return dt

        res["store_s"] = _best(one_store, repeat)
        a, keys = one_store.last
        t0 = time.perf_counter()
        for s in range(0, objects, 32):
            bm = wait(a.get_lookup_and_lock_event_fd(), a.query_lookup_and_lock_result,
                      a.submit_lookup_and_lock_task(keys[s: s + 32], {}))
            assert bm.popcount() == len(keys[s: s + 32])
            a.submit_unlock(keys[s: s + 32])
        res["lookup_s"] = time.perf_counter() - t0

        def one_load():
            t0 = time.perf_counter()
            tasks = [a.submit_load_task(keys[s: s + 32], dsts[s: s + 32]) for s in range(0, objects, 32)]
            for t in tasks:
                bm = wait(a.get_load_event_fd(), a.query_load_result, t)
                assert bm.popcount() == bm.size()
            return time.perf_counter() - t0

        res["load_s"] = _best(one_load, repeat)
        assert torch.equal(dsts[-1].raw_data, srcs[-1].raw_data)
        a.close()
        out[name] = dict(res)
        for op in ("store", "lookup", "load"):
            s = res[f"{op}_s"]
            out[name][f"{op}_keys_per_s"] = objects / s
            if op != "lookup":
                out[name][f"{op}_GBps"] = objects * obj_bytes / s / 1e9

    run("lmcache-fs_native",
        lambda d: _create_fs_native_l2_adapter(FSNativeL2AdapterConfig.from_dict({"type": "fs_native",
                                                                                "base_path": d})),
        lambda a: None)
    run("kvoffload",
        lambda d: _create_native_plugin_l2_adapter(NativePluginL2AdapterConfig.from_dict({
            "type": "native_plugin", "module_path": "kvoffload.lmcache", "class_name": "KvoffloadL2Connector",
            "adapter_params": {"file_root": d, "file_bytes": 4 * objects * obj_bytes, "object_bytes": obj_bytes}})),
        lambda a: a._client.flush())
    return {"object_bytes": obj_bytes, "objects": objects, "results": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="directory on the file system to test (default: a temp dir)")
    ap.add_argument("--pages", type=int, default=256, help="SGLang pages of 1 MiB per run")
    ap.add_argument("--objects", type=int, default=256, help="LMCache objects of 1 MiB per run")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--only", choices=["sglang", "lmcache"], default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="kvo-bench-engines-", dir=a.dir)
    try:
        report = {}
        if a.only in (None, "sglang"):
            report["sglang"] = bench_sglang(root, a.pages, a.repeat)
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root, exist_ok=True)
        if a.only in (None, "lmcache"):
            report["lmcache"] = bench_lmcache(root, a.objects, a.repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(report, indent=1))
        return
    for eng, r in report.items():
        print(f"== {eng}: {r.get('pages', r.get('objects'))} values of "
              f"{r.get('page_bytes', r.get('object_bytes')) / 2**20:.2f} MiB")
        ops = ("set", "exists", "get") if eng == "sglang" else ("store", "lookup", "load")
        for name, x in r["results"].items():
            cells = []
            for op in ops:
                cell = f"{op} {x[f'{op}_keys_per_s']:9.0f} keys/s"
                if f"{op}_GBps" in x:
                    cell += f" {x[f'{op}_GBps']:5.2f} GB/s"
                cells.append(cell)
            print(f"  {name:18s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
