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

