-- list.lua: one page of a hash of one pool keyed by proxy ID (the pool
-- hash for List, the labels hash, the dead hash for Dead), read-only and
-- bounded: one HSCAN of ARGV[2] per call, whatever the pool's size
-- (paged.go reads every page).
--
-- KEYS[1] the hash to read       id -> value
-- KEYS[2] optional: a hash joined on the id (Dead: the pool hash, for the URL);
--         ids it lacks are left out
-- ARGV[1] HSCAN cursor, "0" for the first page
-- ARGV[2] HSCAN count
--
-- Returns {next cursor ("0" after the last page), id, value, id, value, ...},
-- or with KEYS[2] {next cursor, id, value, joined value, ...}. HSCAN may
-- return an id twice over the pages; an id present from the first page to
-- the last is returned at least once.
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {page[1]}
local kv = page[2]
if not KEYS[2] then
  for _, v in ipairs(kv) do out[#out + 1] = v end
  return out
end
if #kv == 0 then return out end
local ids = {}
for i = 1, #kv, 2 do ids[#ids + 1] = kv[i] end
local joined = redis.call('HMGET', KEYS[2], unpack(ids))
for i = 1, #ids do
  if joined[i] then
    out[#out + 1] = kv[2 * i - 1]
    out[#out + 1] = kv[2 * i]
    out[#out + 1] = joined[i]
  end
end
return out
