-- cookies_migrate.lua: move the cookies an earlier version kept for one
-- host (one hash per host and port) into the cookie jar of the host's
-- registrable domain, atomically.
--
-- include: cookies_lib.lua
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<flags>|<expires ms>|<line>"
-- KEYS[2] registry set of the domains that have a cookie jar
-- KEYS[3] the host's hash of the earlier version  "<name>;<path>;<domain>" -> Set-Cookie line
-- KEYS[4] the earlier version's registry set of hosts
-- ARGV[1] domain   ARGV[2] host (the earlier registry's member)   ARGV[3] max cookies per jar
-- ARGV[4] max bytes of a jar's values
-- ARGV[5 ..] legacy field, line read, jar field, "<flags>m|<expires ms>|<line>"
--            quadruples, one per field of KEYS[3] read (the Go side turned
--            the line into the jar's entry; jar field "" when the cookie
--            is not moved: one the host may not set, expired, unreadable)
--
-- Each entry is moved only if its legacy field still holds the line read
-- (checked here): a field changed since (an earlier version still
-- running wrote it again) is left for the next round, which reads it
-- again; a field gone since (moved by another process, deleted by an
-- earlier version) is not moved, so that a migration that lands late
-- never brings back a cookie moved and deleted meanwhile. A moved entry
-- is flagged (m): it replaces a jar entry that is absent or was moved too
-- (by an earlier round, or from another host's hash), never one written
-- natively (cookies_set.lua), which is newer than anything an earlier
-- version wrote. The legacy field is deleted once moved (or refused).
--
-- Returns the number of fields KEYS[3] has left (0: it is gone), and how
-- many jar entries were removed to make room.
local sets, gone = {}, {}
for i = 5, #ARGV - 3, 4 do
  if redis.call('HGET', KEYS[3], ARGV[i]) == ARGV[i + 1] then
    gone[#gone + 1] = ARGV[i]
    local f = ARGV[i + 2]
    if f ~= '' then
      local old = redis.call('HGET', KEYS[1], f)
      if not old or cookie_migrated(old) then
        sets[#sets + 1] = f
        sets[#sets + 1] = ARGV[i + 3]
      end
    end
  end
end
local evicted = cookie_write(KEYS[1], ARGV[3], ARGV[4], sets, {})
cookie_register(KEYS[1], KEYS[2], ARGV[1])
cookie_hdel(KEYS[3], gone)
return {cookie_register(KEYS[3], KEYS[4], ARGV[2]), evicted}
