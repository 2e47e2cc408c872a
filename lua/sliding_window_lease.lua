-- Sliding window lease: an instance takes up to `want` slots of the current window in one call (counted at
-- once, as if that many requests had been admitted), and gives back what it did not spend of an earlier batch.
-- A line-for-line port of crates/tollgate-core/src/algorithm/sliding_window_lease.rs (read that file for the
-- reasoning and the proof).
--
-- KEYS[1]  the key's hash (sliding_window.lua's): window_start, previous, current
-- ARGV[1]  limit     requests per period
-- ARGV[2]  period    in µs
-- ARGV[3]  tick      time resolution in µs (Policy::tick_micros)
-- ARGV[4]  want      slots wanted (capped at the limit)
-- ARGV[5]  returned  slots given back: granted earlier and not spent
-- ARGV[6]  from      the start of the window those were granted in (µs); they come off that window's count if it
--                    is the current or the previous one, and are forgotten with it otherwise
-- ARGV[7]  now       µs since the epoch; empty: the server's TIME
-- ARGV[8]  lockout   the policy's lockout in µs (0: none, and a stored lockout is ignored): a locked key grants
--                    nothing (the call is made with want 0) and answers as a refused request would, its
--                    lockout's end in reset and retry (crates/tollgate-core/src/algorithm/lockout.rs, `lease`)
--
-- Returns {granted, remaining, reset_us, retry_after_us, now_us, window_end_us}: a batch is spent before
-- window_end_us (the end of the window it is counted in); retry_after_us (-1 when everything wanted was
-- granted) is when `want` slots would fit. Integers only: Redis truncates Lua numbers.
-- idiv, imod, div_ceil, int, decision_time and the window arithmetic (sw_*) come from prelude.lua, prepended
-- when the script is embedded.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local tick = tonumber(ARGV[3])
local want = math.min(tonumber(ARGV[4]), limit)
local returned = tonumber(ARGV[5])
local from = tonumber(ARGV[6])
local ticks = idiv(period, tick)
local now, min_ttl_ms = decision_time(ARGV[7])
local lockout = tonumber(ARGV[8])

-- As sliding_window.lua: after a clock step back the window decides as of its stored start.
local server_now = now
local stored = redis.call('HMGET', key, 'window_start', 'previous', 'current', 'locked_until')
local locked_until = 0
if lockout > 0 and stored[4] and tonumber(stored[4]) > now then
  locked_until = tonumber(stored[4])
  want = 0
end
local start, previous, current
now, start, previous, current = sw_window(stored, now, period)
local changed = false
if returned > 0 then
  if from == start then
    current = current - math.min(returned, current)
    changed = true
  elseif from + period == start then
    previous = previous - math.min(returned, previous)
    changed = true
  end
end
local elapsed = idiv(now - start, tick)
local weighted_previous = previous * (ticks - elapsed)
-- The most slots k with current + k + previous * (ticks - elapsed) / ticks <= limit.
local granted = 0
if limit * ticks >= current * ticks + weighted_previous then
  granted = math.min(want, idiv(limit * ticks - current * ticks - weighted_previous, ticks))
end
if granted > 0 then
  current = current + granted
  changed = true
end
local retry = -1
if granted < want then
  local admit_at = sw_admit_at(start, period, tick, ticks, limit, previous, current, want)
  retry = admit_at - server_now
end
local remaining = sw_remaining(ticks, elapsed, limit, previous, current)
local reset = sw_reset(start, period, previous, current, server_now)
if changed and (reset > now or stored[1]) then
  redis.call('HSET', key, 'window_start', int(start), 'previous', int(previous), 'current', int(current))
  -- The key lives at least until its lockout ends.
  redis.call('PEXPIRE', key, int(math.max(div_ceil(math.max(reset, locked_until) - server_now, 1000), min_ttl_ms)))
end
if locked_until > 0 then
  -- Refused as a request is during the lockout (want is 0: no retry of its own).
  remaining, reset, retry = 0, math.max(reset, locked_until), locked_until - server_now
end
return {granted, remaining, reset, retry, server_now, start + period}
