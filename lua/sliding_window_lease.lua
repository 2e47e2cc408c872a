-- Sliding window lease: an instance takes up to `want` slots of the current window in one call (counted at
-- once, as if that many requests had been admitted), and gives back what it did not spend of an earlier batch.
-- A line-for-line port of crates/tollgate-core/src/algorithm/sliding_window_lease.rs (read that file for the
-- reasoning and the proof).
--
-- KEYS[1]  the key's hash (sliding_window.lua's): window_start, previous, current; and the lease records:
--          l:<id> = "window_start:amount:previous" (the slots the window the record was written in, and the one
--          before it, count for instance <id>: granted, less given back), lease_w = the window the records were
--          last swept in
-- ARGV[1]  limit     requests per period
-- ARGV[2]  period    in µs
-- ARGV[3]  tick      time resolution in µs (Policy::tick_micros)
-- ARGV[4]  want      slots wanted (capped at the limit)
-- ARGV[5]  returned  slots given back: granted earlier and not spent
-- ARGV[6]  from      the start of the window those were granted in (µs); they come off that window's count if it
--                    is the current or the previous one, at most what the caller's record counts there, and are
--                    forgotten with it otherwise
-- ARGV[7]  now       µs since the epoch; empty: the server's TIME
-- ARGV[8]  lockout   the policy's lockout in µs (0: none, and a stored lockout is ignored): a locked key grants
--                    nothing (the call is made with want 0) and answers as a refused request would, its
--                    lockout's end in reset and retry (crates/tollgate-core/src/algorithm/lockout.rs, `lease`)
-- ARGV[9]  instance  the caller's instance id (digits)
--
-- Returns {granted, remaining, reset_us, retry_after_us, now_us, window_end_us, held}: a batch is spent before
-- window_end_us (the end of the window it is counted in); retry_after_us (-1 when everything wanted was
-- granted) is when `want` slots would fit; held the slots the current window counts for the caller after the
-- call, the most it keeps of its batch (less after the store lost state). Integers only: Redis truncates Lua
-- numbers.
-- idiv, imod, div_ceil, int, decision_time and the window arithmetic (sw_*) come from prelude.lua, prepended
-- when the script is embedded.

local function parse_window_record(v)
  local w, a, p = string.match(v, '^(%d+):(%d+):(%d+)$')
  return tonumber(w), tonumber(a), tonumber(p)
end

-- Sets the caller's record as of the window starting at `start` (dropped when it counts nothing) and, once per
-- window (`swept`: the stored lease_w), drops the records that count nothing any more: those written before the
-- previous window.
local function write_window_record(key, field, start, period, amount, previous, swept)
  if amount + previous > 0 then
    redis.call('HSET', key, field, int(start) .. ':' .. int(amount) .. ':' .. int(previous))
  else
    redis.call('HDEL', key, field)
  end
  if not swept or tonumber(swept) < start then
    redis.call('HSET', key, 'lease_w', int(start))
    local fields = redis.call('HGETALL', key)
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, 2) == 'l:' and parse_window_record(fields[i + 1]) + period < start then
        redis.call('HDEL', key, fields[i])
      end
    end
  end
end

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
local field = 'l:' .. ARGV[9]

-- As sliding_window.lua: after a clock step back the window decides as of its stored start.
local server_now = now
local stored = redis.call('HMGET', key, 'window_start', 'previous', 'current', 'locked_until', field, 'lease_w')
local locked_until = 0
if lockout > 0 and stored[4] and tonumber(stored[4]) > now then
  locked_until = tonumber(stored[4])
  want = 0
end
local start, previous, current
now, start, previous, current = sw_window(stored, now, period)
-- The caller's record as of this window (a record one window old counts in the previous one only).
local mine, mine_previous = 0, 0
if stored[5] then
  local w, a, p = parse_window_record(stored[5])
  if w == start then
    mine, mine_previous = a, p
  elseif w + period == start then
    mine_previous = a
  end
end
local changed = false
if returned > 0 then
  -- Only what the caller's record counts there comes off: after the store lost state, nothing.
  if from == start then
    local back = math.min(returned, mine, current)
    current = current - back
    mine = mine - back
    changed = true
  elseif from + period == start then
    local back = math.min(returned, mine_previous, previous)
    previous = previous - back
    mine_previous = mine_previous - back
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
  mine = mine + granted
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
  write_window_record(key, field, start, period, mine, mine_previous, stored[6])
  -- The key lives at least until its lockout ends.
  redis.call('PEXPIRE', key, int(math.max(div_ceil(math.max(reset, locked_until) - server_now, 1000), min_ttl_ms)))
end
if locked_until > 0 then
  -- Refused as a request is during the lockout (want is 0: no retry of its own).
  remaining, reset, retry = 0, math.max(reset, locked_until), locked_until - server_now
end
return {granted, remaining, reset, retry, server_now, start + period, mine}
