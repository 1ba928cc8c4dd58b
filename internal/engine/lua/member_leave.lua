-- member_leave.lua: take one server out of its pool's member list at once,
-- only if the caller's process still holds the ID. A member that leaves
-- leases no more: it is not remembered as lapsed (member_heartbeat.lua).
--
-- KEYS[1] members zset  member ID -> unix ms at which its registration ends
-- KEYS[2] owners hash   member ID -> token of the process that holds the ID
-- KEYS[3] joins hash    KEYS[4] acks hash    KEYS[5] lapsed zset (member_heartbeat.lua)
-- ARGV[1] member ID     ARGV[2] owner token
--
-- Returns 1 removed, 0 not registered by this process (expired, or taken
-- over by another one): nothing changed.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return 1
