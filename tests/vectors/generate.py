#!/usr/bin/env python3
"""Writes decisions.json: the shared decision vectors for every tollgate store.

The expected decisions come from this file's own reference model, written from the textbook definitions in
exact rational arithmetic (fractions.Fraction) and searching for retry instants instead of using closed forms,
so it shares no formula with the Rust or Lua implementations it checks. Run: python3 tests/vectors/generate.py
"""
import copy
import json
import random
from fractions import Fraction
from math import ceil, floor
from pathlib import Path

T0 = 1_700_000_000_000_000  # a whole second (and hour) since the epoch, in µs
S = 1_000_000
MAX_SCALED = 1 << 52


class TokenBucket:
    """tokens(t) = min(burst, tokens0 + (t - t0) * limit / period); a bucket starts full."""

    def __init__(self, limit, period, burst):
        self.limit, self.period, self.burst = limit, period, burst
        self.keys = {}

    def tokens(self, key, t):
        if key not in self.keys:
            return Fraction(self.burst)
        tokens, t0 = self.keys[key]
        return min(Fraction(self.burst), tokens + Fraction((t - t0) * self.limit, self.period))

    def full_at(self, tokens, t):
        return t + ceil((self.burst - tokens) * Fraction(self.period, self.limit))

    def decide(self, key, t, cost):
        tokens = self.tokens(key, t)
        # In debt (a charge after the response overdrew the bucket) no whole token remains.
        if cost > self.burst:
            return ("cost_exceeds_capacity", max(0, floor(tokens)), self.full_at(tokens, t), None)
        if tokens >= cost:
            tokens -= cost
            self.keys[key] = (tokens, t)
            return ("allowed", floor(tokens), self.full_at(tokens, t), None)
        # The earliest whole microsecond at which `cost` tokens are there.
        wait = ceil((cost - tokens) * Fraction(self.period, self.limit))
        assert self.tokens(key, t + wait) >= cost and self.tokens(key, t + wait - 1) < cost
        return ("limited", max(0, floor(tokens)), self.full_at(tokens, t), wait)

    def charge(self, key, t, delta, decided_at):
        """Cost after the response: the content may go down to -burst (debt), and a refund fills to burst at most."""
        tokens = self.tokens(key, t)
        tokens = max(tokens - delta, -self.burst) if delta >= 0 else min(tokens - delta, self.burst)
        self.keys[key] = (tokens, t)


