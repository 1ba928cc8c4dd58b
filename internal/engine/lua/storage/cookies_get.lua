-- cookies_get.lua: read the cookie jar of one registrable domain, and the
-- cookies an earlier version kept for the request's host, refusing
-- oversized hashes. Read-only.
--
-- KEYS[1] cookie jar of the domain   "<domain>;<path>;<name>" -> "<created µs>|<h or d>|<line>"
-- KEYS[2] the host's hash of an earlier version (per host and port)
--         "<name>;<path>;<domain>" -> Set-Cookie line
-- ARGV[1] max cookies   ARGV[2] max bytes of all values together (each hash)
--
-- Returns {jar field, value, ...}, {legacy field, line, ...} (hash order),
-- or a PSCORRUPT error if a hash is larger than the limits (nothing this
-- package writes is).
local function read(key)
  local n = redis.call('HLEN', key)
  if n > tonumber(ARGV[1]) then
    corrupt(key, 'cookie hash holds ' .. n .. ' entries, limit ' .. ARGV[1])
  end
  if n == 0 then return {} end
  local kv = redis.call('HGETALL', key)
  local total = 0
  for i = 2, #kv, 2 do total = total + #kv[i] end
  if total > tonumber(ARGV[2]) then
    corrupt(key, 'cookie hash holds ' .. total .. ' bytes, limit ' .. ARGV[2])
  end
  return kv
end
return {read(KEYS[1]), read(KEYS[2])}
