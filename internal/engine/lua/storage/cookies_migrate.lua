-- cookies_migrate.lua: move the cookies an earlier version kept for one
-- host (one hash per host and port) into the cookie jar of the host's
-- registrable domain, atomically.
--
-- include: cookies_lib.lua
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<h or d>|<line>"
-- KEYS[2] registry set of the domains that have a cookie jar
-- KEYS[3] the host's hash of the earlier version  "<name>;<path>;<domain>" -> Set-Cookie line
-- KEYS[4] the earlier version's registry set of hosts
-- ARGV[1] domain   ARGV[2] host (the earlier registry's member)   ARGV[3] max cookies per jar
-- ARGV[4] n = number of cookies to set
-- ARGV[5 .. 4+2n]  field, "<h or d>|<line>" pairs: the host's cookies, set
--                  where the jar has no such field yet (what the jar has
--                  was written after the upgrade, so it is newer)
-- ARGV[5+2n ..]    legacy field, line pairs: the fields of KEYS[3] read, each
--                  deleted if it still holds that line
--
-- Returns the number of fields KEYS[3] has left (0: it is gone).
local n = tonumber(ARGV[4])
local last = 4 + 2 * n
cookie_put(KEYS[1], ARGV[3], 5, last, true, ARGV[1])
cookie_register(KEYS[1], KEYS[2], ARGV[1])
for i = last + 1, #ARGV - 1, 2 do
  if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[3], ARGV[i])
  end
end
return cookie_register(KEYS[3], KEYS[4], ARGV[2])
