-- labels.lua: the labels of the pool's proxies (pool_update.lua keeps them),
-- for List and for the selection of proxies by label (labels.go).
--
-- KEYS[1] labels hash  id -> "k=v,k=v"
--
-- Returns the flat list id, labels, id, labels, ...
return redis.call('HGETALL', KEYS[1])
