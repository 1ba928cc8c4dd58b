-- q_nack.lua: fail a delivery: retry later, or dead-letter it after the last delivery.
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
-- ARGV[1] request ID   ARGV[2] delivery number   ARGV[3] pop ID (see q_lib.lua)
-- ARGV[4] reason   ARGV[5] retry delay ms   ARGV[6] max deliveries
-- ARGV[7] "1": dead-letter now
--
-- Returns 1 retry scheduled, 2 dead-lettered,
--         0 stale (delivered again since, acknowledged, or already dead): nothing changed.
if not current(ARGV[1], ARGV[2], ARGV[3]) then return 0 end
if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[6], ARGV[1], ARGV[4])
if ARGV[7] == '1' or tonumber(ARGV[2]) >= tonumber(ARGV[6]) then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZADD', KEYS[5], now, ARGV[1])
  forget_pop(ARGV[3]) -- a dead delivery is not handed out again
  return 2
end
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), ARGV[1])
return 1
