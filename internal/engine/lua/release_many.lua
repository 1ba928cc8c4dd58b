-- release_many.lua: give many leases of one pool back at once, each only if
-- its caller still owns it: release.lua once per lease, in one call. The
-- Switch batches the releases of finished requests this way (releaser.go),
-- off the request path. Every key of a pool shares its hash tag, so one
-- call covers every site of the pool in Redis Cluster too.
-- embed: release.lua as release_one
--
-- KEYS[1] fails hash (pool), release.lua's KEYS[4]
-- KEYS[5i-3..5i+1] the keys of scope i (1-based), as release.lua's KEYS[1],
--   KEYS[2], KEYS[3], KEYS[5], KEYS[6]: free zset, lease hash, strikes hash,
--   health hash, pace hash
-- ARGV[1] idle TTL ms (release.lua's ARGV[7])
-- then one group of 7 per lease, j = 0, 1, ...: ARGV[2+7j] its scope's index
-- i, ARGV[3+7j..8+7j] release.lua's ARGV[1..6] (member, owner token,
-- cooldown ms, healthy proxy id or "", flaky delay ms, "1"/"0" pacing)
--
-- Returns one integer per lease, in order, as release.lua returns it: 1
-- released, 2 released after its expiry, 0 not the owner (untouched).

local out = {}
local idle = ARGV[1]
for j = 2, #ARGV - 6, 7 do
  local i = tonumber(ARGV[j])
  local b = i and 5 * i - 3
  if not b or b < 2 or not KEYS[b + 4] then
    return redis.error_reply('PSARGS scope index ' .. tostring(ARGV[j]) .. ' names no keys')
  end
  out[#out + 1] = release_one(
    {KEYS[b], KEYS[b + 1], KEYS[b + 2], KEYS[1], KEYS[b + 3], KEYS[b + 4]},
    {ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5], ARGV[j + 6], idle})
end
return out
