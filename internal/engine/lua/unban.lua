-- unban.lua: end a proxy's quarantine on one site now (an operator's call).
--
-- KEYS[1] free zset     "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash    "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[3] strikes hash  id -> "<bans in a row>|<ms of the last>|<its end>"
-- ARGV[1] proxy id      ARGV[2] slots per proxy (K)
--
-- A slot held by a live lease comes back when that lease ends, never
-- earlier; a dead proxy stays dead (Revive brings it back). Its backoff
-- starts over. Returns the number of slots made free.
local now = now_ms()
redis.call('HDEL', KEYS[3], ARGV[1])
local freed = 0
for s = 0, tonumber(ARGV[2]) - 1 do
  local m = ARGV[1] .. ':' .. s
  local score = num(redis.call('ZSCORE', KEYS[1], m))
  if score and score > now and score < DEAD then
    local v = redis.call('HGET', KEYS[2], m)
    local exp = v and tonumber(string.match(v, '|(%d+)$'))
    if exp and exp > now then
      redis.call('ZADD', KEYS[1], exp, m)
    else
      redis.call('ZADD', KEYS[1], now, m)
      freed = freed + 1
    end
  end
end
return freed
