-- lib.lua: what every script of the package shares. scripts.go puts this
-- file in front of each script before loading it, so every call stays one
-- EVALSHA; it runs nothing by itself.

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

-- Script body.
