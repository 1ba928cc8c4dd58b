-- q_ack.lua: acknowledge deliveries: each request done leaves the queue.
--
-- KEYS (every queue script takes the same seven, in this order):
--   KEYS[1] ready list      request IDs ready for delivery
--   KEYS[2] data hash       ID -> serialized request
--   KEYS[3] tries hash      ID -> deliveries so far
--   KEYS[4] inflight zset   ID -> unix ms at which it is delivered again
--   KEYS[5] dead zset       ID -> unix ms it was dead-lettered
--   KEYS[6] why hash        ID -> last failure
--   KEYS[7] seq string      last ID handed out
-- ARGV[1] request ID   ARGV[2] delivery number   ARGV[3], ARGV[4] the next
-- pair, and so on (acknowledgements batched into one round trip)
--
-- Returns one code per pair, in order:
--   1 acknowledged,
--   0 stale (delivered again since, or already acknowledged): nothing changed.
-- A request dead-lettered after this delivery failed, and then acknowledged
-- (it succeeded after all), leaves the dead-letter list too. If a timed-out
-- delivery's ID is still in the ready list, q_pop drops it later.
local out = {}
for i = 1, #ARGV - 1, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id) ~= ARGV[i + 1] then
    out[#out + 1] = 0
  else
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('ZREM', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    out[#out + 1] = 1
  end
end
return out
