-- pool_snapshot.lua: one page of the copy of a pool every Switch keeps, to
-- re-seed a Redis that lost it (snapshot.go, pool_seed.lua). Read-only.
--
-- KEYS[1] pool hash  id -> proxy URL (or another hash of the pool keyed by proxy
--         ID: snapshot.go pages the dead hash with it after the pool hash, and
--         pool.go's hashKeys the gateways hash for a large Replace)
-- KEYS[2] meta hash  "version" -> generation; "emptied" -> 1 while empty on purpose; "slots"
-- ARGV[1] HSCAN cursor of the hash, "0" for the first page
-- ARGV[2] HSCAN count: bounds the work of one call
--
-- Returns {version (0 for none), emptied 0/1, slots (0 for none), next cursor
-- ("0" after the last page), n, id, URL, ... (n pairs)}. A caller that sees
-- the version change between pages (of the pool hash and then of the dead
-- hash: a drain or a revive moves it too) reads again.
local meta = redis.call('HMGET', KEYS[2], 'version', 'emptied', 'slots')
local out = {tonumber(meta[1] or '0') or 0, meta[2] and 1 or 0, tonumber(meta[3] or '0') or 0}
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
out[4] = page[1]
out[5] = #page[2] / 2
for _, v in ipairs(page[2]) do out[#out + 1] = v end
return out
