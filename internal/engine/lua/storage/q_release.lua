-- q_release.lua: hand a delivery back undone, as if it had not been made.
--
-- KEYS (every queue script takes the same seven, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> deliveries so far
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
-- ARGV[1] request ID   ARGV[2] delivery number
--
-- The request goes to the end of the ready list and the delivery does not
-- count towards the maximum.
-- Returns 1 released, 0 stale (delivered again since, or acknowledged).
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then return 0 end
local n = tonumber(ARGV[2]) - 1
if n > 0 then
  redis.call('HSET', KEYS[3], ARGV[1], n)
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
