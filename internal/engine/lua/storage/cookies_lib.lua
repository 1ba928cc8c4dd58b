-- cookies_lib.lua: what the cookie scripts (cookies_set.lua,
-- cookies_migrate.lua) share. A cookie jar hash holds, per registrable
-- domain, "<domain>;<path>;<name>" -> "<created µs>|<h or d>|<Set-Cookie line>"
-- (h: host-only, d: a domain cookie); storage/cookies.go documents it.
--
-- cookie_now_us: the server's clock (TIME) in µs, read once per call.
-- cookie_put(jar, max, from, to, only_new, host): sets the field, value
--   pairs ARGV[from .. to] ("<h or d>|<line>") in hash jar, each stamped
--   with its creation time: the one already stored for the field (an
--   overwrite keeps the first creation, as net/http/cookiejar does), else
--   now + its rank in the call (cookies of one call count as set in
--   order). With only_new, a field already present is left as it is.
--   Raises a PSCORRUPT error (lib.lua's corrupt), writing nothing, when
--   jar would hold more than max cookies (host: the domain, for the message).
-- cookie_register(jar, registry, member): keeps member in the registry
--   set while jar has fields, and removes it once jar is empty; returns
--   the number of fields of jar.

local cookie_now
local function cookie_now_us()
  if not cookie_now then
    local t = redis.call('TIME')
    cookie_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return cookie_now
end

local function cookie_put(jar, max, from, to, only_new, host)
  if to < from then return end
  local olds, fresh = {}, 0
  for i = from, to, 2 do
    local old = redis.call('HGET', jar, ARGV[i])
    olds[i] = old
    if not old then fresh = fresh + 1 end
  end
  if redis.call('HLEN', jar) + fresh > tonumber(max) then
    corrupt(jar, 'cookie domain ' .. host .. ' would hold more than ' .. max .. ' cookies')
  end
  local now = cookie_now_us()
  local set = {}
  for i = from, to, 2 do
    local old = olds[i]
    if not (old and only_new) then
      local created = old and string.match(old, '^(%d+)|')
      if not created then created = string.format('%.0f', now + (i - from) / 2) end
      set[#set + 1] = ARGV[i]
      set[#set + 1] = created .. '|' .. ARGV[i + 1]
    end
  end
  if #set > 0 then redis.call('HSET', jar, unpack(set)) end
end

local function cookie_register(jar, registry, member)
  local left = redis.call('HLEN', jar)
  if left > 0 then
    redis.call('SADD', registry, member)
  else
    redis.call('SREM', registry, member)
  end
  return left
end
