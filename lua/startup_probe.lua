-- The start-up check of a store's permissions: every command any tollgate script runs, once, on a key of the
-- probe's own (KEYS[1], in the store's namespace), which it leaves as it found it (absent). An ACL user that may
-- not run one of them, or not on the namespace's keys, fails here, at start-up, instead of on the first lease or
-- concurrency slot. Keep the list in step with the scripts (a test compares it with every redis.call in lua/).
local key = KEYS[1]
-- Whatever an interrupted probe left (a timeout of 0 deletes the key).
redis.call('PEXPIRE', key, 0)
redis.call('TIME')
-- As a hash: the algorithms' state and the lease books.
redis.call('HSET', key, 'probe', '1')
redis.call('HMGET', key, 'probe')
redis.call('HGETALL', key)
redis.call('PEXPIRE', key, 60000)
redis.call('PEXPIREAT', key, 9999999999999)
redis.call('PTTL', key)
redis.call('HDEL', key, 'probe')
-- As a sorted set (the hash is gone with its last field): the concurrency slots.
redis.call('ZADD', key, 0, 'probe')
redis.call('PEXPIRE', key, 60000)
redis.call('ZSCORE', key, 'probe')
redis.call('ZCOUNT', key, '-inf', '+inf')
redis.call('ZRANGE', key, 0, 0)
redis.call('ZREMRANGEBYSCORE', key, '(0', '(0')
redis.call('ZREM', key, 'probe')
return 1
