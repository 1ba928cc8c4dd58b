-- proxy_states.lua: the state of every proxy of one pool on one site
-- (read-only), slot by slot as state.lua counts them.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] free zset        "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[3] lease hash       "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash     id -> "<bans in a row>|<ms of the last>|<its end>"
-- KEYS[5] quarantine zset  id -> end (ms) of a ban on every site
-- KEYS[6] dead hash        id -> "<ms>|<reason>"
-- KEYS[7] meta hash        "slots" -> concurrency
-- ARGV[1] slots per proxy the caller is configured with, used when the pool
--         has not fixed it yet (nothing was ever leased from it)
--
-- Returns {now ms, slots, proxies, then 13 items per proxy:
--   id, URL, dead entry ("<ms>|<reason>", or "" if not dead),
--   bans in a row on the scope, end ms of a ban on every site (0 if none now),
--   free, leased, cooling, quarantined and dead slots,
--   latest expiry of its live leases, latest end of its cooling slots,
--   latest end of its quarantine (0 when it is not quarantined)}.
--
-- A slot is free when its score has passed; else leased while a lease on it
-- is live, dead at DEAD, quarantined while a ban on the scope or on every
-- site runs, and cooling otherwise: the order of state.lua, whose counts the
-- sums over the proxies equal. (On a site with no free set, state.lua counts
-- a proxy banned on every site as free, where its first lease starts it
-- quarantined, as here, and one slot per proxy before the pool's first lease
-- fixes the concurrency, where this script takes ARGV[1].) A leased slot
-- that a ban pushed past its lease's end (a proxy banned while a request
-- through it is under way) counts as leased, but the proxy is quarantined
-- until that score.
--
-- Values of the hashes are read digits only, so a damaged one counts as
-- absent.
-- Scores are read with num (lib.lua), not tonumber.
local now = now_ms()
local slots = meta_slots(KEYS[7], tonumber(ARGV[1]) or 1)

local function pairs_of(flat, f)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = f(flat[i + 1]) end
  return m
end
local function ends(v) return tonumber(string.match(v, '|(%d+)$')) end

local pool = redis.call('HGETALL', KEYS[1])
local dead = pairs_of(redis.call('HGETALL', KEYS[6]), function(v) return v end)
local strikes = pairs_of(redis.call('HGETALL', KEYS[4]), function(v)
  return {n = tonumber(string.match(v, '^(%d+)|')) or 0, ends = ends(v) or 0}
end)
local all = pairs_of(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf', 'WITHSCORES'), num)
local tracked = redis.call('EXISTS', KEYS[2]) == 1
local scores, leases = {}, {}
if tracked then
  scores = pairs_of(redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'), num)
  leases = pairs_of(redis.call('HGETALL', KEYS[3]), ends)
end

local out = {now, slots, #pool / 2}
for i = 1, #pool, 2 do
  local id = pool[i]
  local st = strikes[id] or {n = 0, ends = 0}
  local allEnd = all[id] or 0
  local banned = st.ends > now or allEnd > now
  local free, leased, cooling, quarantined, deadSlots = 0, 0, 0, 0, 0
  local leaseUntil, coolUntil, quarUntil = 0, 0, 0
  if not tracked then
    -- Never leased for this site (or its keys idled out): the first lease
    -- starts dead proxies dead and those banned on every site quarantined
    -- (lease.lua), every other one free.
    if dead[id] then
      deadSlots = slots
    elseif allEnd > now then
      quarantined, quarUntil = slots, allEnd
    else
      free = slots
    end
  end
  for s = 0, tracked and slots - 1 or -1 do
    local m = id .. ':' .. s
    local sc = scores[m]
    if sc == nil then
      -- Not tracked on this site: in no state (state.lua counts it nowhere).
    elseif sc <= now then
      free = free + 1
    else
      local exp = leases[m]
      if exp and exp > now then
        leased = leased + 1
        leaseUntil = math.max(leaseUntil, exp)
        if banned and sc > exp and sc < DEAD then quarUntil = math.max(quarUntil, sc) end
      elseif sc >= DEAD then
        deadSlots = deadSlots + 1
      elseif banned then
        quarantined = quarantined + 1
        quarUntil = math.max(quarUntil, sc)
      else
        cooling = cooling + 1
        coolUntil = math.max(coolUntil, sc)
      end
    end
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, pool[i + 1], dead[id] or '', st.n, allEnd
  out[n + 6], out[n + 7], out[n + 8], out[n + 9], out[n + 10] = free, leased, cooling, quarantined, deadSlots
  out[n + 11], out[n + 12], out[n + 13] = leaseUntil, coolUntil, quarUntil
end
return out
