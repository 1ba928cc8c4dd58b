-- cookies_set.lua: write and delete single cookies of one host, atomically.
--
-- KEYS[1] cookie hash of the host   "<name>;<path>;<domain>" -> Set-Cookie line
-- KEYS[2] registry set of hosts that have a cookie hash
-- ARGV[1] host   ARGV[2] max cookies per host   ARGV[3] n = number of cookies to set
-- ARGV[4 .. 3+2n]  field, line pairs to set
-- ARGV[4+2n ..]    field, expected pairs to delete: the field goes if its line
--                  equals expected, or whatever it holds if expected is ""
--
-- Other cookies of the host are left alone, so writers in several processes
-- never undo each other's unrelated cookies.
-- Returns the number of cookies the host has afterwards.
local n = tonumber(ARGV[3])
local last = 3 + 2 * n
for i = last + 1, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' or redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
if n > 0 then
  local fresh = 0
  for i = 4, last, 2 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then fresh = fresh + 1 end
  end
  if redis.call('HLEN', KEYS[1]) + fresh > tonumber(ARGV[2]) then
    return redis.error_reply('PSCORRUPT host ' .. ARGV[1] .. ' would hold more than ' .. ARGV[2] .. ' cookies')
  end
  redis.call('HSET', KEYS[1], unpack(ARGV, 4, last))
end
local left = redis.call('HLEN', KEYS[1])
if left > 0 then
  redis.call('SADD', KEYS[2], ARGV[1])
else
  redis.call('SREM', KEYS[2], ARGV[1])
end
return left
