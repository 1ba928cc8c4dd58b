-- q_dead.lua: list dead letters, oldest first. Read-only.
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
-- ARGV[1] first index   ARGV[2] last index (inclusive)
--
-- Returns a flat list: id, dead-since ms, deliveries, reason, request; per dead letter.
local out = {}
local ids = redis.call('ZRANGE', KEYS[5], ARGV[1], ARGV[2], 'WITHSCORES')
for i = 1, #ids, 2 do
  local id = ids[i]
  out[#out + 1] = id
  out[#out + 1] = ids[i + 1]
  local tries = redis.call('HGET', KEYS[3], id) or '0'
  out[#out + 1] = string.match(tries, '^[0-9]+') or '0' -- "<n>|<pop ID>": n
  out[#out + 1] = redis.call('HGET', KEYS[6], id) or ''
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
