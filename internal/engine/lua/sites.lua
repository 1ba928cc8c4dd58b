-- sites.lua: the sites leased from one pool recently, most recent first.
--
-- KEYS[1] sites zset  site -> unix ms of its last lease
-- ARGV[1] idle TTL ms: sites idle for longer are left out
--
-- Returns the flat list site, last-lease ms, site, last-lease ms, ...
local now = now_ms()
return redis.call('ZRANGE', KEYS[1], '+inf', now - tonumber(ARGV[1]), 'BYSCORE', 'REV', 'WITHSCORES')
