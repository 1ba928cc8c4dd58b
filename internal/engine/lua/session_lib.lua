-- session_lib.lua: helpers shared by the session scripts. The engine
-- (internal/engine) puts this file (after lib.lua) in front of each script
-- whose header says "-- include: session_lib.lua", so every script stays one
-- EVALSHA; it runs nothing by itself.
--
-- A session record (hash, TTL: the session TTL, renewed by each use):
--   id       session ID (hex); absent once the session ended (a tombstone)
--   gen      sessions the task had in a row (1 for its first)
--   proxy    proxy ID     created  ms     exp  ms: when every lease ends unless renewed
--   n        requests sent through the session
--   s:<scope> "<id>:<slot>": the slot the session holds on that scope, leased
--            to the token "s:<session ID>" until exp, at score exp
--   rid, rproxy, rreason, rsite, rat, rn, rcreated: the task's previous
--            session, when it was retired (a tombstone keeps only these and gen)
--   h:<tag> ms until which requests of the session that the Switch tagged
--            <tag> started or renewed may still be under way unless renewed
--            (a start, use or renewal writes now + twice that Switch's
--            renewal tick: sessionrenew.go); the session's end keeps its
--            proxy out until then
-- A session's cookie jar is the hash <prefix>:sjar:<session ID>, with the
-- record's TTL. The zset <prefix>:sessions holds the live sessions' IDs
-- scored by expiry (track); the scripts take it as KEYS[3]. DEAD and now_ms
-- come from lib.lua.
--
-- Why a key prefix (<prefix>, checked by lib.lua's pool_prefix) and not
-- KEYS: the free set and lease hash of every scope a session holds are
-- named by the scopes in its record, and its jar by the session ID in it,
-- which only the script reads.

-- read_record returns the record at key as a table ({} if there is none),
-- or nil and what is wrong with the key.
local function read_record(key)
  local typ = redis.call('TYPE', key)['ok']
  if typ == 'none' then return {} end
  if typ ~= 'hash' then return nil, 'the key holds a ' .. typ .. ', not a hash' end
  local flat = redis.call('HGETALL', key)
  local r = {}
  for i = 1, #flat, 2 do r[flat[i]] = flat[i + 1] end
  return r
end

-- held returns the {scope, member} pairs the session holds.
local function held(r)
  local out = {}
  for f, m in pairs(r) do
    if string.sub(f, 1, 2) == 's:' then out[#out + 1] = {string.sub(f, 3), m} end
  end
  return out
end

-- check_live returns what is wrong with a live record (one with an id), or nil.
local function check_live(r)
  if not string.match(r.id, '^%x+$') then return 'bad field id' end
  if not r.proxy or not string.match(r.proxy, '^%x+$') then return 'bad field proxy' end
  for _, f in ipairs({'gen', 'created', 'exp', 'n'}) do
    if not r[f] or not string.match(r[f], '^%d+$') then return 'bad field ' .. f end
  end
  for _, h in ipairs(held(r)) do
    if string.match(h[2], '^(%x+):%d+$') ~= r.proxy then return 'bad slot for scope ' .. h[1] end
  end
  return nil
end

-- hold leases member on scope to token until exp (score exp), and keeps the
-- proxy's other slots on scope out of rotation until exp too: a slot another
-- request holds keeps its lease, and its release keeps the pushed score.
local function hold(base, scope, proxy, member, token, exp, slots, idle)
  local fk, lk = base .. ':free:' .. scope, base .. ':lease:' .. scope
  redis.call('ZADD', fk, exp, member)
  redis.call('HSET', lk, member, token .. '|' .. exp)
  for s = 0, slots - 1 do
    local m = proxy .. ':' .. s
    if m ~= member then redis.call('ZADD', fk, 'GT', exp, m) end
  end
  redis.call('PEXPIRE', fk, idle)
  redis.call('PEXPIRE', lk, idle)
  -- The site's exit index (lib.lua's exit_mark) lives as long as its busy set.
  redis.call('PEXPIRE', base .. ':exitout:' .. scope, idle)
end

-- intact reports whether the session still holds member on scope: its lease
-- entry and its score are what the session wrote (a ban on the scope or a
-- lost lease changes one of them), and its proxy is neither dead nor
-- banned on every site (the dead hash and the quarantine zset: a death or
-- a ban met on another scope writes there, not in this scope's keys).
--
-- A slot with no lease entry whose score is still exactly the session's
-- expiry is intact too: nobody else holds it. That is what a fallback's
-- write-back leaves once the local lease it wrote over the session's entry
-- is released (fallback_writeback.lua sets the entry and keeps the higher
-- score); the session's next hold writes its entry again.
local function intact(base, scope, member, token, exp)
  local v = redis.call('HGET', base .. ':lease:' .. scope, member)
  local sc = redis.call('ZSCORE', base .. ':free:' .. scope, member)
  if not sc then return 'lease_lost' end
  if v ~= token .. '|' .. exp and (v or tonumber(sc) ~= tonumber(exp)) then return 'lease_lost' end
  local id = string.match(member, '^(.*):%d+$') or member
  if redis.call('HEXISTS', base .. ':dead', id) == 1 then return 'proxy_dead' end
  sc = tonumber(sc) -- nil for "1e+15" in some Lua builds: dead all the same
  if not sc or sc >= DEAD then return 'proxy_dead' end
  if sc ~= tonumber(exp) then return 'quarantined' end
  local q = num(redis.call('ZSCORE', base .. ':quarantine', id))
  if q and q > now_ms() then return 'quarantined' end
  return nil
end

-- TRIM is the most lapsed sessions one call of track removes.
local TRIM = 100

-- track puts session id, live until exp, in the pool's set of live
-- sessions k (<prefix>:sessions, a zset scored by expiry: Switch.LiveSessions
-- counts the entries whose expiry is ahead, session_count.lua). With trim,
-- up to TRIM sessions that lapsed unseen (no end_session ran) leave it, the
-- longest lapsed first: a bounded step per session started (500,000 lapsed
-- entries trimmed at once blocked Redis for 0.24 s), which outpaces the one
-- entry each start adds.
local function track(k, id, exp, idle, now, trim)
  if trim then
    local lapsed = redis.call('ZRANGE', k, '-inf', now, 'BYSCORE', 'LIMIT', 0, TRIM)
    if #lapsed > 0 then redis.call('ZREM', k, unpack(lapsed)) end
  end
  redis.call('ZADD', k, exp, id)
  redis.call('PEXPIRE', k, idle)
end

-- REQ_HOLD_MAX bounds an h:<tag> field's hold: a day.
local REQ_HOLD_MAX = 86400000

-- end_session ends the live session r of record key (base: the pool's key
-- prefix, sessions: its set of live sessions): every slot it holds
-- comes back after the cooldown, or after hold ms (never later than the
-- session's expiry), or once the requests of the session that Switches
-- noted under way (its h:<tag> fields; the one tagged skip aside: that
-- Switch has none) can be over, whichever is latest; their Switches keep
-- it out from then on while they run (session_use.lua's afterlife). A
-- slot pushed further out, by a ban, stays out. Its cookie jar goes, and
-- with a reason the record becomes a tombstone naming the session (TTL
-- ttl), else it is deleted.
local function end_session(key, r, base, sessions, reason, site, now, cooldown, slots, ttl, hold, skip)
  local token, exp = 's:' .. r.id, tonumber(r.exp)
  local back = math.max(math.min(now + hold, exp), now + cooldown)
  for f, v in pairs(r) do
    if string.sub(f, 1, 2) == 'h:' and string.sub(f, 3) ~= skip then
      local u = tonumber(v)
      if u and u > back and u <= now + REQ_HOLD_MAX then back = u end
    end
  end
  for _, h in ipairs(held(r)) do
    local fk, lk = base .. ':free:' .. h[1], base .. ':lease:' .. h[1]
    local at = back
    local own = tonumber(redis.call('ZSCORE', fk, h[2]) or '')
    local v = redis.call('HGET', lk, h[2])
    local mine = v == token .. '|' .. r.exp
    if mine then redis.call('HDEL', lk, h[2]) end
    if own == exp then
      -- The score is still the one the session wrote, though the lease entry
      -- may no longer be its own: a fallback's write-back (its local lease
      -- of the slot during an outage) overwrites the entry and keeps the
      -- higher score. The slot comes back as the session's would, but not
      -- before the expiry of the lease that now holds it, if any.
      local e = not mine and v and tonumber(string.match(v, '|(%d+)$'))
      redis.call('ZADD', fk, math.max(at, e or 0), h[2])
      own = at
    end
    -- The other slots follow the session's own: a ban that pushed it out
    -- holds the whole proxy back.
    if own and own > at and own < DEAD then at = own end
    for s = 0, slots - 1 do
      local m = r.proxy .. ':' .. s
      local sc = m ~= h[2] and redis.call('ZSCORE', fk, m)
      if sc and tonumber(sc) == exp then
        local v = redis.call('HGET', lk, m)
        local e = v and tonumber(string.match(v, '|(%d+)$'))
        redis.call('ZADD', fk, math.max(at, e or 0), m)
      end
    end
  end
  redis.call('DEL', base .. ':sjar:' .. r.id, key)
  redis.call('ZREM', sessions, r.id)
  if reason ~= '' then
    redis.call('HSET', key, 'gen', r.gen, 'rid', r.id, 'rproxy', r.proxy, 'rreason', reason, 'rsite', site,
      'rat', now, 'rn', r.n, 'rcreated', r.created)
    redis.call('PEXPIRE', key, ttl)
  end
end

-- previous is the reply part that describes the task's previous session:
-- rid, rproxy, its URL (or ""), rreason, rsite, rat, rn, rcreated.
local function previous(r, pool)
  local url = r.rproxy and redis.call('HGET', pool, r.rproxy) or ''
  return {r.rid or '', r.rproxy or '', url or '', r.rreason or '', r.rsite or '', r.rat or '0', r.rn or '0', r.rcreated or '0'}
end

-- jar_ok reports whether key is a cookie jar or nothing.
local function jar_ok(key)
  local typ = redis.call('TYPE', key)['ok']
  return typ == 'none' or typ == 'hash', typ
end

-- Script body.
