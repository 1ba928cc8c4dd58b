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
--         the pool is empty on purpose; "seq" -> the last place given in the order
-- KEYS[4] dead hash, KEYS[5] fails hash, KEYS[6] quarantine zset (see penalize.lua):
--         a removed proxy leaves no ban state behind
-- KEYS[7] order zset  id -> its place in the rotation (lease.lua): a new proxy
--         comes last
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
-- Work bound: "add" and "remove" stop once BUDGET Redis calls are spent
-- (at least one entry is always done). When a call consumed every entry
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
local BUDGET = 20000

-- Sites idle past the idle TTL are forgotten (a bounded step per call).
local stale = redis.call('ZRANGE', KEYS[2], '-inf', now - idle, 'BYSCORE', 'LIMIT', 0, 100)
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
  redis.call('HDEL', KEYS[8], unpack(stale))
end
local sites = {}
local work = 0
if mode == 'remove' or mode == 'replace' then
  for _, s in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    sites[#sites + 1] = s
  end
end

local function add(id, url)
  work = work + 2
  if redis.call('HSET', KEYS[1], id, url) == 0 then return 0 end
  redis.call('ZADD', KEYS[7], 'NX', redis.call('HINCRBY', KEYS[3], 'seq', 1), id)
  work = work + 2
  return 1
end

local function remove(id)
  work = work + 1
  if redis.call('HDEL', KEYS[1], id) == 0 then return 0 end
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  redis.call('ZREM', KEYS[7], id)
  local ms = {}
  for k = 0, slots - 1 do ms[#ms + 1] = id .. ':' .. k end
  for _, s in ipairs(sites) do
    redis.call('HDEL', base .. ':strikes:' .. s, id)
    redis.call('ZREM', base .. ':free:' .. s, unpack(ms))
    redis.call('HDEL', base .. ':lease:' .. s, unpack(ms))
  end
  work = work + 4 + 3 * #sites
  return 1
end

-- An empty pool's order is complete: lease.lua need not index it.
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('HSET', KEYS[3], 'index', 'done') end

local added, removed, consumed = 0, 0, 0
if mode == 'add' then
  for i = 5, #ARGV, 2 do
    added = added + add(ARGV[i], ARGV[i + 1])
    consumed = consumed + 1
    if work >= BUDGET then break end
  end
elseif mode == 'remove' then
  for i = 5, #ARGV do
    removed = removed + remove(ARGV[i])
    consumed = consumed + 1
    if work >= BUDGET then break end
  end
elseif mode == 'replace' then
  local keep = {}
  for i = 5, #ARGV, 2 do keep[ARGV[i]] = true end
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then removed = removed + remove(id) end
  end
  for i = 5, #ARGV, 2 do added = added + add(ARGV[i], ARGV[i + 1]) end
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
