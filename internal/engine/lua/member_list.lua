-- member_list.lua: the live members of a pool, read-only.
--
-- KEYS[1] members zset  member ID -> unix ms at which its registration ends
--
-- Returns {now ms, ID, ID, ...}: the members whose registration has not
-- ended by the server's clock (TIME), in no particular order.
local now = now_ms()
local out = {now}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do out[#out + 1] = id end
return out
