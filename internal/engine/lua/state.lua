-- state.lua: how many proxy slots of one pool are in each state for one site.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] free zset        "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[3] lease hash       "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash     id -> "<bans in a row>|<ms of the last>|<its end>"
-- KEYS[5] quarantine zset  id -> end (ms) of a ban on every site
-- KEYS[6] dead hash        id -> "<ms>|<reason>"
-- KEYS[7] meta hash        "slots" -> concurrency
-- KEYS[8] pace hash        the cooldown learned for the site (lib.lua's pace_refused)
-- ARGV[1] the caller's concurrency, for a pool that has not recorded one yet
--
-- Returns {free, leased, cooling, quarantined, dead, learned cooldown ms}. Busy slots are looked
-- at one by one (leased first, then dead, then quarantined by a ban; the
-- rest cool down after a release); free slots are counted with ZCOUNT.
local now = now_ms()
local learned = math.ceil(pace_read(KEYS[8]))
local slots = meta_slots(KEYS[7], tonumber(ARGV[1]) or 1)
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- Never leased for this site: every live proxy is free, but for those
  -- banned on every site (the site's first lease starts them quarantined).
  local dead = redis.call('HLEN', KEYS[6])
  local size = redis.call('HLEN', KEYS[1])
  local banned = 0
  for _, id in ipairs(redis.call('ZRANGE', KEYS[5], '(' .. now, '+inf', 'BYSCORE')) do
    if redis.call('HEXISTS', KEYS[1], id) == 1 and redis.call('HEXISTS', KEYS[6], id) == 0 then
      banned = banned + 1
    end
  end
  return {math.max(size - dead - banned, 0) * slots, 0, 0, banned * slots, dead * slots, learned}
end
local free = redis.call('ZCOUNT', KEYS[2], '-inf', now)
local leased, cooling, quarantined, dead = 0, 0, 0, 0
local busy = redis.call('ZRANGE', KEYS[2], '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
for i = 1, #busy, 2 do
  local m, score = busy[i], num(busy[i + 1])
  local v = redis.call('HGET', KEYS[3], m)
  local exp = v and tonumber(string.match(v, '|(%d+)$'))
  if exp and exp > now then
    leased = leased + 1
  elseif score >= DEAD then
    dead = dead + 1
  else
    local id = string.match(m, '^(.*):%d+$') or m
    local s = redis.call('HGET', KEYS[4], id)
    local ends = s and tonumber(string.match(s, '|(%d+)$'))
    local all = num(redis.call('ZSCORE', KEYS[5], id)) or 0
    if (ends and ends > now) or all > now then
      quarantined = quarantined + 1
    else
      cooling = cooling + 1
    end
  end
end
return {free, leased, cooling, quarantined, dead, learned}
