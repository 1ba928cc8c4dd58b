-- cookies_set.lua: write and delete single cookies of one registrable
-- domain, atomically: the deletes and sets of one call are applied
-- together or not at all.
--
-- include: cookies_lib.lua
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<flags>|<expires ms>|<line>"
-- KEYS[2] registry set of the domains that have a cookie jar
-- KEYS[3] the request host's hash of an earlier version (per host and port)
-- ARGV[1] domain (the jar's, for the registry)   ARGV[2] max cookies per jar
-- ARGV[3] max bytes of a jar's values   ARGV[4] n = number of cookies to set
-- ARGV[5 .. 4+2n]  field, "<flags>|<expires ms>|<line>" pairs to set (an
--                  overwrite keeps the stored creation time)
-- ARGV[5+2n ..]    field, expected pairs to delete: the field goes if its value
--                  equals expected, or whatever it holds if expected is ""
--
-- Other cookies of the jar are left alone, so writers in several processes
-- never undo each other's unrelated cookies, but for the oldest ones a full
-- jar removes to make room (cookies_lib.lua's cookie_write).
-- Returns {the number of cookies the jar has afterwards, the number removed
-- to make room}, or -1, writing nothing, while KEYS[3] exists: its cookies
-- go first (cookies_migrate.lua), so that none of them, older than any
-- write, ever overwrites a newer one.
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
local n = tonumber(ARGV[4])
local last = 4 + 2 * n
local sets, dels = {}, {}
for i = 5, last do sets[#sets + 1] = ARGV[i] end
for i = last + 1, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' or redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    dels[#dels + 1] = ARGV[i]
  end
end
local evicted = cookie_write(KEYS[1], ARGV[2], ARGV[3], sets, dels)
return {cookie_register(KEYS[1], KEYS[2], ARGV[1]), evicted}
