-- session_use.lua: use a task's sticky session for one request on one scope
-- (session_lib.lua comes first).
-- include: session_lib.lua
--
-- KEYS[1] session record  {prefix:pool}:session:<task>
-- KEYS[2] pool hash       id -> proxy URL
-- KEYS[3] live sessions zset  session ID -> expiry ms
-- ARGV[1] key prefix "{prefix:pool}": the per-scope keys of the scopes the
--         session holds and its jar are derived from it, since only the
--         record names them (see session_lib.lua; same hash tag as KEYS,
--         checked)
-- ARGV[2] scope            ARGV[3] session TTL ms
-- ARGV[4] max requests, 0 for no limit     ARGV[5] max age ms, 0 for none
-- ARGV[6] cooldown ms      ARGV[7] slots per proxy (K)   ARGV[8] idle TTL ms
-- ARGV[9] "use" (renew, count, retire if due), "peek" (read only), "renew"
--         (renew only: a request of the session is under way) or "join"
--         (read only: has a sibling request started the session, or
--         reached the scope, meanwhile?)
-- ARGV[10] ms a retired session's proxy stays out for its requests under way
-- ARGV[11] "renew" and "join": the session ID ("" for "join" by a request
--         that starts a session)
-- ARGV[12] the caller's Switch tag   ARGV[13] ms its requests under way of
--         the session keep the proxy after this call, unless renewed: a use
--         or renewal writes the record's h:<tag> field (session_lib.lua)
-- ARGV[14...] "renew": scope and member (ARGV[14], ARGV[15], ...) of each
--         slot a request of the session under way in the caller's process
--         goes through
--
-- Returns
--   {1, proxy URL, id, gen, n, created ms, exp ms, member on the scope ("" with
--      "peek"), <previous: 8 items>, <jar values...>}
--      the session is live and holds its proxy on the scope; "use" renewed
--      every lease it holds and the record to now + TTL and counted the request;
--   {2, proxy id, id, scopes held}  live, but it holds nothing on this scope yet;
--   {0, retired now 0/1, gen, <previous: 8 items>}  no live session: none yet,
--      or the one there was just retired (limits, lost lease, proxy banned,
--      dead or removed); gen counts the task's sessions so far;
--   {-3, what}  the record or the jar is not what this package writes;
--   "renew": {4, exp ms} every lease of session ARGV[11] and its record
--      renewed to now + TTL (nothing counted); or, the session no longer
--      live or intact (retired, ended, lapsed, replaced: its next use
--      tells), {7, slots kept, slots lost, lost 0/1 for each pair of
--      ARGV[14...]}: each slot is kept out of rotation until now +
--      ARGV[10] (afterlife), unless another holder's live lease has it or
--      its proxy left the pool (lost);
--   "join": {6, 1} the task has a live session (ARGV[11] ""), or session
--      ARGV[11] holds the scope now or was replaced; {6, 2} a lease of
--      session ARGV[11] holds the proxy on the scope but is not bound yet
--      (a sibling request between lease.lua and session_bind.lua);
--      {6, 0} or {0, ...}: none of these.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local scope, ttl = ARGV[2], tonumber(ARGV[3])
local maxn, maxage, cooldown = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local slots, idle, peek = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9] == 'peek'
local now = now_ms()

