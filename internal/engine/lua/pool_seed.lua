-- pool_seed.lua: give a pool back to a Redis that lost it (restarted empty,
-- failed over to an empty replica, flushed), from the copy a Switch keeps
-- (snapshot.go). Every Switch that finds its pool lost runs it, one per
-- process at a time; the first one seeds, the others find the pool there.
--
-- KEYS[1] pool hash  id -> proxy URL
-- KEYS[2] meta hash  "emptied" -> 1 when an operator emptied the pool (pool_update.lua,
--         clear.lua); "version" -> its generation; "slots"; "hold" (see below)
-- KEYS[3] dead hash  id -> "<ms>|<reason>" (dead and drained proxies)
-- KEYS[4] order zset id -> its place in the rotation (lease.lua), written with the pool
-- KEYS[5] gateways hash id -> gateway template (gateway.go): a re-seeded
--         gateway's sessions rotate after a ban as before
-- KEYS[6] labels hash   id -> "k=v,k=v" (labels.go): labelled requests
--         select as before
-- ARGV[1] the copy's generation ("version"), 0 for none
-- ARGV[2] hold ms: the proxies stay out of every site's rotation that long
--         (lease.lua and fallback_writeback.lua read "hold" when they build a
--         site's free set), since requests leased before Redis lost the pool,
--         whose leases went with it, may still run; 0 for none
-- ARGV[3] slots per proxy (K) of the seeding Switch, recorded if none is
-- ARGV[4] n: the number of proxies
-- ARGV[5] g: the number of gateway entries; ARGV[6] l: the number of labelled proxies
-- ARGV[7 .. 6+2n]  id, URL, id, URL, ...
-- then g pairs id, template; then l pairs id, labels (only ids of the n are written)
-- then the rest    id, "<ms>|<reason>", ...: the dead list of the copy
--
-- Seeds only a pool that does not exist and that no operator emptied: a pool
-- emptied on purpose stays empty, and an operator's write made since Redis
-- lost the pool is never overwritten. Quarantines, strikes and leases are
-- not in the copy: they were lost with Redis. Returns the number of proxies
-- written (0 when nothing was done).
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HEXISTS', KEYS[2], 'emptied') == 1 then return 0 end
local n, g, l = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if not n or n <= 0 or not g or g < 0 or not l or l < 0 or #ARGV < 6 + 2 * (n + g + l) then return 0 end
local last = 6 + 2 * n
for i = 7, last, 1000 do
  local j = math.min(i + 999, last)
  redis.call('HSET', KEYS[1], unpack(ARGV, i, j))
  local ids = {}
  for k = i, j, 2 do ids[#ids + 1] = ARGV[k] end
  order_add(KEYS[4], KEYS[2], ids)
end
-- hset_known writes the pairs ARGV[from .. to] of ids the pool holds into key.
local function hset_known(key, from, to)
  local kv = {}
  for i = from, to, 2 do
    if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
      kv[#kv + 1] = ARGV[i]
      kv[#kv + 1] = ARGV[i + 1]
    end
    if #kv >= 1000 or (i + 2 > to and #kv > 0) then
      redis.call('HSET', key, unpack(kv))
      kv = {}
    end
  end
end
hset_known(KEYS[5], last + 1, last + 2 * g)
last = last + 2 * g
hset_known(KEYS[6], last + 1, last + 2 * l)
last = last + 2 * l
for i = last + 1, #ARGV - 1, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1]) end
end
if redis.call('HEXISTS', KEYS[2], 'version') == 0 and tonumber(ARGV[1]) > 0 then
  redis.call('HSET', KEYS[2], 'version', ARGV[1])
else
  bump_version(KEYS[2])
end
redis.call('HSETNX', KEYS[2], 'slots', ARGV[3])
redis.call('HSET', KEYS[2], 'index', 'done') -- the order is written with the pool
local hold = tonumber(ARGV[2])
if hold > 0 then
  local untl = now_ms() + hold
  if untl > meta_ms(KEYS[2], 'hold') then redis.call('HSET', KEYS[2], 'hold', untl) end
end
return n
