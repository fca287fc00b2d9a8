"""Builds the package's one compiled module, kvoffload._hot: the vLLM
manager's hot calls (kvoffload/_hot.c says what and why).  It links against
nothing: it calls libkvoffload.so through the addresses of the library that
kvoffload._lib loads, so the library is found as before (KVO_LIBRARY, next to
the package, the system loader).  Needs a C11 compiler and the Python headers
(Debian: python3-dev).  Everything else about the package is in
pyproject.toml.  From a checkout without installing:
    python setup.py build_ext --inplace      (tools/test-python.sh does this)
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kvoffload._hot", sources=["kvoffload/_hot.c"],
                             extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"])])
