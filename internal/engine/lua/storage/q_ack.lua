-- q_ack.lua: acknowledge a delivery: the request is done and leaves the queue.
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
-- Returns 1 acknowledged,
--         0 stale (delivered again since, or already acknowledged): nothing changed.
-- A request dead-lettered after this delivery failed, and then acknowledged
-- (it succeeded after all), leaves the dead-letter list too. If a timed-out
-- delivery's ID is still in the ready list, q_pop drops it later.
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return 1
