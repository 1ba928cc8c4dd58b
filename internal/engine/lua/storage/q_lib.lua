-- q_lib.lua: what the queue scripts share. A delivery is named by its
-- token: the request ID, the delivery number (the tries count it set) and
-- the pop ID of the GetRequest call that made it, a random nonce the client
-- generated. The tries count alone repeats (Requeue starts it again at 1,
-- and a Redis that lost its data hands out request IDs from 1 again); the
-- pop ID does not, so a late acknowledgement of an earlier delivery never
-- settles a later one. A delivery made by an earlier version carries no
-- pop ID (its token has none, and no lease is recorded for it): "".

-- current reports whether the delivery (id, n, p) is the request's latest.
local function current(id, n, p)
  if redis.call('HGET', KEYS[3], id) ~= n then return false end
  return (redis.call('HGET', KEYS[8], id) or '') == (p or '')
end

-- unlease forgets the pop ID of id's latest delivery, and that pop's record.
local function unlease(id)
  local old = redis.call('HGET', KEYS[8], id)
  if old then
    redis.call('HDEL', KEYS[9], old)
    redis.call('HDEL', KEYS[8], id)
  end
end

-- lease records that pop p made id's latest delivery.
local function lease(id, p)
  unlease(id)
  redis.call('HSET', KEYS[8], id, p)
  redis.call('HSET', KEYS[9], p, id)
end
