-- pool_update.lua: add, remove or replace proxies of one pool, rotate a
-- gateway's session, and carry the change into every site's keys so it
-- takes effect on the next lease everywhere. "replace" and "rotate" are
-- atomic (the Go side sends "replace" for small pools only); "add" and
-- "remove" do bounded work per call and report how many entries they
-- consumed, so that a large change goes in several calls.
--
-- KEYS[1] pool hash   id -> proxy URL
-- KEYS[2] sites zset  site -> unix ms of its last lease
-- KEYS[3] meta hash   "slots" -> concurrent requests per proxy per site; "version" ->
--         generation of the pool (lib.lua's bump_version); "emptied" -> 1 while
--         the pool is empty on purpose; "seq" (lib.lua's order_add)
-- KEYS[4] dead hash, KEYS[5] fails hash, KEYS[6] quarantine zset (see penalize.lua):
--         a removed proxy leaves no ban state behind
-- KEYS[7] order zset  id -> its place in the rotation (lease.lua, lib.lua's order_add):
--         every proxy added (a rotated-in session too) gets a place, a removed one leaves
-- KEYS[8] cursor hash site -> the site's place in the order (lease.lua)
-- KEYS[9] gateways hash  id -> gateway template ("{session}" in its user info):
--         the pool's virtual proxies, one provider session each (gateway.go)
-- KEYS[10] labels hash   id -> "k=v,k=v" (labels.go): set by add and replace for
--         every entry given (an empty one deletes), removed with the proxy,
--         carried over by rotate
-- ARGV[1] mode: "add" | "remove" | "replace" | "rotate" | "done" (no entries:
--         only the generation and the "emptied" mark below)
-- ARGV[2] key prefix of the per-site keys ("{prefix:pool}"); the busy set of
--         site S is ARGV[2]..":free:"..S, its lease hash ARGV[2]..":lease:"..S,
--         its strikes hash ARGV[2]..":strikes:"..S
--         (same hash tag, hence same cluster slot as KEYS; checked)
--         Why a prefix and not KEYS: the sites are those of KEYS[2], read
--         here, atomically, with the change.
-- ARGV[3] idle TTL ms: sites not leased for that long are forgotten
-- ARGV[4] "1": earlier calls of the same change changed the pool; "0": none
-- ARGV[5..] add/replace: id, URL, template, size, labels, ... (template "" and
--           size "" for a plain proxy, labels "" for none). A gateway's
--           candidates carry its template and its size N: the pool keeps N
--           members of that template, the ones it has first, and takes
--           candidates only for the missing ones (add never removes; a
--           gateway's candidates may come over several "add" calls, N
--           counting the members the earlier calls added)
--           remove: id, id, ... (an id "gw:<template>" names every member of
--           that gateway; a gateway larger than one call's bound is removed
--           over several calls, the entry consumed with its last member)
--           rotate: old id, new id, new URL, member, token: the old member,
--           a virtual proxy banned on a site, gives way to a new session of
--           its gateway (only if it is still in the pool: a second worker
--           banning it finds it gone and changes nothing). The lease member
--           of token (the banned request's) ends; other live leases of the old
--           proxy are left to their holders (the old proxy left the order,
--           so no lease offers it again; release.lua ends them as usual)
--
-- Work bound: "add" takes at most BUDGET entries per call, "remove" at most
-- BUDGET slots of site keys (at least one proxy is always done). A
-- gateway's members are counted from the gateways hash (one HGETALL) in
-- calls that name a template. When a call consumed every entry and the
-- change (this call or, ARGV[4], the ones before) changed the pool, the
-- generation moves (bump_version) and the "emptied" mark is set or cleared:
-- Switches watching the pool (snapshot.go) see one change. A call that
-- changed labels (and nothing else counts them in ARGV[4]) moves it too.
--
-- Returns {added, removed, size after, entries consumed}.
local now = now_ms()
local base, badbase = pool_prefix(ARGV[2])
if not base then return redis.error_reply(badbase) end
local mode, idle = ARGV[1], tonumber(ARGV[3])
local slots = meta_slots(KEYS[3], 1)
local BUDGET = 500
local E = 5 -- ARGV items per add/replace entry

-- Sites idle past the idle TTL are forgotten (a bounded step per call).
local stale = redis.call('ZRANGE', KEYS[2], '-inf', now - idle, 'BYSCORE', 'LIMIT', 0, 100)
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
  redis.call('HDEL', KEYS[8], unpack(stale))
end
local sites = {}
if mode == 'remove' or mode == 'replace' or mode == 'rotate' then
  for _, s in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    sites[#sites + 1] = s
  end
end

-- many runs cmd on key with the items of list, 1000 at a time; returns the
-- sum of the replies.
local function many(cmd, key, list)
  local n = 0
  for i = 1, #list, 1000 do
    n = n + redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
  end
  return n
end

-- label_all gives each id of ids the labels of labels (same index; '' for
-- none) and counts in relabelled those whose labels changed, so that a
-- change of labels alone moves the generation too (the copy every Switch
-- keeps, snapshot.go, holds the labels; a re-seed must not bring old ones back).
local relabelled = 0
local function label_all(ids, labels)
  local set, del = {}, {}
  for i = 1, #ids, 1000 do
    local j = math.min(i + 999, #ids)
    local old = redis.call('HMGET', KEYS[10], unpack(ids, i, j))
    for k = i, j do
      local want = labels[k]
      if (old[k - i + 1] or '') ~= want then
        relabelled = relabelled + 1
        if want ~= '' then
          set[#set + 1] = ids[k]
          set[#set + 1] = want
        else
          del[#del + 1] = ids[k]
        end
      end
    end
  end
  many('HSET', KEYS[10], set)
  many('HDEL', KEYS[10], del)
end

-- add_all adds the entries {id, URL, labels} of list: new ids get their
-- place in the order (lib.lua's order_add; those already there keep
-- theirs), every id the labels given. Returns the number of proxies new to
-- the pool.
local function add_all(list)
  if #list == 0 then return 0 end
  local kv, ids, labels = {}, {}, {}
  for _, e in ipairs(list) do
    kv[#kv + 1] = e[1]
    kv[#kv + 1] = e[2]
    ids[#ids + 1] = e[1]
    labels[#labels + 1] = e[3]
  end
  local added = many('HSET', KEYS[1], kv)
  label_all(ids, labels)
  order_add(KEYS[7], KEYS[3], ids)
  return added
end

-- remove_all takes the ids of list out of the pool, the order, the
-- gateways and labels hashes and every site's keys: a few commands per key
-- for the whole list. With keep_live, slots leased until later than now
-- stay with their holders (but the lease of member mine, owned by token),
-- to be released as usual. Returns how many were in the pool.
local function remove_all(list, keep_live, mine, token)
  if #list == 0 then return 0 end
  local removed = 0
  for i = 1, #list, 1000 do
    local part = {unpack(list, i, math.min(i + 999, #list))}
    removed = removed + redis.call('HDEL', KEYS[1], unpack(part))
    redis.call('HDEL', KEYS[4], unpack(part))
    redis.call('HDEL', KEYS[5], unpack(part))
    redis.call('ZREM', KEYS[6], unpack(part))
    redis.call('ZREM', KEYS[7], unpack(part))
    redis.call('HDEL', KEYS[9], unpack(part))
    redis.call('HDEL', KEYS[10], unpack(part))
    local ms = {}
    for _, id in ipairs(part) do
      for k = 0, slots - 1 do ms[#ms + 1] = id .. ':' .. k end
    end
    for _, s in ipairs(sites) do
      local lk = base .. ':lease:' .. s
      redis.call('HDEL', base .. ':strikes:' .. s, unpack(part))
      local gone = ms
      if keep_live then
        gone = {}
        for _, m in ipairs(ms) do
          local tok, exp = string.match(redis.call('HGET', lk, m) or '', '^(.*)|(%d+)$')
          if not (tok and tonumber(exp) > now and not (m == mine and tok == token)) then gone[#gone + 1] = m end
        end
      end
      many('ZREM', base .. ':free:' .. s, gone)
      many('HDEL', lk, gone)
    end
  end
  return removed
end

-- members returns the ids the pool holds of each template (of want, a set,
-- or every one), sorted.
local function members(want)
  local out = {}
  local kv = redis.call('HGETALL', KEYS[9])
  for i = 1, #kv, 2 do
    local t = kv[i + 1]
    if (not want or want[t]) and redis.call('HEXISTS', KEYS[1], kv[i]) == 1 then
      out[t] = out[t] or {}
      table.insert(out[t], kv[i])
    end
  end
  for _, ids in pairs(out) do table.sort(ids) end
  return out
end

-- entries reads the add/replace entries of ARGV[5..last]: the plain ones
-- {id, URL, labels}, and the candidates of each gateway template (in the
-- order given) with its size. Returns them, or nil and an error reply.
local function entries(last)
  local g = {plain = {}, cands = {}, templates = {}, size = {}}
  for i = 5, last, E do
    local e = {ARGV[i], ARGV[i + 1], ARGV[i + 4] or ''}
    local t = ARGV[i + 2] or ''
    if t == '' then
      g.plain[#g.plain + 1] = e
    else
      if not g.cands[t] then
        local n = tonumber(ARGV[i + 3])
        if not n or n < 1 then return nil, redis.error_reply('PSCONFIG gateway entry without its size') end
        g.cands[t], g.size[t] = {}, n
        g.templates[#g.templates + 1] = t
      end
      table.insert(g.cands[t], e)
    end
  end
  return g
end

-- gateways adds the candidates each template of g still needs (have:
-- members()), gives the sessions kept the entry's labels, and returns how
-- many it added.
local function gateways(g, have)
  local added = 0
  for _, t in ipairs(g.templates) do
    local n = #(have[t] or {})
    local labels, each = g.cands[t][1][3], {}
    for _ in ipairs(have[t] or {}) do each[#each + 1] = labels end
    label_all(have[t] or {}, each)
    local take, tags = {}, {}
    for _, e in ipairs(g.cands[t]) do
      if n >= g.size[t] then break end
      if redis.call('HEXISTS', KEYS[1], e[1]) == 0 then
        take[#take + 1] = e
        tags[#tags + 1] = e[1]
        tags[#tags + 1] = t
        n = n + 1
      end
    end
    added = added + add_all(take)
    many('HSET', KEYS[9], tags)
  end
  return added
end

local function templates_of(g)
  local set = {}
  for _, t in ipairs(g.templates) do set[t] = true end
  return set
end

-- An empty pool's order is complete: lease.lua need not index it.
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('HSET', KEYS[3], 'index', 'done') end

-- The work bound: at most BUDGET slots of site keys touched (removals), or
-- BUDGET entries added, per call.
local added, removed, consumed, total = 0, 0, 0, #ARGV - 4
if mode == 'add' then
  total = math.floor(total / E)
  consumed = math.min(total, BUDGET)
  local g, err = entries(4 + E * consumed)
  if not g then return err end
  added = add_all(g.plain)
  if #g.templates > 0 then added = added + gateways(g, members(templates_of(g))) end
elseif mode == 'remove' then
  local cap = math.max(1, math.floor(BUDGET / math.max(1, #sites * slots)))
  local list, have = {}, nil
  for i = 5, #ARGV do
    local t = string.match(ARGV[i], '^gw:(.*)$')
    if t then
      have = have or members()
      local ids = have[t] or {}
      local room = cap - #list
      if #ids > room then
        -- Part of the gateway now (all of the room, or one member if
        -- nothing else is done in this call), the rest in the next call.
        if #list == 0 then
          for j = 1, math.max(room, 1) do list[#list + 1] = ids[j] end
        end
        break
      end
      for _, id in ipairs(ids) do list[#list + 1] = id end
    else
      if #list >= cap then break end
      list[#list + 1] = ARGV[i]
    end
    consumed = consumed + 1
  end
  removed = remove_all(list)
elseif mode == 'replace' then
  total = math.floor(total / E)
  local g, err = entries(#ARGV)
  if not g then return err end
  local keep = {}
  for _, e in ipairs(g.plain) do keep[e[1]] = true end
  local have = members(templates_of(g))
  for _, t in ipairs(g.templates) do
    for j, id in ipairs(have[t] or {}) do
      if j <= g.size[t] then keep[id] = true end
    end
  end
  local drop = {}
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then drop[#drop + 1] = id end
  end
  removed = remove_all(drop)
  added = add_all(g.plain)
  if #g.templates > 0 then added = added + gateways(g, members(templates_of(g))) end
  consumed = total
elseif mode == 'rotate' then
  local old, t = ARGV[5], redis.call('HGET', KEYS[9], ARGV[5])
  if t and redis.call('HEXISTS', KEYS[1], old) == 1 and redis.call('HEXISTS', KEYS[1], ARGV[6]) == 0 then
    local labels = redis.call('HGET', KEYS[10], old) or ''
    removed = remove_all({old}, true, ARGV[8], ARGV[9])
    added = add_all({{ARGV[6], ARGV[7], labels}})
    redis.call('HSET', KEYS[9], ARGV[6], t)
  end
  consumed = total
elseif mode ~= 'done' then
  return redis.error_reply('PSCONFIG unknown pool update mode ' .. mode)
end
-- What every Switch watches (snapshot.go, fallback.go): the generation of
-- the pool, and whether it was emptied on purpose: an empty pool without
-- that mark was lost by Redis, and a Switch re-seeds it (pool_seed.lua).
local size = redis.call('HLEN', KEYS[1])
if consumed >= total then
  if added + removed + relabelled > 0 or ARGV[4] == '1' then bump_version(KEYS[3]) end
  if size == 0 then
    redis.call('HSET', KEYS[3], 'emptied', '1')
  else
    redis.call('HDEL', KEYS[3], 'emptied')
  end
end
if consumed < total and relabelled > 0 then bump_version(KEYS[3]) end -- not counted by ARGV[4]
return {added, removed, size, consumed}
