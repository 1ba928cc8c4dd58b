-- cookies_get.lua: read the cookie jar of one registrable domain, and the
-- cookies an earlier version kept for the request's host.
--
-- include: cookies_lib.lua
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<flags>|<expires ms>|<line>"
-- KEYS[2] the host's hash of an earlier version (per host and port)
--         "<name>;<path>;<domain>" -> Set-Cookie line
-- KEYS[3] the earlier version's registry set of hosts
-- ARGV[1] max cookies   ARGV[2] max bytes of all values together (a jar)
-- ARGV[3] max cookies   ARGV[4] max bytes (an earlier version's hash, as it limited them)
-- ARGV[5] the host (KEYS[3]'s member for KEYS[2])
--
-- Writes stay within the limits (cookies_set.lua, cookies_migrate.lua), so
-- a read finds a jar over them only if something else wrote it: the read
-- then removes entries until it is within them (cookie_read) rather than
-- fail every read of the domain. An earlier version's hash over its limits
-- (no version wrote one) is deleted.
--
-- Returns {{jar field, value, ...}, {legacy field, line, ...} (hash order),
-- jar entries removed, legacy entries deleted}.
local jar, trimmed = cookie_read(KEYS[1], ARGV[1], ARGV[2])
local legacy, dropped = {}, 0
local n = redis.call('HLEN', KEYS[2])
if n > 0 then
  local over = n > tonumber(ARGV[3])
  if not over then
    legacy = redis.call('HGETALL', KEYS[2])
    local total = 0
    for i = 2, #legacy, 2 do total = total + #legacy[i] end
    over = total > tonumber(ARGV[4])
  end
  if over then
    redis.call('UNLINK', KEYS[2])
    redis.call('SREM', KEYS[3], ARGV[5])
    legacy, dropped = {}, n
  end
end
return {jar, legacy, trimmed, dropped}
