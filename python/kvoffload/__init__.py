"""kvoffload: offload LLM KV caches to host memory and files (Python bindings).

ctypes bindings over libkvoffload.so: the KVO_LIBRARY environment variable's
when set (it overrides), else the one installed inside this package (pip
builds it, python/CMakeLists.txt), else the system loader's.  __version__ is
the version the package was built as (the root CMakeLists.txt's project());
library_version() is the loaded library's.  Main classes: Model, Plan, Store,
Arena, FileTier, RemoteTier, Transfer, Connector, CudaDevice; SharedArena
(kvoffload.shm) for an arena shared by processes with an owner check;
kvoffload.vllm for vLLM's OffloadingConnector.  Errors raise KvoError (code,
name, message).  Handles are not inherited by fork(): docs/python.md, "fork".
"""
from ._lib import KvoError, LIBRARY_PATH, library_version, version
from .core import (KEY_DTYPE, LOAD, MISS, PENDING, READY, SLOT_DTYPE, STORE, Arena, Connector, CudaDevice, FileTier,
                   Model, Plan, RemoteTier, Store, Transfer, make_keys)
from .shm import SharedArena

__all__ = ["KvoError", "LIBRARY_PATH", "library_version", "version", "KEY_DTYPE", "SLOT_DTYPE", "MISS", "READY",
           "PENDING", "STORE", "LOAD", "Arena", "Connector", "CudaDevice", "FileTier", "Model", "Plan", "Store", "Transfer", "make_keys",
           "SharedArena"]
try:
    from ._version import __version__  # written by the build (python/CMakeLists.txt)
except ImportError:  # a checkout used in place: the loaded library's (built from the same tree)
    __version__ = library_version()
