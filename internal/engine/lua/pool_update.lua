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
-- KEYS[11] gateway index registry hash  digest -> labels: one field per
--         template with members, digest = redis.sha1hex(template) (a key
--         name never holds a template: it holds credentials); its value is
--         the labels every member of the template carries (or is being
--         given: KEYS[12]). The template's members are the index zset
--         ARGV[2]..":gw:"..digest, id -> 0 (first N by ID = first N of the
--         zset), deleted with its last member
-- KEYS[12] relabel hash  digest -> the last id given the template's new
--         labels ("" for none yet), while its members are relabelled in
--         pages (RELABEL per call; "index" calls finish it)
-- ARGV[1] mode: "add" | "remove" | "replace" | "rotate" | "done" (no entries:
--         only the generation and the "emptied" mark below) | "index" (no
--         entries: a page of the index build below, or of relabelling; the
--         "emptied" mark is left alone)
-- ARGV[2] key prefix "{prefix:pool}" (same hash tag, hence same cluster
--         slot as KEYS; checked): the gone zset ARGV[2]..":gone" (id -> a
--         unique rising score, ms x 1000 + a count: the proxies removed,
--         which each site forgets at its next leases, lease.lua's
--         forget_gone), the swept hash ARGV[2]..":swept" (site -> how far
--         it did), and with "rotate" the busy set and lease hash of its scope
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
--           rotate: old id, new id, new URL, member, token, scope: the old
--           member, a virtual proxy banned on a site, gives way to a new
--           session of its gateway (only if it is still in the pool: a
--           second worker banning it finds it gone and changes nothing). The
--           lease member of token on scope (the banned request's) ends; other
--           live leases of the old proxy are left to their holders (the old
--           proxy left the order, so no lease offers it again; release.lua
--           ends them as usual)
--
-- Work bound: "add" and "remove" take at most BUDGET entries per call, and
-- no call visits the sites' keys (a removed proxy is recorded in the gone
-- zset for the sites to forget: remove_all). A
-- gateway's members are counted (ZCARD) and listed (a bounded ZRANGE) from
-- its index zset, and relabelled when its labels change RELABEL at a time
-- (one page per call that names it, the rest by "index" calls): the cost
-- of a call follows its own entries, not the gateway sessions of the pool.
--
-- A pool written before the index existed (a gateways hash, and no
-- "gwindex" mark "done" in the meta hash) is indexed INDEX_PAGE entries of
-- its gateways hash per call (HSCAN, the cursor in "gwindex", as lease.lua
-- builds the order); until that is done, a call that needs a template's
-- members (an add naming a template, a remove of "gw:<template>", a
-- replace) changes nothing else and fails with "PSINDEX": the caller runs
-- "index" calls until the reply's fifth item is 0, then calls again.
--
-- When a call consumed every entry and the
-- change (this call or, ARGV[4], the ones before) changed the pool, the
-- generation moves (bump_version) and the "emptied" mark is set or cleared:
-- Switches watching the pool (snapshot.go) see one change. A call that
-- changed labels (and nothing else counts them in ARGV[4]) moves it too.
--
-- Returns {added, removed, size after, entries consumed, pending}: pending
-- 1 while the index build or a relabelling is not done ("index" calls
-- finish them), else 0.
-- "rotate" adds a sixth item: 1 when the old id is in the pool but no
-- gateway's virtual proxy (a plain proxy: the caller quarantines it), else 0.
local now = now_ms()
local base, badbase = pool_prefix(ARGV[2])
if not base then return redis.error_reply(badbase) end
local mode, idle = ARGV[1], tonumber(ARGV[3])
local slots = meta_slots(KEYS[3], 1)
local BUDGET = 500
local E = 5 -- ARGV items per add/replace entry
local RELABEL = 500 -- members relabelled per call
local INDEX_PAGE = 200 -- gateways hash entries indexed per call (HSCAN COUNT)

