#!/usr/bin/env bash
# One client floods one example server: how many requests per second the server answers (nearly all of them
# refusals) on the in-process store and on Redis with the deny cache on, in interleaved rounds, measured from
# outside with wrk.
#
#   scripts/one-key-flood.sh [ROUNDS] [SECONDS] [CONNECTIONS] [PERIOD]
#
# Defaults: 3 rounds of 3 s, 16 connections, a limit of 100 per PERIOD = 1s.
#
# Needs wrk and redis-server; starts a private Redis and both servers, and stops them on exit.
set -euo pipefail
rounds=${1:-3}
seconds=${2:-3}
connections=${3:-16}
period=${4:-1s}
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "one-key-flood.sh: wrk is needed (apt-get install wrk)" >&2; exit 2; }
cargo build -q --release --example axum_server
bin=target/release/examples/axum_server
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
redis_port=6497
redis-server --port "$redis_port" --save '' --appendonly no --dir "$dir" --daemonize no >"$dir/redis.log" 2>&1 &
pids+=($!)
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
"$bin" --addr 127.0.0.1:3197 --limit 100 --period "$period" >"$dir/memory.log" 2>&1 &
pids+=($!)
"$bin" --addr 127.0.0.1:3198 --limit 100 --period "$period" --redis-url "redis://127.0.0.1:$redis_port" \
  --deny-cache on >"$dir/redis.log" 2>&1 &
pids+=($!)
for port in 3197 3198; do
  until curl -s -o /dev/null "http://127.0.0.1:$port/health"; do sleep 0.1; done
done
echo "# 100 per $period, $connections connections, $rounds rounds of ${seconds}s; load average before:" \
  "$(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"
printf '%-6s %-22s %12s\n' round store requests/s
for round in $(seq 1 "$rounds"); do
  for store in in-process redis+deny-cache; do
    port=3197; [ "$store" = in-process ] || port=3198
    rps=$(wrk -t1 -c"$connections" -d"${seconds}s" "http://127.0.0.1:$port/" | awk '/Requests\/sec/ {print $2}')
    printf '%-6s %-22s %12s\n' "$round" "$store" "$rps"
    echo "$store $rps" >>"$dir/rows"
  done
done
awk '
  $1 == "in-process" { m[++i] = $2 }
  $1 != "in-process" { r[++j] = $2 }
  END {
    for (k = 1; k <= i; k++) { q[k] = r[k] / m[k] }
    n = asort(q)
    printf "redis+deny-cache / in-process, per round: median %.3f (range %.3f-%.3f, %d rounds)\n", q[int((n + 1) / 2)], q[1], q[n], n
  }' "$dir/rows"
