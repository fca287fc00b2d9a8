"""Low-level ctypes declarations of the kvoffload C API (include/kvoffload/*.h).

Everything here mirrors the C headers one to one: structs with the same field
order and types, prototypes with argtypes/restype set so ctypes converts and
checks arguments.  The rest of the package wraps these in classes; use this
module directly only for calls the classes do not cover.

Library lookup order: the ``KVO_LIBRARY`` environment variable (a path), the
``libkvoffload.so`` inside this package (an installed package has one: pip
builds it, python/CMakeLists.txt), then the system loader
(``ctypes.util.find_library("kvoffload")``).  The CUDA device library
(``libkvoffload_cuda.so``, kvo_cuda_*) is loaded only when asked for
(cuda_lib()): ``KVO_CUDA_LIBRARY``, else next to libkvoffload.so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, c_bool, c_char, c_char_p, c_int, c_int32, c_int64, c_size_t, c_uint8, c_uint32,
                    c_uint64, c_void_p)
from typing import Any, Optional

KVO_NAME_MAX = 64
KVO_MAX_GROUPS = 64

# The error table is read from the library at import (kvo_error_count /
# kvo_error_code where the library has them, else by asking kvo_error_name
# about each code down to -4096), so the KVO_E* values below are always the
# loaded library's: KVO_EINVAL, KVO_ENOSPC, ... (module attributes).
ERROR_NAMES: dict[int, str] = {}

class KvoError(Exception):
    """A kvoffload call failed.

    Attributes:
        code: the negative ``KVO_E*`` code (e.g. -1).
        name: its symbolic name ("KVO_EINVAL").
        message: the library's detailed message (kvo_last_error()) at the time
            of the failure, naming the object, numbers and a value that works.
        func: the C function that failed.
    """

    def __init__(self, code: int, message: str, func: str = "") -> None:
        self.code = code
        self.name = ERROR_NAMES.get(code, "KVO_E?")
        self.message = message
        self.func = func
        super().__init__(f"{func}: {self.name} ({code}): {message}" if func else f"{self.name} ({code}): {message}")


def _find_library() -> str:
    env = os.environ.get("KVO_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libkvoffload.so", "libkvoffload.so.0"):
        cand = os.path.join(here, name)
        if os.path.exists(cand):
            return cand
    found = ctypes.util.find_library("kvoffload")
    if found:
        return found
    raise OSError(f"kvoffload: shared library not found: {here} has no libkvoffload.so (a checkout used in "
                  "place: `pip install ./python` builds and installs the package with its library) and "
                  "KVO_LIBRARY is not set (the path of a libkvoffload.so) nor does the system loader find one")


lib = ctypes.CDLL(_find_library())
LIBRARY_PATH = lib._name


def _load_error_table() -> None:
    lib.kvo_error_name.restype = c_char_p
    lib.kvo_error_name.argtypes = [c_int]
    if hasattr(lib, "kvo_error_count"):
        lib.kvo_error_count.restype = c_size_t
        lib.kvo_error_code.restype = c_int
        lib.kvo_error_code.argtypes = [c_size_t]
        codes = [lib.kvo_error_code(i) for i in range(lib.kvo_error_count())]
    else:
        codes = [c for c in range(0, -4097, -1) if lib.kvo_error_name(c) != b"KVO_E?"]
    for code in codes:
        name = lib.kvo_error_name(code).decode()
        ERROR_NAMES[code] = name
        globals()[name] = code


_load_error_table()
KVO_OK: int
KVO_EINVAL: int
KVO_ENOMEM: int
KVO_ERANGE: int
KVO_EPARSE: int
KVO_ENOTFOUND: int
KVO_EEXIST: int
KVO_ENOSPC: int
KVO_EBUSY: int
KVO_ESTATE: int
KVO_EIO: int
KVO_ECORRUPT: int
KVO_ECANCELED: int
KVO_ENOTSUP: int
KVO_EAGAIN: int
KVO_ECLOSED: int
KVO_ELAYOUT: int
KVO_ETIMEDOUT: int


# ------------------------------------------------------------------ structs --

class U128(ctypes.Structure):
    _fields_ = [("lo", c_uint64), ("hi", c_uint64)]


class ChunkKey(ctypes.Structure):
    _fields_ = [("hash", U128), ("group", c_uint32), ("tenant", c_uint32)]


class GroupDesc(ctypes.Structure):
    _fields_ = [("name", c_char * KVO_NAME_MAX), ("kind", c_int), ("tokens_per_block", c_uint32),
                ("layers", c_uint32), ("page_bytes", c_uint64), ("window", c_uint32), ("cacheable", c_bool),
                ("draft", c_bool)]


class GroupOverride(ctypes.Structure):
    _fields_ = [("group", c_char_p), ("blocks_per_chunk", c_uint32)]


class PlanParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("block_size", c_uint64), ("blocks_per_chunk", c_uint64), ("overrides", POINTER(GroupOverride)),
                ("n_overrides", c_size_t), ("target_chunk_bytes", c_uint64), ("dtype", c_char_p),
                ("tp_rank", c_uint32), ("tp_size", c_uint32)]


class GroupPlan(ctypes.Structure):
    _fields_ = [("id", c_uint32), ("name", c_char * KVO_NAME_MAX), ("kind", c_int), ("tokens_per_block", c_uint32),
                ("layers", c_uint32), ("page_bytes", c_uint64), ("window", c_uint32), ("cacheable", c_bool),
                ("draft", c_bool), ("offloaded", c_bool), ("blocks_per_chunk", c_uint64),
                ("tokens_per_chunk", c_uint64), ("hashes_per_chunk", c_uint64), ("chunk_bytes", c_uint64),
                ("slot_bytes", c_uint64), ("window_chunks", c_uint64)]


class StoreParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("plan", c_void_p), ("capacity_bytes", c_uint64), ("policy", c_int), ("admit_after", c_uint32),
                ("max_entries", c_uint64), ("event_capacity", c_uint32), ("segment_bytes", c_uint64),
                ("ignore_present", c_bool), ("policy_admission", c_bool),
                ("lookups_per_key", c_bool), ("base_offset", c_uint64)]


class Slot(ctypes.Structure):
    _fields_ = [("offset", c_uint64), ("bytes", c_uint64)]


class StoreEntry(ctypes.Structure):
    _fields_ = [("key", ChunkKey), ("slot", Slot), ("state", c_uint8), ("pins", c_uint32)]


class StoreEvent(ctypes.Structure):
    _fields_ = [("type", c_uint32), ("key", ChunkKey)]


_GROUP_STATS = ["chunks", "bytes_used", "capacity_chunks", "slot_bytes", "hits", "misses", "stores", "evictions"]


class StoreGroupStats(ctypes.Structure):
    _fields_ = [(n, c_uint64) for n in _GROUP_STATS]


_STORE_STATS = ["capacity_bytes", "bytes_used", "bytes_reserved", "entries", "pinned", "pending", "hits", "misses",
                "pending_hits", "stores", "store_skipped_present", "store_not_admitted", "rejected_stores",
                "evictions", "removals", "events_dropped", "segment_bytes", "segments", "segments_free"]


class StoreStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _STORE_STATS] + [("n_groups", c_size_t),
                                                        ("groups", StoreGroupStats * KVO_MAX_GROUPS)]


class ArenaParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("bytes", c_uint64), ("huge_pages", c_bool), ("lock", c_bool), ("prefault", c_bool),
                ("shm_path", c_char_p), ("shm_unlink", c_bool), ("require_huge_pages", c_bool),
                ("share_processes", c_uint32), ("share_fingerprint", U128), ("share_timeout_ms", c_uint32)]


class FileTierParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("root", c_char_p), ("plan", c_void_p), ("quota_bytes", c_uint64), ("policy", c_int),
                ("max_files", c_uint64), ("fsync", c_int), ("io", c_int), ("direct", c_int),
                ("io_threads", c_uint32), ("queue_depth", c_uint32), ("max_pending_writes", c_uint32),
                ("max_staging_bytes", c_uint64), ("write_latency_limit_ms", c_uint32),
                ("write_completions", c_bool), ("shared", c_bool), ("scan", c_bool), ("log_interval_s", c_uint32),
                ("layout_hash", c_uint64), ("file_mode", c_uint32), ("file_secret", c_char_p)]


_FILE_STATS = ["quota_bytes", "bytes_used", "files", "scanned_files", "scan_removed", "scan_ns", "hits", "misses",
               "writes", "write_bytes", "reads", "read_bytes", "read_misses", "write_skipped",
               "dropped_backpressure", "dropped_quota", "dropped_nospace", "dropped_io", "read_errors",
               "corrupt_removed", "evictions", "recycled_files", "pending_writes", "staging_bytes",
               "write_latency_ns", "writes_borrowed", "shared", "shared_bytes_used", "shared_files",
               "foreign_evictions", "read_only", "dropped_readonly", "auth_failed"]


class FileTierStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _FILE_STATS]


class FileCompletion(ctypes.Structure):
    _fields_ = [("user_data", c_uint64), ("key", ChunkKey), ("op", c_uint32), ("result", c_int),
                ("bytes", c_uint64), ("latency_ns", c_uint64)]


class RemoteTierParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("url", c_char_p), ("user", c_char_p), ("password", c_char_p),
                ("plan", c_void_p), ("layout_hash", c_uint64), ("key_prefix", c_char_p), ("ttl_s", c_uint32),
                ("io_threads", c_uint32), ("conns_per_node", c_uint32), ("batch_max", c_uint32),
                ("batch_max_bytes", c_uint64), ("max_pending_writes", c_uint32), ("max_pending_reads", c_uint32),
                ("max_staging_bytes", c_uint64), ("connect_timeout_ms", c_uint32), ("io_timeout_ms", c_uint32),
                ("down_backoff_ms", c_uint32), ("max_redirects", c_uint32), ("write_completions", c_bool),
                ("secret", c_char_p), ("secret_previous", c_char_p)]


_REMOTE_STATS = ["puts", "put_bytes", "gets", "get_bytes", "get_misses", "exists_hits", "exists_misses",
                 "put_skipped", "dropped_backpressure", "dropped_io", "read_errors", "refused_reads",
                 "corrupt_deleted", "moved", "asked", "slot_refreshes", "node_failures", "batches", "nodes",
                 "nodes_down", "pending_writes", "pending_reads", "staging_bytes", "reads_after_put",
                 "auth_failed", "removes", "remove_misses", "remove_errors"]


class RemoteTierStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _REMOTE_STATS]


REMOTE_OP_PUT, REMOTE_OP_GET, REMOTE_OP_EXISTS, REMOTE_OP_REMOVE = 1, 2, 3, 4  # kvo_remote_op_kind
FILE_OP_WRITE, FILE_OP_READ = 1, 2  # kvo_file_op_kind


class RemoteCompletion(ctypes.Structure):
    _fields_ = [("user_data", c_uint64), ("key", ChunkKey), ("op", c_uint32), ("result", c_int),
                ("bytes", c_uint64), ("latency_ns", c_uint64)]


class TransferParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("plan", c_void_p), ("threads", c_uint32), ("max_queued_jobs", c_uint32), ("nontemporal", c_int),
                ("device", c_char_p), ("device_index", c_int)]


class Segment(ctypes.Structure):
    _fields_ = [("group", c_uint32), ("base", c_void_p), ("num_blocks", c_uint64), ("block_stride", c_uint64),
                ("page_bytes", c_uint64)]


class XferOp(ctypes.Structure):
    _fields_ = [("group", c_uint32), ("first_block", c_uint32), ("n_blocks", c_uint32),
                ("engine_blocks", POINTER(c_uint64)), ("slot", c_void_p), ("slot_bytes", c_uint64)]


class XferResult(ctypes.Structure):
    _fields_ = [("job_id", c_uint64), ("status", c_int), ("dir", c_uint32), ("bytes", c_uint64),
                ("duration_ns", c_uint64)]


_XFER_STATS = ["jobs_submitted", "jobs_ok", "jobs_failed", "jobs_canceled", "jobs_queued", "results_pending",
               "bytes_stored", "bytes_loaded", "copies", "dep_waits"]


class TransferStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _XFER_STATS] + [("nontemporal", c_bool), ("copy_kind", c_char_p),
                                                       ("device", c_char_p)]


class CascadeTenant(ctypes.Structure):
    """kvo_cascade_tenant: a tenant's own part of the host and file tiers."""
    _fields_ = [("label", c_char_p), ("host_bytes", c_uint64), ("file_tier", c_void_p)]


