#!/usr/bin/env bash
# Install kvoffload into a temporary prefix, then build and run three small
# consumer programs outside the source tree (tests/consumers/):
#   find_package      CMake: find_package(kvoffload), shared and static
#   pkg_config        make + pkg-config, shared and static (--static)
#   add_subdirectory  CMake: the source tree built inside the consumer
# and check that the shared library exports only kvo_* symbols (nm -D).
# When the build has the CUDA device (nvcc and the toolkit found), also
#   cuda              libkvoffload_cuda.so exports only kvo_cuda_*, and a
#                     consumer built with find_package(kvoffload COMPONENTS
#                     cuda) and with pkg-config kvoffload-cuda runs: without
#                     a GPU it must get KVO_ENOTSUP from kvo_cuda_create
#                     (tests/consumers/cuda_consumer.c), not a crash.
# KVO_CUDA=OFF|ON|AUTO in the environment is passed to the build (AUTO).
# Fails on any failure.  Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvo-consumers.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
jobs="-j$(nproc)"
say() { echo "-- test-consumers: $*"; }

say "build and install into $prefix"
cmake -S . -B "$work/build" $gen -DCMAKE_BUILD_TYPE=Release -DKVO_DEVELOPER=ON \
      -DKVO_BUILD_TESTS=OFF -DKVO_BUILD_CLI=ON -DKVO_INSTALL=ON -DKVO_CUDA="${KVO_CUDA:-AUTO}" >/dev/null
cmake --build "$work/build" $jobs >/dev/null
cmake --install "$work/build" --prefix "$prefix" >/dev/null

so=$(find "$prefix" -name 'libkvoffload.so' | head -n1)
[ -n "$so" ] || { echo "FAIL: no libkvoffload.so installed" >&2; exit 1; }
libdir=$(dirname "$so")
for f in "$prefix/include/kvoffload/kvo.h" "$prefix/include/kvoffload/kvo_version.h" \
         "$prefix/include/kvoffload/kvo_config.h" "$libdir/libkvoffload.a" \
         "$libdir/pkgconfig/kvoffload.pc" "$libdir/cmake/kvoffload/kvoffloadConfig.cmake" \
         "$libdir/cmake/kvoffload/kvoffloadConfigVersion.cmake" "$prefix/bin/kvoffload" \
         "$prefix/share/man/man1/kvoffload.1" "$prefix/share/doc/kvoffload/LICENSE"; do
  [ -f "$f" ] || { echo "FAIL: not installed: ${f#$prefix/}" >&2; exit 1; }
done
say "installed: $(cd "$prefix" && find . -type f | wc -l) files"

say "nm -D: libkvoffload.so exports only kvo_* symbols"
exported=$(nm -D --defined-only "$so" | awk '{print $NF}')
bad=$(printf '%s\n' "$exported" | grep -v '^kvo_' || true)
if [ -n "$bad" ]; then
  echo "FAIL: libkvoffload.so exports symbols outside kvo_*:" >&2
  printf '  %s\n' $bad >&2
  exit 1
fi
internal=$(printf '%s\n' "$exported" | grep '^kvo__' || true)
if [ -n "$internal" ]; then
  echo "FAIL: libkvoffload.so exports internal kvo__ symbols:" >&2
  printf '  %s\n' $internal >&2
  exit 1
fi
say "  $(printf '%s\n' "$exported" | wc -l) symbols, all kvo_*"
# Test-only hooks are built only with KVO_TESTING (tests on): neither
# installed library may carry them.
hooks=$( (nm -D --defined-only "$so"; nm --defined-only "$libdir/libkvoffload.a" 2>/dev/null) |
         awk '{print $NF}' | grep -i 'inject' || true)
if [ -n "$hooks" ]; then
  echo "FAIL: installed libraries carry test-only hooks:" >&2
  printf '  %s\n' $hooks >&2
  exit 1
fi
say "  no test-only hooks (inject*) in libkvoffload.so or libkvoffload.a"

say "installed CLI: $("$prefix/bin/kvoffload" version | head -n1)"

# The consumers are copied out of the tree: they see only the prefix.
cp -r tests/consumers "$work/consumers"

# (ldd output is captured first: `ldd | grep -q` under pipefail fails when
# grep exits early and ldd gets SIGPIPE.)
run_pair() { # dir: run consumer_shared and consumer_static, check the shared one's library
  local d=$1
  "$d/consumer_shared"
  "$d/consumer_static" >/dev/null
  if command -v ldd >/dev/null; then
    grep -q "libkvoffload.so" <<<"$(ldd "$d/consumer_shared")" ||
      { echo "FAIL: $d/consumer_shared does not load libkvoffload.so" >&2; exit 1; }
    if grep -q "libkvoffload.so" <<<"$(ldd "$d/consumer_static")"; then
      echo "FAIL: $d/consumer_static loads libkvoffload.so" >&2; exit 1
    fi
  fi
}

