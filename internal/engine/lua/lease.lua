-- lease.lua: lease the least recently used free proxy of one pool for one site.
--
-- KEYS[1] pool hash      id -> proxy URL
-- KEYS[2] free zset      "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[3] lease hash     "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] sites zset     site -> unix ms of its last lease
-- KEYS[5] meta hash      "slots" -> concurrent requests per proxy per site;
--                        "version" -> generation of the pool; "emptied" -> 1 while it
--                        is empty on purpose; "hold" -> ms until which a re-seeded
--                        pool's proxies stay out (pool_seed.lua)
-- KEYS[6] dead hash      id -> "<ms>|<reason>" (proxies out of every rotation)
-- KEYS[7] quarantine zset id -> unix ms until which it is banned on every site
-- ARGV[1] site (scope)   ARGV[2] owner token      ARGV[3] lease TTL ms
-- ARGV[4] cooldown ms    ARGV[5] slots (K >= 1)   ARGV[6] idle TTL ms of site keys
-- ARGV[7] preferred proxy id, or "" for none
-- ARGV[8] "1": the preferred proxy or none (a sticky session reaching a new
--         site, session.go); absent or "" for any proxy
-- KEYS[8] breaker hash   ARGV[9] site, or absent/"" with no breaker
-- ARGV[10] probes of a half-open breaker (breaker_lib.lua, breaker.go)
-- include: breaker_lib.lua
--
-- Returns {1, member, proxy URL, expiry ms, version} on success (version: the
--                       pool's generation, 0 for none; snapshot.go),
--         {0, wait ms}  when every proxy is busy (wait = time until the next one frees;
--                       with ARGV[8] = "1", {0, wait ms, firm}: see below),
--         {-1, lost, version} when the pool is empty: lost is 1 when no operator
--                       emptied it (no "emptied" mark: Redis lost it, or it was
--                       never loaded), else 0,
--         {-2}          with ARGV[8] = "1", when the preferred proxy left the pool or is dead,
--         {-3, wait ms, until ms} while the site's breaker holds it (until 0: half-open, probes out).
-- Time comes from the server's clock (TIME), never from a client.
local now = now_ms()
if ARGV[9] and ARGV[9] ~= '' then
  local paused = breaker_gate(KEYS[8], ARGV[9], tonumber(ARGV[10]), now)
  if paused then return paused end
end
local ttl, cooldown, idle = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])

local function version() return meta_ms(KEYS[5], 'version') end
local function empty()
  local lost = 1
  if redis.call('HEXISTS', KEYS[5], 'emptied') == 1 then lost = 0 end
  return {-1, lost, version()}
end

local slots = redis.call('HGET', KEYS[5], 'slots')
if not slots then
  redis.call('HSET', KEYS[5], 'slots', ARGV[5])
  slots = ARGV[5]
elseif slots ~= ARGV[5] then
  checked(slots, KEYS[5], 'field slots', 1, MAX_SLOTS)
  return redis.error_reply('PSCONFIG pool serves ' .. slots .. ' concurrent requests per proxy per site, this client asks for ' .. ARGV[5])
end
slots = tonumber(slots)

-- First lease for this site (or its keys idled out): every proxy starts free,
-- except dead ones and those banned on every site (penalize.lua), and
-- every one while a re-seeded pool is held (pool_seed.lua: requests leased
-- before Redis lost the pool may still run).
if redis.call('EXISTS', KEYS[2]) == 0 then
  local ids = redis.call('HKEYS', KEYS[1])
  if #ids == 0 then return empty() end
  local hold = meta_ms(KEYS[5], 'hold')
  if hold <= now then hold = 0 end
  local held = {}
  local q = redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #q, 2 do held[q[i]] = num(q[i + 1]) end
  for _, id in ipairs(redis.call('HKEYS', KEYS[6])) do held[id] = DEAD end
  local batch = {}
  for _, id in ipairs(ids) do
    for s = 0, slots - 1 do
      batch[#batch + 1] = math.max(held[id] or 0, hold)
      batch[#batch + 1] = id .. ':' .. s
    end
    if #batch >= 4000 then
      redis.call('ZADD', KEYS[2], unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then redis.call('ZADD', KEYS[2], unpack(batch)) end
end
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('PEXPIRE', KEYS[4], idle)
redis.call('PEXPIRE', KEYS[2], idle)

local member, url
-- A preferred proxy (same IP across a redirect chain or a session) wins if free.
if ARGV[7] ~= '' then
  for s = 0, slots - 1 do
    local m = ARGV[7] .. ':' .. s
    local score = num(redis.call('ZSCORE', KEYS[2], m))
    if score and score <= now then
      url = redis.call('HGET', KEYS[1], ARGV[7])
      if url then member = m end
      break
    end
  end
end

-- Only the preferred proxy will do: wait for its soonest slot. firm is 1
-- unless that slot is leased by a request, which may end early: a session
-- (token "s:..."), a quarantine or a cooldown end at the score, not before.
if not member and ARGV[8] == '1' then
  if redis.call('HEXISTS', KEYS[1], ARGV[7]) == 0 then return {-2} end
  local soonest, firm
  for s = 0, slots - 1 do
    local m = ARGV[7] .. ':' .. s
    local score = num(redis.call('ZSCORE', KEYS[2], m))
    if score and (not soonest or score < soonest) then
      soonest, firm = score, 1
      local tok, exp = string.match(redis.call('HGET', KEYS[3], m) or '', '^(.*)|(%d+)$')
      if tok and string.sub(tok, 1, 2) ~= 's:' and tonumber(exp) == score then firm = 0 end
    end
  end
  if not soonest or soonest >= DEAD then return {-2} end
  return {0, math.max(soonest - now, 1), firm}
end

-- Otherwise the lowest score: free the longest, i.e. least recently used.
-- Members whose proxy left the pool are dropped on the way (bounded loop).
local tries = 0
while not member do
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #head == 0 then return empty() end
  local score = num(head[2])
  if score > now then return {0, score - now} end
  local id = string.match(head[1], '^(.*):%d+$')
  url = id and redis.call('HGET', KEYS[1], id)
  if url then
    member = head[1]
  else
    redis.call('ZREM', KEYS[2], head[1])
    tries = tries + 1
    if tries >= 64 then return {0, 1} end
  end
end

local expiry = now + ttl
redis.call('ZADD', KEYS[2], expiry, member)
redis.call('HSET', KEYS[3], member, ARGV[2] .. '|' .. expiry)
redis.call('PEXPIRE', KEYS[3], idle)

-- Pacing with K > 1: no other slot of this proxy may start before the cooldown.
if cooldown > 0 and slots > 1 then
  local id = string.match(member, '^(.*):%d+$')
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    if m ~= member then redis.call('ZADD', KEYS[2], 'XX', 'GT', now + cooldown, m) end
  end
end
return {1, member, url, expiry, version()}
