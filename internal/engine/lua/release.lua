-- release.lua: give a lease back, only if the caller still owns it.
--
-- KEYS[1] busy zset     "<id>:<slot>" -> unix ms until which it is out on the scope (none: free)
-- KEYS[2] lease hash    "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[3] strikes hash  id -> "<bans in a row>|<ms of the last>|<its end>" on this scope (penalize.lua)
-- KEYS[4] fails hash    id -> proxy failures in a row (penalize.lua)
-- KEYS[5] health hash   id -> recent failure rate on this scope (lib.lua's health_note)
-- KEYS[6] pace hash     the cooldown learned for this scope (lib.lua's pace_ok)
-- ARGV[1] member      ARGV[2] owner token   ARGV[3] cooldown ms (the floor)
-- ARGV[4] proxy id whose request got a healthy answer, or "": its runs of bans
--         on this scope and of failures end (the backoff starts over), its
--         strikes record becomes "0|<now>|0": healthy on this scope, the
--         evidence penalize.lua reports (the hash keeps the free set's TTL),
--         and the hash's "served" field the time (once per call),
--         its failure rate decays, and the learned cooldown shortens
-- ARGV[5] flaky delay ms: the proxy waits its failure rate times this on top
--         of the cooldown (0: off, or a lease handed back unused)
-- ARGV[6] "1": learned pacing, and the lease was used (the cooldown is at
--         least the learned one, and a healthy answer after another one
--         notes the proxy's rest in between: lib.lua's pace_rest_note); else "0"
-- ARGV[7] idle TTL ms of the health and pace hashes
-- include: release_lib.lua
--
-- Returns 1 released, 2 released after its expiry (nobody had taken it yet),
--         0 not the owner (expired and leased again, or never ours): the lease is untouched.
-- The proxy is next available at now + cooldown (the learned one if longer)
-- + its failure rate times the flaky delay, unless something (a ban) has
-- already pushed it further out: that is kept. A slot this puts out that
-- was free (a late release) has the site's exit index name its proxy
-- (lib.lua's exit_mark).
-- (Numbers go to redis.call as strings where they come as strings: Redis
-- formats a Lua number argument with "%.17g", a cost on every release.)
local idle = ARGV[7]
local cooldown = tonumber(ARGV[3])
-- (The fails, health and pace hashes are read once per call of many
-- releases: release_lib.lua.)
local rest -- the site's accepted rest (learned pacing, a healthy answer)
if ARGV[6] == '1' then
  local learned
  learned, rest = rel_pace_fields(KEYS[6])
  if ARGV[4] ~= '' then rel_pace_ok(KEYS[6], learned, cooldown, idle) end
  cooldown = math.max(cooldown, math.ceil(learned))
end
if ARGV[4] ~= '' then
  local t = now_ms()
  if ARGV[6] == '1' then
    local h = tonumber(string.match(redis.call('HGET', KEYS[3], ARGV[4]) or '', '^0|(%d+)|0$'))
    if h and h > 0 and t > h then rel_rest_note(KEYS[6], rest, t - h, idle) end
  end
  -- A new field may be a new hash: then it takes the free set's TTL.
  if redis.call('HSET', KEYS[3], ARGV[4], '0|' .. now_str() .. '|0') == 1 and redis.call('PTTL', KEYS[3]) < 0 then
    redis.call('PEXPIRE', KEYS[3], math.max(redis.call('PTTL', KEYS[1]), 60000))
  end
  rel_note_served(KEYS[3])
  if not rel_hash_empty(KEYS[4]) then redis.call('HDEL', KEYS[4], ARGV[4]) end
end
local flaky = tonumber(ARGV[5])
if flaky > 0 then
  local r
  if rel_hash_empty(KEYS[5]) then r = 0
  elseif ARGV[4] ~= '' then r = health_note(KEYS[5], ARGV[4], false, idle)
  else
    local id = string.match(ARGV[1], '^(.*):%d+$')
    if id then r = fraction(redis.call('HGET', KEYS[5], id), KEYS[5], 'field ' .. id, 1) or 0 end
  end
  cooldown = cooldown + math.floor((r or 0) * flaky)
end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local sep = string.find(v, '|', 1, true)
if not sep or string.sub(v, 1, sep - 1) ~= ARGV[2] then return 0 end
local expiry = tonumber(string.sub(v, sep + 1))
redis.call('HDEL', KEYS[2], ARGV[1])

local now = now_ms()
-- No entry: the slot's score passed and lease.lua pruned it (score 0).
local score = num(redis.call('ZSCORE', KEYS[1], ARGV[1])) or 0
local nextfree = now + cooldown
if nextfree > now and (score == expiry or score < nextfree) then
  redis.call('ZADD', KEYS[1], string.format('%.0f', nextfree), ARGV[1])
  if score <= now then
    -- A release puts back out a slot that was free (a late one, or one
    -- whose score something lowered): the site's exit index names the
    -- entry again (lib.lua's exit_mark; one HGET when it has no exit). An
    -- entry with a slot out is named already.
    local base, site = busy_site(KEYS[1])
    local id = string.match(ARGV[1], '^(.*):%d+$')
    if base and id then exit_mark_id(base, site, id, idle) end
  end
elseif score == expiry then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
if expiry and expiry > now then return 1 end
return 2