class ConnectorParams(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [("plan", c_void_p), ("host_bytes", c_uint64), ("policy", c_int), ("admit_after", c_uint32),
                ("event_capacity", c_uint32), ("huge_pages", c_bool), ("lock_memory", c_bool),
                ("prefault", c_bool), ("shm_path", c_char_p), ("transfer_threads", c_uint32),
                ("max_queued_jobs", c_uint32), ("nontemporal", c_int), ("salt", c_void_p), ("salt_len", c_size_t),
                ("min_hit_tokens", c_uint64), ("scratch_groups", c_uint64), ("max_hit_tokens", c_uint64),
                ("sliding_store", c_int),
                ("checkpoint_interval", c_uint64), ("verify_checksums", c_bool), ("file_tier", c_void_p),
                ("file_mode", c_int), ("file_persist_on_destroy", c_bool), ("max_requests", c_uint32),
                ("remote_tier", c_void_p), ("remote_lookup_budget_us", c_uint32), ("remote_exists_ttl_ms", c_uint32),
                ("snapshot_groups", c_uint64), ("file_zero_copy", c_bool),
                ("tenants", c_void_p), ("n_tenants", c_uint32)]


class RequestDesc(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("id", c_uint64), ("tokens", POINTER(c_uint32)), ("n_tokens", c_size_t),
                ("unit_hashes", POINTER(U128)), ("n_units", c_size_t), ("prompt_tokens", c_uint64),
                ("cache_salt", c_void_p), ("cache_salt_len", c_size_t), ("extra", c_void_p),
                ("extra_len", c_size_t), ("max_load_tokens", c_uint64), ("max_offload_tokens", c_uint64),
                ("offload_prompt_only", c_bool)]


class CudaParams(ctypes.Structure):
    """kvo_cuda_params (kvo_cuda.h; the functions are in the CUDA device
    library, cuda_lib() below)."""
    _fields_ = [("struct_size", c_size_t), ("device_index", ctypes.c_int), ("compute_stream", c_void_p),
                ("kernel_max_bytes", c_uint64), ("kernel_min_pieces", c_uint32), ("batch", ctypes.c_int),
                ("require_pinned", c_bool), ("completion_timeout_ms", c_uint32), ("kernel_stores", c_bool)]


_CUDA_STATS = ["units", "memcpy_calls", "batch_calls", "batch_pieces", "kernel_launches", "kernel_pieces", "errors"]


class CudaStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _CUDA_STATS] + [("batch_available", c_bool),
                ("batch_refused", c_uint64), ("timeouts", c_uint64), ("kernel_available", c_bool)]


