-- Token bucket lease: an instance takes a batch of up to `want` tokens from the bucket in one call, reports what
-- it has left of its earlier batch, or returns that (ending its lease). A line-for-line port of
-- crates/tollgate-core/src/algorithm/token_bucket_lease.rs (read that file for the reasoning and the proof).
--
-- KEYS[1]  the bucket's hash (token_bucket.lua's): full_at, remainder, and the lease book (token_leases.lua)
-- ARGV[1]  token     size of one token in fixed-point units (Quota::token_bucket_token)
-- ARGV[2]  rate      units accrued per µs (Quota::token_bucket_rate)
-- ARGV[3]  burst     bucket capacity in tokens
-- ARGV[4]  instance  the caller's instance id (digits)
-- ARGV[5]  seq       the caller's call number: increasing per instance; a call not above its record's is stale
-- ARGV[6]  want      tokens wanted (capped at the burst); 0 with end = 1 returns the batch
-- ARGV[7]  unspent   tokens the caller still held of its batch when it sent this call (never more than its record)
-- ARGV[8]  ttl       the lease's lifetime in µs: the caller spends nothing of it from its send instant + ttl on
-- ARGV[9]  end       1: return the unspent tokens and drop the record
-- ARGV[10] now       µs since the epoch; empty: the server's TIME
-- ARGV[11] lockout   the policy's lockout in µs (0: none, and a stored lockout is ignored): a locked key grants
--                    nothing (the call is made with want 0) and answers as a refused request would, its
--                    lockout's end in reset and retry (crates/tollgate-core/src/algorithm/lockout.rs, `lease`)
--
-- Returns {granted, remaining, reset_us, retry_after_us, now_us, deadline_us, stale, held}: remaining is the
-- bucket's content after the grant (tokens no instance holds), retry_after_us (-1 when everything wanted was
-- granted) is when the bucket would hold `want` tokens by refill alone, deadline_us the record's expiry, stale 1
-- when the call was older than the record (nothing changed but the sweep), held the caller's record after the
-- call (0 once ended): the caller keeps no more than that of its batch (less after the store lost the record).
-- Integers only: Redis truncates Lua numbers.

local key = KEYS[1]
local token = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local field = 'l:' .. ARGV[4]
local seq = tonumber(ARGV[5])
local want = math.min(tonumber(ARGV[6]), burst)
local unspent = tonumber(ARGV[7])
local ttl = tonumber(ARGV[8])
local ending = ARGV[9] == '1'
local now, min_ttl_ms = decision_time(ARGV[10])
local lockout = tonumber(ARGV[11])

local capacity = burst * token
local full_at, remainder = now, 0
local stored = redis.call('HMGET', key, 'full_at', 'remainder', 'leased', 'lease_n', 'lease_due', 'lease_end', field,
  'locked_until')
local locked_until = 0
if lockout > 0 and stored[8] and tonumber(stored[8]) > now then
  locked_until = tonumber(stored[8])
  want = 0
end
if stored[1] and tonumber(stored[1]) > now then
  full_at, remainder = tonumber(stored[1]), tonumber(stored[2])
end
local deficit = math.max((full_at - now) * rate - remainder, 0)
if deficit > capacity then
  -- The clock stepped back (or the quota shrank): an empty bucket refilling from now, as token_bucket.lua.
  deficit = capacity
end
local book = {leased = 0, n = 0, due = -1, last = 0, swept = false}
if stored[3] then
  deficit, book = settle_leases(key, now, deficit, token, stored[3], stored[4], stored[5], stored[6])
end
-- This instance's record, unless the sweep just dropped it.
local amount, deadline, record_seq = 0, 0, -1
if stored[7] then
  amount, deadline, record_seq = parse_lease(stored[7])
  if deadline <= now then
    amount, deadline, record_seq = 0, 0, -1
  end
end
local has_record = record_seq >= 0

local granted, stale, held = 0, 0, amount
if seq <= record_seq then
  stale = 1
else
  held = 0
  -- What the caller reports left is what its record still counts; the rest was spent, and stays spent.
  local left = math.min(unspent, amount)
  if has_record then
    book.leased = book.leased - amount
    book.n = book.n - 1
  end
  if ending then
    if has_record then
      deficit = deficit - left * token
      redis.call('HDEL', key, field)
    end
  else
    granted = math.max(math.min(want, idiv(capacity - deficit, token)), 0)
    deficit = deficit + granted * token
    deadline = now + ttl
    book.leased = book.leased + left + granted
    if book.n == 0 or deadline < book.due then
      book.due = deadline
    end
    book.n = book.n + 1
    book.last = math.max(book.last, deadline)
    held = left + granted
    redis.call('HSET', key, field, int(held) .. ':' .. int(deadline) .. ':' .. int(seq))
  end
end

local wait = div_ceil(deficit, rate)
full_at, remainder = now + wait, wait * rate - deficit
redis.call('HSET', key, 'full_at', int(full_at), 'remainder', int(remainder))
write_book(key, book)
-- The key lives at least until its lockout ends.
redis.call('PEXPIRE', key, int(math.max(div_ceil(math.max(keep_until(full_at, book, token, rate), locked_until) - now,
  1000), min_ttl_ms)))

local retry = -1
if granted < want and not ending and stale == 0 then
  -- Earliest t with deficit - (t - now) * rate <= capacity - want * token.
  retry = div_ceil(deficit - (capacity - want * token), rate)
end
local remaining, reset = idiv(capacity - deficit, token), full_at
if locked_until > 0 and not ending and stale == 0 then
  -- Refused as a request is during the lockout (want is 0: no retry of its own).
  remaining, reset, retry = 0, math.max(full_at, locked_until), locked_until - now
end
return {granted, remaining, reset, retry, now, deadline, stale, held}
