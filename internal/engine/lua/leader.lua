-- leader.lua: a lock held by one process at a time, with a TTL, owner-checked
-- (package probe elects its checker with it). A holder that dies stops
-- renewing and the lock is free within one TTL.
--
-- KEYS[1] lock key   string: the holder's token; TTL: ARGV[3]
-- ARGV[1] "hold" (take the lock if free, or renew it if the token holds it),
--         "release" (delete it if the token holds it) or "held" (read only:
--         whether anyone holds it)
-- ARGV[2] token of the caller (hold, release)
-- ARGV[3] TTL ms (hold)
--
-- Returns 1 when the caller holds the lock after a hold (or released it),
-- or, for "held", when a holder holds it; else 0.
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == 'hold' then
  local ttl = tonumber(ARGV[3])
  if not ttl or ttl < 1 then return redis.error_reply('leader: bad TTL') end
  if cur and cur ~= ARGV[2] then return 0 end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', math.floor(ttl))
  return 1
elseif ARGV[1] == 'held' then
  if cur then return 1 end
  return 0
elseif ARGV[1] == 'release' then
  if cur ~= ARGV[2] then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('leader: unknown op')
