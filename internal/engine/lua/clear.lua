-- clear.lua: delete every key of one pool, found through the pool's own
-- registries (no KEYS or SCAN glob, so other pools and prefixes are never
-- touched).
--
-- KEYS[1] sites zset  scope -> unix ms of its last lease
-- KEYS[2..] the other pool-wide keys to delete (pool hash, meta hash, ...)
-- ARGV[1] key prefix "{prefix:pool}": the per-site keys of site S are
--         ARGV[1]..":free:"..S, ":lease:"..S, ":strikes:"..S, ":health:"..S,
--         ":pace:"..S, ":siteprobe:"..S (site_hold.lua), ":exitout:"..S (lib.lua's exit_mark) and ":breaker:"..S (the window of its circuit breaker,
--         breaker.lua; so is that of every site the breaker hash ARGV[1]..":breaker" names),
--         and ARGV[1]..":exit" with the set ARGV[1]..":exit:"..IP and the ban index ARGV[1]..":exitban:"..IP
--         (lib.lua's exit_ban) of each IP it holds, the IP count ARGV[1]..":exitips" and the IP holds
--         ARGV[1]..":exithold" (exit_note.lua),
--         and ARGV[1]..":gwindex" with the index zset ARGV[1]..":gw:"..D of each
--         gateway template digest D it holds (pool_update.lua)
-- ARGV[2] site budget (optional: none clears every site at once): with more sites than that in KEYS[1], the call only
--         deletes the keys of that many sites, takes them out of KEYS[1] and
--         returns -1: the caller calls again (operator.go). The last call,
--         with at most that many sites left, clears the rest atomically, so
--         a site leased again meanwhile (back in KEYS[1]) is cleared too.
-- ARGV[3] entry budget (optional, with ARGV[2]): once the sites are down to
--         ARGV[2], while the breaker hash, the exit hash or the gateway
--         index registry holds more entries than that, the call deletes
--         that many of them (HRANDFIELD: the breaker window of each site
--         named, the set of each exit IP, the index of each template, and
--         the entries) and returns -1; the last call deletes the rest.
--
-- Why a prefix and not KEYS: the sites are the members of KEYS[1], read
-- here, atomically; a caller listing them first could miss one leased in
-- between. The prefix must be KEYS[1]'s hash tag (lib.lua's pool_prefix),
-- so every key stays in the pool's cluster slot.
-- One key stays, or comes: the meta hash ("{prefix:pool}:meta"), with
-- "emptied" set and a new "version", so that no Switch takes the cleared
-- pool for one that Redis lost and re-seeds it (pool_seed.lua).
-- Keys go with UNLINK: Redis frees a large value (the pool hash and order
-- of a million proxies) in a background thread, so the call's own work is
-- one step per key, whatever the pool's size.
-- Returns the number of keys deleted by the last call, -1 from the others.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local budget = math.huge -- no ARGV[2]: every site in this call
if ARGV[2] then
  budget = tonumber(ARGV[2])
  if not budget or budget < 1 then return redis.error_reply('PSCONFIG bad clear budget') end
end
local n = 0
if redis.call('ZCARD', KEYS[1]) > budget then
  local some = redis.call('ZRANGE', KEYS[1], 0, budget - 1)
  for _, sc in ipairs(some) do
    redis.call('UNLINK', base .. ':free:' .. sc, base .. ':lease:' .. sc, base .. ':strikes:' .. sc,
      base .. ':health:' .. sc, base .. ':pace:' .. sc, base .. ':siteprobe:' .. sc, base .. ':breaker:' .. sc,
      base .. ':exitout:' .. sc)
  end
  redis.call('ZREM', KEYS[1], unpack(some))
  return -1
end
local entries = tonumber(ARGV[3])
if ARGV[3] and (not entries or entries < 1) then return redis.error_reply('PSCONFIG bad clear entry budget') end
-- drop_some deletes entries fields of the hash registry, and the key
-- child .. field of each of them (a site's breaker window, a template's
-- gateway index), if the hash holds more than entries: true if it did.
local function drop_some(registry, child)
  if redis.call('HLEN', registry) <= entries then return false end
  local some = redis.call('HRANDFIELD', registry, entries)
  for _, f in ipairs(some) do redis.call('UNLINK', child .. f) end
  redis.call('HDEL', registry, unpack(some))
  return true
end
if entries then
  if drop_some(base .. ':breaker', base .. ':breaker:') then return -1 end
  if redis.call('HLEN', base .. ':exit') > entries then
    local some = redis.call('HRANDFIELD', base .. ':exit', entries, 'WITHVALUES')
    local ids = {}
    for i = 1, #some, 2 do
      ids[#ids + 1] = some[i]
      redis.call('UNLINK', base .. ':exit:' .. some[i + 1], base .. ':exitban:' .. some[i + 1])
    end
    redis.call('HDEL', base .. ':exit', unpack(ids))
    return -1
  end
  if drop_some(base .. ':gwindex', base .. ':gw:') then return -1 end
end
for _, sc in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  n = n + redis.call('UNLINK', base .. ':free:' .. sc, base .. ':lease:' .. sc, base .. ':strikes:' .. sc,
    base .. ':health:' .. sc, base .. ':pace:' .. sc, base .. ':siteprobe:' .. sc, base .. ':breaker:' .. sc,
      base .. ':exitout:' .. sc)
end
for _, site in ipairs(redis.call('HKEYS', base .. ':breaker')) do
  n = n + redis.call('UNLINK', base .. ':breaker:' .. site)
end
-- The exit IPs (exit_note.lua): each IP's set of entries, then the hash.
for _, ip in ipairs(redis.call('HVALS', base .. ':exit')) do
  n = n + redis.call('UNLINK', base .. ':exit:' .. ip, base .. ':exitban:' .. ip)
end
n = n + redis.call('UNLINK', base .. ':exit', base .. ':exitips', base .. ':exithold')
-- The gateway index (pool_update.lua): each template's zset, then the registry.
for _, d in ipairs(redis.call('HKEYS', base .. ':gwindex')) do
  n = n + redis.call('UNLINK', base .. ':gw:' .. d)
end
n = n + redis.call('UNLINK', base .. ':gwindex')
for i = 1, #KEYS do
  n = n + redis.call('UNLINK', KEYS[i])
end
redis.call('HSET', base .. ':meta', 'emptied', '1')
bump_version(base .. ':meta')
return n
