-- session_bind.lua: make a fresh lease a task's session's own (session_lib.lua
-- comes first). The lease was taken by lease.lua with the session's token
-- "s:<id>" and the session TTL; "new" starts the session with it, "add"
-- gives a live session its proxy on one more scope.
-- include: session_lib.lua
--
-- KEYS[1] session record  KEYS[2] pool hash
-- KEYS[3] live sessions zset  session ID -> expiry ms
-- KEYS[4] the session's cookie jar (ARGV[4]'s)
-- ARGV[1] key prefix "{prefix:pool}": the per-scope keys of the scopes the
--         session holds are derived from it, since only the record names
--         them (see session_lib.lua; same hash tag as KEYS, checked)
-- ARGV[2] scope   ARGV[3] member "<id>:<slot>"
-- ARGV[4] session ID       ARGV[5] the lease's expiry ms (lease.lua's reply)
-- ARGV[6] session TTL ms   ARGV[7] slots per proxy (K)  ARGV[8] idle TTL ms
-- ARGV[9] "new" or "add"   ARGV[10] most scopes one session may hold
-- ARGV[11] the caller's Switch tag   ARGV[12] ms its request keeps the
--          proxy unless renewed (the record's h:<tag>, session_lib.lua)
--
-- Returns {1} bound: every lease of the session and its record now last
--   until now + TTL;
--   {0}  the record changed meanwhile (new: another request started a
--        session; add: the session ended): nothing done;
--   {-1} another live session holds this proxy on the scope (K > 1);
--   {-2} the lease is no longer the caller's;
--   {-3, what} the record is not what this package writes;
--   {-4} the session already holds ARGV[10] scopes.
-- On anything but {1} the caller releases the lease (release.lua).
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local scope, member, id = ARGV[2], ARGV[3], ARGV[4]
local ttl, slots, idle = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local token = 's:' .. id
local now = now_ms()

local r, bad = read_record(KEYS[1])
if not r then return {-3, 'session record: ' .. bad} end
local hs = {}
if ARGV[9] == 'new' then
  if r.id then return {0} end
else
  if r.id ~= id then return {0} end
  bad = check_live(r)
  if bad then return {-3, 'session record: ' .. bad} end
  hs = held(r)
  if #hs >= tonumber(ARGV[10]) then return {-4} end
end

local lk = base .. ':lease:' .. scope
if redis.call('HGET', lk, member) ~= token .. '|' .. ARGV[5] or tonumber(ARGV[5]) <= now then return {-2} end
local proxy = string.match(member, '^(%x+):%d+$')
if not proxy or (r.id and proxy ~= r.proxy) then return {-2} end
for s = 0, slots - 1 do
  local m = proxy .. ':' .. s
  local v = m ~= member and redis.call('HGET', lk, m)
  local tok, e = string.match(v or '', '^(.*)|(%d+)$')
  if tok and string.sub(tok, 1, 2) == 's:' and tonumber(e) > now then return {-1} end
end

local exp = now + ttl
for _, h in ipairs(hs) do
  if intact(base, h[1], h[2], token, r.exp) == nil then hold(base, h[1], proxy, h[2], token, exp, slots, idle) end
end
hold(base, scope, proxy, member, token, exp, slots, idle)
if ARGV[9] == 'new' then
  redis.call('HSET', KEYS[1], 'id', id, 'gen', (tonumber(r.gen) or 0) + 1, 'proxy', proxy, 'created', now, 'n', 0)
end
redis.call('HSET', KEYS[1], 'exp', exp, 's:' .. scope, member, 'h:' .. ARGV[11], now + tonumber(ARGV[12]))
track(KEYS[3], id, exp, idle, now, ARGV[9] == 'new')
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[4], ttl)
return {1}
