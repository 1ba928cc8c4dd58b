-- q_release.lua: hand a delivery back undone, as if it had not been made.
--
-- include: q_lib.lua
--
-- KEYS (every queue script takes the same eight, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> "<deliveries so far>|<pop ID of the latest>"
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
--   KEYS[8] pops hash       pop ID -> ID: the delivery each pop made, kept
--                           while it is the request's latest and not dead (a
--                           lost reply's pop, sent again, gets the same
--                           delivery)
-- ARGV[1] request ID   ARGV[2] delivery number   ARGV[3] pop ID
--
-- The request goes to the end of the ready list and the delivery does not
-- count towards the maximum. The count goes back without a pop ID: no
-- token names the request until its next delivery.
-- Returns 1 released, 0 stale (delivered again since, or acknowledged).
if not current(ARGV[1], ARGV[2], ARGV[3]) then return 0 end
if redis.call('ZREM', KEYS[4], ARGV[1]) == 0 then return 0 end
local n = tonumber(ARGV[2]) - 1
if n > 0 then
  redis.call('HSET', KEYS[3], ARGV[1], n)
else
  redis.call('HDEL', KEYS[3], ARGV[1])
end
forget_pop(ARGV[3])
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
