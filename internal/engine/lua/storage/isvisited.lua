-- isvisited.lua: report whether a request ID holds a live visited mark. Read-only.
--
-- KEYS[1] visited bucket hash   field -> "0" (forever) or unix ms of expiry
-- ARGV[1] field (8-byte request hash)
--
-- Returns 1 visited, 0 not visited (absent or expired).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
if v == '0' then return 1 end
local expiry = tonumber(v)
if not expiry then corrupt(KEYS[1], 'visited mark is not a number', v) end
if expiry > now_ms() then return 1 end
return 0
