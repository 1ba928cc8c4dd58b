-- unfail.lua: take back the quarantine a proxy failure of the site's kind
-- cost a proxy that worked on the site (penalize.lua reported it healthy
-- before: a healthy answer there since its last failure that stands): the
-- same URL failed the same way (a gateway error, a timeout) through
-- several such proxies in a row and was served through none, so the page
-- (or the site) is slow or down for everyone, not the proxy (storm.go's
-- unresolvedFailures). A proxy that never served the site, or failed there
-- again since its last healthy answer, is never taken back: the caller
-- does not ask.
--
-- KEYS[1] free zset     "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] fails hash    (pool) id -> "<failures in a row>|<all hard>|<several sites>|<site of the first>"
-- ARGV[1] proxy id      ARGV[2] slots per proxy (K)
-- ARGV[3] the end (ms) of the quarantine to take back, as penalize.lua returned it
-- ARGV[4] the failures in a row it made, as penalize.lua returned them
--
-- The slots that quarantine pushed out (score = its end) are free now;
-- slots pushed further by anything else (a lease, a later failure or ban,
-- a dead mark) keep their score. When a slot came back, the failure
-- leaves the proxy's run of failures (the dead rule) only if it is still
-- the run's last (no failure since, no healthy answer or ban that ended
-- the run: a count is never lowered below what its failures warrant). It
-- stays the proxy's last failure on the scope (worked_lib.lua): only the
-- first failure in a row after a healthy answer is ever taken back, and
-- the proxy's next failure there, with no healthy answer in between, is
-- its own. Returns the number of slots made free.
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
  local n = tonumber(ARGV[4])
  local v = redis.call('HGET', KEYS[2], ARGV[1])
  local c, rest
  if v then c, rest = string.match(v, '^(%d+)(|.*)$') end
  if c and tonumber(c) == n and n > 1 then
    redis.call('HSET', KEYS[2], ARGV[1], (n - 1) .. rest)
  elseif c and tonumber(c) == n then
    redis.call('HDEL', KEYS[2], ARGV[1])
  end
end
return freed
