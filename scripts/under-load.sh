#!/usr/bin/env bash
# A rate limiter must never be slower or less reliable than the resource it protects: builds the axum_server and
# under_load examples (release) and runs under_load, which starts a private redis-server and a fresh axum_server per
# case, loads it, and prints a table and the goals (PASS/FAIL). See examples/under_load/main.rs.
#
#   scripts/under-load.sh [SCENARIO ...] [FLAGS]
#
# Scenarios (default: all): one-conn (a), many-conns (b), latency (c), redis-busy (d). Flags go to under_load
# (--quick, --requests N, --json, --check, ...; --help lists them). Exit status: under_load's (1 with --check when a
# goal fails); 2 for a missing redis-server or an unknown scenario.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null ||
  { echo "under-load.sh: redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server)" >&2; exit 2; }

# The scenarios are the words that are neither flags nor a flag's value: checked here, before a build of minutes.
takes_value=" --requests --connections --phase --recovery-window --health-every --server --server-log --log-dir"
takes_value+=" --on-store-error "
has_server=false
expect_value=false
for arg in "$@"; do
  if $expect_value; then
    expect_value=false
    continue
  fi
  case "$arg" in
    --server | --server=*) has_server=true ;;
  esac
  case "$arg" in
    --*=*) ;;
    -*) [[ "$takes_value" == *" $arg "* ]] && expect_value=true ;;
    one-conn | many-conns | latency | redis-busy | a | b | c | d) ;;
    *)
      echo "under-load.sh: unknown scenario \"$arg\" (expected one-conn, many-conns, latency or redis-busy)" >&2
      exit 2
      ;;
  esac
done

cargo build --release --example under_load --example axum_server
bin="${CARGO_TARGET_DIR:-target}/release/examples"
server=()
$has_server || server=(--server "$bin/axum_server")
exec "$bin/under_load" "${server[@]}" "$@"
