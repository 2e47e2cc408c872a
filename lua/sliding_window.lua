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
-- idiv, div_ceil, int and decision_time come from prelude.lua, prepended when the script is embedded.

local function imod(a, b)
  return a - idiv(a, b) * b
end

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
local start = now - imod(now, period)
local previous, current = 0, 0
local stored = redis.call('HMGET', key, 'window_start', 'previous', 'current')
if stored[1] then
  local window_start = tonumber(stored[1])
  if window_start > start then
    -- The clock stepped back: decide as of the stored window's start.
    now = window_start
    start = window_start
  end
  if window_start == start then
    previous, current = tonumber(stored[2]), tonumber(stored[3])
  elseif window_start + period == start then
    previous = tonumber(stored[3])
  end
end
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
  local admit_at
  if current + cost <= limit then
    -- Later in this window, once the previous window's weight has decayed enough.
    admit_at = start + (ticks - idiv((limit - current - cost) * ticks, previous)) * tick
  else
    -- In the next window, where this window's count becomes the previous one.
    admit_at = start + period + (ticks - idiv((limit - cost) * ticks, current)) * tick
  end
  retry_after = admit_at - server_now
end
local used = current * ticks + previous * (ticks - elapsed)
local remaining = 0
if limit * ticks > used then
  remaining = idiv(limit * ticks - used, ticks)
end
local reset
if current > 0 then
  reset = start + 2 * period
elseif previous > 0 then
  reset = start + period
else
  reset = server_now
end
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
