-- revive.lua: put dead proxies back into every site's rotation at once.
--
-- KEYS[1] dead hash   id -> "<ms>|<reason>"
-- KEYS[2] fails hash  id -> proxy failures in a row
-- KEYS[3] sites zset  not read
-- ARGV[1] key prefix "{prefix:pool}" (lib.lua's pool_prefix): the meta hash
--         is ARGV[1]..":meta"
-- ARGV[2] slots per proxy (K): not read
-- ARGV[3] reason: "" revives whatever the mark; else only a proxy marked
--         with this reason (a health probe revives its own marks, never an
--         operator's drain)
-- ARGV[4] budget: the most proxies one call revives; at least one
-- ARGV[5..] proxy ids
--
-- Reviving is deleting the dead hash's entry, and an "r" event of the
-- sweep zset (lib.lua's sweep_add): each site then frees the proxy's slots
-- out there at its next leases, as the death had put them all at DEAD (a
-- slot a live lease holds comes back when that lease ends, never earlier:
-- no slot is ever leased twice). Until a site did, a slot it records at
-- DEAD is free for a lease (lease.lua's out) and any other stays out. So
-- a call's work follows its proxies, not the sites of the pool.
-- Returns {proxies that were dead and are not any more, ids consumed}: a
-- call does the first ids that fit the budget, the caller sends the rest
-- again (ban.go).
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local want = ARGV[3]
local cap = math.max(1, math.floor(tonumber(ARGV[4]) or 0))
local last = math.min(#ARGV, 4 + cap)
local revived, ids = 0, {}
for i = 5, last do
  local id = ARGV[i]
  local mark = redis.call('HGET', KEYS[1], id)
  if mark and (want == '' or string.sub(mark, (string.find(mark, '|', 1, true) or 0) + 1) == want) then
    redis.call('HDEL', KEYS[1], id)
    revived = revived + 1
    ids[revived] = id
    redis.call('HDEL', KEYS[2], id)
    -- Alive again: its exit IP's ban index names it while it is banned on
    -- every site (lease.lua drops a dead entry from it; lib.lua's exit_ban).
    local ip = redis.call('HGET', base .. ':exit', id)
    local q = ip and num(redis.call('ZSCORE', base .. ':quarantine', id))
    if q and q > now_ms() then exit_ban(base, ip, {id}, q) end
  end
end
sweep_add(base, 'r', ids)
if revived > 0 then bump_version(base .. ':meta') end -- the dead list is part of the pool's generation
return {revived, last - 4}
