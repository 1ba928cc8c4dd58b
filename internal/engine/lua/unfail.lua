-- unfail.lua: take back the quarantine a proxy failure of the site's kind
-- cost a proxy: the same URL failed the same way (a gateway error, a
-- timeout) through several proxies in a row and was served through none,
-- so the page (or the site) is slow or down for everyone, not the proxy
-- (ban.go's unresolvedFailures).
--
-- KEYS[1] free zset     "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] fails hash    (pool) id -> "<failures in a row>|<all hard>|<several sites>|<site of the first>"
-- ARGV[1] proxy id      ARGV[2] slots per proxy (K)
-- ARGV[3] the end (ms) of the quarantine to take back, as penalize.lua returned it
--
-- The slots that quarantine pushed out (score = its end) are free now;
-- slots pushed further by anything else (a lease, a later failure or ban,
-- a dead mark) keep their score. The failure leaves the proxy's run of
-- failures (the dead rule) when a slot came back. Returns the number of
-- slots made free.
local now = now_ms()
local till = tonumber(ARGV[3])
local freed = 0
for s = 0, tonumber(ARGV[2]) - 1 do
  local m = ARGV[1] .. ':' .. s
  local score = num(redis.call('ZSCORE', KEYS[1], m))
  if score and score == till and score > now then
    redis.call('ZADD', KEYS[1], now, m)
    freed = freed + 1
  end
end
if freed > 0 then
  local v = redis.call('HGET', KEYS[2], ARGV[1])
  local c, rest
  if v then c, rest = string.match(v, '^(%d+)(|.*)$') end
  if c and tonumber(c) > 1 then
    redis.call('HSET', KEYS[2], ARGV[1], (tonumber(c) - 1) .. rest)
  elseif c then
    redis.call('HDEL', KEYS[2], ARGV[1])
  end
end
return freed
