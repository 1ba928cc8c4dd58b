-- state.lua: how many proxy slots of one pool are in each state for one
-- site, read in bounded calls (issue 14): each call scans one page of the
-- site's busy set, of the dead hash or of the quarantine zset, whatever
-- the pool's size, and the caller (state.go) sums the pages.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] busy zset        "<id>:<slot>" -> unix ms until which it is out on the site (none: free)
-- KEYS[3] lease hash       "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash     id -> "<bans in a row>|<ms of the last>|<its end>"
-- KEYS[5] quarantine zset  id -> end (ms) of a ban on every site
-- KEYS[6] dead hash        id -> "<ms>|<reason>"
-- KEYS[7] meta hash        "slots" -> concurrency
-- KEYS[8] pace hash        the cooldown learned for the site (lib.lua's pace_refused)
-- KEYS[9] fails hash       id -> failures in a row (penalize.lua): a proxy failure's
--                          quarantine writes no strike, so a slot out of a proxy
--                          failing since its last healthy answer on this site counts quarantined
-- ARGV[1] the caller's concurrency, for a pool that has not recorded one yet
-- ARGV[2] phase: "busy" (the first call), "dead" or "quarantine"
-- ARGV[3] the phase's SCAN cursor, "0" to start it
-- ARGV[4] work budget of the call: entries scanned (x slots for the dead
--         hash and the quarantine zset); a phase whose scan ends with
--         budget left goes on with the next phase in the same call
-- ARGV[5] the site whose proxy failures quarantine here, "" for every site
--         (a global scope): see failing_here (lib.lua)
--
-- Returns {proxies in the pool, slots, learned cooldown ms, next phase
-- ("done" after the last page), its cursor, item, n, item, n, ...}: item is
-- a kind and a name, n the slots it counts. A slot is leased while a live
-- lease holds it (kind "L", name the busy member); else dead while its
-- proxy is (the dead hash: kind "D", name the id, n its slots not leased);
-- else quarantined while its proxy is banned on every site (the quarantine
-- zset: kind "X", name the id) or while its score on the site has not
-- passed and a ban on the site runs or its proxy is failing (kind "Q", the
-- busy member); else
-- cooling while its score has not passed (kind "C", the busy member); else
-- free. Only the slots out on the site (its busy set) and the proxies dead
-- or banned everywhere are looked at one by one: free = the rest. A SCAN
-- may return an entry twice over the pages: the caller counts a name of a
-- phase once.
-- include: states_lib.lua
local now = now_ms()
local learned = math.ceil(pace_read(KEYS[8]))
local slots = meta_slots(KEYS[7], tonumber(ARGV[1]) or 1)
local size = redis.call('HLEN', KEYS[1])
local phase, cursor = ARGV[2], ARGV[3]
local budget = tonumber(ARGV[4])
if not budget or budget < 1 then return redis.error_reply('PSARGS bad state budget') end
local out = {size, slots, learned}
if phase == 'busy' and cursor == '0' then read_sweep(KEYS[1], KEYS[2], KEYS[3], KEYS[6], slots, now) end

-- leased: slot member m is held by a live lease on the site.
local function leased(m)
  local score = num(redis.call('ZSCORE', KEYS[2], m))
  if not score or score <= now then return false end
  local v = redis.call('HGET', KEYS[3], m)
  local exp = v and tonumber(string.match(v, '|(%d+)$'))
  return exp and exp > now or false
end

-- banned: proxy id is dead or banned on every site (its slots below the
-- concurrency are counted by the "dead" or "quarantine" phase).
local function banned(id)
  if redis.call('HEXISTS', KEYS[6], id) == 1 then return true end
  local q = num(redis.call('ZSCORE', KEYS[5], id))
  return q and q > now or false
end

-- free_slots: the slots of proxy id (in the pool) not leased.
local function free_slots(id)
  local n = 0
  for s = 0, slots - 1 do
    if not leased(id .. ':' .. s) then n = n + 1 end
  end
  return n
end

local spent = 0

-- proxy_page scans one page of the proxies of key (cmd: HSCAN of a hash,
-- ZSCAN of a zset, each id with its value) within what is left of the
-- budget, and lists as tag .. id, with their number, the free slots of
-- each proxy of the pool for which keep(id, value) holds; at the end of
-- key the phase moves on to next.
local function proxy_page(cmd, key, tag, next, keep)
  local page = redis.call(cmd, key, cursor, 'COUNT', math.max(math.floor((budget - spent) / slots), 1))
  cursor = page[1]
  local kv = page[2]
  spent = spent + math.max(#kv / 2, 1) * slots
  for i = 1, #kv, 2 do
    local id = kv[i]
    if keep(id, kv[i + 1]) and redis.call('HEXISTS', KEYS[1], id) == 1 then
      local n = free_slots(id)
      if n > 0 then
        out[#out + 1] = tag .. id
        out[#out + 1] = n
      end
    end
  end
  if cursor == '0' then phase = next end
end

while true do
  local left = budget - spent
  if phase == 'busy' then
    local page = redis.call('ZSCAN', KEYS[2], cursor, 'COUNT', left)
    cursor = page[1]
    local kv = page[2]
    spent = spent + math.max(#kv / 2, 1)
    for i = 1, #kv, 2 do
      local m, score = kv[i], num(kv[i + 1])
      if score > now then
        if leased(m) then
          out[#out + 1] = 'L' .. m
          out[#out + 1] = 1
        else
          local id, sfx = string.match(m, '^(.*):(%d+)$')
          id = id or m
          local s = tonumber(sfx)
          if redis.call('HEXISTS', KEYS[1], id) == 1 and
              not (s and s < slots and tostring(s) == sfx and banned(id)) and score < DEAD then
            local st = redis.call('HGET', KEYS[4], id)
            local ends = st and tonumber(string.match(st, '|(%d+)$'))
            if (ends and ends > now) or failing_here(KEYS[9], id, ARGV[5] or '') then
              out[#out + 1] = 'Q' .. m
            else
              out[#out + 1] = 'C' .. m
            end
            out[#out + 1] = 1
          end
        end
      end
    end
    if cursor == '0' then phase = 'dead' end
  elseif phase == 'dead' then
    proxy_page('HSCAN', KEYS[6], 'D', 'quarantine', function() return true end)
  elseif phase == 'quarantine' then
    proxy_page('ZSCAN', KEYS[5], 'X', 'done', function(id, ends)
      return num(ends) > now and redis.call('HEXISTS', KEYS[6], id) == 0
    end)
  else
    return redis.error_reply('PSARGS bad state phase')
  end
  if phase == 'done' or cursor ~= '0' or spent >= budget then break end
end
table.insert(out, 4, phase)
table.insert(out, 5, cursor)
return out
