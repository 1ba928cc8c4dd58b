-- gateway_of.lua: the gateway template a proxy of the pool was expanded
-- from (pool_update.lua keeps them), before a ban rotates its session.
--
-- KEYS[1] gateways hash  id -> gateway template
-- ARGV[1] proxy id
--
-- Returns the template, or "" for a proxy that is not a gateway's.
return redis.call('HGET', KEYS[1], ARGV[1]) or ''
