-- Cost known after the response, on a token bucket: charges (delta > 0) or refunds (delta < 0) tokens after the
-- request was decided. A line-for-line port of token_bucket() in crates/tollgate-core/src/algorithm/charge.rs
-- (read that file for the reasoning: the debt floor of two buckets, refunds never above full).
--
-- KEYS[1]  the bucket's hash: full_at, remainder (and locked_until, kept)
-- ARGV[1]  token   ARGV[2] rate   ARGV[3] burst   (as token_bucket.lua)
-- ARGV[4]  delta   tokens to charge, negative to refund
-- ARGV[5]  now     µs since the epoch; empty: the server's TIME
--
-- Returns {full_at, remainder, locked_until (0: none), now_us}: the caller derives the decision from this state
-- as its Rust twin does. idiv, div_ceil, int and decision_time come from prelude.lua.

local key = KEYS[1]
local token = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local delta = tonumber(ARGV[4])
local now, min_ttl_ms = decision_time(ARGV[5])

local floor = 2 * burst * token
local full_at, remainder = now, 0
local stored = redis.call('HMGET', key, 'full_at', 'remainder', 'locked_until')
if stored[1] and tonumber(stored[1]) > now then
  full_at, remainder = tonumber(stored[1]), tonumber(stored[2])
end
local owed = math.min(math.max((full_at - now) * rate - remainder, 0), floor)
local tokens = math.min(math.abs(delta), 2 * burst)
if delta >= 0 then
  owed = math.min(owed + tokens * token, floor)
else
  owed = math.max(owed - tokens * token, 0)
end
local wait = div_ceil(owed, rate)
full_at, remainder = now + wait, wait * rate - owed
redis.call('HSET', key, 'full_at', int(full_at), 'remainder', int(remainder))
-- Only ever extended: the key may hold a lockout that outlives the bucket.
local ttl = math.max(div_ceil(full_at - now, 1000), min_ttl_ms)
if redis.call('PTTL', key) < ttl then
  redis.call('PEXPIRE', key, int(ttl))
end
return { full_at, remainder, tonumber(stored[3] or 0), now }
