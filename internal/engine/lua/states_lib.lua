-- states_lib.lua: what state.lua and proxy_states.lua share.

-- failing_here reports whether proxy id is under a proxy failure's
-- quarantine on the scope whose site is site ("" for a global scope, where
-- a failure on any site quarantines): it failed since its last healthy
-- answer (the pool's fails hash, penalize.lua), on that site or on several.
-- A failure writes no strike, so state.lua and proxy_states.lua ask this.
local function failing_here(fails, id, site)
  local v = redis.call('HGET', fails, id)
  if not v then return false end
  if site == '' then return true end
  local multi, first = string.match(v, '^%d+|[01]|([01])|(.*)$')
  return multi == '1' or first == site
end
