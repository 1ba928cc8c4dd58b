-- fallback_seed.lua: give the pool back to a Redis that lost it (restarted
-- empty), from the copy a Switch with a fallback kept (fallback.go).
--
-- KEYS[1] pool hash  id -> proxy URL
-- KEYS[2] meta hash  "emptied" -> 1 when an operator emptied the pool (pool_update.lua)
-- ARGV    id, URL, id, URL, ...
--
-- Seeds only a pool that does not exist and that no operator emptied: a
-- pool emptied on purpose stays empty. Returns the number of proxies written.
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HEXISTS', KEYS[2], 'emptied') == 1 then return 0 end
local n = 0
for i = 1, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('HSET', KEYS[1], unpack(ARGV, i, last))
  n = n + (last - i + 1) / 2
end
if n > 0 then redis.call('HINCRBY', KEYS[2], 'version', 1) end
return n
