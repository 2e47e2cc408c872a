#!/usr/bin/env python3
"""Checks the fleet simulation's figures (CI): reads `fleet --json` on stdin and fails unless the in-process rows
admit about instances x limit and the Redis rows (with and without token leases) about limit, as the README
promises.

  cargo run --release --example fleet -- --json ... | python3 scripts/check_fleet.py [--tolerance 0.15]

A run that cannot show it also fails: Redis rows missing, requests that failed or were never sent, or a baseline
(no limiter) that did not get the offered load through (then every other row is starved, not limited).
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # A release build on an idle machine lands within 2 % (the token bucket exactly, the sliding window a request or
    # two under); a loaded one, within 10 %. N x limit and limit are N times apart.
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="largest relative deviation from the expected admitted rate (default 0.15)")
    tolerance = parser.parse_args().tolerance
    try:
        run = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        sys.exit(f"check_fleet: stdin is not the JSON of `fleet --json`: {e}")

    n, limit, offered = run["instances"], run["limit"], run["offered_per_s"]
    expected = {"-": offered, "in-process": n * limit, "Redis": limit, "Redis + leases": limit}
    problems, seen = [], set()
    if run.get("redis_error"):
        problems.append(f"no Redis rows: {run['redis_error']}")
    for row in run["rows"]:
        state, admitted = row["state"], row["admitted_per_s"]
        name = f"{row['design']}, {state}"
        seen.add(state)
        if row["failed"] or row["not_sent"]:
            problems.append(f"{name}: {row['failed']} failed, {row['not_sent']} not sent")
        want = expected[state]
        # The baseline only has to get the load through; a limited row must be near its expected rate.
        low, high = want * (1 - tolerance), (want * (1 + tolerance) if state != "-" else float("inf"))
        verdict = "ok" if low <= admitted <= high else "WRONG"
        print(f"check_fleet: {name:<36} admitted {admitted:8.1f}/s, expected {want} (within {tolerance:.0%}): {verdict}")
        if verdict != "ok":
            problems.append(f"{name}: admitted {admitted:.1f}/s, expected {want}/s within {tolerance:.0%}")
    for state in expected:
        if state not in seen:
            problems.append(f"no {state} row")
    sys.stdout.flush()
    if problems:
        sys.exit("check_fleet: FAILED\n  " + "\n  ".join(problems))
    print(f"check_fleet: in-process ~ {n} x {limit}, Redis ~ {limit}: as promised")


if __name__ == "__main__":
    main()
