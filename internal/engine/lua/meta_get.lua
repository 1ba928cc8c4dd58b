-- meta_get.lua: read one field of a pool's settings (Switch.PoolConcurrency).
--
-- KEYS[1] meta hash   "slots" -> concurrent requests per proxy per site
-- ARGV[1] field
--
-- Returns the field's value, or nil when it is not set.
return redis.call('HGET', KEYS[1], ARGV[1])
