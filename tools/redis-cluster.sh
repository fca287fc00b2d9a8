#!/usr/bin/env bash
# A throw-away Redis Cluster on loopback for tests and benchmarks.
#
#   tools/redis-cluster.sh start DIR [base_port] [password]
#       3 masters + 3 replicas on 127.0.0.1:base_port..base_port+5 (default
#       7000; cluster bus on port+10000), data and pid files under DIR.  Waits
#       for every node to answer PING, creates the cluster (retried up to 3
#       times, the nodes reset in between), waits until every node reports
#       cluster_state:ok with all 16384 slots assigned and ok and all 6 nodes
#       known, then prints the seed address (127.0.0.1:base_port).  With a password: requirepass +
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
  # every node must answer PING before the cluster is made of them (under
  # load a node was once not listening yet when create ran)
  for i in 0 1 2 3 4 5; do
    up=0
    for _ in $(seq 300); do
      cli -p $((base + i)) ping 2>/dev/null | grep -q PONG && { up=1; break; }
      sleep 0.1
    done
    [ $up = 1 ] || { echo "node 127.0.0.1:$((base + i)) does not answer PING (see $dir/$((base + i))/redis.log)" >&2
                     stop; exit 1; }
  done
  # create, retried: redis-cli --cluster create once crashed (SIGSEGV)
  # under load; a failed attempt may leave slots assigned or nodes met, so
  # every node is emptied and reset before the next one
  created=0
  for attempt in 1 2 3; do
    # shellcheck disable=SC2086
    if cli --cluster create $addrs --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1; then
      created=1
      break
    fi
    cat "$dir/create.log" >>"$dir/create-failures.log"
    for i in 0 1 2 3 4 5; do
      cli -p $((base + i)) flushall >/dev/null 2>&1 || true
      cli -p $((base + i)) cluster reset hard >/dev/null 2>&1 || true
    done
    sleep "$attempt"
  done
  [ $created = 1 ] || { echo "redis-cli --cluster create failed 3 times:" >&2; cat "$dir/create-failures.log" >&2
                        stop; exit 1; }
  # ready when every node says so: cluster_state:ok, all 16384 slots
  # assigned and served, all 6 nodes known (so that a redirect never names a
  # node another one has not met yet)
  ok=0
  for _ in $(seq 600); do
    ok=1
    for i in 0 1 2 3 4 5; do
      info=$(cli -p $((base + i)) cluster info 2>/dev/null || true)
      case "$info" in *cluster_state:ok*) ;; *) ok=0; break ;; esac
      for want in cluster_slots_assigned:16384 cluster_slots_ok:16384 cluster_known_nodes:6; do
        case "$info" in *"$want"*) ;; *) ok=0; break 2 ;; esac
      done
    done
    [ $ok = 1 ] && break
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "cluster on port $base did not reach cluster_state:ok with every slot covered on every node" >&2
                   stop; exit 1; }
  echo "127.0.0.1:$base"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
