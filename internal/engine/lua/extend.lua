-- extend.lua: push a live lease's expiry to now + TTL, only for its owner.
--
-- KEYS[1] free zset   "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- ARGV[1] member      ARGV[2] owner token   ARGV[3] lease TTL ms
--
-- Returns the new expiry (unix ms), or 0 if the caller no longer owns a live
-- lease (expired, released, or leased by someone else): nothing changed.

local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local sep = string.find(v, '|', 1, true)
if not sep or string.sub(v, 1, sep - 1) ~= ARGV[2] then return 0 end
local expiry = tonumber(string.sub(v, sep + 1))
local now = now_ms()
if not expiry or expiry <= now then return 0 end

local newexp = now + tonumber(ARGV[3])
local score = num(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not score then return 0 end
if score < newexp then
  redis.call('ZADD', KEYS[1], newexp, ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. '|' .. newexp)
return newexp
