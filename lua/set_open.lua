-- Several limits decided as one (a set of rate limiters): every limit admits, or none spends anything. tollgate-redis
-- embeds prelude.lua, this file, token_leases.lua, each algorithm script wrapped as a function of its KEYS and
-- ARGV (token_bucket, sliding_window, fixed_window), and set_close.lua, in that order: the algorithms run line for
-- line as they do alone, and this file holds their writes back until every limit has admitted.
--
-- KEYS[i]  limit i's key (on a Redis Cluster every key is in one hash slot: the caller checks)
-- ARGV[1]  now     µs since the epoch; empty: the server's TIME (one instant for every limit)
-- then, per limit, 7 values: its algorithm ('tb', 'sw' or 'fw'), whether its refusal refuses the set ('1'; '0' for
-- a limit in shadow mode, decided and reported only), and the algorithm's own five arguments (its time, the
-- fifth, unused: the set's instant is every limit's).
--
-- Returns one reply per limit, the algorithm's {outcome, remaining, reset_us, retry_after_us, now_us}. When every
-- enforced limit admits, every limit's writes are made; otherwise none is, and a limit that would have admitted
-- answers as a request of cost 0 would (what it has left).

local set_now, set_min_ttl_ms = decision_time(ARGV[1])
local decision_time = function()
  return set_now, set_min_ttl_ms
end

-- The algorithms' redis.call goes through here: reads run, writes are held in `set_writes` (dropped when it is
-- nil) and made in order once the set admits. No algorithm reads a key after writing it, and no two limits of a
-- set share a key (the caller checks), so holding the writes back changes no decision.
local set_server = redis
local set_reads = { HMGET = true, HGET = true, HGETALL = true, TIME = true, PTTL = true }
local set_writes = {}
local redis = setmetatable({
  call = function(command, ...)
    if set_reads[command] then
      return set_server.call(command, ...)
    end
    if set_writes then
      set_writes[#set_writes + 1] = { command, ... }
    end
    return 0
  end,
}, { __index = set_server })
