-- exit_strict.lua: strict exits for a pool (probe.Checker.Strict): until
-- the time it writes, lease.lua holds every entry whose exit IP is not
-- recorded yet off every site (but for the probe's own lease, which
-- records it). A strict checker writes it each round, far enough ahead to
-- outlast the rounds in between; when no strict checker runs any more, it
-- lapses and such entries are leased again (nobody would record their
-- exits: they would be out for good).
--
-- KEYS[1] meta hash   "strict" -> unix ms until which strict exits hold
-- ARGV[1] ms from now (server time) during which they hold
--
-- Returns the time written (unix ms).
local d = tonumber(ARGV[1])
if not d or d < 1 or d > 86400000 then
  return redis.error_reply('PSARGS exit_strict wants a duration of 1 ms to 24 h')
end
local t = string.format('%.0f', now_ms() + d)
redis.call('HSET', KEYS[1], 'strict', t)
return t
