-- extend.lua: push a live lease's expiry to now + TTL, only for its owner.
-- include: extend_lib.lua
--
-- KEYS[1] free zset   "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- ARGV[1] member      ARGV[2] owner token   ARGV[3] lease TTL ms
--
-- Returns the new expiry (unix ms), or 0 if the caller no longer owns a live
-- lease (expired, released, or leased by someone else): nothing changed.

local now = now_ms()
return extend_member(KEYS[1], KEYS[2], ARGV[1], ARGV[2], now + tonumber(ARGV[3]), now, true)
