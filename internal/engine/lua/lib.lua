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
  local v = tonumber(redis.call('HGET', meta, 'version') or '0') or 0
  local t = now_ms()
  if t <= v then t = v + 1 end
  redis.call('HSET', meta, 'version', t)
  return t
end

-- Script body.
