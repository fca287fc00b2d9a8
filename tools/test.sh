#!/usr/bin/env bash
# Build kvoffload and run every test with ctest.
#   tools/test.sh            normal build in build/
#   tools/test.sh asan       AddressSanitizer + UBSan build in build-asan/
#   tools/test.sh tsan       ThreadSanitizer build in build-tsan/
# Extra arguments after the mode go to ctest (e.g. -R store).
# With redis-server installed, a local Redis Cluster is started for the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# (no mode, only ctest arguments, e.g. `tools/test.sh -R tiers`: the normal build)
case "${1:-}" in -*|"") mode=normal ;; *) mode=$1; shift ;; esac
case "$mode" in
  normal) dir=build; flags="-DCMAKE_BUILD_TYPE=RelWithDebInfo" ;;
  asan)   dir=build-asan; flags="-DCMAKE_BUILD_TYPE=Debug -DKVO_SANITIZE=ON" ;;
  tsan)   dir=build-tsan; flags="-DCMAKE_BUILD_TYPE=Debug -DKVO_TSAN=ON" ;;
  *) echo "usage: tools/test.sh [normal|asan|tsan] [ctest args]" >&2; exit 2 ;;
esac
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
[ -f "$dir/CMakeCache.txt" ] && gen=""
# KVO_DEVELOPER: warnings are errors here and in CI (not for consumers).
cmake -S . -B "$dir" $gen $flags -DKVO_DEVELOPER=ON >/dev/null
cmake --build "$dir" -j"$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
# The remote tier's tests: a throw-away Redis Cluster on 127.0.0.1:7000-7005
# for this run (tools/test-redis.sh; their tests report SKIPPED without one).
. tools/test-redis.sh
kvo_test_redis_start 7000
run=""
# ThreadSanitizer cannot map its shadow memory with high ASLR entropy; run without ASLR.
if [ "$mode" = tsan ] && command -v setarch >/dev/null; then run="setarch $(uname -m) -R"; fi
$run ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" "$@"
