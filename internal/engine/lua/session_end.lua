-- session_end.lua: end a task's session (session_lib.lua comes first): on a
-- ban or proxy failure (retirement), or at the caller's request.
-- include: session_lib.lua
--
-- KEYS[1] session record  KEYS[2] pool hash
-- KEYS[3] live sessions zset  session ID -> expiry ms
-- ARGV[1] key prefix "{prefix:pool}": the per-scope keys of the scopes the
--         session holds and its jar are derived from it, since only the
--         record names them (see session_lib.lua; same hash tag as KEYS,
--         checked)
-- ARGV[2] session ID to end, or "" for whichever is live (and then a
--         record this package did not write is deleted too)
-- ARGV[3] reason    ARGV[4] site where it showed, or ""
-- ARGV[5] cooldown ms   ARGV[6] slots per proxy (K)   ARGV[7] session TTL ms
-- ARGV[8] ms the proxy stays out for the session's requests under way (0: none)
-- ARGV[9] the caller's Switch tag when it has none of the session's
--         requests under way (its h:<tag> field then holds nothing), or ""
--
-- Every slot the session held comes back after the cooldown, ARGV[8], or
-- the requests other Switches noted under way (unless a ban pushed it
-- further out), its cookie jar is deleted and the record becomes
-- a tombstone naming it, which the task's next session reports.
-- Returns {1, id, gen, proxy id, proxy URL or "", n, created ms, now ms} ended;
--         {0} no such live session; {2} a corrupt record was deleted.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
local r = read_record(KEYS[1])
if not r or (r.id and check_live(r)) then
  if ARGV[2] ~= '' then return {0} end
  redis.call('DEL', KEYS[1])
  return {2}
end
if not r.id or (ARGV[2] ~= '' and r.id ~= ARGV[2]) then return {0} end
local now = now_ms()
local out = {1, r.id, r.gen, r.proxy, redis.call('HGET', KEYS[2], r.proxy) or '', r.n, r.created, now}
end_session(KEYS[1], r, base, KEYS[3], ARGV[3], ARGV[4], now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9])
return out