local r, bad = read_record(KEYS[1])
if not r then return {-3, 'session record: ' .. bad} end
local function none(retired)
  local out = {0, retired, r.gen or '0'}
  for _, v in ipairs(previous(r, KEYS[2])) do out[#out + 1] = v end
  return out
end
-- afterlife keeps the slots of ARGV[14...] out of rotation until now +
-- ARGV[10] for the requests of session ARGV[11] still under way in the
-- caller's process, the session being over: its end put them back once
-- they could be over (end_session), which a long request outlives. Every
-- slot of the proxy is kept out, as the session kept them, also one whose
-- score passed and was pruned (lease.lua: the site's exit index names it
-- again, as extend_lib.lua does); a score that is already later (a ban)
-- stays. A request's slot is lost when another holder's live lease has it
-- (that slot is left to it) or its proxy left the pool (nothing is put
-- back): the caller fails that request rather than pass it for exclusive.
local function afterlife()
  local untl, token = now + tonumber(ARGV[10]), 's:' .. ARGV[11]
  local out = {7, 0, 0}
  for i = 14, #ARGV - 1, 2 do
    local scope, member = ARGV[i], ARGV[i + 1]
    local id = string.match(member, '^(%x+):%d+$')
    if not id then return {-3, 'bad member ' .. member} end
    local fk, lk = base .. ':free:' .. scope, base .. ':lease:' .. scope
    local lost = redis.call('HEXISTS', KEYS[2], id) == 0
    for s = 0, slots - 1 do
      if lost then break end
      local m = id .. ':' .. s
      local tok, e = string.match(redis.call('HGET', lk, m) or '', '^(.*)|(%d+)$')
      if tok and tok ~= token and tonumber(e) > now then
        if m == member then lost = true end
      else
        local sc = num(redis.call('ZSCORE', fk, m)) or 0
        if sc < untl then redis.call('ZADD', fk, untl, m) end
        if sc <= now then exit_mark_id(base, scope, id, redis.call('PTTL', fk)) end
      end
    end
    if lost then out[3] = out[3] + 1 else out[2] = out[2] + 1 end
    out[#out + 1] = lost and 1 or 0
  end
  return out
end
if ARGV[9] == 'renew' and (r.id ~= ARGV[11] or tonumber(r.exp or '') == nil or tonumber(r.exp) <= now) then
  return afterlife() -- over: its next use ends a lapsed one
end
if not r.id then return none(0) end
if ARGV[9] == 'join' then
  local want = ARGV[11]
  if want == '' then
    local e = tonumber(r.exp or '')
    if e and e <= now then return {6, 0} end -- lapsed: the next use ends it
    return {6, 1}
  end
  if r.id ~= want or r['s:' .. scope] then return {6, 1} end
  if r.proxy and string.match(r.proxy, '^%x+$') then
    local lk, token = base .. ':lease:' .. scope, 's:' .. want
    for s = 0, slots - 1 do
      local tok, e = string.match(redis.call('HGET', lk, r.proxy .. ':' .. s) or '', '^(.*)|(%d+)$')
      if tok == token and tonumber(e) > now then return {6, 2} end
    end
  end
  return {6, 0}
end
bad = check_live(r)
if bad then return {-3, 'session record: ' .. bad} end
local jar = base .. ':sjar:' .. r.id
local ok, typ = jar_ok(jar)
if not ok then return {-3, 'cookie jar: the key holds a ' .. typ .. ', not a hash'} end
local token = 's:' .. r.id

local function live(url, n, exp, member)
  local out = {1, url, r.id, r.gen, n, r.created, exp, member}
  for _, v in ipairs(previous(r, KEYS[2])) do out[#out + 1] = v end
  for _, v in ipairs(redis.call('HVALS', jar)) do out[#out + 1] = v end
  return out
end

if tonumber(r.exp) <= now then
  -- Lapsed (the record's own TTL is a hair behind): gone, like an expired key.
  if peek then return {0, 0, '0', '', '', '', '', '', '0', '0', '0'} end
  end_session(KEYS[1], r, base, KEYS[3], '', '', now, cooldown, slots, ttl, 0, '')
  r = {}
  return none(0)
end

local url = redis.call('HGET', KEYS[2], r.proxy)
if ARGV[9] == 'renew' then
  -- A request of the session runs longer than part of the TTL: its proxy
  -- stays the session's until it is over (sessionrenew.go). Nothing is
  -- retired here: a session that is not intact is left to its next use,
  -- and its requests' slots to the afterlife.
  if not url then return afterlife() end
  local hs = held(r)
  for _, h in ipairs(hs) do
    if intact(base, h[1], h[2], token, r.exp) then return afterlife() end
  end
  local exp = math.max(now + ttl, tonumber(r.exp))
  for _, h in ipairs(hs) do hold(base, h[1], r.proxy, h[2], token, exp, slots, idle) end
  redis.call('HSET', KEYS[1], 'exp', exp, 'h:' .. ARGV[12], now + tonumber(ARGV[13]))
  track(KEYS[3], r.id, exp, idle, now, false)
  redis.call('PEXPIRE', KEYS[1], exp - now)
  redis.call('PEXPIRE', jar, exp - now)
  return {4, exp}
end
if peek then return live(url or '', r.n, r.exp, '') end

local function retire(reason, site)
  end_session(KEYS[1], r, base, KEYS[3], reason, site, now, cooldown, slots, ttl, tonumber(ARGV[10]), '')
  r = read_record(KEYS[1])
  return none(1)
end
if maxn > 0 and tonumber(r.n) >= maxn then return retire('max_requests', '') end
if maxage > 0 and now - tonumber(r.created) >= maxage then return retire('max_age', '') end
if not url then return retire('proxy_removed', '') end
local hs, mine = held(r), nil
for _, h in ipairs(hs) do
  local why = intact(base, h[1], h[2], token, r.exp)
  if why then return retire(why, h[1]) end
  if h[1] == scope then mine = h[2] end
end
if not mine then return {2, r.proxy, r.id, #hs} end

local exp = now + ttl
for _, h in ipairs(hs) do hold(base, h[1], r.proxy, h[2], token, exp, slots, idle) end
redis.call('HSET', KEYS[1], 'exp', exp, 'h:' .. ARGV[12], now + tonumber(ARGV[13]))
track(KEYS[3], r.id, exp, idle, now, false)
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', jar, ttl)
return live(url, n, exp, mine)
