#!/usr/bin/env bash
# Runs every tollgate test against real servers. On a machine without redis-server it installs it (Debian/Ubuntu,
# apt-get); with no Redis reachable at REDIS_URL (default redis://127.0.0.1:6379) it starts a private one for the
# run. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the tests run besides cargo: redis-server and redis-cli, redis-sentinel (the Sentinel failover tests), and
# the `kill` program (procps) that pauses and resumes private servers (minimal images have only the shell's
# builtin).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 \
  || ! command -v redis-sentinel >/dev/null 2>&1 || ! type -P kill >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: redis-server, redis-cli, redis-sentinel and procps's kill are needed; install them (e.g." \
      "brew install redis, dnf install redis procps-ng) and run again" >&2
    exit 1
  fi
  echo "test.sh: installing redis-server, redis-sentinel, redis-tools and procps with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-sentinel redis-tools procps \
    >/dev/null
fi

# PONG within 5 s, or not a usable Redis (a silent port would hang redis-cli; one needing a password says NOAUTH).
answers() {
  [ "$(timeout 5 redis-cli "$@" ping 2>/dev/null)" = "PONG" ]
}

if [ -z "${REDIS_URL:-}" ]; then
  export REDIS_URL="redis://127.0.0.1:6379"
  if ! answers -u "$REDIS_URL"; then
    dir="$(mktemp -d)"
    trap 'kill "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$dir"' EXIT
    started=""
    for port in $(seq 6399 6420); do
      # --daemonize returns before the server binds: it has started only if it answers PING.
      redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --daemonize yes \
        --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" || continue
      for _ in $(seq 50); do answers -p "$port" && break; sleep 0.1; done
      # Another Redis may have been on that port already: ours is the one whose pid the pidfile names.
      if [ -s "$dir/redis.pid" ] && answers -p "$port" \
        && [ "$(timeout 5 redis-cli -p "$port" info server | tr -d '\r' | sed -n 's/^process_id://p')" = \
          "$(cat "$dir/redis.pid")" ]; then
        started="$port"
        break
      fi
      kill "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null || true
      rm -f "$dir/redis.pid"
    done
    if [ -z "$started" ]; then
      echo "test.sh: no Redis on 127.0.0.1:6379, and a private one did not start; its log:" >&2
      cat "$dir/redis.log" >&2 2>/dev/null || true
      exit 1
    fi
    export REDIS_URL="redis://127.0.0.1:$started"
    echo "test.sh: no Redis on 127.0.0.1:6379; started a private one at $REDIS_URL" >&2
  fi
elif ! answers -u "$REDIS_URL"; then
  echo "test.sh: REDIS_URL=$REDIS_URL is set but does not answer PING with PONG within 5 s" >&2
  exit 1
fi

# The black-box tests run the example binaries from target/debug/examples. `cargo test` builds an example there
# only when its own tests are off (`test = true` examples such as fleet are built as test harnesses instead), so
# build them all first: on a clean clone the fleet binary would otherwise be missing.
cargo build --workspace --all-features --examples
cargo test --workspace --all-features "$@"

# CI (.ci/run) also runs the fleet simulation on the same Redis, the README's main command, and checks its figures.
if [ -n "${TOLLGATE_FLEET_CHECK:-}" ]; then
  ./scripts/check-fleet.sh
fi
