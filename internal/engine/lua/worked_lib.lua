-- worked_lib.lua: whether a proxy worked on a scope since its last
-- failure there (storm.go). Included by penalize.lua and worked.lua.
--
-- A scope's strikes hash holds the proxy's record under its id ("0|<ms>|0"
-- after a healthy answer there, release.lua) and, under "f:<id>", the ms
-- of its last failure there that stands (penalize.lua, worked.lua; the
-- breaker's lift takes the storm's back, breaker.lua).

-- worked reports whether proxy id worked on the scope of strikes hash key:
-- a healthy answer there after its last failure that stands, or with none.
-- A proxy that never served the scope, was struck since, or failed again
-- with no healthy answer since, did not.
local function worked(key, id)
  local sv = redis.call('HMGET', key, id, 'f:' .. id)
  local h = tonumber(string.match(sv[1] or '', '^0|(%d+)|0$')) -- (a missing field is false)
  local f = tonumber(sv[2] or '')
  return h ~= nil and (f == nil or f < h)
end

-- worked_fail notes a failure of proxy id now on the scope of strikes hash
-- key; a hash it creates gets the idle TTL (ms).
local function worked_fail(key, id, idle)
  if redis.call('HSET', key, 'f:' .. id, now_str()) == 1 and redis.call('PTTL', key) < 0 then
    redis.call('PEXPIRE', key, idle)
  end
end
