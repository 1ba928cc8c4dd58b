-- list.lua: every proxy of one pool.
--
-- KEYS[1] pool hash   id -> proxy URL
--
-- Returns the flat list id, URL, id, URL, ...
return redis.call('HGETALL', KEYS[1])
