"""Builds the package's one compiled module, kvoffload._hot: the vLLM
manager's calls into the cascade (kvoffload/_hot.c says what and why).  It
links against nothing: it calls libkvoffload.so through the addresses of the
library that kvoffload._lib loads, so the library is found as before
(KVO_LIBRARY, next to the package, the system loader).  It is compiled
against the library's headers: ../include, and the generated
kvoffload/kvo_version.h of the build (beside KVO_LIBRARY, else ../build).
Needs a C11 compiler and the Python headers (Debian: python3-dev).
Everything else about the package is in pyproject.toml.  From a checkout
without installing:
    python setup.py build_ext --inplace      (tools/test-python.sh does this)
"""
import os

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))
lib = os.environ.get("KVO_LIBRARY")
generated = [os.path.join(d, "include") for d in ([os.path.dirname(lib)] if lib else []) +
             [os.path.join(here, "..", "build")]]
setup(ext_modules=[Extension("kvoffload._hot", sources=["kvoffload/_hot.c"],
                             include_dirs=[os.path.join(here, "..", "include")] +
                             [d for d in generated if os.path.exists(os.path.join(d, "kvoffload", "kvo_version.h"))],
                             extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"])])
