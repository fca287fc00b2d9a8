# Sourced by tools/test-python.sh and tools/test-engines.sh (from the
# repository root): the shared library their Python tests load, and the
# pinned venvs they run in.
#   kvo_test_library
# builds build/libkvoffload.so (and build/libkvoffload_cuda.so where the CUDA
# toolkit is found) unless KVO_LIBRARY already names one, exports
# KVO_LIBRARY (an absolute path) and prints it.  build/ is configured as
# tools/test.sh and the README's demo step configure it (RelWithDebInfo,
# KVO_DEVELOPER=ON): whichever runs first, the others rebuild nothing.
#   kvo_build_hot PYTHON
# builds the package's compiled module kvoffload._hot for PYTHON (the target
# _hot of python/CMakeLists.txt, in build/py-ext, warnings as errors) and
# installs it into python/kvoffload/, for the checkout used in place
# (PYTHONPATH=python); nothing is rebuilt when it is up to date.  An installed
# package (pip install ./python) has its own, built with its library.
#   kvo_pinned_venv VENV WHAT REQUIREMENTS...
# makes VENV (when it has no python) and installs the requirements files,
# every package pinned, with --no-deps and no download cache, unless VENV
# holds them already (a stamp of the files' hash, VENV/.kvo-requirements:
# they are installed again when a file changes); prints "WHAT took N s (size)"
# when it installs.
kvo_test_library() {
  if [ -z "${KVO_LIBRARY:-}" ]; then
    local gen="" so
    command -v ninja >/dev/null && gen="-G Ninja"
    [ -f build/CMakeCache.txt ] && gen=""
    cmake -S . -B build $gen -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVO_DEVELOPER=ON >/dev/null
    # and the CUDA device library where the toolkit is found: the package
    # loads it from beside libkvoffload.so
    local targets=kvoffload_shared
    cmake --build build --target help | grep -q kvoffload_cuda_shared && targets="$targets kvoffload_cuda_shared"
    cmake --build build -j2 --target $targets
    # the link names the library just built (an older version's file may
    # still lie beside it)
    so=$(readlink -f build/libkvoffload.so)
    export KVO_LIBRARY="$so"
  fi
  echo "library: $KVO_LIBRARY"
}

kvo_build_hot() {
  local gen=""
  command -v ninja >/dev/null && gen="-G Ninja"
  [ -f build/py-ext/CMakeCache.txt ] && gen=""
  cmake -S python -B build/py-ext $gen -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$1" \
        -DCMAKE_C_FLAGS=-Werror >/dev/null
  cmake --build build/py-ext --target _hot >/dev/null
  cmake --install build/py-ext --component hot --prefix python >/dev/null
}

kvo_pinned_venv() {
  local venv=$1 what=$2; shift 2
  local stamp="$venv/.kvo-requirements" want start r args=()
  want=$(cat "$@" | sha256sum | cut -c1-16)
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    start=$(date +%s)
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    for r in "$@"; do args+=(-r "$r"); done
    "$venv/bin/pip" install -q --no-cache-dir --no-deps "${args[@]}"
    echo "$want" > "$stamp"
    echo "$what took $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
  fi
}
