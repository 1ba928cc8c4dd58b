-- exit_note.lua: record the exit IPs of a pool's proxies (probe.Checker
-- with Exits), and, when a proxy's exit changes, hold its old IP for what
-- the proxy earned there (the IP holds, below).
--
-- KEYS[1] exit hash   id -> exit IP; each IP's entries in the set "<KEYS[1]>:<IP>"
-- KEYS[2] sites zset  site -> unix ms of its last lease
-- KEYS[3] meta hash   "slots"; "exit_changes", the exit changes counted so far
-- KEYS[4] pool hash   id -> proxy URL
-- ARGV[1] key prefix "{prefix:pool}" (lib.lua's pool_prefix): the busy set
--         and the lease hash of site S are ARGV[1]..":free:"..S and
--         ARGV[1]..":lease:"..S, the quarantine zset ARGV[1]..":quarantine",
--         the dead hash ARGV[1]..":dead"; the exit indexes (lib.lua's
--         exit_mark, exit_ban), the IP counts ARGV[1]..":exitips" (IP ->
--         its entries, for lease.lua's exit_all_out) and the IP holds
--         ARGV[1]..":exithold" (below) are kept here too
-- ARGV[2], ARGV[3], ... pairs of a proxy ID and its exit IP now; an IP ""
--         forgets the proxy's exit (and so does a proxy no longer in the
--         pool); an IP holds no "|" (the indexes' lex ranges, the holds)
--
-- lease.lua lets the entries of one exit IP have at most the slots of one
-- proxy out on a site at once: each entry's own slots, leased, cooling
-- down or quarantined, hold the IP. When a proxy's exit changes, its own
-- state goes with it to the new IP (it is the same entry), and the old IP
-- keeps what the proxy earned there (carry): the IP itself is held, in the
-- IP holds zset "<prefix>:exithold", member "<site>|<IP>" on one site,
-- "<IP>" on every site, score the hold's end (ms), on each site (the 256
-- last leased) where the proxy's slots rest (cooling down or quarantined,
-- not leased) until they come back, and on every site as long as the
-- proxy's ban on every site lasts. lease.lua counts an IP held there as
-- out (all its K slots) until then, whatever its entries (ip_count). The
-- entries left on the old IP are not written: they are not cooling down
-- nor banned themselves (state reads show them free, as they show an entry
-- whose IP a sibling's lease holds), an entry that comes to the IP later
-- is held with them, and one that leaves it is no longer held by it.
-- Unban of an entry on a site lifts its IP's hold on that site (unban.lua);
-- a hold on every site lasts until its end or Clear. Bounded work: sites x
-- slots for the proxy's rest, one write of at most 257 holds, whatever the
-- old IP's entries (they are not read: SCARD only).
-- A proxy that comes to an IP (first recorded, or changed) is named in its
-- exit indexes where it is out (join: each site through a sweep event). A
-- first exit or a forgotten one deletes the meta's "exitall" (lease.lua's
-- scan for entries without an exit starts over).
--
-- Returns {code 1, old IP 1, code 2, old IP 2, ...}, per pair: 0 unchanged,
-- 1 first recorded, 2 changed (counted in the meta hash's "exit_changes"),
-- 3 forgotten, -1 not in the pool (nothing recorded); old IP "" for none.
local base, badbase = pool_prefix(ARGV[1])
if not base then return redis.error_reply(badbase) end
if #ARGV % 2 ~= 1 then return redis.error_reply('PSARGS want pairs of a proxy ID and an exit IP') end
for i = 3, #ARGV, 2 do
  -- The exit indexes read an IP's members by lex range ("<IP>|<id>").
  if string.find(ARGV[i], '|', 1, true) then return redis.error_reply('PSARGS an exit IP holds no "|"') end
end
local now = now_ms()
local slots = meta_slots(KEYS[3], 1)
local MAX_SITES = 256

-- hold writes the holds hs (a table: score, member, ...; scores as
-- strings) into the IP holds zset, each kept at its latest end (ZADD GT);
-- as many holds whose end passed as it writes, and one more, go (bounded
-- work: what a write adds, it takes away at least), and the zset lives
-- at least until latest (ms), the latest end written.
local holds_key = base .. ':exithold'
local function hold(hs, latest)
  local gone = redis.call('ZRANGE', holds_key, '-inf', string.format('%.0f', now), 'BYSCORE', 'LIMIT', '0',
    string.format('%d', #hs / 2 + 1))
  if #gone > 0 then redis.call('ZREM', holds_key, unpack(gone)) end
  redis.call('ZADD', holds_key, 'GT', unpack(hs))
  local need = latest - now
  if redis.call('PTTL', holds_key) < need then redis.call('PEXPIRE', holds_key, string.format('%.0f', need)) end
end

-- carry holds IP old, which proxy id leaves, on each site where id's own
-- slots rest, until they come back, and on every site as long as id is
-- banned on every site: one hold per such site, one for every site. The
-- old IP's entries are not read (a shared IP may hold thousands); nothing
-- is written when none is left there, or when id has nothing to carry (a
-- proxy that left the pool has no state left). A site's rest that ends
-- no later than the ban adds nothing to it (lease.lua takes the later).
local function carry(id, old)
  local ipk = KEYS[1] .. ':' .. old
  local n = redis.call('SCARD', ipk)
  if n == 0 or (n == 1 and redis.call('SISMEMBER', ipk, id) == 1) then return end -- no entry left there
  local q = num(redis.call('ZSCORE', base .. ':quarantine', id))
  local hs, floor = {}, now -- floor: a site's rest holds past it, or adds nothing
  if q and q > now then
    hs[1], hs[2], floor = string.format('%.0f', q), old, q
  end
  local latest = floor
  for _, site in ipairs(redis.call('ZREVRANGE', KEYS[2], 0, MAX_SITES - 1)) do
    local fk, lk = base .. ':free:' .. site, base .. ':lease:' .. site
    local untl = floor
    for s = 0, slots - 1 do
      local m = id .. ':' .. s
      local sc = num(redis.call('ZSCORE', fk, m))
      if sc and sc > untl and sc < DEAD and redis.call('HEXISTS', lk, m) == 0 then untl = sc end
    end
    if untl > floor then
      hs[#hs + 1] = string.format('%.0f', untl)
      hs[#hs + 1] = site .. '|' .. old
      if untl > latest then latest = untl end
    end
  end
  if #hs > 0 then hold(hs, latest) end
end

-- join has the exit indexes of IP ip (lib.lua's exit_mark, exit_ban) name
-- proxy id, one of its entries now, where it is out: in the IP's ban index
-- while it is banned on every site (not while it is dead: revive.lua names
-- it then), and on each site where a slot of it is out through an "x"
-- event of the sweep zset (lib.lua's sweep_add), which every site applies
-- before it counts an IP (lease.lua). Bounded work: no site is visited.
local function join(id, ip)
  local q = num(redis.call('ZSCORE', base .. ':quarantine', id))
  if q and q > now and redis.call('HEXISTS', base .. ':dead', id) == 0 then exit_ban(base, ip, {id}, q) end
  sweep_add(base, 'x', {id})
end

local ips = base .. ':exitips' -- IP -> its entries (lease.lua's exit_all_out)
local out = {}
for i = 2, #ARGV, 2 do
  local id, ip = ARGV[i], ARGV[i + 1]
  local old = redis.call('HGET', KEYS[1], id)
  local code = 0
  if ip ~= '' and redis.call('HEXISTS', KEYS[4], id) == 0 then
    code, ip = -1, ''
  end
  if old == ip or (not old and ip == '') then
    if code ~= -1 then code = 0 end
  else
    if old then
      carry(id, old)
      if redis.call('SREM', KEYS[1] .. ':' .. old, id) == 1 and redis.call('ZINCRBY', ips, -1, old) + 0 <= 0 then
        redis.call('ZREM', ips, old)
      end
    end
    if ip == '' then
      redis.call('HDEL', KEYS[1], id)
      code = 3
    else
      redis.call('HSET', KEYS[1], id, ip)
      if redis.call('SADD', KEYS[1] .. ':' .. ip, id) == 1 then redis.call('ZINCRBY', ips, 1, ip) end
      join(id, ip)
      if old then
        code = 2
        redis.call('HINCRBY', KEYS[3], 'exit_changes', 1)
      else
        code = 1
      end
    end
    -- A first exit, or one forgotten: lease.lua's scan for entries with
    -- no exit (the meta's "exitall") starts over.
    if code ~= 2 then redis.call('HDEL', KEYS[3], 'exitall') end
  end
  out[#out + 1] = code
  out[#out + 1] = old or ''
end
return out
