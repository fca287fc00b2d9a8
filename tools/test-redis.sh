# Sourced by tools/test.sh and tools/test-python.sh (from the repository
# root): the remote tier's tests need a Redis Cluster.
#   kvo_test_redis_start DEFAULT_PORT
# starts a throw-away one on loopback (tools/redis-cluster.sh, base port
# KVO_TEST_REDIS_PORT or DEFAULT_PORT), exports KVO_TEST_REDIS=127.0.0.1:port
# and stops it when the calling script exits; nothing when KVO_TEST_REDIS
# names a cluster already, KVO_NO_REDIS=1 or redis-server is missing (then
# those tests skip).
kvo_test_redis_start() {
  if [ -z "${KVO_TEST_REDIS:-}" ] && [ "${KVO_NO_REDIS:-0}" != 1 ] && command -v redis-server >/dev/null; then
    kvo_redis_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvo-test-redis.XXXXXX")
    trap 'tools/redis-cluster.sh stop "$kvo_redis_dir" >/dev/null 2>&1 || true' EXIT INT TERM
    KVO_TEST_REDIS=$(tools/redis-cluster.sh start "$kvo_redis_dir" "${KVO_TEST_REDIS_PORT:-$1}")
    export KVO_TEST_REDIS
  fi
}
