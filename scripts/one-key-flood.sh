#!/usr/bin/env bash
# One client floods one example server: how many requests per second the server answers (nearly all of them
# refusals) on the in-process store and on Redis with the deny cache on, in interleaved rounds, measured from
# outside with wrk, and the server's own CPU time per request answered (from /proc: on a VM whose speed varies from
# second to second, the time a request costs the server varies less than the rate a client gets).
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
memory_pid=$!
"$bin" --addr 127.0.0.1:3198 --limit 100 --period "$period" --redis-url "redis://127.0.0.1:$redis_port" \
  --deny-cache on >"$dir/redis.log" 2>&1 &
pids+=($!)
redis_server_pid=$!
# A process's user + system CPU time, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
for port in 3197 3198; do
  until curl -s -o /dev/null "http://127.0.0.1:$port/health"; do sleep 0.1; done
done
echo "# 100 per $period, $connections connections, $rounds rounds of ${seconds}s; load average before:" \
  "$(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"
printf '%-6s %-22s %12s %14s\n' round store requests/s server_cpu_us
# Each round starts with the store the last one ended with (in-process, Redis, Redis, in-process, ...): neither
# is always first after a pause, nor always second after the other's load.
for round in $(seq 1 "$rounds"); do
  order="in-process redis+deny-cache"
  [ $((round % 2)) -eq 0 ] && order="redis+deny-cache in-process"
  for store in $order; do
    port=3197 pid=$memory_pid
    [ "$store" = in-process ] || { port=3198; pid=$redis_server_pid; }
    before=$(cpu_ticks "$pid")
    out=$(wrk -t1 -c"$connections" -d"${seconds}s" "http://127.0.0.1:$port/")
    after=$(cpu_ticks "$pid")
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    answered=$(echo "$out" | awk '/requests in/ {print $1}')
    cpu_us=$(awk -v t="$((after - before))" -v u="$tick_us" -v n="$answered" 'BEGIN { printf "%.2f", t * u / n }')
    printf '%-6s %-22s %12s %14s\n' "$round" "$store" "$rps" "$cpu_us"
    echo "$store $rps $cpu_us" >>"$dir/rows"
  done
done
awk '
  function summary(what, q,   n) {
    n = asort(q)
    printf "%s, per round: median %.3f (quartiles %.3f-%.3f; range %.3f-%.3f; %d rounds)\n", what, q[int((n + 1) / 2)], q[int((n + 3) / 4)], q[n + 1 - int((n + 3) / 4)], q[1], q[n], n
  }
  $1 == "in-process" { m[++i] = $2; mc[i] = $3 }
  $1 != "in-process" { r[++j] = $2; rc[j] = $3 }
  END {
    for (k = 1; k <= i; k++) { q[k] = r[k] / m[k]; c[k] = mc[k] / rc[k] }
    summary("redis+deny-cache / in-process, requests/s", q)
    summary("in-process / redis+deny-cache, server CPU per request", c)
  }' "$dir/rows"
