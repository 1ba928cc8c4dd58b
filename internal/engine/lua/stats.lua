-- stats.lua: a read-only snapshot of one pool as seen by one site.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] busy zset   "<id>:<slot>" -> unix ms until which it is out on the site
-- KEYS[3] lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] meta hash   "slots" -> the concurrency the pool records
--
-- Returns {proxies in the pool, slots free now, live leases, slots tracked,
--          slots not free (leased, cooling down or quarantined), lease records,
--          recorded concurrency (0: none yet, -1: not a positive integer)}.
-- A slot with no entry in the site's busy set (KEYS[2]) is free there; the
-- busy set's entries whose score passed (not pruned yet) are free too. If the
-- site has no busy set, or the pool records no concurrency yet, every slot
-- counts as free: -1 in "tracked".
local now = now_ms()
local size = redis.call('HLEN', KEYS[1])
local slots = redis.call('HGET', KEYS[4], 'slots')
local k = 0
if slots then
  k = tonumber(slots)
  if not k or k < 1 or k > MAX_SLOTS or k ~= math.floor(k) then k = -1 end
end
if k <= 0 or redis.call('EXISTS', KEYS[2]) == 0 then return {size, -1, 0, -1, 0, 0, k} end
local tracked = redis.call('ZCARD', KEYS[2])
local out = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local free = math.max(size * k - out, 0)
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
return {size, free, live, tracked, out, records, k}
