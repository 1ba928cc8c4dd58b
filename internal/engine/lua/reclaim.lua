-- reclaim.lua: give back the leases that lease calls of unknown outcome may
-- have made (a call that timed out, or lost its connection, after it was
-- sent: reclaim.go), found by their owner tokens in one page of the scope's
-- lease hash. Nobody holds a lease of these tokens (their caller got an
-- error), and each one goes back owner-checked by its token, as an unused
-- lease: release.lua with no cooldown, no flaky delay, no pacing.
-- embed: release.lua as release_one
--
-- KEYS[1] busy zset of the scope    KEYS[2] its lease hash  "<id>:<slot>" -> "<token>|<expiry ms>"
-- KEYS[3] its strikes hash  KEYS[4] fails hash  KEYS[5] its health hash
-- KEYS[6] its pace hash: release.lua's KEYS, in its order
-- ARGV[1] HSCAN cursor of the lease hash, "0" to start
-- ARGV[2] entries to look at (HSCAN's COUNT): the call's work is this page
--         and the tokens, never the pool
-- ARGV[3] idle TTL ms (release.lua's ARGV[7])
-- ARGV[4..] the owner tokens of the calls in doubt
--
-- Returns {next cursor ("0": the scan is over), member, token, ...}: the
-- leases released by this call.
local want = {}
for i = 4, #ARGV do want[ARGV[i]] = true end
local page = redis.call('HSCAN', KEYS[2], ARGV[1], 'COUNT', ARGV[2])
local out = {page[1]}
local kv = page[2]
for i = 1, #kv - 1, 2 do
  local v = kv[i + 1]
  local sep = string.find(v, '|', 1, true)
  local tok = sep and string.sub(v, 1, sep - 1)
  if tok and want[tok] then
    -- (HSCAN may return a field twice: the second release finds no record.)
    if release_one(KEYS, {kv[i], tok, '0', '', '0', '0', ARGV[3]}) ~= 0 then
      out[#out + 1] = kv[i]
      out[#out + 1] = tok
    end
  end
end
return out
