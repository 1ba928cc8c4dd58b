-- exit_list.lua: the exit IPs recorded for a pool's proxies (exit_note.lua).
--
-- KEYS[1] exit hash   id -> exit IP
-- KEYS[2] pool hash   id -> proxy URL (ARGV[1] "count" only)
-- ARGV[1] "count": return {proxies in the pool, exits recorded} (two HLENs:
--         the checker's cheap look for proxies without an exit); absent or
--         "": return {id 1, IP 1, id 2, IP 2, ...} (HGETALL).
if ARGV[1] == 'count' then
  return {redis.call('HLEN', KEYS[2]), redis.call('HLEN', KEYS[1])}
end
return redis.call('HGETALL', KEYS[1])
