-- Cost known after the response, on a sliding window: charges (delta > 0) or refunds (delta < 0) after the
-- request was decided. A line-for-line port of sliding_window() in crates/tollgate-core/src/algorithm/charge.rs
-- (read that file for the reasoning: counts up to 2 × limit, refunds only from the request's own window).
--
-- KEYS[1]  the key's hash: window_start, previous, current (and locked_until, kept)
-- ARGV[1]  limit   ARGV[2] period (µs)
-- ARGV[3]  delta       cost to charge, negative to refund
-- ARGV[4]  decided_at  µs since the epoch: when the request was decided (which window holds its cost)
-- ARGV[5]  now         µs since the epoch; empty: the server's TIME
--
-- Returns {window_start, previous, current, locked_until (0: none), now_us}: the caller derives the decision from
-- this state as its Rust twin does. idiv, imod, div_ceil, int, decision_time and sw_window, sw_reset come from
-- prelude.lua.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local delta = tonumber(ARGV[3])
local decided_at = tonumber(ARGV[4])
local now, min_ttl_ms = decision_time(ARGV[5])

local stored = redis.call('HMGET', key, 'window_start', 'previous', 'current', 'locked_until')
-- As the decision does: after a clock step back, the stored window stands (its TTL still counts from `now`).
local _, start, previous, current = sw_window(stored, now, period)
local amount = math.min(math.abs(delta), 2 * limit)
if delta >= 0 then
  current = math.min(current + amount, 2 * limit)
else
  local decided = decided_at - imod(decided_at, period)
  if decided == start then
    current = current - math.min(amount, current)
  elseif decided + period == start then
    previous = previous - math.min(amount, previous)
  end
end
redis.call('HSET', key, 'window_start', int(start), 'previous', int(previous), 'current', int(current))
local reset = sw_reset(start, period, previous, current, now)
-- Only ever extended: the key may hold a lockout that outlives the window.
local ttl = math.max(div_ceil(math.max(reset - now, 0), 1000), min_ttl_ms)
if redis.call('PTTL', key) < ttl then
  redis.call('PEXPIRE', key, int(ttl))
end
return { start, previous, current, tonumber(stored[4] or 0), now }
