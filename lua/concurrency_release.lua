-- Concurrency lease release: the request finished (or was dropped), its lease goes back.
--
-- KEYS[1]  the key's lease set (see concurrency_acquire.lua)
-- ARGV[1]  lease id
-- ARGV[2]  tombstone_ms  how long a release that finds no lease keeps its acquire from being granted
--
-- A release can overtake its own acquire: a caller whose acquire timed out during a stall releases at once, and
-- the acquire, sent first, may run after it once the server wakes (another connection, a retry). A release that
-- finds no lease therefore leaves a tombstone, the lease id with the negative of its expiry as score, which the
-- acquire refuses; without it the late lease would hold a slot until its TTL with nobody to give it back.
--
-- Returns the number of leases removed (0 or 1). The key's TTL still matches its longest lease or tombstone
-- (never shorter than needed); removing the last member deletes the key.

-- int, idiv and server_time_us come from prelude.lua, prepended when the script is embedded.

local key = KEYS[1]
local lease = ARGV[1]
local tombstone_ms = tonumber(ARGV[2])
local held = redis.call('ZSCORE', key, lease)
if held and tonumber(held) > 0 then
  return redis.call('ZREM', key, lease)
end
if held then
  return 0 -- a tombstone already
end
local now_ms = idiv(server_time_us(), 1000)
local until_ms = now_ms + tombstone_ms
redis.call('ZADD', key, int(-until_ms), lease)
local ttl = redis.call('PTTL', key)
if ttl < tombstone_ms then
  redis.call('PEXPIREAT', key, int(until_ms))
end
return 0
