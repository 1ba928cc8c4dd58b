-- lib.lua: what every script shares, those of package proxyswitch (lua/)
-- and of package storage (lua/storage/). The engine (internal/engine) puts
-- this file in front of each script before loading it, so every call stays
-- one EVALSHA; it runs nothing by itself.

-- DEAD is the score of a dead or drained proxy's slots in every site's free
-- set (penalize.lua, drain.lua; revive.lua brings them back).
local DEAD = 1e15

-- now_ms is the server's clock (TIME) in ms: time never comes from a client.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
-- record (WithConcurrency's limit).
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

-- Script body.
