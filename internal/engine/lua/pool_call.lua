-- pool_call.lua: one round trip for what a pool's requests asked of Redis
-- at once (poolcall.go): the leases they give back, release.lua once per
-- lease, then the plain leases they ask for, lease.lua once per site with
-- the owner tokens of its attempts. Every key of a pool shares its hash
-- tag, so one call covers every site of the pool in Redis Cluster too.
-- embed: release.lua as release_one
-- embed: lease.lua as lease_one
--
-- KEYS[1] fails hash (pool), release.lua's KEYS[4]; then the keys of each
--   site, lease.lua's KEYS (ARGV gives their count); then five keys per
--   release scope, release.lua's KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6]:
--   free zset, lease hash, strikes hash, health hash, pace hash
-- ARGV[1] idle TTL ms (release.lua's ARGV[7])
-- ARGV[2] n, the sites leased on     ARGV[3] r, the release scopes
-- then for each site: its key count k, its argument count a, then
--   lease.lua's ARGV[1..a] (the further owner tokens from its ARGV[11])
-- then one group of 7 per release: its scope's index i (1..r), then
--   release.lua's ARGV[1..6] (member, owner token, cooldown ms, healthy
--   proxy id or "", flaky delay ms, "1"/"0" pacing)
--
-- Returns {reply of site 1, ..., reply of site n, {reply of each release}}:
-- a site's reply as lease.lua replies, a release's as release.lua's (1
-- released, 2 released after its expiry, 0 not the owner: untouched). A
-- part that fails fails alone, the others keep their effects: a site's
-- reply is then {"e", message}, a release's "e:" .. message.
--
-- The releases run first: a proxy given back with no cooldown can be
-- leased again in the same call, as in two calls one after the other.

local function failed(e)
  if type(e) == 'table' then e = e.err end
  return tostring(e)
end

local n, r = tonumber(ARGV[2]), tonumber(ARGV[3])
if not n or not r or n < 0 or r < 0 then
  return redis.error_reply('PSARGS malformed site or scope count')
end

-- Where each site's keys and arguments are.
local sites, k, a = {}, 2, 4
for i = 1, n do
  local nk, na = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if not nk or not na or nk < 1 or na < 1 or k + nk - 1 > #KEYS or a + 1 + na > #ARGV then
    return redis.error_reply('PSARGS site ' .. i .. ' names no keys or arguments')
  end
  sites[i] = {k, nk, a + 2, na}
  k, a = k + nk, a + 2 + na
end
local rk = k -- the first release scope's keys
if rk + 5 * r - 1 > #KEYS or (#ARGV - a + 1) % 7 ~= 0 then
  return redis.error_reply('PSARGS malformed releases')
end

local out = {}
local rel = {}
local idle = ARGV[1]
for j = a, #ARGV - 6, 7 do
  local i = tonumber(ARGV[j])
  if not i or i < 1 or i > r or i ~= math.floor(i) then
    return redis.error_reply('PSARGS scope index ' .. tostring(ARGV[j]) .. ' names no keys')
  end
  local b = rk + 5 * (i - 1)
  local ok, v = pcall(release_one,
    {KEYS[b], KEYS[b + 1], KEYS[b + 2], KEYS[1], KEYS[b + 3], KEYS[b + 4]},
    {ARGV[j + 1], ARGV[j + 2], ARGV[j + 3], ARGV[j + 4], ARGV[j + 5], ARGV[j + 6], idle})
  if not ok then v = 'e:' .. failed(v) end
  rel[#rel + 1] = v
end

for i = 1, n do
  local s = sites[i]
  local ok, v = pcall(lease_one, {unpack(KEYS, s[1], s[1] + s[2] - 1)}, {unpack(ARGV, s[3], s[3] + s[4] - 1)})
  if not ok then
    v = {'e', failed(v)}
  elseif type(v) == 'table' and v.err then
    v = {'e', v.err}
  end
  out[i] = v
end
out[n + 1] = rel
return out