class LookupResultC(ctypes.Structure):
    _fields_ = [("status", c_int), ("tokens", c_uint64), ("tokens_if_pending", c_uint64),
                ("local_tokens", c_uint64), ("tokens_host", c_uint64), ("tokens_file", c_uint64),
                ("limiting_group", c_int32), ("reason", c_int), ("tokens_remote", c_uint64),
                ("remote_pending", c_bool)]


class BlockTable(ctypes.Structure):
    _fields_ = [("blocks", POINTER(c_uint64)), ("n", c_size_t)]


class Completion(ctypes.Structure):
    _fields_ = [("request", c_uint64), ("type", c_uint32), ("status", c_int), ("tokens_valid", c_uint64),
                ("n_invalid_blocks", c_uint64)]


_CONN_STATS = ["requests_added", "requests_live", "requests_finished", "lookups", "lookup_hits", "lookup_pending",
               "lookup_tokens", "hit_tokens", "loads", "load_failures", "checksum_failures", "tokens_loaded",
               "tokens_loaded_host", "tokens_loaded_file", "bytes_loaded", "bytes_stored", "chunks_stored",
               "chunks_loaded", "stores_skipped_nospace", "stores_skipped_queue", "stores_failed", "file_writes",
               "file_reads", "file_read_failures", "file_writebacks", "file_writes_skipped", "file_writes_dropped"]
