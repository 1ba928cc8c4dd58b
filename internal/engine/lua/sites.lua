-- sites.lua: one page of the sites leased from one pool recently, in
-- bounded calls (issue 14): the caller (sites.go) reads the pages oldest
-- first, from a continuation, and puts the whole list most recent first.
--
-- KEYS[1] sites zset  site -> unix ms of its last lease
-- ARGV[1] idle TTL ms: sites idle for longer are left out
-- ARGV[2] continuation: the score the previous page's last site had, ""
--         for the first page
-- ARGV[3] the previous page's last site ("" for the first page)
-- ARGV[4] most sites in the page
--
-- Returns {next score, next site, site, last-lease ms, site, ms, ...}: the
-- page's sites in ascending order of score (ties: of name) from the first
-- one after the continuation; next site "" after the last page. A site whose
-- last lease was read moves up (its score only grows), ahead of the
-- continuation: every site leased within the idle TTL from the first page
-- to the last is read, one leased again meanwhile maybe twice (the caller
-- keeps its later score). Each call is O(log N + ARGV[4]) whatever the
-- number of sites (one unbounded ZRANGE of 100,000 sites blocked Redis for
-- 73 ms, and the reply for more).
local now = now_ms()
local min = now - tonumber(ARGV[1])
local count = tonumber(ARGV[4])
if not count or count < 1 then return redis.error_reply('PSCONFIG bad sites page size') end
-- The first rank with a score of min or more: sites idle for longer come first.
local start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. min)
if ARGV[3] ~= '' then
  local sc = redis.call('ZSCORE', KEYS[1], ARGV[3])
  if sc and tonumber(sc) == tonumber(ARGV[2]) then
    -- The last site read is where it was: the page goes on after it.
    start = math.max(start, redis.call('ZRANK', KEYS[1], ARGV[3]) + 1)
  else
    -- It moved up or left: the page goes on from its old score (the sites
    -- tied with it may come again).
    start = math.max(start, redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[2]))
  end
end
local page = redis.call('ZRANGE', KEYS[1], start, start + count - 1, 'WITHSCORES')
local reply = {'', ''}
if #page == 2 * count then reply = {page[#page], page[#page - 1]} end
for i = 1, #page do reply[#reply + 1] = page[i] end
return reply
