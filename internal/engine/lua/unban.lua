-- unban.lua: end a proxy's quarantine on one site now (an operator's call).
-- include: unban_lib.lua
--
-- KEYS[1] free zset     "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash    "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[3] strikes hash  id -> "<bans in a row>|<ms of the last>|<its end>"
-- ARGV[1] proxy id      ARGV[2] slots per proxy (K)
--
-- A slot held by a live lease comes back when that lease ends, never
-- earlier; a dead proxy stays dead (Revive brings it back). Its backoff
-- starts over. The hold of its exit IP on the site, if any (what an entry
-- that left the IP earned there: exit_note.lua's IP holds,
-- "<prefix>:exithold", named from KEYS[1]'s prefix), goes too; the IP's
-- hold on every site stays, as the proxy's own ban on every site does.
-- Returns the number of slots made free.
local freed = unban_slots(KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2]), now_ms())
local base, site = busy_site(KEYS[1])
if base then
  local ip = redis.call('HGET', base .. ':exit', ARGV[1])
  if ip then redis.call('ZREM', base .. ':exithold', site .. '|' .. ip) end
end
return freed
