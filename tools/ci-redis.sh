#!/usr/bin/env bash
# CI for the remote tier: start a throw-away Redis Cluster on loopback
# (3 masters + 3 replicas, tools/redis-cluster.sh), run the tests labelled
# `redis` in the normal and the ASan+UBSan builds against it (tests that
# break a cluster start their own on ports base+10..base+55), and stop the
# cluster on every exit path, failure included.  .ci/run calls this after its
# own builds.  Env: KVO_CI_REDIS_PORT (default 7000).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! pkg-config --exists hiredis; then
  echo "ci-redis: redis-server or hiredis missing (tools/setup-deps.sh installs them)" >&2
  exit 1
fi
port=${KVO_CI_REDIS_PORT:-7000}
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvo-ci-redis.XXXXXX")
trap 'tools/redis-cluster.sh stop "$dir" || true' EXIT INT TERM
export KVO_TEST_REDIS
KVO_TEST_REDIS=$(tools/redis-cluster.sh start "$dir" "$port")
echo "== remote tier tests against $KVO_TEST_REDIS (normal build)"
tools/test.sh normal -L redis
echo "== remote tier tests (AddressSanitizer + UBSan)"
tools/test.sh asan -L redis
echo "== remote tier tests (ThreadSanitizer)"
tools/test.sh tsan -L redis
