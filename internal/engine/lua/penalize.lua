-- penalize.lua: quarantine a proxy after a site ban or a proxy failure, and
-- end the lease it was caught with (owner-checked). The quarantine is the
-- score of all K slots of the proxy in the free set(s): no lease anywhere in
-- the cluster hands it out before the score passes, and nothing has to lift
-- it afterwards.
-- include: worked_lib.lua
--
-- KEYS[1] free zset       of the scope  "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash      of the scope  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[3] strikes hash    of the scope  id -> "<bans in a row>|<ms of the last>|<its end, ms>";
--                                       "f:<id>" -> ms of its last failure there that stands (fail)
-- KEYS[4] fails hash      (pool)        id -> "<failures in a row>|<all hard 0/1>|<several sites 0/1>|<site of the first>"
-- KEYS[5] dead hash       (pool)        id -> "<ms>|<reason>"
-- KEYS[6] sites zset      (pool)        not read: a ban on every site and a death touch this scope only
-- KEYS[7] quarantine zset (pool)        id -> unix ms until which it is banned on every site
-- KEYS[8] health hash     of the scope  id -> recent failure rate (lib.lua's health_note)
-- KEYS[9] pace hash       of the scope  the learned cooldown (lib.lua's pace_refused)
-- KEYS[10] gateways hash  (pool)        id -> gateway template; read only with ARGV[22] = "1"
-- ARGV[1]  "ban" or "fail"              ARGV[2] proxy id
-- ARGV[3]  member of the lease to end, or ""     ARGV[4] its owner token, or ""
-- ARGV[5]  base quarantine ms           ARGV[6] max quarantine ms
-- ARGV[7]  minimum quarantine ms (the site's Retry-After), at most ARGV[6]
-- ARGV[8]  jitter, permille (850..1150)
-- ARGV[9]  "1": ban on every site, not only on this scope
-- ARGV[10] key prefix "{prefix:pool}" (same hash tag as KEYS, hence same cluster slot;
--          checked): a death moves the pool's generation in ARGV[10]..":meta"
-- ARGV[11] idle TTL ms of the bookkeeping hashes
-- ARGV[12] fail: "1" when only the proxy can be at fault (could not connect, refused credentials)
-- ARGV[13] fail: failures in a row that make a proxy dead; "0" = never
-- ARGV[14] site (tells failures on several sites apart)   ARGV[15] reason
-- ARGV[16] slots per proxy (K)
-- ARGV[17] ban: the first quarantine ms (Bans.EvidenceFirst), "0": every ban is a verdict (base at once)
-- ARGV[18] ban: "1" when the refusal is unambiguous (a challenge redirect): no first quarantine;
--          confirm: "1" when the proxy was healthy on the scope before the strike
-- ARGV[19] confirm: the end (ms) of the strike to confirm, as this script returned it
--
-- ARGV[1] may also be "confirm": the page a strike's refusal was about was
-- then served through another proxy, which confirms the strike. A strike
-- still on record (the same end, ARGV[19]) is then sentenced as an
-- unambiguous one; anything else (a healthy answer, a lift or a newer
-- strike since) leaves the proxy alone and returns zeros. No lease ends.
--
-- Evidence (ban, with ARGV[17] > 0): the n-th strike in a row is weighed
-- e = n, plus one when it is unambiguous or confirmed. Weight 1 (a first,
-- unconfirmed refusal) is the first quarantine; weight e >= 2 is
-- base * 2^(e-2). With ARGV[17] = "0" the n-th ban is base * 2^(n-1), the
-- verdict on the first refusal it has always been.
-- ARGV[20] flaky delay ms (Rotation.FlakyDelay): a verdict (no first strike) counts in the health
--          hash, and the proxy waits at least its failure rate times this; 0: off
-- ARGV[21] a rate-limit refusal under learned pacing: "<floor ms>|<max ms>"; else ""
-- ARGV[22] "1": a ban that rotates a gateway's session (gateway.go): when the
--          proxy is a virtual proxy of a gateway (KEYS[10]), nothing changes
--          and the reply is {"gateway", its template}, for the caller to
--          rotate it (pool_update.lua's "rotate"); a plain proxy is
--          penalized as any. Saves the caller a round trip to learn which.
--
-- Paced refusals (ban with ARGV[21]): a refusal of a proxy that had not
-- rested (lib.lua's PACE_RESTED: its last healthy answer on the scope is
-- younger than twice the site's accepted rest, or while none is known
-- four times the learned cooldown, at least 100ms) is the site's pace, not
-- the proxy's: the learned cooldown grows (pace_refused) and the proxy
-- waits it out, or the Retry-After if longer, with no strike, no backoff,
-- no ban on every site (a "hold"). A rested proxy refused (or one struck
-- since its last healthy answer, or one new to the site once anything is
-- learned of its pace) is no pace: the refusal is a strike as any other,
-- and leaves the cooldown alone.
--
-- Backoff: the n-th ban in a row of a proxy on a site (no healthy response
-- in between, see release.lua; a run older than twice the max quarantine is
-- forgotten; a ban met while the last one still runs is the same offence)
-- quarantines it for base * 2^(n-1), jittered, capped at max, never less
-- than the minimum. A ban proves the proxy itself
-- works, so it ends its run of failures. A run of failures makes the proxy
-- dead when it is long enough and either every failure was the proxy's alone
-- or they happened on more than one site (so one site's outage never kills
-- the pool). A dead proxy's slots go to DEAD in this scope's free set, and
-- in another's when a lease there meets it (lease.lua), until revive.lua.
--
-- The strikes record of a proxy that got a healthy answer on the scope is
-- "0|<ms of that answer>|0" (release.lua), "0|<ms>|1" after a lift
-- (lift.lua): a strike on such a record is reported healthy. It is also
-- reported a witness, the evidence that the proxy works on the site's
-- other pages (the page or IP judgment of ban.go), when that healthy answer
-- was no lift and came after the site's last verdict on a proxy healthy
-- there before (the pace hash's "burnt": proxies burnt together with a
-- proxy proven burnt are no witnesses until they are healthy again). A lift after that verdict is reported by its time (the
-- page or IP judgment counts it only when it comes after the refusals it
-- weighs).
--
-- A failure ("fail") is reported healthy before when the proxy worked on
-- the scope since its last failure there that stands: a healthy answer
-- after it (or after none). A proxy that never served the site, or failed
-- there again with no healthy answer since, is not: its failure is the
-- proxy's, never taken back, no evidence of a storm (storm.go).
--
-- A record "1|<ms of a strike>|0" is an unproven lift (lift.lua: a first
-- strike taken back, of a proxy never healthy on the scope): within twice
-- the max quarantine of that strike, the proxy's next ban is a first
-- strike again, reported unproven (witness 2): ban.go never counts it as a
-- witness nor as a fresh first strike, once the scope served a page
-- after that strike (the strikes hash's "served", release.lua; before,
-- the record counts as none). Unresolved, it stays on record as any first
-- strike: the ban after it is a repeat.
--
-- Returns {quarantine ms, until ms, offences in a row, dead 0/1, lease ended 0/1,
--          first quarantine 0/1, healthy before 0/1, witness 0/1 (2: a first strike, unproven),
--          hold 0/1 (2: a hold of a proxy rested past PACE_TIRED times the accepted rest),
--          ms of the lift after the last verdict (0: none), now ms},
--          or {"gateway", template} (ARGV[22]).
local pool, badpool = pool_prefix(ARGV[10])
if not pool then return redis.error_reply(badpool) end
if ARGV[22] == '1' then
  local t = redis.call('HGET', KEYS[10], ARGV[2])
  if t then return {'gateway', t} end
end
local now = now_ms()
local id = ARGV[2]
local base, maxq, minq = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local idle = tonumber(ARGV[11])

-- end_lease ends the lease ARGV[3] if ARGV[4] owns it (owner-checked):
-- its slot's score is the lease's expiry, which the quarantine replaces.
-- Returns the member ended (nil for none) and the lease's expiry.
local function end_lease()
  if ARGV[3] == '' then return nil end
  local v = redis.call('HGET', KEYS[2], ARGV[3])
  local sep = v and string.find(v, '|', 1, true)
  if sep and string.sub(v, 1, sep - 1) == ARGV[4] then
    redis.call('HDEL', KEYS[2], ARGV[3])
    return ARGV[3], tonumber(string.sub(v, sep + 1))
  end
  return nil
end

-- push moves every slot of the proxy in free set fk (lease hash lk) out to
-- untl. A slot another request holds past untl keeps its lease's expiry,
-- plus 1 ms so that its release (release.lua keeps a score that is not the
-- lease's own) cannot bring it back before the quarantine ends. mine, mineexp:
-- the lease end_lease ended, whose slot's score is that lease's expiry.
-- A slot that was free and goes out (not dead) has the site's exit index
-- name the proxy (lib.lua's exit_mark; one HGET when it has no exit, read
-- once per call).
local slots = tonumber(ARGV[16])
local exit_ip -- the proxy's exit IP ('' for none), once read
local function push(fk, lk, untl, mine, mineexp)
  local rose = false
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local sc = num(redis.call('ZSCORE', fk, m)) or 0 -- no entry: free on the scope
    if sc < untl or (fk == KEYS[1] and m == mine and sc == mineexp) then
      redis.call('ZADD', fk, untl, m)
      if sc <= now then rose = true end
    else
      local v = redis.call('HGET', lk, m)
      local exp = v and tonumber(string.match(v, '|(%d+)$'))
      if exp and exp == sc and sc < DEAD then redis.call('ZADD', fk, sc + 1, m) end
    end
  end
  if redis.call('PTTL', fk) < 0 then redis.call('PEXPIRE', fk, idle) end
  if rose and untl < DEAD then
    if not exit_ip then exit_ip = redis.call('HGET', pool .. ':exit', id) or '' end
    local b, site = busy_site(fk)
    if exit_ip ~= '' and b == pool then exit_mark(pool, site, exit_ip, {id}, idle) end
  end
end

local firstq, certain = tonumber(ARGV[17]) or 0, ARGV[18] == '1'
local pfloor, pmax = string.match(ARGV[21] or '', '^(%d+)|(%d+)$')
local n, dead, healthy, running, witness, hold, lifted, tired = 1, false, false, 0, false, false, 0, false
local unproven = false -- a strike of a proxy lifted unproven (lift.lua): a first strike, no fresh one
if ARGV[1] == 'ban' or ARGV[1] == 'confirm' then
  local v = redis.call('HGET', KEYS[3], id)
  local c, last, till
  if v then c, last, till = string.match(v, '^(%d+)|(%d+)|(%d+)$') end
  if ARGV[1] == 'confirm' then
    if not c or tonumber(c) < 1 or tonumber(till) ~= tonumber(ARGV[19]) then
      return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, now}
    end
    n, certain, healthy = tonumber(c), true, ARGV[18] == '1'
  elseif c and tonumber(c) == 1 and tonumber(till) == 0 and now - tonumber(last) <= 2 * maxq then
    -- An unproven lift (lift.lua): struck again, a first strike awaiting
    -- its evidence (confirmed, lifted, or a repeat next time), but no
    -- fresh one: no witness, and reported apart (ban.go's pageRefused);
    -- once the scope served a page after that strike (release.lua's
    -- "served"). Before, no proxy has been healthy there since: an IP the
    -- site bans cannot be told from a page that refuses everyone (a cold
    -- site meeting refused pages first), and the record counts as none.
    if (tonumber(redis.call('HGET', KEYS[3], 'served')) or 0) > tonumber(last) then unproven = true end
  elseif c and now - tonumber(last) <= 2 * maxq then
    n = tonumber(c) + 1
    healthy = n == 1
    if healthy and tonumber(last) > site_burnt(KEYS[9]) then
      if tonumber(till) == 0 then witness = true else lifted = tonumber(last) end
    end
    -- Still quarantined: another request through the same proxy (a slot
    -- of Rotation.Concurrency, a request under way) met the same ban.
    if now < tonumber(till) then n, running = tonumber(c), tonumber(till) end
  end
  if ARGV[1] == 'ban' and pfloor then
    -- (Rested or not, from the record as it is: a healthy answer is no
    -- run of bans that twice the max quarantine forgets.)
    local rest = pace_rest(KEYS[9])
    if c and tonumber(c) == 0 then
      -- No accepted rest known yet: twice the learned cooldown's double
      -- (a proxy refused while the pace doubles has rested about it).
      local ref = rest or 2 * math.max(pace_read(KEYS[9]), PACE_PROBE)
      hold = now - tonumber(last) < PACE_RESTED * ref
      -- Rested past the accepted rest, not twice over: the pace's
      -- refusal for the proxy, yet evidence of a storm for the breaker.
      if hold and rest and now - tonumber(last) >= PACE_TIRED * rest then tired = true end
    elseif c and now - tonumber(last) <= 2 * maxq then
      hold = false -- struck since its last healthy answer
    else
      -- New to the site (a per-IP limit serves a new IP): the pace only
      -- while nothing is learned, the first refusal of all.
      hold = not rest and pace_read(KEYS[9]) == 0
    end
  end
  redis.call('HDEL', KEYS[4], id)
else
  local hard, multi, first = ARGV[12], '0', ARGV[14]
  local v = redis.call('HGET', KEYS[4], id)
  if v then
    local c, h, m, s = string.match(v, '^(%d+)|([01])|([01])|(.*)$')
    if c then
      n = tonumber(c) + 1
      if h == '0' then hard = '0' end
      multi = m
      if s ~= ARGV[14] then multi = '1' end
      first = s
    end
  end
  redis.call('HSET', KEYS[4], id, n .. '|' .. hard .. '|' .. multi .. '|' .. first)
  redis.call('PEXPIRE', KEYS[4], idle)
  -- Worked on the scope (reported as healthy before): a healthy answer
  -- there since its last failure there that stands (worked_lib.lua).
  -- Only such a failure is evidence of the site's trouble, and may be
  -- taken back (storm.go); this one is the proxy's last failure there now.
  healthy = worked(KEYS[3], id)
  worked_fail(KEYS[3], id, idle)
  local after = tonumber(ARGV[13])
  dead = after > 0 and n >= after and (hard == '1' or multi == '1')
end

if hold then
  -- The site's pace: the proxy waits the learned cooldown (raised by this
  -- refusal) or the Retry-After, and nothing else happens.
  local q = math.max(minq, math.ceil(pace_refused(KEYS[9], KEYS[1], KEYS[2], tonumber(pfloor), tonumber(pmax), now, idle)))
  local mine, mineexp = end_lease()
  push(KEYS[1], KEYS[2], now + q, mine, mineexp)
  return {q, now + q, 0, 0, mine and 1 or 0, 0, healthy and 1 or 0, witness and 1 or 0, tired and 2 or 1, lifted, now}
end

local e, short = n, false
if certain then e = n + 1 end
local q = base * 2 ^ (n - 1)
if ARGV[1] ~= 'fail' and firstq > 0 then
  if e <= 1 then
    q, short = firstq, true
  else
    q = base * 2 ^ (e - 2)
  end
end
if q > maxq then q = maxq end
q = math.floor(q * tonumber(ARGV[8]) / 1000)
if q > maxq then q = maxq end
if q < minq then q = minq end
local untl = now + q
if running > untl then
  -- The same offence met again never shortens the quarantine it got
  -- (confirmed meanwhile, say): its end stays, and it is no first strike.
  untl, q, short = running, running - now, false
end
if ARGV[1] ~= 'fail' then
  redis.call('HSET', KEYS[3], id, n .. '|' .. now .. '|' .. untl)
  redis.call('PEXPIRE', KEYS[3], idle)
  -- A verdict on a proxy healthy there before: the site burns IPs that
  -- worked (a proxy burnt from the start, or a repeat, says nothing new).
  -- (A site probe's failure, reason "site_probe", is no refusal of the site.)
  if not short and healthy and ARGV[15] ~= 'site_probe' then site_burnt_mark(KEYS[9], now, idle) end
end
if dead then
  untl = DEAD
  redis.call('HSET', KEYS[5], id, now .. '|' .. ARGV[15])
  bump_version(pool .. ':meta') -- the dead list is part of the pool's generation
end

local mine, mineexp = end_lease()
push(KEYS[1], KEYS[2], untl, mine, mineexp)
-- A ban on every site is one entry of the quarantine zset, and a death one
-- of the dead hash: every lease reads both for each proxy it offers
-- (lease.lua), so neither visits the other sites' keys here (bounded work
-- whatever the number of sites). Only this scope's slots move at once.
if ARGV[9] == '1' and not dead then
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
  redis.call('ZADD', KEYS[7], 'GT', untl, id)
  redis.call('PEXPIRE', KEYS[7], maxq + 60000)
  -- Its exit IP's ban index names it (lib.lua's exit_ban).
  if not exit_ip then exit_ip = redis.call('HGET', pool .. ':exit', id) or '' end
  if exit_ip ~= '' then exit_ban(pool, exit_ip, {id}, untl) end
end
-- A first strike (short) is no evidence against the proxy yet: its page
-- may refuse everyone (lift.lua takes it back). The failure rate counts
-- verdicts: a repeat, a confirmation ("confirm" passes the delay too), an
-- unambiguous ban, a proxy failure.
local flaky = tonumber(ARGV[20] or '0') or 0
if flaky > 0 and not short then
  health_hold(KEYS[1], KEYS[2], id, slots, health_note(KEYS[8], id, true, idle), flaky, now)
end
local wit = witness and 1 or 0
if unproven and short then wit = 2 end
return {q, untl, n, dead and 1 or 0, mine and 1 or 0, short and 1 or 0, healthy and 1 or 0, wit, 0,
  lifted, now}
