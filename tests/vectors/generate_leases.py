#!/usr/bin/env python3
"""Writes leases.json: the shared vectors of token leases (plain requests and lease calls mixed) for every store.

Like generate.py, the expected answers come from this file's own reference model, written from the rules in
exact rational arithmetic (fractions.Fraction), sharing no formula with the Rust twins
(crates/tollgate-core/src/algorithm/*_lease.rs) or the Lua scripts (lua/*lease*.lua) it checks. The rules:

token bucket: the bucket holds C tokens and instances hold records (amount, deadline, seq) summing to O; C + O <=
burst, and the refill goes into C only up to burst - O. At each call, records whose deadline has passed are
dropped (their tokens lost); then a plain request is the textbook decision on C, a lease call sets the caller's
record to min(reported unspent, record), grants min(want, floor C) (record += grant, deadline = now + ttl), and a
return puts min(unspent, record) back into C and drops the record. A call whose number is not above its record's
changes nothing. Every answer says what the caller's record holds after it (held: 0 once ended).

sliding window: each instance has a record of the slots the current window, and the one before, count for it. A
lease adds the most slots k <= want that keep estimate + k <= limit to the current window and to the caller's
record; a return takes unspent slots off the window they were granted in (current or previous), never more than
the caller's record counts there. Every answer says what the current window counts for the caller (held).

lockouts (a case's lockout_us): a plain request denied starts one (the key is refused until then: remaining 0,
reset and retry no earlier than its end; a refused request changes nothing, leases' sweep included). A lease call
on a locked key grants nothing: it is made with want 0 (a report or a return still applies) and answers as a
refused request would (remaining 0, reset no earlier than the end, retry until the end); a token bucket's return
answers as it is. A lease call never starts a lockout.
The models assert the invariants the proofs rest on at every step (token bucket: 0 <= C and C + O <= burst,
and what left the bucket over any interval [a, b] -- plain admissions plus grants less returns -- is at most
burst + rate x (b - a); sliding window: the estimate never exceeds the limit after a grant or an admission,
and the records never count more than the windows do), so a vector can only encode answers that keep them.
Run: python3 tests/vectors/generate_leases.py
"""
import copy
import json
import random
from fractions import Fraction
from math import ceil, floor
from pathlib import Path

from generate import S, T0, SlidingWindow

MAX_SCALED = 1 << 52


class LeasedBucket:
    def __init__(self, limit, period, burst):
        self.limit, self.period, self.burst = limit, period, burst
        self.c, self.t, self.records = Fraction(burst), None, {}
        self.flow = []  # (instant, tokens out of the bucket: plain admissions and grants, less returns)

    def leased(self):
        return sum(a for a, _, _ in self.records.values())

    def advance(self, t):
        if self.t is not None:
            self.c = min(Fraction(self.burst - self.leased()), self.c + Fraction((t - self.t) * self.limit, self.period))
        self.t = t
        self.records = {i: r for i, r in self.records.items() if r[1] > t}

    def invariants(self):
        assert 0 <= self.c and self.c + self.leased() <= self.burst, (self.c, self.records)

    def check_flow(self):
        """Over every interval [a, b] of the calls, what left the bucket is at most burst + rate x (b - a)."""
        for i, (a, _) in enumerate(self.flow):
            out = 0
            for b, tokens in self.flow[i:]:
                out += tokens
                assert out <= self.burst + Fraction((b - a) * self.limit, self.period), (a, b, out)

    def wait_for(self, tokens):
        return ceil((tokens - self.c) * Fraction(self.period, self.limit))

    def full_at(self, t):
        return t + ceil((self.burst - self.c) * Fraction(self.period, self.limit))

    def check(self, t, cost):
        self.advance(t)
        if cost > self.burst:
            return {"outcome": "cost_exceeds_capacity", "remaining": floor(self.c), "reset_us": self.full_at(t)}
        if self.c >= cost:
            self.c -= cost
            self.flow.append((t, cost))
            self.invariants()
            return {"outcome": "allowed", "remaining": floor(self.c), "reset_us": self.full_at(t)}
        return {"outcome": "limited", "remaining": floor(self.c), "reset_us": self.full_at(t),
                "retry_after_us": self.wait_for(cost)}

    def lease(self, t, instance, seq, want, unspent, ttl, end):
        self.advance(t)
        want = min(want, self.burst)
        record = self.records.get(instance)
        stale = record is not None and seq <= record[2]
        granted, deadline = 0, record[1] if record else 0
        held = record[0] if record else 0
        if not stale:
            left = min(unspent, record[0] if record else 0)
            self.records.pop(instance, None)
            held = 0
            if end:
                self.c += left
                self.flow.append((t, -left))
            else:
                granted = min(want, floor(self.c))
                self.c -= granted
                self.flow.append((t, granted))
                deadline = t + ttl
                held = left + granted
                self.records[instance] = (held, deadline, seq)
        self.invariants()
        out = {"granted": granted, "remaining": floor(self.c), "reset_us": self.full_at(t), "expires_us": deadline,
               "window_start_us": 0, "stale": stale, "held": held}
        if granted < want and not end and not stale:
            out["retry_after_us"] = self.wait_for(want)
        return out


