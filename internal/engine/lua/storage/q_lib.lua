-- q_lib.lua: what the queue scripts share. A delivery is named by its
-- token: the request ID, the delivery number (the tries count it set) and
-- the pop ID of the GetRequest call that made it, a random nonce the client
-- generated. The tries hash holds both for the request's latest delivery:
-- "<n>|<pop ID>". The count alone repeats (Requeue starts it again at 1,
-- and a Redis that lost its data hands out request IDs from 1 again); the
-- pop ID does not, so a late acknowledgement of an earlier delivery never
-- settles a later one. A count without a pop ID ("<n>") is that of a
-- delivery an earlier version made (its token has none either), or the
-- count a release (q_release) went back to, which no token names.

-- split_tries reads a tries value: the count (0 for none) and the pop ID
-- ('' for none), or nil for a value this package does not write.
local function split_tries(v)
  if not v then return 0, '' end
  local n, p = string.match(v, '^([1-9][0-9]*)|([0-9a-z]+)$')
  if not n then
    n, p = string.match(v, '^([1-9][0-9]*)$'), ''
  end
  if not n or #n > 15 or #p > 16 then return nil end
  return tonumber(n), p
end

-- tries_value is the tries value of delivery n made by pop p.
local function tries_value(n, p)
  if p == nil or p == '' then return tostring(n) end
  return n .. '|' .. p
end

-- current reports whether the delivery (id, n, p) is the request's latest.
local function current(id, n, p)
  return redis.call('HGET', KEYS[3], id) == tries_value(n, p)
end

-- forget_pop deletes the record of pop p, if any.
local function forget_pop(p)
  if p and p ~= '' then redis.call('HDEL', KEYS[8], p) end
end
