-- q_requeue.lua: move a dead letter back to the queue, with a fresh delivery count.
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
-- ARGV[1] request ID
--
-- The tries count starts again and the last delivery's pop ID is forgotten,
-- so no earlier delivery's token names the request again.
-- Returns 1 requeued, 0 not in the dead-letter list.
if redis.call('ZREM', KEYS[5], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[6], ARGV[1])
local _, p = split_tries(redis.call('HGET', KEYS[3], ARGV[1]))
forget_pop(p)
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[1])
return 1
