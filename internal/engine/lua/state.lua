-- state.lua: how many proxy slots of one pool are in each state for one site.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] busy zset        "<id>:<slot>" -> unix ms until which it is out on the site (none: free)
-- KEYS[3] lease hash       "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash     id -> "<bans in a row>|<ms of the last>|<its end>"
-- KEYS[5] quarantine zset  id -> end (ms) of a ban on every site
-- KEYS[6] dead hash        id -> "<ms>|<reason>"
-- KEYS[7] meta hash        "slots" -> concurrency
-- KEYS[8] pace hash        the cooldown learned for the site (lib.lua's pace_refused)
-- ARGV[1] the caller's concurrency, for a pool that has not recorded one yet
--
-- Returns {free, leased, cooling, quarantined, dead, learned cooldown ms}. A
-- slot is leased while a live lease holds it; else dead while its proxy is
-- (the dead hash); else quarantined while its proxy is banned on every site
-- (the quarantine zset) or while its score on the site has not passed and a
-- ban on the site runs; else cooling while its score has not passed; else
-- free. Only the slots out on the site (its busy set) and the proxies dead
-- or banned everywhere are looked at one by one: free = the rest.
local now = now_ms()
local learned = math.ceil(pace_read(KEYS[8]))
local slots = meta_slots(KEYS[7], tonumber(ARGV[1]) or 1)
local size = redis.call('HLEN', KEYS[1])
local leased, cooling, quarantined, dead = 0, 0, 0, 0
local counted = {}
local busy = redis.call('ZRANGE', KEYS[2], '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
for i = 1, #busy, 2 do
  local v = redis.call('HGET', KEYS[3], busy[i])
  local exp = v and tonumber(string.match(v, '|(%d+)$'))
  if exp and exp > now then
    leased = leased + 1
    counted[busy[i]] = true
  end
end
local all = {}
for _, id in ipairs(redis.call('HKEYS', KEYS[6])) do all[id] = 'dead' end
for _, id in ipairs(redis.call('ZRANGE', KEYS[5], '(' .. now, '+inf', 'BYSCORE')) do
  if not all[id] then all[id] = 'q' end
end
for id, why in pairs(all) do
  if redis.call('HEXISTS', KEYS[1], id) == 1 then
    for s = 0, slots - 1 do
      local m = id .. ':' .. s
      if not counted[m] then
        counted[m] = true
        if why == 'dead' then dead = dead + 1 else quarantined = quarantined + 1 end
      end
    end
  end
end
for i = 1, #busy, 2 do
  local m, score = busy[i], num(busy[i + 1])
  if not counted[m] then
    local id = string.match(m, '^(.*):%d+$') or m
    if score < DEAD and redis.call('HEXISTS', KEYS[1], id) == 1 then
      local st = redis.call('HGET', KEYS[4], id)
      local ends = st and tonumber(string.match(st, '|(%d+)$'))
      if ends and ends > now then
        quarantined = quarantined + 1
      else
        cooling = cooling + 1
      end
    end
  end
end
local free = math.max(size * slots - leased - cooling - quarantined - dead, 0)
return {free, leased, cooling, quarantined, dead, learned}
