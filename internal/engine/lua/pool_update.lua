-- pool_update.lua: add, remove or replace proxies of one pool atomically, and
-- carry the change into every site's free set so it takes effect on the next
-- lease everywhere.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] sites zset  site -> unix ms of its last lease
-- KEYS[3] meta hash   "slots" -> concurrent requests per proxy per site; "version" ->
--         generation of the pool (lib.lua's bump_version); "emptied" -> 1 while
--         the pool is empty on purpose
-- KEYS[4] dead hash, KEYS[5] fails hash, KEYS[6] quarantine zset (see penalize.lua):
--         a removed proxy leaves no ban state behind
-- KEYS[7] gateways hash  id -> gateway template ("{session}" in its user info):
--         the pool's virtual proxies, one provider session each (gateway.go)
-- KEYS[8] labels hash    id -> "k=v,k=v" (labels.go): set by add and replace for
--         every entry given (an empty one deletes), removed with the proxy,
--         carried over by rotate
-- ARGV[1] mode: "add" | "remove" | "replace" | "rotate"
-- ARGV[2] key prefix of the per-site keys ("{prefix:pool}"); the free set of
--         site S is ARGV[2]..":free:"..S, its lease hash ARGV[2]..":lease:"..S,
--         its strikes hash ARGV[2]..":strikes:"..S
--         (same hash tag, hence same cluster slot as KEYS; checked)
--         Why a prefix and not KEYS: the sites are those of KEYS[2], read
--         here, atomically, with the change.
-- ARGV[3] idle TTL ms: sites not leased for that long are forgotten
-- ARGV[4..] add/replace: id, URL, template, labels, ... (template ""
--           for a plain proxy, labels "" for none; a gateway's N candidates carry its template:
--           the pool keeps N members of that template, the ones it has
--           first, and takes candidates only for the missing ones; add never
--           removes)
--           remove: id, id, ... (an id "gw:<template>" names every member of
--           that gateway)
--           rotate: old id, new id, new URL, member, token: the old member,
--           a virtual proxy banned on a site, gives way to a new session of
--           its gateway (only if it is still in the pool: a second worker
--           banning it finds it gone and changes nothing). The lease member
--           of token (the banned request's) ends; other live leases of the old
--           proxy are left to their holders (lease.lua drops members whose
--           proxy left the pool)
--
-- Returns {added, removed, size after}.
local now = now_ms()
local base, badbase = pool_prefix(ARGV[2])
if not base then return redis.error_reply(badbase) end
local mode, idle = ARGV[1], tonumber(ARGV[3])
local slots = meta_slots(KEYS[3], 1)

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - idle)
local sites = {}
for _, s in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if redis.call('EXISTS', base .. ':free:' .. s) == 1 then sites[#sites + 1] = s end
end

local function label(id, labels)
  if labels ~= '' then
    redis.call('HSET', KEYS[8], id, labels)
  else
    redis.call('HDEL', KEYS[8], id)
  end
end

local function add(id, url, labels)
  label(id, labels)
  if redis.call('HSET', KEYS[1], id, url) == 0 then return 0 end
  for _, s in ipairs(sites) do
    local fk = base .. ':free:' .. s
    for k = 0, slots - 1 do redis.call('ZADD', fk, 'NX', 0, id .. ':' .. k) end
  end
  return 1
end

-- remove takes id out of the pool. With keep_live, slots leased until
-- later than now stay with their holders (but the lease of member mine,
-- owned by token), to be released as usual.
local function remove(id, keep_live, mine, token)
  if redis.call('HDEL', KEYS[1], id) == 0 then return 0 end
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  redis.call('HDEL', KEYS[7], id)
  redis.call('HDEL', KEYS[8], id)
  for _, s in ipairs(sites) do
    redis.call('HDEL', base .. ':strikes:' .. s, id)
    for k = 0, slots - 1 do
      local m = id .. ':' .. k
      local lk = base .. ':lease:' .. s
      local live = false
      if keep_live then
        local tok, exp = string.match(redis.call('HGET', lk, m) or '', '^(.*)|(%d+)$')
        live = tok and tonumber(exp) > now and not (m == mine and tok == token)
      end
      if not live then
        redis.call('ZREM', base .. ':free:' .. s, m)
        redis.call('HDEL', lk, m)
      end
    end
  end
  return 1
end

-- The entries of add and replace: plain ones, and the candidates of each
-- gateway template (in the order given).
local plain, cands, templates = {}, {}, {}
if mode == 'add' or mode == 'replace' then
  for i = 4, #ARGV, 4 do
    local e = {ARGV[i], ARGV[i + 1], ARGV[i + 3] or ''}
    local t = ARGV[i + 2] or ''
    if t == '' then
      plain[#plain + 1] = e
    else
      if not cands[t] then cands[t] = {}; templates[#templates + 1] = t end
      table.insert(cands[t], e)
    end
  end
end

-- members returns the ids the pool holds of each template, sorted.
local function members()
  local out = {}
  local kv = redis.call('HGETALL', KEYS[7])
  for i = 1, #kv, 2 do
    if redis.call('HEXISTS', KEYS[1], kv[i]) == 1 then
      out[kv[i + 1]] = out[kv[i + 1]] or {}
      table.insert(out[kv[i + 1]], kv[i])
    end
  end
  for _, ids in pairs(out) do table.sort(ids) end
  return out
end

-- gateways adds the candidates each template still needs (have: members()),
-- and returns how many it added.
local function gateways(have)
  local added = 0
  for _, t in ipairs(templates) do
    local want = #cands[t]
    local n = math.min(#(have[t] or {}), want)
    for _, id in ipairs(have[t] or {}) do -- the sessions kept take the entry's labels
      label(id, cands[t][1][3])
    end
    for _, e in ipairs(cands[t]) do
      if n >= want then break end
      if add(e[1], e[2], e[3]) == 1 then
        redis.call('HSET', KEYS[7], e[1], t)
        added, n = added + 1, n + 1
      end
    end
  end
  return added
end

local added, removed = 0, 0
if mode == 'add' then
  for _, e in ipairs(plain) do added = added + add(e[1], e[2], e[3]) end
  added = added + gateways(members())
elseif mode == 'remove' then
  local have
  for i = 4, #ARGV do
    local t = string.match(ARGV[i], '^gw:(.*)$')
    if t then
      have = have or members()
      for _, id in ipairs(have[t] or {}) do removed = removed + remove(id) end
    else
      removed = removed + remove(ARGV[i])
    end
  end
elseif mode == 'replace' then
  local keep = {}
  for _, e in ipairs(plain) do keep[e[1]] = true end
  local have = members()
  for _, t in ipairs(templates) do
    local n = 0
    for _, id in ipairs(have[t] or {}) do
      if n < #cands[t] then keep[id] = true; n = n + 1 end
    end
  end
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then removed = removed + remove(id) end
  end
  for _, e in ipairs(plain) do added = added + add(e[1], e[2], e[3]) end
  added = added + gateways(members())
elseif mode == 'rotate' then
  local old, t = ARGV[4], redis.call('HGET', KEYS[7], ARGV[4])
  if t and redis.call('HEXISTS', KEYS[1], old) == 1 and redis.call('HEXISTS', KEYS[1], ARGV[5]) == 0 then
    local labels = redis.call('HGET', KEYS[8], old) or ''
    removed = remove(old, true, ARGV[7], ARGV[8])
    added = add(ARGV[5], ARGV[6], labels)
    redis.call('HSET', KEYS[7], ARGV[5], t)
  end
else
  return redis.error_reply('PSCONFIG unknown pool update mode ' .. mode)
end
-- What every Switch watches (snapshot.go, fallback.go): the generation of
-- the pool, and whether it was emptied on purpose: an empty pool without
-- that mark was lost by Redis, and a Switch re-seeds it (pool_seed.lua).
if added + removed > 0 then bump_version(KEYS[3]) end
local size = redis.call('HLEN', KEYS[1])
if size == 0 then
  redis.call('HSET', KEYS[3], 'emptied', '1')
else
  redis.call('HDEL', KEYS[3], 'emptied')
end
return {added, removed, size}
