#!/usr/bin/env bash
# The engine back ends' tests: kvoffload.sglang (SGLang HiCache storage) and
# kvoffload.lmcache (LMCache native_plugin L2 connector) against the real
# classes of sglang 0.5.23 and lmcache 0.5.6, over the file tier and a
# loopback Redis Cluster.
#   tools/test-engines.sh [pytest args]
#   tools/test-engines.sh --bench     also python/bench/bench_engines.py (figures)
# Environment: KVO_ENGINES_VENV (default build/engines-venv; one venv for both
# engines: their pins agree), KVO_LIBRARY (a prebuilt library; else
# build/libkvoffload.so), KVO_TEST_REDIS (a cluster's host:port; else one is
# started on KVO_TEST_REDIS_PORT, default 7200), KVO_NO_REDIS=1: none.
# The venv is made from python/requirements-sglang.txt and
# python/requirements-lmcache.txt with --no-deps (every package pinned there:
# SGLang's storage layer needs torch and a few small packages, not its GPU
# kernels; about 6 GB, 4-7 minutes on a fresh machine).  pytest's "no tests
# collected" (exit 5) fails; a missing engine fails (KVO_TEST_ENGINES=1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bench=0
if [ "${1:-}" = "--bench" ]; then bench=1; shift; fi

# -- the shared library (tools/test-library.sh)
. tools/test-library.sh
kvo_test_library

# -- the engines' venv
venv=${KVO_ENGINES_VENV:-build/engines-venv}
[ "${venv:0:1}" = / ] || venv="$root/$venv"
reqs="python/requirements-sglang.txt python/requirements-lmcache.txt"
kvo_pinned_venv "$venv" "test-engines: pip install" $reqs
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
export KVO_TEST_ENGINES=1

# -- the remote tier's tests: a throw-away Redis Cluster on loopback
. tools/test-redis.sh
kvo_test_redis_start 7200

start=$(date +%s)
set +e
(cd python && "$venv/bin/python" -m pytest -q -W ignore::UserWarning -p no:cacheprovider \
   tests/test_sglang.py tests/test_lmcache.py "$@")
rc=$?
set -e
echo "test-engines: tests took $(( $(date +%s) - start )) s"
if [ $rc -eq 5 ]; then echo "test-engines: no tests were collected (pytest exit 5)" >&2; exit 1; fi
[ $rc -eq 0 ] || exit $rc

if [ $bench -eq 1 ]; then
  (cd python && "$venv/bin/python" bench/bench_engines.py)
fi
