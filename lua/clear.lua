-- clear.lua: delete every key of one pool, found through the pool's own
-- registries (no KEYS or SCAN glob, so other pools and prefixes are never
-- touched).
--
-- KEYS[1] sites zset  scope -> unix ms of its last lease
-- KEYS[2..] the other pool-wide keys to delete (pool hash, meta hash, ...)
-- ARGV[1] key prefix "{prefix:pool}"
--
-- Per-site keys are ARGV[1]..":free:"..S, ":lease:"..S and ":strikes:"..S.
-- Returns the number of keys deleted.
local n = 0
for _, sc in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  n = n + redis.call('DEL', ARGV[1] .. ':free:' .. sc, ARGV[1] .. ':lease:' .. sc, ARGV[1] .. ':strikes:' .. sc)
end
for i = 1, #KEYS do
  n = n + redis.call('DEL', KEYS[i])
end
return n