# after `host` (fields appended since; the struct_size convention)
_CONN_STATS_REMOTE = ["tokens_loaded_remote", "remote_reads", "remote_read_bytes", "remote_read_failures",
                      "remote_writes", "remote_write_bytes", "remote_writes_dropped", "remote_exists",
                      "remote_exists_refused", "remote_lookups_pending", "remote_budget_expired",
                      "file_lent_now", "lookups_wait_lent"]


class ConnectorStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _CONN_STATS] + [("host", StoreStats)] + \
        [(n, c_uint64) for n in _CONN_STATS_REMOTE]


class TenantStats(ctypes.Structure):
    """kvo_tenant_stats: one tenant's counters (kvo_connector_tenant_stats)."""
    _fields_ = [("label", ctypes.c_char * 16)] + \
        [(n, c_uint64) for n in ("requests", "lookup_tokens", "hit_tokens", "loaded_tokens", "stored_chunks",
                                 "load_failures")]


_REQ_STATS = ["prompt_tokens", "tokens", "lookups", "pending_lookups", "local_tokens", "tokens_loaded",
              "tokens_loaded_host", "tokens_loaded_file", "tokens_computed", "bytes_loaded", "bytes_stored",
              "chunks_loaded", "chunks_stored", "stores_skipped", "load_failures", "tokens_loaded_remote"]


