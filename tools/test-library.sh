# Sourced by tools/test-python.sh and tools/test-engines.sh (from the
# repository root): the shared library their Python tests load, and the
# pinned venvs they run in.
#   kvo_test_library
# builds build/libkvoffload.so (RelWithDebInfo) unless KVO_LIBRARY already
# names one, exports KVO_LIBRARY (an absolute path) and prints it.
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
    cmake -S . -B build $gen -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j2 --target kvoffload_shared
    so=$(find build -maxdepth 2 -name 'libkvoffload.so*' -type f | sort | head -n1)
    export KVO_LIBRARY="$PWD/$so"
  fi
  echo "library: $KVO_LIBRARY"
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
