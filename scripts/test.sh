#!/usr/bin/env bash
# Runs every tollgate test against real servers. On a machine without redis-server it installs it (Debian/Ubuntu,
# apt-get); with no Redis reachable at REDIS_URL (default redis://127.0.0.1:6379) it starts a private one for the
# run. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "test.sh: redis-server/redis-cli not found; installing them with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi

if [ -z "${REDIS_URL:-}" ]; then
  export REDIS_URL="redis://127.0.0.1:6379"
  if ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
    dir="$(mktemp -d)"
    port=6399
    while redis-cli -p "$port" ping >/dev/null 2>&1; do port=$((port + 1)); done
    redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --daemonize yes \
      --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
    trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; rm -rf "$dir"' EXIT
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    export REDIS_URL="redis://127.0.0.1:$port"
    echo "test.sh: no Redis on 127.0.0.1:6379; started a private one at $REDIS_URL" >&2
  fi
elif ! redis-cli -u "$REDIS_URL" ping >/dev/null 2>&1; then
  echo "test.sh: REDIS_URL=$REDIS_URL is set but does not answer PING" >&2
  exit 1
fi

cargo test --workspace --all-features "$@"
