-- breaker_list.lua: the sites whose breaker is open or half-open (breaker.go).
-- include: breaker_lib.lua
--
-- KEYS[1] breaker hash
-- Returns {now ms, site, until ms, pause ms, probes granted, probe successes, ...}.
local out = {now_ms()}
local h = redis.call('HGETALL', KEYS[1])
for i = 1, #h, 2 do
  local u, p, g, o = breaker_parse(KEYS[1], h[i], h[i + 1])
  out[#out + 1] = h[i]
  out[#out + 1] = u
  out[#out + 1] = p
  out[#out + 1] = g
  out[#out + 1] = o
end
return out