say "1/4 find_package(kvoffload)"
cmake -S "$work/consumers/find_package" -B "$work/fp" $gen -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/fp" $jobs >/dev/null
grep -q "$libdir/libkvoffload.so" <<<"$(ldd "$work/fp/consumer_shared")" ||
  { echo "FAIL: find_package consumer does not load the installed libkvoffload.so" >&2; exit 1; }
run_pair "$work/fp"

say "2/4 pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists --print-errors kvoffload
pkg-config --static --libs kvoffload >/dev/null
make -s -C "$work/consumers/pkg_config" >/dev/null
run_pair "$work/consumers/pkg_config"
unset PKG_CONFIG_PATH

say "3/4 add_subdirectory(kvoffload)"
cmake -S "$work/consumers/add_subdirectory" -B "$work/as" $gen -DKVOFFLOAD_SOURCE_DIR="$src" >/dev/null
cmake --build "$work/as" $jobs >/dev/null
run_pair "$work/as"

cuda_so=$(find "$prefix" -name 'libkvoffload_cuda.so' | head -n1)
if [ -z "$cuda_so" ]; then
  if [ "${KVO_CUDA:-AUTO}" = ON ] || { [ "${KVO_CUDA:-AUTO}" = AUTO ] && command -v nvcc >/dev/null; }; then
    echo "FAIL: the CUDA toolkit is here but no libkvoffload_cuda.so was installed" >&2; exit 1
  fi
  say "4/4 CUDA device: not built (no CUDA toolkit, or KVO_CUDA=OFF): skipped"
else
  say "4/4 CUDA device: $(basename "$(readlink -f "$cuda_so")")"
  for f in "$prefix/include/kvoffload/kvo_cuda.h" "$libdir/pkgconfig/kvoffload-cuda.pc" \
           "$libdir/cmake/kvoffload/kvoffloadCudaTargets.cmake"; do
    [ -f "$f" ] || { echo "FAIL: not installed: ${f#$prefix/}" >&2; exit 1; }
  done
  cexp=$(nm -D --defined-only "$cuda_so" | awk '{print $NF}')
  cbad=$(printf '%s\n' "$cexp" | grep -v '^kvo_cuda_' || true)
  if [ -n "$cbad" ]; then
    echo "FAIL: libkvoffload_cuda.so exports symbols outside kvo_cuda_*:" >&2
    printf '  %s\n' $cbad >&2
    exit 1
  fi
  for sym in kvo_cuda_create kvo_cuda_destroy kvo_cuda_device_count kvo_cuda_pin_arena kvo_cuda_record_event; do
    grep -qx "$sym" <<<"$cexp" || { echo "FAIL: libkvoffload_cuda.so does not export $sym" >&2; exit 1; }
  done
  say "  $(printf '%s\n' "$cexp" | wc -l) symbols, all kvo_cuda_*; SONAME $(readelf -d "$cuda_so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')"
  needed=$(readelf -d "$cuda_so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p')
  grep -q "^libkvoffload.so" <<<"$needed" || { echo "FAIL: libkvoffload_cuda.so is not linked against libkvoffload.so" >&2; exit 1; }
  # No CUDA library at link time: the driver is opened at run time (any CUDA runtime may be loaded beside it).
  if grep -E '^lib(cuda|cudart|nv)' <<<"$needed"; then
    echo "FAIL: libkvoffload_cuda.so needs a CUDA library at link time (above)" >&2; exit 1
  fi
  say "  NEEDED: $(tr '\n' ' ' <<<"$needed")"
  say "  find_package(kvoffload COMPONENTS cuda)"
  cmake -S "$work/consumers/cuda_find_package" -B "$work/cfp" $gen -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$work/cfp" $jobs >/dev/null
  grep -q "$libdir/libkvoffload_cuda.so" <<<"$(ldd "$work/cfp/cuda_consumer")" ||
    { echo "FAIL: the CUDA consumer does not load the installed libkvoffload_cuda.so" >&2; exit 1; }
  "$work/cfp/cuda_consumer"
  say "  pkg-config kvoffload-cuda: $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --libs kvoffload-cuda)"
  PKG_CONFIG_PATH="$libdir/pkgconfig" make -s -C "$work/consumers/cuda_pkg_config" >/dev/null
  "$work/consumers/cuda_pkg_config/cuda_consumer" >/dev/null
  # A component that does not exist must fail find_package.
  mkdir -p "$work/nocomp"
  printf 'cmake_minimum_required(VERSION 3.16)\nproject(x LANGUAGES C)\nfind_package(kvoffload REQUIRED COMPONENTS tpu)\n' \
    > "$work/nocomp/CMakeLists.txt"
  if cmake -S "$work/nocomp" -B "$work/nocomp/b" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
    echo "FAIL: find_package(kvoffload COMPONENTS tpu) succeeded" >&2; exit 1
  fi
fi

say "passed"
