-- Concurrency lease renewal: a long request pushes its lease's expiry forward while it runs.
--
-- KEYS[1]  the key's lease set (see concurrency_acquire.lua)
-- ARGV[1]  lease id
-- ARGV[2]  ttl_ms   the new expiry is now + ttl_ms (server time)
--
-- Returns 1 when renewed, 0 when the lease is gone (it expired, or was released): the holder then runs without
-- a lease, and says so in its logs.

-- int, idiv and server_time_us come from prelude.lua, prepended when the script is embedded.

local key = KEYS[1]
local lease = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local now_ms = idiv(server_time_us(), 1000)

local expiry = redis.call('ZSCORE', key, lease)
if not expiry or tonumber(expiry) < 0 then
  return 0 -- gone, or a tombstone (released): never brought back
end
if tonumber(expiry) <= now_ms then
  redis.call('ZREM', key, lease)
  return 0
end
redis.call('ZADD', key, 'XX', int(now_ms + ttl_ms), lease)
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
redis.call('PEXPIREAT', key, int(math.max(tonumber(last[2]), -tonumber(first[2]))))
return 1
