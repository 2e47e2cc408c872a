-- Concurrency lease: admit one more in-flight request on a key if fewer than `limit` leases are live.
-- Cleanup, count, admission and TTL happen here, atomically (Stripe's published limiter cleaned up outside
-- its script and set no TTL, so a dead instance's leases and idle keys lived forever).
--
-- KEYS[1]  the key's lease set: a sorted set, member = lease id, score = lease expiry (ms, server time); a
--          negative score is a tombstone (see concurrency_release.lua), expiring at minus its score
-- ARGV[1]  lease id (unique per request)
-- ARGV[2]  limit    the ceiling this request is checked against (the fleet shedder's depends on priority)
-- ARGV[3]  ttl_ms   how long the lease lives unless renewed: the backstop when an instance dies holding it
--
-- Returns {granted (1/0), in_flight}: in_flight counts the new lease when granted, the blocking leases when not.
-- Integers only: Redis truncates Lua numbers.

-- int, idiv and server_time_us come from prelude.lua, prepended when the script is embedded.

local key = KEYS[1]
local lease = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
local now_ms = idiv(server_time_us(), 1000)

-- Leases whose expiry has passed belong to requests whose instance stopped renewing them (a crash); tombstones
-- whose expiry has passed have no acquire left to stop. Both have scores in [-now, now].
redis.call('ZREMRANGEBYSCORE', key, int(-now_ms), int(now_ms))
local in_flight = redis.call('ZCOUNT', key, '(0', '+inf')
local tombstone = redis.call('ZSCORE', key, lease)
if tombstone then
  -- Released before it got here (its holder gave up waiting for this reply, during a stall): never granted.
  redis.call('ZREM', key, lease)
  return {0, in_flight}
end
if in_flight >= limit then
  return {0, in_flight}
end
redis.call('ZADD', key, int(now_ms + ttl_ms), lease)
-- The key lives exactly as long as its longest lease or tombstone: an idle key disappears by itself.
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
redis.call('PEXPIREAT', key, int(math.max(tonumber(last[2]), -tonumber(first[2]))))
return {1, in_flight + 1}