class LeasedWindow(SlidingWindow):
    def __init__(self, limit, period):
        super().__init__(limit, period)
        self.records = {}  # instance -> (window start, slots it counts there, slots the window before counts)

    def mine(self, instance, start):
        """What the caller's record counts in the window starting at `start`, and in the one before."""
        w, amount, previous = self.records.get(instance, (0, 0, 0))
        if w == start:
            return amount, previous
        if w + self.period == start:
            return 0, amount
        return 0, 0

    def invariants(self, t):
        start, prev, cur = self.counts("k", t)
        counted = [self.mine(i, start) for i in self.records]
        assert sum(a for a, _ in counted) <= cur and sum(p for _, p in counted) <= prev, (self.records, prev, cur)
        assert self.estimate("k", t) <= self.limit, (t, prev, cur)

    def check(self, t, cost):
        outcome, remaining, reset, retry = self.decide("k", t, cost)
        if outcome == "allowed":
            self.invariants(t)
        out = {"outcome": outcome, "remaining": remaining, "reset_us": reset}
        if retry is not None:
            out["retry_after_us"] = retry
        return out

    def fits(self, t, k):
        return self.estimate("k", t) + k <= self.limit

    def lease(self, t, instance, seq, want, unspent, window_start, end):
        want = min(want, self.limit)
        start, prev, cur = self.counts("k", t)
        mine, mine_prev = self.mine(instance, start)
        if unspent > 0:
            if window_start == start:
                back = min(unspent, mine)
                cur, mine = cur - back, mine - back
            elif window_start + self.period == start:
                back = min(unspent, mine_prev)
                prev, mine_prev = prev - back, mine_prev - back
        self.keys["k"] = (start, prev, cur)
        granted = max(k for k in range(want + 1) if k == 0 or self.fits(t, k))
        self.keys["k"] = (start, prev, cur + granted)
        mine += granted
        self.records[instance] = (start, mine, mine_prev)
        if granted:
            self.invariants(t)
        est = self.estimate("k", t)
        out = {"granted": granted, "remaining": max(0, floor(self.limit - est)),
               "reset_us": self.reset(start, prev, cur + granted, t), "expires_us": start + self.period,
               "window_start_us": start, "stale": False, "held": mine}
        if granted < want:
            # The first tick boundary from which `want` more fit (admission only grows as time passes).
            lo, hi = (t - start) // self.tick, 2 * (self.period // self.tick)
            at = lambda i: start + i * self.tick
            assert not self.fits(at(lo), want) and self.fits(at(hi), want)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.fits(at(mid), want):
                    hi = mid
                else:
                    lo = mid
            out["retry_after_us"] = at(hi) - t
        return out


