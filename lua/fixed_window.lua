-- Fixed window: at most `limit` per window, windows aligned to multiples of the period since the epoch (the
-- counting of envoyproxy/ratelimit). A line-for-line port of crates/tollgate-core/src/algorithm/fixed_window.rs
-- (read that file for the reasoning).
--
-- KEYS[1]  the key's hash: window_start (µs since the epoch, a multiple of the period), count
-- ARGV[1]  limit   requests per window
-- ARGV[2]  period  in µs
-- ARGV[3]  cost    this request's cost
-- ARGV[4]  unused  (the time stays the fifth argument, where the store operations, ops_open.lua, read it)
-- ARGV[5]  now     µs since the epoch; empty: the server's TIME (no client clock can mint requests)
--
-- Returns {outcome, remaining, reset_us, retry_after_us, now_us}; outcome 0 allowed, 1 limited,
-- 2 cost exceeds capacity; retry_after_us is -1 when absent. Integers only: Redis truncates Lua numbers.
-- imod, div_ceil, int and decision_time come from prelude.lua, prepended when the script is embedded.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now, min_ttl_ms = decision_time(ARGV[5])

local start = now - imod(now, period)
local count = 0
local stored = redis.call('HMGET', key, 'window_start', 'count')
if stored[1] then
  local window_start = tonumber(stored[1])
  if window_start > start then
    -- The clock stepped back: decide in the stored window.
    start = window_start
  end
  if window_start == start then
    count = tonumber(stored[2])
  end
end
local window_end = start + period
local outcome = 1
local retry_after = -1
if cost > limit then
  outcome = 2
elseif count + cost <= limit then
  outcome = 0
  count = count + cost
else
  retry_after = window_end - now
end
local reset = now
if count > 0 then
  reset = window_end
end
local remaining = 0
if limit > count then
  remaining = limit - count
end
if outcome == 0 then
  -- The state lives until the window ends, when it is indistinguishable from fresh. A decayed state is still
  -- written over an existing one, as the Rust store does.
  if reset > now or stored[1] then
    redis.call('HSET', key, 'window_start', int(start), 'count', int(count))
    redis.call('PEXPIRE', key, int(math.max(div_ceil(reset - now, 1000), min_ttl_ms)))
  end
end
return {outcome, remaining, reset, retry_after, now}
