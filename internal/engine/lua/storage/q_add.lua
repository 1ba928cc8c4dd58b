-- q_add.lua: append requests to the queue, in order, atomically.
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
-- ARGV[1] most requests queued at once (ready or in flight), 0 for no limit
-- ARGV[2..n+1] serialized requests (AddRequest: one; AddURLs: a batch)
--
-- Returns the ID of the last request added, or -1 (nothing added) when the
-- batch would take the queue past ARGV[1].
local n, max = #ARGV - 1, tonumber(ARGV[1])
if max > 0 and redis.call('HLEN', KEYS[2]) - redis.call('ZCARD', KEYS[5]) + n > max then
  return -1
end
local last = redis.call('INCRBY', KEYS[7], n)
local first = last - n + 1
for i = 1, n do
  local id = first + i - 1
  redis.call('HSET', KEYS[2], id, ARGV[i + 1])
  redis.call('RPUSH', KEYS[1], id)
end
return last
