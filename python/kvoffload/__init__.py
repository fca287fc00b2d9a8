"""kvoffload: offload LLM KV caches to host memory and files (Python bindings).

ctypes bindings over libkvoffload.so (found via KVO_LIBRARY, next to this
package, or the system loader).  Main classes: Model, Plan, Store, Arena,
FileTier, RemoteTier, Transfer, Connector, CudaDevice; SharedArena (kvoffload.shm) for an arena
shared by processes with an owner check; kvoffload.vllm for vLLM's
OffloadingConnector.  Errors raise KvoError (code, name, message).
"""
from ._lib import KvoError, LIBRARY_PATH, version
from .core import (KEY_DTYPE, LOAD, MISS, PENDING, READY, SLOT_DTYPE, STORE, Arena, Connector, CudaDevice, FileTier,
                   Model, Plan, RemoteTier, Store, Transfer, make_keys)
from .shm import SharedArena

__all__ = ["KvoError", "LIBRARY_PATH", "version", "KEY_DTYPE", "SLOT_DTYPE", "MISS", "READY", "PENDING", "STORE",
           "LOAD", "Arena", "Connector", "CudaDevice", "FileTier", "Model", "Plan", "Store", "Transfer", "make_keys",
           "SharedArena"]
__version__ = "0.1.0"
