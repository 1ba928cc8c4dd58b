-- isvisited.lua: report whether a request ID holds a live visited mark. Read-only.
--
-- KEYS[1] visited bucket hash   field -> "<expiry>|<owner>" (expiry "0":
--                               forever, else unix ms; owner: the ID of the
--                               queued request whose delivery claimed the
--                               mark, empty for any other claim), or
--                               "<expiry>" alone, a mark an earlier version
--                               wrote (no owner recorded)
-- ARGV[1] field (8-byte request hash)
--
-- Returns 0 not visited (absent or expired), 1 visited (empty owner),
-- 2 visited by an earlier version's mark, or, for a live mark a queued
-- request claimed, that request's ID (a string).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return 0 end
local e, owner = string.match(v, '^([0-9]+)|([0-9]*)$')
local legacy = not e
if legacy then e = v end
local expiry = tonumber(e)
if not expiry then corrupt(KEYS[1], 'visited mark is not a number', v) end
if expiry ~= 0 and expiry <= now_ms() then return 0 end
if legacy then return 2 end
if owner == '' then return 1 end
return owner
