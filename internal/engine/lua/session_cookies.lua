-- session_cookies.lua: store cookies a site set in a session's jar
-- (session_lib.lua comes first).
-- include: session_lib.lua
--
-- KEYS[1] session record   KEYS[2] the session's jar  field -> "<created µs>|<cookie JSON>"
-- ARGV[1] session ID       ARGV[2] most cookies a jar keeps
-- ARGV[3] n: fields to set; ARGV[4 .. 3+2n] field, value pairs; the rest: fields to delete
--
-- Only the live session may write (a late response of a retired session
-- writes nothing). Beyond the bound the oldest cookies go first. The jar
-- lives as long as the record. Returns the jar's size, -1 when the session
-- is not live, or {-3, what} when the record or jar is not ours.
local r, bad = read_record(KEYS[1])
if not r then return {-3, 'session record: ' .. bad} end
if r.id ~= ARGV[1] then return -1 end
local ok, typ = jar_ok(KEYS[2])
if not ok then return {-3, 'cookie jar: the key holds a ' .. typ .. ', not a hash'} end
local n = tonumber(ARGV[3])
for i = 0, n - 1 do redis.call('HSET', KEYS[2], ARGV[4 + 2 * i], ARGV[5 + 2 * i]) end
for i = 4 + 2 * n, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
local size, most = redis.call('HLEN', KEYS[2]), tonumber(ARGV[2])
if size > most then
  local flat, all = redis.call('HGETALL', KEYS[2]), {}
  for i = 1, #flat, 2 do all[#all + 1] = {flat[i], tonumber(string.match(flat[i + 1], '^(%d+)|')) or 0} end
  table.sort(all, function(a, b) return a[2] < b[2] end)
  for i = 1, size - most do redis.call('HDEL', KEYS[2], all[i][1]) end
  size = most
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return size
