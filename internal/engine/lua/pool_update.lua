-- pool_update.lua: add, remove or replace proxies of one pool, and carry the
-- change into every site's keys so it takes effect on the next lease
-- everywhere. "replace" is atomic (the Go side sends it for small pools
-- only); "add" and "remove" do bounded work per call and report how many
-- entries they consumed, so that a large change goes in several calls.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] sites zset  site -> unix ms of its last lease
-- KEYS[3] meta hash   "slots" -> concurrent requests per proxy per site; "version" ->
--         generation of the pool (lib.lua's bump_version); "emptied" -> 1 while
--         the pool is empty on purpose; "seq" (lib.lua's order_add)
-- KEYS[4] dead hash, KEYS[5] fails hash, KEYS[6] quarantine zset (see penalize.lua):
--         a removed proxy leaves no ban state behind
-- KEYS[7] order zset  id -> its place in the rotation (lease.lua, lib.lua's order_add)
-- KEYS[8] cursor hash site -> the site's place in the order (lease.lua)
-- ARGV[1] mode: "add" | "remove" | "replace" | "done" (no entries: only the
--         generation and the "emptied" mark below)
-- ARGV[2] key prefix of the per-site keys ("{prefix:pool}"); the busy set of
--         site S is ARGV[2]..":free:"..S, its lease hash ARGV[2]..":lease:"..S,
--         its strikes hash ARGV[2]..":strikes:"..S
--         (same hash tag, hence same cluster slot as KEYS; checked)
--         Why a prefix and not KEYS: the sites are those of KEYS[2], read
--         here, atomically, with the change.
-- ARGV[3] idle TTL ms: sites not leased for that long are forgotten
-- ARGV[4] "1": earlier calls of the same change changed the pool; "0": none
-- ARGV[5..] add/replace: id, URL, id, URL, ...   remove: id, id, ...
--
-- Work bound: "add" takes at most BUDGET proxies per call, "remove" at most
-- BUDGET slots of site keys (at least one proxy is always done). When a call consumed every entry
-- and the change (this call or, ARGV[4], the ones before) changed the
-- pool, the generation moves (bump_version) and the "emptied" mark is set
-- or cleared: Switches watching the pool (snapshot.go) see one change.
--
-- Returns {added, removed, size after, entries consumed (ids)}.
local now = now_ms()
local base, badbase = pool_prefix(ARGV[2])
if not base then return redis.error_reply(badbase) end
local mode, idle = ARGV[1], tonumber(ARGV[3])
local slots = meta_slots(KEYS[3], 1)
local BUDGET = 500

-- Sites idle past the idle TTL are forgotten (a bounded step per call).
local stale = redis.call('ZRANGE', KEYS[2], '-inf', now - idle, 'BYSCORE', 'LIMIT', 0, 100)
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
  redis.call('HDEL', KEYS[8], unpack(stale))
end
local sites = {}
if mode == 'remove' or mode == 'replace' then
  for _, s in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    sites[#sites + 1] = s
  end
end

-- add_all adds the id, URL pairs of list (new ids get their place in the
-- order, lib.lua's order_add; those already there keep theirs). Returns the number of proxies new to the pool.
local function add_all(list)
  if #list == 0 then return 0 end
  local added = 0
  for i = 1, #list, 1000 do
    added = added + redis.call('HSET', KEYS[1], unpack(list, i, math.min(i + 999, #list)))
  end
  local ids = {}
  for i = 1, #list, 2 do ids[#ids + 1] = list[i] end
  order_add(KEYS[7], KEYS[3], ids)
  return added
end

-- remove_all takes the ids of list out of the pool and every site's keys:
-- a few commands per key for the whole list. Returns how many were in the pool.
local function remove_all(list)
  if #list == 0 then return 0 end
  local removed = 0
  for i = 1, #list, 1000 do
    local part = {unpack(list, i, math.min(i + 999, #list))}
    removed = removed + redis.call('HDEL', KEYS[1], unpack(part))
    redis.call('HDEL', KEYS[4], unpack(part))
    redis.call('HDEL', KEYS[5], unpack(part))
    redis.call('ZREM', KEYS[6], unpack(part))
    redis.call('ZREM', KEYS[7], unpack(part))
    local ms = {}
    for _, id in ipairs(part) do
      for k = 0, slots - 1 do ms[#ms + 1] = id .. ':' .. k end
    end
    for _, s in ipairs(sites) do
      redis.call('HDEL', base .. ':strikes:' .. s, unpack(part))
      for j = 1, #ms, 1000 do
        local m = {unpack(ms, j, math.min(j + 999, #ms))}
        redis.call('ZREM', base .. ':free:' .. s, unpack(m))
        redis.call('HDEL', base .. ':lease:' .. s, unpack(m))
      end
    end
  end
  return removed
end

-- An empty pool's order is complete: lease.lua need not index it.
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('HSET', KEYS[3], 'index', 'done') end

-- The work bound: at most BUDGET slots of site keys touched (removals), or
-- BUDGET proxies added, per call.
local added, removed, consumed = 0, 0, 0
if mode == 'add' then
  consumed = math.min((#ARGV - 4) / 2, BUDGET)
  added = add_all({unpack(ARGV, 5, 4 + 2 * consumed)})
elseif mode == 'remove' then
  consumed = math.min(#ARGV - 4, math.max(1, math.floor(BUDGET / math.max(1, #sites * slots))))
  removed = remove_all({unpack(ARGV, 5, 4 + consumed)})
elseif mode == 'replace' then
  local keep = {}
  for i = 5, #ARGV, 2 do keep[ARGV[i]] = true end
  local drop = {}
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then drop[#drop + 1] = id end
  end
  removed = remove_all(drop)
  added = add_all({unpack(ARGV, 5)})
  consumed = (#ARGV - 4) / 2
elseif mode ~= 'done' then
  return redis.error_reply('PSCONFIG unknown pool update mode ' .. mode)
end
local total = #ARGV - 4
if mode == 'add' or mode == 'replace' then total = total / 2 end
-- What every Switch watches (snapshot.go, fallback.go): the generation of
-- the pool, and whether it was emptied on purpose: an empty pool without
-- that mark was lost by Redis, and a Switch re-seeds it (pool_seed.lua).
local size = redis.call('HLEN', KEYS[1])
if consumed >= total then
  if added + removed > 0 or ARGV[4] == '1' then bump_version(KEYS[3]) end
  if size == 0 then
    redis.call('HSET', KEYS[3], 'emptied', '1')
  else
    redis.call('HDEL', KEYS[3], 'emptied')
  end
end
return {added, removed, size, consumed}
