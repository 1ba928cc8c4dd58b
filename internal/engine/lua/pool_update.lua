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
-- ARGV[1] mode: "add" | "remove" | "replace"
-- ARGV[2] key prefix of the per-site keys ("{prefix:pool}"); the free set of
--         site S is ARGV[2]..":free:"..S, its lease hash ARGV[2]..":lease:"..S,
--         its strikes hash ARGV[2]..":strikes:"..S
--         (same hash tag, hence same cluster slot as KEYS; checked)
--         Why a prefix and not KEYS: the sites are those of KEYS[2], read
--         here, atomically, with the change.
-- ARGV[3] idle TTL ms: sites not leased for that long are forgotten
-- ARGV[4..] add/replace: id, URL, id, URL, ...   remove: id, id, ...
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

local function add(id, url)
  if redis.call('HSET', KEYS[1], id, url) == 0 then return 0 end
  for _, s in ipairs(sites) do
    local fk = base .. ':free:' .. s
    for k = 0, slots - 1 do redis.call('ZADD', fk, 'NX', 0, id .. ':' .. k) end
  end
  return 1
end

local function remove(id)
  if redis.call('HDEL', KEYS[1], id) == 0 then return 0 end
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  for _, s in ipairs(sites) do
    redis.call('HDEL', base .. ':strikes:' .. s, id)
    for k = 0, slots - 1 do
      local m = id .. ':' .. k
      redis.call('ZREM', base .. ':free:' .. s, m)
      redis.call('HDEL', base .. ':lease:' .. s, m)
    end
  end
  return 1
end

local added, removed = 0, 0
if mode == 'add' then
  for i = 4, #ARGV, 2 do added = added + add(ARGV[i], ARGV[i + 1]) end
elseif mode == 'remove' then
  for i = 4, #ARGV do removed = removed + remove(ARGV[i]) end
elseif mode == 'replace' then
  local keep = {}
  for i = 4, #ARGV, 2 do keep[ARGV[i]] = true end
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then removed = removed + remove(id) end
  end
  for i = 4, #ARGV, 2 do added = added + add(ARGV[i], ARGV[i + 1]) end
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
