-- The rest of the set's decision (see set_open.lua).

local set_algorithms = { tb = token_bucket, sw = sliding_window, fw = fixed_window }
-- Where each algorithm reads its cost among its five arguments.
local set_cost_at = { tb = 4, sw = 4, fw = 3 }
local set_answers, set_refused = {}, false
local function set_decide(i, cost)
  local at = 2 + (i - 1) * 7
  local algorithm = ARGV[at]
  local args = { ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5], '' }
  if cost then
    args[set_cost_at[algorithm]] = cost
  end
  return set_algorithms[algorithm]({ KEYS[i] }, args), ARGV[at + 1] == '1'
end
for i = 1, #KEYS do
  local reply, enforced = set_decide(i, nil)
  set_answers[i] = reply
  if reply[1] ~= 0 and enforced then
    set_refused = true
  end
end
if set_refused then
  -- Nothing is written: a limit that would have admitted reports what it has left, as a request of cost 0.
  set_writes = nil
  for i = 1, #KEYS do
    if set_answers[i][1] == 0 then
      set_answers[i] = set_decide(i, '0')
    end
  end
else
  for _, write in ipairs(set_writes) do
    set_server.call(unpack(write))
  end
end
return set_answers
