-- worked.lua: a proxy failure the site's circuit breaker is asked to
-- absorb as its storm's while it holds the site (storm.go's
-- workedBefore): it may only if the proxy worked on the site's scope
-- since its last failure there (worked_lib.lua). Then the failure is
-- noted as its last there (no quarantine follows): the proxy's next
-- failure with no healthy answer in between is its own, quarantined, no
-- evidence of the storm, so that a proxy that went bad cannot reopen the
-- breaker again and again.
-- include: worked_lib.lua
--
-- KEYS[1] strikes hash of the scope   ARGV[1] proxy id   ARGV[2] idle TTL ms of the hash
--
-- Returns 1 if it worked (the failure noted), else 0.
if not worked(KEYS[1], ARGV[1]) then return 0 end
worked_fail(KEYS[1], ARGV[1], ARGV[2])
return 1
