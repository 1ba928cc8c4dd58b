-- member_heartbeat.lua: register or refresh one server in its pool's member
-- list, drop the members whose registration ran out, and return who is live.
--
-- KEYS[1] members zset  member ID -> unix ms at which its registration ends
-- KEYS[2] owners hash   member ID -> token of the process that holds the ID
-- ARGV[1] member ID     ARGV[2] owner token     ARGV[3] registration TTL ms
--
-- Returns {1, now ms, ID, ID, ...}: the live members, this one included, or
--         {0, ms at which the holder's registration ends} when another
--         process holds the ID and is live: nothing changed.
-- Both keys expire with the last live registration, so a pool whose servers
-- all stopped leaves nothing behind. Time comes from the server (TIME).
local now = now_ms()

local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(stale) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end

local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder and holder ~= ARGV[2] then
  local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if ends then return {0, checked(ends, KEYS[1], 'registration end of ' .. ARGV[1], 0, MAX_MS)} end
end

redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local keep = checked(last[2], KEYS[1], 'registration end', 0, MAX_MS) - now + 1000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)

local out = {1, now}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do out[#out + 1] = id end
return out
