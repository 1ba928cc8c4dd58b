-- breaker.lua: report what a Switch saw of some sites since its last report
-- and get back the state of each site's circuit breaker (breaker.go).
-- include: breaker_lib.lua
--
-- KEYS[1] breaker hash   site -> record (breaker_lib.lua)
-- then per site i (i = 1..n), four keys:
--   KEYS[4i-2] window hash "a<bucket>" / "b<bucket>" -> attempts / bans in the
--                          bucket (bucket = floor(ms / ARGV[9])); "q<id>" -> ms at
--                          which proxy id was quarantined there last;
--                          "c<bucket>" -> the q fields whose ms is in the bucket;
--                          "scan" -> the HSCAN cursor of the prune (below);
--                          "lift" -> that of the lifting, or "done";
--                          "run" -> the ids
--                          of the distinct proxies banned there since the last
--                          healthy answer, space separated. TTL: twice the window
--   KEYS[4i-1] the site's free zset   KEYS[4i] its lease hash   KEYS[4i+1] its strikes hash
-- ARGV[1] window ms      ARGV[2] min attempts    ARGV[3] ban rate threshold, permille
-- ARGV[4] burst: distinct proxies banned in a row that open it whatever the rate
-- ARGV[5] first pause ms ARGV[6] max pause ms    ARGV[7] probes
-- ARGV[8] slots (K)      ARGV[9] bucket ms       ARGV[10] min distinct proxies for the rate rule
-- then per site i, five: site, attempts, bans, healthy answers, ids of proxies
--   quarantined for a ban there (space separated, "" for none)
--
-- Returns per site {state, until ms, lifted, more}: state 0 closed, 1 open
-- (until: the end of the pause), 2 half-open; lifted: the quarantines of
-- this storm lifted by this call; more: 1 if the window holds more to lift
-- (the caller reports the site again with zero counts until it is 0). While the breaker is open or half-open the proxies
-- quarantined on the site within the window are freed (the storm is the
-- site's, not theirs): their slots in the free zset that wait out a
-- quarantine (not leased, not dead) are free now, and their strikes end.
--
-- Bounded work per call (issue 14), whatever the number of proxies
-- quarantined on a site (one HGETALL of a window of 50,000 blocked Redis
-- for 89 ms): the window's sums read the bucket fields by name (HMGET),
-- the distinct proxies quarantined in it are counted by bucket ("c"
-- fields, kept as "q" fields are written), and the "q" fields are gone
-- through a page (HSCAN) per call from the "scan" cursor: the ones older
-- than the window go. While the breaker is open or half-open, the ones in
-- it are lifted a page per call from the "lift" cursor (the proxies of the
-- call's own bans at once), and breaker.go calls again for the next page.
-- A window kept as a listpack (a hundred-odd fields) is one page: all of it.
local now = now_ms()
local window, mina, thr, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local pause0, pausemax, probes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local slots, bucketms, minq = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local bucket = math.floor(now / bucketms)
local oldest = bucket - math.floor(window / bucketms)
local SCAN = 200 -- fields of the window gone through per call
local out = {}

-- fields lists prefix .. b for the buckets b from first to last.
local function fields(prefix, first, last)
  local t = {}
  for b = first, last do t[#t + 1] = prefix .. b end
  return t
end
-- The buckets of the window, and those that passed out of it since a call
-- that kept the window alive (its TTL is twice the window).
local inwin, stale = {}, {}
for _, k in ipairs({'a', 'b', 'c'}) do
  for _, f in ipairs(fields(k, oldest + 1, bucket)) do inwin[#inwin + 1] = f end
  for _, f in ipairs(fields(k, oldest - 2 * (bucket - oldest) - 2, oldest)) do stale[#stale + 1] = f end
end
-- qbucket is the "c" field of the bucket of a q field's ms, if in the window.
local function qbucket(v)
  local b = math.floor((tonumber(v) or 0) / bucketms)
  if b > oldest and b <= bucket then return 'c' .. b end
  return nil
end

local function words(s)
  local t = {}
  for w in string.gmatch(s or '', '%S+') do t[#t + 1] = w end
  return t
end

local function lift(id, free, leases, strikes)
  local n = 0
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local score = num(redis.call('ZSCORE', free, m))
    if score and score > now and score < DEAD and redis.call('HEXISTS', leases, m) == 0 then
      redis.call('ZADD', free, now, m)
      n = 1
    end
  end
  redis.call('HDEL', strikes, id)
  return n
end

for i = 1, (#KEYS - 1) / 4 do
  local win, free, leases, strikes = KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i], KEYS[4 * i + 1]
  local a = 10 + 5 * (i - 1)
  local site = ARGV[a + 1]
  local att, bans, ok = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ids = words(ARGV[a + 5])

  if att > 0 then redis.call('HINCRBY', win, 'a' .. bucket, att) end
  if bans > 0 then redis.call('HINCRBY', win, 'b' .. bucket, bans) end
  local run = {}
  if ok == 0 then run = words(redis.call('HGET', win, 'run')) end
  for _, id in ipairs(ids) do
    local was = qbucket(redis.call('HGET', win, 'q' .. id))
    if was then redis.call('HINCRBY', win, was, -1) end
    redis.call('HSET', win, 'q' .. id, now)
    redis.call('HINCRBY', win, 'c' .. bucket, 1)
    local seen = false
    for _, r in ipairs(run) do if r == id then seen = true end end
    if not seen then run[#run + 1] = id end
  end
  if ok > 0 or #ids > 0 then redis.call('HSET', win, 'run', table.concat(run, ' ')) end

  -- The window: attempts, bans and proxies quarantined in its buckets.
  local A, B, Q = 0, 0, 0
  local h = redis.call('HMGET', win, unpack(inwin))
  local n = #h / 3
  for j = 1, n do
    A = A + (tonumber(h[j]) or 0)
    B = B + (tonumber(h[n + j]) or 0)
    Q = Q + (tonumber(h[2 * n + j]) or 0)
  end
  redis.call('HDEL', win, unpack(stale))
  -- One page of the window's fields: the q fields that left the window go.
  -- (A stored cursor that is no cursor, a corrupt one, starts over.)
  local page = redis.call('HSCAN', win, string.match(redis.call('HGET', win, 'scan') or '', '^%d+$') or '0', 'COUNT', SCAN)
  for j = 1, #page[2], 2 do
    local f, v = page[2][j], page[2][j + 1]
    if string.sub(f, 1, 1) == 'q' and (tonumber(v) or 0) < now - window then redis.call('HDEL', win, f) end
  end
  if page[1] == '0' then redis.call('HDEL', win, 'scan') else redis.call('HSET', win, 'scan', page[1]) end
  redis.call('PEXPIRE', win, 2 * window)

  local state, untl = 0, 0
  local rec = redis.call('HGET', KEYS[1], site)
  if rec then
    local u, p, g, o = breaker_parse(KEYS[1], site, rec)
    if u > now then
      state, untl = 1, u
    elseif bans > 0 then
      -- A probe failed (or a request of the storm came back late): open
      -- again, for twice the last pause.
      p = math.min(2 * p, pausemax)
      breaker_put(KEYS[1], site, now + p, p, 0, 0)
      state, untl = 1, now + p
    elseif o + ok >= probes then
      redis.call('HDEL', KEYS[1], site)
      redis.call('DEL', win) -- the storm's history opens nothing again
      ids = {}
    else
      if ok > 0 then breaker_put(KEYS[1], site, u, p, g, o + ok) end
      state = 2
    end
  else
    local rate = A >= mina and B * 1000 >= thr * A and Q >= minq
    if rate or #run >= burst then
      breaker_put(KEYS[1], site, now + pause0, pause0, 0, 0)
      state, untl = 1, now + pause0
    end
  end

  -- The quarantines to lift: the call's own bans, and one page of the
  -- window's from the "lift" cursor, until one pass over the window is
  -- done ("lift" -> "done": later bans are lifted as they are reported).
  local lifted, more = 0, 0
  if state ~= 0 then
    local quarantined = {}
    for _, id in ipairs(ids) do quarantined[id] = tostring(now) end
    local lc = redis.call('HGET', win, 'lift') or '0'
    if lc ~= 'done' then
      lc = string.match(lc, '^%d+$') or '0' -- a corrupt cursor starts over
      local pg = redis.call('HSCAN', win, lc, 'COUNT', SCAN)
      for j = 1, #pg[2], 2 do
        local f, v = pg[2][j], pg[2][j + 1]
        if string.sub(f, 1, 1) == 'q' and (tonumber(v) or 0) >= now - window then quarantined[string.sub(f, 2)] = v end
      end
      if pg[1] == '0' then
        redis.call('HSET', win, 'lift', 'done')
      else
        redis.call('HSET', win, 'lift', pg[1])
        more = 1
      end
    end
    for id, v in pairs(quarantined) do
      lifted = lifted + lift(id, free, leases, strikes)
      local c = qbucket(v)
      if c then redis.call('HINCRBY', win, c, -1) end
      redis.call('HDEL', win, 'q' .. id)
    end
    redis.call('HDEL', win, 'run')
  end
  out[#out + 1] = {state, untl, lifted, more}
end
return out
