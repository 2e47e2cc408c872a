end
-- The rest of the store operations (see ops_open.lua), mirrored by crates/tollgate-core/src/algorithm/lockout.rs.

local ops_locked_until = 0
if ops_lockout > 0 then
  local stored = ops_server.call('HMGET', ops_key, 'locked_until')[1]
  if stored then
    ops_locked_until = tonumber(stored)
  end
end
local ops_locked = ops_locked_until > ops_now
-- A locked key's refusal spends nothing: the algorithm decides (for its reset) without writing.
ops_writes = not (ops_peek or ops_locked)
local reply = decide_unlocked()
if reply[1] == 2 then
  -- A cost that can never be admitted neither starts nor reports a lockout.
  return reply
end
if ops_locked then
  return { 1, 0, math.max(reply[3], ops_locked_until), math.max(reply[4], ops_locked_until - ops_now), ops_now }
end
if reply[1] == 1 and ops_lockout > 0 then
  local until_us = ops_now + ops_lockout
  if not ops_peek then
    ops_server.call('HSET', ops_key, 'locked_until', int(until_us))
    -- The key lives at least until the lockout ends.
    local ttl = math.max(div_ceil(ops_lockout, 1000), ops_min_ttl_ms)
    if ops_server.call('PTTL', ops_key) < ttl then
      ops_server.call('PEXPIRE', ops_key, int(ttl))
    end
  end
  return { 1, 0, math.max(reply[3], until_us), math.max(reply[4], ops_lockout), ops_now }
end
return reply
