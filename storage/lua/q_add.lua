-- q_add.lua: append requests to the queue, in order, atomically.
--
-- KEYS (every queue script takes the same seven, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> deliveries so far
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
-- ARGV[1..n] serialized requests (AddRequest: one; AddURLs: a batch)
--
-- Returns the ID of the last request added.
local last = redis.call('INCRBY', KEYS[7], #ARGV)
local first = last - #ARGV + 1
for i = 1, #ARGV do
  local id = first + i - 1
  redis.call('HSET', KEYS[2], id, ARGV[i])
  redis.call('RPUSH', KEYS[1], id)
end
return last