class RequestStats(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _REQ_STATS]


# -------------------------------------------------------------- prototypes --

P = c_void_p
KEYS = c_void_p  # const kvo_chunk_key * (a numpy KEY_DTYPE buffer or a ChunkKey array)

_PROTOS: dict[str, tuple[Any, list[Any]]] = {
    "kvo_version": (c_char_p, []),
    "kvo_strerror": (c_char_p, [c_int]),
    "kvo_error_name": (c_char_p, [c_int]),
    "kvo_last_error": (c_char_p, []),
    "kvo_free": (None, [c_void_p]),
    # model / plan
    "kvo_group_desc_default": (GroupDesc, []),
    "kvo_model_create": (c_int, [c_char_p, c_uint32, POINTER(P)]),
    "kvo_model_add_group": (c_int, [P, POINTER(GroupDesc)]),
    "kvo_model_from_json": (c_int, [c_char_p, c_size_t, c_char_p, POINTER(P)]),
    "kvo_model_open": (c_int, [c_char_p, POINTER(P)]),
    "kvo_model_from_hf_config": (c_int, [c_char_p, c_size_t, c_char_p, c_uint32, c_uint32, POINTER(P)]),
    "kvo_model_to_json": (c_int, [P, POINTER(c_void_p)]),
    "kvo_model_destroy": (None, [P]),
    "kvo_model_preset_count": (c_size_t, []),
    "kvo_model_preset_name": (c_char_p, [c_size_t]),
    "kvo_plan_default_params": (PlanParams, []),
    "kvo_plan_create": (c_int, [P, POINTER(PlanParams), POINTER(P)]),
    "kvo_plan_destroy": (None, [P]),
    "kvo_plan_num_groups": (c_size_t, [P]),
    "kvo_plan_group": (POINTER(GroupPlan), [P, c_size_t]),
    "kvo_plan_tokens_per_hash": (c_uint32, [P]),
    "kvo_plan_fingerprint": (U128, [P]),
    "kvo_plan_max_slot_bytes": (c_uint64, [P]),
    "kvo_plan_to_json": (c_int, [P, POINTER(c_void_p)]),
    # keys
    "kvo_keys_namespace": (U128, [U128, c_void_p, c_size_t]),
    "kvo_hash_tokens": (c_int, [U128, c_void_p, c_size_t, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                                POINTER(c_size_t)]),
    "kvo_chunk_keys": (c_size_t, [POINTER(GroupPlan), c_void_p, c_size_t, c_void_p, c_size_t]),
    # store
    "kvo_policy_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "kvo_store_default_params": (StoreParams, []),
    "kvo_store_create": (c_int, [POINTER(StoreParams), POINTER(P)]),
    "kvo_store_destroy": (None, [P]),
    "kvo_store_lookup": (c_int, [P, KEYS, c_size_t, c_void_p]),
    "kvo_store_prepare_store": (c_int, [P, KEYS, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                                        POINTER(c_size_t)]),
    "kvo_store_complete_store": (c_int, [P, KEYS, c_size_t, c_bool]),
    "kvo_store_prepare_load": (c_int, [P, KEYS, c_size_t, c_void_p]),
    "kvo_store_complete_load": (c_int, [P, KEYS, c_size_t]),
    "kvo_store_touch": (c_int, [P, KEYS, c_size_t]),
    "kvo_store_remove": (c_int, [P, KEYS, c_size_t]),
    "kvo_store_retire": (c_int, [P, KEYS, c_size_t]),
    "kvo_store_clear": (c_size_t, [P]),
    "kvo_store_peek": (c_int, [P, KEYS, POINTER(StoreEntry)]),
    "kvo_store_drain_events": (c_size_t, [P, c_void_p, c_size_t, POINTER(c_uint64)]),
    "kvo_store_get_stats": (c_int, [P, POINTER(StoreStats)]),
    # arena
    "kvo_arena_default_params": (ArenaParams, []),
    "kvo_arena_create": (c_int, [POINTER(ArenaParams), POINTER(P)]),
    "kvo_arena_destroy": (None, [P]),
    "kvo_arena_base": (c_void_p, [P]),
    "kvo_arena_size": (c_uint64, [P]),
    "kvo_arena_creator": (c_bool, [P]),
    "kvo_arena_instance": (U128, [P]),
    "kvo_arena_sweep_stale": (c_int, [c_char_p, c_char_p, POINTER(c_size_t)]),
    # file tier
    "kvo_file_tier_default_params": (FileTierParams, []),
    "kvo_file_tier_create": (c_int, [POINTER(FileTierParams), POINTER(P)]),
    "kvo_file_tier_destroy": (None, [P]),
    "kvo_file_tier_dir": (c_char_p, [P]),
    "kvo_file_tier_backend": (c_char_p, [P]),
    "kvo_file_tier_lookup": (c_int, [P, KEYS, c_size_t, c_void_p]),
    "kvo_file_tier_write": (c_int, [P, KEYS, c_void_p, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_file_tier_write_borrowed": (c_int, [P, KEYS, c_void_p, c_void_p, c_size_t, c_void_p, c_void_p,
                                             POINTER(c_size_t)]),
    "kvo_file_tier_read": (c_int, [P, KEYS, c_void_p, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_file_tier_poll": (c_int, [P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_file_tier_wait": (c_int, [P, c_int64]),
    "kvo_file_tier_flush": (c_int, [P, c_int64]),
    "kvo_file_tier_touch": (c_int, [P, KEYS, c_size_t]),
    "kvo_file_tier_remove": (c_int, [P, KEYS, c_size_t]),
    "kvo_file_tier_get_stats": (c_int, [P, POINTER(FileTierStats)]),
    # remote tier (Redis Cluster; without hiredis create says KVO_ENOTSUP)
    "kvo_remote_tier_default_params": (RemoteTierParams, []),
    "kvo_remote_tier_create": (c_int, [POINTER(RemoteTierParams), POINTER(P)]),
    "kvo_remote_tier_destroy": (None, [P]),
    "kvo_remote_tier_put": (c_int, [P, KEYS, c_void_p, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_remote_tier_get": (c_int, [P, KEYS, c_void_p, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_remote_tier_exists": (c_int, [P, KEYS, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_remote_tier_remove": (c_int, [P, KEYS, c_size_t, c_void_p, c_void_p, POINTER(c_size_t)]),
    "kvo_remote_tier_poll": (c_int, [P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_remote_tier_wait": (c_int, [P, c_int64]),
    "kvo_remote_tier_flush": (c_int, [P, c_int64]),
    "kvo_remote_tier_key_name": (c_int, [P, KEYS, c_char_p, c_size_t]),
    "kvo_remote_tier_get_stats": (c_int, [P, POINTER(RemoteTierStats)]),
    # transfer
    "kvo_transfer_default_params": (TransferParams, []),
    "kvo_transfer_create": (c_int, [POINTER(TransferParams), POINTER(P)]),
    "kvo_transfer_destroy": (None, [P]),
    "kvo_transfer_set_layout": (c_int, [P, c_void_p, c_size_t]),
    "kvo_transfer_submit": (c_int, [P, c_int, c_void_p, c_size_t, POINTER(c_uint64)]),
    "kvo_transfer_poll": (c_int, [P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_transfer_wait": (c_int, [P, c_void_p, c_size_t, c_int64]),
    "kvo_transfer_get_stats": (c_int, [P, POINTER(TransferStats)]),
    # connector
    "kvo_connector_default_params": (ConnectorParams, []),
    "kvo_connector_create": (c_int, [POINTER(ConnectorParams), POINTER(P)]),
    "kvo_connector_destroy": (None, [P]),
    "kvo_connector_set_layout": (c_int, [P, c_void_p, c_size_t]),
    "kvo_connector_step": (c_uint64, [P]),
    "kvo_connector_add_request": (c_int, [P, POINTER(RequestDesc)]),
    "kvo_connector_append_tokens": (c_int, [P, c_uint64, c_void_p, c_size_t]),
    "kvo_connector_lookup": (c_int, [P, c_uint64, c_uint64, POINTER(LookupResultC)]),
    "kvo_connector_load": (c_int, [P, c_uint64, c_uint64, c_void_p, c_size_t]),
    "kvo_connector_update": (c_int, [P, c_uint64, c_uint64, c_void_p, c_size_t]),
    "kvo_connector_wait_request": (c_int, [P, c_uint64]),
    "kvo_connector_finish": (c_int, [P, c_uint64, c_uint64, c_void_p, c_size_t, POINTER(c_bool)]),
    "kvo_connector_preempt": (c_int, [P, c_uint64]),
    "kvo_connector_abort": (c_int, [P, c_uint64]),
    "kvo_connector_poll": (c_int, [P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_connector_request_stats": (c_int, [P, c_uint64, POINTER(RequestStats)]),
    "kvo_connector_get_stats": (c_int, [P, POINTER(ConnectorStats)]),
    "kvo_connector_tenant_stats": (c_int, [P, c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvo_connector_drain_events": (c_size_t, [P, c_void_p, c_size_t, POINTER(c_uint64)]),
}

# the CUDA device (kvo_cuda.h), bound on the library cuda_lib() loads
_CUDA_PROTOS: dict[str, tuple[Any, list[Any]]] = {
    "kvo_cuda_default_params": (CudaParams, []),
    "kvo_cuda_device_count": (c_int, [POINTER(c_int)]),
    "kvo_cuda_create": (c_int, [POINTER(CudaParams), POINTER(P)]),
    "kvo_cuda_destroy": (None, [P]),
    "kvo_cuda_set_compute_stream": (c_int, [P, c_void_p]),
    "kvo_cuda_record_event": (c_int, [P, c_int, c_void_p]),
    "kvo_cuda_pin_host": (c_int, [P, c_void_p, c_uint64]),
    "kvo_cuda_pin_arena": (c_int, [P, P]),
    "kvo_cuda_unpin_host": (c_int, [P, c_void_p]),
    "kvo_cuda_unpin_arena": (c_int, [P, P]),
    "kvo_cuda_get_stats": (c_int, [P, POINTER(CudaStats)]),
}


def _bind(dll: ctypes.CDLL, protos: dict[str, tuple[Any, list[Any]]]) -> None:
    for name, (res, args) in protos.items():
        fn = getattr(dll, name)
        fn.restype = res
        fn.argtypes = args


_bind(lib, _PROTOS)


def addresses(dll: ctypes.CDLL, names: Any) -> dict[str, int]:
    """The addresses of the named functions of a loaded library (for the
    compiled module kvoffload._hot, which calls them through pointers so
    that the library is the one found here)."""
    return {n: ctypes.cast(getattr(dll, n), c_void_p).value for n in names}


def last_error() -> str:
    """kvo_last_error() of the calling thread, decoded."""
    return (lib.kvo_last_error() or b"").decode("utf-8", "replace")


def check(rc: int, func: str) -> int:
    """Raise KvoError for a negative return code; return rc otherwise."""
    if rc < 0:
        raise KvoError(rc, last_error(), func)
    return rc


# ------------------------------------------------- checks at the boundary --
# ctypes silently truncates an int that does not fit a field (2**32 + 5 into a
# uint32 is 5, -1 into a uint64 is 2**64 - 1): every value that reaches a C
# struct or argument from a user goes through check_int / set_fields.

def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """value as an int in [lo, hi]; else TypeError (a float, a string, None,
    a bool), ValueError (below lo) or OverflowError (above hi), each naming
    the parameter."""
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} ({value!r})")
    v = value.__index__()
    if v < lo:
        raise ValueError(f"{name}={v} is below {lo}")
    if v > hi:
        raise OverflowError(f"{name}={v} does not fit: at most {hi}")
    return v


def int_range(ctype: Any) -> tuple[int, int]:
    """The values a ctypes integer type holds."""
    bits = 8 * ctypes.sizeof(ctype)
    if ctype._type_.islower():  # signed: b h i l q
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def set_fields(struct: ctypes.Structure, names: Optional[dict[str, str]] = None, **values: Any) -> None:
    """struct.<field> = value for each keyword, checked against the field's
    ctypes integer type (check_int); errors name the caller's parameter
    (names maps a field to it where they differ)."""
    types = {f[0]: f[1] for f in type(struct)._fields_}
    for field, v in values.items():
        t = types[field]
        if getattr(t, "_type_", None) in tuple("bBhHiIlLqQ"):
            v = check_int((names or {}).get(field, field), v, *int_range(t))
        setattr(struct, field, v)


def need(name: str, value: Any, cls: type) -> Any:
    """value when it is a cls, else TypeError naming the parameter."""
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be a {cls.__name__}, not {type(value).__name__}")
    return value


def take_string(ptr: c_void_p) -> str:
    """Copy a library-allocated NUL-terminated string and kvo_free() it."""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8") if ptr.value else ""
    finally:
        lib.kvo_free(ptr)


def library_version() -> str:
    """kvo_version() of the loaded library (kvoffload.__version__ is the
    version the package was built as; they differ only when KVO_LIBRARY names
    another build)."""
    return lib.kvo_version().decode()


version = library_version  # the older name


# ------------------------------------------------------------- CUDA device --

CUDA_LIBRARY_NAMES = ("libkvoffload_cuda.so", "libkvoffload_cuda.so.0")
_cuda: Optional[ctypes.CDLL] = None


def _find_cuda_library() -> Optional[str]:
    """KVO_CUDA_LIBRARY (a path), else libkvoffload_cuda.so next to the
    loaded libkvoffload.so, else None."""
    env = os.environ.get("KVO_CUDA_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(LIBRARY_PATH)) if os.path.sep in LIBRARY_PATH else ""
    for d in [x for x in (here, os.path.dirname(os.path.abspath(__file__))) if x]:
        for name in CUDA_LIBRARY_NAMES:
            cand = os.path.join(d, name)
            if os.path.exists(cand):
                return cand
    return None


def cuda_lib() -> ctypes.CDLL:
    """The CUDA device library (kvo_cuda_*), loaded on first use with its
    prototypes bound: KVO_CUDA_LIBRARY, else libkvoffload_cuda.so next to
    libkvoffload.so (or next to this package), else libkvoffload.so itself
    when it exports kvo_cuda_create.  Raises KvoError KVO_ENOTSUP naming
    where it looked when there is none or it does not load (no CUDA
    runtime); importing kvoffload never needs it."""
    global _cuda
    if _cuda is not None:
        return _cuda
    path = _find_cuda_library()
    if path is None and not hasattr(lib, "kvo_cuda_create"):
        raise KvoError(KVO_ENOTSUP, "no CUDA device library: set KVO_CUDA_LIBRARY to the path of "
                       f"libkvoffload_cuda.so, or put it next to {LIBRARY_PATH} (build with -DKVO_CUDA=ON); "
                       f"{LIBRARY_PATH} itself has no kvo_cuda_create", "cuda_lib")
    try:
        dll = lib if path is None else ctypes.CDLL(path)
        _bind(dll, _CUDA_PROTOS)
    except (OSError, AttributeError) as e:
        raise KvoError(KVO_ENOTSUP, f"CUDA device library {path} does not load or lacks kvo_cuda_*: {e} "
                       "(it needs the libkvoffload.so it was built with; no CUDA library)", "cuda_lib") from None
    _cuda = dll
    return dll

