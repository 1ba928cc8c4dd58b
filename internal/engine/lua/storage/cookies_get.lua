-- cookies_get.lua: read the cookies of one host, refusing oversized hashes. Read-only.
--
-- KEYS[1] cookie hash of the host   "<name>;<path>;<domain>" -> Set-Cookie line
-- ARGV[1] max cookies   ARGV[2] max bytes of all lines together
--
-- Returns field, line, field, line, ... (hash order), or a PSCORRUPT error if
-- the hash is larger than the limits (nothing this package writes is).
local n = redis.call('HLEN', KEYS[1])
if n > tonumber(ARGV[1]) then
  return redis.error_reply('PSCORRUPT cookie hash holds ' .. n .. ' entries, limit ' .. ARGV[1])
end
local kv = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 2, #kv, 2 do total = total + #kv[i] end
if total > tonumber(ARGV[2]) then
  return redis.error_reply('PSCORRUPT cookie hash holds ' .. total .. ' bytes, limit ' .. ARGV[2])
end
return kv
