-- session_score.lua: a soft refusal (429, 503) met through a task's live
-- session adds to the session's error score (sessionscore.go).
-- include: session_lib.lua
--
-- KEYS[1] session record ({prefix:pool}:session:<task>; session_lib.lua)
-- ARGV[1] session ID      ARGV[2] max error score (> 0)
-- ARGV[3] decay per healthy request
--
-- The record keeps "err", the score after the last soft refusal, and
-- "errn", its request count then ("n"). Every request the session sent in
-- between was healthy (a hard ban or a proxy failure retires the session,
-- a soft refusal comes here), so the score first decays by ARGV[3] for each
-- (never below 0), then grows by 1. No round trip on the healthy path.
-- Returns {1, score} kept (score < max), {2, score} spent: the caller
-- retires the session (session_end.lua); {0} no such live session.
local r = read_record(KEYS[1])
if not r or not r.id or r.id ~= ARGV[1] or check_live(r) then return {0} end
local maxs, decay = tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(r.n)
local score = tonumber(r.err or '0') or 0
local since = tonumber(r.errn or '') or n
score = math.max(0, score - decay * math.max(0, n - since - 1)) + 1
redis.call('HSET', KEYS[1], 'err', tostring(score), 'errn', n)
local st = 1
if score >= maxs then st = 2 end
return {st, tostring(score)}
