-- fallback_probe.lua: the health probe of a Switch with a fallback or with
-- sharding (fallback.go). One round trip tells that Redis answers, marks
-- this server as leasing from the broker (or takes the mark away), and
-- returns what shares are computed from and which servers are ready.
--
-- KEYS[1] modes zset    member ID -> Redis ms of its last mark (TTL: ARGV[3])
-- KEYS[2] members zset  member ID -> end of its registration, ms (membership.go)
-- KEYS[3] pool hash     id -> proxy URL
-- KEYS[4] meta hash     "version" -> generation of the pool (lib.lua's bump_version)
-- KEYS[5] dead hash     id -> "<ms>|<reason>"
-- ARGV[1] member ID
-- ARGV[2] "1": mark this member as on the broker now; "-1": take its mark
--         away (it leases locally); "0": neither
-- ARGV[3] TTL ms of a mark
--
-- Returns {now ms, pool size, pool version, dead proxies, ID, mark ms, ...}
-- with a pair for every live member (mark -1 for none).

local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
if ARGV[2] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl)
elseif ARGV[2] == '-1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
end
local out = {now, redis.call('HLEN', KEYS[3]), checked(redis.call('HGET', KEYS[4], 'version'), KEYS[4], 'field version', 0, MAX_MS) or 0,
  redis.call('HLEN', KEYS[5])}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')) do
  out[#out + 1] = id
  local m = redis.call('ZSCORE', KEYS[1], id)
  out[#out + 1] = num(m) or -1
end
return out
