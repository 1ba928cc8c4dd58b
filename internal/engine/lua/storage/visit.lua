-- visit.lua: claim a request ID, atomically: set-if-absent, with optional expiry.
--
-- KEYS[1] visited bucket hash   field -> "<expiry>|<owner>" (expiry "0":
--                               forever, else unix ms; owner: the ID of the
--                               queued request whose delivery claimed the
--                               mark, empty for any other claim), or
--                               "<expiry>" alone, a mark an earlier version
--                               wrote (no owner recorded)
-- ARGV[1] field (8-byte request hash)   ARGV[2] TTL ms (0 = forever)
-- ARGV[3] the queue request ID of the delivery claiming it ("" for none)
--
-- Returns 1 claimed (absent or expired: the caller fetches the URL),
--         0 already visited (someone else claimed it and the mark is live),
--         2 already visited, by a mark an earlier version wrote,
--         or, when a queued request's delivery claimed the live mark, that
--         request's ID (a string): already visited, by that request.
-- Time comes from the server's clock (TIME). With a TTL, a few random fields
-- of the bucket are sampled and expired ones removed, so marks of URLs that
-- are never crawled again do not pile up.
local now

-- expiry_of returns the expiry of mark v (0: forever) and its owner ('' for
-- none, nil for an earlier version's mark), or nil for a value this package
-- does not write.
local function expiry_of(v)
  local e, owner = string.match(v, '^([0-9]+)|([0-9]*)$')
  if not e then e = v end
  return tonumber(e), owner
end

-- visited is the reply for a live mark of owner owner.
local function visited(owner)
  if owner == nil then return 2 end
  if owner == '' then return 0 end
  return owner
end

local v = redis.call('HGET', KEYS[1], ARGV[1])
if v then
  local expiry, owner = expiry_of(v)
  if not expiry then corrupt(KEYS[1], 'visited mark is not a number', v) end
  if expiry == 0 then return visited(owner) end
  now = now_ms()
  if expiry > now then return visited(owner) end
end

local suffix = '|' .. (ARGV[3] or '')
local ttl = tonumber(ARGV[2])
if ttl <= 0 then
  redis.call('HSET', KEYS[1], ARGV[1], '0' .. suffix)
  return 1
end
now = now or now_ms()
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + ttl) .. suffix)
local sample = redis.call('HRANDFIELD', KEYS[1], 4, 'WITHVALUES')
for i = 1, #sample, 2 do
  local e = expiry_of(sample[i + 1])
  if e and e > 0 and e <= now then redis.call('HDEL', KEYS[1], sample[i]) end
end
return 1
