# Sourced by tools/test-python.sh and tools/test-engines.sh (from the
# repository root): the shared library their Python tests load.
#   kvo_test_library
# builds build/libkvoffload.so (RelWithDebInfo) unless KVO_LIBRARY already
# names one, exports KVO_LIBRARY (an absolute path) and prints it.
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
