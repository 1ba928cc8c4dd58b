-- proxy_states.lua: the state of every proxy of one pool on one site
-- (read-only), slot by slot as state.lua counts them.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] busy zset        "<id>:<slot>" -> unix ms until which it is out on the site (none: free)
-- KEYS[3] lease hash       "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash     id -> "<bans in a row>|<ms of the last>|<its end>"
-- KEYS[5] quarantine zset  id -> end (ms) of a ban on every site
-- KEYS[6] dead hash        id -> "<ms>|<reason>"
-- KEYS[7] meta hash        "slots" -> concurrency
-- KEYS[8] pace hash        (state.lua's; not read here)
-- KEYS[9] fails hash       id -> failures in a row (penalize.lua): a proxy failure's
--                          quarantine writes no strike, so a proxy failing since its
--                          last healthy answer counts quarantined on the site it failed on
-- ARGV[1] slots per proxy the caller is configured with, used when the pool
--         has not fixed it yet (nothing was ever leased from it)
-- ARGV[2] HSCAN cursor of the pool hash, "0" for the first page
-- ARGV[3] HSCAN count: one page, a few lookups per proxy and slot, bounds
--         the work of a call whatever the pool's size (issue 14)
-- ARGV[4] the site whose proxy failures quarantine here, "" for every site
--         (a global scope): see failing_here (lib.lua)
--
-- Returns {next cursor ("0" after the last page), now ms, slots, proxies of
-- the page, then 13 items per proxy:
--   id, URL, dead entry ("<ms>|<reason>", or "" if not dead),
--   bans in a row on the scope, end ms of a ban on every site (0 if none now),
--   free, leased, cooling, quarantined and dead slots,
--   latest expiry of its live leases, latest end of its cooling slots,
--   latest end of its quarantine (0 when it is not quarantined)}.
--
-- A slot is free when its score has passed; else leased while a lease on it
-- is live, dead at DEAD, quarantined while a ban on the scope or on every
-- site runs or the proxy is failing (its failures in a row), and cooling
-- otherwise: the order of state.lua, whose counts the
-- sums over the proxies equal. A slot with no entry in the site's busy set
-- is free there unless its proxy is dead or banned on every site. A leased slot
-- that a ban pushed past its lease's end (a proxy banned while a request
-- through it is under way) counts as leased, but the proxy is quarantined
-- until that score.
--
-- Values of the hashes are read digits only, so a damaged one counts as
-- absent.
-- Scores are read with num (lib.lua), not tonumber.
-- include: states_lib.lua
local now = now_ms()
local slots = meta_slots(KEYS[7], tonumber(ARGV[1]) or 1)

local function ends(v) return v and tonumber(string.match(v, '|(%d+)$')) end
local function after_now(v)
  v = num(v)
  if v and v > now then return v end
end

if ARGV[2] == '0' then read_sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[6], slots, now) end
local page = redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
local pool = page[2]
local out = {page[1], now, slots, #pool / 2}
for i = 1, #pool, 2 do
  local id = pool[i]
  local dead = redis.call('HGET', KEYS[6], id)
  local sv = redis.call('HGET', KEYS[4], id)
  local st = {n = 0, ends = 0}
  if sv then st = {n = tonumber(string.match(sv, '^(%d+)|')) or 0, ends = ends(sv) or 0} end
  local allEnd = after_now(redis.call('ZSCORE', KEYS[5], id)) or 0
  local banned = st.ends > now or allEnd > now or failing_here(KEYS[9], id, ARGV[4] or '')
  local free, leased, cooling, quarantined, deadSlots = 0, 0, 0, 0, 0
  local leaseUntil, coolUntil, quarUntil = 0, 0, 0
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local sc = after_now(redis.call('ZSCORE', KEYS[2], m)) or 0 -- no entry (or a passed score): free on the site
    if sc >= DEAD and not dead then sc = 0 end -- revived
    local exp = ends(redis.call('HGET', KEYS[3], m))
    if exp and exp > now and sc > now then
      leased = leased + 1
      leaseUntil = math.max(leaseUntil, exp)
      if banned and sc > exp and sc < DEAD then quarUntil = math.max(quarUntil, sc) end
    elseif dead then
      deadSlots = deadSlots + 1
    elseif allEnd > now then
      quarantined = quarantined + 1
      quarUntil = math.max(quarUntil, allEnd, sc < DEAD and sc or 0)
    elseif sc <= now then
      free = free + 1
    elseif banned then
      quarantined = quarantined + 1
      quarUntil = math.max(quarUntil, sc)
    else
      cooling = cooling + 1
      coolUntil = math.max(coolUntil, sc)
    end
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, pool[i + 1], dead or '', st.n, allEnd
  out[n + 6], out[n + 7], out[n + 8], out[n + 9], out[n + 10] = free, leased, cooling, quarantined, deadSlots
  out[n + 11], out[n + 12], out[n + 13] = leaseUntil, coolUntil, quarUntil
end
return out
