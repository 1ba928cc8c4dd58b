-- breaker_lib.lua: the site circuit breaker's record and its gate on the
-- lease path (breaker.go). Included by lease.lua, breaker.lua and
-- breaker_set.lua.
--
-- The breaker hash of a pool ("{prefix:pool}:breaker") holds one field per
-- site whose breaker is not closed:
--   "<until ms>|<pause ms>|<probes granted>|<probe successes>"
-- The site is open (paused: no lease) while until > now, then half-open: at
-- most `probes` leases are granted as probes until breaker.lua closes it (the
-- probes succeeded) or opens it again for a doubled pause (one failed).
-- Probes that never report (their process died) are granted anew once
-- another pause has passed. No field: the breaker is closed.

-- breaker_parse reads a site's record, or raises corrupt.
local function breaker_parse(key, site, rec)
  local u, p, g, o = string.match(rec, '^(%d+)|(%d+)|(%d+)|(%d+)$')
  if not u then corrupt(key, 'field ' .. site .. ' is not a breaker record', rec) end
  return tonumber(u), tonumber(p), tonumber(g), tonumber(o)
end

local function breaker_put(key, site, u, p, g, o)
  redis.call('HSET', key, site, string.format('%.0f|%.0f|%.0f|%.0f', u, p, g, o))
end

-- breaker_gate is nil when a lease for site may go ahead (the breaker is
-- closed, or a probe is granted now), else lease.lua's paused reply
-- {-3, wait ms, until ms}: until is 0 while half-open with every probe out.
-- A second result true says the lease goes ahead as a probe (half-open).
local function breaker_gate(key, site, probes, now)
  local rec = redis.call('HGET', key, site)
  if not rec then return nil end
  local u, p, g, o = breaker_parse(key, site, rec)
  if u > now then return {-3, u - now, u} end
  if g >= probes and now - u > p then u, g = now, 0 end
  if g >= probes then return {-3, math.min(p, 250), 0} end
  breaker_put(key, site, u, p, g + 1, o)
  return nil, true
end
