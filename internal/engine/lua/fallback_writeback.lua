-- fallback_writeback.lua: when Redis is back, write what a Switch learnt on
-- its local shard (fallback.go): the quarantines, and the local leases still
-- running, so that no other server leases their proxies from Redis.
--
-- KEYS[1] pool hash        id -> proxy URL
-- KEYS[2] sites zset       scope -> unix ms of its last lease
-- KEYS[3] meta hash        "slots" -> concurrent requests per proxy per site; "hold" -> ms
--                          until which a re-seeded pool's proxies stay out (pool_seed.lua)
-- KEYS[4] dead hash        id -> "<ms>|<reason>"
-- KEYS[5] quarantine zset  id -> unix ms until which it is banned on every site
-- ARGV[1] key prefix "{prefix:pool}": the busy set of scope S is ARGV[1]..":free:"..S,
--         its lease hash ARGV[1]..":lease:"..S (same hash tag as KEYS; checked).
--         Why a prefix and not KEYS: the scopes come in ARGV. A ban on every
--         site ("" scope) is one entry of KEYS[5], which every lease reads
--         (lease.lua): no site's keys are visited for it.
-- ARGV[2] idle TTL ms     ARGV[3] slots (K) of the writer     ARGV[4] max quarantine ms
-- ARGV[5..] entries of five:
--   "ban",   scope ("" for every site), proxy id, strikes, ms left
--   "lease", scope,                     member,   token,   ms left
--   strikes: the run of strikes in a row the local quarantine is part of
--   ("0" or "": none, a proxy failure's). A ban with strikes on a scope
--   writes the scope's strikes record as penalize.lua does
--   ("<bans in a row>|<now>|<end>", base .. ':strikes:' .. scope): the
--   proxy shows quarantined, not cooling (state.lua, proxy_states.lua),
--   and the next strike doubles on from there. The run written is the
--   longer of the local one and the record's (still in a row: its last
--   strike within twice the max quarantine), its end the later: a
--   write-back that runs twice (Redis failed again while resuming) writes
--   the same record.
--
-- A quarantine only ever lengthens (GT); proxies no longer in the pool are
-- skipped. A slot with no entry in a scope's busy set is free there: it
-- gets one (the re-seed's hold stays in the meta hash, which lease.lua
-- reads). Time comes from TIME.
-- Returns {quarantines written, leases written}.
local now = now_ms()
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local idle, maxq = tonumber(ARGV[2]), tonumber(ARGV[4])
local slots = redis.call('HGET', KEYS[3], 'slots')
if not slots then
  redis.call('HSET', KEYS[3], 'slots', ARGV[3])
  slots = ARGV[3]
end
slots = checked(slots, KEYS[3], 'field slots', 1, MAX_SLOTS)

local ready = {}
local function free(scope)
  local fk = base .. ':free:' .. scope
  if ready[scope] then return fk end
  ready[scope] = true
  redis.call('ZADD', KEYS[2], now, scope)
  redis.call('PEXPIRE', KEYS[2], idle)
  return fk
end

-- exit_of is proxy id's exit IP, '' for none (read once per proxy).
local exits = {}
local function exit_of(id)
  local ip = exits[id]
  if not ip then
    ip = redis.call('HGET', base .. ':exit', id) or ''
    exits[id] = ip
  end
  return ip
end

-- push keeps every slot of proxy id out on the busy set fk of scope until
-- untl (a slot with no entry is free there: it gets one); the site's exit
-- index names the proxy (lib.lua's exit_mark).
local function push(scope, id, untl)
  local fk = base .. ':free:' .. scope
  for s = 0, slots - 1 do redis.call('ZADD', fk, 'GT', untl, id .. ':' .. s) end
  redis.call('PEXPIRE', fk, idle)
  if exit_of(id) ~= '' then exit_mark(base, scope, exit_of(id), {id}, idle) end
end

local bans, leases = 0, 0
for i = 5, #ARGV - 4, 5 do
  local kind, scope, who, token = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local untl = now + tonumber(ARGV[i + 4])
  if kind == 'ban' and redis.call('HEXISTS', KEYS[1], who) == 1 then
    bans = bans + 1
    if scope == '' then
      redis.call('ZADD', KEYS[5], 'GT', untl, who)
      redis.call('PEXPIRE', KEYS[5], maxq + 60000)
      if exit_of(who) ~= '' then exit_ban(base, exit_of(who), {who}, untl) end
    else
      free(scope)
      push(scope, who, untl)
      local n = tonumber(token) or 0
      if n > 0 then
        local sk = base .. ':strikes:' .. scope
        local v = redis.call('HGET', sk, who)
        local c, last, till
        if v then c, last, till = string.match(v, '^(%d+)|(%d+)|(%d+)$') end
        local e = untl
        if c and now - tonumber(last) <= 2 * maxq then
          n = math.max(n, tonumber(c))
          e = math.max(e, tonumber(till))
        end
        redis.call('HSET', sk, who, n .. '|' .. now .. '|' .. e)
        redis.call('PEXPIRE', sk, idle)
      end
    end
  elseif kind == 'lease' then
    local id = string.match(who, '^(.*):%d+$')
    if id and redis.call('HEXISTS', KEYS[1], id) == 1 then
      leases = leases + 1
      local fk = free(scope)
      redis.call('ZADD', fk, 'GT', untl, who)
      redis.call('PEXPIRE', fk, idle)
      if exit_of(id) ~= '' then exit_mark(base, scope, exit_of(id), {id}, idle) end
      local lk = base .. ':lease:' .. scope
      redis.call('HSET', lk, who, token .. '|' .. untl)
      redis.call('PEXPIRE', lk, idle)
    end
  end
end
return {bans, leases}
