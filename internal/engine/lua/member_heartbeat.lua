-- member_heartbeat.lua: register or refresh one server in its pool's member
-- list, drop the members whose registration ran out, and return who is live,
-- who lapsed lately, and whether every other server has seen this one.
--
-- KEYS[1] members zset  member ID -> unix ms at which its registration ends
-- KEYS[2] owners hash   member ID -> token of the process that holds the ID
-- KEYS[3] joins hash    member ID -> Redis ms at which its registration began
-- KEYS[4] acks hash     member ID -> Redis ms of the member list it holds (the
--                       reply of its last heartbeat it received)
-- KEYS[5] lapsed zset   member ID -> ms at which its registration ran out with
--                       no leave (member_leave.lua): it may still lease from
--                       its fallback shard, by a list naming itself
-- ARGV[1] member ID     ARGV[2] owner token     ARGV[3] registration TTL ms
-- ARGV[4] ack: Redis ms of the list this member holds (0 for none)
-- ARGV[5] how long a lapsed member is remembered, ms
--
-- Returns {1, now ms, settled, n, n live IDs (this one included), lapsed IDs},
--         settled 1 when every other live or lapsed member holds a list read
--         since this one's registration began, and so names it: its fallback
--         share may count (fallback.go);
--         or {0, ms at which the holder's registration ends} when another
--         process holds the ID and is live: nothing changed.
-- The keys expire with the last live registration (the lapsed zset and the
-- acks of lapsed members a lapse keep later), so a pool whose servers all
-- stopped leaves nothing behind. Time comes from the server (TIME).
local now = now_ms()
local keep = tonumber(ARGV[5])

local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES')
for i = 1, #stale, 2 do
  local id = stale[i]
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZADD', KEYS[5], checked(stale[i + 1], KEYS[1], 'registration end of ' .. id, 0, MAX_MS), id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - keep)) do
  redis.call('ZREM', KEYS[5], id)
  if not redis.call('ZSCORE', KEYS[1], id) then redis.call('HDEL', KEYS[4], id) end
end

local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder and holder ~= ARGV[2] then
  local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if ends then return {0, checked(ends, KEYS[1], 'registration end of ' .. ARGV[1], 0, MAX_MS)} end
end

local joined = redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('HGET', KEYS[3], ARGV[1])
if not joined then
  joined = now
  redis.call('HSET', KEYS[3], ARGV[1], now)
end
joined = checked(joined, KEYS[3], 'join of ' .. ARGV[1], 0, MAX_MS)
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], tonumber(ARGV[4]) or 0)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local keepLive = checked(last[2], KEYS[1], 'registration end', 0, MAX_MS) - now + 1000
redis.call('PEXPIRE', KEYS[1], keepLive)
redis.call('PEXPIRE', KEYS[2], keepLive)
redis.call('PEXPIRE', KEYS[3], keepLive)
redis.call('PEXPIRE', KEYS[4], keepLive + keep)
if redis.call('ZCARD', KEYS[5]) > 0 then redis.call('PEXPIRE', KEYS[5], keep + 1000) end

-- settled: each other member that joined no later, or lapsed, holds a
-- list read since this one joined (a member that joined later read this one
-- in the reply to its registration, and answers for itself the same way).
-- A member with no ack (none yet, or of an older version) has not seen it.
-- A list read in the millisecond this one joined may be from before the
-- join (scripts of one millisecond are not ordered by their time): it does
-- not count, and the member is seen one heartbeat later.
-- That this member holds the reply is the caller's to know: a reply lost
-- after a re-registration leaves it an older list (shard/membership.go).
local settled = 1
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local lapsed = redis.call('ZRANGE', KEYS[5], 0, -1)
if settled == 1 then
  for _, id in ipairs(live) do
    if id ~= ARGV[1] then
      local j = num(redis.call('HGET', KEYS[3], id)) or 0
      if j <= joined and (num(redis.call('HGET', KEYS[4], id)) or 0) <= joined then settled = 0 break end
    end
  end
end
if settled == 1 then
  for _, id in ipairs(lapsed) do
    if (num(redis.call('HGET', KEYS[4], id)) or 0) <= joined then settled = 0 break end
  end
end

local out = {1, now, settled, #live}
for _, id in ipairs(live) do out[#out + 1] = id end
for _, id in ipairs(lapsed) do out[#out + 1] = id end
return out
