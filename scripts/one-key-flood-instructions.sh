#!/usr/bin/env bash
# Instructions per request the example server spends under a one-key flood (nearly every request refused), on
# the in-process store and on Redis with the deny cache on: the server runs under callgrind, wrk warms it up,
# the counters are zeroed, then wrk floods it for a few seconds; the server's instructions (every thread) ÷ the
# requests wrk counted.
#
#   scripts/one-key-flood-instructions.sh [PERIOD]      # a limit of 100 per PERIOD (default 1m)
#
# Under callgrind the server answers 1-2 thousand requests a second, so the store calls of a fast-refilling
# limit (100 per 1s: a token every 10 ms) weigh 20-40 x more per request than at full speed; a long period keeps
# them out and leaves the refusal path.
set -euo pipefail
period=${1:-1m}
cd "$(dirname "$0")/.."
for tool in wrk valgrind callgrind_control redis-server; do
  command -v "$tool" >/dev/null || { echo "one-key-flood-instructions.sh: $tool is needed" >&2; exit 2; }
done
cargo build -q --release --example axum_server
bin=$PWD/target/release/examples/axum_server
dir=$(mktemp -d)
redis_port=6498
port=3199
trap 'redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
redis-server --port "$redis_port" --save '' --appendonly no --dir "$dir" --daemonize yes --logfile "$dir/redis.log"
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

# Prints the instructions per request of the server started with the flags given.
measure() {
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" "$bin" --addr "127.0.0.1:$port" --limit 100 \
    --period "$period" "$@" >"$dir/server.log" 2>&1 &
  local vpid=$!
  until curl -s -o /dev/null "http://127.0.0.1:$port/health"; do sleep 0.3; done
  wrk -t1 -c4 -d2s "http://127.0.0.1:$port/" >/dev/null
  callgrind_control -z "$vpid" >/dev/null 2>&1
  local n
  n=$(wrk -t1 -c4 -d6s "http://127.0.0.1:$port/" | awk '/requests in/ {print $1}')
  callgrind_control -d "$vpid" >/dev/null 2>&1
  kill -INT "$vpid"; sleep 0.5; kill "$vpid" 2>/dev/null || true; wait "$vpid" 2>/dev/null || true
  local total
  total=$(grep -hE '^(summary|totals):' "$dir"/cg.out.* | head -1 | awk '{print $2}')
  rm -f "$dir"/cg.out*
  echo $((total / n))
}

echo "# 100 per $period; commit $(git rev-parse --short HEAD); instructions per request, the server's threads"
memory=$(measure)
redis=$(measure --redis-url "redis://127.0.0.1:$redis_port" --deny-cache on)
printf '%-22s %10s\n' in-process "$memory" redis+deny-cache "$redis"
awk -v m="$memory" -v r="$redis" 'BEGIN { printf "in-process / redis+deny-cache: %.3f\n", m / r }'
