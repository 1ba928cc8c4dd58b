-- q_ack.lua: acknowledge deliveries: each request done leaves the queue.
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
-- ARGV[1] request ID   ARGV[2] delivery number   ARGV[3] pop ID ("" for a
-- delivery of an earlier version); ARGV[4..6] the next triple, and so on
-- (acknowledgements batched into one round trip)
--
-- Returns one code per triple, in order:
--   1 acknowledged,
--   0 stale (delivered again since, or already acknowledged): nothing changed.
-- A request dead-lettered after this delivery failed, and then acknowledged
-- (it succeeded after all), leaves the dead-letter list too. If a timed-out
-- delivery's ID is still in the ready list, q_pop drops it later.
local out = {}
for i = 1, #ARGV - 2, 3 do
  local id = ARGV[i]
  if not current(id, ARGV[i + 1], ARGV[i + 2]) then
    out[#out + 1] = 0
  else
    forget_pop(ARGV[i + 2])
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('ZREM', KEYS[4], id)
    redis.call('ZREM', KEYS[5], id)
    out[#out + 1] = 1
  end
end
return out
