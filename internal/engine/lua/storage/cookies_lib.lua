-- cookies_lib.lua: what the cookie scripts (cookies_get.lua, cookies_set.lua,
-- cookies_migrate.lua) share. A cookie jar hash holds, per registrable
-- domain, "<domain>;<path>;<name>" ->
-- "<created µs>|<flags>|<expires ms>|<Set-Cookie line>" (flags: h host-only
-- or d domain cookie, then m if the entry was moved from an earlier
-- version's hash; expires 0 for a session cookie); storage/cookies.go
-- documents it.
--
-- Limits (ARGV of each script): at most max cookies and maxb bytes of
-- values per jar. A write that would pass either makes room as a browser
-- does: it removes entries this package did not write first, then expired
-- cookies, then the oldest by creation time, never one the write itself
-- names; it never refuses for a full jar.

-- COOKIE_VALUE_MAX bounds a value this package writes (storage's
-- maxCookieValue plus the creation time): a jar of n values holds at most
-- n * COOKIE_VALUE_MAX bytes, so a write reads the whole jar to count its
-- bytes only when that bound passes maxb.
local COOKIE_VALUE_MAX = 8192 + 32

-- cookie_now_us is the server's clock in µs, read once per call: the TIME
-- that lib.lua's now_ms reads then too (it fills now_ms's cache), so a call
-- reads TIME once. Creation times need the µs: the cookies of two calls in
-- one ms must not tie.
local cookie_us
local function cookie_now_us()
  if not cookie_us then
    local t = redis.call('TIME')
    cookie_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if not now_read then now_read = math.floor(cookie_us / 1000) end
  end
  return cookie_us
end

-- cookie_meta parses a stored value: its creation time (µs) and expiry
-- (ms, 0 for none), or nil for a value this package did not write.
local function cookie_meta(v)
  local c, e = string.match(v, '^(%d+)|[hd]m?|(%d+)|')
  if not c then return nil end
  return tonumber(c), tonumber(e)
end

-- cookie_migrated reports whether a stored value was moved from an earlier
-- version's hash (flag m).
local function cookie_migrated(v)
  return string.match(v, '^%d+|[hd]m|') ~= nil
end

-- cookie_room returns the fields of jar (its HGETALL kv) to remove so that
-- it holds at most max entries and maxb bytes of values, given that n
-- entries and total bytes will be there (those of the call included) and
-- keep names the fields not to remove (the call's own); nil when even
-- removing every other entry is not enough. Order: entries this package
-- did not write, expired ones (at now ms), then the oldest created.
local function cookie_room(kv, keep, n, total, max, maxb, now)
  if n <= max and total <= maxb then return {} end
  local cand = {}
  for i = 1, #kv, 2 do
    if not keep[kv[i]] then
      local c, e = cookie_meta(kv[i + 1])
      local rank = 2
      if not c then rank, c = 0, 0 elseif e > 0 and e <= now then rank = 1 end
      cand[#cand + 1] = {kv[i], rank, c, #kv[i + 1]}
    end
  end
  table.sort(cand, function(a, b)
    if a[2] ~= b[2] then return a[2] < b[2] end
    if a[3] ~= b[3] then return a[3] < b[3] end
    return a[1] < b[1]
  end)
  local out = {}
  for _, e in ipairs(cand) do
    if n <= max and total <= maxb then break end
    out[#out + 1] = e[1]
    n, total = n - 1, total - e[4]
  end
  if n > max or total > maxb then return nil end
  return out
end

-- cookie_hdel deletes fields (a table) of key, a page at a time.
local function cookie_hdel(key, fields)
  for i = 1, #fields, 1000 do
    redis.call('HDEL', key, unpack(fields, i, math.min(i + 999, #fields)))
  end
end

-- cookie_write applies one call's changes to jar, all or nothing: dels
-- (a table of fields) are deleted, sets (a table of field,
-- "<flags>|<expires ms>|<line>" pairs) set, each stamped with its creation
-- time: the one stored for the field (an overwrite keeps the first, as
-- net/http/cookiejar does), else now (µs) + its rank in the call (cookies
-- of one call count as set in order). Room is made first (cookie_room). Raises an
-- error, writing nothing, only when the call's own cookies pass the limits
-- (the Go side never sends such a call). Returns how many entries it
-- removed to make room.
local function cookie_write(jar, max, maxb, sets, dels)
  max, maxb = tonumber(max), tonumber(maxb)
  local now_us = cookie_now_us()
  local now = now_ms()
  local keep, olds = {}, {}
  local n = redis.call('HLEN', jar)
  for _, f in ipairs(dels) do
    if not keep[f] then
      keep[f] = true
      if redis.call('HEXISTS', jar, f) == 1 then n = n - 1 end
    end
  end
  local vals, rank = {}, 0
  for i = 1, #sets, 2 do
    local f = sets[i]
    local old = olds[f]
    if old == nil then
      old = redis.call('HGET', jar, f)
      olds[f] = old
      if not old or keep[f] then n = n + 1 end
    end
    keep[f] = true
    local created = old and string.match(old, '^(%d+)|')
    if not created then created = string.format('%.0f', now_us + rank) end
    rank = rank + 1
    vals[#vals + 1] = f
    vals[#vals + 1] = created .. '|' .. sets[i + 1]
  end
  local evict = {}
  if n > max or n * COOKIE_VALUE_MAX > maxb then
    local kv = redis.call('HGETALL', jar)
    local total = 0
    for i = 2, #kv, 2 do
      if not keep[kv[i - 1]] then total = total + #kv[i] end
    end
    local last = {}
    for i = 1, #vals, 2 do last[vals[i]] = #vals[i + 1] end
    for _, l in pairs(last) do total = total + l end
    evict = cookie_room(kv, keep, n, total, max, maxb, now)
    if not evict then
      error('cookie write of ' .. #sets / 2 .. ' cookies passes the limits of a jar on its own', 0)
    end
  end
  cookie_hdel(jar, evict)
  cookie_hdel(jar, dels)
  for i = 1, #vals, 1000 do
    redis.call('HSET', jar, unpack(vals, i, math.min(i + 999, #vals)))
  end
  return #evict
end

-- cookie_read returns jar's HGETALL, after removing entries until it is
-- within the limits (as cookie_room orders them: a jar some other writer
-- took past them), and how many it removed.
local function cookie_read(jar, max, maxb)
  local kv = redis.call('HGETALL', jar)
  local total = 0
  for i = 2, #kv, 2 do total = total + #kv[i] end
  local evict = cookie_room(kv, {}, #kv / 2, total, tonumber(max), tonumber(maxb), now_ms())
  if #evict == 0 then return kv, 0 end
  cookie_hdel(jar, evict)
  return redis.call('HGETALL', jar), #evict
end

-- cookie_register(jar, registry, member): keeps member in the registry
-- set while jar has fields, and removes it once jar is empty; returns
-- the number of fields of jar.
local function cookie_register(jar, registry, member)
  local left = redis.call('HLEN', jar)
  if left > 0 then
    redis.call('SADD', registry, member)
  else
    redis.call('SREM', registry, member)
  end
  return left
end
