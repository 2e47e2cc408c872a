#!/usr/bin/env bash
# The README's fleet simulation, run as CI runs it (REDIS_URL must answer: scripts/test.sh sees to that), with its
# figures checked by check_fleet.py: the in-process rows admit about N x limit, the Redis rows about limit.
set -euo pipefail
cd "$(dirname "$0")/.."

# The shortest honest run: 1 s measured per design, after a warm-up that spends each instance's first burst (or
# the in-process token bucket admits that burst on top of its rate): a bucket of `limit` tokens receiving
# offered/N - limit more than it refills per second is spent in 50 / (150 - 50) = 0.5 s here; 1 s leaves room. The
# default limit of 100 at the same load per instance would need 2 s more in all. A release build: a debug one
# is too slow to offer the load on time, and its figures are off.
out="$(cargo run --quiet --release --example fleet -- --limit 50 --offered 600 --warmup 1s --duration 1s --json)"
echo "$out" | python3 scripts/check_fleet.py
