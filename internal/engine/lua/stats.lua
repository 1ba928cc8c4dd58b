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
-- A slot with no entry in the site's busy set (KEYS[2]) is free there
-- unless its proxy is dead or banned on every site (the pool's dead hash
-- and quarantine zset, named from KEYS[1]'s prefix "{prefix:pool}"); the
-- busy set's entries whose score passed (not pruned yet) are free too. If
-- the pool records no concurrency yet, every slot counts as free: -1 in
-- "tracked", no lease read (cursor "0").
local now = now_ms()
local size = redis.call('HLEN', KEYS[1])
local slots = redis.call('HGET', KEYS[4], 'slots')
local k = 0
if slots then
  k = tonumber(slots)
  if not k or k < 1 or k > MAX_SLOTS or k ~= math.floor(k) then k = -1 end
end
if k <= 0 then return {size, -1, -1, 0, 0, k, '0'} end
local tracked = redis.call('ZCARD', KEYS[2])
local out = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
-- Dead proxies, and those banned on every site, are out on the site
-- whatever its busy set says: their death or ban wrote the busy set of the
-- site it happened on only (lease.lua reads the dead hash and the
-- quarantine zset). Their slots the busy set does not count out are added,
-- each once, for up to AWAY of them (bounded work); past that, all of their
-- slots are (an estimate: a slot out on the site counts twice).
local AWAY = 256
local base = pool_prefix(string.sub(KEYS[1], 1, #KEYS[1] - #':proxies'))
if base then
  local dk, qk = base .. ':dead', base .. ':quarantine'
  local nd, nq = redis.call('HLEN', dk), redis.call('ZCOUNT', qk, '(' .. now, '+inf')
  if nd + nq > 0 and (nd + nq) * k <= AWAY * 4 and nd + nq <= AWAY then
    local ids = {}
    for _, id in ipairs(redis.call('HKEYS', dk)) do ids[id] = true end
    for _, id in ipairs(redis.call('ZRANGE', qk, '(' .. now, '+inf', 'BYSCORE')) do ids[id] = true end
    for id in pairs(ids) do
      if redis.call('HEXISTS', KEYS[1], id) == 1 then
        for s = 0, k - 1 do
          local sc = num(redis.call('ZSCORE', KEYS[2], id .. ':' .. s))
          if not sc or sc <= now then out = out + 1 end
        end
      end
    end
  elseif nd + nq > 0 then
    out = out + (nd + nq) * k
  end
end
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
