-- dead.lua: the proxies of one pool marked dead, with their URLs.
--
-- KEYS[1] dead hash  id -> "<ms>|<reason>"
-- KEYS[2] pool hash  id -> proxy URL
--
-- Returns the flat list id, URL, "<ms>|<reason>", ... of dead proxies still
-- in the pool (Remove clears the entry of a proxy it takes out). Read-only.
local out = {}
local d = redis.call('HGETALL', KEYS[1])
for i = 1, #d, 2 do
  local url = redis.call('HGET', KEYS[2], d[i])
  if url then
    out[#out + 1] = d[i]
    out[#out + 1] = url
    out[#out + 1] = d[i + 1]
  end
end
return out
