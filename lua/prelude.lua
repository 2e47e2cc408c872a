-- Prelude: prepended to every script in this folder when tollgate-redis embeds it
-- (crates/tollgate-redis/src/script.rs), so the exact arithmetic the bit-identical guarantee rests on lives once.
-- (Line numbers in Redis's script errors count from this file's first line.)
--
-- Lua numbers are doubles. Every value the scripts compute stays at or below 2^53 (Quota and Policy guarantee
-- it), where doubles are exact integers, but `/` is a float division: idiv floors it and corrects the last bit,
-- so it equals Rust's `/` on non-negative integers.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function div_ceil(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

-- Redis formats a Lua number argument in the shortest float notation ("1.7e+15"): write integers digit by digit.
local function int(x)
  return string.format('%d', x)
end

-- The server's clock (TIME) in µs since the epoch: about 2^51 today, an exact integer in a double.
local function server_time_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The time prologue of the decision scripts: `injected` is their time argument (µs since the epoch; empty: the
-- server's TIME, so no client clock can mint tokens or requests). Returns the decision's instant and the
-- shortest TTL (ms) a written key gets. An injected time says nothing about how long the key must live in the
-- server's time, where the next step of a test may come a moment later than the injected clock says: such keys
-- live at least a minute.
local function decision_time(injected)
  if injected ~= nil and injected ~= '' then
    return tonumber(injected), 60000
  end
  return server_time_us(), 1
end


local function imod(a, b)
  return a - idiv(a, b) * b
end

-- The sliding window counter's arithmetic, shared by its decision, lease and charge scripts (their Rust twin:
-- crates/tollgate-core/src/algorithm/sliding_window.rs). `stored` is HMGET's window_start, previous, current.
-- Returns the instant the window decides as of (the stored start after a clock step back, a later instant than
-- `now`), the window's start, and the previous and current counts.
local function sw_window(stored, now, period)
  local start = now - imod(now, period)
  local previous, current = 0, 0
  if stored[1] then
    local window_start = tonumber(stored[1])
    if window_start > start then
      now = window_start
      start = window_start
    end
    if window_start == start then
      previous, current = tonumber(stored[2]), tonumber(stored[3])
    elseif window_start + period == start then
      previous = tonumber(stored[3])
    end
  end
  return now, start, previous, current
end

-- When `cost` more fits: later in this window, once the previous window's weight has decayed enough, or in the
-- next window, where this window's count becomes the previous one.
local function sw_admit_at(start, period, tick, ticks, limit, previous, current, cost)
  if current + cost <= limit then
    return start + (ticks - idiv((limit - current - cost) * ticks, previous)) * tick
  end
  return start + period + (ticks - idiv((limit - cost) * ticks, current)) * tick
end

-- Whole requests left `elapsed` ticks into the window.
local function sw_remaining(ticks, elapsed, limit, previous, current)
  local used = current * ticks + previous * (ticks - elapsed)
  if limit * ticks > used then
    return idiv(limit * ticks - used, ticks)
  end
  return 0
end

-- When both counts have decayed to zero (`now` when nothing is counted).
local function sw_reset(start, period, previous, current, now)
  if current > 0 then
    return start + 2 * period
  elseif previous > 0 then
    return start + period
  end
  return now
end