class Lockout:
    """A lockout around a leased model (see the rules above); lockout 0: none."""

    def __init__(self, model, lockout):
        self.model, self.lockout, self.until = model, lockout, 0

    def locked(self, t):
        return self.lockout > 0 and self.until > t

    def check(self, t, cost):
        saved = copy.deepcopy(self.model.__dict__)
        out = self.model.check(t, cost)
        locked = self.locked(t)
        if locked:
            self.model.__dict__ = saved
        if out["outcome"] == "cost_exceeds_capacity":
            return out
        if locked:
            return {"outcome": "limited", "remaining": 0, "reset_us": max(out["reset_us"], self.until),
                    "retry_after_us": max(out.get("retry_after_us", 0), self.until - t)}
        if out["outcome"] == "limited" and self.lockout:
            self.until = t + self.lockout
            return {"outcome": "limited", "remaining": 0, "reset_us": max(out["reset_us"], self.until),
                    "retry_after_us": max(out["retry_after_us"], self.lockout)}
        return out

    def lease(self, t, instance, seq, want, unspent, extra, end, ends):
        locked = self.locked(t)
        out = self.model.lease(t, instance, seq, 0 if locked else want, unspent, extra, end)
        if locked and not out["stale"] and not ends:
            out["remaining"], out["reset_us"] = 0, max(out["reset_us"], self.until)
            out["retry_after_us"] = self.until - t
        return out


def run(name, algorithm, limit, period, ops, burst=None, lockout=0):
    inner = LeasedBucket(limit, period, burst or limit) if algorithm == "token_bucket" else LeasedWindow(limit, period)
    model = Lockout(inner, lockout)
    steps = []
    for op in ops:
        at = op["at_us"]
        if op["op"] == "check":
            expected = model.check(at, op["cost"])
        elif algorithm == "token_bucket":
            expected = model.lease(at, op["instance"], op["seq"], op["want"], op["unspent"], op["ttl_us"], op["end"],
                                   op["end"])
        else:
            expected = model.lease(at, op["instance"], op["seq"], op["want"], op["unspent"], op["window_start_us"],
                                   op["end"], False)
        steps.append({**op, "expect": expected})
    if algorithm == "token_bucket":
        inner.check_flow()
    case = {"name": name, "algorithm": algorithm, "limit": limit, "period_us": period, "steps": steps}
    if burst is not None:
        case["burst"] = burst
    if lockout:
        case["lockout_us"] = lockout
    return case


def check(at, cost=1):
    return {"op": "check", "at_us": at, "cost": cost}


def lease(at, instance, seq, want, unspent=0, ttl=S, end=False, window_start=0):
    return {"op": "lease", "at_us": at, "instance": instance, "seq": seq, "want": want, "unspent": unspent,
            "window_start_us": window_start, "ttl_us": ttl, "end": end}


def random_ops(seed, n, span, instances, max_want, ttl, window=None):
    """Random traffic: plain requests and lease calls of several instances, each reporting plausible leftovers."""
    rng = random.Random(seed)
    t = T0 + rng.randrange(span)
    seqs = {i: 0 for i in range(1, instances + 1)}
    ops = []
    for _ in range(n):
        t += int(rng.expovariate(1 / span)) if rng.random() < 0.7 else 0
        if rng.random() < 0.4:
            ops.append(check(t, rng.randint(1, 3)))
            continue
        i = rng.randint(1, instances)
        seqs[i] += 1 if rng.random() < 0.9 else -1  # now and then a late, stale call
        unspent = rng.randint(0, max_want)
        ws = t - t % window - (window if rng.random() < 0.3 else 0) if window else 0
        ops.append(lease(t, i, max(seqs[i], 0), rng.randint(0, max_want), unspent, ttl, rng.random() < 0.15, ws))
    return ops


