-- extend_lib.lua: the owner-checked extension of one lease, shared by
-- extend.lua (Lease.Extend: one lease) and extend_many.lua (the renewer:
-- many leases of one pool per call). The engine (internal/engine) puts this
-- file (after lib.lua) in front of each script whose header says
-- "-- include: extend_lib.lua"; it runs nothing by itself.

-- extend_member pushes the lease of member on one scope (free zset free,
-- lease hash leases) to newexp, if token still owns it: its record in the
-- lease hash carries token, and, with live_only, has not expired by now.
-- Returns newexp, or 0 when the caller no longer owns the lease (nothing
-- changed).
local function extend_member(free, leases, member, token, newexp, now, live_only)
  local v = redis.call('HGET', leases, member)
  if not v then return 0 end
  local sep = string.find(v, '|', 1, true)
  if not sep or string.sub(v, 1, sep - 1) ~= token then return 0 end
  local expiry = tonumber(string.sub(v, sep + 1))
  if live_only and (not expiry or expiry <= now) then return 0 end
  -- No entry: the lease's score passed and lease.lua pruned it (score 0).
  local score = num(redis.call('ZSCORE', free, member)) or 0
  if score < newexp then redis.call('ZADD', free, newexp, member) end
  if score <= now or score >= DEAD then
    -- A lease renewed after its expiry (live_only false) puts back out a
    -- slot that was free, or a dead proxy's lease that its exit index may
    -- have let go (lease.lua's dead_kept): the site's exit index names its
    -- entry again (lib.lua's exit_mark; one HGET when it has no exit).
    local base, site = busy_site(free)
    local id = string.match(member, '^(.*):%d+$')
    if base and id then exit_mark_id(base, site, id, redis.call('PTTL', free)) end
  end
  redis.call('HSET', leases, member, token .. '|' .. newexp)
  return newexp
end
