-- breaker.lua: report what a Switch saw of some sites since its last report
-- and get back the state of each site's circuit breaker (breaker.go).
-- include: breaker_lib.lua
--
-- KEYS[1] breaker hash   site -> record (breaker_lib.lua)
-- then per site i (i = 1..n), four keys:
--   KEYS[4i-2] window hash "a<bucket>" / "b<bucket>" -> attempts / bans in the
--                          bucket (bucket = floor(ms / ARGV[9])); "q<id>" -> ms at
--                          which proxy id was quarantined there; "run" -> the ids
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
-- Returns per site {state, until ms, lifted}: state 0 closed, 1 open (until:
-- the end of the pause), 2 half-open; lifted: the quarantines of this storm
-- lifted by this call. While the breaker is open or half-open the proxies
-- quarantined on the site within the window are freed (the storm is the
-- site's, not theirs): their slots in the free zset that wait out a
-- quarantine (not leased, not dead) are free now, and their strikes end.
local now = now_ms()
local window, mina, thr, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local pause0, pausemax, probes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local slots, bucketms, minq = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local bucket = math.floor(now / bucketms)
local oldest = bucket - math.floor(window / bucketms)
local out = {}

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
    redis.call('HSET', win, 'q' .. id, now)
    local seen = false
    for _, r in ipairs(run) do if r == id then seen = true end end
    if not seen then run[#run + 1] = id end
  end
  if ok > 0 or #ids > 0 then redis.call('HSET', win, 'run', table.concat(run, ' ')) end

  -- The window: attempts and bans of its buckets, proxies quarantined in it.
  local A, B, quarantined = 0, 0, {}
  local h = redis.call('HGETALL', win)
  for j = 1, #h, 2 do
    local f, v = h[j], h[j + 1]
    local kind, rest = string.sub(f, 1, 1), string.sub(f, 2)
    if (kind == 'a' or kind == 'b') and tonumber(rest) then
      if tonumber(rest) <= oldest then
        redis.call('HDEL', win, f)
      elseif kind == 'a' then
        A = A + tonumber(v)
      else
        B = B + tonumber(v)
      end
    elseif kind == 'q' then
      if (tonumber(v) or 0) < now - window then
        redis.call('HDEL', win, f)
      else
        quarantined[#quarantined + 1] = rest
      end
    end
  end
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
      quarantined = {}
    else
      if ok > 0 then breaker_put(KEYS[1], site, u, p, g, o + ok) end
      state = 2
    end
  else
    local rate = A >= mina and B * 1000 >= thr * A and #quarantined >= minq
    if rate or #run >= burst then
      breaker_put(KEYS[1], site, now + pause0, pause0, 0, 0)
      state, untl = 1, now + pause0
    end
  end

  local lifted = 0
  if state ~= 0 then
    for _, id in ipairs(quarantined) do
      lifted = lifted + lift(id, free, leases, strikes)
      redis.call('HDEL', win, 'q' .. id)
    end
    redis.call('HDEL', win, 'run')
  end
  out[#out + 1] = {state, untl, lifted}
end
return out
