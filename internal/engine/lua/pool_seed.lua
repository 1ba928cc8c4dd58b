-- pool_seed.lua: give a pool back to a Redis that lost it (restarted empty,
-- failed over to an empty replica, flushed), from the copy a Switch keeps
-- (snapshot.go). Every Switch that finds its pool lost runs it, one per
-- process at a time; the first one seeds, the others find the pool there.
--
-- A copy of any size goes in calls of bounded work (issue 14): "stage"
-- calls write it, a page at a time, into staged keys of the seeding Switch
-- alone (KEYS[5..7], named with a token of its own, expiring unless
-- staged to again), then one "commit" call RENAMEs the staged pool hash
-- and order into place: O(1) whatever the size, so that leases see either
-- no pool or the whole of it. A staged dead list is renamed into place
-- too; a dead hash found there (marks written since the loss, which win
-- over the copy's) is merged with it in the commit when one of the two
-- holds at most ARGV[7] entries (the usual case: a few marks since the
-- loss), else it is set aside (KEYS[14]) and "merge" calls put its marks
-- back a page at a time right after the commit (see "merge" below).
--
-- KEYS[1] pool hash  id -> proxy URL
-- KEYS[2] meta hash  "emptied" -> 1 when an operator emptied the pool (pool_update.lua,
--         clear.lua); "version" -> its generation; "slots"; "hold" (see below)
-- KEYS[3] dead hash  id -> "<ms>|<reason>" (dead and drained proxies)
-- KEYS[4] order zset id -> its place in the rotation (lease.lua), written with the pool
-- KEYS[5] staged pool hash, KEYS[6] staged order zset, KEYS[7] staged dead hash,
-- KEYS[8] staged gateways hash, KEYS[9] staged labels hash (same hash tag as KEYS[1])
-- KEYS[10] gateways hash id -> gateway template (gateway.go): a re-seeded
--         gateway's sessions rotate after a ban as before
-- KEYS[11] labels hash  id -> "k=v,k=v" (labels.go): labelled requests
--         select as before
-- KEYS[12] gateway index registry hash, KEYS[13] relabel hash (pool_update.lua):
--         what is left of them and of the index zsets ARGV[6]..":gw:"..digest
--         they name describes a pool that is gone, and goes at commit; the
--         re-seeded gateways hash is indexed anew, in pages (the meta hash's
--         "gwindex" mark, pool_update.lua)
-- ARGV[1] "stage" or "commit"
-- stage:  ARGV[2] TTL ms of the staged keys; ARGV[3] n: the number of proxies
--         of this call; ARGV[4] g, ARGV[5] l: the numbers of their gateway
--         templates and labels; ARGV[6 .. 5+2n] id, URL, ...; then g pairs
--         id, template; then l pairs id, labels; then id, "<ms>|<reason>", ...
--         of the copy's dead list (all of proxies staged: others are skipped)
-- commit: ARGV[2] the copy's generation ("version"), 0 for none
--         ARGV[3] hold ms: the proxies stay out of every site's rotation that long
--         (lease.lua and fallback_writeback.lua read "hold" when they build a
--         site's free set), since requests leased before Redis lost the pool,
--         whose leases went with it, may still run; 0 for none
--         ARGV[4] slots per proxy (K) of the seeding Switch, recorded if none is
--         ARGV[5] the number of proxies staged: a commit that finds fewer
--         (the staged keys expired) writes nothing and fails
--         ARGV[6] key prefix "{prefix:pool}" (lib.lua's pool_prefix: the hash
--         tag of KEYS[1]) of the gateway index zsets
--         ARGV[7] most dead marks merged in the commit; ARGV[8] TTL ms of
--         the marks set aside (KEYS[14]) when there are more
-- merge:  ARGV[2] HSCAN cursor of KEYS[14], "0" for the first call;
--         ARGV[3] HSCAN count; ARGV[4] TTL ms of KEYS[14] until the next call.
--         Puts one page of the marks set aside into the dead hash: a mark
--         set aside wins unless the dead hash holds a later one (by its ms:
--         the copy's marks are older, a mark written after the commit is
--         newer). Meanwhile the re-seed's hold keeps every proxy out of
--         rotation; the copy's marks are all in place from the commit on, so
--         a seeder cut off mid-merge loses only marks written since the loss.
--         Stops, deleting KEYS[14], at the last page or when the pool is gone
--         again (cleared).
-- KEYS[14] the dead marks set aside by the commit (staged name, same hash tag)
--
-- Seeds only a pool that does not exist and that no operator emptied: a pool
-- emptied on purpose stays empty, and an operator's write made since Redis
-- lost the pool is never overwritten (a commit that finds the pool there
-- drops what it staged). Quarantines, strikes and leases are not in the copy:
-- they were lost with Redis. Returns, for stage, 1 (go on) or 0 (the pool is
-- there or emptied: stop); for commit, {the number of proxies written (0
-- when nothing was done), 1 if marks were set aside for "merge" calls else
-- 0}; for merge, the next cursor ("0": done).
local function taken()
  return redis.call('EXISTS', KEYS[1]) == 1 or redis.call('HEXISTS', KEYS[2], 'emptied') == 1
end
if ARGV[1] == 'stage' then
  if taken() then
    redis.call('UNLINK', KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
    return 0
  end
  local ttl, n, g, l = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  if not ttl or ttl <= 0 or not n or n < 0 or not g or g < 0 or not l or l < 0
      or #ARGV < 5 + 2 * (n + g + l) then
    return redis.error_reply('PSCONFIG bad pool_seed stage arguments')
  end
  local last = 5 + 2 * n
  for i = 6, last, 1000 do
    local j = math.min(i + 999, last)
    redis.call('HSET', KEYS[5], unpack(ARGV, i, j))
    local ids = {}
    for k = i, j, 2 do ids[#ids + 1] = ARGV[k] end
    order_add(KEYS[6], KEYS[2], ids)
  end
  -- the gateway templates, labels and dead marks of proxies staged
  local function stage_known(key, from, to)
    for i = from, to - 1, 2 do
      if redis.call('HEXISTS', KEYS[5], ARGV[i]) == 1 then redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
    end
  end
  stage_known(KEYS[8], last + 1, last + 2 * g)
  last = last + 2 * g
  stage_known(KEYS[9], last + 1, last + 2 * l)
  last = last + 2 * l
  stage_known(KEYS[7], last + 1, #ARGV)
  for k = 5, 9 do redis.call('PEXPIRE', KEYS[k], ttl) end
  return 1
end
if ARGV[1] == 'merge' then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('UNLINK', KEYS[14])
    return '0'
  end
  local r = redis.call('HSCAN', KEYS[14], ARGV[2], 'COUNT', ARGV[3])
  local kv = r[2]
  for i = 1, #kv, 2 do
    local cur = redis.call('HGET', KEYS[3], kv[i])
    local at, was = tonumber(string.match(kv[i + 1], '^(%d+)|')), cur and tonumber(string.match(cur, '^(%d+)|'))
    if not (at and was and was > at) then redis.call('HSET', KEYS[3], kv[i], kv[i + 1]) end
  end
  if r[1] == '0' then
    redis.call('UNLINK', KEYS[14])
  else
    redis.call('PEXPIRE', KEYS[14], ARGV[4])
  end
  return r[1]
end
if ARGV[1] ~= 'commit' then return redis.error_reply('PSCONFIG unknown pool_seed mode') end
local base, badbase = pool_prefix(ARGV[6] or '')
if not base then return redis.error_reply(badbase) end
local most, aside = tonumber(ARGV[7]), tonumber(ARGV[8])
if not most or most < 1 or not aside or aside < 1 then
  return redis.error_reply('PSCONFIG bad pool_seed commit arguments')
end
if taken() then
  redis.call('UNLINK', KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
  return {0, 0}
end
local n = tonumber(ARGV[5])
if not n or n <= 0 or redis.call('HLEN', KEYS[5]) ~= n then
  redis.call('UNLINK', KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
  return redis.error_reply('PSSTAGED the staged copy is incomplete (expired?)')
end
redis.call('UNLINK', KEYS[4]) -- an order left without its pool (none, normally)
redis.call('RENAME', KEYS[5], KEYS[1])
redis.call('PERSIST', KEYS[1])
redis.call('RENAME', KEYS[6], KEYS[4])
redis.call('PERSIST', KEYS[4])
-- The gateways and labels hashes go with the pool they describe: what is
-- left of them without it is stale.
for k = 8, 9 do
  redis.call('UNLINK', KEYS[k + 2])
  if redis.call('EXISTS', KEYS[k]) == 1 then
    redis.call('RENAME', KEYS[k], KEYS[k + 2])
    redis.call('PERSIST', KEYS[k + 2])
  end
end
-- The gateway index of the pool that was lost (one key per template), then
-- the mark that has pool_update.lua build it anew.
for _, d in ipairs(redis.call('HKEYS', KEYS[12])) do redis.call('UNLINK', base .. ':gw:' .. d) end
redis.call('UNLINK', KEYS[12], KEYS[13])
redis.call('HSET', KEYS[2], 'gwindex', redis.call('EXISTS', KEYS[10]) == 1 and '0' or 'done')
-- The dead list: marks written since the loss (a Drain, a worker's
-- failures) win over the copy's (KEYS[7]). The smaller of the two is merged
-- into the other when it holds at most ARGV[7] marks; else the copy's goes
-- into place and the others are set aside for the "merge" calls.
local merge = 0
if redis.call('EXISTS', KEYS[7]) == 1 then
  if redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('RENAME', KEYS[7], KEYS[3])
    redis.call('PERSIST', KEYS[3])
  elseif redis.call('HLEN', KEYS[7]) <= most then
    local kv = redis.call('HGETALL', KEYS[7])
    for i = 1, #kv, 2 do redis.call('HSETNX', KEYS[3], kv[i], kv[i + 1]) end
    redis.call('UNLINK', KEYS[7])
  else
    if redis.call('HLEN', KEYS[3]) <= most then
      local kv = redis.call('HGETALL', KEYS[3])
      for i = 1, #kv, 2 do redis.call('HSET', KEYS[7], kv[i], kv[i + 1]) end
    else
      redis.call('RENAME', KEYS[3], KEYS[14])
      redis.call('PEXPIRE', KEYS[14], aside)
      merge = 1
    end
    redis.call('RENAME', KEYS[7], KEYS[3])
    redis.call('PERSIST', KEYS[3])
  end
end
if redis.call('HEXISTS', KEYS[2], 'version') == 0 and tonumber(ARGV[2]) > 0 then
  redis.call('HSET', KEYS[2], 'version', ARGV[2])
else
  bump_version(KEYS[2])
end
redis.call('HSETNX', KEYS[2], 'slots', ARGV[4])
redis.call('HSET', KEYS[2], 'index', 'done') -- the order is written with the pool
local hold = tonumber(ARGV[3])
if hold > 0 then
  local untl = now_ms() + hold
  if untl > meta_ms(KEYS[2], 'hold') then redis.call('HSET', KEYS[2], 'hold', untl) end
end
return {n, merge}
