#!/usr/bin/env bash
# A throw-away Redis Cluster on loopback for tests and benchmarks.
#
#   tools/redis-cluster.sh start DIR [base_port] [password]
#       3 masters + 3 replicas on 127.0.0.1:base_port..base_port+5 (default
#       7000; cluster bus on port+10000), data and pid files under DIR; waits
#       until every node reports cluster_state:ok, then prints the seed
#       address (127.0.0.1:base_port).  With a password: requirepass +
#       masterauth on every node.
#   tools/redis-cluster.sh stop DIR
#       kills the nodes by their pid files (TERM, then KILL) and removes DIR.
#
# Environment: KVO_CLUSTER_MAXMEMORY (default 512mb per node, allkeys-lru),
# KVO_CLUSTER_NODE_TIMEOUT_MS (default 2000: a killed master fails over in a
# few seconds).  Binds 127.0.0.1 only.
set -euo pipefail
usage() { echo "usage: $0 start DIR [base_port] [password] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2 base=${3:-7000} pass=${4:-}

stop() {
  [ -d "$dir" ] || return 0
  local pids=""
  for f in "$dir"/*/redis.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && pids="$pids $pid"
  done
  for _ in $(seq 50); do
    alive=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for p in ${alive:-}; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}

cli() {
  if [ -n "$pass" ]; then REDISCLI_AUTH="$pass" redis-cli -h 127.0.0.1 "$@"; else redis-cli -h 127.0.0.1 "$@"; fi
}

start() {
  command -v redis-server >/dev/null || { echo "redis-server not installed (apt-get install redis-server)" >&2; exit 1; }
  mkdir -p "$dir"
  local addrs=""
  for i in 0 1 2 3 4 5; do
    port=$((base + i))
    mkdir -p "$dir/$port"
    extra=()
    [ -n "$pass" ] && extra=(--requirepass "$pass" --masterauth "$pass")
    redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
      --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout "${KVO_CLUSTER_NODE_TIMEOUT_MS:-2000}" \
      --cluster-replica-validity-factor 0 --cluster-announce-ip 127.0.0.1 \
      --dir "$dir/$port" --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
      --daemonize yes --save "" --appendonly no \
      --maxmemory "${KVO_CLUSTER_MAXMEMORY:-512mb}" --maxmemory-policy allkeys-lru \
      --client-output-buffer-limit "normal 0 0 0" --proto-max-bulk-len 1gb \
      "${extra[@]}"
    addrs="$addrs 127.0.0.1:$port"
  done
  for i in 0 1 2 3 4 5; do
    for _ in $(seq 100); do
      cli -p $((base + i)) ping 2>/dev/null | grep -q PONG && break
      sleep 0.1
    done
  done
  # shellcheck disable=SC2086
  cli --cluster create $addrs --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 || {
    echo "redis-cli --cluster create failed:" >&2; cat "$dir/create.log" >&2; stop; exit 1; }
  for _ in $(seq 300); do
    ok=1
    for i in 0 1 2 3 4 5; do
      cli -p $((base + i)) cluster info 2>/dev/null | grep -q "cluster_state:ok" || { ok=0; break; }
    done
    [ $ok = 1 ] && break
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "cluster on port $base did not reach cluster_state:ok" >&2; stop; exit 1; }
  echo "127.0.0.1:$base"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
