-- q_pop.lua: deliver the next requests, keeping each in flight until acknowledged.
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
-- ARGV[1] visibility timeout ms   ARGV[2] max deliveries   ARGV[3] max request bytes
-- ARGV[4..] one pop ID per GetRequest call (calls batched into one round
-- trip): a nonce the client made for the call, or, when the client got no
-- reply to an earlier pop, that pop's ID again.
--
-- Returns {k, wait, pop ID 1, id 1, delivery number 1, request 1, ..., pop
-- ID k, ...}: the k requests delivered (0 <= k <= number of pop IDs), each
-- with the pop ID it went to, and, when some pop got none (nothing more is
-- ready), wait: ms until the next in-flight request comes back (-1 when
-- nothing is in flight; 0 when every pop got one).
-- A pop ID whose delivery is still the request's latest (the client never
-- got that reply: a timeout, a lost connection) gets the same delivery
-- again, with its deadline renewed and without counting it again: a
-- delivery the client never received does not bring the request closer to
-- the dead-letter list. Any other pop ID gets a new delivery.
-- Then requests whose visibility timeout (or retry delay) has passed come
-- back to the head of the ready list, or go to the dead-letter list after
-- their last delivery. IDs whose request was acknowledged meanwhile are
-- dropped on the way. Time comes from the server's clock (TIME).
local now = now_ms()
local vis, maxd, maxb = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want = #ARGV - 3

-- tries returns the deliveries of id so far (0 if none is recorded) and
-- the pop ID of the latest ('' for none), or nil if the recorded value is
-- not what this package writes (see q_lib.lua): that request alone is then
-- dead-lettered.
local function tries(id)
  return split_tries(redis.call('HGET', KEYS[3], id))
end

-- bury dead-letters id. Its latest pop is forgotten: a dead delivery is
-- not handed out again, so the record would only wait for Requeue or Ack.
local function bury(id, reason)
  local _, p = tries(id)
  forget_pop(p)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[5], now, id)
  redis.call('HSET', KEYS[6], id, reason)
end

local out = {0, 0}
local k = 0
local served = {}

-- emit appends the delivery of request id (its nth, payload) to pop p to
-- the reply.
local function emit(p, id, n, payload)
  k = k + 1
  out[#out + 1] = p
  out[#out + 1] = id
  out[#out + 1] = n
  out[#out + 1] = payload
end

-- Pops sent again: the same delivery, if it is still the request's latest
-- (and not dead or acknowledged); a record that no longer is is deleted.
for i = 1, want do
  local p = ARGV[3 + i]
  local id = redis.call('HGET', KEYS[8], p)
  local n, latest
  if id then n, latest = tries(id) end
  if n and n > 0 and latest == p and not redis.call('ZSCORE', KEYS[5], id) then
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
      if not redis.call('ZSCORE', KEYS[4], id) then
        redis.call('LREM', KEYS[1], 1, id) -- it came back meanwhile
      end
      redis.call('ZADD', KEYS[4], now + vis, id)
      served[i] = true
      emit(p, id, n, payload)
    end
  end
  if id and not served[i] then redis.call('HDEL', KEYS[8], p) end
end

local due = redis.call('ZRANGE', KEYS[4], '-inf', now, 'BYSCORE', 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  local n, p = tries(id)
  if redis.call('HEXISTS', KEYS[2], id) == 0 then
    redis.call('ZREM', KEYS[4], id)  -- acknowledged meanwhile: forget it
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[6], id)
    forget_pop(p)
  elseif not n or n >= maxd then
    local why = redis.call('HGET', KEYS[6], id)
    if not n then
      why = 'corrupt delivery count'
    elseif not why then
      why = 'not acknowledged within the visibility timeout, ' .. n .. ' deliveries'
    end
    bury(id, why)
  else
    redis.call('ZREM', KEYS[4], id)
    redis.call('LPUSH', KEYS[1], id)
  end
end

local next_pop = 1
for _ = 1, 50 + want do
  while next_pop <= want and served[next_pop] do next_pop = next_pop + 1 end
  if next_pop > want then break end
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local payload = redis.call('HGET', KEYS[2], id)
  local size = payload and #payload or 0
  if size == 0 then
    local _, p = tries(id)
    forget_pop(p)
    redis.call('HDEL', KEYS[3], id)  -- acknowledged or cleared meanwhile
  elseif redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id) then
    -- already in flight or dead: a stale duplicate of the ID, skip it
  elseif size > maxb then
    bury(id, 'request of ' .. size .. ' bytes exceeds the limit of ' .. maxb)
  else
    local n, old = tries(id)
    if not n then
      bury(id, 'corrupt delivery count')
    else
      local p = ARGV[3 + next_pop]
      served[next_pop] = true
      n = n + 1
      forget_pop(old)
      redis.call('HSET', KEYS[3], id, tries_value(n, p))
      redis.call('HSET', KEYS[8], p, id)
      redis.call('ZADD', KEYS[4], now + vis, id)
      emit(p, id, n, payload)
    end
  end
end
out[1] = k
if k == want then return out end

local head = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #head == 0 then
  out[2] = -1
else
  out[2] = math.max(1, tonumber(head[2]) - now)
end
return out
