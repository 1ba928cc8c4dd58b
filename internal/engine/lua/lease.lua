-- lease.lua: lease a free proxy of one pool for one site, offering the
-- pool's proxies to the site in turn.
--
-- KEYS[1] pool hash      id -> proxy URL
-- KEYS[2] busy zset      "<id>:<slot>" -> unix ms until which it is out on this site
--                        (leased, cooling down, quarantined, dead); a slot with no
--                        entry, or a passed score, is free on the site
-- KEYS[3] lease hash     "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[4] sites zset     site -> unix ms of its last lease (written at most once a second)
-- KEYS[5] meta hash      "slots" -> concurrent requests per proxy per site;
--                        "version" -> generation of the pool; "emptied" -> 1 while it
--                        is empty on purpose; "hold" -> ms until which a re-seeded
--                        pool's proxies stay out (pool_seed.lua); "index" -> "done"
--                        when every proxy of the pool is in the order (KEYS[9]);
--                        "strict" -> ms until which strict exits hold (exit_strict.lua)
-- KEYS[6] dead hash      id -> "<ms>|<reason>" (proxies out of every rotation)
-- KEYS[7] quarantine zset id -> unix ms until which it is banned on every site
-- ARGV[1] site (scope)   ARGV[2] owner token      ARGV[3] lease TTL ms
-- ARGV[4] cooldown ms    ARGV[5] slots (K >= 1)   ARGV[6] idle TTL ms of site keys
-- ARGV[7] preferred proxy id, or "" for none
-- ARGV[8] "1": the preferred proxy or none (a sticky session reaching a new
--         site, session.go); "x": the preferred proxy if free, even with
--         its exit IP unknown under strict exits (Switch.LeaseProxy: the
--         probe that records it), else any; absent or "" for any proxy
-- KEYS[8] breaker hash   ARGV[9] site, or absent/"" with no breaker
-- ARGV[10] probes of a half-open breaker (breaker_lib.lua, breaker.go)
-- KEYS[9] order zset     id -> its place in the pool's rotation (pool_update.lua)
-- KEYS[10] cursor hash   site -> "<place of the proxy last offered>|<ms of the site's last bookkeeping>"
-- ARGV[11..] owner tokens of further plain leases in the same call (the lease
--         attempts of a pool call, poolcall.go; ARGV[7] must be "" and ARGV[8] not "1"): the
--         call grants up to 1 + their count leases, each one the rotation's
--         next free proxy after the one before, every lease exactly as a call
--         of its own would grant it; TIME, the meta, the cursor, the breaker
--         gate and the prune are paid once. A half-open breaker grants one
--         probe per call: then only ARGV[2]'s lease.
-- KEYS[11] exit hash    id -> the proxy's exit IP (probe.Checker with Exits,
--                        exit_note.lua); each IP's entries in the set
--                        "<KEYS[11]>:<IP>". Absent, or empty: no exit known.
--                        With exits, the keys named from its prefix (KEYS[11]
--                        is "<base>:exit", the pool's hash tag): the site's
--                        exit index "<base>:exitout:<site>", the ban index
--                        "<base>:exitban:<IP>" of each IP (lib.lua), the
--                        IPs "<base>:exitips" (IP -> its entries, exit_note.lua)
--                        and the IP holds "<base>:exithold" (exit_note.lua);
--                        the meta's "exitidx" (migrate) and "exitall" (exit_all_out).
-- include: breaker_lib.lua
--
-- Exit IPs: entries whose exit IPs are known and equal share one set of
-- slots on the site: an entry is free there only while fewer than K slots
-- of all the entries of its IP are out on the site (leased, cooling down,
-- quarantined there, or banned on every site; dead entries do not count).
-- Exclusivity, pacing and quarantine thus apply to the IP, and two
-- requests never reach a site from one exit address because two entries
-- share it. Each entry keeps its own members ("<id>:<slot>"): release,
-- extend and penalize stay owner-checked on them, and the state an entry
-- earned stays with it when its exit changes (it then holds its new IP's
-- slots). The count does not read the IP's entries (thousands may share
-- one): it reads the site's index of the entries of the IP that may have
-- slots out, and the IP's index of entries banned on every site (lib.lua's
-- exit_mark, exit_ban; ip_count below), checking each entry read as the
-- count always did: bounded work per IP met, one count per IP per call.
-- An IP that an entry left holds what the entry earned there (its rests
-- on sites, its ban on every site: exit_note.lua's IP holds), read first:
-- while held, it is out on the site, whatever its entries.
-- A pool saturated by its IPs answers the time until one comes back
-- (exit_all_out), not a 1 ms retry.
-- Strict exits (the meta's "strict" in the future, probe.Checker.Strict):
-- an entry whose exit is not known yet is out on every site, for a second
-- at a time, until a probe records it; only a lease that names it with
-- ARGV[8] "x" takes it (the probe's own).
--
-- Rotation: the site's cursor walks the pool's order (KEYS[9]) and the
-- lease takes the first proxy after it with a slot free on the site, not
-- dead, not banned on every site: every proxy is offered once per turn of
-- the cursor, as least-recently-used order offered it once per rotation. A
-- site thus costs memory only for the slots out on it (KEYS[2]), pruned as
-- their scores pass (two per lease), plus its cursor. One call looks at
-- most SCAN proxies: when none of them is free and the site's busy set does
-- not cover the whole pool, the cursor moves past them and the reply is a
-- 1 ms wait (the caller retries: bounded work per call, progress each call).
--
-- Returns {1, member, proxy URL, expiry ms, version} on success (version: the
--                       pool's generation, 0 for none; snapshot.go),
--         {2, version, expiry ms, wait ms, member 1, URL 1, member 2, URL 2, ...}
--                       on success with further tokens (ARGV[11..]): pair i
--                       is the lease of the i-th token (ARGV[2], then
--                       ARGV[11], ...); fewer pairs than tokens when no more
--                       proxy was free within the call's bounded look, and
--                       then wait is the wait of the tokens left (as in
--                       {0, wait ms} below: 1 when only part of the pool
--                       was looked at), else 0,
--         {0, wait ms}  when every proxy is busy (wait = time until the next one frees;
--                       with ARGV[8] = "1", {0, wait ms, firm}: see below),
--         {-1, lost, version} when the pool is empty: lost is 1 when no operator
--                       emptied it (no "emptied" mark: Redis lost it, or it was
--                       never loaded), else 0,
--         {-2}          with ARGV[8] = "1", when the preferred proxy left the pool or is dead,
--         {-3, wait ms, until ms} while the site's breaker holds it (until 0: half-open, probes out).
-- Time comes from the server's clock (TIME), never from a client.
local now = now_ms()
local want = 1 + math.max(#ARGV - 10, 0)
if want > 1 and (ARGV[7] ~= '' or ARGV[8] == '1') then
  return redis.error_reply('PSARGS further owner tokens are for plain leases only')
end
if ARGV[9] and ARGV[9] ~= '' then
  local paused, probe = breaker_gate(KEYS[8], ARGV[9], tonumber(ARGV[10]), now)
  if paused then return paused end
  if probe then want = 1 end
end
-- (Numbers go to redis.call as strings, formatted once: Redis formats a Lua
-- number argument with "%.17g", a cost on every lease.)
local ttl, cooldown, idle = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[6]
local SCAN, PRUNE = 128, tostring(2 * want)
local nows = now_str()

local meta = redis.call('HMGET', KEYS[5], 'slots', 'version', 'hold', 'index', 'strict', 'exitall', 'exitidx')
local slots = meta[1]
if not slots then
  redis.call('HSET', KEYS[5], 'slots', ARGV[5])
  slots = ARGV[5]
elseif slots ~= ARGV[5] then
  checked(slots, KEYS[5], 'field slots', 1, MAX_SLOTS)
  return redis.error_reply('PSCONFIG pool serves ' .. slots .. ' concurrent requests per proxy per site, this client asks for ' .. ARGV[5])
end
slots = tonumber(slots)
local version = checked(meta[2], KEYS[5], 'field version', 0, MAX_MS) or 0
local hold = checked(meta[3], KEYS[5], 'field hold', 0, MAX_MS) or 0
local strict = (checked(meta[5], KEYS[5], 'field strict', 0, MAX_MS) or 0) > now

local function empty()
  local lost = 1
  if redis.call('HEXISTS', KEYS[5], 'emptied') == 1 then lost = 0 end
  return {-1, lost, version}
end

-- The site's cursor and its bookkeeping: the sites zset and the TTLs of
-- the site's keys are refreshed at most once a second.
local cur = redis.call('HGET', KEYS[10], ARGV[1])
local place, booked = 0, 0
local place_s = '0' -- place as the order zset's score text (a ZRANGE bound)
if cur then
  local p, b = string.match(cur, '^(%d+)|(%d+)$')
  if not p then corrupt(KEYS[10], 'field ' .. ARGV[1] .. ' is not a cursor', cur) end
  place, booked, place_s = tonumber(p), tonumber(b), p
end
local fresh = now - booked >= 1000
if fresh then
  booked = now
  redis.call('ZADD', KEYS[4], nows, ARGV[1])
  redis.call('PEXPIRE', KEYS[4], idle)
  redis.call('HSET', KEYS[10], ARGV[1], string.format('%.0f', place) .. '|' .. now)
  redis.call('PEXPIRE', KEYS[10], idle)
end

-- Prune: slots whose score passed are free; their entries go.
local pruned = redis.call('ZRANGE', KEYS[2], '-inf', nows, 'BYSCORE', 'LIMIT', '0', PRUNE)
if #pruned > 0 then redis.call('ZREM', KEYS[2], unpack(pruned)) end

-- The sweep (lib.lua's site_sweep), at the site's bookkeeping (once a
-- second), before it answers that every proxy is out (all_out), and with
-- exit IPs before any IP is counted: once per call. Returns whether a slot
-- out came back; sweep_more is then whether events were left for later.
local DEAD_SAMPLE = 64
local swept, sweep_more = false, false
local function sweep()
  if swept then return false end
  swept = true
  local moved
  moved, sweep_more = site_sweep(ARGV[1], KEYS[2], KEYS[3], KEYS[1], KEYS[6], slots, now, idle)
  return moved
end
if fresh then sweep() end

-- Whether any proxy is dead is read once (most often none is: then no
-- candidate is looked up); a call of several leases reads once whether any
-- is banned on every site now too.
local nodead = redis.call('HLEN', KEYS[6]) == 0
local noban = want > 1 and redis.call('ZCOUNT', KEYS[7], '(' .. nows, '+inf') == 0

-- out is the score of slot m on the site (0: free there). A slot at DEAD
-- whose proxy is no longer dead (revive.lua) is out only while a lease
-- taken before its death runs.
local function out(m, id)
  local sc = num(redis.call('ZSCORE', KEYS[2], m)) or 0
  if sc >= DEAD and redis.call('HEXISTS', KEYS[6], id) == 0 then
    local v = redis.call('HGET', KEYS[3], m)
    local exp = v and tonumber(string.match(v, '|(%d+)$'))
    if exp and exp > now then sc = exp else sc = 0 end
  end
  return sc
end

-- dead_mark records dead proxy id on the site: its slots out here (a ban,
-- a cooldown, a lease taken before its death) go to DEAD, so that all_out
-- counts them once (the dead hash counts every dead proxy's slots), and a
-- release keeps them out. A death writes the dead hash and the busy set of
-- the scope it happened on only (penalize.lua, drain.lua: bounded work
-- whatever the sites); each other site records it here, when a lease
-- meets the proxy. Returns whether a slot moved. A slot with no entry gets
-- none (free but for the dead hash, which all_out counts).
local function dead_mark(id)
  local moved = 0
  for s = 0, slots - 1 do
    moved = moved + redis.call('ZADD', KEYS[2], 'XX', 'GT', 'CH', DEAD, id .. ':' .. s)
  end
  return moved > 0
end

-- is_dead returns DEAD when proxy id is dead (marking it on the site), else nil.
local function is_dead(id)
  if nodead or redis.call('HEXISTS', KEYS[6], id) == 0 then return nil end
  dead_mark(id)
  return DEAD
end

-- banned is how long proxy id is out on every site (banned on every site:
-- the ban's end), or nil. A site that first meets a ban this way records it
-- on its free slots (its busy set then counts them out until the ban ends).
local function banned(id, free)
  if noban then return nil end
  local q = num(redis.call('ZSCORE', KEYS[7], id))
  if not q or q <= now then return nil end
  for _, m in ipairs(free) do redis.call('ZADD', KEYS[2], 'GT', q, m) end
  return q
end

-- The exit IPs: read only when some are known, or strict exits hold the
-- unknown ones (strict_hold: until when such an entry is out, a second at
-- a time; nil when not strict).
local EXITS = KEYS[11]
local exits_on = EXITS and (strict or redis.call('HLEN', EXITS) > 0)
local strict_hold = strict and EXITS and now + 1000 or nil
-- With exits: whether any proxy is dead, or banned on every site, read once;
-- the pool's key prefix (EXITS is "<base>:exit") and the site's index of
-- the entries with slots out (lib.lua's exit_mark).
local anydead = exits_on and not nodead
local anyban = exits_on and redis.call('ZCOUNT', KEYS[7], '(' .. nows, '+inf') > 0
local XBASE = exits_on and string.sub(EXITS, 1, #EXITS - 5)
local XOUT = exits_on and XBASE .. ':exitout:' .. ARGV[1]
-- READ bounds the entries of one IP an index read looks at.
local READ = 64

-- The exit machinery below is defined only when exits are on: a call
-- of a pool without exits creates none of its functions (Lua work on
-- every lease).
local migrate, dead_kept, entries_read, ip_count, index_trim, exit_all_out
local built = true
if exits_on then
  local XHOLD = XBASE .. ':exithold' -- the IP holds (exit_note.lua; ip_count)
  -- The indexes are built once per pool from what is out when a lease first
  -- meets exits (what a Switch older than them left out: leases, cooldowns,
  -- quarantines, bans), in steps of MIGRATE entries per call, before any
  -- count is sure: the meta's "exitidx" is "q|<ZSCAN cursor>" while the
  -- quarantine zset is read into the ban indexes, "s|<rank>|<ZSCAN cursor>"
  -- while the busy set of the site of that rank in the sites zset (by last
  -- lease: a site leased meanwhile moves past the rank, to be read again) is
  -- read into its index, then "done". Returns whether it is done.
  local MIGRATE = 2048
  function migrate()
    local st = meta[7]
    if st == 'done' then return true end
    local budget = MIGRATE
    local qc = string.match(st or 'q|0', '^q|(%d+)$')
    if qc then
      repeat
        local page = redis.call('ZSCAN', KEYS[7], qc, 'COUNT', 256)
        qc = page[1]
        local ids, qs = {}, {}
        for i = 1, #page[2], 2 do
          local q = num(page[2][i + 1])
          if q and q > now then ids[#ids + 1], qs[#ids + 1] = page[2][i], q end
        end
        budget = budget - math.max(#page[2] / 2, 1)
        if #ids > 0 then
          for i, ip in ipairs(redis.call('HMGET', EXITS, unpack(ids))) do
            if ip then exit_ban(XBASE, ip, {ids[i]}, qs[i]) end
          end
        end
      until qc == '0' or budget <= 0
      if qc ~= '0' then
        redis.call('HSET', KEYS[5], 'exitidx', 'q|' .. qc)
        return false
      end
      st = 's|0|0'
    end
    local rank, bc = string.match(st, '^s|(%d+)|(%d+)$')
    rank = tonumber(rank) or 0
    bc = bc or '0'
    while budget > 0 do
      local site = redis.call('ZRANGE', KEYS[4], rank, rank)[1]
      if not site then
        redis.call('HSET', KEYS[5], 'exitidx', 'done')
        return true
      end
      local fk = XBASE .. ':free:' .. site
      local page = redis.call('ZSCAN', fk, bc, 'COUNT', 256)
      bc = page[1]
      local ids = {}
      for i = 1, #page[2], 2 do
        local sc = num(page[2][i + 1])
        local id = string.match(page[2][i], '^(.*):%d+$')
        if id and sc and sc > now then ids[#ids + 1] = id end
      end
      budget = budget - math.max(#page[2] / 2, 1)
      if #ids > 0 then
        local by, ttl = {}, redis.call('PTTL', fk)
        for i, ip in ipairs(redis.call('HMGET', EXITS, unpack(ids))) do
          if ip then
            by[ip] = by[ip] or {}
            table.insert(by[ip], ids[i])
          end
        end
        for ip, es in pairs(by) do exit_mark(XBASE, site, ip, es, ttl) end
      end
      if bc == '0' then rank = rank + 1 end
    end
    redis.call('HSET', KEYS[5], 'exitidx', 's|' .. rank .. '|' .. bc)
    return false
  end
  built = migrate()
  -- An entry whose exit was recorded or changed (exit_note.lua's "x" sweep
  -- event) is named in the site's index of its IP when the site applies the
  -- event: with exits, a call applies the pending events before it counts
  -- an IP, and while more are left than one call applies, no count is sure.
  sweep()

  -- dead_kept records dead entry e on the site (dead_mark: its slots out go
  -- to DEAD) and reports whether one of its slots is leased still (a lease
  -- taken before its death): then it stays in the site's exit index, which
  -- holds it again if revive.lua brings it back while that lease runs (out);
  -- else it leaves it (a revived entry's slots at DEAD are free).
  function dead_kept(e)
    dead_mark(e)
    for s = 0, slots - 1 do
      local v = redis.call('HGET', KEYS[3], e .. ':' .. s)
      local exp = v and tonumber(string.match(v, '|(%d+)$'))
      if exp and exp > now then return true end
    end
    return false
  end

  -- entries_read reads, for the entries es (a table, at most READ), their
  -- exit IPs, dead marks (if any proxy is dead), bans on every site (if any)
  -- and their slots' members and scores on the site (sl, scs: K per entry,
  -- in order), in a few batched commands.
  function entries_read(es)
    local at = redis.call('HMGET', EXITS, unpack(es))
    local dead = anydead and redis.call('HMGET', KEYS[6], unpack(es)) or {}
    local qs = anyban and redis.call('ZMSCORE', KEYS[7], unpack(es)) or {}
    local sl = {}
    for _, e in ipairs(es) do
      for s = 0, slots - 1 do sl[#sl + 1] = e .. ':' .. s end
    end
    local scs = {}
    for j = 1, #sl, 4096 do
      local part = redis.call('ZMSCORE', KEYS[2], unpack(sl, j, math.min(j + 4095, #sl)))
      for x = 1, #part do scs[j + x - 1] = part[x] end
    end
    return at, dead, qs, sl, scs
  end

  -- ip_count counts the slots out on the site of the entries of exit IP ip,
  -- from the two indexes (lib.lua): each entry banned on every site holds K
  -- (the IP's ban index, entries whose noted end is ahead; once K are
  -- counted there, the site's index is not read), each other entry the
  -- slots it has out there (the site's index); dead entries hold none. An
  -- entry gone to another IP or with nothing out any more leaves the index
  -- it was read from, and so does a dead one (but from the site's index
  -- while a lease of it runs: dead_kept). Returns that count, the soonest
  -- time one of the slots counted comes back (nil for none), and whether
  -- the count is sure: false when an index held more than READ entries to
  -- look at and fewer than K were found out among those read (those read
  -- that were stale are gone: the next call goes further), or while the
  -- indexes are being built (migrate). Bounded work: two index reads of
  -- READ entries and K slots each, whatever the IP's size.
  -- First, the IP's holds (exit_note.lua: what an entry that left the IP
  -- earned there, in the IP holds zset XHOLD, "<IP>" on every site and
  -- "<site>|<IP>" on this one): while the later of them is ahead, the IP
  -- counts as out, all its K slots, until then (sure: no index is read;
  -- a fourth result, true, tells that the time is a hold's end).
  -- The zset lives until its latest hold ends (exit_note.lua): one EXISTS
  -- per call tells a pool without holds (most calls) to read none.
  local any_hold -- whether the IP holds zset exists (read once per call, at the first count)
  function ip_count(ip)
    if any_hold == nil then any_hold = redis.call('EXISTS', XHOLD) == 1 end
    if any_hold then
      local h = redis.call('ZMSCORE', XHOLD, ip, ARGV[1] .. '|' .. ip)
      local held = math.max(num(h[1]) or 0, num(h[2]) or 0)
      if held > now then return slots, held, true, true end
    end
    local n, soonest, sure, counted = 0, nil, true, {}
    if not built or sweep_more then return 0, nil, false end
    local function add(k, sc)
      n = n + k
      if not soonest or sc < soonest then soonest = sc end
    end
    if anyban then
      local bk = XBASE .. ':exitban:' .. ip
      local es = redis.call('ZRANGE', bk, '(' .. nows, '+inf', 'BYSCORE', 'LIMIT', 0, READ)
      if #es > 0 then
        local qs = redis.call('ZMSCORE', KEYS[7], unpack(es))
        local at = redis.call('HMGET', EXITS, unpack(es))
        local dead = anydead and redis.call('HMGET', KEYS[6], unpack(es)) or {}
        local stale = {}
        for i, e in ipairs(es) do
          local q = num(qs[i])
          if at[i] ~= ip or dead[i] or not q or q <= now then
            stale[#stale + 1] = e -- (a dead entry's ban: revive.lua names it again)
          elseif n < slots then
            counted[e] = true
            add(slots, q)
          end
        end
        if #stale > 0 then redis.call('ZREM', bk, unpack(stale)) end
        if #es == READ and n < slots then sure = false end
      end
    end
    if n >= slots or not sure then return n, soonest, sure end
    local ms = redis.call('ZRANGEBYLEX', XOUT, '[' .. ip .. '|', '(' .. ip .. '}', 'LIMIT', 0, READ)
    if #ms == 0 then return n, soonest, sure end
    local es, mine = {}, {}
    for i, m in ipairs(ms) do
      local mip, e = string.match(m, '^(.*)|([^|]*)$')
      if mip == ip then
        es[#es + 1] = e
        mine[#es] = m
      end
    end
    if #es == 0 then return n, soonest, sure end
    local at, dead, qs, sl, scs = entries_read(es)
    local stale = {}
    for i, e in ipairs(es) do
      local q, any = nil, false
      if at[i] ~= ip then
        any = nil
      elseif dead[i] then
        any = dead_kept(e)
      else
        q = num(qs[i])
        for s = 1, slots do
          local k = (i - 1) * slots + s
          local sc = num(scs[k]) or 0
          if sc >= DEAD then sc = out(sl[k], e) end
          if q and q > sc then sc = q end
          if sc > now then
            any = true
            if not counted[e] then add(1, sc) end
          end
        end
      end
      if not any then stale[#stale + 1] = mine[i] end
    end
    if #stale > 0 then redis.call('ZREM', XOUT, unpack(stale)) end
    if #ms == READ and n < slots then sure = false end
    return n, soonest, sure
  end

  -- index_trim checks n entries of the site's exit index at random, and drops
  -- those with nothing out there, gone to another IP, or dead (but while a
  -- lease taken before the death runs: dead_kept), so that the index of a
  -- site leased without pause holds about what is out, not every entry ever
  -- leased there (an IP read again is swept by ip_count). A grant that adds
  -- an entry runs it: an index grows by one entry at most per grant.
  function index_trim(n)
    local ms = redis.call('ZRANDMEMBER', XOUT, n)
    local es, ips = {}, {}
    for _, m in ipairs(ms) do
      local ip, e = string.match(m, '^(.*)|([^|]*)$')
      if e then
        es[#es + 1], ips[#es + 1] = e, ip
      end
    end
    if #es == 0 then return end
    local at, dead, qs, sl, scs = entries_read(es)
    local stale = {}
    for i, e in ipairs(es) do
      local gone = at[i] ~= ips[i]
      if not gone and dead[i] then
        gone = not dead_kept(e)
      elseif not gone and not (num(qs[i]) and num(qs[i]) > now) then
        gone = true
        for s = 1, slots do
          local k = (i - 1) * slots + s
          local sc = num(scs[k]) or 0
          if sc >= DEAD then sc = out(sl[k], e) end
          if sc > now then gone = false end
        end
      end
      if gone then stale[#stale + 1] = ips[i] .. '|' .. e end
    end
    if #stale > 0 then redis.call('ZREM', XOUT, unpack(stale)) end
  end
end

-- exit_out returns nil when proxy id has no known exit (and true: its
-- exit is unknown), or fewer than K slots of the entries of its exit IP
-- are out on the site; else the time the soonest of them comes back (1 ms
-- from now when the count was not sure: see ip_count). Its third result is
-- the IP, its fourth true when the IP is held (exit_note.lua's IP holds:
-- the time is the hold's end, not a lease's). Each IP is counted once per call (ip_out), again after a grant
-- to one of its entries.
local ip_out = {}
local function exit_out(id)
  if not exits_on then return nil end
  local ip = redis.call('HGET', EXITS, id)
  if not ip then return nil, true end
  local memo = ip_out[ip]
  if not memo then
    memo = {ip_count(ip)}
    ip_out[ip] = memo
  end
  if not memo[3] then return now + 1, false, ip end
  if memo[1] < slots then return nil, false, ip end
  return memo[2], false, ip, memo[4]
end

-- try returns the first free slot of proxy id on the site (member), or nil
-- and the time until which the proxy is out; held: until when an entry
-- free but for its unknown exit is out (strict exits), or nil.
local function try(id, held)
  local x, unknown, ip = exit_out(id) -- first: the IP's count read once per call
  if x then return nil, x end
  local d = is_dead(id)
  if d then return nil, d end
  local soonest, free = nil, {}
  for s = 0, slots - 1 do
    local m = id .. ':' .. s
    local sc = out(m, id)
    if sc <= now then
      free[#free + 1] = m
    elseif not soonest or sc < soonest then
      soonest = sc
    end
  end
  if #free == 0 then return nil, soonest end
  local b = banned(id, free)
  if b then
    -- A ban recorded on the site's busy set: the IP's index names it.
    if ip and b < DEAD then exit_mark(XBASE, ARGV[1], ip, {id}, idle) end
    return nil, b
  end
  if unknown and held then return nil, held end
  return free[1]
end

local member, url
-- A preferred proxy (same IP across a redirect chain or a session) wins if free.
if ARGV[7] ~= '' and hold <= now then
  local held = strict_hold
  if ARGV[8] == 'x' then held = nil end
  local m = try(ARGV[7], held)
  if m then
    url = redis.call('HGET', KEYS[1], ARGV[7])
    if url then member = m end
  end
end

-- Only the preferred proxy will do: wait for its soonest slot. firm is 1
-- unless that slot is leased by a request, which may end early: a session
-- (token "s:..."), a quarantine, a cooldown or an IP hold (exit_note.lua)
-- end at the score, not before.
if not member and ARGV[8] == '1' then
  if redis.call('HEXISTS', KEYS[1], ARGV[7]) == 0 then return {-2} end
  if redis.call('HEXISTS', KEYS[6], ARGV[7]) == 1 then return {-2} end
  if hold > now then return {0, hold - now, 1} end
  local soonest, firm
  for s = 0, slots - 1 do
    local m = ARGV[7] .. ':' .. s
    local score = out(m, ARGV[7])
    if not soonest or score < soonest then
      soonest, firm = score, 1
      local tok, exp = string.match(redis.call('HGET', KEYS[3], m) or '', '^(.*)|(%d+)$')
      if tok and string.sub(tok, 1, 2) ~= 's:' and tonumber(exp) == score then firm = 0 end
    end
  end
  local q = num(redis.call('ZSCORE', KEYS[7], ARGV[7]))
  if q and q > soonest then soonest, firm = q, 1 end
  if soonest and soonest <= now then
    -- Its own slot is free: another entry of its exit IP holds the IP.
    -- Firm when that is an IP hold (exit_note.lua), which ends at its
    -- score as a quarantine does; not when it is another entry's lease.
    local x, unk, _, iph = exit_out(ARGV[7])
    if not x and unk then x = strict_hold end
    if x then soonest, firm = x, iph and 1 or 0 end
  end
  if not soonest or soonest >= DEAD then return {-2} end
  return {0, math.max(soonest - now, 1), firm}
end

-- A pool written without its order (by hand, or before the order existed:
-- no "index" mark in the meta hash; pool_update.lua and pool_seed.lua
-- write both) is put in order here, one bounded page per lease.
-- (The mark is a scan cursor: any other value, a corrupt one, starts the
-- scan over, which only adds what is missing.)
if meta[4] ~= 'done' then
  local page = redis.call('HSCAN', KEYS[1], string.match(meta[4] or '', '^%d+$') or '0', 'COUNT', 200)
  local ids = {}
  for i = 1, #page[2], 2 do ids[#ids + 1] = page[2][i] end
  order_add(KEYS[9], KEYS[5], ids)
  if page[1] == '0' then page[1] = 'done' end
  redis.call('HSET', KEYS[5], 'index', page[1])
end

-- all_out is the soonest score of the site's busy set when it covers every
-- slot of the pool (out on the site, or dead), else nil: a saturated pool
-- answers a wait at once, not after looking at SCAN busy proxies. Under
-- strict exits the entries with no exit are out too: as many as the pool
-- has entries more than exits recorded, counted with the dead (the larger
-- of the two, as they may be the same entries: never more out than are),
-- and the wait is at most the hold's.
--
-- The busy set may still count, below DEAD, slots of proxies that died
-- since on another site (dead_mark) or left the pool (sweep): before
-- it answers a wait, a bounded sample of each is recorded, and the set
-- counted again.
local function all_out()
  local dead = redis.call('HLEN', KEYS[6])
  local gone = dead
  if strict_hold then gone = math.max(dead, redis.call('HLEN', KEYS[1]) - redis.call('HLEN', EXITS)) end
  local total = redis.call('HLEN', KEYS[1]) * slots
  local function outs() return redis.call('ZCOUNT', KEYS[2], '(' .. nows, '(' .. DEAD) + gone * slots end
  if outs() < total then return nil end
  local moved = sweep()
  if dead > 0 then
    for _, id in ipairs(redis.call('HRANDFIELD', KEYS[6], math.max(1, math.floor(DEAD_SAMPLE / slots)))) do
      if dead_mark(id) then moved = true end
    end
  end
  if moved and outs() < total then return nil end
  local head = redis.call('ZRANGE', KEYS[2], '(' .. nows, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  local soon = head[2] and num(head[2])
  if gone > dead then soon = math.min(soon or strict_hold, strict_hold) end
  return soon or now + 1
end

if exits_on then
  -- IPS bounds the exit IPs exit_all_out counts; EXITSCAN the entries one
  -- call of it scans for an exit (in pages of 512).
  local IPS, EXITSCAN = 64, 2048

  -- exit_all_out is, for a pool whose entries all leave from recorded exit
  -- IPs (or are held for having none: strict exits), of at most IPS IPs,
  -- the soonest time one of them comes back when every IP has its K slots
  -- out on the site; else nil. It answers the wait of a pool saturated by
  -- its IPs, which all_out (counting slots) cannot see, with bounded work:
  -- ip_count for each IP (shared with the rotation's), the exit IPs zset
  -- ("<base>:exitips", IP -> its entries: exit_note.lua), whose counts must
  -- add up to the exit hash's (else nil: an IP may be missing), and, without
  -- strict exits, the meta's "exitall" mark: "<version>|done|<proxies>"
  -- once a scan of the pool (EXITSCAN entries per call, at this version of
  -- the pool) found an exit for every entry, "<version>|miss" when
  -- one had none (exit_note.lua deletes the mark when it records a first
  -- exit or forgets one), else "<version>|<HSCAN cursor>" while the scan runs.
  function exit_all_out()
    local vs = string.format('%.0f', version)
    if not strict then
      local mark = meta[6] or ''
      local v, rest = string.match(mark, '^(%d+)|(.*)$')
      if v ~= vs then rest = '0' end
      if rest == 'miss' then return nil end
      local size = string.match(rest, '^done|(%d+)$')
      if size then
        if tonumber(size) ~= redis.call('HLEN', KEYS[1]) then
          rest = '0'
        end
      end
      if not size or rest == '0' then
        if not string.match(rest, '^%d+$') then rest = '0' end
        local nxt, seen_ = rest, 0
        repeat
          local page = redis.call('HSCAN', KEYS[1], nxt, 'COUNT', 512)
          local ids = {}
          for i = 1, #page[2], 2 do ids[#ids + 1] = page[2][i] end
          nxt, seen_ = page[1], seen_ + #ids
          if #ids > 0 then
            for _, ip in ipairs(redis.call('HMGET', EXITS, unpack(ids))) do
              if not ip then nxt = 'miss' end
            end
          end
        until nxt == '0' or nxt == 'miss' or seen_ >= EXITSCAN
        if nxt == '0' then nxt = 'done|' .. redis.call('HLEN', KEYS[1]) end
        redis.call('HSET', KEYS[5], 'exitall', vs .. '|' .. nxt)
        meta[6] = vs .. '|' .. nxt
        if nxt == 'miss' or string.sub(nxt, 1, 5) ~= 'done|' then return nil end
      end
    end
    local xk = XBASE .. ':exitips'
    if redis.call('ZCARD', xk) > IPS then return nil end
    local ips = redis.call('ZRANGE', xk, 0, -1, 'WITHSCORES')
    local sum, soon = 0, nil
    for i = 1, #ips, 2 do sum = sum + (num(ips[i + 1]) or 0) end
    if sum ~= redis.call('HLEN', EXITS) then return nil end
    for i = 1, #ips, 2 do
      local ip = ips[i]
      local memo = ip_out[ip]
      if not memo then
        memo = {ip_count(ip)}
        ip_out[ip] = memo
      end
      if not memo[3] or memo[1] < slots or not memo[2] then return nil end
      if not soon or memo[2] < soon then soon = memo[2] end
    end
    if strict_hold and redis.call('HLEN', KEYS[1]) > sum then soon = math.min(soon or strict_hold, strict_hold) end
    return soon
  end
end

-- rotate walks the rotation from the cursor (place) to the first proxy with
-- a slot free, up to SCAN proxies per call in all, wrapping once: it returns
-- that slot and the proxy's URL, and moves place to the proxy; or nil, the
-- reply of a call that grants nothing, and the place the cursor may move to
-- (nil: stay) when only part of the pool was looked at.
local seen = 0
local function rotate()
  if seen >= SCAN then return nil, {0, 1} end
  local first, soonest, last, whole = seen, nil, nil, false
  local from, to, wrapped = '(' .. place_s, '+inf', false
  while seen < SCAN do
    -- The first page is short: the next proxy of the rotation is the one
    -- least recently used on the site, most often free.
    local n = math.min(seen == first and 4 or 16, SCAN - seen)
    local ids = redis.call('ZRANGE', KEYS[9], from, to, 'BYSCORE', 'LIMIT', '0', tostring(n), 'WITHSCORES')
    for i = 1, #ids, 2 do
      seen = seen + 1
      last = ids[i + 1]
      local m, w = try(ids[i], strict_hold)
      if m then
        local u = redis.call('HGET', KEYS[1], ids[i])
        if u then
          place, place_s = num(last), last
          return m, u
        end
      else
        if w and (not soonest or w < soonest) then soonest = w end
        if seen == 1 then
          local full = all_out()
          if full then return nil, {0, math.max(full - now, 1)} end
        end
      end
    end
    if #ids < 2 * n then
      if wrapped or place <= 0 then
        whole = true
        break
      end
      -- Past the end of the order: once more from its start, up to the cursor.
      wrapped, from, to = true, '-inf', place_s
    else
      from = '(' .. last
    end
  end
  if seen == first then
    if redis.call('HLEN', KEYS[1]) == 0 then return nil, empty() end
    return nil, {0, 1} -- an order not written yet (pool_update.lua writes it with the pool)
  end
  if not whole then
    -- Only part of the pool looked at: out everywhere only if the busy
    -- set covers every slot of the pool (all_out found it did not at the
    -- first proxy) or every exit IP is out (exit_all_out); else move on
    -- and come back soon.
    local full = exits_on and exit_all_out()
    if full then return nil, {0, math.max(full - now, 1)}, num(last) end
    return nil, {0, 1}, num(last)
  end
  if not soonest then return nil, {0, 1} end
  return nil, {0, math.max(soonest - now, 1)}
end

local expiry = now + ttl
local exps = string.format('%.0f', expiry)
-- grant leases slot m to token tok, at once (a later rotation of the same
-- call sees it out).
local function grant(m, tok)
  redis.call('ZADD', KEYS[2], exps, m)
  if exits_on then
    local id = string.match(m, '^(.*):%d+$')
    local ip = redis.call('HGET', EXITS, id)
    if ip then
      -- The site's index names the entry; one it did not name yet (the
      -- index may be new: its TTL) has two others checked.
      ip_out[ip] = nil
      if exit_mark(XBASE, ARGV[1], ip, {id}) > 0 then
        redis.call('PEXPIRE', XOUT, idle)
        index_trim(2)
      end
    end
  end
  redis.call('HSET', KEYS[3], m, tok .. '|' .. exps)
  -- Pacing with K > 1: no other slot of this proxy may start before the cooldown.
  if cooldown > 0 and slots > 1 then
    local id = string.match(m, '^(.*):%d+$')
    for s = 0, slots - 1 do
      local o = id .. ':' .. s
      if o ~= m then redis.call('ZADD', KEYS[2], 'GT', now + cooldown, o) end
    end
  end
end

local reply = {2, version, expiry, 0}
if member then
  grant(member, ARGV[2])
else
  if hold > now then return {0, hold - now} end
  local r, moved
  member, r, moved = rotate()
  if not member then
    if moved then
      redis.call('HSET', KEYS[10], ARGV[1], string.format('%.0f', moved) .. '|' .. booked)
    end
    return r
  end
  url = r
  grant(member, ARGV[2])
  for i = 2, want do
    local m, u = rotate()
    if not m then
      reply[4] = u[1] == 0 and u[2] or 1 -- the wait of the tokens left
      break
    end
    grant(m, ARGV[9 + i])
    reply[#reply + 1], reply[#reply + 2] = m, u
  end
  fresh = true -- the cursor moved
end
if fresh then
  redis.call('HSET', KEYS[10], ARGV[1], string.format('%.0f', place) .. '|' .. booked)
end
if booked == now then -- the bookkeeping above: the keys may be new
  redis.call('PEXPIRE', KEYS[2], idle)
  redis.call('PEXPIRE', KEYS[3], idle)
  if exits_on then redis.call('PEXPIRE', XOUT, idle) end -- the site's exit index lives as long
end
-- A call with further tokens answers in the form of many grants even when
-- it granted one (a half-open breaker's probe): the one is ARGV[2]'s, the
-- other tokens wait.
if #ARGV <= 10 then return {1, member, url, expiry, version} end
table.insert(reply, 5, url)
table.insert(reply, 5, member)
return reply