class SlidingWindow:
    """estimate = current + previous * (1 - elapsed / period), windows aligned to the epoch, elapsed in ticks."""

    def __init__(self, limit, period):
        self.limit, self.period = limit, period
        self.tick = next(t for t in (1, 1000, S) if period % t == 0 and limit * (period // t) <= MAX_SCALED)
        self.keys = {}

    def counts(self, key, t):
        start = t - t % self.period
        ws, prev, cur = self.keys.get(key, (start, 0, 0))
        if ws == start:
            return start, prev, cur
        if ws + self.period == start:
            return start, cur, 0
        return start, 0, 0

    def estimate(self, key, t, extra_current=0):
        start, prev, cur = self.counts(key, t)
        ticks = self.period // self.tick
        elapsed = (t - start) // self.tick
        return cur + extra_current + prev * Fraction(ticks - elapsed, ticks)

    def reset(self, start, prev, cur, t):
        return start + 2 * self.period if cur else (start + self.period if prev else t)

    def charge(self, key, t, delta, decided_at):
        """Cost after the response: the count may go up to 2 * limit (debt); a refund gives back only what the
        window the request was decided in still holds, and nothing once that window left the estimate."""
        start, prev, cur = self.counts(key, t)
        if delta >= 0:
            cur = min(cur + delta, 2 * self.limit)
        else:
            decided = decided_at - decided_at % self.period
            if decided == start:
                cur -= min(-delta, cur)
            elif decided + self.period == start:
                prev -= min(-delta, prev)
        self.keys[key] = (start, prev, cur)

    def admits(self, key, t, cost):
        return self.estimate(key, t) + cost <= self.limit

    def decide(self, key, t, cost):
        start, prev, cur = self.counts(key, t)
        if cost <= self.limit and self.admits(key, t, cost):
            self.keys[key] = (start, prev, cur + cost)
            est = self.estimate(key, t)
            return ("allowed", max(0, floor(self.limit - est)), self.reset(start, prev, cur + cost, t), None)
        est = self.estimate(key, t)
        remaining = max(0, floor(self.limit - est))
        if cost > self.limit:
            return ("cost_exceeds_capacity", remaining, self.reset(start, prev, cur, t), None)
        # Admission can only change at tick boundaries, and only towards "admitted" as time passes: binary search
        # for the first boundary after the current tick.
        lo, hi = (t - start) // self.tick, 2 * (self.period // self.tick)
        assert not self.admits(key, start + lo * self.tick, cost) and self.admits(key, start + hi * self.tick, cost)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.admits(key, start + mid * self.tick, cost):
                hi = mid
            else:
                lo = mid
        hi = start + hi * self.tick
        return ("limited", remaining, self.reset(start, prev, cur, t), hi - t)


class FixedWindow:
    """At most `limit` per window, windows aligned to the epoch; only admissions count; a refusal waits for the
    next window (envoyproxy/ratelimit's counting, refused requests aside)."""

    def __init__(self, limit, period):
        self.limit, self.period = limit, period
        self.keys = {}

    def count(self, key, t):
        start = t - t % self.period
        ws, n = self.keys.get(key, (start, 0))
        return start, (n if ws == start else 0)

    def decide(self, key, t, cost):
        start, n = self.count(key, t)
        end = start + self.period
        if cost > self.limit:
            return ("cost_exceeds_capacity", self.limit - n, end if n else t, None)
        if n + cost <= self.limit:
            self.keys[key] = (start, n + cost)
            n += cost
            return ("allowed", self.limit - n, end if n else t, None)
        return ("limited", self.limit - n, end, end - t)


class Store:
    """A model with the store operations: peeks (decide, keep nothing) and lockouts (after a denial, refuse the
    key until a fixed instant: remaining 0, reset and retry no earlier than its end; refusals spend nothing)."""

    def __init__(self, model, lockout):
        self.model, self.lockout, self.locked_until = model, lockout, {}

    def decide(self, key, t, cost, peek):
        saved = copy.deepcopy(self.model.keys)
        outcome, remaining, reset, retry = self.model.decide(key, t, cost)
        until = self.locked_until.get(key, 0) if self.lockout else 0
        if peek or until > t:
            self.model.keys = saved
        if outcome == "cost_exceeds_capacity":
            return outcome, remaining, reset, retry
        if until > t:
            return "limited", 0, max(reset, until), max(retry or 0, until - t)
        if outcome == "limited" and self.lockout:
            until = t + self.lockout
            if not peek:
                self.locked_until[key] = until
            return "limited", 0, max(reset, until), max(retry, self.lockout)
        return outcome, remaining, reset, retry

    def charge(self, key, t, delta, decided_at):
        """Applies a charge, then reports what a request of cost 0 gets (a debt starts no lockout)."""
        self.model.charge(key, t, delta, decided_at)
        saved = copy.deepcopy(self.model.keys)
        outcome, remaining, reset, retry = self.model.decide(key, t, 0)
        self.model.keys = saved
        until = self.locked_until.get(key, 0) if self.lockout else 0
        if until > t:
            return "limited", 0, max(reset, until), max(retry or 0, until - t)
        return outcome, remaining, reset, retry


def run(name, algorithm, limit, period, steps, burst=None, lockout=0):
    models = {"token_bucket": lambda: TokenBucket(limit, period, burst or limit),
              "sliding_window": lambda: SlidingWindow(limit, period), "fixed_window": lambda: FixedWindow(limit, period)}
    model = models[algorithm]()
    store = Store(model, lockout)
    out = []
    for at, key, cost, *extra in steps:
        peek = bool(extra and extra[0] is True)
        charged = extra[0] if extra and isinstance(extra[0], tuple) else None
        if charged:
            outcome, remaining, reset, retry = store.charge(key, at, *charged)
        else:
            outcome, remaining, reset, retry = store.decide(key, at, cost, peek)
        step = {"at_us": at, "key": key, "cost": cost, "outcome": outcome, "remaining": remaining, "reset_us": reset}
        if retry is not None:
            step["retry_after_us"] = retry
        if peek:
            step["peek"] = True
        if charged:
            step["charge"], step["decided_at_us"] = charged
        out.append(step)
    case = {"name": name, "algorithm": algorithm, "limit": limit, "period_us": period, "steps": out}
    if burst is not None:
        case["burst"] = burst
    if lockout:
        case["lockout_us"] = lockout
    return case


def peek(t, key="a", cost=1):
    return (t, key, cost, True)


def charge(t, delta, decided_at, key="a"):
    """A charge (delta > 0) or refund (delta < 0) after the response of a request decided at `decided_at`."""
    return (t, key, 0, (delta, decided_at))


def same(t, n, key="a", cost=1):
    return [(t, key, cost)] * n


def random_steps(seed, n, span, max_cost, keys):
    rng = random.Random(seed)
    t = T0 + rng.randrange(span)
    steps = []
    for _ in range(n):
        t += int(rng.expovariate(1 / span)) if rng.random() < 0.7 else 0
        steps.append((t, rng.choice(keys), rng.randint(0, max_cost) or 1))
    return steps


def cases():
    tb, sw = "token_bucket", "sliding_window"
    yield run("tb: a fresh bucket admits its burst at once, then says when the next token comes", tb, 5, S, same(T0, 6))
    yield run("tb: one token refills after period/limit", tb, 5, S, same(T0, 6) + [(T0 + 200_000, "a", 1), (T0 + 200_000, "a", 1)])
    yield run("tb: a partial refill is not a token", tb, 5, S, same(T0, 5) + [(T0 + 100_000, "a", 1), (T0 + 199_999, "a", 1), (T0 + 200_000, "a", 1)])
    yield run("tb: burst after idle is by design", tb, 10, S, same(T0, 11) + same(T0 + 5 * S, 11))
    yield run("tb: burst smaller than the limit", tb, 10, S, same(T0, 3) + [(T0 + 100_000, "a", 1)] * 2, burst=2)
    yield run("tb: burst larger than the limit", tb, 1, S, same(T0, 6) + [(T0 + S, "a", 1), (T0 + S, "a", 1)], burst=5)
    yield run("tb: cost above one", tb, 5, S, [(T0, "a", 3), (T0, "a", 3), (T0 + 200_000, "a", 3), (T0 + 400_000, "a", 3)])
    yield run("tb: a cost above the burst can never succeed", tb, 5, S, [(T0, "a", 6), (T0, "a", 2), (T0, "a", 6)])
    yield run("tb: a cost equal to the burst", tb, 5, S, [(T0, "a", 5), (T0, "a", 5), (T0 + S, "a", 5)])
    yield run("tb: a rate that does not divide the period (3/s)", tb, 3, S, same(T0, 4) + [(T0 + 333_333, "a", 1), (T0 + 333_334, "a", 1), (T0 + 666_667, "a", 1), (T0 + 999_999, "a", 1), (T0 + S, "a", 1)])
    yield run("tb: 7 per 10 s with a burst of 3", tb, 7, 10 * S, same(T0, 4) + [(T0 + 1_428_571, "a", 1), (T0 + 1_428_572, "a", 1), (T0 + 4 * S, "a", 2)], burst=3)
    yield run("tb: more tokens per second than microseconds", tb, 10_000_000, S, [(T0, "a", 100), (T0, "a", 1), (T0 + 1, "a", 10), (T0 + 1, "a", 1), (T0 + 7, "a", 50)], burst=100)
    yield run("tb: 60 per minute", tb, 60, 60 * S, same(T0, 61) + [(T0 + S - 1, "a", 1), (T0 + S, "a", 1)])
    yield run("tb: GitHub's 5000 per hour", tb, 5000, 3600 * S, [(T0, "a", 4999), (T0, "a", 1), (T0, "a", 1), (T0 + 720_000, "a", 1)])
    yield run("tb: keys are independent", tb, 2, S, same(T0, 3, "a") + same(T0, 3, "b") + [(T0 + 500_000, "a", 1), (T0 + 500_000, "b", 1)])
    yield run("tb: retry exactly at retry_after is admitted", tb, 4, S, same(T0, 5) + [(T0 + 250_000, "a", 1), (T0 + 250_000, "a", 1), (T0 + 500_000, "a", 1)])
    yield run("tb: a cost of zero inspects without consuming", tb, 2, S, [(T0, "a", 0), (T0, "a", 1), (T0, "a", 0), (T0, "a", 1), (T0, "a", 0)])
    yield run("tb: days of idle refill to the burst, not beyond", tb, 3, S, same(T0, 4) + same(T0 + 3 * 86_400 * S, 4))
    yield run("tb: one per microsecond", tb, 1, 1, same(T0, 2) + same(T0 + 1, 2))
    yield run("tb: reset moves with consumption, not with time", tb, 10, S, [(T0, "a", 4), (T0 + 100_000, "a", 1), (T0 + 250_000, "a", 2), (T0 + 260_000, "a", 9)])
    yield run("tb: random traffic, 5 per second, burst 8", tb, 5, S, random_steps(1, 120, 150_000, 3, ["a", "b", "c"]), burst=8)
    yield run("tb: random traffic, 7 per 3 seconds", tb, 7, 3 * S, random_steps(2, 120, 400_000, 4, ["a", "b"]))

    m = 60 * S
    w0 = T0 - T0 % m
    yield run("sw: the seed's example (42 previous, 18 current, 15 s of 60: 49.5 + 1 > 50)", sw, 50, m, [(w0 + 30 * S, "a", 42), (w0 + m + 15 * S, "a", 18), (w0 + m + 15 * S, "a", 1)])
    yield run("sw: the seed's example admitted under a limit of 51 (50.5)", sw, 51, m, [(w0 + 30 * S, "a", 42), (w0 + m + 15 * S, "a", 18), (w0 + m + 15 * S, "a", 1), (w0 + m + 15 * S, "a", 1)])
    yield run("sw: fill a window, then wait for the next", sw, 3, S, same(T0, 4) + [(T0 + 500_000, "a", 1)])
    yield run("sw: the previous window's weight decays", sw, 4, S, same(T0 + 900_000, 4) + [(T0 + S, "a", 1), (T0 + S + 250_000, "a", 1), (T0 + S + 500_000, "a", 1), (T0 + S + 750_000, "a", 1), (T0 + S + 750_000, "a", 1)])
    yield run("sw: two idle windows forget everything", sw, 2, S, same(T0, 3) + same(T0 + 2 * S, 3))
    yield run("sw: exactly at the window boundary", sw, 2, S, same(T0 + S - 1, 3) + same(T0 + S, 2))
    yield run("sw: the last microsecond of a window", sw, 2, S, same(T0 + 999_999, 3))
    yield run("sw: retry later in the same window", sw, 10, S, [(T0, "a", 10), (T0 + S, "a", 1), (T0 + S + 100_000, "a", 1), (T0 + S + 100_000, "a", 1)])
    yield run("sw: retry in the next window", sw, 5, S, [(T0 + 100_000, "a", 4), (T0 + 200_000, "a", 2), (T0 + 300_000, "a", 1), (T0 + 400_000, "a", 1)])
    yield run("sw: cost above one and equal to the limit", sw, 6, S, [(T0, "a", 4), (T0, "a", 3), (T0 + S, "a", 6), (T0 + 2 * S, "a", 6)])
    yield run("sw: a cost above the limit can never succeed", sw, 6, S, [(T0, "a", 7), (T0, "a", 1), (T0, "a", 7)])
    yield run("sw: millisecond ticks for a large hourly limit", sw, 5_000_000, 3600 * S, [(T0, "a", 5_000_000), (T0 + 3600 * S + 1_234_567, "a", 2000), (T0 + 3600 * S + 1_234_999, "a", 1), (T0 + 3600 * S + 1_235_000, "a", 1)])
    yield run("sw: second ticks for a billion per day", sw, 1_000_000_000, 86_400 * S, [(T0 - T0 % (86_400 * S) + 86_400 * S - 1, "a", 999_999_999), (T0 - T0 % (86_400 * S) + 86_400 * S + 1_500_000, "a", 12), (T0 - T0 % (86_400 * S) + 86_400 * S + 1_500_000, "a", 1)])
    yield run("sw: keys are independent", sw, 2, S, same(T0, 3, "a") + same(T0, 3, "b"))
    yield run("sw: a cost of zero inspects without consuming", sw, 2, S, [(T0, "a", 0), (T0, "a", 2), (T0, "a", 0)])
    yield run("sw: retry exactly at retry_after is admitted", sw, 3, S, same(T0 + 600_000, 3) + [(T0 + S + 100_000, "a", 1), (T0 + S + 400_000, "a", 1), (T0 + S + 400_000, "a", 1)])
    yield run("sw: 100 per minute across several windows", sw, 100, m, [(w0 + i * 7_000_000, "a", 9) for i in range(30)])
    yield run("sw: random traffic, 6 per second", sw, 6, S, random_steps(3, 150, 120_000, 2, ["a", "b", "c"]))
    yield run("sw: random traffic, 20 per 2 seconds", sw, 20, 2 * S, random_steps(4, 150, 60_000, 5, ["a", "b"]))

    # Peeks: what a request would get, changing nothing (the next request decides as if the peek never happened).
    yield run("tb: a peek consumes nothing", tb, 2, S, [peek(T0), (T0, "a", 1), peek(T0), peek(T0, cost=2), (T0, "a", 1), peek(T0), peek(T0 + 250_000), (T0 + 250_000, "a", 1), peek(T0 + 500_000, cost=3)])
    yield run("sw: a peek consumes nothing", sw, 3, S, [peek(T0), (T0, "a", 2), peek(T0), peek(T0, cost=2), (T0, "a", 1), peek(T0 + S + 500_000), (T0 + S + 500_000, "a", 2), peek(T0 + S + 500_000, cost=4)])
    # Lockouts: after a denial the key is refused until a fixed instant; refusals neither extend it nor spend.
    yield run("tb: a denial locks the key for 5 s, refusals spend nothing", tb, 2, S, same(T0, 3) + [(T0 + S, "a", 1), peek(T0 + 2 * S), (T0 + 4 * S, "a", 2), (T0 + 5 * S - 1, "a", 1), (T0 + 5 * S, "a", 2), (T0 + 5 * S, "a", 1), (T0 + 5 * S, "a", 9), (T0 + 6 * S, "a", 1)], lockout=5 * S)
    yield run("tb: a lockout shorter than the refill: the retry is the refill's", tb, 1, 10 * S, same(T0, 2) + [(T0 + S, "a", 1), (T0 + 10 * S, "a", 1)], lockout=S)
    yield run("tb: a peek of a denial shows the lockout it would start, and starts none", tb, 1, S, [(T0, "a", 1), peek(T0 + 1), (T0 + S, "a", 1), (T0 + S, "b", 1), (T0 + S, "b", 1), (T0 + S + 1, "b", 1), peek(T0 + S + 2, "b")], lockout=30 * S)
    yield run("tb: a cost above the burst starts no lockout", tb, 3, S, [(T0, "a", 4), (T0, "a", 3), (T0, "a", 1), (T0 + S, "a", 4), (T0 + S, "a", 1), (T0 + 2 * S, "a", 1)], lockout=2 * S)
    yield run("sw: a denial locks the key for 90 s", sw, 3, 60 * S, [(w0, "a", 3), (w0 + S, "a", 1), (w0 + 61 * S, "a", 1), peek(w0 + 90 * S), (w0 + 91 * S, "a", 1), (w0 + 91 * S, "a", 1), (w0 + 91 * S, "b", 1)], lockout=90 * S)
    yield run("sw: random traffic under a lockout", sw, 4, S, random_steps(5, 120, 200_000, 2, ["a", "b"]), lockout=700_000)
    # Cost after the response: charges overdraw into a debt the key waits out; refunds never beyond full.
    yield run("tb: a charge after the response overdraws, the key waits until it is repaid", tb, 10, S, [(T0, "a", 1), charge(T0 + 1000, 14, T0), (T0 + 1000, "a", 1), (T0 + 500_000, "a", 1), (T0 + 600_000, "a", 1), (T0 + 600_000, "a", 1), peek(T0 + 600_000)])
    yield run("tb: a debt stops at minus the burst", tb, 2, S, [(T0, "a", 1), charge(T0, 50, T0), (T0, "a", 1), (T0 + 2 * S, "a", 1), (T0 + 2 * S + 1, "a", 1)])
    yield run("tb: a refund gives back tokens, never beyond full", tb, 4, S, [(T0, "a", 4), charge(T0 + 100_000, -3, T0), (T0 + 100_000, "a", 3), charge(T0 + 200_000, -3, T0), charge(T0 + 3 * S, -4, T0), (T0 + 3 * S, "a", 4), (T0 + 3 * S, "a", 1)])
    yield run("tb: a charge on a fresh key, and under a lockout", tb, 2, S, [charge(T0, 3, T0), (T0, "a", 1), (T0 + S, "a", 1), charge(T0 + S, 1, T0), (T0 + 2 * S, "a", 1)], lockout=10 * S)
    yield run("sw: a charge pushes the count above the limit until the windows decay", sw, 4, S, [(T0, "a", 1), charge(T0 + 1000, 6, T0), (T0 + 1000, "a", 1), (T0 + S, "a", 1), (T0 + S + 800_000, "a", 1), (T0 + 2 * S, "a", 1), charge(T0 + 2 * S, 20, T0 + 2 * S), peek(T0 + 2 * S)])
    yield run("sw: a refund comes from the request's own window, and only while it counts", sw, 4, S, [(T0 + 900_000, "a", 4), charge(T0 + 950_000, -2, T0 + 900_000), (T0 + 950_000, "a", 2), (T0 + S + 100_000, "a", 1), charge(T0 + S + 100_000, -3, T0 + 900_000), (T0 + S + 100_000, "a", 3), charge(T0 + 3 * S, -4, T0 + S + 100_000), (T0 + 3 * S, "a", 4), charge(T0 + 3 * S, -9, T0 + 3 * S), (T0 + 3 * S, "a", 4)])
    yield run("tb: random traffic under a lockout", tb, 3, S, random_steps(6, 120, 200_000, 2, ["a", "b"]), burst=4, lockout=1_500_000)

    # The fixed window (envoyproxy/ratelimit's counting): windows aligned to the epoch, a refusal waits for the next.
    fw = "fixed_window"
    yield run("fw: fill a window, then wait for the next", fw, 3, S, same(T0 + 400_000, 4) + [(T0 + 999_999, "a", 1), (T0 + S, "a", 3), (T0 + S, "a", 1)])
    yield run("fw: twice the limit across a boundary, which a sliding window refuses", fw, 5, S, same(T0 + 999_000, 5) + same(T0 + S, 6))
    yield run("fw: cost above one, equal to the limit, above it", fw, 6, S, [(T0, "a", 4), (T0, "a", 3), (T0, "a", 2), (T0 + S, "a", 6), (T0 + S, "a", 7), (T0 + 2 * S, "a", 7)])
    yield run("fw: a cost of zero inspects without consuming", fw, 2, S, [(T0, "a", 0), (T0, "a", 2), (T0, "a", 0), (T0 + S, "a", 0)])
    yield run("fw: a minute aligned to the minute, keys independent", fw, 2, m, [(w0 + 59 * S, "a", 2), (w0 + 59 * S, "a", 1), (w0 + 59 * S, "b", 1), (w0 + m, "a", 2)])
    yield run("fw: a day of 1000 and a gap of days", fw, 1000, 86_400 * S, [(T0, "a", 999), (T0, "a", 2), (T0 + 3 * 86_400 * S, "a", 1000)])
    yield run("fw: a peek consumes nothing", fw, 2, S, [peek(T0), (T0, "a", 2), peek(T0), peek(T0, cost=3), (T0 + S, "a", 1)])
    yield run("fw: a denial locks the key for 3 s", fw, 2, S, same(T0, 3) + [(T0 + S, "a", 1), peek(T0 + 2 * S), (T0 + 3 * S, "a", 1), (T0 + 3 * S, "b", 2), (T0 + 3 * S, "a", 9)], lockout=3 * S)
    yield run("fw: random traffic, 5 per second", fw, 5, S, random_steps(7, 150, 120_000, 3, ["a", "b", "c"]))
    yield run("fw: random traffic, 9 per 2 seconds under a lockout", fw, 9, 2 * S, random_steps(8, 120, 150_000, 4, ["a", "b"]), lockout=500_000)


def main():
    data = {"note": "generated by tests/vectors/generate.py; edit that file, not this one", "cases": list(cases())}
    path = Path(__file__).with_name("decisions.json")
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['cases'])} cases, {sum(len(c['steps']) for c in data['cases'])} steps -> {path}")


if __name__ == "__main__":
    main()
