-- stats.lua: a read-only look at one pool as seen by one site, in bounded
-- calls (issue 14): each call reads the counts (O(1) or O(log N) each) and
-- one HSCAN page of the site's lease hash for its live leases; the caller
-- (pool.go) reads every page and counts a live lease once.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] busy zset   "<id>:<slot>" -> unix ms until which it is out on the site
-- KEYS[3] lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] meta hash   "slots" -> the concurrency the pool records
-- ARGV[1] HSCAN cursor of the lease hash, "0" for the first page
-- ARGV[2] HSCAN count
--
-- Returns {proxies in the pool, slots free now, slots tracked, slots not
--          free (leased, cooling down or quarantined), lease records,
--          recorded concurrency (0: none yet, -1: not a positive integer),
--          next cursor ("0" after the last page), the page's live leases
--          (lease hash fields)...}.
-- A slot with no entry in the site's busy set (KEYS[2]) is free there; the
-- busy set's entries whose score passed (not pruned yet) are free too. If the
-- site has no busy set, or the pool records no concurrency yet, every slot
-- counts as free: -1 in "tracked", no lease read (cursor "0").
local now = now_ms()
local size = redis.call('HLEN', KEYS[1])
local slots = redis.call('HGET', KEYS[4], 'slots')
local k = 0
if slots then
  k = tonumber(slots)
  if not k or k < 1 or k > MAX_SLOTS or k ~= math.floor(k) then k = -1 end
end
if k <= 0 or redis.call('EXISTS', KEYS[2]) == 0 then return {size, -1, -1, 0, 0, k, '0'} end
local tracked = redis.call('ZCARD', KEYS[2])
local out = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
local free = math.max(size * k - out, 0)
local records = redis.call('HLEN', KEYS[3])
local r = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', ARGV[2])
local reply = {size, free, tracked, out, records, k, r[1]}
for i = 2, #r[2], 2 do
  local v = r[2][i]
  local sep = string.find(v, '|', 1, true)
  local exp = sep and tonumber(string.sub(v, sep + 1))
  if exp and exp > now then reply[#reply + 1] = r[2][i - 1] end
end
return reply
