-- visit.lua: claim a request ID, atomically: set-if-absent, with optional expiry.
--
-- KEYS[1] visited bucket hash   field -> "0" (forever) or unix ms of expiry
-- ARGV[1] field (8-byte request hash)   ARGV[2] TTL ms (0 = forever)
--
-- Returns 1 claimed (absent or expired: the caller fetches the URL),
--         0 already visited (someone else claimed it and the mark is live).
-- Time comes from the server's clock (TIME). With a TTL, a few random fields
-- of the bucket are sampled and expired ones removed, so marks of URLs that
-- are never crawled again do not pile up.
local now

local v = redis.call('HGET', KEYS[1], ARGV[1])
if v then
  if v == '0' then return 0 end
  local expiry = tonumber(v)
  if not expiry then corrupt(KEYS[1], 'visited mark is not a number', v) end
  now = now_ms()
  if expiry > now then return 0 end
end

local ttl = tonumber(ARGV[2])
if ttl <= 0 then
  redis.call('HSET', KEYS[1], ARGV[1], '0')
  return 1
end
now = now or now_ms()
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + ttl))
local sample = redis.call('HRANDFIELD', KEYS[1], 4, 'WITHVALUES')
for i = 1, #sample, 2 do
  local e = tonumber(sample[i + 1])
  if e and e > 0 and e <= now then redis.call('HDEL', KEYS[1], sample[i]) end
end
return 1
