-- drain.lua: take proxies out of every site's rotation (an operator's call, or
-- a health probe's): they are marked dead with the reason "drained" (or the
-- probe's), so Dead lists them and Revive brings them back. Requests already under way finish: their
-- release keeps the slot out.
--
-- KEYS[1] dead hash   id -> "<ms>|<reason>"
-- KEYS[2] sites zset  scope -> unix ms of its last lease
-- KEYS[3] pool hash   id -> proxy URL
-- ARGV[1] key prefix "{prefix:pool}" (the free set of scope S is ARGV[1]..":free:"..S)
-- ARGV[2] slots per proxy (K)
-- ARGV[3] reason: "drained" (Drain: marks over any mark, an operator's word
--         wins) or another (Drain with a reason: marks only a proxy not marked yet, so
--         it never hides an operator's drain or a failure's mark)
-- ARGV[4] budget: the most slot writes (proxies x sites x slots) of one call;
--         at least one proxy is always done
-- ARGV[5..] proxy ids
--
-- Why a prefix and not KEYS: the free sets are those of every site in
-- KEYS[2], read here, atomically. The prefix must be KEYS[1]'s hash tag
-- (lib.lua's pool_prefix), so every key stays in the pool's cluster slot.
-- Returns {proxies marked (those in the pool, and with another reason than
-- "drained" not marked before), ids consumed}: a call does the first ids
-- that fit the budget, the caller sends the rest again (health.go), so a
-- Drain of many proxies goes in calls of bounded work, each proxy's drain
-- atomic across the sites.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local now = now_ms()
local reason = ARGV[3]
if reason == '' or string.find(reason, '|', 1, true) then return redis.error_reply('bad reason') end
local sites = redis.call('ZRANGE', KEYS[2], 0, -1)
local slots = tonumber(ARGV[2])
local cap = math.max(1, math.floor((tonumber(ARGV[4]) or 0) / math.max(1, #sites * slots)))
local last = math.min(#ARGV, 4 + cap)
local n = 0
for i = 5, last do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[3], id) == 1 and
      (reason == 'drained' or redis.call('HEXISTS', KEYS[1], id) == 0) then
    n = n + 1
    redis.call('HSET', KEYS[1], id, now .. '|' .. reason)
    for _, sc in ipairs(sites) do
      local fk = base .. ':free:' .. sc
      for s = 0, slots - 1 do
        redis.call('ZADD', fk, 'XX', DEAD, id .. ':' .. s)
      end
    end
  end
end
if n > 0 then bump_version(base .. ':meta') end -- the dead list is part of the pool's generation
return {n, last - 4}
