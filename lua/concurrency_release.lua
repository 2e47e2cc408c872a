-- Concurrency lease release: the request finished (or was dropped), its lease goes back.
--
-- KEYS[1]  the key's lease set (see concurrency_acquire.lua)
-- ARGV[1]  lease id
--
-- Returns the number of leases removed (0 or 1). The key's TTL still matches its longest lease (never shorter
-- than needed); removing the last member deletes the key.

return redis.call('ZREM', KEYS[1], ARGV[1])
