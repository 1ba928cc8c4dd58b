-- unban_lib.lua: the end of a proxy's quarantine on one scope, shared by
-- unban.lua (Switch.Unban) and site_hold.lua (a site probe's quarantine
-- lifted when the probe passes again). The engine (internal/engine) puts
-- this file (after lib.lua) in front of each script whose header says
-- "-- include: unban_lib.lua"; it runs nothing by itself.

-- unban_slots ends the quarantine of proxy id on a scope (free zset free,
-- lease hash leases, strikes hash strikes) now: its backoff starts over
-- (its strikes record goes), a slot held by a live lease comes back when
-- that lease ends, never earlier, and a dead proxy's slots stay dead.
-- Returns the number of slots made free now.
local function unban_slots(free, leases, strikes, id, slots, now)
  redis.call('HDEL', strikes, id)
  local freed = 0
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local score = num(redis.call('ZSCORE', free, m))
    if score and score > now and score < DEAD then
      local v = redis.call('HGET', leases, m)
      local exp = v and tonumber(string.match(v, '|(%d+)$'))
      if exp and exp > now then
        redis.call('ZADD', free, exp, m)
      else
        redis.call('ZADD', free, now, m)
        freed = freed + 1
      end
    end
  end
  return freed
end
