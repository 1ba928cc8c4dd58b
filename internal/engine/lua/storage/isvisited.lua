-- isvisited.lua: report whether a request ID holds a live visited mark. Read-only.
--
-- KEYS[1] visited bucket hash   field -> "<expiry>" or "<expiry>|<queue request ID>"
--                               (expiry "0": forever, else unix ms; the queue
--                               request ID names the queued request whose
--                               delivery claimed the mark)
-- ARGV[1] field (8-byte request hash)
--
-- Returns 0 not visited (absent or expired), 1 visited, or, for a live
-- mark a queued request claimed, that request's ID (a string).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local e, owner = string.match(v, '^([0-9]+)|([0-9]+)$')
if not e then e = v end
local expiry = tonumber(e)
if not expiry then corrupt(KEYS[1], 'visited mark is not a number', v) end
if expiry ~= 0 and expiry <= now_ms() then return 0 end
return owner or 1
