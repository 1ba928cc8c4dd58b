-- exit_list.lua: the exit IPs recorded for a pool's proxies (exit_note.lua).
--
-- KEYS[1] exit hash   id -> exit IP
-- Returns {id 1, IP 1, id 2, IP 2, ...} (HGETALL).
return redis.call('HGETALL', KEYS[1])
