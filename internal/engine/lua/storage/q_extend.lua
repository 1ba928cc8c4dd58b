-- q_extend.lua: keep running deliveries invisible: push their in-flight deadlines to now + visibility.
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
-- ARGV[1] visibility timeout ms
-- ARGV[2 ..] request ID, delivery number, pop ID triples: the deliveries to extend
--
-- Returns one code per triple, in order:
--   1 extended: the delivery is still the request's latest and in flight;
--     its deadline is now at least now + visibility (never moved earlier)
--   2 this delivery was the last and the request is dead-lettered: nothing
--     to extend (its acknowledgement still takes it out of the list)
--   0 gone: acknowledged, delivered again since, or back in the ready list;
--     nothing changed
-- A delivery is touched only while it is the request's latest (its tries
-- count and pop ID, q_lib.lua's current), so one that came back and went to another worker is never extended.
-- Time comes from the server's clock (TIME).
local deadline = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV - 2, 3 do
  local id = ARGV[i]
  local code = 0
  if current(id, ARGV[i + 1], ARGV[i + 2]) then
    local score = redis.call('ZSCORE', KEYS[4], id)
    if score then
      if tonumber(score) < deadline then
        redis.call('ZADD', KEYS[4], 'XX', deadline, id)
      end
      code = 1
    elseif redis.call('ZSCORE', KEYS[5], id) then
      code = 2
    end
  end
  out[#out + 1] = code
end
return out
