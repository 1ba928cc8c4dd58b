-- lift.lua: take back a first strike that a page cost a proxy: the page
-- refused every proxy tried for it, proxies healthy on the site's other
-- pages, so the refusal was no evidence against this one (transport.go).
--
-- KEYS[1] free zset     "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] strikes hash  id -> "<bans in a row>|<ms of the last>|<its end>" (penalize.lua)
-- ARGV[1] proxy id      ARGV[2] slots per proxy (K)
-- ARGV[3] the end (ms) of the strike to lift, as penalize.lua returned it
-- ARGV[4] "1": the proxy was healthy on the scope before the strike
--
-- Only a first strike still on record (one ban in a row, the same end) is
-- lifted: a strike since, or a healthy answer, wins. A proxy healthy on the
-- scope before the strike goes back to healthy, as lifted ("0|<now>|1"): no
-- strike, and a witness of a page refusing everyone only for refusals that
-- come after the lift, until its next healthy answer (penalize.lua, ban.go),
-- so that proxies burnt together, judged a page once, are not judged so
-- again each time a request meets two of them in a row. A proxy never
-- healthy there (an "unproven lift") keeps its strike on record as the
-- marker "1|<ms of the strike>|0", with the record's lifetime: its
-- quarantine is over, but it is no witness, and its next refusal on the
-- scope is no fresh first strike (penalize.lua reports it unproven; a
-- first strike awaiting its evidence all the same), until a healthy
-- answer there (release.lua) clears it. Else an IP the site bans, lifted
-- with the pages of a cold site, would pass for a page's first strike on
-- each page it meets and never be quarantined. The slots the strike
-- pushed out (score = its end) are free now; slots pushed further by
-- anything else (a lease, a ban on every site, a dead mark) keep their
-- score. Returns the number of slots made free, or -1 when nothing was
-- lifted.
local now = now_ms()
local v = redis.call('HGET', KEYS[2], ARGV[1])
local c, last, till
if v then c, last, till = string.match(v, '^(%d+)|(%d+)|(%d+)$') end
if not c or tonumber(c) ~= 1 or tonumber(till) ~= tonumber(ARGV[3]) then return -1 end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], '0|' .. now .. '|1')
else
  redis.call('HSET', KEYS[2], ARGV[1], '1|' .. last .. '|0') -- an unproven lift (the hash keeps its TTL)
end
local freed = 0
for s = 0, tonumber(ARGV[2]) - 1 do
  local m = ARGV[1] .. ':' .. s
  local score = num(redis.call('ZSCORE', KEYS[1], m))
  if score and score == tonumber(till) and score > now then
    redis.call('ZADD', KEYS[1], now, m)
    freed = freed + 1
  end
end
return freed
