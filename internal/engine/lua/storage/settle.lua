-- settle.lua: record a shared setting unless one is recorded, and return the recorded one.
--
-- KEYS[1] meta hash   ARGV[1] field   ARGV[2] value
--
-- Returns the value now stored (the caller's, or an earlier caller's).
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
