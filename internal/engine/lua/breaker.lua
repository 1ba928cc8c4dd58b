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
--                          "run" -> the ids of the distinct proxies banned
--                          there since the last healthy answer reported,
--                          space separated (the burst's);
--                          "runt" -> "<id> <ms> ..." the same since the
--                          request of the last healthy answer was sent,
--                          each with when its last ban was reported (the
--                          few rule's row);
--                          "h" -> "<id> <ms> ..." the proxies that answered
--                          healthily there in the window, when the request of
--                          each one's last healthy answer was sent, at most
--                          HCAP of them (the most recent). TTL: twice the window
--   KEYS[4i-1] the site's free zset   KEYS[4i] its lease hash   KEYS[4i+1] its strikes hash
-- ARGV[1] window ms      ARGV[2] min attempts    ARGV[3] ban rate threshold, permille
-- ARGV[4] burst: distinct proxies banned in a row that open it whatever the rate
-- ARGV[5] first pause ms ARGV[6] max pause ms    ARGV[7] probes
-- ARGV[8] slots (K)      ARGV[9] bucket ms       ARGV[10] min distinct proxies for the rate rule
-- ARGV[11] min run of the few rule (below): more proxies than one request tries
-- then per site i, seven: site, attempts, bans, healthy answers, ids of proxies
--   quarantined for a ban there (space separated, "" for none), some of the
--   proxies that answered healthily there, "<id> <age ms> ..." (age: since
--   the request of its last healthy answer was sent), ms since the request
--   of the last healthy answer was sent (when healthy answers > 0)
--
-- The few rule's row: a healthy answer ends it, but only for the bans
-- reported before its request was sent (now - its age): a report's healthy
-- answers may reach Redis after another report's ban, taken later (two
-- flushes of one Switch at once, two servers), or be judged after the
-- storm's first failures though the site gave them before it; ending the
-- whole row then dropped a ban of the storm from it for good, and a small
-- pool has no ban to spare. (A stamp ahead of this clock, after a failover
-- to a Redis whose clock is behind, reads as now.) The burst's run ends
-- whole at every healthy answer reported, as it always did: on a large
-- pool crawling slow pages, a row cut at send times would keep the bans of
-- the seconds each page takes, and steady IP bans would make a burst.
--
-- The rules that open a closed breaker: the rate (at least ARGV[2]
-- attempts and ARGV[10] distinct proxies quarantined in the window, bans
-- at ARGV[3] permille of attempts), the burst (ARGV[4] distinct proxies in
-- the run), and the few: fewer than min(burst, HCAP) proxies answered
-- healthily in the window (a small pool, or a slow crawl), at least
-- ARGV[11] of them (more than one request tries), and every one of them
-- was banned or failed there since its last healthy answer, two at least
-- in the run (covers). A small pool cannot make a run of burst, nor the
-- attempts of the rate once every proxy is out: without the few rule a
-- storm of a few seconds quarantined all of it, for a minute or more.
--
-- Returns per site {state, until ms, lifted, more}: state 0 closed, 1 open
-- (until: the end of the pause), 2 half-open; lifted: the quarantines of
-- this storm lifted by this call; more: 1 if the window holds more to lift
-- (the caller reports the site again with zero counts until it is 0). While the breaker is open or half-open the proxies
-- quarantined on the site within the window are freed (the storm is the
-- site's, not theirs): their slots in the free zset that wait out a
-- quarantine (not leased, not dead) are free now, and their strikes end
-- (a healthy record stays; their failures no longer stand).
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
-- A window kept as a listpack (a hundred-odd fields) is one page: all of it
-- (the run and "h" grow past a listpack's 64-byte values at three ids: a
-- storm's window, and a site's served by three proxies or more, is a hash
-- table, of 1-2 KB with "h" full).
local now = now_ms()
local window, mina, thr, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local pause0, pausemax, probes = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local slots, bucketms, minq = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local minrun = tonumber(ARGV[11])
local HCAP = 32
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

local function lift(id, free, leases, strikes, rec)
  local n = 0
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local score = num(redis.call('ZSCORE', free, m))
    if score and score > now and score < DEAD and redis.call('HEXISTS', leases, m) == 0 then
      redis.call('ZADD', free, now, m)
      n = 1
    end
  end
  -- Its run of bans ends; a healthy record (rec "0|<ms>|0": no run)
  -- stays, and its last failure there no longer stands (the storm's):
  -- the proxy still counts as one that worked on the site
  -- (worked_lib.lua, storm.go). (A strike record goes, an unproven lift's
  -- mark with it: the record does not say whether the proxy was healthy
  -- before its strike, and a mark would take a witness from the site for
  -- each proxy healthy before the storm; so an IP the site bans is a fresh
  -- first strike again after each opening: the README's known gaps.)
  if string.match(rec or '', '^0|%d+|0$') then
    redis.call('HDEL', strikes, 'f:' .. id)
  else
    redis.call('HDEL', strikes, id, 'f:' .. id)
  end
  return n
end

-- healthy_read is the window's healthy proxies: id -> ms of its last
-- healthy answer, those in the window only, and their count. (A corrupt
-- field reads as none.)
local function healthy_read(win)
  local t, n = {}, 0
  local w = words(redis.call('HGET', win, 'h'))
  for j = 1, #w - 1, 2 do
    local ms = tonumber(w[j + 1])
    if ms and ms > now then ms = now end -- a stamp ahead of this clock (a failover): now
    if ms and ms >= now - window and not t[w[j]] then t[w[j]], n = ms, n + 1 end
  end
  return {ids = t, n = n}
end

-- healthy_note adds the proxies of pairs ("<id> <age ms>": each one's
-- request sent age ago answered healthily) to the window's healthy
-- proxies, keeps the HCAP most recent, and returns them.
local function healthy_note(win, pairs_)
  local h = healthy_read(win)
  for j = 1, #pairs_ - 1, 2 do
    local id, ms = pairs_[j], now - math.max(tonumber(pairs_[j + 1]) or 0, 0)
    if ms >= now - window then
      if not h.ids[id] then h.n = h.n + 1 end
      if not h.ids[id] or h.ids[id] < ms then h.ids[id] = ms end
    end
  end
  local list = {}
  for id, ms in pairs(h.ids) do list[#list + 1] = {id, ms} end
  table.sort(list, function(x, y) return x[2] > y[2] end)
  local out, keep = {}, {}
  for j = 1, math.min(#list, HCAP) do
    out[#out + 1] = list[j][1] .. ' ' .. string.format('%.0f', list[j][2])
    keep[list[j][1]] = list[j][2]
  end
  redis.call('HSET', win, 'h', table.concat(out, ' '))
  return {ids = keep, n = math.min(#list, HCAP)}
end

-- covers reports whether few (healthy_read) is at least minrun proxies
-- (more than one request tries) and fewer than min(burst, HCAP), each of
-- them banned or failed there since the request of its last healthy
-- answer was sent: two at least in the run (id -> ms), every other one
-- with its "q" field no older than that, nor than a second before the
-- run's first ban. (A ban of the storm may leave the run to a healthy
-- answer of another proxy as the storm begins; its proxy stays
-- quarantined, never in the run again. A ban a second or more before the
-- run is no part of it: an IP the site banned among pages it served.) No
-- one request's tries cover them all; pages failing for everyone one
-- after the other, with none of those proxies serving in between, may.
local function covers(win, run, few)
  if few.n < minrun or few.n >= math.min(burst, HCAP) then return false end
  local inrun, first, rest, qf = 0, nil, {}, {}
  for id, hms in pairs(few.ids) do
    if run[id] and run[id] >= hms then
      inrun = inrun + 1
      if not first or run[id] < first then first = run[id] end
    elseif run[id] then
      return false -- it served since its ban
    else
      rest[#rest + 1] = id
      qf[#qf + 1] = 'q' .. id
    end
  end
  if inrun < 2 then return false end
  if #rest == 0 then return true end
  local q = redis.call('HMGET', win, unpack(qf))
  for j, id in ipairs(rest) do
    local ms = tonumber(q[j])
    if not ms or ms < few.ids[id] or ms < first - 1000 then return false end
  end
  return true
end

for i = 1, (#KEYS - 1) / 4 do
  local win, free, leases, strikes = KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i], KEYS[4 * i + 1]
  local a = 11 + 7 * (i - 1)
  local site = ARGV[a + 1]
  local att, bans, ok = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local ids = words(ARGV[a + 5])

  if att > 0 then redis.call('HINCRBY', win, 'a' .. bucket, att) end
  if bans > 0 then redis.call('HINCRBY', win, 'b' .. bucket, bans) end
  -- The burst's run: the ids banned since the last healthy answer
  -- reported. The few rule's row, id -> ms of its last ban: a healthy
  -- answer ends the part of it reported before its request was sent.
  local run = {}
  if ok == 0 then run = words(redis.call('HGET', win, 'run')) end
  local row, nrow, cut = {}, 0, nil
  if ok > 0 then cut = now - math.max(tonumber(ARGV[a + 7]) or 0, 0) end
  local rw = words(redis.call('HGET', win, 'runt'))
  for j = 1, #rw - 1, 2 do
    local ms = tonumber(rw[j + 1])
    if ms and ms > now then ms = now end -- a stamp ahead of this clock (a failover): now
    if ms and not row[rw[j]] and (not cut or ms > cut) then row[rw[j]], nrow = ms, nrow + 1 end
  end
  for _, id in ipairs(ids) do
    local was = qbucket(redis.call('HGET', win, 'q' .. id))
    if was then redis.call('HINCRBY', win, was, -1) end
    redis.call('HSET', win, 'q' .. id, now)
    redis.call('HINCRBY', win, 'c' .. bucket, 1)
    local seen = false
    for _, r in ipairs(run) do if r == id then seen = true end end
    if not seen then run[#run + 1] = id end
    if not row[id] then nrow = nrow + 1 end
    row[id] = now
  end
  if ok > 0 or #ids > 0 then
    redis.call('HSET', win, 'run', table.concat(run, ' '))
    local t = {}
    for id, ms in pairs(row) do t[#t + 1] = id .. ' ' .. string.format('%.0f', ms) end
    redis.call('HSET', win, 'runt', table.concat(t, ' '))
  end
  local healthy = words(ARGV[a + 6])
  local few = nil -- the window's healthy proxies, read when needed
  if #healthy > 0 then few = healthy_note(win, healthy) end

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
    local fewrule = false
    if not rate and #run < burst and nrow >= 2 then
      few = few or healthy_read(win)
      fewrule = covers(win, row, few)
    end
    if rate or #run >= burst or fewrule then
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
    -- Their strikes records, in one read.
    local ids, recs = {}, {}
    for id in pairs(quarantined) do ids[#ids + 1] = id end
    if #ids > 0 then
      local r = redis.call('HMGET', strikes, unpack(ids))
      for j, id in ipairs(ids) do recs[id] = r[j] end
    end
    for id, v in pairs(quarantined) do
      lifted = lifted + lift(id, free, leases, strikes, recs[id])
      local c = qbucket(v)
      if c then redis.call('HINCRBY', win, c, -1) end
      redis.call('HDEL', win, 'q' .. id)
    end
    redis.call('HDEL', win, 'run', 'runt')
  end
  out[#out + 1] = {state, untl, lifted, more}
end
return out
