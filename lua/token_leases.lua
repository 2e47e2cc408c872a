-- Token leases' book in a token bucket's hash, shared by token_bucket.lua and token_bucket_lease.lua (prepended
-- after prelude.lua). A line-for-line port of crates/tollgate-core/src/algorithm/token_bucket_lease.rs (read that
-- file for the proof that the fleet never admits more than burst + rate x T in any interval T).
--
-- Fields beside full_at and remainder, present only while some instance holds a lease on the key:
--   leased     tokens leased out and not yet reported spent or returned (O; the bucket holds at most burst - O)
--   lease_n    how many lease records there are
--   lease_due  no record expires before this instant (µs): the next sweep
--   lease_end  the latest record deadline (µs)
--   l:<id>     one instance's record, "amount:deadline:seq" (tokens it may still hold, µs, its last call's number)

local function parse_lease(v)
  local a, d, s = string.match(v, '^(%d+):(%d+):(%d+)$')
  return tonumber(a), tonumber(d), tonumber(s)
end

-- Floors `deficit` at the leased tokens (the refill stops at capacity - leased) and, once a record may have
-- expired, drops the expired records: their tokens are lost, never refilled at once (the deficit is floored with
-- the book as it was, before they are dropped). Returns the deficit and the book {leased, n, due, end, swept}.
local function settle_leases(key, now, deficit, token, stored_leased, stored_n, stored_due, stored_end)
  local book = {leased = tonumber(stored_leased), n = tonumber(stored_n), due = tonumber(stored_due),
    last = tonumber(stored_end), swept = false}
  deficit = math.max(deficit, book.leased * token)
  if now >= book.due then
    book.swept = true
    book.leased, book.n, book.due, book.last = 0, 0, -1, 0
    local fields = redis.call('HGETALL', key)
    for i = 1, #fields, 2 do
      if string.sub(fields[i], 1, 2) == 'l:' then
        local amount, deadline = parse_lease(fields[i + 1])
        if deadline <= now then
          redis.call('HDEL', key, fields[i])
        else
          book.leased = book.leased + amount
          book.n = book.n + 1
          if book.due < 0 or deadline < book.due then
            book.due = deadline
          end
          book.last = math.max(book.last, deadline)
        end
      end
    end
  end
  return deficit, book
end

-- Writes the book's summary fields (or removes them with the last record).
local function write_book(key, book)
  if book.n == 0 then
    redis.call('HDEL', key, 'leased', 'lease_n', 'lease_due', 'lease_end')
  else
    redis.call('HSET', key, 'leased', int(book.leased), 'lease_n', int(book.n), 'lease_due', int(book.due),
      'lease_end', int(book.last))
  end
end

-- The instant until which the key must live: a full bucket, and every lease's tokens refilled after its deadline.
local function keep_until(full_at, book, token, rate)
  if book == nil or book.n == 0 then
    return full_at
  end
  return math.max(full_at, book.last + div_ceil(book.leased * token, rate))
end
