-- extend_many.lua: the renewer's tick for one pool (renew.go): push the
-- expiry of many leases, on any of the pool's sites, to now + TTL, each only
-- for its owner. Every key of a pool shares its hash tag, so one call covers
-- every site of the pool in Redis Cluster too.
-- include: extend_lib.lua
--
-- KEYS[1] free zset of the first scope   "<id>:<slot>" -> unix ms at which it is next available
-- KEYS[2] lease hash of the first scope  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[2i-1], KEYS[2i]: the same two keys of scope i, for every scope of the call
-- ARGV[1] lease TTL ms
-- then one triple per lease: ARGV[3j-1] its scope's index i (1-based),
-- ARGV[3j] member, ARGV[3j+1] owner token
--
-- Returns one integer per lease, in order: the new expiry (unix ms), or 0
-- when the caller no longer owns it (released, or leased by someone else):
-- that lease is untouched. Unlike extend.lua, a lease whose expiry passed is
-- renewed as long as its record still carries the token: no one was granted
-- the slot meanwhile (lease.lua writes its own token when it grants one), so
-- a tick that came late loses nothing.

local now = now_ms()
local newexp = now + tonumber(ARGV[1])
local out = {}
for j = 2, #ARGV - 2, 3 do
  local i = tonumber(ARGV[j])
  local free, leases = KEYS[2 * i - 1], KEYS[2 * i]
  if not free or not leases then
    return redis.error_reply('PSARGS scope index ' .. tostring(ARGV[j]) .. ' names no keys')
  end
  out[#out + 1] = extend_member(free, leases, ARGV[j + 1], ARGV[j + 2], newexp, now, false)
end
return out
