-- find.lua: one proxy of a pool by ID (Ban, Unban: an operator naming a
-- proxy), a few steps whatever the pool's size. Read-only.
--
-- KEYS[1] pool hash    id -> proxy URL
-- KEYS[2] labels hash  id -> "k=v,k=v"
-- ARGV[1] proxy id
--
-- Returns {URL, labels ("" for none)}, or {} for an id not in the pool.
local url = redis.call('HGET', KEYS[1], ARGV[1])
if not url then return {} end
return {url, redis.call('HGET', KEYS[2], ARGV[1]) or ''}
