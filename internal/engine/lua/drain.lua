-- drain.lua: take proxies out of every site's rotation (an operator's call, or
-- a health probe's): they are marked dead with the reason "drained" (or the
-- probe's), so Dead lists them and Revive brings them back. Requests already
-- under way finish.
--
-- KEYS[1] dead hash   id -> "<ms>|<reason>"
-- KEYS[2] sites zset  not read (a mark is one entry of the dead hash)
-- KEYS[3] pool hash   id -> proxy URL
-- ARGV[1] key prefix "{prefix:pool}" (lib.lua's pool_prefix): the meta hash
--         is ARGV[1]..":meta"
-- ARGV[2] slots per proxy (K): not read
-- ARGV[3] reason: "drained" (Drain: marks over any mark, an operator's word
--         wins) or another (Drain with a reason: marks only a proxy not marked yet, so
--         it never hides an operator's drain or a failure's mark)
-- ARGV[4] budget: the most proxies one call marks; at least one
-- ARGV[5..] proxy ids
--
-- A mark is the dead hash's entry alone: every lease reads it for each
-- proxy it offers (lease.lua), and a site's busy set records the proxy at
-- DEAD when a lease there first meets it. So a call's work follows its
-- proxies, not the sites of the pool.
-- Returns {proxies marked (those in the pool, and with another reason than
-- "drained" not marked before), ids consumed}: a call does the first ids
-- that fit the budget, the caller sends the rest again (health.go).
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local now = now_ms()
local reason = ARGV[3]
if reason == '' or string.find(reason, '|', 1, true) then return redis.error_reply('bad reason') end
local cap = math.max(1, math.floor(tonumber(ARGV[4]) or 0))
local last = math.min(#ARGV, 4 + cap)
local n = 0
for i = 5, last do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[3], id) == 1 and
      (reason == 'drained' or redis.call('HEXISTS', KEYS[1], id) == 0) then
    n = n + 1
    redis.call('HSET', KEYS[1], id, now .. '|' .. reason)
  end
end
if n > 0 then bump_version(base .. ':meta') end -- the dead list is part of the pool's generation
return {n, last - 4}
