-- Store operations around a decision script: peek (decide, write nothing) and lockouts. tollgate-redis embeds
-- prelude.lua, this file, an algorithm script (token_bucket.lua or sliding_window.lua) and ops_close.lua, in that
-- order: the algorithm's body becomes the function `decide_unlocked` below, run once, so that these operations
-- share its every line instead of copying them. (token_bucket.lua's lease book, token_leases.lua, comes first in
-- that body, so that its writes go through the wrapper below as well.) The Rust twin is crates/tollgate-core/src/algorithm/lockout.rs.
--
-- ARGV     the algorithm's own arguments (its ARGV[5] is the injected time), then:
-- ARGV[n-1] lockout  µs a denial locks the key for (0: none)
-- ARGV[n]   peek     '1': decide without writing anything (run read-only, EVALSHA_RO), '0': decide
--
-- The reply is the algorithm's: {outcome, remaining, reset_us, retry_after_us, now_us}.

local ops_key = KEYS[1]
local ops_lockout = tonumber(ARGV[#ARGV - 1])
local ops_peek = ARGV[#ARGV] == '1'
-- One instant for the lockout and the algorithm: the algorithm's call of decision_time gets this one.
local ops_now, ops_min_ttl_ms = decision_time(ARGV[5])
local decision_time = function()
  return ops_now, ops_min_ttl_ms
end
-- The algorithm reads its own five arguments only: token_bucket.lua's optional sixth (a hold) is not one the
-- store operations take, and the lockout sits there.
local ARGV = { ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5] }

-- The algorithm's redis.call goes through here: while `ops_writes` is false (a peek, a locked key) its reads run
-- and its writes are skipped. (Under EVALSHA_RO a write that slipped through would fail the script, not write.)
local ops_server = redis
local ops_writes = true
local ops_reads = { HMGET = true, HGET = true, HGETALL = true, TIME = true, PTTL = true }
local redis = setmetatable({
  call = function(command, ...)
    if ops_writes or ops_reads[command] then
      return ops_server.call(command, ...)
    end
    return 0
  end,
}, { __index = ops_server })

local function decide_unlocked()
