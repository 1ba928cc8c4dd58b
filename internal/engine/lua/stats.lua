-- stats.lua: a read-only snapshot of one pool as seen by one site.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] free zset   "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[3] lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] meta hash   "slots" -> the concurrency the pool records
--
-- Returns {proxies in the pool, slots free now, live leases, slots tracked,
--          slots not free (leased, cooling down or quarantined), lease records,
--          recorded concurrency (0: none yet, -1: not a positive integer)}.
-- If the site has no free set yet every slot counts as free: -1 in "tracked".
local now = now_ms()
local size = redis.call('HLEN', KEYS[1])
local slots = redis.call('HGET', KEYS[4], 'slots')
local k = 0
if slots then
  k = tonumber(slots)
  if not k or k < 1 or k > MAX_SLOTS or k ~= math.floor(k) then k = -1 end
end
if redis.call('EXISTS', KEYS[2]) == 0 then return {size, -1, 0, -1, 0, 0, k} end
local free = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local tracked = redis.call('ZCARD', KEYS[2])
local live, records = 0, 0
local cursor = '0'
repeat
  local r = redis.call('HSCAN', KEYS[3], cursor, 'COUNT', 500)
  cursor = r[1]
  for i = 2, #r[2], 2 do
    records = records + 1
    local v = r[2][i]
    local sep = string.find(v, '|', 1, true)
    local exp = sep and tonumber(string.sub(v, sep + 1))
    if exp and exp > now then live = live + 1 end
  end
until cursor == '0'
return {size, free, live, tracked, tracked - free, records, k}
