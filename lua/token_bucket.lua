-- Token bucket with lazy refill, in exact fixed point: a line-for-line port of
-- crates/tollgate-core/src/algorithm/token_bucket.rs (read that file for the reasoning).
--
-- KEYS[1]  the bucket's hash: full_at (µs since the epoch), remainder
-- ARGV[1]  token   size of one token in fixed-point units (Quota::token_bucket_token)
-- ARGV[2]  rate    units accrued per µs (Quota::token_bucket_rate)
-- ARGV[3]  burst   bucket capacity in tokens
-- ARGV[4]  cost    tokens this request takes
-- ARGV[5]  now     µs since the epoch; empty: the server's TIME (no client clock can mint tokens)
-- ARGV[6]  hold    optional: the µs the caller may hold the request back; one admitted within it (and within the
--                  time the burst takes to accrue) is admitted as of that instant, its wait returned as the retry
--                  (token_bucket::decide_held); not on a rebased state nor while tokens are leased
--
-- Returns {outcome, remaining, reset_us, retry_after_us, now_us}; outcome 0 allowed, 1 limited,
-- 2 cost exceeds capacity; retry_after_us is -1 when absent. Integers only: Redis truncates Lua numbers.
-- idiv, div_ceil, int and decision_time come from prelude.lua, settle_leases, write_book and keep_until from
-- token_leases.lua, both prepended when the script is embedded. A key no instance leases tokens of reads one field
-- more than a bucket without leases would, and nothing else changes for it.

local key = KEYS[1]
local token = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now, min_ttl_ms = decision_time(ARGV[5])

local capacity = burst * token
local full_at, remainder = now, 0
local stored = redis.call('HMGET', key, 'full_at', 'remainder', 'leased', 'lease_n', 'lease_due', 'lease_end')
if stored[1] and tonumber(stored[1]) > now then
  full_at, remainder = tonumber(stored[1]), tonumber(stored[2])
end
-- A remainder above what is owed is state from another quota (a limit changed under a running key): nothing owed.
local deficit = math.max((full_at - now) * rate - remainder, 0)
-- More than the debt floor owed (two buckets: a charge after the response may overdraw one, and a debt is kept):
-- the clock stepped back (or the quota shrank). Rebased to an empty bucket refilling from now, and kept (written
-- below even when the request is refused). (Past 2^53 the product loses precision, but any such product exceeds
-- the floor, so the comparison is exact.)
local rebased = deficit > 2 * capacity
if rebased then
  local wait = div_ceil(capacity, rate)
  full_at, remainder = now + wait, wait * rate - capacity
  deficit = capacity
end
-- Tokens leased out (token_bucket_lease.lua) hold the bucket below its capacity: the deficit is at least the
-- leased tokens, and the state is rebuilt from the floored deficit.
local book = nil
if stored[3] then
  local floored
  floored, book = settle_leases(key, now, deficit, token, stored[3], stored[4], stored[5], stored[6])
  if floored ~= deficit or book.swept then
    deficit = floored
    local wait = div_ceil(deficit, rate)
    full_at, remainder = now + wait, wait * rate - deficit
  end
end
-- Kept even when the request is refused: a rebased state, and a swept book (whose dropped tokens stay spent).
local kept = rebased or (book ~= nil and book.swept)
local function keep_rebased()
  if kept then
    redis.call('HSET', key, 'full_at', int(full_at), 'remainder', int(remainder))
    if book and book.swept then
      write_book(key, book)
    end
    redis.call('PEXPIRE', key, int(math.max(div_ceil(keep_until(full_at, book, token, rate) - now, 1000), min_ttl_ms)))
  end
end

if cost > burst then
  local remaining = idiv(math.max(capacity - deficit, 0), token) -- 0 in debt
  keep_rebased()
  return {2, remaining, full_at, -1, now}
end
local need = cost * token
-- Admits the request as of `at` (now, or the instant a held request is admitted as of), the bucket then owing
-- `owed`.
local function admit(at, owed)
  local spent = owed + need
  local wait = div_ceil(spent, rate)
  local new_full_at = at + wait
  -- The state lives exactly until it is indistinguishable from a full (fresh) bucket. A state that is already
  -- full is still written over an existing one, as the Rust store does: after a clock step back it differs.
  if new_full_at > now or stored[1] then
    redis.call('HSET', key, 'full_at', int(new_full_at), 'remainder', int(wait * rate - spent))
    if book and book.swept then
      write_book(key, book)
    end
    local keep = keep_until(new_full_at, book, token, rate)
    redis.call('PEXPIRE', key, int(math.max(div_ceil(keep - now, 1000), min_ttl_ms)))
  end
  return {0, idiv(capacity - spent, token), new_full_at, at > now and at - now or -1, now}
end
if deficit + need <= capacity then
  return admit(now, deficit)
end
-- Earliest t with (full_at - t) * rate - remainder <= capacity - need.
local admit_at = full_at - idiv(capacity - need + remainder, rate)
-- A held request: admitted as of admit_at if that is within the hold (and the time the burst takes to accrue).
local hold = tonumber(ARGV[6])
if hold and not kept and book == nil and admit_at - now <= math.min(hold, idiv(capacity, rate)) then
  return admit(admit_at, math.max((full_at - admit_at) * rate - remainder, 0))
end
local remaining = idiv(math.max(capacity - deficit, 0), token) -- 0 in debt
keep_rebased()
return {1, remaining, full_at, admit_at - now, now}
