-- q_requeue.lua: move a dead letter back to the queue, with a fresh delivery count.
--
-- KEYS (every queue script takes the same seven, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> deliveries so far
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
-- ARGV[1] request ID
--
-- Returns 1 requeued, 0 not in the dead-letter list.
if redis.call('ZREM', KEYS[5], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
