#!/usr/bin/env bash
# The README's fleet simulation, run as CI runs it (REDIS_URL must answer: scripts/test.sh sees to that), with its
# figures checked by check_fleet.py: the in-process rows admit about N x limit, the Redis rows about limit. Then
# the flood (--scenario flood), short: no row may admit more than its limiters can give over its run.
set -euo pipefail
cd "$(dirname "$0")/.."

# The shortest honest run: 2 s measured per design (over 1 s a window-aligned counter loses up to 10 % to a
# loaded machine's jitter), after a warm-up that spends each instance's first burst (or the in-process token
# bucket admits that burst on top of its rate): a bucket of `limit` tokens receiving offered/N - limit more than
# it refills per second is spent in 50 / (150 - 50) = 0.5 s here; 1 s leaves room (the default limit of 100 at
# the same load per instance would need 2 s). The debug build test.sh made (its features, so nothing is built
# again): at 600 requests per second it offers the load on time, and its figures match a release build's within
# a few percent (the README's own run is the release build, at a higher load).
# Its progress line (stderr) is shown only when the run fails.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo build --quiet --workspace --all-features --example fleet
fleet="${CARGO_TARGET_DIR:-target}/debug/examples/fleet"
if ! out="$("$fleet" --limit 50 --offered 600 --warmup 1s --duration 2s --json 2>"$log")"; then
  cat "$log" >&2
  echo "check-fleet: the fleet simulation failed" >&2
  exit 1
fi
echo "$out" | python3 scripts/check_fleet.py

# The flood's bound is exact whatever the run's length (burst + rate × the span of the run's decisions, or the
# limit per window the span touches), so the shortest run the simulation takes is enough: 500 ms of warm-up and
# 500 ms measured per design, one round, 8 connections (2 per instance).
if ! out="$("$fleet" --scenario flood --limit 50 --warmup 500ms --duration 500ms --connections 8 --json \
  2>"$log")"; then
  cat "$log" >&2
  echo "check-fleet: the fleet flood failed" >&2
  exit 1
fi
echo "$out" | python3 scripts/check_fleet.py
