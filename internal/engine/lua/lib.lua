-- lib.lua: what every script shares, those of package proxyswitch (lua/)
-- and of package storage (lua/storage/). The engine (internal/engine) puts
-- this file in front of each script before loading it, so every call stays
-- one EVALSHA; it runs nothing by itself.

-- DEAD is the score of a dead or drained proxy's slots in a site's busy set:
-- that of the site it died on (penalize.lua), and of each other site once a
-- lease there meets it (lease.lua's dead_mark). The dead hash is what says a
-- proxy is dead: a slot at DEAD of a proxy no longer dead (revive.lua) is
-- free but for a lease taken before its death.
local DEAD = 1e15

-- tonumber, for every script, returns nil for nil as Redis' Lua 5.1 does:
-- gopher-lua (miniredis' Lua) raises "value expected" instead, so that
-- tonumber(string.match(v, ...)) of a value that does not match would fail
-- the script on an embedded Redis only.
local lua_tonumber = tonumber
local function tonumber(v, base)
  if v == nil then return nil end
  if base == nil then return lua_tonumber(v) end
  return lua_tonumber(v, base)
end

-- now_ms is the server's clock (TIME) in ms: time never comes from a client.
-- It is read once per script call: a call is atomic, so one instant serves
-- all of it (pool_call.lua's releases and leases share it) and TIME costs one call.
local now_read, now_text
local function now_ms()
  if not now_read then
    local t = redis.call('TIME')
    now_read = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_read
end

-- now_str is now_ms as a string of digits, formatted once per call (a
-- number formatted for a command or a record costs more than the command's
-- own work on the hot path).
local function now_str()
  if not now_text then now_text = string.format('%.0f', now_ms()) end
  return now_text
end

-- num reads a number as Redis replies it (a score, false for none).
-- Redis 7.2+ and miniredis write the DEAD score 1e15 as "1e+15"; the
-- tonumber of gopher-lua (miniredis' Lua) reads no exponent without a dot
-- (nil), but "+ 0" reads it in every Lua.
local function num(s) return s and s + 0 end

-- clip is a stored value as an error may quote it: at most 64 bytes, then
-- its length (an error never copies a huge value whole).
local function clip(v)
  v = tostring(v)
  if #v <= 64 then return v end
  return string.sub(v, 1, 64) .. '...(' .. #v .. ' bytes)'
end

-- corrupt raises the error of a stored value this module did not write:
-- "PSCORRUPT key <key>: <what>: <value, clipped>", which the Go side maps to
-- ErrCorrupt (engine.Corrupt). It does not return.
local function corrupt(key, what, v)
  local msg = 'PSCORRUPT key ' .. clip(key) .. ': ' .. what
  if v ~= nil then msg = msg .. ': ' .. clip(v) end
  error(msg, 0)
end

-- redis, for the rest of every script, is the Redis API but for call: a
-- command that meets a key holding another kind of value than it works on
-- (WRONGTYPE: a string where a hash belongs) raises corrupt naming that key
-- (its first argument), where Redis's own error names none; so does an
-- INCR, DECR or HINCRBY of a stored value that is no integer. Other errors
-- are raised as redis.call raises them.
local redis_api = redis
local redis = setmetatable({
  call = function(cmd, ...)
    local r = redis_api.pcall(cmd, ...)
    if type(r) == 'table' and r.err then
      local e = r.err
      if string.sub(e, 1, 9) == 'WRONGTYPE' then
        corrupt(tostring((...)), 'holds the wrong kind of value for ' .. cmd)
      end
      local c = string.upper(cmd)
      if (string.find(c, 'INCR', 1, true) or string.find(c, 'DECR', 1, true)) and
          (string.find(e, 'not an integer', 1, true) or string.find(e, 'not a valid float', 1, true) or
           string.find(e, 'overflow', 1, true)) then
        corrupt(tostring((...)), 'holds no integer for ' .. cmd)
      end
      -- Any other error: the call again raises it as redis.call does, in
      -- Redis and in gopher-lua alike (a failed command changed nothing).
      return redis_api.call(cmd, ...)
    end
    return r
  end,
}, {__index = redis_api})

-- checked reads a stored number (as num does: "1e+15" too) that must be an
-- integer from lo to hi, or raises corrupt naming key and what it holds: not
-- a number, NaN, infinite or out of range. v false (no value) is nil.
local function checked(v, key, what, lo, hi)
  if not v then return nil end
  local ok, n = pcall(num, v)
  if not ok or type(n) ~= 'number' or n ~= n or n < lo or n > hi or n ~= math.floor(n) then
    corrupt(key, what .. string.format(' is not an integer from %.0f to %.0f', lo, hi), v)
  end
  return n
end

-- MAX_MS bounds a time in ms (2^53: a Lua number holds every integer up to
-- it); a score beyond it (+inf) is no time this module wrote.
local MAX_MS = 2 ^ 53

-- MAX_SLOTS is the most concurrent requests per proxy per site a pool may
-- record (Rotation.Concurrency's limit).
local MAX_SLOTS = 1000

-- meta_slots reads the concurrency a pool records in its meta hash (KEYS
-- entry key), or def when it records none; a value that is not 1..MAX_SLOTS
-- raises corrupt (a loop over the slots of a proxy must end).
local function meta_slots(key, def)
  return checked(redis.call('HGET', key, 'slots'), key, 'field slots', 1, MAX_SLOTS) or def
end

-- meta_ms reads a time or generation in ms that a pool records in its meta
-- hash (KEYS entry key), field f ("version", "hold"), or 0 when it records
-- none; a value that is not 0..MAX_MS raises corrupt.
local function meta_ms(key, f)
  return checked(redis.call('HGET', key, f), key, 'field ' .. f, 0, MAX_MS) or 0
end

-- pool_prefix checks the key prefix p ("{prefix:pool}") a script was given
-- in ARGV to name keys it cannot know up front (those of every site of the
-- pool, of a session's scopes): p must be a whole hash tag that KEYS[1]
-- starts with, so every key built from it is in the pool's Redis Cluster
-- slot. It returns p, or nil and the error to reply.
local function pool_prefix(p)
  local k = KEYS[1] or ''
  if string.sub(p, 1, 1) ~= '{' or string.find(p, '}', 1, true) ~= #p or string.sub(k, 1, #p + 1) ~= p .. ':' then
    return nil, 'PSKEYS key prefix ' .. p .. ' is not the hash tag of ' .. k
  end
  return p
end

-- bump_version moves the generation of a pool's operator state (its proxies
-- and its dead list) in its meta hash meta, field "version": the server's
-- clock in ms, or one more than the last generation if that is later. A
-- generation is thus never reused, not even after Redis lost the meta hash
-- and a re-seed (pool_seed.lua) wrote back an older one. Switches compare it
-- with the copy of the pool they keep (snapshot.go). Returns the new one.
local function bump_version(meta)
  local v = meta_ms(meta, 'version')
  local t = now_ms()
  if t <= v then t = v + 1 end
  redis.call('HSET', meta, 'version', t)
  return t
end

-- order_add puts the ids of list (a table) in a pool's rotation order
-- (zset key: id -> place, lease.lua), those not there yet: a proxy's place
-- is the first 13 hex digits of its ID (a hash: the order mixes proxies
-- added together, as the old least-recently-used start did), moved on to
-- the next free number when taken, so that no two proxies share one (the
-- cursor of a site passes a place once). An ID that is no hash takes the
-- meta hash's counter "seq" (past every hash place). Returns nothing.
local function order_add(key, meta, list)
  for _, id in ipairs(list) do
    if not redis.call('ZSCORE', key, id) then
      local p = string.match(id, '^%x+$') and #id >= 13 and tonumber(string.sub(id, 1, 13), 16)
      if not p then p = 2 ^ 52 + redis.call('HINCRBY', meta, 'seq', 1) end
      while redis.call('ZCOUNT', key, p, p) > 0 do p = p + 1 end
      redis.call('ZADD', key, p, id)
    end
  end
end

-- Exit IPs (exit_note.lua, lease.lua). The entries whose recorded exit
-- IPs are equal share one proxy's slots on a site. So that a lease counts
-- the slots out of one IP without reading its entries (thousands may share
-- it), two indexes name the entries that may have some out:
--   "<base>:exitout:<site>" zset  "<IP>|<id>" -> 0 (read by lex range, one
--       IP at a time): every entry with a slot out on the site (leased,
--       cooling down, quarantined there), written where a slot goes out
--       without a live lease of the entry (lease.lua's grant and ban
--       record, a late release or renewal, penalize.lua,
--       fallback_writeback.lua, an entry that comes to an IP: exit_note.lua
--       through the sweep, site_sweep below); it lives as long as the
--       site's busy set (the idle TTL, refreshed with it);
--   "<base>:exitban:<IP>" zset  id -> the end (ms) of its ban on every
--       site, or later: every entry of IP with such a ban (penalize.lua,
--       fallback_writeback.lua, revive.lua, exit_note.lua); TTL: the
--       quarantine zset's.
-- (A third key holds IPs, not entries: "<base>:exithold", the holds an
-- entry that left an IP leaves on it, exit_note.lua; lease.lua's ip_count
-- reads them first.)
-- They may name more than that: lease.lua checks each entry it reads
-- against the busy set, the dead hash, the quarantine and the exit hash,
-- and drops those with nothing out there or gone to another IP, and dead
-- ones (but from the site's index while a lease of theirs runs, which
-- counts again if they are revived then; revive.lua names them again in
-- the ban index). An IP never holds '|' (lex ranges); the IP of a member
-- is what comes before its last '|' (ids are hex).

-- exit_mark names the entries ids (a table) of exit IP ip in the index of
-- the site whose busy set is "<base>:free:<site>", which then lives ttl ms
-- (a number or a string; nil or below 1: its TTL is left as it is).
-- Returns how many it added (those not named yet).
local function exit_mark(base, site, ip, ids, ttl)
  local k = base .. ':exitout:' .. site
  local added = 0
  for i = 1, #ids, 512 do
    local args = {}
    for j = i, math.min(i + 511, #ids) do
      args[#args + 1] = '0'
      args[#args + 1] = ip .. '|' .. ids[j]
    end
    added = added + redis.call('ZADD', k, unpack(args))
  end
  local t = tonumber(ttl)
  if t and t > 0 then redis.call('PEXPIRE', k, string.format('%.0f', t)) end
  return added
end

-- exit_mark_id is exit_mark for one proxy id, whose exit IP it reads:
-- nothing when none is recorded (then it is one HGET). Returns the IP, or nil.
local function exit_mark_id(base, site, id, ttl)
  local ip = redis.call('HGET', base .. ':exit', id)
  if ip then exit_mark(base, site, ip, {id}, ttl) end
  return ip
end

-- exit_ban names the entries ids (a table) of exit IP ip, banned on every
-- site until q, in the IP's ban index (which then takes the quarantine
-- zset's TTL); up to #ids + 1 entries whose noted end passed go (bounded
-- work: what a write adds, it takes away at least).
local function exit_ban(base, ip, ids, q)
  local k = base .. ':exitban:' .. ip
  local old = redis.call('ZRANGE', k, '-inf', string.format('%.0f', now_ms()), 'BYSCORE', 'LIMIT', 0, #ids + 1)
  if #old > 0 then redis.call('ZREM', k, unpack(old)) end
  local qs = string.format('%.0f', q)
  for i = 1, #ids, 512 do
    local args = {}
    for j = i, math.min(i + 511, #ids) do
      args[#args + 1] = qs
      args[#args + 1] = ids[j]
    end
    redis.call('ZADD', k, 'GT', unpack(args))
  end
  local t = redis.call('PTTL', base .. ':quarantine')
  if t > 0 then redis.call('PEXPIRE', k, t) end
end

-- busy_site splits the key of a site's busy set, "<base>:free:<site>",
-- into base and site (nil for another key).
local function busy_site(fk)
  return string.match(fk, '^({[^}]*}):free:(.*)$')
end

-- Per-site sweeps. A change that concerns every site's keys (a proxy
-- removed from the pool, or revived) is written once, as an event of the
-- pool's sweep zset ("<prefix>:sweep", member "<kind>:<id>", score a unique
-- rising number, ms x 1000 + a count from 1), never into each site's keys:
-- each site applies the events newer than its mark (the swept hash) at its
-- next leases (lease.lua's sweep). Kinds: "g" gone from the pool (the site
-- forgets its state), "r" revived (its slots out on the site, but a live
-- lease's, come back, as its death had put them all at DEAD), "x" exit IP
-- recorded or changed (the site names it in its exit index where it is
-- out). An event goes after the idle TTL (pool_update.lua).

-- sweep_add records an event of kind for each id of list (at most 1000)
-- in the sweep zset of pool prefix base, each at a score of its own above
-- every score there (a site new to the sweep at now starts at now x 1000).
local function sweep_add(base, kind, list)
  if #list == 0 then return end
  local key = base .. ':sweep'
  local top = redis.call('ZRANGE', key, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  local sc = math.max(now_ms() * 1000 + 1, (num(top[2]) or 0) + 1)
  local args = {}
  for _, id in ipairs(list) do
    args[#args + 1] = string.format('%.0f', sc)
    args[#args + 1] = kind .. ':' .. id
    sc = sc + 1
  end
  redis.call('ZADD', key, unpack(args))
end

-- SWEEP_PAGE is the most sweep events one call applies to a site (fewer
-- at more than 4 slots per proxy: at most 256 slots looked at, or one
-- proxy's).
local SWEEP_PAGE = 64

-- site_sweep applies to site scope (its busy set free and lease hash
-- leases; pool hash pool, dead hash dead, slots per proxy) the events of
-- the pool's sweep zset newer than the site's mark in the swept hash (a
-- bounded page; lease.lua at the site's bookkeeping, the state reads
-- before they count). "g", a proxy gone from the pool (and not back
-- since): its slots out on the site but a live lease's (its holder
-- releases it), its expired leases, strikes and failure rate go. "r", a
-- proxy revived (and not dead again): its slots out on the site come back,
-- a live lease's at its end. A site new to the sweep starts from now
-- (nothing before is on it); with idle nil (a read), a site with no mark
-- is left alone. The keys are named from free's prefix, which must be
-- KEYS[1]'s hash tag (pool_prefix; else nothing is done). Returns whether
-- a slot out came back, and whether more events were left for later.
-- "x", a proxy whose exit IP was recorded or changed (exit_note.lua): it
-- is named in the site's exit index of its IP (exit_mark) if a slot of it
-- is out there.
local function site_sweep(scope, free, leases, pool, dead, slots, now, idle)
  local base = pool_prefix(string.sub(free, 1, #free - #(':free:' .. scope)))
  if not base or free ~= base .. ':free:' .. scope then return false end
  local wk = base .. ':swept'
  local from = redis.call('HGET', wk, scope)
  if not from then
    if not idle then return false end
    redis.call('HSET', wk, scope, string.format('%.0f', now * 1000))
    redis.call('PEXPIRE', wk, idle)
    return false
  end
  local page = math.max(1, math.min(SWEEP_PAGE, math.floor(4 * SWEEP_PAGE / slots)))
  if redis.call('ZCOUNT', base .. ':sweep', '(' .. from, '+inf') == 0 then return false, false end -- (most calls)
  local evs = redis.call('ZRANGE', base .. ':sweep', '(' .. from, '+inf', 'BYSCORE', 'LIMIT', 0, page, 'WITHSCORES')
  local sk, hk, moved = base .. ':strikes:' .. scope, base .. ':health:' .. scope, false
  for i = 1, #evs, 2 do
    local kind, id = string.match(evs[i], '^(%a):(.+)$')
    local here = id and redis.call('HEXISTS', pool, id) == 1
    if kind == 'x' and here then
      for s = 0, slots - 1 do
        local sc = num(redis.call('ZSCORE', free, id .. ':' .. s))
        if sc and sc > now then
          exit_mark_id(base, scope, id, redis.call('PTTL', free))
          break
        end
      end
    elseif (kind == 'g' and not here) or (kind == 'r' and here and redis.call('HEXISTS', dead, id) == 0) then
      for s = 0, slots - 1 do
        local m = id .. ':' .. s
        local v = redis.call('HGET', leases, m)
        local exp = v and tonumber(string.match(v, '|(%d+)$'))
        if exp and exp > now then
          if kind == 'r' and num(redis.call('ZSCORE', free, m)) ~= exp then redis.call('ZADD', free, exp, m) end
        else
          if redis.call('ZREM', free, m) == 1 then moved = true end
          if v and kind == 'g' then redis.call('HDEL', leases, m) end
        end
      end
      if kind == 'g' then
        redis.call('HDEL', sk, id, 'f:' .. id)
        redis.call('HDEL', hk, id)
      end
    end
  end
  redis.call('HSET', wk, scope, evs[#evs])
  if idle then redis.call('PEXPIRE', wk, idle) end
  return moved, #evs / 2 >= page
end

-- read_sweep is site_sweep for the scripts that read a site's state
-- (state.lua, proxy_states.lua, stats.lua; pool hash pool, busy set free,
-- whose scope follows the pool's prefix): a revival or removal the site
-- has not applied yet is applied before they count.
local function read_sweep(pool, free, leases, dead, slots, now)
  local pre = string.sub(pool, 1, #pool - #':proxies') .. ':free:'
  if string.sub(pool, -#':proxies') ~= ':proxies' or string.sub(free, 1, #pre) ~= pre then return end
  site_sweep(string.sub(free, #pre + 1), free, leases, pool, dead, slots, now, nil)
end

-- Script body.

-- fraction reads a stored non-negative number (a rate, a learned time in
-- ms) of at most hi, or raises corrupt naming key and what it holds; v
-- false (no value) is nil. Unlike checked, it allows a fraction.
local function fraction(v, key, what, hi)
  if not v then return nil end
  local ok, n = pcall(num, v)
  if not ok or type(n) ~= 'number' or n ~= n or n < 0 or n > hi then
    corrupt(key, what .. string.format(' is not a number from 0 to %.0f', hi), v)
  end
  return n
end

-- Success-aware selection. A health hash per scope (KEYS, "health:<site>")
-- holds each proxy's recent failure rate there: id -> r, 0 < r <= 1, an
-- exponentially weighted moving average of its outcomes (1 a ban or a proxy
-- failure, penalize.lua; 0 a healthy answer, release.lua), the latest
-- weighing HEALTH_ALPHA; a rate below HEALTH_FORGET is deleted (a healthy
-- proxy has no field). release.lua delays a proxy's next free time by
-- r * the flaky delay (Rotation.FlakyDelay), so that least-recently-used order
-- serves it less often, never less than once per rotation plus that delay.
local HEALTH_ALPHA, HEALTH_FORGET = 0.2, 0.01

-- health_note records one outcome (failed true or false) of proxy id in the
-- health hash key, kept for idle ms, and returns its new failure rate.
local function health_note(key, id, failed, idle)
  local r = fraction(redis.call('HGET', key, id), key, 'field ' .. id, 1) or 0
  if not failed and r == 0 then return 0 end
  r = r * (1 - HEALTH_ALPHA)
  if failed then r = r + HEALTH_ALPHA end
  if r < HEALTH_FORGET then
    redis.call('HDEL', key, id)
    return 0
  end
  redis.call('HSET', key, id, string.format('%.4f', r))
  redis.call('PEXPIRE', key, idle)
  return r
end

-- health_hold makes proxy id, failure rate r, wait at least r * flaky ms
-- from now on the scope of free set free: each of its slots not leased
-- (lease hash) whose score is below that is pushed out to it.
local function health_hold(free, lease, id, slots, r, flaky, now)
  local untl = now + math.floor(r * flaky)
  if untl <= now then return end
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    if redis.call('HEXISTS', lease, m) == 0 then redis.call('ZADD', free, 'GT', untl, m) end
  end
end

-- Learned pacing. A pace hash per scope (KEYS, "pace:<site>") holds the
-- cooldown the fleet learned for the site: "c" (ms), "cut" (ms of its last
-- raise), "ok" (healthy answers since), "step" (req/s per IP added by each
-- healthy answer). Each healthy answer shortens it (additive increase of the
-- rate per IP by step: pace_ok); a rate-limit refusal lengthens it
-- (multiplicative decrease: pace_refused), at most once per cooldown. It
-- never goes below the floor (Rotation.Cooldown) nor above the max
-- (Rotation.LearnedPacing).
--
-- PACE_PROBE is the first cooldown of a site refused at a cooldown of 0;
-- PACE_SETTLED the healthy answers after which a refusal raises the
-- cooldown by PACE_CUT (x1.25), not twice over (far from the site's pace
-- yet); PACE_CLIMB the healthy answers over which the rate climbs back to
-- the one refused.
local PACE_PROBE, PACE_SETTLED, PACE_CUT, PACE_CLIMB = 100, 20, 1.25, 200
local PACE_MAX = 86400000 -- a day: no learned cooldown this module wrote is longer
-- PACE_PUSH bounds the slots one raise pushes out (pace_refused).
local PACE_PUSH = 1000

-- A rate-limit refusal is the site's pace only when the proxy had not
-- rested: under a per-IP limit, a proxy idle on the site longer than the
-- limit is served; in a storm (the site refuses everyone) even rested
-- proxies are refused. The pace hash's "rest" (ms) is the site's accepted
-- rest: about the shortest time between two healthy answers of one proxy
-- lately (pace_rest_note, on each healthy answer after another one). A
-- refusal of a proxy whose last healthy answer there is PACE_RESTED times
-- that old or more is not the pace (penalize.lua). Under a per-IP limit
-- every accepted rest is at least the limit, so no refusal (which comes
-- sooner than the limit) is ever that old; a new accepted rest below the
-- one kept replaces it, one above moves it up by 1/PACE_REST_DRIFT of the
-- difference, at most by 1/PACE_REST_DRIFT of itself (a site whose limit
-- tightened is learned again; a proxy idle for hours moves it little).
-- A hold of a proxy rested past PACE_TIRED times the accepted rest is
-- still the pace for the proxy (latency blurs a rest measured in Redis),
-- but evidence of a storm for the site's circuit breaker.
local PACE_RESTED, PACE_TIRED, PACE_REST_DRIFT = 2, 1.25, 32

-- pace_rest returns the site's accepted rest in the pace hash key (ms), or
-- nil while no proxy has had two healthy answers there.
local function pace_rest(key)
  return fraction(redis.call('HGET', key, 'rest'), key, 'field rest', MAX_MS)
end

-- pace_rest_note records one accepted rest t (ms: from a proxy's healthy
-- answer to its next one) in the pace hash key; r is the rest the hash
-- holds (pace_rest, pace_fields), nil for none. The rest is kept to the ms:
-- a note that leaves it as it is (most do, on a steady site) writes
-- nothing. Returns the rest now held and whether the note wrote it (the
-- caller keeps the hash's TTL: release_lib.lua's rel_rest_note).
local function pace_rest_note(key, r, t)
  local r2 = t
  if r ~= nil and t >= r then r2 = r + math.min(t - r, r) / PACE_REST_DRIFT end
  -- r is whole (written to the ms) and r2 >= r when t >= r: the note
  -- leaves it as it is while r2 rounds to r.
  if r ~= nil and r2 >= r and r2 < r + 0.5 then return r, false end
  local s = string.format('%.0f', r2)
  redis.call('HSET', key, 'rest', s)
  return tonumber(s), true
end

-- The pace hash also holds "burnt": the ms of the site's last verdict on a
-- proxy healthy there before (penalize.lua: a confirmation, an unambiguous
-- refusal; no first strike). A proxy whose last healthy answer there is
-- older may have been burnt with it: it is no witness of a page refusing
-- everyone.

-- site_burnt returns the site's last verdict (ms) in the pace hash key, or 0.
local function site_burnt(key)
  return fraction(redis.call('HGET', key, 'burnt'), key, 'field burnt', MAX_MS) or 0
end

-- site_burnt_mark records a verdict at now in the pace hash key, kept for idle ms.
local function site_burnt_mark(key, now, idle)
  redis.call('HSET', key, 'burnt', now)
  redis.call('PEXPIRE', key, idle)
end

-- pace_read returns the cooldown learned in the pace hash key, or 0.
local function pace_read(key)
  return fraction(redis.call('HGET', key, 'c'), key, 'field c', PACE_MAX) or 0
end

-- pace_fields returns, in one read, pace_read's cooldown and pace_rest's
-- rest of the pace hash key.
local function pace_fields(key)
  local v = redis.call('HMGET', key, 'c', 'rest')
  return fraction(v[1], key, 'field c', PACE_MAX) or 0, fraction(v[2], key, 'field rest', MAX_MS)
end

-- pace_ok applies one healthy answer to the pace hash key: the cooldown c
-- (as pace_read found it) shortens by one step, down to floor.
local function pace_ok(key, c, floor, idle)
  if c <= floor then return end
  local step = fraction(redis.call('HGET', key, 'step'), key, 'field step', 1e9) or 0
  local c2 = floor
  if step > 0 then c2 = math.max(floor, 1000 / (1000 / c + step)) end
  redis.call('HSET', key, 'c', string.format('%.3f', c2))
  redis.call('HINCRBY', key, 'ok', 1)
  redis.call('PEXPIRE', key, idle)
end

-- pace_refused applies one rate-limit refusal to the pace hash key at now
-- (ms): unless the cooldown was raised less than a cooldown ago (this
-- refusal answers a request sent before), it grows (x2 while unsettled,
-- else x PACE_CUT; from 0 to PACE_PROBE; at most maxc), and every slot of
-- the scope's free set free (which) cooling down (score within the old
-- cooldown from now, not leased: lease hash) is pushed out by the
-- difference, so that no proxy released before the raise runs early.
-- Bounded work: at most PACE_PUSH slots, those free soonest (a site with
-- more cooling down at once leaves the later ones as they are: they run
-- after the soonest), at most once per cooldown. Returns the cooldown
-- after it (ms).
local function pace_refused(key, free, lease, floor, maxc, now, idle)
  local v = redis.call('HMGET', key, 'c', 'cut', 'ok')
  local c = math.max(fraction(v[1], key, 'field c', PACE_MAX) or 0, floor)
  local cut = fraction(v[2], key, 'field cut', MAX_MS) or 0
  if now - cut < math.max(c, PACE_PROBE) then return c end
  local ok = fraction(v[3], key, 'field ok', MAX_MS) or 0
  local c2 = 2 * c
  if ok >= PACE_SETTLED then c2 = PACE_CUT * c end
  if c == 0 then c2 = PACE_PROBE end
  c2 = math.min(c2, maxc)
  if c2 <= c then return c end
  local step = 1000 / c2 / PACE_CLIMB -- from 2x below (the rate refused at c = 0: twice c2's)
  if c > 0 then step = (1000 / c - 1000 / c2) / PACE_CLIMB end
  redis.call('HSET', key, 'c', string.format('%.3f', c2), 'cut', now, 'ok', 0, 'step', string.format('%.6f', step))
  redis.call('PEXPIRE', key, idle)
  local d = math.floor(c2 - c)
  local cooling = redis.call('ZRANGE', free, '(' .. now, now + math.ceil(c), 'BYSCORE', 'LIMIT', 0, PACE_PUSH, 'WITHSCORES')
  for i = 1, #cooling, 2 do
    if redis.call('HEXISTS', lease, cooling[i]) == 0 then
      redis.call('ZADD', free, 'XX', num(cooling[i + 1]) + d, cooling[i])
    end
  end
  return c2
end
