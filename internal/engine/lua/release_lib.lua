-- release_lib.lua: what release.lua reads once per script call of the keys
-- that the releases of one call share. pool_call.lua runs release.lua once
-- per lease given back, most of them on one scope; a lone release.lua call
-- is a call of one. Each table lives for one script call.
--
-- rel_empty: whether a hash (the fails hash, a scope's health hash) was
-- empty when first read. A release only deletes from them (a healthy
-- answer ends a proxy's failures and lowers its failure rate; nothing in
-- a release adds one), so an empty one stays empty for the rest of the
-- call: its per-proxy reads and deletes are skipped. On a healthy crawl
-- both are empty, and each release saves two commands.
-- rel_pace: a scope's pace fields {learned cooldown, accepted rest}
-- (lib.lua's pace_fields), read once and kept as the call writes them.
-- rel_ttl: whether the pace hash's TTL was refreshed in this call.
local rel_empty, rel_pace, rel_ttl, rel_served = {}, {}, {}, {}

-- rel_note_served writes the strikes hash key's "served" field (the ms of
-- the scope's latest healthy answer: penalize.lua reads it against an
-- unproven lift) once per call.
local function rel_note_served(key)
  if rel_served[key] then return end
  rel_served[key] = true
  redis.call('HSET', key, 'served', now_str())
end

-- rel_hash_empty returns whether hash key is empty, read once per call.
local function rel_hash_empty(key)
  local e = rel_empty[key]
  if e == nil then
    e = redis.call('HLEN', key) == 0
    rel_empty[key] = e
  end
  return e
end

-- rel_pace_fields returns the learned cooldown and the accepted rest of the
-- pace hash key (pace_fields), read once per call.
local function rel_pace_fields(key)
  local p = rel_pace[key]
  if not p then
    local c, r = pace_fields(key)
    p = {c = c, rest = r}
    rel_pace[key] = p
  end
  return p.c, p.rest
end

-- rel_pace_ok is pace_ok (a healthy answer shortens the learned cooldown c)
-- on the pace hash key: the next release of the call reads it again.
local function rel_pace_ok(key, c, floor, idle)
  if c <= floor then return end
  pace_ok(key, c, floor, idle)
  rel_pace[key] = nil
end

-- rel_rest_note is pace_rest_note (one accepted rest t, the hash holding
-- r) on the pace hash key, which it keeps for idle ms: the TTL is set when
-- the note writes the hash (it may create it) and else once per call.
local function rel_rest_note(key, r, t, idle)
  local r2, wrote = pace_rest_note(key, r, t)
  local p = rel_pace[key]
  if p then p.rest = r2 end
  if wrote or not rel_ttl[key] then
    redis.call('PEXPIRE', key, idle)
    rel_ttl[key] = true
  end
end
