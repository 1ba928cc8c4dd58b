-- revive.lua: put dead proxies back into every site's rotation at once.
--
-- KEYS[1] dead hash   id -> "<ms>|<reason>"
-- KEYS[2] fails hash  id -> proxy failures in a row
-- KEYS[3] sites zset  scope -> unix ms of its last lease
-- ARGV[1] key prefix "{prefix:pool}": the free set of scope S is ARGV[1]..":free:"..S,
--         its lease hash ARGV[1]..":lease:"..S (same hash tag as KEYS)
-- ARGV[2] slots per proxy (K)
-- ARGV[3] reason: "" revives whatever the mark; else only a proxy marked
--         with this reason (a health probe revives its own marks, never an
--         operator's drain)
-- ARGV[4] budget: the most slot reads (proxies x sites x slots) of one call;
--         at least one proxy is always done
-- ARGV[5..] proxy ids
--
-- Why a prefix and not KEYS: the free sets and lease hashes are those of
-- every site in KEYS[3], read here, atomically. The prefix must be KEYS[1]'s
-- hash tag (lib.lua's pool_prefix), so every key stays in the pool's slot.
-- A slot still held by a live lease (taken before the proxy died) comes back
-- when that lease expires, never earlier: no slot is ever leased twice.
-- Returns {proxies that were dead and are not any more, ids consumed}: a
-- call does the first ids that fit the budget, the caller sends the rest
-- again (ban.go), so a Revive of many proxies goes in calls of bounded
-- work, each proxy's revival atomic across the sites.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local now = now_ms()
local slots = tonumber(ARGV[2])
local sites = redis.call('ZRANGE', KEYS[3], 0, -1)
local want = ARGV[3]
local cap = math.max(1, math.floor((tonumber(ARGV[4]) or 0) / math.max(1, #sites * slots)))
local last = math.min(#ARGV, 4 + cap)
local revived = 0
for i = 5, last do
  local id = ARGV[i]
  local mark = redis.call('HGET', KEYS[1], id)
  if mark and (want == '' or string.sub(mark, (string.find(mark, '|', 1, true) or 0) + 1) == want) then
    redis.call('HDEL', KEYS[1], id)
    revived = revived + 1
    redis.call('HDEL', KEYS[2], id)
    -- Alive again: its exit IP's indexes name it where it is out (lib.lua's
    -- exit_mark, exit_ban; lease.lua drops a dead entry from them).
    local ip = redis.call('HGET', base .. ':exit', id)
    if ip then
      local q = num(redis.call('ZSCORE', base .. ':quarantine', id))
      if q and q > now then exit_ban(base, ip, {id}, q) end
    end
    for _, sc in ipairs(sites) do
      local fk, lk = base .. ':free:' .. sc, base .. ':lease:' .. sc
      for s = 0, slots - 1 do
        local m = id .. ':' .. s
        local score = num(redis.call('ZSCORE', fk, m))
        if score and score >= DEAD then
          local at = now
          local v = redis.call('HGET', lk, m)
          local exp = v and tonumber(string.match(v, '|(%d+)$'))
          if exp and exp > now then at = exp end
          redis.call('ZADD', fk, at, m)
          score = at
        end
        if ip and score and score > now then exit_mark(base, sc, ip, {id}, redis.call('PTTL', fk)) end
      end
    end
  end
end
if revived > 0 then bump_version(base .. ':meta') end -- the dead list is part of the pool's generation
return {revived, last - 4}