def cases():
    tb, sw = "token_bucket", "sliding_window"
    yield run("tb lease: a batch is debited at once, plain requests see the rest", tb, 10, S,
              [lease(T0, 1, 1, 6), check(T0), check(T0), check(T0), check(T0), check(T0)])
    yield run("tb lease: leased tokens hold the refill below the burst", tb, 10, S,
              [lease(T0, 1, 1, 8, ttl=10 * S), check(T0 + 5 * S), check(T0 + 5 * S), check(T0 + 5 * S)])
    yield run("tb lease: a report lowers the record, the spent tokens stay spent", tb, 10, S,
              [lease(T0, 1, 1, 8, ttl=10 * S), lease(T0 + 100_000, 1, 2, 0, unspent=3, ttl=10 * S),
               check(T0 + 2 * S, 6), check(T0 + 2 * S, 2)])
    yield run("tb lease: a return gives the unspent tokens back", tb, 10, S,
              [lease(T0, 1, 1, 8), check(T0, 3), lease(T0, 1, 2, 0, unspent=5, end=True), check(T0, 7)])
    yield run("tb lease: a report never raises a record", tb, 10, S,
              [lease(T0, 1, 1, 4), lease(T0, 1, 2, 0, unspent=9, end=True), check(T0, 10)])
    yield run("tb lease: an expired record's tokens are lost, the bucket refills from its deadline", tb, 10, S,
              [lease(T0, 1, 1, 10, ttl=S // 2), check(T0 + S // 2 - 1), check(T0 + S // 2), check(T0 + S // 2 + 100_000),
               check(T0 + S // 2 + 100_000)])
    yield run("tb lease: a stale call changes nothing", tb, 10, S,
              [lease(T0, 1, 2, 3), lease(T0, 1, 1, 5), lease(T0, 1, 2, 5), check(T0, 7), check(T0, 1)])
    yield run("tb lease: an empty bucket grants what it has and says when the rest comes", tb, 10, S,
              [check(T0, 8), lease(T0, 1, 1, 5), lease(T0 + 150_000, 2, 1, 5), lease(T0 + 200_000, 1, 2, 5, unspent=2)])
    yield run("tb lease: two instances share the burst", tb, 20, S,
              [lease(T0, 1, 1, 8), lease(T0, 2, 1, 8), lease(T0, 3, 1, 8), check(T0, 4), check(T0, 5),
               lease(T0 + 100_000, 1, 2, 8, unspent=0), lease(T0 + 200_000, 2, 2, 0, unspent=8, end=True)])
    yield run("tb lease: want above the burst is capped", tb, 5, S, [lease(T0, 1, 1, 50), check(T0)], burst=5)
    yield run("tb lease: held is the record, and only the grant once the record is gone", tb, 10, S,
              [lease(T0, 1, 1, 6, ttl=S // 2), lease(T0 + 100_000, 1, 2, 2, unspent=4, ttl=S // 2),
               lease(T0 + S, 1, 3, 3, unspent=5, ttl=S // 2), lease(T0 + S, 1, 4, 0, unspent=9, end=True)])
    yield run("tb lease: random traffic, 3 instances, 50 per second", tb, 50, S,
              random_ops(11, 160, 40_000, 3, 12, 300_000))
    yield run("tb lease: random traffic, 2 instances, 7 per 3 s, burst 9", tb, 7, 3 * S,
              random_ops(12, 160, 150_000, 2, 5, 2 * S), burst=9)

    yield run("sw lease: a batch counts in the current window", sw, 10, S,
              [lease(T0 + 250_000, 1, 1, 6), check(T0 + 250_000, 4), check(T0 + 250_000)])
    yield run("sw lease: a grant is the most that fits", sw, 10, S,
              [check(T0 + 500_000, 6), lease(T0 + S + 500_000, 1, 1, 9), check(T0 + S + 500_000)])
    yield run("sw lease: unspent slots come off the current window", sw, 10, S,
              [lease(T0, 1, 1, 8), lease(T0 + 10, 1, 2, 0, unspent=5, window_start=T0, end=True), check(T0 + 10, 7)])
    yield run("sw lease: unspent slots come off the previous window", sw, 10, S,
              [lease(T0 + 900_000, 1, 1, 10), lease(T0 + S + 100_000, 1, 2, 4, unspent=6, window_start=T0),
               check(T0 + S + 100_000, 3)])
    yield run("sw lease: slots of an older window are forgotten", sw, 10, S,
              [lease(T0, 1, 1, 10), lease(T0 + 2 * S, 1, 2, 3, unspent=6, window_start=T0), check(T0 + 2 * S, 7),
               check(T0 + 2 * S)])
    yield run("sw lease: a return takes off only what the window counts for the caller", sw, 10, S,
              [lease(T0 + 100_000, 1, 1, 4), lease(T0 + 100_000, 2, 1, 3),
               lease(T0 + 200_000, 2, 2, 0, unspent=5, window_start=T0, end=True), check(T0 + 200_000, 7),
               lease(T0 + S + 100_000, 1, 2, 2, unspent=6, window_start=T0), check(T0 + S + 100_000)])
    yield run("sw lease: held is what the current window counts for the caller", sw, 10, S,
              [lease(T0 + 100_000, 1, 1, 3), lease(T0 + 300_000, 1, 2, 2), check(T0 + 300_000),
               lease(T0 + S + 500_000, 1, 3, 1), lease(T0 + 3 * S, 1, 4, 0, unspent=3, window_start=T0 + 2 * S)])
    yield run("sw lease: nothing fits, retry when the batch would", sw, 10, S,
              [check(T0 + 500_000, 10), lease(T0 + S + 200_000, 1, 1, 4), lease(T0 + S + 700_000, 1, 2, 4)])
    yield run("sw lease: random traffic, 3 instances, 40 per second", sw, 40, S,
              random_ops(13, 160, 50_000, 3, 10, S, window=S))
    yield run("sw lease: random traffic, 2 instances, 15 per 2 s", sw, 15, 2 * S,
              random_ops(14, 160, 120_000, 2, 6, S, window=2 * S))

    yield run("tb lockout: a locked key grants no lease until the lockout ends, and says when", tb, 10, S,
              [lease(T0, 1, 1, 8), check(T0, 2), check(T0 + 1), lease(T0 + 100, 2, 1, 5), lease(T0 + S, 1, 2, 5),
               check(T0 + 2 * S), lease(T0 + 5 * S - 1, 2, 2, 5), lease(T0 + 5 * S, 2, 3, 5), check(T0 + 5 * S, 5),
               check(T0 + 5 * S, 1)], lockout=5 * S)
    yield run("tb lockout: reports and returns still apply while locked", tb, 10, S,
              [lease(T0, 1, 1, 6, ttl=10 * S), lease(T0, 2, 1, 4, ttl=10 * S), check(T0), check(T0 + 1),
               lease(T0 + 10, 1, 2, 3, unspent=4, ttl=10 * S), lease(T0 + 20, 2, 2, 0, unspent=4, end=True),
               check(T0 + 30), lease(T0 + 3 * S, 1, 3, 5, unspent=1, ttl=10 * S), check(T0 + 3 * S, 3)],
              lockout=2 * S)
    yield run("tb lockout: a refusal while locked sweeps no expired lease", tb, 10, S,
              [lease(T0, 1, 1, 6, ttl=S // 2), check(T0, 4), check(T0 + 1), check(T0 + S), check(T0 + 2 * S + 1),
               check(T0 + 2 * S + 1, 4)], lockout=2 * S)
    yield run("tb lockout: a stale call while locked changes nothing", tb, 10, S,
              [lease(T0, 1, 2, 10), check(T0), lease(T0 + 1, 1, 1, 5), lease(T0 + 2, 1, 3, 5, unspent=4)],
              lockout=S)
    yield run("sw lockout: a locked window grants no slots, returns still apply", sw, 10, S,
              [lease(T0 + 100_000, 1, 1, 8), check(T0 + 100_000, 2), check(T0 + 200_000),
               lease(T0 + 300_000, 1, 2, 4, unspent=3, window_start=T0), check(T0 + S + 500_000),
               lease(T0 + 2 * S + 199_999, 2, 1, 4), lease(T0 + 2 * S + 200_000, 2, 2, 4),
               check(T0 + 2 * S + 200_000)], lockout=2 * S)
    yield run("tb lockout: random traffic, 3 instances, 20 per second, 300 ms lockouts", tb, 20, S,
              random_ops(15, 200, 30_000, 3, 8, 200_000), lockout=300_000)
    yield run("sw lockout: random traffic, 2 instances, 12 per second, 400 ms lockouts", sw, 12, S,
              random_ops(16, 200, 40_000, 2, 6, S, window=S), lockout=400_000)


def main():
    data = {"note": "generated by tests/vectors/generate_leases.py; edit that file, not this one",
            "cases": list(cases())}
    path = Path(__file__).with_name("leases.json")
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['cases'])} cases, {sum(len(c['steps']) for c in data['cases'])} steps -> {path}")


if __name__ == "__main__":
    main()