-- Sites idle past the idle TTL are forgotten (a bounded step per call),
-- and so are proxies that left the pool that long ago (the gone zset,
-- lease.lua's forget_gone: every site leased since has forgotten them).
local stale = redis.call('ZRANGE', KEYS[2], '-inf', now - idle, 'BYSCORE', 'LIMIT', 0, 100)
if #stale > 0 then
  redis.call('ZREM', KEYS[2], unpack(stale))
  redis.call('HDEL', KEYS[8], unpack(stale))
  redis.call('HDEL', base .. ':swept', unpack(stale))
end
local GONE = base .. ':gone'
local old_gone = redis.call('ZRANGE', GONE, '-inf', string.format('%.0f', (now - idle) * 1000), 'BYSCORE', 'LIMIT', 0, 1000)
if #old_gone > 0 then redis.call('ZREM', GONE, unpack(old_gone)) end
local plain = 0 -- rotate: the old id is in the pool but no gateway's

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

-- digest is the name of template t in keys: its SHA-1 (hex), computed
-- once per call.
local digests = {}
local function digest(t)
  local d = digests[t]
  if not d then
    d = redis.sha1hex(t)
    digests[t] = d
  end
  return d
end

-- index_key is the key of template t's index zset (same hash tag as KEYS).
local function index_key(t) return base .. ':gw:' .. digest(t) end

-- index puts the ids of list, members of template t, in its index and
-- registers the template with labels (its members' labels) unless it is
-- registered.
local function index(t, list, labels)
  if #list == 0 then return end
  redis.call('HSETNX', KEYS[11], digest(t), labels)
  for i = 1, #list, 1000 do
    local args = {}
    for k = i, math.min(i + 999, #list) do
      args[#args + 1] = 0
      args[#args + 1] = list[k]
    end
    redis.call('ZADD', index_key(t), unpack(args))
  end
end

-- forget drops template t from the registry once its index is empty.
local function forget(t)
  if redis.call('EXISTS', index_key(t)) == 0 then
    redis.call('HDEL', KEYS[11], digest(t))
    redis.call('HDEL', KEYS[12], digest(t))
  end
end

-- unindex takes the ids of list (at most 1000) out of the index of their
-- templates (one HMGET of the gateways hash).
local function unindex(list)
  local ts = redis.call('HMGET', KEYS[9], unpack(list))
  local of = {}
  for k, t in ipairs(ts) do
    if t then
      of[t] = of[t] or {}
      table.insert(of[t], list[k])
    end
  end
  for t, ids in pairs(of) do
    redis.call('ZREM', index_key(t), unpack(ids))
    forget(t)
  end
end

-- indexed reports whether the pool's gateways are all in the index. An
-- empty gateways hash is indexed.
local meta_gw = redis.call('HGET', KEYS[3], 'gwindex')
-- A scan cursor or "done"; any other value (a corrupt one) starts the
-- indexing over, which only registers what is missing.
if meta_gw and meta_gw ~= 'done' and not string.match(meta_gw, '^%d+$') then meta_gw = nil end
if meta_gw ~= 'done' and redis.call('EXISTS', KEYS[9]) == 0 then
  meta_gw = 'done'
  redis.call('HSET', KEYS[3], 'gwindex', 'done')
end
local function indexed() return meta_gw == 'done' end

-- index_page indexes the next INDEX_PAGE entries of the gateways hash
-- (those of proxies in the pool), registering each template with the
-- labels of its first member seen.
local function index_page()
  if indexed() then return end
  local page = redis.call('HSCAN', KEYS[9], meta_gw or '0', 'COUNT', INDEX_PAGE)
  local of, order = {}, {}
  for i = 1, #page[2], 2 do
    local id, t = page[2][i], page[2][i + 1]
    if redis.call('HEXISTS', KEYS[1], id) == 1 then
      if not of[t] then
        of[t] = {}
        order[#order + 1] = t
      end
      table.insert(of[t], id)
    end
  end
  for _, t in ipairs(order) do
    index(t, of[t], redis.call('HGET', KEYS[10], of[t][1]) or '')
  end
  meta_gw = page[1] == '0' and 'done' or page[1]
  redis.call('HSET', KEYS[3], 'gwindex', meta_gw)
end

-- gone_add records the ids of list (at most 1000) in the gone zset, each
-- at a score of its own above every score there (ms x 1000 + a count from 1), so
-- that a site's sweep (lease.lua's forget_gone) pages through them
-- without skipping any.
local function gone_add(list)
  local top = redis.call('ZRANGE', GONE, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  local sc = math.max(now * 1000 + 1, (num(top[2]) or 0) + 1) -- (a site new to the sweep now starts at now x 1000)
  local args = {}
  for _, id in ipairs(list) do
    args[#args + 1] = string.format('%.0f', sc)
    args[#args + 1] = id
    sc = sc + 1
  end
  redis.call('ZADD', GONE, unpack(args))
end

-- remove_all takes the ids of list out of the pool, the order, the
-- gateways and labels hashes, the dead, fails and quarantine records: a
-- few commands per key for the whole list. The sites' keys are left to
-- the sites: each forgets the proxies recorded in the gone zset at its
-- next leases (lease.lua's forget_gone), so the call's work does not grow
-- with the sites. With a scope, the lease of member mine there, owned by
-- token, ends now. Returns how many were in the pool.
local function remove_all(list, scope, mine, token)
  if #list == 0 then return 0 end
  local removed = 0
  for i = 1, #list, 1000 do
    local part = {unpack(list, i, math.min(i + 999, #list))}
    removed = removed + redis.call('HDEL', KEYS[1], unpack(part))
    redis.call('HDEL', KEYS[4], unpack(part))
    redis.call('HDEL', KEYS[5], unpack(part))
    redis.call('ZREM', KEYS[6], unpack(part))
    redis.call('ZREM', KEYS[7], unpack(part))
    unindex(part)
    redis.call('HDEL', KEYS[9], unpack(part))
    redis.call('HDEL', KEYS[10], unpack(part))
    gone_add(part)
  end
  if scope and mine and mine ~= '' then
    local lk = base .. ':lease:' .. scope
    local tok = string.match(redis.call('HGET', lk, mine) or '', '^(.*)|%d+$')
    if tok and tok == token then
      redis.call('HDEL', lk, mine)
      redis.call('ZREM', base .. ':free:' .. scope, mine)
    end
  end
  return removed
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

-- relabel_page gives at most budget members of the template of digest d,
-- from its relabel cursor on (KEYS[12]), the template's labels (KEYS[11]);
-- the relabelling ends with a short page. Returns the members looked at.
local function relabel_page(d, budget)
  local at = redis.call('HGET', KEYS[12], d)
  if not at then return 0 end
  local labels = redis.call('HGET', KEYS[11], d) or ''
  local from = at == '' and '-' or '(' .. at
  local ids = redis.call('ZRANGE', base .. ':gw:' .. d, from, '+', 'BYLEX', 'LIMIT', 0, budget)
  local each = {}
  for k = 1, #ids do each[k] = labels end
  label_all(ids, each)
  if #ids < budget then
    redis.call('HDEL', KEYS[12], d)
  else
    redis.call('HSET', KEYS[12], d, ids[#ids])
  end
  return #ids
end

-- set_labels records labels as those of template t's members: when they
-- change for a template with members, its relabelling starts over
-- (relabel_page; new members get them as they are added).
local function set_labels(t, labels)
  local d = digest(t)
  if redis.call('HGET', KEYS[11], d) == labels then return end
  redis.call('HSET', KEYS[11], d, labels)
  if redis.call('EXISTS', index_key(t)) == 1 then redis.call('HSET', KEYS[12], d, '') end
end

-- gateways adds the candidates each template of g still needs (its index
-- counts the members it has), gives the sessions kept the entry's labels
-- (a page of them per call when they changed: relabel_page), and returns
-- how many it added. The index must be built (indexed()).
local function gateways(g)
  local added = 0
  for _, t in ipairs(g.templates) do
    local n = redis.call('ZCARD', index_key(t))
    local labels = g.cands[t][1][3]
    set_labels(t, labels)
    relabel_page(digest(t), RELABEL)
    local take, tags, ids = {}, {}, {}
    for _, e in ipairs(g.cands[t]) do
      if n >= g.size[t] then break end
      if redis.call('HEXISTS', KEYS[1], e[1]) == 0 then
        take[#take + 1] = e
        tags[#tags + 1] = e[1]
        tags[#tags + 1] = t
        ids[#ids + 1] = e[1]
        n = n + 1
      end
    end
    added = added + add_all(take)
    many('HSET', KEYS[9], tags)
    index(t, ids, labels)
    forget(t)
  end
  return added
end

-- need_index is the reply of a call that needs the index before it is
-- built: nothing but the index page (and the idle sites) changed.
local function need_index()
  return redis.error_reply('PSINDEX the gateway index of the pool is being built: run "index" calls first')
end

-- An empty pool's order is complete: lease.lua need not index it.
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('HSET', KEYS[3], 'index', 'done') end

-- The work bound: at most BUDGET entries added or removed per call.
local was_indexed = indexed()
index_page()

local added, removed, consumed, total = 0, 0, 0, #ARGV - 4
if mode == 'add' then
  total = math.floor(total / E)
  consumed = math.min(total, BUDGET)
  local g, err = entries(4 + E * consumed)
  if not g then return err end
  if #g.templates > 0 and not indexed() then return need_index() end
  added = add_all(g.plain)
  if #g.templates > 0 then added = added + gateways(g) end
elseif mode == 'remove' then
  local cap = BUDGET
  local list = {}
  for i = 5, #ARGV do
    local t = string.match(ARGV[i], '^gw:(.*)$')
    if t then
      if not indexed() then return need_index() end
      local n = redis.call('ZCARD', index_key(t))
      local room = cap - #list
      if n > room then
        -- Part of the gateway now (all of the room, or one member if
        -- nothing else is done in this call), the rest in the next call.
        if #list == 0 then list = redis.call('ZRANGE', index_key(t), 0, math.max(room, 1) - 1) end
        break
      end
      if n > 0 then
        for _, id in ipairs(redis.call('ZRANGE', index_key(t), 0, -1)) do list[#list + 1] = id end
      end
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
  if #g.templates > 0 and not indexed() then return need_index() end
  local keep = {}
  for _, e in ipairs(g.plain) do keep[e[1]] = true end
  for _, t in ipairs(g.templates) do
    -- The members each gateway keeps: its first N, by ID.
    for _, id in ipairs(redis.call('ZRANGE', index_key(t), 0, g.size[t] - 1)) do keep[id] = true end
  end
  local drop = {}
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not keep[id] then drop[#drop + 1] = id end
  end
  removed = remove_all(drop)
  added = add_all(g.plain)
  if #g.templates > 0 then added = added + gateways(g) end
  consumed = total
elseif mode == 'rotate' then
  local old, t = ARGV[5], redis.call('HGET', KEYS[9], ARGV[5])
  if not t and redis.call('HEXISTS', KEYS[1], old) == 1 then plain = 1 end
  if t and redis.call('HEXISTS', KEYS[1], old) == 1 and redis.call('HEXISTS', KEYS[1], ARGV[6]) == 0 then
    local labels = redis.call('HGET', KEYS[10], old) or ''
    if redis.call('HEXISTS', KEYS[12], digest(t)) == 1 then
      -- Its gateway is being relabelled: the new session gets the new labels.
      labels = redis.call('HGET', KEYS[11], digest(t)) or ''
    end
    removed = remove_all({old}, ARGV[10], ARGV[8], ARGV[9])
    added = add_all({{ARGV[6], ARGV[7], labels}})
    redis.call('HSET', KEYS[9], ARGV[6], t)
    index(t, {ARGV[6]}, labels)
  end
  consumed = total
elseif mode == 'index' then
  -- The index build (index_page, above) first; then pending relabellings.
  if was_indexed then
    local left = RELABEL
    for _, d in ipairs(redis.call('HRANDFIELD', KEYS[12], 10)) do
      if left <= 0 then break end
      left = left - relabel_page(d, left)
    end
  end
elseif mode ~= 'done' then
  return redis.error_reply('PSCONFIG unknown pool update mode ' .. mode)
end
local pending = 0
if not indexed() or redis.call('EXISTS', KEYS[12]) == 1 then pending = 1 end
if mode == 'index' then
  if relabelled > 0 then bump_version(KEYS[3]) end
  return {0, 0, redis.call('HLEN', KEYS[1]), 0, pending}
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
if mode == 'rotate' then return {added, removed, size, consumed, pending, plain} end
return {added, removed, size, consumed, pending}
