#!/usr/bin/env bash
# Install kvoffload into a temporary prefix, then build and run three small
# consumer programs outside the source tree (tests/consumers/):
#   find_package      CMake: find_package(kvoffload), shared and static
#   pkg_config        make + pkg-config, shared and static (--static)
#   add_subdirectory  CMake: the source tree built inside the consumer
# and check that the shared library exports only kvo_* symbols (nm -D).
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
      -DKVO_BUILD_TESTS=OFF -DKVO_BUILD_CLI=ON -DKVO_INSTALL=ON >/dev/null
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

say "1/3 find_package(kvoffload)"
cmake -S "$work/consumers/find_package" -B "$work/fp" $gen -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/fp" $jobs >/dev/null
grep -q "$libdir/libkvoffload.so" <<<"$(ldd "$work/fp/consumer_shared")" ||
  { echo "FAIL: find_package consumer does not load the installed libkvoffload.so" >&2; exit 1; }
run_pair "$work/fp"

say "2/3 pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists --print-errors kvoffload
pkg-config --static --libs kvoffload >/dev/null
make -s -C "$work/consumers/pkg_config" >/dev/null
run_pair "$work/consumers/pkg_config"
unset PKG_CONFIG_PATH

say "3/3 add_subdirectory(kvoffload)"
cmake -S "$work/consumers/add_subdirectory" -B "$work/as" $gen -DKVOFFLOAD_SOURCE_DIR="$src" >/dev/null
cmake --build "$work/as" $jobs >/dev/null
run_pair "$work/as"

say "passed"
