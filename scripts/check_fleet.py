#!/usr/bin/env python3
"""Checks the fleet simulation's figures (CI): reads `fleet --json` on stdin and fails unless the in-process rows
admit about instances x limit and the Redis rows (with and without token leases) about limit, as the README
promises.

  cargo run --release --example fleet -- --json ... | python3 scripts/check_fleet.py [--tolerance 0.15]

A run that cannot show it also fails: Redis rows missing, requests that failed or were never sent, or a baseline
(no limiter) that did not get the offered load through (then every other row is starved, not limited).

`fleet --scenario flood --json` is checked for what its limiters may admit at most: every round of every limited
row within the bound the simulation derives from its own limiters and the span of its decisions (no tolerance: a
single request over it fails), with requests refused (a flood that never reached the limit tests nothing), no
failed answers, every store's rows there, and every key the README's table is read from present.
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

    if run.get("scenario") == "flood":
        check_flood(run)
        return
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


FLOOD_KEYS = ["design", "state", "deny_cache", "limit", "admitted_per_s", "served_per_s", "served_per_s_lowest",
              "served_per_s_highest", "vs_in_process", "vs_in_process_lowest", "vs_in_process_highest", "served",
              "failed", "redis_calls", "redis_calls_per_s", "redis_calls_per_decision", "over_bound", "per_round"]
FLOOD_ROUND_KEYS = ["admitted_per_s", "served_per_s", "vs_in_process", "admitted_in_run", "most_admissible"]
FLOOD_STATES = ["-", "in-process", "Redis", "Redis, no deny cache", "Redis + leases"]


def check_flood(run):
    problems, seen = [], set()
    missing = [k for k in ["instances", "limit", "connections", "duration_s", "warmup_s", "rounds", "rows"]
               if k not in run]
    if missing:
        sys.exit(f"check_fleet: FAILED\n  flood JSON without {', '.join(missing)}")
    if run.get("redis_error"):
        problems.append(f"no Redis rows: {run['redis_error']}")
    for row in run["rows"]:
        missing = [k for k in FLOOD_KEYS if k not in row]
        missing += [f"per_round.{k}" for r in row.get("per_round", []) for k in FLOOD_ROUND_KEYS if k not in r]
        name = f"{row.get('design')}, {row.get('state')}"
        if missing:
            problems.append(f"{name}: no {', '.join(sorted(set(missing)))}")
            continue
        seen.add(row["state"])
        if len(row["per_round"]) != run["rounds"]:
            problems.append(f"{name}: {len(row['per_round'])} rounds, the run says {run['rounds']}")
        if row["failed"]:
            problems.append(f"{name}: {row['failed']} answers neither 200 nor 429")
        if row["state"] == "-":
            continue
        for i, r in enumerate(row["per_round"]):
            admitted, most = r["admitted_in_run"], r["most_admissible"]
            verdict = "ok" if most is not None and admitted <= most else "OVER THE BOUND"
            print(f"check_fleet: flood {name:<36} round {i + 1}: admitted {admitted:6} in the run, at most {most}: "
                  f"{verdict}")
            if verdict != "ok":
                problems.append(f"{name}, round {i + 1}: admitted {admitted}, at most {most}")
            if r["served_per_s"] <= r["admitted_per_s"]:
                problems.append(f"{name}, round {i + 1}: nothing refused, the flood did not reach the limit")
    for state in FLOOD_STATES:
        if state not in seen:
            problems.append(f"no {state} row")
    sys.stdout.flush()
    if problems:
        sys.exit("check_fleet: FAILED\n  " + "\n  ".join(problems))
    print("check_fleet: flood: no row admitted over its bound, every key present")


if __name__ == "__main__":
    main()
