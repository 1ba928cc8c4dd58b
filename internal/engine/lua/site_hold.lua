-- site_hold.lua: the quarantines site probes (package probe) put proxies
-- under on one scope, so that a later probe of the site that passes lifts
-- them early, and only them.
-- include: unban_lib.lua
--
-- KEYS[1] ledger hash  of the scope  id -> "<site>|<end ms>" of the quarantine a site probe of
--                                    site put it under (under one scope for every site, each
--                                    proxy's record names the site whose probe it was)
-- KEYS[2] free zset    of the scope  "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[3] lease hash   of the scope  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] strikes hash of the scope  id -> "<bans in a row>|<ms of the last>|<its end>"
-- ARGV[1] "note" | "list" | "lift" | "held"
-- ARGV[2] slots per proxy (K)
-- ARGV[3] note: ms the ledger outlives the latest quarantine noted (its TTL);
--         held: ms the quarantine must still last
-- ARGV[4] site
-- ARGV[5..] note, lift, held: proxy ids; list: ARGV[5] HSCAN cursor ("0" first),
--           ARGV[6] HSCAN count (bounded work per call, whatever the ledger's size)
--
-- A proxy's quarantine end on the scope is the latest score of its slots
-- in the free set, while it is in the future (and no dead mark). A
-- quarantine is the probe's while that end is the one noted: a later ban
-- (which pushes it), an Unban, its running out or the proxy's death makes
-- it someone else's, or none, and its entry goes.
--
-- note: records the end of each id's quarantine, just put (ids not
-- quarantined are skipped); returns the ids noted.
-- list: returns {next cursor ("0" after the last page), ids...}: of one
-- HSCAN page of the ledger, the ids whose quarantine is still the probe's
-- of the site (an id may come twice over the pages).
-- held: returns the ids whose quarantine is still the probe's of the site
-- and lasts ARGV[3] ms more at least (a probe without a lease meets no
-- request within that).
-- lift: ends the quarantine of each id that is still the probe's of the site, as
-- unban.lua does (unban_slots) (a slot held by a live lease comes back when the lease
-- ends; the backoff starts over); returns the ids lifted.
local now = now_ms()
local mode, slots, site = ARGV[1], tonumber(ARGV[2]), ARGV[4]

local function qend(id)
  local e = nil
  for s = 0, slots - 1 do
    local sc = num(redis.call('ZSCORE', KEYS[2], id .. ':' .. s))
    if sc and sc >= DEAD then return nil end
    if sc and sc > now and (not e or sc > e) then e = sc end
  end
  return e
end

-- held reports whether id's quarantine is the one noted, by the site's
-- probe; a stale entry goes.
local function held(id, noted)
  local e = qend(id)
  local by, untl = string.match(noted or '', '^(.*)|(%d+)$')
  if e and untl and tonumber(untl) == e then return by == site end
  redis.call('HDEL', KEYS[1], id)
  return false
end

local out = {}
if mode == 'note' then
  local last = 0
  for i = 5, #ARGV do
    local e = qend(ARGV[i])
    if e then
      redis.call('HSET', KEYS[1], ARGV[i], site .. '|' .. string.format('%d', e))
      out[#out + 1] = ARGV[i]
      if e > last then last = e end
    end
  end
  local ttl = last - now + tonumber(ARGV[3])
  if #out > 0 and redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl))
  end
elseif mode == 'list' then
  local page = redis.call('HSCAN', KEYS[1], ARGV[5], 'COUNT', ARGV[6])
  out[1] = page[1]
  local kv = page[2]
  for i = 1, #kv, 2 do
    if held(kv[i], kv[i + 1]) then out[#out + 1] = kv[i] end
  end
elseif mode == 'held' then
  local need = tonumber(ARGV[3])
  for i = 5, #ARGV do
    local id = ARGV[i]
    if held(id, redis.call('HGET', KEYS[1], id)) and qend(id) - now > need then out[#out + 1] = id end
  end
elseif mode == 'lift' then
  for i = 5, #ARGV do
    local id = ARGV[i]
    if held(id, redis.call('HGET', KEYS[1], id)) then
      redis.call('HDEL', KEYS[1], id)
      unban_slots(KEYS[2], KEYS[3], KEYS[4], id, slots, now)
      out[#out + 1] = id
    end
  end
else
  return redis.error_reply('PSCONFIG unknown site_hold mode ' .. tostring(mode))
end
return out
