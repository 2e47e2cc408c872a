-- Sliding window counter: estimate = current + previous * (1 - elapsed / period). A line-for-line port of
-- crates/tollgate-core/src/algorithm/sliding_window.rs (read that file for the reasoning).
--
-- KEYS[1]  the key's hash: window_start (µs since the epoch, a multiple of the period), previous, current
-- ARGV[1]  limit   requests per period
-- ARGV[2]  period  in µs
-- ARGV[3]  tick    time resolution in µs (Policy::tick_micros), so that limit * period / tick stays exact
-- ARGV[4]  cost    this request's cost
-- ARGV[5]  now     µs since the epoch; empty: the server's TIME (no client clock can mint requests)
--
-- Returns {outcome, remaining, reset_us, retry_after_us, now_us}; outcome 0 allowed, 1 limited,
-- 2 cost exceeds capacity; retry_after_us is -1 when absent. Integers only: Redis truncates Lua numbers.
-- idiv, imod, div_ceil, int, decision_time and the window arithmetic (sw_*) come from prelude.lua, prepended
-- when the script is embedded.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local tick = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local ticks = idiv(period, tick)
local now, min_ttl_ms = decision_time(ARGV[5])

-- After a clock step back the window decides as of its stored start, a later instant than the server's time;
-- retry delays, the decision's instant and the key's TTL still count from the server's time.
local server_now = now
local stored = redis.call('HMGET', key, 'window_start', 'previous', 'current')
local start, previous, current
now, start, previous, current = sw_window(stored, now, period)
local elapsed = idiv(now - start, tick)
-- estimate * ticks = current * ticks + previous * (ticks - elapsed)
local weighted_previous = previous * (ticks - elapsed)
local outcome = 1
local retry_after = -1
if cost > limit then
  outcome = 2
elseif current + cost <= limit and weighted_previous <= (limit - current - cost) * ticks then
  outcome = 0
  current = current + cost
else
  local admit_at = sw_admit_at(start, period, tick, ticks, limit, previous, current, cost)
  retry_after = admit_at - server_now
end
local remaining = sw_remaining(ticks, elapsed, limit, previous, current)
local reset = sw_reset(start, period, previous, current, server_now)
if outcome == 0 then
  -- The state lives exactly until both counts have decayed to zero, when it is indistinguishable from fresh. A
  -- decayed state is still written over an existing one, as the Rust store does: after a clock step back it
  -- differs.
  if reset > now or stored[1] then
    redis.call('HSET', key, 'window_start', int(start), 'previous', int(previous), 'current', int(current))
    redis.call('PEXPIRE', key, int(math.max(div_ceil(reset - server_now, 1000), min_ttl_ms)))
  end
end
return {outcome, remaining, reset, retry_after, server_now}
