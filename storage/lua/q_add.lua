-- q_add.lua: append a request to the queue.
--
-- KEYS (every queue script takes the same seven, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> deliveries so far
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
-- ARGV[1] serialized request
--
-- Returns the new request ID.
local id = redis.call('INCR', KEYS[7])
redis.call('HSET', KEYS[2], id, ARGV[1])
redis.call('RPUSH', KEYS[1], id)
return id
