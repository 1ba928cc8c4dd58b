-- cookies_set.lua: write and delete single cookies of one registrable
-- domain, atomically.
--
-- include: cookies_lib.lua
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<h or d>|<line>"
-- KEYS[2] registry set of the domains that have a cookie jar
-- KEYS[3] the request host's hash of an earlier version (per host and port)
-- ARGV[1] domain (the jar's, for the registry)   ARGV[2] max cookies per jar
-- ARGV[3] n = number of cookies to set
-- ARGV[4 .. 3+2n]  field, "<h or d>|<line>" pairs to set (an overwrite keeps
--                  the stored creation time)
-- ARGV[4+2n ..]    field, expected pairs to delete: the field goes if its value
--                  equals expected, or whatever it holds if expected is ""
--
-- Other cookies of the jar are left alone, so writers in several processes
-- never undo each other's unrelated cookies.
-- Returns the number of cookies the jar has afterwards, or -1, writing
-- nothing, while KEYS[3] exists: its cookies go first (cookies_migrate.lua),
-- so that none of them, older than any write, ever overwrites a newer one.
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local n = tonumber(ARGV[3])
local last = 3 + 2 * n
for i = last + 1, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' or redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
cookie_put(KEYS[1], ARGV[2], 4, last, false, ARGV[1])
return cookie_register(KEYS[1], KEYS[2], ARGV[1])
