-- breaker_set.lua: an operator pauses a site, or resumes it (breaker.go).
-- include: breaker_lib.lua
--
-- KEYS[1] breaker hash   KEYS[2] the site's window hash (breaker.lua)
-- ARGV[1] site           ARGV[2] pause ms; 0 resumes the site (closes its breaker)
--
-- A paused site leases nothing until the pause ends, then half-opens like
-- one the breaker paused; resuming closes the breaker and forgets the
-- site's window. Returns the end of the pause in ms (0 on resume).
local now = now_ms()
local ms = tonumber(ARGV[2])
if ms <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  return 0
end
breaker_put(KEYS[1], ARGV[1], now + ms, ms, 0, 0)
return now + ms
