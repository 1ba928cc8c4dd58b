-- session_count.lua: count a pool's live sessions (Switch.LiveSessions).
--
-- KEYS[1] live sessions zset  {prefix:pool}:sessions  session ID -> expiry ms
--         (session_lib.lua's track)
-- Returns the number of sessions whose expiry is after now (Redis clock).
-- Read only: the set's lapsed entries, not counted, are trimmed when sessions
-- start (session_lib.lua's track, a bounded number per start).
local now = now_ms()
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
